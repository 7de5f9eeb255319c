// AVX2 + FMA + F16C kernels of matmul and matmul_w8a8; this file alone is compiled with those -m
// flags and is only called after a run-time CPU check (cpu_isa.cpp). Same structure as
// matmul_avx512.cpp with 8-wide vectors and 16 registers: GEMV along k for decode (up to 8 tokens),
// INT8/INT4 weights on INT16 activations (GEMV-shaped, and for prefill a GEMM on int16 panels of 16
// rows x 6-token tiles), a [KC][16] f32 panel x 6-token tile for float weights' prefill, a W8A8
// GEMV on the rows in place, and for W8A8 [quad][8 rows][4 bytes] panels multiplied with
// the sign trick (maddubs(|w|, sign(a, w)) then madd by ones: no VNNI needed, no 16-bit overflow
// because |w|, |a| <= 127 gives pair sums <= 2 * 127 * 127 < 32767). W4A8 unpacks the 4-bit codes
// into the same panels and needs no sign trick (codes are unsigned, pair sums <= 2 * 15 * 127);
// its decode GEMV (groups a multiple of 128) reads the row-major codes directly.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/simd_avx2.h"

namespace shardlm {
namespace {

// The first `len` (< 8) of them, the rest zero.
template <DType DT>
inline __m256 load8_part(const void* p, int64_t i, int64_t len) {
    alignas(32) float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t l = 0; l < len; ++l) v[l] = load1<DT>(p, i + l);
    return _mm256_load_ps(v);
}

inline __m256i lane_mask(int64_t n) {  // lanes < n all ones
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// In-place 8x8 transpose of 32-bit values.
inline void transpose8(__m256 (&r)[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {  // u[4i + j]: rows 4i..4i+3 at columns j (low half) and j + 4 (high)
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int j = 0; j < 4; ++j) {
        r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}

// ---------------------------------------------------------------------------------------------
// GEMV (see matmul_avx512.cpp): R rows x T tokens, vectors along k; tails of each group or row
// are finished in scalar code.

template <DType DT, int R, int T, bool SCALED>
inline __attribute__((always_inline)) void gemv_step(const uint8_t* const (&wr)[R], const float* x, int64_t cols,
                                                     int64_t k, const __m256 (&sc)[R], __m256 (&acc)[R][T],
                                                     const uint8_t* pf) {
    if (pf)  // a later tile of R contiguous rows into L2 (see matmul_avx512.cpp)
        for (size_t o = 0; o < R * 8 * elem_size<DT>(); o += 64)
            _mm_prefetch(reinterpret_cast<const char*>(pf + size_t(k) * R * elem_size<DT>() + o), _MM_HINT_T1);
    __m256 xv[T];
    SHARDLM_UNROLL for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(x + t * cols + k);
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        __m256 wv = load8<DT>(wr[i], k);
        if (SCALED) wv = _mm256_mul_ps(wv, sc[i]);
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
    }
}

template <DType DT, int R, int T>
void gemv_tile(const float* x, const WeightView& w, int64_t r, const float* bias, float* y, const uint8_t* pf) {
    const int64_t cols = w.cols;
    const uint8_t* wr[R];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) wr[i] = static_cast<const uint8_t*>(w.data) + size_t((r + i) * cols) * elem_size<DT>();
    __m256 acc[R][T], sc[R];
    float tail[R][T] = {};
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        sc[i] = _mm256_set1_ps(1.0f);
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm256_setzero_ps();
    }
    const bool grouped = DT == DType::I8 && w.group_size < cols;
    const int64_t g_len = grouped ? w.group_size : cols, ng = cols / g_len;
    for (int64_t g = 0; g < ng; ++g) {
        float s[R];
        SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
            s[i] = grouped ? w.scales[(r + i) * ng + g] : 1.0f;
            sc[i] = _mm256_set1_ps(s[i]);
        }
        int64_t k = g * g_len;
        const int64_t end = k + g_len;
        if (grouped)
            for (; k + 8 <= end; k += 8) gemv_step<DT, R, T, true>(wr, x, cols, k, sc, acc, pf);
        else
            for (; k + 8 <= end; k += 8) gemv_step<DT, R, T, false>(wr, x, cols, k, sc, acc, pf);
        for (; k < end; ++k)
            SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
                const float wv = load1<DT>(wr[i], k) * s[i];
                SHARDLM_UNROLL for (int t = 0; t < T; ++t) tail[i][t] += wv * x[t * cols + k];
            }
    }
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        const float post = DT == DType::I8 && !grouped ? w.scales[r + i] : 1.0f;
        const float b = bias ? bias[r + i] : 0.0f;
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) y[t * w.rows + r + i] = (hsum(acc[i][t]) + tail[i][t]) * post + b;
    }
}

template <DType DT, int T>
void gemv_rows(const float* x, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int R = T <= 2 ? 4 : 2;  // 16 ymm registers: R*T accumulators + T activations + R scales
    constexpr int64_t kAhead = 2;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    int64_t r = r0;
    for (; r + R <= r1; r += R) {
        const uint8_t* pf = r + (kAhead + 1) * R <= r1 ? base + size_t((r + kAhead * R) * w.cols) * elem_size<DT>() : nullptr;
        gemv_tile<DT, R, T>(x, w, r, bias, y, pf);
    }
    for (; r < r1; ++r) gemv_tile<DT, 1, T>(x, w, r, bias, y, nullptr);
}

// 5-8 tokens (as the AVX-512 GEMV): per tile of rows, tokens 0..3 and then the other T2 with the
// tile still in L1, so the weights stream from memory once (the packed GEMM took 3x the time of
// 4 tokens at 8).
template <DType DT, int T2>
void gemv_rows8(const float* x, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int R = 2;
    constexpr int64_t kAhead = 2;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const float* x_hi = x + 4 * w.cols;
    float* y_hi = y + 4 * w.rows;
    int64_t r = r0;
    for (; r + R <= r1; r += R) {
        const uint8_t* pf = r + (kAhead + 1) * R <= r1 ? base + size_t((r + kAhead * R) * w.cols) * elem_size<DT>() : nullptr;
        gemv_tile<DT, R, 4>(x, w, r, bias, y, pf);
        gemv_tile<DT, R, T2>(x_hi, w, r, bias, y_hi, nullptr);
    }
    for (; r < r1; ++r) {
        gemv_tile<DT, 1, 4>(x, w, r, bias, y, nullptr);
        gemv_tile<DT, 1, T2>(x_hi, w, r, bias, y_hi, nullptr);
    }
}

template <DType DT>
void gemv_dispatch(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    switch (n) {
        case 1: gemv_rows<DT, 1>(x, w, bias, y, r0, r1); break;
        case 2: gemv_rows<DT, 2>(x, w, bias, y, r0, r1); break;
        case 3: gemv_rows<DT, 3>(x, w, bias, y, r0, r1); break;
        case 4: gemv_rows<DT, 4>(x, w, bias, y, r0, r1); break;
        case 5: gemv_rows8<DT, 1>(x, w, bias, y, r0, r1); break;
        case 6: gemv_rows8<DT, 2>(x, w, bias, y, r0, r1); break;
        case 7: gemv_rows8<DT, 3>(x, w, bias, y, r0, r1); break;
        default: gemv_rows8<DT, 4>(x, w, bias, y, r0, r1); break;
    }
}

// ---------------------------------------------------------------------------------------------
// INT4 GEMV (layout in weights_view.h): each 32-column block of a row is one 16-byte load, whose
// four 8-column chunks are dequantized (q * scale + min, the group's) in registers.

// Chunk c (0..3: columns 8c .. 8c + 8) of the 32-column block whose 16 bytes start at p, as codes.
inline __m256 i4_chunk8(const uint8_t* p, int c) {
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * (c & 1)));
    if (c >= 2) b = _mm_srli_epi16(b, 4);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(b, _mm_set1_epi8(0x0F))));
}

template <int R, int T>
void gemv_i4_tile(const float* x, const WeightView& w, int64_t r, const float* bias, float* y, const uint8_t* pf) {
    const int64_t cols = w.cols, rb = cols / 2, g_len = w.group_size, ng = cols / g_len;
    const uint8_t* wr[R];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) wr[i] = static_cast<const uint8_t*>(w.data) + (r + i) * rb;
    __m256 acc[R][T];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
        __m256 sc[R], mn[R];
        SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
            sc[i] = _mm256_set1_ps(w.scales[(r + i) * ng + g]);
            mn[i] = _mm256_set1_ps(w.mins[(r + i) * ng + g]);
        }
        for (int64_t k = g * g_len; k < (g + 1) * g_len; k += 32) {
            if (pf && k % 128 == 0)
                for (int i = 0; i < R; ++i) _mm_prefetch(reinterpret_cast<const char*>(pf + i * rb + k / 2), _MM_HINT_T1);
            SHARDLM_UNROLL for (int c = 0; c < 4; ++c) {
                __m256 xv[T];
                SHARDLM_UNROLL for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(x + t * cols + k + 8 * c);
                SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
                    const __m256 wv = _mm256_fmadd_ps(i4_chunk8(wr[i] + k / 2, c), sc[i], mn[i]);
                    SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
                }
            }
        }
    }
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        const float b = bias ? bias[r + i] : 0.0f;
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) y[t * w.rows + r + i] = hsum(acc[i][t]) + b;
    }
}

template <int T>
void gemv_i4_rows(const float* x, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int R = T <= 2 ? 4 : 2;
    constexpr int64_t kAhead = 2;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const int64_t rb = w.cols / 2;
    int64_t r = r0;
    for (; r + R <= r1; r += R)
        gemv_i4_tile<R, T>(x, w, r, bias, y, r + (kAhead + 1) * R <= r1 ? base + (r + kAhead * R) * rb : nullptr);
    for (; r < r1; ++r) gemv_i4_tile<1, T>(x, w, r, bias, y, nullptr);
}

void gemv_i4_dispatch(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    switch (n) {
        case 1: gemv_i4_rows<1>(x, w, bias, y, r0, r1); break;
        case 2: gemv_i4_rows<2>(x, w, bias, y, r0, r1); break;
        case 3: gemv_i4_rows<3>(x, w, bias, y, r0, r1); break;
        default: gemv_i4_rows<4>(x, w, bias, y, r0, r1); break;
    }
}

// ---------------------------------------------------------------------------------------------
// INT8 and INT4 weights on INT16 activations (matmul_kernels.h, i16_gemv_usable), the AVX-512
// kernel's scheme on 16-column halves: vpmaddwd sums pairs of weight x activation products into 8
// INT32 lanes, two per 32-column step added to acc[i][t]. A step gives each lane 4 products, so a
// flush segment of kI16FlushCols columns holds at most 512 of |w| <= 128 and |q| <= 32767 per lane.
static_assert(kI16FlushCols / 32 * 4 * 128 * 32767LL < (1LL << 31), "an INT32 lane could overflow");

// Half h of columns [k, k + 32) of a row as 16 int16: I8 sign-extended; I4 (the 16-byte block at
// k / 2) its low nibbles (columns 0..15) or its high nibbles (16..31).
template <bool I4>
inline __m256i load16_i16(const uint8_t* row, int64_t k, int h) {
    if constexpr (I4) {  // each byte widened to 16 bits: its high nibble is a shift away, unmasked
        const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + size_t(k) / 2)));
        return h == 0 ? _mm256_and_si256(b, _mm256_set1_epi16(0x0F)) : _mm256_srli_epi16(b, 4);
    } else {
        return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k + 16 * h)));
    }
}

// acc + pairs of s16(w) * s16(x) per 32-bit lane. With the intrinsics GCC 12 regrouped the adds and
// kept three of a 2 x 4 tile's accumulators on the stack, with register copies of the others, on
// every step; as one asm statement (value in, value out, as dpwssd in matmul_avx512.cpp) they stay
// in registers.
inline __m256i madd_acc(__m256i acc, __m256i w, __m256i x) {
#if defined(__GNUC__) && !defined(__clang__)
    __m256i prod;
    __asm__("vpmaddwd %2, %3, %1\n\tvpaddd %1, %0, %0" : "+x"(acc), "=&x"(prod) : "x"(x), "x"(w));
    return acc;
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
#endif
}

// One 32-column step: weights from column kw of the rows wr (kw = k, or 0 for the zero-padded tail
// copies), activations (from L1) from column k.
template <bool I4, int R, int T>
inline __attribute__((always_inline)) void i16_step(const uint8_t* const (&wr)[R], int64_t kw, const int16_t* q,
                                                    int64_t kp, int64_t k, __m256i (&acc)[R][T], const uint8_t* pf) {
    constexpr int kStepBytes = R * (I4 ? 16 : 32);
    if (pf)  // the tile kAhead tiles on, at the pace of this one (as gemv_step)
        for (int o = 0; o < kStepBytes; o += 64)
            _mm_prefetch(reinterpret_cast<const char*>(pf + k / 32 * kStepBytes + o), _MM_HINT_T1);
    SHARDLM_UNROLL for (int h = 0; h < 2; ++h) {  // one half at a time: fewer registers live
        __m256i wv[R];
        SHARDLM_UNROLL for (int i = 0; i < R; ++i) wv[i] = load16_i16<I4>(wr[i], kw, h);
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + t * kp + k + 16 * h));
            SHARDLM_UNROLL for (int i = 0; i < R; ++i) acc[i][t] = madd_acc(acc[i][t], wv[i], xv);
        }
    }
}

// Tokens t0 .. t0 + T of rows [r, r + R); pf: the tile to prefetch (first pass only). I4 adds the
// mins' share, sum over groups of min * (f32 sum of x over the group), from a.xsum.
template <bool I4, int R, int T>
void i16_tile(const I16Acts& a, int64_t t0, const WeightView& w, int64_t r, const float* bias, float* y, const uint8_t* pf) {
    const int64_t cols = w.cols, kp = a.kp, row_bytes = I4 ? cols / 2 : cols;
    const bool grouped = I4 || w.group_size < cols;
    const int64_t g_len = grouped ? w.group_size : cols, ng = cols / g_len;
    const int16_t* q = a.q + t0 * kp;
    const uint8_t* wr[R];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) wr[i] = static_cast<const uint8_t*>(w.data) + (r + i) * row_bytes;
    // The f32 sums in memory: held in registers across the column loop, they pushed accumulators out.
    alignas(32) float sum[R][T][8] = {};
    for (int64_t g = 0; g < ng; ++g)
        for (int64_t s0 = g * g_len, g_end = s0 + g_len; s0 < g_end; s0 += kI16FlushCols) {
            const int64_t s1 = std::min(g_end, s0 + kI16FlushCols);
            __m256i acc[R][T];
            SHARDLM_UNROLL for (int i = 0; i < R; ++i) SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm256_setzero_si256();
            int64_t k = s0;
            for (; k + 32 <= s1; k += 32) i16_step<I4, R, T>(wr, k, q, kp, k, acc, pf);
            if (k < s1) {  // I8 with one scale per row only: the row's last cols % 32 bytes, zero-padded
                alignas(32) uint8_t tail[R][32] = {};
                const uint8_t* tr[R];
                SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
                    std::memcpy(tail[i], wr[i] + k, size_t(s1 - k));
                    tr[i] = tail[i];
                }
                i16_step<I4, R, T>(tr, 0, q, kp, k, acc, nullptr);
            }
            SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
                const __m256 sc = _mm256_set1_ps(grouped ? w.scales[(r + i) * ng + g] : 1.0f);
                SHARDLM_UNROLL for (int t = 0; t < T; ++t)
                    _mm256_store_ps(sum[i][t], _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][t]), sc, _mm256_load_ps(sum[i][t])));
            }
        }
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        const float post = grouped ? 1.0f : w.scales[r + i];
        const float b = bias ? bias[r + i] : 0.0f;
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
            float mins = 0.0f;
            if constexpr (I4)
                for (int64_t g = 0; g < ng; ++g) mins += w.mins[(r + i) * ng + g] * a.xsum[(t0 + t) * ng + g];
            y[(t0 + t) * w.rows + r + i] = hsum(_mm256_load_ps(sum[i][t])) * (post * a.scales[t0 + t]) + mins + b;
        }
    }
}

// Tokens [t0, t1) of one tile, at most 4 per pass; the passes after the first find the rows in L1.
template <bool I4, int R>
void i16_tile_passes(const I16Acts& a, int64_t t0, int64_t t1, const WeightView& w, int64_t r, const float* bias,
                     float* y, const uint8_t* pf) {
    for (int64_t t = t0; t < t1; t += 4) {
        const uint8_t* p = t == t0 ? pf : nullptr;
        switch (std::min<int64_t>(4, t1 - t)) {
            case 1: i16_tile<I4, R, 1>(a, t, w, r, bias, y, p); break;
            case 2: i16_tile<I4, R, 2>(a, t, w, r, bias, y, p); break;
            case 3: i16_tile<I4, R, 3>(a, t, w, r, bias, y, p); break;
            default: i16_tile<I4, R, 4>(a, t, w, r, bias, y, p); break;
        }
    }
}

template <bool I4, int R>
void i16_rows_r(const I16Acts& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int64_t kAhead = 8 / R;  // tiles, as far ahead in bytes as the AVX-512 kernel's 2 of 4 rows
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const int64_t row_bytes = I4 ? w.cols / 2 : w.cols;
    for (int64_t t0 = 0; t0 < a.n; t0 += kI16TokenBlock) {
        const int64_t t1 = std::min(a.n, t0 + kI16TokenBlock);
        int64_t r = r0;
        for (; r + R <= r1; r += R)
            i16_tile_passes<I4, R>(a, t0, t1, w, r, bias, y,
                                   r + (kAhead + 1) * R <= r1 ? base + (r + kAhead * R) * row_bytes : nullptr);
        for (; r < r1; ++r) i16_tile_passes<I4, 1>(a, t0, t1, w, r, bias, y, nullptr);
    }
}

template <bool I4>
void i16_rows(const I16Acts& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    // 16 ymm registers: at 4 tokens 2 rows (8 accumulators, 2 weight halves, x, a product). One
    // token (INT4 decode at batch 1) reads 4 rows at a time, 4 streams from DRAM as the AVX-512
    // kernel: kernels_bench decode int4 n = 1, avx2, 2 threads 39.9 / 45.4 / 42.2 -> 37.7 / 38.2 /
    // 33.6 ms, one thread 64.7 / 70.7 -> 60.3 / 54.4 (2 tokens even).
    if (a.n == 1) i16_rows_r<I4, 4>(a, w, bias, y, r0, r1);
    else i16_rows_r<I4, 2>(a, w, bias, y, r0, r1);
}

// ---------------------------------------------------------------------------------------------
// GEMM for f32 activations: panel [KC][16] f32, x block [n_tiles][KC][NR].

constexpr int MR = 16;
constexpr int NR = 6;
constexpr int64_t KC = 256;

template <DType DT>
void pack_f32(const WeightView& w, int64_t rb, int64_t nr, int64_t k0, int64_t kc, float* panel) {
    const int64_t cols = w.cols, ng = w.n_groups(), g_len = w.group_size;
    if constexpr (DT == DType::I4) {  // k0 and kc are multiples of 32 (cols is, and so is KC)
        for (int h = 0; h < 2; ++h) {
            const int64_t vr = std::clamp<int64_t>(nr - 8 * h, 0, 8);
            for (int64_t kk = 0; kk < kc; kk += 8) {
                const int64_t k = k0 + kk;
                __m256 v[8];
                for (int i = 0; i < 8; ++i) {
                    if (i >= vr) {
                        v[i] = _mm256_setzero_ps();
                        continue;
                    }
                    const int64_t row = rb + 8 * h + i;
                    const uint8_t* blk = static_cast<const uint8_t*>(w.data) + row * (cols / 2) + k / 32 * 16;
                    v[i] = _mm256_fmadd_ps(i4_chunk8(blk, int(k % 32 / 8)), _mm256_set1_ps(w.scales[row * ng + k / g_len]),
                                           _mm256_set1_ps(w.mins[row * ng + k / g_len]));
                }
                transpose8(v);
                for (int j = 0; j < 8; ++j) _mm256_store_ps(panel + (kk + j) * MR + 8 * h, v[j]);
            }
        }
        return;
    }
    for (int h = 0; h < 2; ++h) {
        const int64_t vr = std::clamp<int64_t>(nr - 8 * h, 0, 8);
        for (int64_t kk = 0; kk < kc; kk += 8) {
            const int64_t len = std::min<int64_t>(8, kc - kk);
            __m256 v[8];
            for (int i = 0; i < 8; ++i) {
                if (i >= vr) {
                    v[i] = _mm256_setzero_ps();
                    continue;
                }
                const int64_t row = rb + 8 * h + i;
                const void* src = static_cast<const uint8_t*>(w.data) + size_t(row * cols) * elem_size<DT>();
                v[i] = len == 8 ? load8<DT>(src, k0 + kk) : load8_part<DT>(src, k0 + kk, len);
                if constexpr (DT == DType::I8) {
                    const float* s = w.scales + row * ng;
                    if (g_len % 8 == 0) {
                        v[i] = _mm256_mul_ps(v[i], _mm256_set1_ps(s[(k0 + kk) / g_len]));
                    } else {
                        alignas(32) float sv[8];
                        for (int l = 0; l < 8; ++l) sv[l] = s[std::min(k0 + kk + l, cols - 1) / g_len];
                        v[i] = _mm256_mul_ps(v[i], _mm256_load_ps(sv));
                    }
                }
            }
            transpose8(v);
            for (int64_t j = 0; j < len; ++j) _mm256_store_ps(panel + (kk + j) * MR + 8 * h, v[j]);
        }
    }
}

template <int N>
void kernel_f32(const float* panel, const float* xp, int64_t kc, float* y, int64_t ys, __m256i m0, __m256i m1,
                const float* bias, bool first) {
    __m256 acc[N][2];
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; ++k) {
        const __m256 w0 = _mm256_load_ps(panel + k * MR), w1 = _mm256_load_ps(panel + k * MR + 8);
        SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
            const __m256 b = _mm256_set1_ps(xp[k * NR + t]);
            acc[t][0] = _mm256_fmadd_ps(w0, b, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, b, acc[t][1]);
        }
    }
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
        float* yt = y + t * ys;
        __m256 c0, c1;
        if (first) {
            c0 = bias ? _mm256_maskload_ps(bias, m0) : _mm256_setzero_ps();
            c1 = bias ? _mm256_maskload_ps(bias + 8, m1) : _mm256_setzero_ps();
        } else {
            c0 = _mm256_maskload_ps(yt, m0);
            c1 = _mm256_maskload_ps(yt + 8, m1);
        }
        _mm256_maskstore_ps(yt, m0, _mm256_add_ps(acc[t][0], c0));
        _mm256_maskstore_ps(yt + 8, m1, _mm256_add_ps(acc[t][1], c1));
    }
}

using KernelF32 = void (*)(const float*, const float*, int64_t, float*, int64_t, __m256i, __m256i, const float*, bool);
constexpr KernelF32 kKernelsF32[NR + 1] = {nullptr,       kernel_f32<1>, kernel_f32<2>, kernel_f32<3>,
                                           kernel_f32<4>, kernel_f32<5>, kernel_f32<6>};

// Store masks of the two 8-row halves of a block of nr <= 16 rows.
struct RowMasks {
    __m256i first, second;
};
inline RowMasks row_masks(int64_t nr) { return {lane_mask(nr), lane_mask(nr - 8)}; }

template <DType DT>
void gemm_rows(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int64_t kTokBlock = 256;  // bounds the packed x (256 x cols f32) and the y tiles
    if (n > kTokBlock) {
        for (int64_t t0 = 0; t0 < n; t0 += kTokBlock)
            gemm_rows<DT>(x + t0 * w.cols, std::min(kTokBlock, n - t0), w, bias, y + t0 * w.rows, r0, r1);
        return;
    }
    // x is packed once per call as [tile][cols][NR]; then each 32-row block runs over all k-blocks
    // with its y tile ([n][32], L1/L2-resident) accumulated in place. (k-blocks outermost would
    // stream all of y through the caches once per k-block, each kernel call stalling on it.)
    const int64_t cols = w.cols, tiles = (n + NR - 1) / NR;
    uint8_t* mem = scratch(size_t(KC * MR) * 4 + size_t(tiles * cols * NR) * 4);
    float* panel = reinterpret_cast<float*>(mem);
    float* xp = panel + KC * MR;
    for (int64_t tile = 0; tile < tiles; ++tile) {
        float* dst = xp + tile * cols * NR;
        const int64_t t0 = tile * NR, nt = std::min<int64_t>(NR, n - t0);
        for (int64_t k = 0; k < cols; ++k)
            for (int64_t t = 0; t < NR; ++t) dst[k * NR + t] = t < nt ? x[(t0 + t) * cols + k] : 0.0f;
    }
    for (int64_t rb = r0; rb < r1; rb += MR) {
        const int64_t nr = std::min<int64_t>(MR, r1 - rb);
        const auto masks = row_masks(nr);
        for (int64_t k0 = 0; k0 < cols; k0 += KC) {
            const int64_t kc = std::min(KC, cols - k0);
            pack_f32<DT>(w, rb, nr, k0, kc, panel);
            for (int64_t tile = 0; tile < tiles; ++tile) {
                const int64_t t0 = tile * NR, nt = std::min<int64_t>(NR, n - t0);
                kKernelsF32[nt](panel, xp + (tile * cols + k0) * NR, kc, y + t0 * w.rows + rb, w.rows, masks.first,
                                masks.second, bias ? bias + rb : nullptr, k0 == 0);
            }
        }
    }
}

template <DType DT>
void matmul_rows_dt(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    if constexpr (DT == DType::I4) {
        if (n > kGemvMaxN) gemm_rows<DT>(x, n, w, bias, y, r0, r1);
        else gemv_i4_dispatch(x, n, w, bias, y, r0, r1);
    } else {
        if (n > 2 * kGemvMaxN) gemm_rows<DT>(x, n, w, bias, y, r0, r1);
        else gemv_dispatch<DT>(x, n, w, bias, y, r0, r1);
    }
}

// ---------------------------------------------------------------------------------------------
// INT16 GEMM for prefill (i16_gemm_usable), the AVX-512 kernel's scheme on 16-row blocks: the
// block's weights unpacked once to int16 pairs, panel [pair k/2][half][8 rows][2 int16] (32 bytes
// per pair and half, the whole kp), and each token's pair of activations broadcast against them:
// per pair, 2 loads and N broadcasts feed 2N vpmaddwd. The GEMV-shaped kernel above holds 2 rows
// in L1 and streams 4 tokens' activations from L2 per pass, one 32-byte load per two multiply-adds,
// and widens each weight again on every pass. INT32 sums flushed to f32 (in L1) per group and every
// kI16GemmFlushCols columns; I4 adds the mins' share per group.

constexpr int MR16 = 16;
constexpr int NR16 = 6;  // tokens per tile: 12 accumulators, 2 weight vectors, a broadcast, a product
// Here a lane is one row, so it takes every column's product: INT16 activations (|q| <= 32767)
// are flushed every 512 columns; W8A8's (|q| <= 127) per segment of W8A8Prep::seg_len <= 1024.
constexpr int64_t kI16GemmFlushCols = 512;
static_assert(kI16GemmFlushCols * 128 * 32767LL < (1LL << 31), "an INT32 lane could overflow");
static_assert(1024 * 128 * 127LL < (1LL << 31), "an INT32 lane could overflow");

// What the GEMM reads of its activations: int16 rows, and per internal group (g_len columns, one
// activation scale and one weight scale each) the activation scale of token t at
// sa[t * sa_t + g * sa_g]; for I4 weights xs[t * ng + g], what the rows' mins multiply.
struct GemmActs {
    const int16_t* q = nullptr;  // [n][kp], zeros past the row
    int64_t n = 0, kp = 0;
    int64_t g_len = 0, ng = 0;   // ng == 1: one group up to kp
    int64_t flush = 0;           // columns per INT32 segment, even
    const float* sa = nullptr;
    int64_t sa_t = 0, sa_g = 0;
    const float* xs = nullptr;
};

// INT16 activations (i16_rows_avx2): one scale per token; the groups are the weights' (or the
// whole row, up to kp); I4's xs the f32 sums of x over each group.
GemmActs gemm_acts(const I16Acts& a, const WeightView& w) {
    const bool grouped = w.dtype == DType::I4 || w.group_size < w.cols;
    const int64_t g_len = grouped ? w.group_size : w.cols;
    return {a.q, a.n, a.kp, g_len, w.cols / g_len, kI16GemmFlushCols, a.scales, 1, 0, a.xsum};
}

// W8A8's int8 activations widened (W8A8Prep::q16, avx2_w8a8_gemm_usable): the internal groups of ge columns, a scale per
// token and group.
GemmActs gemm_acts(const W8A8Prep& a) {
    return {a.q16, a.n, a.kp, a.ge, a.ng, a.seg_len, a.scales, a.ng, 1, nullptr};
}

// Rows [rb, rb + nr) (nr <= 16) into the panel (kp columns: I8 rows past cols zero); wsc [ng][16]
// their weight scales per internal group, wmn [ng][16] (I4) their mins; zeros for rows past nr.
template <bool I4>
void pack_i16(const WeightView& w, const GemmActs& a, int64_t rb, int64_t nr, uint8_t* panel, float* wsc, float* wmn) {
    const int64_t row_bytes = I4 ? w.cols / 2 : w.cols, ngw = w.n_groups();
    const uint8_t* wq = static_cast<const uint8_t*>(w.data);
    for (int h = 0; h < 2; ++h) {
        const int64_t vr = std::clamp<int64_t>(nr - 8 * h, 0, 8);
        const uint8_t* rows[8] = {};
        for (int i = 0; i < vr; ++i) rows[i] = wq + (rb + 8 * h + i) * row_bytes;
        for (int64_t k = 0; k < a.kp; k += 32) {
            const uint8_t* src[8] = {};
            int64_t kw = k;
            alignas(32) uint8_t tail[8][32];
            if (!I4 && k + 32 > w.cols) {  // I8 with one scale per row: the last cols % 32 bytes, zero-padded
                for (int i = 0; i < vr; ++i) {
                    std::memset(tail[i], 0, 32);
                    std::memcpy(tail[i], rows[i] + k, size_t(w.cols - k));
                    src[i] = tail[i];
                }
                kw = 0;
            } else {
                for (int i = 0; i < vr; ++i) src[i] = rows[i];
            }
            for (int hh = 0; hh < 2; ++hh) {  // columns k + 16 hh .. + 15: 8 pairs of each row
                __m256 v[8];
                for (int i = 0; i < 8; ++i)
                    v[i] = i < vr ? _mm256_castsi256_ps(load16_i16<I4>(src[i], kw, hh)) : _mm256_setzero_ps();
                transpose8(v);  // v[j] = pair j of each of the 8 rows
                for (int j = 0; j < 8; ++j)
                    _mm256_store_ps(reinterpret_cast<float*>(panel + ((k / 2 + 8 * hh + j) * 2 + h) * 32), v[j]);
            }
        }
        for (int64_t g = 0; g < a.ng; ++g)
            for (int i = 0; i < 8; ++i) {
                const int64_t wi = (rb + 8 * h + i) * ngw + g * a.g_len / w.group_size;
                wsc[g * 16 + 8 * h + i] = i < vr ? w.scales[wi] : 0.0f;
                if constexpr (I4) wmn[g * 16 + 8 * h + i] = i < vr ? w.mins[wi] : 0.0f;
            }
    }
}

// Tokens t0 .. t0 + N against the panel: y [N][ys] (rows past the masks left alone).
template <int N, bool I4>
void kernel_i16(const GemmActs& a, const uint8_t* panel, const float* wsc, const float* wmn, int64_t t0, float* y,
                int64_t ys, const RowMasks& m, const float* bias) {
    alignas(32) float facc[N][16];  // f32 sums in L1, touched once per segment
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
        _mm256_store_ps(facc[t], _mm256_setzero_ps());
        _mm256_store_ps(facc[t] + 8, _mm256_setzero_ps());
    }
    const int16_t* xq[N];
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) xq[t] = a.q + (t0 + t) * a.kp;
    for (int64_t g = 0; g < a.ng; ++g) {
        const int64_t g_end = a.ng == 1 ? a.kp : (g + 1) * a.g_len;  // one group of the whole row: up to kp
        for (int64_t s0 = g * a.g_len; s0 < g_end; s0 += a.flush) {
            const int64_t p0 = s0 / 2, p1 = std::min(g_end, s0 + a.flush) / 2;
            __m256i acc[N][2];
            SHARDLM_UNROLL for (int t = 0; t < N; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_si256();
            for (int64_t p = p0; p < p1; ++p) {
                const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + p * 64));
                const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + p * 64 + 32));
                SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
                    int32_t pair;
                    std::memcpy(&pair, xq[t] + 2 * p, 4);
                    const __m256i b = _mm256_set1_epi32(pair);
                    acc[t][0] = madd_acc(acc[t][0], w0, b);
                    acc[t][1] = madd_acc(acc[t][1], w1, b);
                }
            }
            const __m256 sw0 = _mm256_load_ps(wsc + g * 16), sw1 = _mm256_load_ps(wsc + g * 16 + 8);
            SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
                const __m256 sa = _mm256_set1_ps(a.sa[(t0 + t) * a.sa_t + g * a.sa_g]);
                _mm256_store_ps(facc[t], _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t][0]), _mm256_mul_ps(sw0, sa),
                                                         _mm256_load_ps(facc[t])));
                _mm256_store_ps(facc[t] + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t][1]), _mm256_mul_ps(sw1, sa),
                                                             _mm256_load_ps(facc[t] + 8)));
            }
        }
        if constexpr (I4) {  // + min * (f32 sum of x over the group)
            const __m256 mn0 = _mm256_load_ps(wmn + g * 16), mn1 = _mm256_load_ps(wmn + g * 16 + 8);
            SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
                const __m256 xs = _mm256_set1_ps(a.xs[(t0 + t) * a.ng + g]);
                _mm256_store_ps(facc[t], _mm256_fmadd_ps(mn0, xs, _mm256_load_ps(facc[t])));
                _mm256_store_ps(facc[t] + 8, _mm256_fmadd_ps(mn1, xs, _mm256_load_ps(facc[t] + 8)));
            }
        }
    }
    const __m256 b0 = bias ? _mm256_maskload_ps(bias, m.first) : _mm256_setzero_ps();
    const __m256 b1 = bias ? _mm256_maskload_ps(bias + 8, m.second) : _mm256_setzero_ps();
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
        _mm256_maskstore_ps(y + t * ys, m.first, _mm256_add_ps(_mm256_load_ps(facc[t]), b0));
        _mm256_maskstore_ps(y + t * ys + 8, m.second, _mm256_add_ps(_mm256_load_ps(facc[t] + 8), b1));
    }
}

using KernelI16 = void (*)(const GemmActs&, const uint8_t*, const float*, const float*, int64_t, float*, int64_t,
                           const RowMasks&, const float*);
template <bool I4>
constexpr KernelI16 kKernelsI16[NR16 + 1] = {nullptr,           kernel_i16<1, I4>, kernel_i16<2, I4>, kernel_i16<3, I4>,
                                             kernel_i16<4, I4>, kernel_i16<5, I4>, kernel_i16<6, I4>};

template <bool I4>
void i16_gemm_rows(const GemmActs& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    const size_t panel_bytes = size_t(a.kp) * 2 * MR16;
    uint8_t* mem = scratch(panel_bytes + size_t(a.ng * MR16) * 8);
    float* wsc = reinterpret_cast<float*>(mem + panel_bytes);
    float* wmn = wsc + a.ng * MR16;
    for (int64_t rb = r0; rb < r1; rb += MR16) {
        const int64_t nr = std::min<int64_t>(MR16, r1 - rb);
        pack_i16<I4>(w, a, rb, nr, mem, wsc, wmn);
        const RowMasks m = row_masks(nr);
        for (int64_t t0 = 0; t0 < a.n; t0 += NR16) {
            const int64_t nt = std::min<int64_t>(NR16, a.n - t0);
            kKernelsI16<I4>[nt](a, mem, wsc, wmn, t0, y + t0 * w.rows + rb, w.rows, m, bias ? bias + rb : nullptr);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// W8A8: panel for 8 rows: internal group e, quad q: 32 bytes [8 rows x 4 bytes] at (e * Q + q) * 32;
// wsc[e][8] the rows' weight scales. Signed x signed, so no offset correction is needed.

constexpr int MR8 = 8;
constexpr int NR8 = 4;

// I4 (W4A8): the panel holds the unsigned codes, unpacked from a 32-column block into column order
// (ge is then a multiple of 32), and wmn[e][8] the rows' mins.
template <bool I4>
void pack_w8a8(const W8A8Prep& a, const WeightView& w, int64_t rb, int64_t nr, uint8_t* panel, float* wsc, float* wmn) {
    const int64_t cols = w.cols, ge = a.ge, q_per = a.ge4 / 4, ngw = cols / w.group_size;
    const int64_t row_bytes = weight_row_bytes(w);
    const int8_t* wq = static_cast<const int8_t*>(w.data);
    for (int64_t e = 0; e < a.ng; ++e) {
        for (int64_t c = 0; c < ge; c += 32) {
            const int64_t len = std::min<int64_t>(32, ge - c);
            __m256 v[8];
            for (int i = 0; i < 8; ++i) {
                const int8_t* src = wq + (rb + i) * row_bytes + (I4 ? (e * ge + c) / 2 : e * ge + c);
                if (i >= nr) {
                    v[i] = _mm256_setzero_ps();
                } else if (I4) {
                    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src)), nib = _mm_set1_epi8(0x0F);
                    v[i] = _mm256_castsi256_ps(_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), nib), _mm_and_si128(b, nib)));
                } else if (len == 32) {
                    v[i] = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
                } else {
                    alignas(32) int8_t b[32] = {};
                    std::memcpy(b, src, size_t(len));
                    v[i] = _mm256_load_ps(reinterpret_cast<const float*>(b));
                }
            }
            transpose8(v);  // v[j] = quad j of each of the 8 rows
            const int64_t nq = (len + 3) / 4;
            for (int64_t j = 0; j < nq; ++j) _mm256_store_ps(reinterpret_cast<float*>(panel + (e * q_per + c / 4 + j) * 32), v[j]);
        }
        for (int i = 0; i < 8; ++i) {
            const int64_t wi = (rb + i) * ngw + e * ge / w.group_size;
            wsc[e * MR8 + i] = i < nr ? w.scales[wi] : 0.0f;
            if constexpr (I4) wmn[e * MR8 + i] = i < nr ? w.mins[wi] : 0.0f;
        }
    }
}

template <int N, bool I4>
void kernel_w8a8(const W8A8Prep& a, const uint8_t* panel, const float* wsc, const float* wmn, int64_t t0, float* y,
                 int64_t ys, __m256i m, const float* bias) {
    const int64_t q_per = a.ge4 / 4, seg_q = a.seg_len / 4;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 facc[N];
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) facc[t] = _mm256_setzero_ps();
    for (int64_t e = 0; e < a.ng; ++e) {
        const uint8_t* pe = panel + e * q_per * 32;
        const __m256 sw = _mm256_load_ps(wsc + e * MR8);
        for (int64_t s = 0; s < a.segs; ++s) {
            const int64_t q0 = s * seg_q, q1 = std::min(q_per, q0 + seg_q);
            __m256i acc[N];
            SHARDLM_UNROLL for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_si256();
            for (int64_t q = q0; q < q1; ++q) {
                const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(pe + q * 32));
                // maddubs multiplies unsigned by signed bytes: I4 codes are unsigned as they are;
                // signed INT8 weights go in as |w| with w's sign moved onto the activations.
                const __m256i aw = I4 ? wv : _mm256_abs_epi8(wv);
                SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
                    int32_t quad;
                    std::memcpy(&quad, a.q + (t0 + t) * a.kp + e * a.ge4 + 4 * q, 4);
                    const __m256i sa = I4 ? _mm256_set1_epi32(quad) : _mm256_sign_epi8(_mm256_set1_epi32(quad), wv);
                    acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sa), ones));
                }
            }
            SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
                const __m256 sa = _mm256_set1_ps(a.scales[(t0 + t) * a.ng + e]);
                facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t]), _mm256_mul_ps(sw, sa), facc[t]);
            }
        }
        if constexpr (I4) {  // + min * (the group's sum of the dequantized activations)
            const __m256 mn = _mm256_load_ps(wmn + e * MR8);
            SHARDLM_UNROLL for (int t = 0; t < N; ++t)
                facc[t] = _mm256_fmadd_ps(mn, _mm256_set1_ps(a.xs[(t0 + t) * a.ng + e]), facc[t]);
        }
    }
    const __m256 b = bias ? _mm256_maskload_ps(bias, m) : _mm256_setzero_ps();
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) _mm256_maskstore_ps(y + t * ys, m, _mm256_add_ps(facc[t], b));
}

using KernelW8A8 = void (*)(const W8A8Prep&, const uint8_t*, const float*, const float*, int64_t, float*, int64_t,
                            __m256i, const float*);
template <bool I4>
constexpr KernelW8A8 kKernelsW8A8[NR8 + 1] = {nullptr, kernel_w8a8<1, I4>, kernel_w8a8<2, I4>, kernel_w8a8<3, I4>,
                                              kernel_w8a8<4, I4>};

// W8A8 GEMV (n <= kInt8ActsGemvMaxN, internal groups a multiple of 32): each row read in place,
// 32 columns per step, the packed kernel's sign trick on every (row, token) pair: maddubs(|w|,
// sign(a, w)) then madd by ones, exact INT32 sums per segment (a lane takes 4 products a step, at
// most 128 of 128 * 127 in a 1024-column segment). One row per tile, all n tokens in one pass:
// 8 accumulators and 5 other registers; the ALU work per product is the same for any tile height,
// as the activations come from L1.
inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// acc + madd(maddubs(|w|, sign(x, w)), ones): the products w x, summed four to a lane. One asm
// statement, as madd_acc above: with the intrinsics GCC 12 ran all tokens' signs first and kept
// three accumulators on the stack.
inline __m256i sign_dot_acc(__m256i acc, __m256i aw, __m256i wv, __m256i xv, __m256i ones) {
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vpsignb %[w], %[x], %[x]\n\t"
            "vpmaddubsw %[x], %[aw], %[x]\n\t"
            "vpmaddwd %[ones], %[x], %[x]\n\t"
            "vpaddd %[x], %[acc], %[acc]"
            : [acc] "+x"(acc), [x] "+x"(xv)
            : [aw] "x"(aw), [w] "x"(wv), [ones] "x"(ones));
    return acc;
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), ones));
#endif
}

template <int T>
void w8a8_gemv_row(const W8A8Prep& a, const WeightView& w, int64_t r, const float* bias, float* y, const int8_t* pf) {
    const int64_t ngw = w.cols / w.group_size;
    const int8_t* wr = static_cast<const int8_t*>(w.data) + r * w.cols;
    const __m256i ones = _mm256_set1_epi16(1);
    float out[T] = {};
    for (int64_t e = 0; e < a.ng; ++e) {
        const float sw = w.scales[r * ngw + e * a.ge / w.group_size];
        for (int64_t s = 0; s < a.segs; ++s) {
            const int64_t k0 = e * a.ge + s * a.seg_len, k1 = std::min(k0 + a.seg_len, (e + 1) * a.ge);
            __m256i acc[T];
            SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_si256();
            for (int64_t k = k0; k < k1; k += 32) {
                if (pf && k % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(pf + k), _MM_HINT_T1);
                const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + k));
                const __m256i aw = _mm256_abs_epi8(wv);  // -128 -> 0x80, read as unsigned 128
                SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
                    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + t * a.kp + k));
                    acc[t] = sign_dot_acc(acc[t], aw, wv, xv, ones);
                }
            }
            SHARDLM_UNROLL for (int t = 0; t < T; ++t)
                out[t] += float(hsum_epi32(acc[t])) * (sw * a.scales[t * a.ng + e]);
        }
    }
    SHARDLM_UNROLL for (int t = 0; t < T; ++t) y[t * w.rows + r] = out[t] + (bias ? bias[r] : 0.0f);
}

template <int T>
void w8a8_gemv_rows(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int64_t kAhead = 8;  // rows: as far ahead as the other GEMVs
    const int8_t* base = static_cast<const int8_t*>(w.data);
    for (int64_t r = r0; r < r1; ++r) w8a8_gemv_row<T>(a, w, r, bias, y, r + kAhead < r1 ? base + (r + kAhead) * w.cols : nullptr);
}

// The packed W8A8/W4A8 product over rows [r0, r1) (the GEMVs take decode: W8A8's above, W4A8's below).
template <bool I4>
void w8a8_packed_rows(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    const size_t panel_bytes = size_t(a.kp) * MR8;
    uint8_t* mem = scratch(panel_bytes + size_t(a.ng * MR8) * 8);
    uint8_t* panel = mem;
    float* wsc = reinterpret_cast<float*>(mem + panel_bytes);
    float* wmn = wsc + a.ng * MR8;
    for (int64_t rb = r0; rb < r1; rb += MR8) {
        const int64_t nr = std::min<int64_t>(MR8, r1 - rb);
        pack_w8a8<I4>(a, w, rb, nr, panel, wsc, wmn);
        const __m256i m = lane_mask(nr);
        for (int64_t t0 = 0; t0 < a.n; t0 += NR8) {
            const int64_t nt = std::min<int64_t>(NR8, a.n - t0);
            kKernelsW8A8<I4>[nt](a, panel, wsc, wmn, t0, y + t0 * w.rows + rb, w.rows, m, bias ? bias + rb : nullptr);
        }
    }
}

// W4A8 GEMV (n <= kGemvMaxN, groups a multiple of 128): two 32-byte loads hold 128 columns of a
// row; an and and a shift split them into low-half and high-half codes, multiplied with maddubs
// against the activations in W8A8Prep::xi4's order. The four 16-bit pair sums of a chunk stay
// below 4 * 2 * 15 * 127 = 15240, so they add in 16 bits before one madd widens them to INT32.
template <int R, int T>
void w4a8_gemv_tile(const W8A8Prep& a, const WeightView& w, int64_t r, const float* bias, float* y, const uint8_t* pf) {
    const int64_t cols = w.cols, rb = cols / 2, gw = w.group_size, ngw = cols / gw, ge = a.ge;
    const uint8_t* wr[R];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) wr[i] = static_cast<const uint8_t*>(w.data) + (r + i) * rb;
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[R][T];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm256_setzero_ps();
    for (int64_t e = 0; e < a.ng; ++e) {
        __m256i ia[R][T];
        SHARDLM_UNROLL for (int i = 0; i < R; ++i)
            SHARDLM_UNROLL for (int t = 0; t < T; ++t) ia[i][t] = _mm256_setzero_si256();
        for (int64_t k = e * ge; k < (e + 1) * ge; k += 128) {
            if (pf)  // the tile kAhead tiles on, at the same pace (R * 64 bytes per 128 columns)
                SHARDLM_UNROLL for (int i = 0; i < R; ++i) _mm_prefetch(reinterpret_cast<const char*>(pf + i * rb + k / 2), _MM_HINT_T1);
            SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
                const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[i] + k / 2));
                const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[i] + k / 2 + 32));
                const __m256i lo0 = _mm256_and_si256(w0, nib), hi0 = _mm256_and_si256(_mm256_srli_epi16(w0, 4), nib);
                const __m256i lo1 = _mm256_and_si256(w1, nib), hi1 = _mm256_and_si256(_mm256_srli_epi16(w1, 4), nib);
                SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
                    const __m256i* xt = reinterpret_cast<const __m256i*>(a.xi4 + t * cols + k);
                    const __m256i s = _mm256_add_epi16(
                        _mm256_add_epi16(_mm256_maddubs_epi16(lo0, _mm256_loadu_si256(xt)),
                                         _mm256_maddubs_epi16(lo1, _mm256_loadu_si256(xt + 1))),
                        _mm256_add_epi16(_mm256_maddubs_epi16(hi0, _mm256_loadu_si256(xt + 2)),
                                         _mm256_maddubs_epi16(hi1, _mm256_loadu_si256(xt + 3))));
                    ia[i][t] = _mm256_add_epi32(ia[i][t], _mm256_madd_epi16(s, ones));
                }
            }
        }
        SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
            const float sw = w.scales[(r + i) * ngw + e * ge / gw];
            SHARDLM_UNROLL for (int t = 0; t < T; ++t)
                acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[i][t]), _mm256_set1_ps(sw * a.scales[t * a.ng + e]), acc[i][t]);
        }
    }
    // + sum over groups of min * (sum of the dequantized activations).
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        const float* mn = w.mins + (r + i) * ngw;
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
            float m = 0.0f;
            for (int64_t e = 0; e < a.ng; ++e) m += mn[e * ge / gw] * a.xs[t * a.ng + e];
            y[t * w.rows + r + i] = hsum(acc[i][t]) + m + (bias ? bias[r + i] : 0.0f);
        }
    }
}

template <int T>
void w4a8_gemv_rows(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int R = T == 1 ? 4 : T == 2 ? 2 : 1;  // 2 * R * T accumulators + the unpacked codes <= 16
    constexpr int64_t kAhead = 2;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const int64_t rb = w.cols / 2;
    int64_t r = r0;
    for (; r + R <= r1; r += R)
        w4a8_gemv_tile<R, T>(a, w, r, bias, y, r + (kAhead + 1) * R <= r1 ? base + (r + kAhead * R) * rb : nullptr);
    for (; r < r1; ++r) w4a8_gemv_tile<1, T>(a, w, r, bias, y, nullptr);
}

}  // namespace

void quantize_acts_avx2(const float* x, int64_t t0, int64_t t1, int64_t cols, int64_t g, int8_t* q, float* scales) {
    const int64_t ng = cols / g;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t t = t0; t < t1; ++t)
        for (int64_t e = 0; e < ng; ++e) {
            const float* p = x + t * cols + e * g;
            int8_t* d = q + t * cols + e * g;
            __m256 m = _mm256_setzero_ps();
            int64_t k = 0;
            for (; k + 8 <= g; k += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(p + k)), m);
            alignas(32) float lanes[8];
            _mm256_store_ps(lanes, m);
            float amax = 0.0f;
            for (float l : lanes) amax = std::max(amax, l);
            for (; k < g; ++k) amax = std::max(amax, std::fabs(p[k]));
            scales[t * ng + e] = amax / 127.0f;
            const float inv_s = amax > 0.0f ? 127.0f / amax : 0.0f;
            const __m256 inv = _mm256_set1_ps(inv_s), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
            for (k = 0; k + 8 <= g; k += 8) {
                const __m256 v = _mm256_max_ps(_mm256_min_ps(_mm256_mul_ps(_mm256_loadu_ps(p + k), inv), hi), lo);
                const __m256i i32 = _mm256_cvtps_epi32(v);  // round to nearest even
                const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
                _mm_storel_epi64(reinterpret_cast<__m128i*>(d + k), _mm_packs_epi16(i16, i16));
            }
            for (; k < g; ++k) {
                float v = p[k] * inv_s;
                v = v < 127.0f ? v : 127.0f;
                v = v > -127.0f ? v : -127.0f;
                d[k] = int8_t(_mm_cvtss_si32(_mm_set_ss(v)));
            }
        }
}

void acts_to_i16_avx2(const float* x, int64_t n, int64_t cols, int16_t* q, float* scales, int64_t group,
                      float* xsum) {
    const int64_t kp = i16_acts_stride(cols);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t t = 0; t < n; ++t) {
        const float* p = x + t * cols;
        int16_t* d = q + t * kp;
        __m256 m = _mm256_setzero_ps(), gs = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 8 <= cols; k += 8) {
            const __m256 v = _mm256_loadu_ps(p + k);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));  // lanes that held a NaN: max_ps would skip them
            m = _mm256_max_ps(_mm256_and_ps(v, abs_mask), m);
            if (xsum) {  // group a multiple of 32, so no group ends in the tail
                gs = _mm256_add_ps(gs, v);
                if ((k + 8) % group == 0) {
                    xsum[t * (cols / group) + k / group] = hsum(gs);
                    gs = _mm256_setzero_ps();
                }
            }
        }
        float amax = hmax(m);
        bool finite = _mm256_movemask_ps(bad) == 0;
        for (; k < cols; ++k) {
            finite = finite && !std::isnan(p[k]);
            amax = std::max(amax, std::fabs(p[k]));
        }
        finite = finite && std::isfinite(amax);
        scales[t] = finite ? amax / 32767.0f : __builtin_nanf("");
        const float inv_s = finite && amax > 0.0f ? 32767.0f / amax : 0.0f;
        const __m256 inv = _mm256_set1_ps(inv_s);
        for (k = 0; k + 16 <= cols; k += 16) {  // cvtps rounds to nearest even, packs saturates
            const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p + k), inv));
            const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p + k + 8), inv));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + k), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
        }
        for (; k < cols; ++k) {  // the same rounding (MXCSR's) and the same saturation
            const float v = std::min(32767.0f, std::max(-32767.0f, p[k] * inv_s));
            d[k] = int16_t(_mm_cvtss_si32(_mm_set_ss(v)));
        }
        for (; k < kp; ++k) d[k] = 0;
    }
}

void i16_rows_avx2(const I16Acts& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    const bool gemm = i16_gemm_usable(a.n, w);
    if (w.dtype == DType::I4) gemm ? i16_gemm_rows<true>(gemm_acts(a, w), w, bias, y, r0, r1) : i16_rows<true>(a, w, bias, y, r0, r1);
    else gemm ? i16_gemm_rows<false>(gemm_acts(a, w), w, bias, y, r0, r1) : i16_rows<false>(a, w, bias, y, r0, r1);
}

void i16_gemv_rows_avx2(const I16Acts& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    if (w.dtype == DType::I4) i16_rows<true>(a, w, bias, y, r0, r1);
    else i16_rows<false>(a, w, bias, y, r0, r1);
}

void matmul_rows_avx2(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, int64_t r0,
                      int64_t r1) {
    switch (w.dtype) {
        case DType::F16: matmul_rows_dt<DType::F16>(x, n, w, bias, y, r0, r1); break;
        case DType::BF16: matmul_rows_dt<DType::BF16>(x, n, w, bias, y, r0, r1); break;
        case DType::I8: matmul_rows_dt<DType::I8>(x, n, w, bias, y, r0, r1); break;
        case DType::I4: matmul_rows_dt<DType::I4>(x, n, w, bias, y, r0, r1); break;
        default: matmul_rows_dt<DType::F32>(x, n, w, bias, y, r0, r1); break;
    }
}

void w8a8_rows_avx2(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    if (a.n <= kInt8ActsGemvMaxN && a.ge % 32 == 0) {
        switch (a.n) {
            case 1: return w8a8_gemv_rows<1>(a, w, bias, y, r0, r1);
            case 2: return w8a8_gemv_rows<2>(a, w, bias, y, r0, r1);
            case 3: return w8a8_gemv_rows<3>(a, w, bias, y, r0, r1);
            case 4: return w8a8_gemv_rows<4>(a, w, bias, y, r0, r1);
            case 5: return w8a8_gemv_rows<5>(a, w, bias, y, r0, r1);
            case 6: return w8a8_gemv_rows<6>(a, w, bias, y, r0, r1);
            case 7: return w8a8_gemv_rows<7>(a, w, bias, y, r0, r1);
            default: return w8a8_gemv_rows<8>(a, w, bias, y, r0, r1);
        }
    }
    if (a.q16) return i16_gemm_rows<false>(gemm_acts(a), w, bias, y, r0, r1);
    w8a8_packed_rows<false>(a, w, bias, y, r0, r1);
}

void w4a8_rows_avx2(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    if (a.n <= kGemvMaxN && a.xi4 && a.ge % 128 == 0) {
        switch (a.n) {
            case 1: w4a8_gemv_rows<1>(a, w, bias, y, r0, r1); return;
            case 2: w4a8_gemv_rows<2>(a, w, bias, y, r0, r1); return;
            case 3: w4a8_gemv_rows<3>(a, w, bias, y, r0, r1); return;
            default: w4a8_gemv_rows<4>(a, w, bias, y, r0, r1); return;
        }
    }
    w8a8_packed_rows<true>(a, w, bias, y, r0, r1);
}

}  // namespace shardlm
