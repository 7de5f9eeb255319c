// Everything one loaded model needs, owned in one place: config, mapped checkpoint, weights and
// the engine with its KV cache. The CLI, tests and benchmarks all start from here.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/lora_weights.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"

namespace shardlm {

// --device: Auto picks CUDA when this build has it and every rank of the node gets its own GPU.
enum class Device { Auto, Cpu, Cuda };
Device parse_device(const std::string& s);  // throws Error naming --device

struct SessionOptions {
    std::string model_dir;
    LoadOptions load;  // weight format, INT8 group size, --keep-fp16
    KVFormat kv = KVFormat::Auto;
    int64_t ctx = 0;            // KV positions per sequence (required > 0)
    // The flags ctx was derived from when the user gave no --ctx (e.g. "the longest prompt (5
    // tokens) + --max-new-tokens 64"): check_context names them instead of a --ctx never given.
    std::string ctx_origin;
    int64_t max_batch = 1;
    int64_t prefill_chunk = 256;
    // The flags prefill_chunk came from when not --prefill-chunk (bench: "--prompt-len P x batch B"),
    // named when the step workspace cannot be allocated.
    std::string chunk_origin;
    int64_t max_logit_rows = 0;  // 0: max_batch (perplexity needs a chunk's worth)
    Device device = Device::Cpu;  // the CLI defaults to auto; library users choose
    AttentionImpl attention = AttentionImpl::Flash;
    bool cuda_graphs = true;
    bool batch_invariant = false;  // EngineOptions::batch_invariant
    int fused_rope = -1;   // EngineOptions::fused_rope
    int fused_norm = -1;   // EngineOptions::fused_norm
    int gemm_staging = -1;  // EngineOptions::gemm_staging
    int64_t max_penalties = 0;  // EngineOptions::max_penalties (runtime/generate.h: max_penalties)
    // LoRA adapters kept beside the weights and chosen per sequence (SeqChunk::adapter numbers
    // them in this order; serve --lora-modules NAME=DIR).
    std::vector<std::pair<std::string, LoraAdapter>> adapters;
    int64_t max_lora_rank = 0;  // an adapter of a higher rank is refused (load_lora_weights; 0: any)
    int64_t max_loras = 0;      // EngineOptions::max_adapters (serve --max-loras)
};

struct Session {
    ModelConfig cfg;
    std::unique_ptr<Checkpoint> ckpt;
    ModelWeights weights;  // on CUDA only the plan, format and byte count stay after the upload
    std::unique_ptr<Communicator> data_comm;  // NCCL under TP on GPUs (declared before the engine that uses it)
    std::vector<LoraWeights> adapters;  // SessionOptions::adapters, this rank's slices (the engine reads them)
    std::unique_ptr<Engine> engine;
    double load_ms = 0;
};

// The engine's sizes for these session options (batch, context, step rows, cache format); the
// rest open_session fills in. shardlm info plans its memory with it.
EngineOptions engine_options(const SessionOptions& opt);

// The checks on the context every command makes before it plans or allocates memory (throws
// Error naming --ctx, or the flags in ctx_origin): at least 1, within max_position_embeddings,
// and a KV cache of max_batch x ctx positions whose byte count fits in int64. shardlm info runs
// them for its plan.
void check_context(const ModelConfig& c, const SessionOptions& opt);

// Loads config and weights and checks the context against the model's limits (check_context).
std::unique_ptr<Session> open_session(const SessionOptions& opt, Communicator& comm);

}  // namespace shardlm
