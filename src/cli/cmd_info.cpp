// shardlm info: what a checkpoint is and what it costs in memory.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/shard.h"
#include "tokenizer/tokenizer.h"
#include "runtime/cpu_engine.h"
#include "runtime/kv_cache.h"
#include "runtime/session.h"
#ifdef SHARDLM_HAVE_CUDA
#include "runtime/cuda_engine.h"
#endif

namespace shardlm {

namespace {

// What a pre-quantized checkpoint holds and what --weights auto loads it as.
std::string quant_summary(const ModelConfig& c) {
    const QuantConfig& q = c.quant;
    if (c.fp8.present) {
        const Fp8Weights& f = c.fp8;
        const std::string blocks = f.block_rows == 0 && f.block_cols == 0 ? std::string("one scale for each matrix")
                                   : f.block_cols == 0                   ? std::string("one scale per row")
                                       : cat("a scale per ", f.block_rows, " x ", f.block_cols, " block");
        return cat("fp8 e4m3, ", blocks, ": loads as bf16 (code x scale; --weights int8, int4, ... quantize from it)");
    }
    if (!q.present) return "no";
    const std::string group = q.group_size > 0 ? cat("groups of ", q.group_size) : std::string("one scale per row");
    if (q.method == QuantMethod::Shardlm) return cat("shardlm ", q.format, ", ", group);
    return cat(quant_method_name(q.method), " ", q.bits, "-bit, ",
               q.per_tensor ? std::string("one scale for each matrix")
               : q.packed_group > 0 ? cat("groups of ", q.packed_group)
                                    : std::string("one group per row"),
               q.act_order ? ", act-order" : "", ": loads as ", q.format, " (", group,
               q.act_order ? "; the columns sorted by group, each layer's input gathered into their order)" : ")");
}
std::string gib(double bytes) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(3) << bytes / (1024.0 * 1024.0 * 1024.0) << " GiB";
    return os.str();
}
std::string mib(double bytes) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << bytes / (1024.0 * 1024.0) << " MiB";
    return os.str();
}
}  // namespace

int cmd_info(const Args& args) {
    po::options_description d("info options");
    std::string model, kv = "fp16";
    int tp = 1;
    int64_t ctx = 0, batch = 1;
    d.add_options()("help", "show this help")("model", po::value(&model)->required(), "checkpoint folder")
        ("tp", po::value(&tp)->default_value(1), "tensor-parallel size: print each rank's share")
        ("ctx", po::value(&ctx)->default_value(0),
         "KV positions per sequence, for the memory plan (0: generate's default, 4096 at most max_position_embeddings)")
        ("batch", po::value(&batch)->default_value(1), "sequences, for the memory plan")
        ("kv", po::value(&kv)->default_value("fp16"), "KV-cache precision of the plan: fp32|fp16|bf16|int8");
    po::variables_map vm;
    // What chat and serve make of the tokenizer's chat template: its family, tool format and
    // thinking switch, or why there is none.
    const auto chat_summary = [](const std::string& dir) -> std::string {
        if (!Tokenizer::exists(dir)) return "none (no tokenizer.json)";
        try {
            const Tokenizer tok = Tokenizer::load(dir);
            if (!tok.has_chat_template()) return "none (no chat_template in tokenizer_config.json, no chat_template.jinja)";
            const ChatTools tools = tok.chat_tools();
            return tok.chat_family() +
                   (tools == ChatTools::Qwen25       ? ", tools (Qwen2.5's)"
                    : tools == ChatTools::Qwen3      ? ", tools (Qwen3's)"
                    : tools == ChatTools::Llama3Json ? ", tools (Llama 3.1/3.2's JSON)"
                    : tools == ChatTools::MistralJson ? ", tools (Mistral v3's [TOOL_CALLS])"
                                                     : ", no tools") +
                   (tok.chat_thinking_switch() ? ", enable_thinking switch" : "");
        } catch (const Error& e) {
            return std::string("unusable: ") + e.what();
        }
    };
    if (!parse_args(args, d, vm, "usage: shardlm info --model DIR [--tp N] [--ctx N] [--batch B] [--kv F]")) return 0;
    if (tp < 1) fail("--tp must be >= 1");
    if (batch < 1) fail("--batch must be >= 1");
    // What generate would allocate (its default --prefill-chunk), checked as generate checks it.
    SessionOptions so;
    if (ctx < 0) fail("--ctx must be >= 0");
    so.max_batch = batch;
    so.kv = parse_kv_format(kv == "auto" ? "fp16" : kv);
    const DType kv_type = kv_dtype(so.kv);
    const ModelConfig c = load_config(model);
    set_session_ctx(so, ctx, c, "info");
    ctx = so.ctx;
    check_context(c, so);
    plan_shard(c, 0, tp);  // a --tp that cannot split the model fails here, before any output
    const Checkpoint ck(model);
    const int64_t params = parameter_count(c);
    std::string labels;
    for (const std::string& l : c.labels) labels += (labels.empty() ? "" : ", ") + l;
    std::cout << "architecture      " << c.architecture
              << (c.head == Head::Classifier ? cat(" (labels: ", labels, c.multi_label ? "; multi-label" : "", ")")
                  : c.head == Head::None     ? std::string(" (no lm_head: embeddings)")
                                             : std::string())
              << "\n"
              << "layers            " << c.n_layers << "\n"
              << "hidden            " << c.hidden << "\n"
              << "heads / kv heads  " << c.n_heads << " / " << c.n_kv_heads << " (head_dim " << c.head_dim << ")\n"
              << "intermediate      " << c.intermediate << "\n"
              << "vocab             " << c.vocab << "\n"
              << "rope              theta " << c.rope_theta
              << (c.rope.kind == RopeScaling::Kind::None ? "" : cat(", ", rope_kind_name(c.rope.kind), " scaling x", c.rope.factor))
              << "\n"
              << "tied embeddings   " << (c.tie_embeddings ? "yes" : "no") << "\n"
              << "checkpoint        " << ck.file_count() << " file(s), " << gib(double(ck.total_bytes())) << " of tensors, "
              << "torch_dtype " << dtype_name(c.torch_dtype) << "\n"
              << "pre-quantized     " << quant_summary(c) << "\n"
              << "chat template     " << chat_summary(model) << "\n"
              << "parameters        " << params << "\n"
              << "weights fp32      " << gib(double(params) * 4) << "\n"
              << "weights fp16/bf16 " << gib(double(params) * 2) << "\n";
    const double kv_tok = double(2 * c.n_layers * c.n_kv_heads * c.head_dim);
    std::cout << "kv cache / token  fp32 " << kv_tok * 4 / 1024 << " KiB, fp16 " << kv_tok * 2 / 1024 << " KiB\n";
    // The memory plan of each rank: its weights in 16 bits, in INT8 (one f32 scale per output
    // row) and in INT4, and the KV cache preallocated for --batch sequences of --ctx positions.
    EngineOptions eo = engine_options(so);
    eo.max_logit_rows = eo.max_batch;  // generate's: a row per sequence
    const int64_t capacity = kv_capacity(c, eo);
    std::cout << "\nmemory plan per rank: batch " << batch << " x ctx " << ctx << ", KV " << kv_name(kv_type)
              << "; the step workspace holds " << eo.max_step_tokens << " token rows (--prefill-chunk "
              << so.prefill_chunk << ") and " << eo.max_logit_rows << " logits row(s), weight-only products"
#ifdef SHARDLM_HAVE_CUDA
              << " (the CUDA engine adds cuBLAS's prefill scratch)"
#endif
              << "\n";
    // Act-order layers gather their input into their columns' order (the widest whole input; never
    // down_proj's, whose gate and up make it in that order: LayerWeights::inter_rows).
    const int64_t ordered = c.quant.act_order ? std::max(c.hidden, c.n_heads * c.head_dim) : 0;
    if (capacity < ctx)
        std::cout << "  (every layer slides over a window of " << c.sliding_window << ": the cache is a ring of "
                  << capacity << " positions per sequence at --prefill-chunk " << so.prefill_chunk << ")\n";
    for (int r = 0; r < tp; ++r) {
        const ShardPlan p = plan_shard(c, r, tp);
        const int64_t n = shard_parameter_count(c, p);
        const int64_t q_dim = p.n_q_heads * c.head_dim, kv_dim = p.n_kv_heads * c.head_dim;
        // INT8: every Linear and lm_head (the tied embedding with it); an untied embedding stays 16-bit.
        const int64_t scale_rows = c.n_layers * (q_dim + 2 * kv_dim + c.hidden + 2 * p.n_inter + c.hidden) + p.n_vocab;
        const int64_t untied_embed = c.tie_embeddings ? 0 : p.n_vocab * c.hidden;
        // INT4 (group 128): the layers' Linear matrices in 4 bits with an f32 scale and min per
        // group; lm_head INT8 per row as above.
        const int64_t layer_params = c.n_layers * c.hidden * (2 * q_dim + 2 * kv_dim + 3 * p.n_inter);
        const KVCacheShape ks = kv_cache_shape(c, p.n_kv_heads, eo);
        std::cout << "  rank " << r << "  q heads " << p.q_head0 << ".." << p.q_head0 + p.n_q_heads - 1 << ", kv heads "
                  << p.kv_head0 << ".." << p.kv_head0 + p.n_kv_heads - 1 << ", vocab " << p.vocab0 << ".."
                  << p.vocab0 + p.n_vocab - 1 << ": " << n << " parameters; weights " << gib(double(n) * 2)
                  << " fp16/bf16, " << gib(double(n) + double(untied_embed) + 4.0 * double(scale_rows)) << " int8, "
                  << gib(double(n - layer_params) + double(untied_embed) + 4.0 * double(p.n_vocab) +
                         double(layer_params) * (0.5 + 8.0 / double(kInt4DefaultGroup)))
                  << " int4/w4a8; KV cache "
                  << gib(double(kv_cache_bytes(ks))) << "; workspace " << mib(double(cpu_workspace_bytes(c, p, eo, false, ordered)))
                  << " cpu";
#ifdef SHARDLM_HAVE_CUDA
        DeviceArena sizing;
        take_step_buffers(sizing, c, p, eo, false, ordered);
        std::cout << ", " << mib(double(sizing.used())) << " cuda";
#endif
        std::cout << "\n";
    }
    return 0;
}

}  // namespace shardlm
