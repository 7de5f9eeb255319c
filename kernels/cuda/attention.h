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
// keys are cut into up to n_splits ranges processed by separate blocks, then merged.
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
    // Split-KV partial results; attention_scratch_bytes() of them. The grid depends only on
    // n_chunks, max_chunk_n and kv.capacity, never on positions, so a captured graph stays valid
    // as the sequences grow.
    void* scratch = nullptr;
    // Decode steps only (every chunk one token, Flash): the RoPE prologue fused into the split-KV
    // kernel. When set, q above is not read: each block makes its query heads from rope->q (the
    // projection's raw output) and the block whose keys hold the newest position writes its k and
    // v into the cache, with rope_kv_cuda(*rope)'s operations (kernels/cuda/rope_head.h), so the
    // result is bit for bit that of rope_kv_cuda followed by attention_cuda. rope->pos and
    // rope->slot are not read (the chunk table says the same); rope->kv must be this layer's cache.
    // One kernel launch less per layer and step.
    const RopeKVParams* rope = nullptr;
};

size_t attention_scratch_bytes(int64_t max_chunks, int64_t n_heads, int64_t head_dim, int64_t capacity);

void attention_cuda(const AttentionCuda& a, AttentionKind kind, cudaStream_t stream);

}  // namespace shardlm
