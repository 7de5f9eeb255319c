// Everything one loaded model needs, owned in one place: config, mapped checkpoint, weights and
// the engine with its KV cache. The CLI, tests and benchmarks all start from here.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"

namespace shardlm {

struct SessionOptions {
    std::string model_dir;
    LoadOptions load;  // weight format, INT8 group size, --keep-fp16
    KVFormat kv = KVFormat::Auto;
    int64_t ctx = 0;            // KV positions per sequence (required > 0)
    int64_t max_batch = 1;
    int64_t prefill_chunk = 256;
    int64_t max_logit_rows = 0;  // 0: max_batch (perplexity needs a chunk's worth)
};

struct Session {
    ModelConfig cfg;
    std::unique_ptr<Checkpoint> ckpt;
    ModelWeights weights;
    std::unique_ptr<Engine> engine;
    double load_ms = 0;
};

// Loads config and weights and checks the context against the model's limits.
std::unique_ptr<Session> open_session(const SessionOptions& opt, Communicator& comm);

}  // namespace shardlm
