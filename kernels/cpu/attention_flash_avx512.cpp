// AVX-512 score and value steps of attention_cached_flash (the tile copy and the softmax stay in
// attention_flash_avx2.cpp). 32 zmm registers: 4 rows x 64 columns keep 16 accumulators live, and
// the row's broadcast folds into the FMA's memory operand. Also the decode steps that read the
// cache rows in place (attn_scores_avx512 / attn_values_avx512, attention_kernels.h).
//
// simd_avx512.h first: it silences GCC 12's false warnings inside <immintrin.h>, which must not be
// parsed before it.
#include "kernels/cpu/simd_avx512.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/attention_kernels.h"

namespace shardlm {
namespace {

// s[r][0 .. 16W) = sum_c q[r][c] * kt[c][..] for RB rows.
template <int RB, int W>
inline void scores_block(const float* q, int64_t d, const float* kt, int64_t ldk, float* s, int64_t lds) {
    __m512 acc[RB][W];
    for (int r = 0; r < RB; ++r)
        for (int u = 0; u < W; ++u) acc[r][u] = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; ++c) {
        __m512 kv[W];
        for (int u = 0; u < W; ++u) kv[u] = _mm512_loadu_ps(kt + c * ldk + 16 * u);
        for (int r = 0; r < RB; ++r) {
            const __m512 b = _mm512_set1_ps(q[r * d + c]);
            for (int u = 0; u < W; ++u) acc[r][u] = _mm512_fmadd_ps(b, kv[u], acc[r][u]);
        }
    }
    for (int r = 0; r < RB; ++r)
        for (int u = 0; u < W; ++u) _mm512_storeu_ps(s + r * lds + 16 * u, acc[r][u]);
}

// The same over 8 columns (a tile's ragged end), in the lower half of a zmm.
template <int RB>
inline void scores_block8(const float* q, int64_t d, const float* kt, int64_t ldk, float* s, int64_t lds) {
    __m256 acc[RB];
    for (int r = 0; r < RB; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; ++c) {
        const __m256 kv = _mm256_loadu_ps(kt + c * ldk);
        for (int r = 0; r < RB; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(q[r * d + c]), kv, acc[r]);
    }
    for (int r = 0; r < RB; ++r) _mm256_storeu_ps(s + r * lds, acc[r]);
}

template <int RB>
inline void scores_rows(const float* q, int64_t d, const float* kt, int64_t ldk, int64_t np, float* s, int64_t lds) {
    int64_t j = 0;
    for (; j + 64 <= np; j += 64) scores_block<RB, 4>(q, d, kt + j, ldk, s + j, lds);
    for (; j + 16 <= np; j += 16) scores_block<RB, 1>(q, d, kt + j, ldk, s + j, lds);
    for (; j < np; j += 8) scores_block8<RB>(q, d, kt + j, ldk, s + j, lds);
}

// o[r][0 .. 16W) = alpha[r] * o[r][..] + sum_{j < n} p[r][j] * vt[j][..] for RB rows.
template <int RB, int W>
inline void values_block(const float* p, int64_t lds, const float* vt, int64_t n, int64_t d, const float* alpha,
                         float* o) {
    __m512 acc[RB][W];
    for (int r = 0; r < RB; ++r)
        for (int u = 0; u < W; ++u) acc[r][u] = _mm512_mul_ps(_mm512_set1_ps(alpha[r]), _mm512_loadu_ps(o + r * d + 16 * u));
    for (int64_t j = 0; j < n; ++j) {
        __m512 x[W];
        for (int u = 0; u < W; ++u) x[u] = _mm512_loadu_ps(vt + j * d + 16 * u);
        for (int r = 0; r < RB; ++r) {
            const __m512 b = _mm512_set1_ps(p[r * lds + j]);
            for (int u = 0; u < W; ++u) acc[r][u] = _mm512_fmadd_ps(b, x[u], acc[r][u]);
        }
    }
    for (int r = 0; r < RB; ++r)
        for (int u = 0; u < W; ++u) _mm512_storeu_ps(o + r * d + 16 * u, acc[r][u]);
}

template <int RB>
inline void values_rows(const float* p, int64_t lds, const float* vt, int64_t n, int64_t d, const float* alpha,
                        float* o) {
    int64_t c = 0;
    for (; c + 64 <= d; c += 64) values_block<RB, 4>(p, lds, vt + c, n, d, alpha, o + c);
    for (; c + 16 <= d; c += 16) values_block<RB, 1>(p, lds, vt + c, n, d, alpha, o + c);
    for (; c < d; ++c)  // head_dim not a multiple of 16
        for (int r = 0; r < RB; ++r) {
            float acc = alpha[r] * o[r * d + c];
            for (int64_t j = 0; j < n; ++j) acc += p[r * lds + j] * vt[j * d + c];
            o[r * d + c] = acc;
        }
}

// ---------------------------------------------------------------------------------------------
// Decode steps over the cache rows in place (INT8 rows widened in registers, their scale folded into
// the score or the softmax weight, as the AVX2 loops do).

// G query heads against keys in blocks of 16: per key and head a 16-lane partial sum over the head
// dim, then the block's 16 partial sums transposed and added into its 16 scores.
template <DType DT, int G>
void scores_g16(const float* q, int64_t d, const KvRows& k, int64_t n_keys, float scale, float* s, int64_t ld) {
    alignas(64) float part[G][16][16];
    alignas(64) float mult[16] = {};  // lanes past a short last block stay finite (their scores are not stored)
    int64_t slot = k.first_slot;
    for (int64_t j0 = 0; j0 < n_keys; j0 += 16) {
        const int64_t nb = std::min<int64_t>(16, n_keys - j0);
        for (int64_t j = 0; j < 16; ++j) {
            if (j >= nb) {
                for (int g = 0; g < G; ++g) _mm512_store_ps(part[g][j], _mm512_setzero_ps());
                continue;
            }
            const void* row = kv_row_ptr(k, slot);
            __m512 acc[G];
            for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
            for (int64_t c = 0; c < d; c += 16) {
                const __m512 kv = load16<DT>(row, c);
                for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * d + c), kv, acc[g]);
            }
            for (int g = 0; g < G; ++g) _mm512_store_ps(part[g][j], acc[g]);
            mult[j] = DT == DType::I8 ? scale * k.scales[slot] : scale;
            slot = slot + 1 == k.capacity ? 0 : slot + 1;
        }
        const __m512 m = _mm512_load_ps(mult);
        for (int g = 0; g < G; ++g) {
            __m512 r[16];
            for (int j = 0; j < 16; ++j) r[j] = _mm512_load_ps(part[g][j]);
            transpose16(r);  // r[c] lane j: key j's partial sum c
            for (int w = 8; w >= 1; w /= 2)
                for (int c = 0; c < w; ++c) r[c] = _mm512_add_ps(r[c], r[c + w]);
            _mm512_mask_storeu_ps(s + g * ld + j0, mask16(nb), _mm512_mul_ps(r[0], m));
        }
    }
}

// acc[g][c0 .. c0 + 16W) = sum_j p_g[j] * V_j[c0 ..] for G heads.
template <DType DT, int G, int W>
void values_g16(const float* p, int64_t ld, const KvRows& v, int64_t n_keys, int64_t c0, int64_t d, float* acc) {
    __m512 a[G][W];
    for (int g = 0; g < G; ++g)
        for (int u = 0; u < W; ++u) a[g][u] = _mm512_setzero_ps();
    int64_t slot = v.first_slot;
    for (int64_t j = 0; j < n_keys; ++j, slot = slot + 1 == v.capacity ? 0 : slot + 1) {
        const void* row = kv_row_ptr(v, slot);
        const float vs = DT == DType::I8 ? v.scales[slot] : 1.0f;
        __m512 x[W];
        for (int u = 0; u < W; ++u) x[u] = load16<DT>(row, c0 + 16 * u);
        for (int g = 0; g < G; ++g) {
            const __m512 pj = _mm512_set1_ps(p[g * ld + j] * vs);
            for (int u = 0; u < W; ++u) a[g][u] = _mm512_fmadd_ps(pj, x[u], a[g][u]);
        }
    }
    for (int g = 0; g < G; ++g)
        for (int u = 0; u < W; ++u) _mm512_storeu_ps(acc + g * d + c0 + 16 * u, a[g][u]);
}

template <DType DT, int G>
void values_cols(const float* p, int64_t ld, const KvRows& v, int64_t n_keys, int64_t d, float* acc) {
    int64_t c = 0;
    for (; c + 128 <= d; c += 128) values_g16<DT, G, 8>(p, ld, v, n_keys, c, d, acc);
    for (; c + 64 <= d; c += 64) values_g16<DT, G, 4>(p, ld, v, n_keys, c, d, acc);
    for (; c < d; c += 16) values_g16<DT, G, 1>(p, ld, v, n_keys, c, d, acc);
}

template <DType DT>
void scores_dt(const float* q, int64_t nq, int64_t d, const KvRows& k, int64_t n_keys, float scale, float* s, int64_t ld) {
    int64_t g = 0;
    for (; g + 2 <= nq; g += 2) scores_g16<DT, 2>(q + g * d, d, k, n_keys, scale, s + g * ld, ld);
    for (; g < nq; ++g) scores_g16<DT, 1>(q + g * d, d, k, n_keys, scale, s + g * ld, ld);
}

template <DType DT>
void values_dt(const float* p, int64_t nq, int64_t ld, const KvRows& v, int64_t n_keys, int64_t d, float* acc) {
    int64_t g = 0;
    for (; g + 2 <= nq; g += 2) values_cols<DT, 2>(p + g * ld, ld, v, n_keys, d, acc + g * d);
    for (; g < nq; ++g) values_cols<DT, 1>(p + g * ld, ld, v, n_keys, d, acc + g * d);
}

}  // namespace

void attn_scores_avx512(const float* q, int64_t nq, int64_t d, const KvRows& k, int64_t n_keys, float scale,
                        float* scores, int64_t ld) {
    if (d % 16) return attn_scores_avx2(q, nq, d, k, n_keys, scale, scores, ld);
    switch (k.dtype) {
        case DType::F16: scores_dt<DType::F16>(q, nq, d, k, n_keys, scale, scores, ld); break;
        case DType::BF16: scores_dt<DType::BF16>(q, nq, d, k, n_keys, scale, scores, ld); break;
        case DType::I8: scores_dt<DType::I8>(q, nq, d, k, n_keys, scale, scores, ld); break;
        default: scores_dt<DType::F32>(q, nq, d, k, n_keys, scale, scores, ld); break;
    }
}

void attn_values_avx512(const float* p, int64_t nq, int64_t ld, const KvRows& v, int64_t n_keys, int64_t d, float* acc) {
    if (d % 16) return attn_values_avx2(p, nq, ld, v, n_keys, d, acc);
    switch (v.dtype) {
        case DType::F16: values_dt<DType::F16>(p, nq, ld, v, n_keys, d, acc); break;
        case DType::BF16: values_dt<DType::BF16>(p, nq, ld, v, n_keys, d, acc); break;
        case DType::I8: values_dt<DType::I8>(p, nq, ld, v, n_keys, d, acc); break;
        default: values_dt<DType::F32>(p, nq, ld, v, n_keys, d, acc); break;
    }
}

void flash_scores_avx512(const float* q, int64_t rows, int64_t d, const float* kt, int64_t ldk, int64_t n, float* s,
                         int64_t lds) {
    const int64_t np = (n + 7) / 8 * 8;
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) scores_rows<4>(q + r * d, d, kt, ldk, np, s + r * lds, lds);
    for (; r < rows; ++r) scores_rows<1>(q + r * d, d, kt, ldk, np, s + r * lds, lds);
}

void flash_values_avx512(const float* p, int64_t lds, int64_t rows, const float* vt, int64_t n, int64_t d,
                         const float* alpha, float* o) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) values_rows<4>(p + r * lds, lds, vt, n, d, alpha + r, o + r * d);
    for (; r < rows; ++r) values_rows<1>(p + r * lds, lds, vt, n, d, alpha + r, o + r * d);
}

}  // namespace shardlm
