// AVX2 + FMA + F16C tile steps of attention_cached_flash (attention_flash.cpp has the tiling, the
// buffers' layouts and the math). Compiled with those -m flags only; called after a run-time check.
// Register blocking (16 ymm): scores 4 rows x 16 keys and values 4 rows x 16 channels keep 8
// accumulators, 2 loaded vectors and 4 broadcasts live; 1-2 row remainders (decode: rows = group)
// widen to 32 columns instead.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/simd_avx2.h"

namespace shardlm {
namespace {

// In-register 8 x 8 transpose: r[i] lane j -> r[j] lane i.
inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

template <DType DT>
void load_tile(const KvRows& k, const KvRows& v, int64_t j0, int64_t n, int64_t d, float* kt, int64_t ldk, float* vt) {
    for (int64_t jb = 0; jb < n; jb += 8) {
        const void* krow[8];
        __m256 ks[8];
        float ks1[8];
        for (int u = 0; u < 8; ++u) {
            const bool in = jb + u < n;
            const int64_t slot = in ? (j0 + jb + u) % k.capacity : 0;
            krow[u] = in ? kv_row_ptr(k, slot) : nullptr;
            ks1[u] = !in ? 0.0f : DT == DType::I8 ? k.scales[slot] : 1.0f;
            ks[u] = _mm256_set1_ps(ks1[u]);
            if (!in) continue;
            // V row as is (times its scale): vt[(jb + u) * d ..]
            const void* vrow = kv_row_ptr(v, slot);
            const float vs = DT == DType::I8 ? v.scales[slot] : 1.0f;
            float* dst = vt + (jb + u) * d;
            int64_t c = 0;
            for (; c + 8 <= d; c += 8) {
                const __m256 x = load8<DT>(vrow, c);
                _mm256_storeu_ps(dst + c, DT == DType::I8 ? _mm256_mul_ps(x, _mm256_set1_ps(vs)) : x);
            }
            for (; c < d; ++c) dst[c] = load1<DT>(vrow, c) * vs;
        }
        // K rows jb .. jb + 7 transposed into columns jb .. jb + 7 of kt (missing rows as zeros).
        int64_t c = 0;
        for (; c + 8 <= d; c += 8) {
            __m256 r[8];
            for (int u = 0; u < 8; ++u)
                r[u] = krow[u] ? (DT == DType::I8 ? _mm256_mul_ps(load8<DT>(krow[u], c), ks[u]) : load8<DT>(krow[u], c))
                               : _mm256_setzero_ps();
            transpose8(r);
            for (int u = 0; u < 8; ++u) _mm256_storeu_ps(kt + (c + u) * ldk + jb, r[u]);
        }
        for (; c < d; ++c)
            for (int u = 0; u < 8; ++u) kt[c * ldk + jb + u] = krow[u] ? load1<DT>(krow[u], c) * ks1[u] : 0.0f;
    }
}

// s[r][j0 .. j0 + 8W) for rows 0 .. RB-1: sum over channels c of q[r][c] * kt[c][j ..].
template <int RB, int W>
inline void scores_block(const float* q, int64_t d, const float* kt, int64_t ldk, float* s, int64_t lds) {
    __m256 acc[RB][W];
    for (int r = 0; r < RB; ++r)
        for (int u = 0; u < W; ++u) acc[r][u] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; ++c) {
        __m256 kv[W];
        for (int u = 0; u < W; ++u) kv[u] = _mm256_loadu_ps(kt + c * ldk + 8 * u);
        for (int r = 0; r < RB; ++r) {
            const __m256 b = _mm256_broadcast_ss(q + r * d + c);
            for (int u = 0; u < W; ++u) acc[r][u] = _mm256_fmadd_ps(b, kv[u], acc[r][u]);
        }
    }
    for (int r = 0; r < RB; ++r)
        for (int u = 0; u < W; ++u) _mm256_storeu_ps(s + r * lds + 8 * u, acc[r][u]);
}

template <int RB, int W>
inline void scores_rows(const float* q, int64_t d, const float* kt, int64_t ldk, int64_t np, float* s, int64_t lds) {
    int64_t j = 0;
    for (; j + 8 * W <= np; j += 8 * W) scores_block<RB, W>(q, d, kt + j, ldk, s + j, lds);
    for (; j < np; j += 8) scores_block<RB, 1>(q, d, kt + j, ldk, s + j, lds);
}

// o[r][c0 .. c0 + 8W) = alpha[r] * o[r][..] + sum_{j < n} p[r][j] * vt[j][..] for rows 0 .. RB-1.
template <int RB, int W>
inline void values_block(const float* p, int64_t lds, const float* vt, int64_t n, int64_t d, const float* alpha,
                         float* o) {
    __m256 acc[RB][W];
    for (int r = 0; r < RB; ++r) {
        const __m256 ar = _mm256_set1_ps(alpha[r]);
        for (int u = 0; u < W; ++u) acc[r][u] = _mm256_mul_ps(ar, _mm256_loadu_ps(o + r * d + 8 * u));
    }
    for (int64_t j = 0; j < n; ++j) {
        __m256 x[W];
        for (int u = 0; u < W; ++u) x[u] = _mm256_loadu_ps(vt + j * d + 8 * u);
        for (int r = 0; r < RB; ++r) {
            const __m256 b = _mm256_broadcast_ss(p + r * lds + j);
            for (int u = 0; u < W; ++u) acc[r][u] = _mm256_fmadd_ps(b, x[u], acc[r][u]);
        }
    }
    for (int r = 0; r < RB; ++r)
        for (int u = 0; u < W; ++u) _mm256_storeu_ps(o + r * d + 8 * u, acc[r][u]);
}

template <int RB, int W>
inline void values_rows(const float* p, int64_t lds, const float* vt, int64_t n, int64_t d, const float* alpha,
                        float* o) {
    int64_t c = 0;
    for (; c + 8 * W <= d; c += 8 * W) values_block<RB, W>(p, lds, vt + c, n, d, alpha, o + c);
    for (; c + 8 <= d; c += 8) values_block<RB, 1>(p, lds, vt + c, n, d, alpha, o + c);
    for (; c < d; ++c)  // head_dim not a multiple of 8
        for (int r = 0; r < RB; ++r) {
            float acc = alpha[r] * o[r * d + c];
            for (int64_t j = 0; j < n; ++j) acc += p[r * lds + j] * vt[j * d + c];
            o[r * d + c] = acc;
        }
}

// e^x for x <= 0 (NaN-free input): x = n ln2 + f with n = round(x log2 e), |f| <= ln2 / 2, and
// e^f from its Taylor polynomial to f^6 (relative error below 2e-7). x is clamped at -87 so 2^n
// stays a normal float; e^-87 ~ 1.6e-38 is nothing next to the row maximum's e^0.
inline __m256 exp_nonpos(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.4426950409f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);  // ln 2 = hi (exact in n * hi) + lo
    f = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), f);
    __m256 e = _mm256_set1_ps(1.0f / 720.0f);
    for (float c : {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) e = _mm256_fmadd_ps(e, f, _mm256_set1_ps(c));
    const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(e, _mm256_castsi256_ps(two_n));
}

}  // namespace

void flash_load_tile_avx2(const KvRows& k, const KvRows& v, int64_t j0, int64_t n, int64_t d, float* kt, int64_t ldk,
                          float* vt) {
    switch (k.dtype) {
        case DType::F16: load_tile<DType::F16>(k, v, j0, n, d, kt, ldk, vt); break;
        case DType::BF16: load_tile<DType::BF16>(k, v, j0, n, d, kt, ldk, vt); break;
        case DType::I8: load_tile<DType::I8>(k, v, j0, n, d, kt, ldk, vt); break;
        default: load_tile<DType::F32>(k, v, j0, n, d, kt, ldk, vt); break;
    }
}

void flash_scores_avx2(const float* q, int64_t rows, int64_t d, const float* kt, int64_t ldk, int64_t n, float* s,
                       int64_t lds) {
    const int64_t np = (n + 7) / 8 * 8;
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) scores_rows<4, 2>(q + r * d, d, kt, ldk, np, s + r * lds, lds);
    for (; r + 2 <= rows; r += 2) scores_rows<2, 4>(q + r * d, d, kt, ldk, np, s + r * lds, lds);
    for (; r < rows; ++r) scores_rows<1, 4>(q + r * d, d, kt, ldk, np, s + r * lds, lds);
}

float flash_softmax_row_avx2(float* s, int64_t v0, int64_t v1, int64_t n, float& m, float& l) {
    const int64_t np = (n + 7) / 8 * 8;
    if (v0 >= v1) {
        std::fill(s, s + np, 0.0f);
        return 1.0f;
    }
    int64_t j = v0;
    __m256 m8 = _mm256_set1_ps(m);
    for (; j + 8 <= v1; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + j));
    float mt = hmax(m8);
    for (; j < v1; ++j) mt = std::max(mt, s[j]);
    const float alpha = std::exp(m - mt);  // m = -inf before the row's first keys: a = 0
    const __m256 mv = _mm256_set1_ps(mt);
    __m256 sum8 = _mm256_setzero_ps();
    for (j = v0; j + 8 <= v1; j += 8) {
        const __m256 e = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, e);
        sum8 = _mm256_add_ps(sum8, e);
    }
    float sum = hsum(sum8);
    for (; j < v1; ++j) sum += (s[j] = std::exp(s[j] - mt));
    std::fill(s, s + v0, 0.0f);
    std::fill(s + v1, s + np, 0.0f);
    l = l * alpha + sum;
    m = mt;
    return alpha;
}

void flash_values_avx2(const float* p, int64_t lds, int64_t rows, const float* vt, int64_t n, int64_t d,
                       const float* alpha, float* o) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) values_rows<4, 2>(p + r * lds, lds, vt, n, d, alpha + r, o + r * d);
    for (; r + 2 <= rows; r += 2) values_rows<2, 4>(p + r * lds, lds, vt, n, d, alpha + r, o + r * d);
    for (; r < rows; ++r) values_rows<1, 4>(p + r * lds, lds, vt, n, d, alpha + r, o + r * d);
}

}  // namespace shardlm
