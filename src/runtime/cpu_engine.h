// The forward pass on the CPU: FP32 activations, the kernels of kernels/cpu (vectorised where the
// machine allows), the KV cache in host memory. Under tensor parallelism each rank runs this on
// its slice of the weights (ModelWeights::plan) and the Communicator joins the partial results.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <new>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/quantize.h"
#include "model/lora_weights.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"

namespace shardlm {

// The step workspace (opt.max_step_tokens rows of activations) could not be allocated: the caller
// names the flags behind the step size (open_session).
struct WorkspaceAllocError : std::bad_alloc {
    WorkspaceAllocError(int64_t t, size_t b) : step_tokens(t), bytes(b) {}
    const char* what() const noexcept override { return "step workspace allocation failed"; }
    int64_t step_tokens;
    size_t bytes;  // the one buffer refused (or SIZE_MAX when its size overflows)
};

// The step workspace's bytes of a rank's CpuEngine with these options (opt.max_logit_rows 0:
// max_batch), known before any engine exists (`shardlm info`); the engine checks its buffers
// against it. `ordered_width`: the widest act-order input of the weights (widest_input_order;
// 0 where none is, or not yet known).
size_t cpu_workspace_bytes(const ModelConfig& c, const ShardPlan& p, const EngineOptions& opt, bool int8_acts,
                           int64_t ordered_width = 0);

class CpuEngine final : public Engine {
public:
    // Throws WorkspaceAllocError when the step workspace is refused (KVCacheAllocError for the cache).
    CpuEngine(const ModelConfig& cfg, const ModelWeights& w, Communicator& comm, const EngineOptions& opt);

    void forward(const std::vector<SeqChunk>& chunks, float* logits) override;
    void forward_hidden(const std::vector<SeqChunk>& chunks, float* hidden) override;
    void shift_kv(int64_t slot, int64_t keep, int64_t discard, int64_t len) override;
    void copy_kv(int64_t src, int64_t dst, int64_t n) override;
    size_t kv_position_bytes() const override { return shardlm::kv_position_bytes(kv_.shape()); }
    void save_kv(int64_t slot, int64_t n, uint8_t* out) override;
    void load_kv(int64_t slot, int64_t n, const uint8_t* in, int64_t saved) override;
    const ModelConfig& config() const override { return cfg_; }
    const EngineOptions& options() const override { return opt_; }
    // The weights and the adapters' factors (set_adapters), as this rank holds them.
    size_t weight_bytes() const override { return w_.bytes + adapter_bytes_; }
    size_t kv_bytes() const override { return kv_.bytes(); }
    size_t workspace_bytes() const override { return ws_bytes_; }
    std::string device() const override;

    // Calibration (runtime/awq.h): when set, called with the input rows [T, cols] of each layer's
    // Linear groups as they are computed, before the products. Changes no result.
    enum class LinearInput { Qkv, O, GateUp, Down };
    using Probe = std::function<void(int64_t layer, LinearInput which, const float* x, int64_t T, int64_t cols)>;
    void set_probe(Probe p) { probe_ = std::move(p); }

    // Engine::set_adapters. Sizes the scratch of their products: throws WorkspaceAllocError when
    // it is refused.
    void set_adapters(const std::vector<LoraWeights>* adapters) override;

private:
    // Embedding, layers and the final norm of the wanted rows into out [rows, hidden]; returns rows.
    // `hidden`: a forward_hidden step (its rows are not bounded by max_logit_rows: check_step).
    int64_t final_rows(const std::vector<SeqChunk>& chunks, float* out, bool hidden);
    void attention_block(const LayerWeights& L, int64_t layer, const std::vector<SeqChunk>& chunks, int64_t T);
    void mlp_block(const LayerWeights& L, int64_t layer, int64_t T);
    // W8A8/W4A8: x is quantized per token (or group) once (quantize_input) and
    // reused by every INT8/INT4 layer reading the same x; layers kept in 16 bits read x as floats.
    const QuantizedActs* quantize_input(const float* x, int64_t T, int64_t cols, int64_t group);
    // The layers that read the same x [T, cols] (q/k/v, gate/up, or one layer alone), y = x * W^T
    // (+ b) each: one threaded product over all their rows (one fork and join, not one per layer)
    // for the layers that read x in one order (act-order layers: their input_order).
    void linears(std::initializer_list<std::pair<const Linear*, float*>> ls, const float* x, int64_t T, int64_t cols);
    void products(const std::vector<std::pair<const Linear*, float*>>& ls, const float* x, int64_t T, int64_t cols);
    // x [T, cols] in act-order layer l's input order: [T, l.input_order.size()] in ordered_. A
    // row-parallel layer split over ranks reads every rank's columns: gathered first (into
    // order_parts_).
    const float* reorder_input(const float* x, int64_t T, int64_t cols, const Linear& l);
    // For each (matrix, y) of ys (matrices of one input x of layer `layer`: q/k/v, gate/up): y
    // [T, m.out] += (x A^T) B^T for the rows of each adapter run of the step (lora_runs_), after
    // the base product and before any all-reduce; all of them in one lora_add_jobs call (none
    // in a step without adapter runs).
    void add_lora(int64_t layer, const float* x, std::initializer_list<std::pair<LoraMatrix LoraLayer::*, float*>> ys);
    // The all-reduce of a row-parallel product's n partial sums (o_proj, down_proj). With
    // batch_invariant and more than two ranks: gathered and summed in rank order here, since MPI's
    // all-reduce may choose its algorithm, and so the order of its sums, by the message's size (the
    // step's token count); two ranks' sum is one addition either way.
    void row_parallel_sum(float* o, size_t n);

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
    Probe probe_;
    // set_adapters: the adapters, this step's runs of consecutive rows under one adapter, and
    // the products' scratch, x A^T ([3, max_step_tokens, max rank]: q/k/v's in one call).
    struct LoraRun {
        int64_t adapter, row0, n;
    };
    const std::vector<LoraWeights>* adapters_ = nullptr;
    std::vector<LoraRun> lora_runs_;
    std::vector<float> lora_t_;
    std::vector<LoraJob> lora_jobs_;  // add_lora's, kept to reuse their memory
    std::vector<float> rank_parts_;   // row_parallel_sum's gathered parts, [tp][n]
    // Act-order layers' inputs in their order [max_step_tokens, at most the widest input], and
    // (several ranks) the ranks' parts of a row-parallel input, [tp][max_step_tokens][its columns].
    // (Buffers: 128-byte aligned, as the products' other inputs are.)
    Buffer ordered_, order_parts_;
    std::vector<std::pair<const Linear*, float*>> same_input_;  // linears' layers of one input order
    size_t adapter_bytes_ = 0;
};

}  // namespace shardlm
