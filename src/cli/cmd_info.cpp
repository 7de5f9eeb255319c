// shardlm info: what a checkpoint is and what it costs in memory.
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/shard.h"

namespace shardlm {

namespace {
std::string gib(double bytes) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(3) << bytes / (1024.0 * 1024.0 * 1024.0) << " GiB";
    return os.str();
}
}  // namespace

int cmd_info(const Args& args) {
    po::options_description d("info options");
    std::string model;
    int tp = 1;
    d.add_options()("help", "show this help")("model", po::value(&model)->required(), "checkpoint folder")
        ("tp", po::value(&tp)->default_value(1), "tensor-parallel size: print each rank's share");
    po::variables_map vm;
    if (!parse_args(args, d, vm, "usage: shardlm info --model DIR [--tp N]")) return 0;
    const ModelConfig c = load_config(model);
    const Checkpoint ck(model);
    const int64_t params = parameter_count(c);
    std::cout << "architecture      " << arch_name(c.arch) << "\n"
              << "layers            " << c.n_layers << "\n"
              << "hidden            " << c.hidden << "\n"
              << "heads / kv heads  " << c.n_heads << " / " << c.n_kv_heads << " (head_dim " << c.head_dim << ")\n"
              << "intermediate      " << c.intermediate << "\n"
              << "vocab             " << c.vocab << "\n"
              << "rope              theta " << c.rope_theta
              << (c.rope.kind == RopeScaling::Kind::Llama3 ? ", llama3 scaling" : "") << "\n"
              << "tied embeddings   " << (c.tie_embeddings ? "yes" : "no") << "\n"
              << "checkpoint        " << ck.file_count() << " file(s), " << gib(double(ck.total_bytes())) << " of tensors, "
              << "torch_dtype " << dtype_name(c.torch_dtype) << "\n"
              << "parameters        " << params << "\n"
              << "weights fp32      " << gib(double(params) * 4) << "\n"
              << "weights fp16/bf16 " << gib(double(params) * 2) << "\n";
    const double kv_tok = double(2 * c.n_layers * c.n_kv_heads * c.head_dim);
    std::cout << "kv cache / token  fp32 " << kv_tok * 4 / 1024 << " KiB, fp16 " << kv_tok * 2 / 1024 << " KiB\n";
    if (tp > 1) {
        std::cout << "\ntensor parallel " << tp << " (each rank):\n";
        for (int r = 0; r < tp; ++r) {
            const ShardPlan p = plan_shard(c, r, tp);
            const int64_t n = shard_parameter_count(c, p);
            std::cout << "  rank " << r << "  q heads " << p.q_head0 << ".." << p.q_head0 + p.n_q_heads - 1 << ", kv heads "
                      << p.kv_head0 << ".." << p.kv_head0 + p.n_kv_heads - 1 << ", vocab " << p.vocab0 << ".."
                      << p.vocab0 + p.n_vocab - 1 << ": " << n << " parameters, " << gib(double(n) * 2)
                      << " fp16/bf16, kv cache/token " << double(2 * c.n_layers * p.n_kv_heads * c.head_dim) * 2 / 1024
                      << " KiB fp16\n";
        }
    }
    return 0;
}

}  // namespace shardlm
