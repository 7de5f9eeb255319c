// shardlm make-model: writes a random-weight checkpoint of a built-in shape, for the demo,
// tests and benchmarks (no model can be downloaded on the build machines).
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "model/synthetic.h"

namespace shardlm {

int cmd_make_model(const Args& args) {
    po::options_description d("make-model options");
    std::string preset, out, dtype;
    int shards = 1;
    std::string seed = "1";
    d.add_options()
        ("help", "show this help")
        ("preset", po::value(&preset)->default_value("tiny"),
         "tiny, qwen3-1.7b, smollm2-1.7b, llama3.2-1b, or tiny-llama/tiny-mistral/tiny-qwen2/tiny-qwen3")
        ("out", po::value(&out)->required(), "output folder")
        ("dtype", po::value(&dtype)->default_value("bf16"), "fp32|fp16|bf16")
        ("shards", po::value(&shards)->default_value(1), "number of safetensors files")
        ("seed", po::value(&seed)->default_value("1"), "random seed, 0 .. 2^64-1");
    po::variables_map vm;
    if (!parse_args(args, d, vm, "usage: shardlm make-model --preset NAME --out DIR")) return 0;
    ModelConfig c;
    if (preset == "tiny-llama") c = tiny_config(Arch::Llama);
    else if (preset == "tiny-mistral") c = tiny_config(Arch::Mistral);
    else if (preset == "tiny-qwen2") c = tiny_config(Arch::Qwen2);
    else if (preset == "tiny-qwen3") c = tiny_config(Arch::Qwen3);
    else c = synthetic_config(preset);
    SyntheticOptions o;
    if (dtype == "fp32") o.dtype = DType::F32;
    else if (dtype == "fp16") o.dtype = DType::F16;
    else if (dtype == "bf16") o.dtype = DType::BF16;
    else fail("--dtype: unknown \"", dtype, "\" (fp32, fp16, bf16)");
    const int max_shards = max_synthetic_shards(c);
    if (shards < 1 || shards > max_shards)
        fail("--shards ", shards, " must be in [1, ", max_shards, "] for --preset ", preset, " (one file per layer of its ",
             c.n_layers, ", plus one)");
    for (const char* f : {"/config.json", "/model.safetensors", "/model.safetensors.index.json"})
        if (file_exists(out + f))  // random weights over a real checkpoint would be silent garbage
            fail("--out ", out, " already holds a checkpoint (", f + 1, "); choose a new or empty folder");
    o.shards = shards;
    o.seed = parse_seed(seed);
    write_synthetic_checkpoint(out, c, o);
    std::cerr << "wrote a random-weight " << preset << " checkpoint (" << parameter_count(c) << " parameters) to "
              << out << "\n";
    return 0;
}

}  // namespace shardlm
