// Causal grouped-query attention over the device KV cache (kernels/cuda/kv_layout.h), FP32 math
// (scores, softmax, sums). Query head h reads KV head h / (n_heads / n_kv_heads). The step's
// keys and values are already in the cache (rope_kv_cuda), so a chunk attends to its own tokens
// and to everything cached before it through one path. Same results as attention_cached in
// kernels/cpu/attention.h, chunk by chunk.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kv_layout.h"
#include "kernels/cuda/rope_kv.h"

namespace shardlm {

// Flash: FlashAttention-2 style tiles of queries against tiles of keys in shared memory with an
// online softmax for chunks of several tokens, and split-KV for one-token (decode) chunks: the
// keys are cut into up to n_splits ranges processed by separate blocks, then merged (by the last
// of those blocks to finish, or by a separate kernel: AttentionCuda::fused_merge).
// On sm_80 and later, Flash runs the tiles of an F16, BF16 or I8 cache with head_dim <= 128 on
// tensor cores (prefill_tensor_cores()); FlashFp32 keeps them on the FP32 pipes, as Flash does for
// an F32 cache, larger heads and older GPUs (same tiles, same results to FP32 rounding).
// Naive: one block per (query, head) making three plain passes over the keys (max, sum,
// weighted values); the fallback and the baseline.
enum class AttentionKind { Flash, FlashFp32, Naive };

struct AttentionCuda {
    const float* q = nullptr;  // [T, n_heads * head_dim]
    float* out = nullptr;      // [T, n_heads * head_dim]
    const AttnChunk* chunks = nullptr;  // device [n_chunks]
    int64_t n_chunks = 0;
    int64_t max_chunk_n = 0;  // largest chunk n (host-known; sizes the grid)
    int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
    float scale = 1.0f;
    // Sliding window (0: none): the query at position p sees keys max(0, p - window + 1) .. p.
    // The cache must hold all of them (kv.capacity >= window + max_chunk_n - 1 when it wraps).
    int64_t window = 0;
    DeviceKVLayer kv;
    // Split-KV partial results and the fused merge's counters: attention_scratch_bytes() of
    // them, zeroed once by attention_scratch_init() after allocation (see there). The grid depends
    // only on n_chunks, max_chunk_n and kv.capacity, never on positions, so a captured graph stays
    // valid as the sequences grow.
    void* scratch = nullptr;
    // Decode steps only (every chunk one token, Flash): the RoPE prologue fused into the split-KV
    // kernel. When set, q above is not read: each block makes its query heads from rope->q (the
    // projection's raw output) and the block whose keys hold the newest position writes its k and
    // v into the cache, with rope_kv_cuda(*rope)'s operations (kernels/cuda/rope_head.h), so the
    // result is bit for bit that of rope_kv_cuda followed by attention_cuda. rope->pos and
    // rope->slot are not read (the chunk table says the same); rope->kv must be this layer's cache.
    // One kernel launch less per layer and step.
    const RopeKVParams* rope = nullptr;
    // Decode steps only (Flash): who merges the splits' partial results. 1: the split-KV kernel
    // itself, in the last of a block row's split blocks to finish (a counter per (chunk, block
    // row) in the scratch); 0: a separate merge kernel after it (one launch more per layer, ~3 us
    // on an H200). The same result bit for bit. -1: decode_merge_fused() (kernels/cuda/device.h:
    // SHARDLM_FUSED_MERGE, fused when unset).
    int fused_merge = -1;
};

// Bytes of AttentionCuda::scratch for decode batches of up to max_chunks chunks of these heads over
// a cache of this capacity: per chunk, each (query head, split)'s partial record and the fused
// merge's counters. One scratch serves every call with these n_heads, head_dim and capacity (the
// layers of a model, in turn on one stream) and any n_chunks up to max_chunks; the counters' place
// depends on the shape, so a call of another shape on it needs attention_scratch_init() first.
size_t attention_scratch_bytes(int64_t max_chunks, int64_t n_heads, int64_t head_dim, int64_t capacity);

// Zeroes `bytes` of scratch on `stream` (cudaMemsetAsync). Call it once after allocating the
// scratch, before its first attention_cuda: the fused merge's counters must start at zero. Every
// decode launch returns them to zero by the time it completes (the last block to count resets
// its counter), so eager steps and graph replays need nothing more; a launch that did not
// complete (a failed or aborted stream) leaves them undefined: zero the scratch again before
// reusing it.
void attention_scratch_init(void* scratch, size_t bytes, cudaStream_t stream);

void attention_cuda(const AttentionCuda& a, AttentionKind kind, cudaStream_t stream);

}  // namespace shardlm
