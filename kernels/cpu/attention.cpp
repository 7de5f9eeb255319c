// attention_cached: the work split (one query x one KV head, i.e. all query heads of a GQA group,
// so each cache row is read once per group), f32 softmax, and the scalar inner loops. The
// vectorised inner loops are in attention_avx2.cpp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_kernels.h"

namespace shardlm {
namespace {

inline float cache_value(const KvRows& kv, int64_t j, int64_t c) {
    const int64_t slot = (kv.first_slot + j) % kv.capacity, off = slot * kv.row_stride + c;
    switch (kv.dtype) {
        case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(kv.base)[off]);
        case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(kv.base)[off]);
        case DType::I8: return float(static_cast<const int8_t*>(kv.base)[off]) * kv.scales[slot];
        default: return static_cast<const float*>(kv.base)[off];
    }
}

void scores_scalar(const float* q, int64_t nq, int64_t d, const KvRows& k, int64_t n_keys, float scale, float* s,
                   int64_t ld) {
    for (int64_t g = 0; g < nq; ++g)
        for (int64_t j = 0; j < n_keys; ++j) {
            float acc = 0;
            for (int64_t c = 0; c < d; ++c) acc += q[g * d + c] * cache_value(k, j, c);
            s[g * ld + j] = acc * scale;
        }
}

float softmax_scalar(float* p, int64_t n) {
    float mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, p[j]);
    for (int64_t j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - mx));
    return sum;
}

void values_scalar(const float* p, int64_t nq, int64_t ld, const KvRows& v, int64_t n_keys, int64_t d, float* acc) {
    std::fill(acc, acc + nq * d, 0.0f);
    for (int64_t j = 0; j < n_keys; ++j)
        for (int64_t c = 0; c < d; ++c) {
            const float x = cache_value(v, j, c);
            for (int64_t g = 0; g < nq; ++g) acc[g * d + c] += p[g * ld + j] * x;
        }
}

}  // namespace

void attention_cached(const CachedAttention& a) {
    SHARDLM_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 && a.capacity > 0, "attention: bad head counts");
    SHARDLM_CHECK(a.kv_dtype != DType::I8 || (a.k_scales && a.v_scales), "attention: INT8 KV cache needs scales");
    const int64_t d = a.head_dim, group = a.n_heads / a.n_kv_heads;
    // Score rows as long as the most keys one query sees: the context, or the window.
    const int64_t work = a.n_q * a.n_kv_heads,
                  ld = a.window > 0 ? std::min(a.window, a.q_pos0 + a.n_q) : a.q_pos0 + a.n_q;
    const CpuIsa isa = cpu_isa_resolve(a.isa);
    const bool vec = isa != CpuIsa::Scalar;  // any vector variant implies AVX2
    const bool avx512 = cpu_isa_avx512(isa);
    (void)vec;
    (void)avx512;
#pragma omp parallel if (work > 1)
    {
        std::vector<float> scores(size_t(group * ld)), acc(size_t(group * d)), sums(static_cast<size_t>(group));
#pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < work; ++w) {
            const int64_t i = w / a.n_kv_heads, kh = w % a.n_kv_heads, lo = window_start(a.q_pos0 + i, a.window);
            const int64_t n_keys = a.q_pos0 + i + 1 - lo;
            KvRows K = kv_rows(a, kh, false), V = kv_rows(a, kh, true);
            K.first_slot = V.first_slot = lo % a.capacity;
            const float* q = a.q + (i * a.n_heads + kh * group) * d;  // the group's heads are adjacent
            float* s = scores.data();
#if defined(SHARDLM_HAVE_AVX2)
            if (vec) {
#if defined(SHARDLM_HAVE_AVX512)
                if (avx512) attn_scores_avx512(q, group, d, K, n_keys, a.scale, s, ld);
                else
#endif
                    attn_scores_avx2(q, group, d, K, n_keys, a.scale, s, ld);
                for (int64_t g = 0; g < group; ++g) sums[size_t(g)] = attn_softmax_avx2(s + g * ld, n_keys);
#if defined(SHARDLM_HAVE_AVX512)
                if (avx512) attn_values_avx512(s, group, ld, V, n_keys, d, acc.data());
                else
#endif
                    attn_values_avx2(s, group, ld, V, n_keys, d, acc.data());
            } else
#endif
            {
                scores_scalar(q, group, d, K, n_keys, a.scale, s, ld);
                for (int64_t g = 0; g < group; ++g) sums[size_t(g)] = softmax_scalar(s + g * ld, n_keys);
                values_scalar(s, group, ld, V, n_keys, d, acc.data());
            }
            for (int64_t g = 0; g < group; ++g) {
                float* o = a.out + (i * a.n_heads + kh * group + g) * d;
                const float inv = 1.0f / sums[size_t(g)];
                for (int64_t c = 0; c < d; ++c) o[c] = acc[size_t(g * d + c)] * inv;
            }
        }
    }
}

}  // namespace shardlm
