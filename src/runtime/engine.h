// The forward pass of a Llama-family decoder over the KV cache, on the CPU.
// One call runs a "step": chunks of several sequences, each chunk a run of consecutive tokens
// that attends to everything its sequence has cached so far. Prefill is a few large chunks,
// decode is one token per sequence; both are the same code.
// Under tensor parallelism each rank runs this on its slice of the weights (ModelWeights::plan)
// and the Communicator joins the partial results.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/buffer.h"
#include "kernels/cpu/quantize.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/kv_cache.h"

namespace shardlm {

struct EngineOptions {
    int64_t max_batch = 1;       // KV-cache slots
    int64_t ctx = 0;             // positions per slot
    int64_t max_step_tokens = 256;  // workspace rows: the largest chunk sum one step may hold
    int64_t max_logit_rows = 0;     // logit rows one step may produce (0: max_batch)
    DType kv = DType::F32;
};

struct SeqChunk {
    int64_t slot = 0;              // KV-cache slot of the sequence
    const int32_t* tokens = nullptr;
    int64_t n = 0;                 // tokens in this chunk
    int64_t pos = 0;               // position of tokens[0]; everything before is cached
    bool want_logits = false;      // produce logits at the chunk's last token
    bool all_logits = false;       // produce logits at every token of the chunk (perplexity)
};

class Engine {
public:
    Engine(const ModelConfig& cfg, const ModelWeights& w, Communicator& comm, const EngineOptions& opt);

    // Runs the chunks; `logits` receives, chunk by chunk in order, n rows for an all_logits chunk
    // and one row for a want_logits chunk: [rows, vocab].
    void forward(const std::vector<SeqChunk>& chunks, float* logits);

    const ModelConfig& config() const { return cfg_; }
    const EngineOptions& options() const { return opt_; }
    size_t kv_bytes() const { return kv_.bytes(); }
    size_t workspace_bytes() const { return ws_bytes_; }

private:
    void attention_block(const LayerWeights& L, int64_t layer, const std::vector<SeqChunk>& chunks, int64_t T);
    void mlp_block(const LayerWeights& L, int64_t T);
    // y = x * W^T (+ b). W8A8: x is quantized per token once (quantize_input) and reused by every
    // INT8 layer reading the same x; layers kept in 16 bits read x as floats.
    const QuantizedActs* quantize_input(const float* x, int64_t T, int64_t cols, int64_t group);
    void linear(const Linear& l, const float* x, const QuantizedActs* qx, int64_t T, float* y);

    const ModelConfig& cfg_;
    const ModelWeights& w_;
    Communicator& comm_;
    EngineOptions opt_;
    KVCache kv_;
    std::vector<float> inv_freq_;
    std::vector<int64_t> tok_pos_;  // position of each row of the step
    // Workspace, [max_step_tokens, width] each.
    Buffer x_, h_, q_, k_, v_, attn_, o_, gate_, up_, last_;
    std::vector<float> local_logits_, gathered_;
    // W8A8 activations: int8 [max_step_tokens, widest input] and their scales.
    std::vector<int8_t> act_q_;
    std::vector<float> act_scales_;
    QuantizedActs acts_;  // [n, vocab_per_rank] and [tp, n, vocab_per_rank]
    size_t ws_bytes_ = 0;
};

}  // namespace shardlm
