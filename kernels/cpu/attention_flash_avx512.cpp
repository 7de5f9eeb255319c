// AVX-512 score and value steps of attention_cached_flash (the tile copy and the softmax stay in
// attention_flash_avx2.cpp). 32 zmm registers: 4 rows x 64 columns keep 16 accumulators live, and
// the row's broadcast folds into the FMA's memory operand.
#include <immintrin.h>

#include <cstdint>

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

}  // namespace

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
