// Internal to kernels/cpu: the inner loops of attention_cached, per variant.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/attention.h"

namespace shardlm {

// The cache rows of one KV head: row of position j at base + (j % capacity) * row_stride elements;
// I8 rows are scaled by scales[j % capacity]. The per-query loops (attn_*_avx2) walk n_keys rows
// from slot first_slot on, wrapping at capacity: the first key a query sees need not be position 0
// (a sliding window), and the ring may have wrapped.
struct KvRows {
    const void* base = nullptr;
    DType dtype = DType::F32;
    const float* scales = nullptr;
    int64_t capacity = 0, row_stride = 0;
    int64_t first_slot = 0;
    // row_stride in bytes. Kept here because dtype_size is out of line (it throws for I4): called
    // per row inside the per-key loops, it made GCC spill every accumulator and vzeroupper on each
    // key (values_g16: decode attention at batch 4, 2048 keys, 2x slower; see attention_avx512).
    int64_t row_bytes = 0;
};

// The row in slot `slot` (element 0).
inline const void* kv_row_ptr(const KvRows& kv, int64_t slot) {
    return static_cast<const uint8_t*>(kv.base) + size_t(slot * kv.row_bytes);
}

// The keys (values = false) or values of KV head kh of a's cache.
inline KvRows kv_rows(const CachedAttention& a, int64_t kh, bool values) {
    KvRows r;
    r.base = static_cast<const uint8_t*>(values ? a.v : a.k) + size_t(kh * a.capacity * a.row_stride) * dtype_size(a.kv_dtype);
    r.dtype = a.kv_dtype;
    r.capacity = a.capacity;
    r.row_stride = a.row_stride;
    r.row_bytes = a.row_stride * int64_t(dtype_size(a.kv_dtype));
    if (a.kv_dtype == DType::I8) r.scales = (values ? a.v_scales : a.k_scales) + kh * a.capacity;
    return r;
}

// scores[g * ld + j] = scale * q_g . K_j for g < nq (q_g = q + g * d), j < n_keys.
void attn_scores_avx2(const float* q, int64_t nq, int64_t d, const KvRows& k, int64_t n_keys, float scale,
                      float* scores, int64_t ld);
// p[g * ld + j] = exp(p[g * ld + j] - max_j), returns the sum (one head, n values).
float attn_softmax_avx2(float* p, int64_t n);
// acc[g * d + c] = sum_j p[g * ld + j] * V_j[c] for g < nq.
void attn_values_avx2(const float* p, int64_t nq, int64_t ld, const KvRows& v, int64_t n_keys, int64_t d, float* acc);

// The same two steps with AVX-512 (attention_flash_avx512.cpp), for head_dim a multiple of 16 (else
// they run the AVX2 loops): 16 columns per FMA, and the scores of 16 keys reduced together (a 16 x 16
// transpose and adds) instead of one horizontal sum per key and head.
void attn_scores_avx512(const float* q, int64_t nq, int64_t d, const KvRows& k, int64_t n_keys, float scale,
                        float* scores, int64_t ld);
void attn_values_avx512(const float* p, int64_t nq, int64_t ld, const KvRows& v, int64_t n_keys, int64_t d, float* acc);

}  // namespace shardlm
