// Causal grouped-query attention in FP32 (scores, softmax and sums), one sequence at a time.
// Query head h reads KV head h / (n_heads / n_kv_heads).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/cpu_isa.h"

namespace shardlm {

// The first key a query at position `pos` sees: 0, or under a sliding window of `window` > 0
// positions pos - window + 1 (Hugging Face's kv_idx > q_idx - sliding_window).
inline int64_t window_start(int64_t pos, int64_t window) { return window > 0 && pos >= window ? pos - window + 1 : 0; }

// Plain truth over contiguous tensors: q/out [n_q, n_heads, d], k/v [n_k, n_kv_heads, d].
// Query i sits at position q_pos0 + i and sees keys window_start(q_pos0 + i, window) .. q_pos0 + i
// (n_k >= q_pos0 + n_q; window 0: all earlier keys).
void attention_ref(const float* q, const float* k, const float* v, float* out, int64_t n_q, int64_t n_k,
                   int64_t n_heads, int64_t n_kv_heads, int64_t d, int64_t q_pos0, float scale, int64_t window = 0);

// The engine's attention over one sequence's KV cache. Layout of k and v:
// [n_kv_heads][capacity][row_stride] elements of kv_dtype; position p lives in slot p % capacity.
// kv_dtype I8: symmetric INT8 rows (quantize_row_int8 in quantize.h) with one scale per
// (KV head, slot): K[h][s][c] = k[h][s][c] * k_scales[h * capacity + s], likewise V.
struct CachedAttention {
    const float* q = nullptr;  // [n_q, n_heads, head_dim]
    float* out = nullptr;      // [n_q, n_heads, head_dim]
    int64_t n_q = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
    int64_t q_pos0 = 0;  // query i attends to positions [window_start(q_pos0 + i, window), q_pos0 + i]
    int64_t window = 0;  // sliding window (0: none); the cache then holds at least the window's rows
    const void* k = nullptr;
    const void* v = nullptr;
    DType kv_dtype = DType::F32;  // F32, F16, BF16 or I8
    int64_t capacity = 0, row_stride = 0;
    float scale = 1.0f;
    const float* k_scales = nullptr;  // I8 only: [n_kv_heads][capacity]
    const float* v_scales = nullptr;  // I8 only: [n_kv_heads][capacity]
    CpuIsa isa = CpuIsa::Auto;        // tests pin a variant; the AVX-512 variant runs the AVX2 loops
};

void attention_cached(const CachedAttention& a);

// The same contract and results, FlashAttention-style: a block of queries of one KV head's group
// (all its query heads) against tiles of keys dequantized once to f32, with an online softmax
// (running max m and sum l per row; the accumulator rescaled by e^(m_old - m_new) per tile), so
// no score row as long as the context is ever materialised. Pays in prefill, where one tile
// serves many queries; in decode it reads the cache as attention_cached does.
void attention_cached_flash(const CachedAttention& a);

}  // namespace shardlm
