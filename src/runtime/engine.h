// The forward pass of a Llama-family decoder over the KV cache, as the rest of the runtime sees it.
// One call runs a "step": chunks of several sequences, each chunk a run of consecutive tokens
// that attends to everything its sequence has cached so far. Prefill is a few large chunks,
// decode is one token per sequence; both are the same code. Two backends implement it: the CPU
// engine (runtime/cpu_engine.h) and the CUDA engine (runtime/cuda_engine.h), each on this rank's
// slice of the weights under tensor parallelism.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "kernels/cpu/penalty.h"
#include "kernels/cpu/rope.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/kv_cache.h"

namespace shardlm {

struct LoraWeights;  // model/lora_weights.h

// --attention: Flash is the tiled kernel with an online softmax (and split-KV decode on the GPU),
// Naive the plain per-query passes kept as the fallback and the baseline.
enum class AttentionImpl { Flash, Naive };
AttentionImpl parse_attention(const std::string& s);  // throws Error naming --attention

struct EngineOptions {
    int64_t max_batch = 1;       // KV-cache slots
    int64_t ctx = 0;             // positions per sequence (the cache holds kv_capacity() of them)
    int64_t max_step_tokens = 256;  // workspace rows: the largest chunk sum one step may hold
    int64_t max_logit_rows = 0;     // logit rows one step may produce (0: max_batch)
    DType kv = DType::F32;
    AttentionImpl attention = AttentionImpl::Flash;
    bool cuda_graphs = true;  // CUDA: replay decode steps from captured graphs
    // CPU: each sequence's logits the same bits whatever else its step holds (the other sequences,
    // how its prompt was cut into chunks): matmul's batch_invariant kernels and the per-query
    // attention for every chunk. The CUDA engine refuses it.
    bool batch_invariant = false;
    // CUDA decode: the RoPE prologue run inside the split-KV attention kernel (1) or as its own
    // kernel before it (0); -1: the SHARDLM_FUSED_ROPE environment variable, 1 when unset. Changes
    // no result.
    int fused_rope = -1;
    // CUDA one-token decode steps at TP=1 with weight-only products: each RMSNorm folded into the
    // GEMV after it and each residual add into the GEMV before it (1: kernels/cuda/gemv.h
    // GemvFuse), or run as norm kernels (0); -1: the SHARDLM_FUSED_NORM environment variable, 1
    // when unset. Changes the logits by f32 rounding only (1 / rms scales the sums instead of the
    // inputs). Steps of more tokens keep the norm kernels (faster there on the H200).
    int fused_norm = -1;
    // CUDA prefill with INT8 weights: each matrix dequantized on a side stream while the product
    // before it runs (1), or just before its own product (0); -1: the SHARDLM_GEMM_STAGE
    // environment variable, 0 when unset. Changes no result; costs a second dequantization
    // scratch (the largest layer matrix in FP16).
    int gemm_staging = -1;
    // Ranks of this job on this process's node (MpiComm::local_size; 1 without MPI). They share
    // its host memory: the CPU engine weighs its KV cache against 1/ranks_on_node of what the
    // machine can back (KVCache), so that N ranks that each fit alone are not granted N times it.
    int ranks_on_node = 1;
    // Token penalties (SeqChunk::penalties): the most distinct ids one logits row may list, what
    // the CUDA engine reserves room for up front (0: no penalties).
    int64_t max_penalties = 0;
    // LoRA adapters chosen per sequence (set_adapters): the most whose factors the CUDA engine
    // keeps in device memory at once (vLLM's --max-loras: its GPU slots; the others wait in host
    // memory and are copied in when a step needs them, replacing the least recently used); a step
    // may run at most this many. 0: every adapter resident. The CPU engine reads host memory: no
    // limit there.
    int64_t max_adapters = 0;
};

struct SeqChunk {
    int64_t slot = 0;              // KV-cache slot of the sequence
    const int32_t* tokens = nullptr;
    int64_t n = 0;                 // tokens in this chunk
    int64_t pos = 0;               // position of tokens[0]; everything before is cached
    bool want_logits = false;      // produce logits at the chunk's last token
    bool all_logits = false;       // produce logits at every token of the chunk (perplexity)
    // Token penalties on the logits row of a want_logits chunk (not all_logits), applied before
    // anything reads the row (kernels/cpu/penalty.h): n_penalties entries with distinct ids, their
    // `row` fields ignored (the engine numbers the rows), at most EngineOptions::max_penalties.
    const PenaltyEntry* penalties = nullptr;
    int64_t n_penalties = 0;
    // The LoRA adapter the chunk's sequence runs under (model/lora_weights.h; Engine::set_adapters
    // numbers them), -1: the base model.
    int64_t adapter = -1;
};

// The most candidates per row Engine::forward_top hands back (the GPU selection's limit).
constexpr int64_t kMaxTopCandidates = 1024;

class Engine {
public:
    virtual ~Engine() = default;
    // Runs the chunks; `logits` receives, chunk by chunk in order, n rows for an all_logits chunk
    // and one row for a want_logits chunk: [rows, vocab].
    virtual void forward(const std::vector<SeqChunk>& chunks, float* logits) = 0;
    // Runs the chunks like forward() but hands back, for the same rows, the final RMSNorm's output
    // instead of logits: [rows, hidden], what an embedding model pools (runtime/embed.h). No
    // lm_head runs and no penalties apply. Every rank gets whole rows (the residual stream is
    // replicated under tensor parallelism). Its rows are not limited by max_logit_rows: up to one
    // per token of the step.
    virtual void forward_hidden(const std::vector<SeqChunk>& chunks, float* hidden) = 0;
    // Runs the chunks like forward() but hands back only each logits row's first k candidates in
    // the sampler's ranking (runtime/sampler.h): vals and ids [rows, k], 1 <= k <= min(vocab,
    // kMaxTopCandidates). What a sampler with top-k (or greedy) reads, without moving the
    // vocabulary: the CUDA engine selects on the device (and merges the ranks' candidates under
    // tensor parallelism); this default ranks forward()'s rows on the host.
    virtual void forward_top(const std::vector<SeqChunk>& chunks, int64_t k, float* vals, int32_t* ids);
    // forward_top for top-p sampling without a top-k limit: also each row's total nucleus weight
    // at `temperature` (kernels/cpu/nucleus.h) in mass [rows], from which Sampler::sample_nucleus
    // draws out of the k candidates what it would draw from the row. Returns false, running
    // nothing, where the engine cannot (this default: the CPU engine has whole rows at hand):
    // then forward() the step.
    virtual bool forward_nucleus(const std::vector<SeqChunk>& chunks, int64_t k, float temperature, float* vals,
                                 int32_t* ids, uint64_t* mass);
    // After forward_nucleus: the whole logits row `row` of that step ([vocab]), for a nucleus that
    // reaches past the candidates (a collective under tensor parallelism: every rank asks).
    virtual void nucleus_row(int64_t row, float* logits);
    // Context shift of the sequence in `slot`, which has positions [0, len) cached: positions
    // [keep + discard, len) become [keep, len - discard), their keys turned back by `discard`
    // positions, and the discarded ones are gone; the sequence goes on at position len - discard.
    // For --context-overflow slide (runtime/generate.h). Local to each rank (its own KV heads).
    virtual void shift_kv(int64_t slot, int64_t keep, int64_t discard, int64_t len) = 0;
    // Copies the keys and values of positions [0, n) of the sequence in slot `src` into slot `dst`
    // (rows and INT8 scales as they are): dst's sequence then goes on at position n as if it had
    // run those tokens. Prefix sharing between sequences (runtime/batcher.h); the caller knows that
    // src holds them (its ring has not wrapped past them). Ordered with the steps; local to each rank.
    virtual void copy_kv(int64_t src, int64_t dst, int64_t n) = 0;
    // The prefix cache's host tier (BatcherOptions::host_cache_bytes): save_kv copies the keys and
    // values of positions [0, n) of the sequence in `slot` (rows and INT8 scales as they are) to
    // host memory, n * kv_position_bytes() bytes at `out`, done when it returns; load_kv puts the
    // first n positions of such a copy of `saved` >= n positions back as positions [0, n) of a
    // slot, whose sequence then goes on at position n as if it had run those tokens (`in` may be
    // freed once it returns). Ordered with the steps; local to each rank (its own KV heads).
    // 1 <= n <= kv_capacity.
    virtual size_t kv_position_bytes() const = 0;
    virtual void save_kv(int64_t slot, int64_t n, uint8_t* out) = 0;
    virtual void load_kv(int64_t slot, int64_t n, const uint8_t* in, int64_t saved) = 0;
    virtual const ModelConfig& config() const = 0;
    virtual const EngineOptions& options() const = 0;
    virtual size_t weight_bytes() const = 0;     // as held by this rank's engine
    virtual size_t kv_bytes() const = 0;
    virtual size_t workspace_bytes() const = 0;
    virtual std::string device() const = 0;      // "cpu(avx512)", "cuda:0 NVIDIA H200", ...
    // The decode GEMVs a step of `tokens` one-token rows runs, for benchmark rows: "-" where the
    // engine has one kind (the CPU's), else e.g. "persistent+norm" (CudaEngine).
    virtual std::string gemv_kernels(int64_t tokens) const {
        (void)tokens;
        return "-";
    }
    // LoRA adapters chosen per chunk (SeqChunk::adapter indexes them): this rank's slices, which
    // must outlive the engine's steps; one without layers is unloaded. Called again after the list
    // changes (serve's runtime loads), between steps. Throws Error where they cannot be held (the
    // CPU's scratch or the GPU's memory refused); this default, for engines without LoRA, where
    // any is given.
    virtual void set_adapters(const std::vector<LoraWeights>* adapters);
};

// What every backend checks of a step's adapters (SeqChunk::adapter): -1, or an adapter of
// `adapters` (null: none) that is loaded.
void check_adapters(const std::vector<SeqChunk>& chunks, const std::vector<LoraWeights>* adapters);

// One rank's ranked candidates of a logits row: its vocabulary slice's first n in the sampler's
// ranking (values, global ids).
struct CandidateList {
    const float* vals = nullptr;
    const int32_t* ids = nullptr;
    int64_t n = 0;
};
// The row's first k candidates merged from the ranks' lists (vocab-parallel lm_head). Exact when
// each list holds min(k, its slice) candidates: an element among the row's first k has fewer than
// k elements ranked before it, so fewer than k in its own slice. Needs k <= the lists' total.
void merge_candidates(const std::vector<CandidateList>& parts, int64_t k, float* vals, int32_t* ids);

// What the engines refuse a step that wants logits with on a model loaded without its lm_head
// (ModelWeights::headless).
std::string headless_message();

// The rotary embedding of a model's config (theta, its rope scaling) as the kernels take it.
RopeParams rope_params(const ModelConfig& c);
// The attention's score scale: 1/sqrt(head_dim), times YaRN's attention_factor squared (HF scales
// cos and sin by it, so q and k each; here the scores are, and the cache keeps unscaled keys).
float attention_scale(const ModelConfig& c);

// What every backend checks before a step: chunk bounds, positions within the cache, ids within
// the vocabulary, and the workspace limits. Returns the step's token rows and logit rows.
struct StepShape {
    int64_t tokens = 0, logit_rows = 0;
};
// A hidden step (Engine::forward_hidden) may want a row per token: its rows are bounded by the
// step's tokens, not by max_logit_rows (no vocabulary-wide buffer holds them).
StepShape check_step(const ModelConfig& c, const EngineOptions& opt, const std::vector<SeqChunk>& chunks,
                     bool hidden = false);
// The step's token penalties (SeqChunk::penalties) in chunk order, each entry's `row` set to its
// chunk's logits row in the step. For the engines, after check_step.
std::vector<PenaltyEntry> step_penalties(const std::vector<SeqChunk>& chunks);
// Positions each slot's KV cache holds. opt.ctx, except for a model whose every layer slides over
// a window W: a ring of W + max_step_tokens - 1 rows (when shorter), the least that keeps every key
// a chunk's queries see while the chunk writes its own rows (position p in row p % capacity).
int64_t kv_capacity(const ModelConfig& c, const EngineOptions& opt);
// The CPU KV cache of a rank holding n_kv_heads heads: opt.max_batch slots of kv_capacity positions
// in opt.kv (what CpuEngine allocates, check_context bounds and shardlm info prints).
KVCacheShape kv_cache_shape(const ModelConfig& c, int64_t n_kv_heads, const EngineOptions& opt);

// What every backend checks before Engine::shift_kv (the shifted positions must all be cached).
void check_shift(const ModelConfig& c, const EngineOptions& opt, int64_t slot, int64_t keep, int64_t discard,
                 int64_t len);
// What every backend checks before Engine::copy_kv: two distinct slots, 1 <= n <= kv_capacity.
void check_copy(const ModelConfig& c, const EngineOptions& opt, int64_t src, int64_t dst, int64_t n);
// What every backend checks before Engine::save_kv and load_kv: a slot, 1 <= n <= kv_capacity,
// and n <= saved (a load's copy; save_kv: saved = n).
void check_kv_io(const ModelConfig& c, const EngineOptions& opt, int64_t slot, int64_t n, int64_t saved);

}  // namespace shardlm
