// shardlm make-model: writes a random-weight checkpoint of a built-in shape, for the demo,
// tests and benchmarks (no model can be downloaded on the build machines).
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "model/config.h"
#include "model/synthetic.h"

namespace shardlm {

int cmd_make_model(const Args& args) {
    po::options_description d("make-model options");
    std::string preset, out, dtype, model;
    int shards = 1;
    int64_t lora_rank = 0;
    std::string seed = "1";
    d.add_options()
        ("help", "show this help")
        ("preset", po::value(&preset)->default_value("tiny"),
         "tiny, qwen3-1.7b, smollm2-1.7b, llama3.2-1b, or tiny-llama/tiny-mistral/tiny-qwen2/tiny-qwen3")
        ("out", po::value(&out)->required(), "output folder")
        ("dtype", po::value(&dtype)->default_value("bf16"), "fp32|fp16|bf16")
        ("shards", po::value(&shards)->default_value(1), "number of safetensors files")
        ("seed", po::value(&seed)->default_value("1"), "random seed, 0 .. 2^64-1")
        ("lora-rank", po::value(&lora_rank),
         "R: write a random LoRA adapter (PEFT's folder) of rank R on every layer matrix of the preset's shape "
         "instead of a checkpoint (for --lora and serve --lora-modules)")
        ("model", po::value(&model), "with --lora-rank: the adapter for this checkpoint's shape (its config.json) instead of --preset's");
    po::variables_map vm;
    if (!parse_args(args, d, vm, "usage: shardlm make-model --preset NAME --out DIR")) return 0;
    if (vm.count("lora-rank") && (lora_rank < 1 || lora_rank > 4096)) fail("--lora-rank must be in [1, 4096]");
    if (vm.count("model") && !vm.count("lora-rank")) fail("--model names the base of an adapter: it needs --lora-rank");
    if (vm.count("model") && !vm["preset"].defaulted()) fail("--model and --preset exclude each other");
    ModelConfig c;
    if (!model.empty()) c = load_config(model);
    else if (preset == "tiny-llama") c = tiny_config(Arch::Llama);
    else if (preset == "tiny-mistral") c = tiny_config(Arch::Mistral);
    else if (preset == "tiny-qwen2") c = tiny_config(Arch::Qwen2);
    else if (preset == "tiny-qwen3") c = tiny_config(Arch::Qwen3);
    else c = synthetic_config(preset);
    SyntheticOptions o;
    if (dtype == "fp32") o.dtype = DType::F32;
    else if (dtype == "fp16") o.dtype = DType::F16;
    else if (dtype == "bf16") o.dtype = DType::BF16;
    else fail("--dtype: unknown \"", dtype, "\" (fp32, fp16, bf16)");
    o.seed = parse_seed(seed);
    if (lora_rank > 0) {
        for (const char* f : {"/adapter_config.json", "/adapter_model.safetensors"})
            if (file_exists(out + f)) fail("--out ", out, " already holds an adapter (", f + 1, "); choose a new or empty folder");
        if (!vm["shards"].defaulted()) fail("--shards applies to checkpoints, not to --lora-rank");
        write_synthetic_lora(out, c, lora_rank, o);
        std::cerr << "wrote a random rank-" << lora_rank << " LoRA adapter for " << (model.empty() ? preset : model) << " to "
                  << out << "\n";
        return 0;
    }
    const int max_shards = max_synthetic_shards(c);
    if (shards < 1 || shards > max_shards)
        fail("--shards ", shards, " must be in [1, ", max_shards, "] for --preset ", preset, " (one file per layer of its ",
             c.n_layers, ", plus one)");
    for (const char* f : {"/config.json", "/model.safetensors", "/model.safetensors.index.json"})
        if (file_exists(out + f))  // random weights over a real checkpoint would be silent garbage
            fail("--out ", out, " already holds a checkpoint (", f + 1, "); choose a new or empty folder");
    o.shards = shards;
    write_synthetic_checkpoint(out, c, o);
    std::cerr << "wrote a random-weight " << preset << " checkpoint (" << parameter_count(c) << " parameters) to "
              << out << "\n";
    return 0;
}

}  // namespace shardlm
