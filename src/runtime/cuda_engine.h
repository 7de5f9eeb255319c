// The forward pass on one GPU: the CPU engine's math (runtime/cpu_engine.h) with the kernels of
// kernels/cuda, FP32 activations and residual stream, weights as loaded (F32/F16/BF16/INT8, or
// INT4 layers with an INT8 vocabulary matrix).
// Memory is one arena per rank laid out up front: weights, the KV cache and every workspace
// buffer, so a step allocates nothing and a captured decode graph stays valid for the session.
//
// A step: the host writes the step's small tables (ids, positions, slots, chunks, logit rows) into
// pinned memory and copies them to fixed device addresses; the kernels read them there. Decode
// steps (one token per sequence) and speculative verify steps (a few tokens per sequence) are
// replayed from CUDA Graphs captured once per step shape, cut at each collective
// (runtime/cuda_graph.h); prefill and mixed steps run the same kernels eagerly.
// Under tensor parallelism the collectives are NCCL's on the engine's stream (comm/nccl_comm.h).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/kv_layout.h"
#include "kernels/cuda/lora.h"
#include "kernels/cuda/matrix.h"
#include "kernels/cuda/w8a8.h"
#include "runtime/cuda_graph.h"
#include "runtime/engine.h"

namespace shardlm {

// Construction found the weights, KV cache and workspace larger than the device's free memory.
// what() says so with the bytes; open_session rewrites it naming the flags behind the KV cache and
// the step size (SessionOptions::ctx_origin, chunk_origin), which the engine does not know.
struct DeviceFitError : Error {
    DeviceFitError(const std::string& msg, std::string dev, int r, size_t need_b, size_t free_b, size_t weight_b,
                   size_t kv_b, size_t ws_b)
        : Error(msg), device(std::move(dev)), rank(r), need(need_b), free(free_b), weights(weight_b), kv(kv_b),
          workspace(ws_b) {}
    std::string device;
    int rank;
    size_t need, free, weights, kv, workspace;  // bytes
};

struct CudaLinear {
    DeviceMatrix w;  // [out, in]
    const float* bias = nullptr;
    // Act-order layers (Linear::input_order): w's column j reads element order[j] ([w.cols]) of
    // the whole input of order_width elements, wider than w.cols where a row-parallel layer is
    // split over ranks (CudaEngine::ordered_input gathers it). Null: column j reads element j.
    const int32_t* order = nullptr;
    int64_t order_width = 0;
};

struct CudaLayer {
    const float* input_norm = nullptr;
    const float* post_attn_norm = nullptr;
    const float* q_norm = nullptr;  // Qwen3 only
    const float* k_norm = nullptr;
    // q/k/v and gate/up are fused into one matrix each ([q | k | v] and [gate | up] rows) when
    // their formats agree: one pass and one launch instead of three and two. Otherwise the
    // fused member is empty and the separate ones are used.
    CudaLinear qkv, gate_up;
    CudaLinear q, k, v, o, gate, up, down;
};

// The step's device buffers, the engine's workspace: [max_step_tokens, width] f32 each unless noted
// (T = max_step_tokens, L = max_logit_rows, R = step_out_rows: max(T, L)).
// The kernel classes `bench --ablate` can leave out of a step (CudaEngine::set_ablation).
constexpr uint32_t kAblateQkv = 1;        // the q/k/v projections (with their norm where fused)
constexpr uint32_t kAblateAttention = 2;  // RoPE and the cache write, attention and its merge
constexpr uint32_t kAblateO = 4;          // o_proj
constexpr uint32_t kAblateMlp = 8;        // gate/up with SwiGLU, and down_proj
constexpr uint32_t kAblateLmHead = 16;    // lm_head
// "qkv", "attention", "o", "mlp", "lm_head", joined with '+' ("attention+o"); throws Error naming
// `flag` for anything else.
uint32_t parse_ablation(const std::string& names, const std::string& flag);

struct CudaStepBuffers {
    float *x = nullptr, *h = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr;
    float *delta = nullptr, *gate = nullptr, *up = nullptr;
    float *qkv = nullptr, *gate_up = nullptr;  // fused projections' outputs, [T, q+2kv] and [T, 2*inter]
    float* last = nullptr;      // [R, hidden]: the final norm's rows (a hidden step may want every token's)
    float* local = nullptr;     // [L, n_vocab]: this rank's lm_head rows
    float* padded = nullptr;    // [L, vocab_per_rank] (TP > 1: equal all-gather parts)
    float* gathered = nullptr;  // [tp, L, vocab_per_rank]
    int8_t* act_q = nullptr;     // W8A8/W4A8: the quantized layer input, [T, widest]
    float* act_scales = nullptr;  // and its scales
    void* top = nullptr;           // forward_top: [vals | ids], each [L, kMaxTopCandidates]
    void* top_gathered = nullptr;  // [tp] of top (TP > 1)
    void* topk_scratch = nullptr;
    void* attn_scratch = nullptr;
    int32_t* meta = nullptr;  // the step's tables: ids[T] pos[T] slot[T] adapter[T] out_rows[R] chunks[max_batch] (AttnChunk)
    size_t meta_bytes = 0;
    uint64_t* mass = nullptr;           // forward_nucleus: [L] total nucleus weights
    uint64_t* mass_gathered = nullptr;  // [tp] of mass (TP > 1)
    float* row_max = nullptr;           // [L] each row's maximum (TP > 1)
    // Act-order layers' inputs: [T, widest w.cols of them] in their columns' order, and (TP > 1)
    // every rank's part of a row-parallel layer's input, [tp][T, part].
    float* ordered = nullptr;
    float* order_parts = nullptr;
    PenaltyEntry* penalties = nullptr;  // a step's token penalties, [L * max_penalties]
};

// Rows a step's final norm may hand out: a logits step's max_logit_rows, a hidden step's
// (Engine::forward_hidden) every token of the step.
inline int64_t step_out_rows(const EngineOptions& opt) { return std::max(opt.max_step_tokens, opt.max_logit_rows); }

// Takes the step buffers of one rank's engine from `a`: CudaEngine's workspace (besides cuBLAS's
// scratch), and from a sizing arena its bytes before any engine exists (`shardlm info`).
// opt.max_logit_rows > 0 (the engine's resolved value). `ordered_width`: the widest whole input
// of the act-order layers (widest_input_order; 0: none).
CudaStepBuffers take_step_buffers(DeviceArena& a, const ModelConfig& c, const ShardPlan& p, const EngineOptions& opt,
                                  bool int8_acts, int64_t ordered_width = 0);

class CudaEngine final : public Engine {
public:
    // `comm` is this rank's data plane: SingleRank for one GPU, NcclComm (device buffers, ordered
    // on `stream`) under tensor parallelism. `stream` is where all work goes (null: the engine
    // makes its own). `wait` blocks until the stream is done and reports asynchronous failures
    // (NcclComm::synchronize under TP; null: cudaStreamSynchronize). The current device must be
    // set by the caller. `w` is only read during construction.
    CudaEngine(const ModelConfig& cfg, const ModelWeights& w, Communicator& comm, cudaStream_t stream,
               std::function<void()> wait, const EngineOptions& opt);
    ~CudaEngine() override;

    void forward(const std::vector<SeqChunk>& chunks, float* logits) override;
    void forward_hidden(const std::vector<SeqChunk>& chunks, float* hidden) override;
    void forward_top(const std::vector<SeqChunk>& chunks, int64_t k, float* vals, int32_t* ids) override;
    bool forward_nucleus(const std::vector<SeqChunk>& chunks, int64_t k, float temperature, float* vals, int32_t* ids,
                         uint64_t* mass) override;
    void nucleus_row(int64_t row, float* logits) override;
    void shift_kv(int64_t slot, int64_t keep, int64_t discard, int64_t len) override;
    void copy_kv(int64_t src, int64_t dst, int64_t n) override;
    size_t kv_position_bytes() const override;
    void save_kv(int64_t slot, int64_t n, uint8_t* out) override;
    void load_kv(int64_t slot, int64_t n, const uint8_t* in, int64_t saved) override;
    const ModelConfig& config() const override { return cfg_; }
    const EngineOptions& options() const override { return opt_; }
    // The weights and the adapters' factors (set_adapters), as this rank holds them.
    size_t weight_bytes() const override { return weight_bytes_ + adapter_bytes_; }
    size_t kv_bytes() const override { return kv_bytes_; }
    size_t workspace_bytes() const override { return ws_bytes_; }
    std::string device() const override { return device_name_; }
    // The GEMV grid (kernels/cuda/gemv.h), "+norm" where the norms run inside the GEMVs.
    std::string gemv_kernels(int64_t tokens) const override;
    // Step graphs captured so far (one per step shape seen twice); tests and bench report it.
    size_t graphs_captured() const { return graphs_.size(); }
    // Adapters copied into a device slot when a step needed them (EngineOptions::max_adapters
    // below the adapters loaded), since construction; tests report it.
    int64_t adapter_copies() const { return lora_copies_; }
    // A measurement, not a mode (`bench --ablate`): the steps leave out the kernels of the classes
    // in `mask` (kAblate*), so that a step's time with and without them gives their marginal cost
    // under graphs and PDL, overlap included, where Nsight Compute times each kernel alone. The
    // logits are then meaningless. Drops the captured graphs (each mask captures its own).
    void set_ablation(uint32_t mask);
    // Engine::set_adapters: uploads every adapter's factors (one device buffer each, outside the
    // arena: they come and go while serving) and drops the captured graphs. Throws Error naming
    // the adapter and the bytes where the device has no room.
    void set_adapters(const std::vector<LoraWeights>* adapters) override;

private:
    // What a step's launches depend on besides the device-side tables: its token rows, chunks,
    // longest chunk, logit rows and whether lm_head runs. Steps of one shape replay one graph
    // whatever their tokens, positions, slots and chunk lengths (the kernels read those from meta_).
    struct GraphKey {
        int64_t tokens, chunks, max_chunk, logit_rows;
        bool head;
        bool lora;  // some row runs under an adapter (its kernels read which from meta_)
        bool operator<(const GraphKey& o) const {
            return std::tie(tokens, chunks, max_chunk, logit_rows, head, lora) <
                   std::tie(o.tokens, o.chunks, o.max_chunk, o.logit_rows, o.head, o.lora);
        }
    };
    // Steps whose chunks are at most this long are captured: decode (1) and verify steps of
    // speculative decoding (up to 17). Longer chunks are prefill: compute-bound, where a launch
    // costs little, and of shapes that seldom repeat.
    static constexpr int64_t kGraphMaxChunk = 32;
    // At most this many graphs per engine; steps of further shapes run eagerly. Decode makes one
    // shape per batch size; speculation a few more (the proposals per sequence vary), and the cap
    // bounds the graphs of shapes that come rarely.
    static constexpr size_t kMaxGraphs = 96;

    void layout(DeviceArena& a, const ModelWeights& w);
    void upload(const ModelWeights& w);
    bool headless_ = false;  // ModelWeights::headless: every step that wants logits is refused
    // Queues a step; returns its logit rows. head false: the step stops at the final norm (b_.last),
    // for forward_hidden.
    int64_t launch(const std::vector<SeqChunk>& chunks, bool head = true);
    void wait();  // until the stream is done
    void run_step(int64_t T, int64_t n_chunks, int64_t max_n, int64_t n_logits, bool head);
    void collective(std::function<void()> op);
    // y = x W^T (+ b): GEMV for decode, cuBLAS for prefill; W8A8's INT8 and W4A8's INT4 matrices
    // (int8_product) quantize x first unless int8_acts is false (lm_head, which stays W8A16 as on
    // the CPU), or take the quantized x already in act_q_ / act_scales_ when acts_ready (see norm_for).
    void linear(const CudaLinear& l, const float* x, int64_t T, float* y, bool int8_acts = true,
                bool acts_ready = false);
    // The residual add and the norm into h_ before projection `next`; under W8A8/W4A8, when next
    // takes per-token activation scales, the norm also quantizes h_ into act_q_ / act_scales_ (one kernel
    // instead of two). Returns whether it did: pass that as linear()'s acts_ready for every
    // projection of h_. Where next is act-order and reads h_ alone (`sole`: stacked q/k/v or
    // gate/up), the norm writes h_ in next's order instead of a gather kernel after it (h_order_).
    bool norm_for(const CudaLinear& next, const float* delta, const float* w, int64_t T, bool sole = false);
    // x, or where l is act-order x's columns in l's order (b_.ordered), gathered after an
    // all-gather of every rank's part where l is a row-parallel layer split over ranks: l's input.
    // h_ written in l's order by norm_for is l's input as it is.
    const float* ordered_input(const CudaLinear& l, const float* x, int64_t T);
    // Steps of more than kGemvMaxTokens rows (cuBLAS products): the 16-bit input the products in
    // `ls` share (CublasGemm::input_for), so that the kernel producing it writes it there and the
    // products skip their conversion; data null when they take none or not the same one.
    HalfInput shared_half_input(std::initializer_list<const CudaLinear*> ls, int64_t T) const;
    // Whether products with w take INT8 activations: I8 under W8A8, I4 under W4A8.
    bool int8_product(const DeviceMatrix& w) const {
        return int8_acts_ && (w.dtype == DType::I8 || w.dtype == DType::I4);
    }
    // set_adapters' slots and uploads, into the state it has reset.
    void upload_adapters(const std::vector<LoraWeights>& adapters);
    // Copies adapter `adapter`'s factors into device slot `slot` (on the stream, after the steps
    // queued before) and rewrites the slot's entries of lora_table_ (the caller copies it over).
    void place_adapter(int64_t slot, int64_t adapter);
    // lora_table_ to the device's copy, on the stream.
    void upload_slot_table();
    // Before a step: every adapter of its chunks into a slot, replacing the least recently used
    // ones that it does not use; refuses a step of more adapters than slots.
    void seat_adapters(const std::vector<SeqChunk>& chunks);
    // The LoRA updates of matrices of one input x [T, in] of `layer` (q/k/v, gate/up: one call),
    // for the step's rows under an adapter (nothing in a step without any): each LoraOut's y (rows ldy apart) += its matrix's
    // (`which`: kLoraMatrices' index) update; those no adapter changes are left out.
    struct LoraOut {
        int which;
        float* y;
        int64_t out, ldy;
    };
    void add_lora(int64_t layer, const float* x, int64_t T, int64_t in, std::initializer_list<LoraOut> outs);
    // forward_top, and with temperature set each row's nucleus mass into mass.
    void top_candidates(const std::vector<SeqChunk>& chunks, int64_t k, float* vals, int32_t* ids,
                        const float* temperature, uint64_t* mass);

    const ModelConfig& cfg_;
    ShardPlan plan_;
    Communicator& comm_;
    EngineOptions opt_;
    std::unique_ptr<CudaStream> own_stream_;
    cudaStream_t stream_ = nullptr;
    std::function<void()> wait_;
    std::string device_name_;

    DeviceArena arena_;
    std::unique_ptr<CublasGemm> gemm_;
    std::unique_ptr<CublasInt8Gemm> int8_gemm_;  // W8A8 prefill (W4A8 prefill runs gemm_)
    bool int8_acts_ = false;                      // W8A8 or W4A8 (the layers' only quantized type)
    bool fused_rope_ = false;  // EngineOptions::fused_rope, resolved
    bool fused_norm_ = false;  // EngineOptions::fused_norm, resolved (and only at TP=1, weight-only, no act-order)
    // Whether a step of T token rows runs its norms inside the GEMVs (run_step).
    bool norm_in_gemv(int64_t T) const { return fused_norm_ && T == 1; }
    bool staging_ = false;     // EngineOptions::gemm_staging, resolved (INT8 W8A16 weights only)
    uint32_t ablate_ = 0;      // set_ablation's kernel classes left out
    bool ablated(uint32_t what) const { return (ablate_ & what) != 0; }
    // The matrices of a step in the order the step reads them (per layer q/k/v, o, gate/up, down,
    // fused or not; then lm_head), and each one's place by its data pointer: what prefill staging
    // dequantizes next.
    std::vector<const DeviceMatrix*> read_order_;
    std::unordered_map<const void*, size_t> read_pos_;
    size_t weight_bytes_ = 0, kv_bytes_ = 0, ws_bytes_ = 0;

    // Weights (device pointers into arena_).
    DeviceMatrix embed_, lm_head_;
    const float* final_norm_ = nullptr;
    std::vector<CudaLayer> layers_;
    std::vector<DeviceKVLayer> kv_;
    float* inv_freq_ = nullptr;  // [head_dim / 2]

    // The step's device buffers (in arena_) and their pinned host staging.
    CudaStepBuffers b_;
    PinnedBuffer meta_host_;  // b_.meta's staging copy
    PinnedBuffer logits_host_;
    PinnedBuffer top_host_;   // [tp] of b_.top
    PinnedBuffer mass_host_;
    PinnedBuffer penalty_host_;  // b_.penalties' staging copy

    // LoRA adapters (set_adapters): the host list (SeqChunk::adapter is checked against it); the
    // device slots, each a buffer as large as the largest adapter's factors (one per loaded
    // adapter, or EngineOptions::max_adapters of them); the table of LoraSlot [layer][matrix]
    // [slot] the kernels read (the step's tables give each row's slot) and its host copy; which
    // adapter each slot holds and the slot of each adapter (-1: none), each slot's last step
    // (lora_clock_) for replacing the least recently used; which (layer, matrix) any adapter
    // changes; the shrink's scratch [kLoraMaxParts, max_step_tokens, lora_rank_]; and whether the
    // step being run has rows under an adapter: then it runs the norms and SwiGLU apart from the
    // GEMVs and the products from f32 inputs, since the update reads the products' f32 inputs and
    // adds to their separate outputs.
    const std::vector<LoraWeights>* adapters_ = nullptr;
    std::vector<DeviceBuffer> lora_factors_;
    DeviceBuffer lora_slots_, lora_t_;
    std::vector<LoraSlot> lora_table_;
    std::vector<int64_t> slot_adapter_, adapter_slot_;
    std::vector<uint64_t> slot_used_;
    uint64_t lora_clock_ = 0;
    std::vector<bool> lora_targets_;
    int64_t lora_rank_ = 0;
    DType lora_dtype_ = DType::BF16;
    size_t adapter_bytes_ = 0;
    bool lora_step_ = false;
    // The order norm_for last wrote h_ in (an act-order projection's device order), null: natural.
    const int32_t* h_order_ = nullptr;
    int64_t lora_copies_ = 0;

    std::map<GraphKey, std::unique_ptr<SegmentedGraph>> graphs_;
    std::set<GraphKey> eager_once_;  // shapes whose first step ran eagerly
    SegmentedGraph* recording_ = nullptr;

    // save_kv / load_kv: positions [0, n) of `slot` to or from host memory laid out as
    // kv_position_bytes says, for a copy of `stride` positions.
    void host_copy_kv(int64_t slot, int64_t n, uint8_t* host, int64_t stride, bool save);
};

}  // namespace shardlm
