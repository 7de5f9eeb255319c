// AVX2 + FMA + F16C inner loops of attention_cached (compiled with those -m flags only; called
// after a run-time CPU check). Cache rows are converted to f32 in registers (INT8: widened, and
// the per-row scale folded into the score or the softmax weight), never copied out.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/simd_avx2.h"

namespace shardlm {
namespace {

// G query heads against every key: one pass over the cache rows.
template <DType DT, int G>
void scores_g(const float* q, int64_t d, const KvRows& k, int64_t n_keys, float scale, float* s, int64_t ld) {
    int64_t slot = k.first_slot;
    for (int64_t j = 0; j < n_keys; ++j, slot = slot + 1 == k.capacity ? 0 : slot + 1) {
        const void* row = kv_row_ptr(k, slot);
        __m256 acc[G];
        float tail[G];
        for (int g = 0; g < G; ++g) {
            acc[g] = _mm256_setzero_ps();
            tail[g] = 0.0f;
        }
        int64_t c = 0;
        for (; c + 8 <= d; c += 8) {
            const __m256 kv = load8<DT>(row, c);
            for (int g = 0; g < G; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + c), kv, acc[g]);
        }
        for (; c < d; ++c) {
            const float kv = load1<DT>(row, c);
            for (int g = 0; g < G; ++g) tail[g] += q[g * d + c] * kv;
        }
        const float mult = DT == DType::I8 ? scale * k.scales[slot] : scale;
        for (int g = 0; g < G; ++g) s[g * ld + j] = (hsum(acc[g]) + tail[g]) * mult;
    }
}

// acc[g][c0 .. c0 + 8W) = sum_j p_g[j] * V_j[c0 ..] for G heads, W 8-wide column chunks in registers.
template <DType DT, int G, int W>
void values_block(const float* p, int64_t ld, const KvRows& v, int64_t n_keys, int64_t d, int64_t c0, float* acc) {
    __m256 a[G][W];
    for (int g = 0; g < G; ++g)
        for (int u = 0; u < W; ++u) a[g][u] = _mm256_setzero_ps();
    int64_t slot = v.first_slot;
    for (int64_t j = 0; j < n_keys; ++j, slot = slot + 1 == v.capacity ? 0 : slot + 1) {
        const void* row = kv_row_ptr(v, slot);
        const float vs = DT == DType::I8 ? v.scales[slot] : 1.0f;
        __m256 x[W];
        for (int u = 0; u < W; ++u) x[u] = load8<DT>(row, c0 + 8 * u);
        for (int g = 0; g < G; ++g) {
            const __m256 pj = _mm256_set1_ps(p[g * ld + j] * vs);
            for (int u = 0; u < W; ++u) a[g][u] = _mm256_fmadd_ps(pj, x[u], a[g][u]);
        }
    }
    for (int g = 0; g < G; ++g)
        for (int u = 0; u < W; ++u) _mm256_storeu_ps(acc + g * d + c0 + 8 * u, a[g][u]);
}

template <DType DT, int G>
void values_g(const float* p, int64_t ld, const KvRows& v, int64_t n_keys, int64_t d, float* acc) {
    int64_t c = 0;
    for (; c + 32 <= d; c += 32) values_block<DT, G, 4>(p, ld, v, n_keys, d, c, acc);
    for (; c + 8 <= d; c += 8) values_block<DT, G, 1>(p, ld, v, n_keys, d, c, acc);
    if (c < d) {
        for (int g = 0; g < G; ++g) std::fill(acc + g * d + c, acc + g * d + d, 0.0f);
        int64_t slot = v.first_slot;
        for (int64_t j = 0; j < n_keys; ++j, slot = slot + 1 == v.capacity ? 0 : slot + 1) {
            const void* row = kv_row_ptr(v, slot);
            const float vs = DT == DType::I8 ? v.scales[slot] : 1.0f;
            for (int64_t cc = c; cc < d; ++cc) {
                const float x = load1<DT>(row, cc) * vs;
                for (int g = 0; g < G; ++g) acc[g * d + cc] += p[g * ld + j] * x;
            }
        }
    }
}

template <DType DT>
void scores_dt(const float* q, int64_t nq, int64_t d, const KvRows& k, int64_t n_keys, float scale, float* s, int64_t ld) {
    int64_t g = 0;
    for (; g + 4 <= nq; g += 4) scores_g<DT, 4>(q + g * d, d, k, n_keys, scale, s + g * ld, ld);
    for (; g + 2 <= nq; g += 2) scores_g<DT, 2>(q + g * d, d, k, n_keys, scale, s + g * ld, ld);
    for (; g < nq; ++g) scores_g<DT, 1>(q + g * d, d, k, n_keys, scale, s + g * ld, ld);
}

template <DType DT>
void values_dt(const float* p, int64_t nq, int64_t ld, const KvRows& v, int64_t n_keys, int64_t d, float* acc) {
    int64_t g = 0;
    for (; g + 2 <= nq; g += 2) values_g<DT, 2>(p + g * ld, ld, v, n_keys, d, acc + g * d);
    for (; g < nq; ++g) values_g<DT, 1>(p + g * ld, ld, v, n_keys, d, acc + g * d);
}

// e^x for x <= 0: 2^n * e^r with n = round(x / ln 2), |r| <= ln2 / 2, e^r by its Taylor series to
// r^6 (relative error < 2e-7). Inputs below -87 are clamped (e^-87 ~ 1.6e-38, still a normal
// float), which only matters for weights that are negligible next to the maximum's e^0 = 1.
inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 split hi + lo
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 e = _mm256_set1_ps(1.0f / 720);
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f / 120));
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f / 24));
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f / 6));
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(0.5f));
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f));
    e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f));
    const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(e, _mm256_castsi256_ps(pow2n));
}

}  // namespace

void attn_scores_avx2(const float* q, int64_t nq, int64_t d, const KvRows& k, int64_t n_keys, float scale,
                      float* scores, int64_t ld) {
    switch (k.dtype) {
        case DType::F16: scores_dt<DType::F16>(q, nq, d, k, n_keys, scale, scores, ld); break;
        case DType::BF16: scores_dt<DType::BF16>(q, nq, d, k, n_keys, scale, scores, ld); break;
        case DType::I8: scores_dt<DType::I8>(q, nq, d, k, n_keys, scale, scores, ld); break;
        default: scores_dt<DType::F32>(q, nq, d, k, n_keys, scale, scores, ld); break;
    }
}

float attn_softmax_avx2(float* p, int64_t n) {
    int64_t j = 0;
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    for (; j + 8 <= n; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(p + j));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m8);
    float mx = *std::max_element(lanes, lanes + 8);
    for (; j < n; ++j) mx = std::max(mx, p[j]);
    const __m256 mv = _mm256_set1_ps(mx);
    __m256 s8 = _mm256_setzero_ps();
    for (j = 0; j + 8 <= n; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), mv));
        _mm256_storeu_ps(p + j, e);
        s8 = _mm256_add_ps(s8, e);
    }
    float sum = hsum(s8);
    for (; j < n; ++j) sum += (p[j] = std::exp(p[j] - mx));
    return sum;
}

void attn_values_avx2(const float* p, int64_t nq, int64_t ld, const KvRows& v, int64_t n_keys, int64_t d, float* acc) {
    switch (v.dtype) {
        case DType::F16: values_dt<DType::F16>(p, nq, ld, v, n_keys, d, acc); break;
        case DType::BF16: values_dt<DType::BF16>(p, nq, ld, v, n_keys, d, acc); break;
        case DType::I8: values_dt<DType::I8>(p, nq, ld, v, n_keys, d, acc); break;
        default: values_dt<DType::F32>(p, nq, ld, v, n_keys, d, acc); break;
    }
}

}  // namespace shardlm
