// The attention prologue of one layer on the GPU, fused: Qwen3's per-head q/k RMSNorm (optional),
// rotary embedding of q and k (kernels/cpu/rope.h's rotate-half layout, angle pos * inv_freq[i]),
// and the write of k (after RoPE) and v into the KV cache, quantized to INT8 with one scale per
// (token, head) when the cache is INT8. Pointers are device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kv_layout.h"

namespace shardlm {

struct RopeKVParams {
    float* q = nullptr;        // [T, n_heads * head_dim], rotated in place (or into q_out)
    float* k = nullptr;        // [T, n_kv_heads * head_dim], normed and rotated in place
    const float* v = nullptr;  // [T, n_kv_heads * head_dim]
    // Elements from one token's row to the next in q, k and v; 0: each tensor is packed. A fused
    // QKV projection writes [T, q | k | v] rows, so q, k, v point into one row at their offsets
    // and row_stride is the fused width.
    int64_t row_stride = 0;
    float* q_out = nullptr;    // [T, n_heads * head_dim] packed rotated q; null: q in place
    int64_t T = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
    const int32_t* pos = nullptr;   // [T] position of each row
    const int32_t* slot = nullptr;  // [T] KV-cache slot of each row
    const float* inv_freq = nullptr;  // [head_dim / 2]
    const float* q_norm = nullptr;    // [head_dim] or null (no q/k norm)
    const float* k_norm = nullptr;    // [head_dim] or null
    float eps = 1e-6f;
    DeviceKVLayer kv;  // this layer's cache; row pos % capacity of slot receives k and v
};

void rope_kv_cuda(const RopeKVParams& p, cudaStream_t stream);

}  // namespace shardlm
