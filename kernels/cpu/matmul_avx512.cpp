// AVX-512 (F/DQ/BW/VL) + VNNI + FMA + F16C kernels of matmul, matmul_w8a8 and matmul_w4a8. This file
// alone is compiled with those -m flags and is only called after a run-time CPU check (cpu_isa.cpp).
//
// Three kernels, all over the rows [r0, r1) one thread owns:
//  - GEMV (n <= kGemvMaxN, decode): R weight rows x n tokens of accumulators, vectors along k, the
//    weights read straight from the row-major matrix once (memory-bound by design). INT8 weights
//    are widened to f32 and scaled in registers, per group.
//  - GEMM (larger n, prefill): a 32-row x KC panel of weights is dequantized/transposed into
//    [KC][32] f32 (L1-resident) and swept by a 32-row x 12-token register tile; x is packed per
//    k-block as [KC][12] so each broadcast is one load at a fixed offset.
//  - W8A8 GEMM: a 32-row panel of int8 weights is repacked as VNNI quads [quad][32 rows][4 bytes]
//    (u8 = w + 128) and swept by vpdpbusd with 4-byte activation broadcasts, 8 tokens at a time.
//  - W8A8 GEMV (decode, groups a multiple of 64): vpdpbusd along k on the row-major weights.
//  - INT8 and INT4 weights on INT16 activations (from 3 tokens on, matmul_kernels.h): vpdpwssd
//    along k on the row-major weights, 4 rows x 4 tokens per pass, token blocks of 64.
//  - W4A8: the W8A8 GEMM with the 4-bit codes unpacked into its panels; and a GEMV that splits each
//    64-byte load of codes into two vpdpbusd operands against pre-ordered activations.
// Also quantize_acts_avx512 (the activation quantizer of quantize.h, vectorised).
//
// simd_avx512.h first: it silences GCC 12's false warnings inside <immintrin.h>, which must not be
// parsed before it.
#include "kernels/cpu/simd_avx512.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/simd_avx2.h"

namespace shardlm {
namespace {

// acc += u8(a) . s8(b) per 32-bit lane (4 products each). GCC 12 wraps the intrinsic in register
// copies of the accumulator on every use (two extra moves per vpdpbusd in the GEMM loop); the same
// instruction as inline asm keeps the accumulator in place.
inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
#else
    return _mm512_dpbusd_epi32(acc, a, b);
#endif
}

// ---------------------------------------------------------------------------------------------
// GEMV: y[t, r] = sum_k x[t, k] * W[r, k] for T <= 4 tokens and R rows at a time. acc[i][t] keeps
// 16 partial sums (lane = k mod 16), reduced once at the end of the row.

template <DType DT, int R, int T, bool SCALED, bool TAIL>
inline __attribute__((always_inline)) void gemv_step(const uint8_t* const (&wr)[R], const float* x, int64_t cols,
                                                     int64_t k, __mmask16 m, const __m512 (&sc)[R],
                                                     __m512 (&acc)[R][T], const uint8_t* pf) {
    // A later tile (R contiguous rows) streams into L2 while this one is summed, R * 16 elements per
    // step: the R interleaved row streams alone leave the hardware prefetchers well short of the
    // copy bandwidth (measured ~55% -> ~75% of a one-stream read, one thread).
    if (pf)
        for (size_t o = 0; o < R * 16 * elem_size<DT>(); o += 64)
            _mm_prefetch(reinterpret_cast<const char*>(pf + size_t(k) * R * elem_size<DT>() + o), _MM_HINT_T1);
    __m512 xv[T];
    SHARDLM_UNROLL for (int t = 0; t < T; ++t)
        xv[t] = TAIL ? _mm512_maskz_loadu_ps(m, x + t * cols + k) : _mm512_loadu_ps(x + t * cols + k);
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        __m512 wv = TAIL ? load16m<DT>(wr[i], k, m) : load16<DT>(wr[i], k);
        if (SCALED) wv = _mm512_mul_ps(wv, sc[i]);
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm512_fmadd_ps(wv, xv[t], acc[i][t]);
    }
}

template <DType DT, int R, int T>
void gemv_tile(const float* x, const WeightView& w, int64_t r, const float* bias, float* y, const uint8_t* pf) {
    const int64_t cols = w.cols;
    const uint8_t* wr[R];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) wr[i] = static_cast<const uint8_t*>(w.data) + size_t((r + i) * cols) * elem_size<DT>();
    __m512 acc[R][T], sc[R];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        sc[i] = _mm512_set1_ps(1.0f);
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_ps();
    }
    const bool grouped = DT == DType::I8 && w.group_size < cols;
    if (grouped) {  // dequantize each 16-wide chunk with its group's scale (any group size)
        const int64_t g_len = w.group_size, ng = cols / g_len;
        for (int64_t g = 0; g < ng; ++g) {
            SHARDLM_UNROLL for (int i = 0; i < R; ++i) sc[i] = _mm512_set1_ps(w.scales[(r + i) * ng + g]);
            int64_t k = g * g_len;
            const int64_t end = k + g_len;
            for (; k + 16 <= end; k += 16) gemv_step<DT, R, T, true, false>(wr, x, cols, k, 0, sc, acc, pf);
            if (k < end) gemv_step<DT, R, T, true, true>(wr, x, cols, k, mask16(end - k), sc, acc, nullptr);
        }
    } else {  // f32/f16/bf16, or one scale per row applied after the sum
        int64_t k = 0;
        for (; k + 16 <= cols; k += 16) gemv_step<DT, R, T, false, false>(wr, x, cols, k, 0, sc, acc, pf);
        if (k < cols) gemv_step<DT, R, T, false, true>(wr, x, cols, k, mask16(cols - k), sc, acc, nullptr);
    }
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        const float post = DT == DType::I8 && !grouped ? w.scales[r + i] : 1.0f;
        const float b = bias ? bias[r + i] : 0.0f;
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) y[t * w.rows + r + i] = _mm512_reduce_add_ps(acc[i][t]) * post + b;
    }
}

template <DType DT, int T>
void gemv_rows(const float* x, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    // 4 rows per tile: 8 (tried for T <= 2) means 16 row streams plus their prefetches on a 2-thread
    // machine, which read DRAM slower (Xeon, int8 n=1: 16.4 -> 20.0 GB/s with 4). 16-bit rows at one
    // token take 2, as many bytes per tile as 4 INT8 rows (Xeon with AMX, weights on huge pages,
    // bf16 n=1: 115-118 -> 105-112 ms per step; at 2-4 tokens 4 rows share each load of x and win).
    constexpr int R = T == 1 && elem_size<DT>() == 2 ? 2 : 4;
    constexpr int64_t kAhead = 2;  // tiles between the one summed and the one prefetched
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const size_t tile_bytes = size_t(R * w.cols) * elem_size<DT>();
    int64_t r = r0;
    for (; r + R <= r1; r += R) {
        const uint8_t* next = r + (kAhead + 1) * R <= r1 ? base + size_t(r * w.cols) * elem_size<DT>() + kAhead * tile_bytes : nullptr;
        gemv_tile<DT, R, T>(x, w, r, bias, y, next);
    }
    for (; r < r1; ++r) gemv_tile<DT, 1, T>(x, w, r, bias, y, nullptr);
}

// 5-8 tokens: per tile of R rows, tokens 0..3 and then the other T2 with the tile's rows still in L1,
// so the weights stream from memory once (the register-blocked GEMM there took about 4x the time of
// 4 tokens on one INT8 matrix); each token's sums are those of a GEMV of at most 4 tokens.
template <DType DT, int T2>
void gemv_rows8(const float* x, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int R = 4;
    constexpr int64_t kAhead = 2;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const size_t tile_bytes = size_t(R * w.cols) * elem_size<DT>();
    const float* x_hi = x + 4 * w.cols;
    float* y_hi = y + 4 * w.rows;
    int64_t r = r0;
    for (; r + R <= r1; r += R) {
        const uint8_t* next = r + (kAhead + 1) * R <= r1 ? base + size_t(r * w.cols) * elem_size<DT>() + kAhead * tile_bytes : nullptr;
        gemv_tile<DT, R, 4>(x, w, r, bias, y, next);
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
// INT8 and INT4 weights on INT16 activations (matmul_kernels.h, i16_gemv_usable): R rows x T <= 4
// tokens, 32 columns per step, acc[i][t] 16 INT32 lanes (2 products each per step) flushed to f32
// per group or segment.

// acc += pairs of s16(a) * s16(b) per 32-bit lane, as inline asm for the reason of dpbusd above.
inline __m512i dpwssd(__m512i acc, __m512i a, __m512i b) {
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
#else
    return _mm512_dpwssd_epi32(acc, a, b);
#endif
}

// 32 columns from k of a row as int16: I8 sign-extended; I4 (16 bytes, low nibbles the block's
// columns 0..15, high nibbles 16..31) with the high nibbles shifted down in the upper 128 bits.
template <bool I4, bool TAIL>
inline __m512i load32_i16(const uint8_t* row, int64_t k, __mmask32 m) {
    if constexpr (I4) {
        const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2)));
        const __m256i shift = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
        return _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srlv_epi16(b, shift), _mm256_set1_epi8(0x0F)));
    } else {
        const __m256i b = TAIL ? _mm256_maskz_loadu_epi8(m, row + k) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k));
        return _mm512_cvtepi8_epi16(b);
    }
}

template <bool I4, int R, int T, bool TAIL>
inline __attribute__((always_inline)) void i16_step(const uint8_t* const (&wr)[R], const int16_t* q, int64_t kp, int64_t k,
                                                    __mmask32 m, __m512i (&acc)[R][T], const uint8_t* pf) {
    constexpr int kStepBytes = R * (I4 ? 16 : 32);
    if (pf)  // the tile kAhead tiles on, at the pace of this one (see gemv_step)
        for (int o = 0; o < kStepBytes; o += 64)
            _mm_prefetch(reinterpret_cast<const char*>(pf + k / 32 * kStepBytes + o), _MM_HINT_T1);
    __m512i xv[T];
    SHARDLM_UNROLL for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_si512(q + t * kp + k);
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        const __m512i wv = load32_i16<I4, TAIL>(wr[i], k, m);
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = dpwssd(acc[i][t], wv, xv[t]);
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
    __m512 sum[R][T];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) SHARDLM_UNROLL for (int t = 0; t < T; ++t) sum[i][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; ++g)
        for (int64_t s0 = g * g_len, g_end = s0 + g_len; s0 < g_end; s0 += kI16FlushCols) {
            const int64_t s1 = std::min(g_end, s0 + kI16FlushCols);
            __m512i acc[R][T];
            SHARDLM_UNROLL for (int i = 0; i < R; ++i) SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_si512();
            int64_t k = s0;
            for (; k + 32 <= s1; k += 32) i16_step<I4, R, T, false>(wr, q, kp, k, 0, acc, pf);
            if (k < s1) i16_step<I4, R, T, true>(wr, q, kp, k, __mmask32(mask64(s1 - k)), acc, nullptr);  // I8 only
            SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
                const __m512 sc = _mm512_set1_ps(grouped ? w.scales[(r + i) * ng + g] : 1.0f);
                SHARDLM_UNROLL for (int t = 0; t < T; ++t)
                    sum[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][t]), sc, sum[i][t]);
            }
        }
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        const float post = grouped ? 1.0f : w.scales[r + i];
        const float b = bias ? bias[r + i] : 0.0f;
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
            float mins = 0.0f;
            if constexpr (I4)
                for (int64_t g = 0; g < ng; ++g) mins += w.mins[(r + i) * ng + g] * a.xsum[(t0 + t) * ng + g];
            y[(t0 + t) * w.rows + r + i] = _mm512_reduce_add_ps(sum[i][t]) * (post * a.scales[t0 + t]) + mins + b;
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

template <bool I4>
void i16_rows(const I16Acts& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int R = 4;
    constexpr int64_t kAhead = 2;  // as gemv_rows
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

// ---------------------------------------------------------------------------------------------
// INT16 GEMM for prefill (i16_gemm_usable): the weights of a 32-row block unpacked once to int16
// pairs, panel [pair k/2][half][16 rows][2 int16] (64 bytes per pair and half, the whole K), and
// each token's pair of activations broadcast against them: per pair, 2 loads and N broadcasts feed
// 2N vpdpwssd, where the GEMV-shaped kernel above loads every row and token vector anew. INT32
// sums flushed to f32 (in L1) per group and every 512 columns; I4 adds the mins' share per group.

// The f32 tiles of the packed integer GEMMs (kernel_i16, kernel_w8a8): facc [N tokens][32 rows]
// in L1. tile_add_mins: + the rows' mins mn [32] times each token's xs[t * stride] (I4 weights);
// tile_store: facc + bias into y [N][ys], rows past the masks left alone.
template <int N>
inline void tile_add_mins(float (&facc)[N][32], const float* mn, const float* xs, int64_t stride) {
    const __m512 mn0 = _mm512_load_ps(mn), mn1 = _mm512_load_ps(mn + 16);
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
        const __m512 x = _mm512_set1_ps(xs[t * stride]);
        _mm512_store_ps(facc[t], _mm512_fmadd_ps(mn0, x, _mm512_load_ps(facc[t])));
        _mm512_store_ps(facc[t] + 16, _mm512_fmadd_ps(mn1, x, _mm512_load_ps(facc[t] + 16)));
    }
}

template <int N>
inline void tile_store(const float (&facc)[N][32], float* y, int64_t ys, __mmask16 m0, __mmask16 m1, const float* bias) {
    const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    const __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
        _mm512_mask_storeu_ps(y + t * ys, m0, _mm512_add_ps(_mm512_load_ps(facc[t]), b0));
        _mm512_mask_storeu_ps(y + t * ys + 16, m1, _mm512_add_ps(_mm512_load_ps(facc[t] + 16), b1));
    }
}

constexpr int NR16 = 12;  // tokens per tile: 24 accumulators, 2 weight vectors and a broadcast
// Here a lane is one row, so it takes every column's product: flushed every 512 columns.
constexpr int64_t kI16GemmFlushCols = 512;
static_assert(kI16GemmFlushCols * 128 * 32767LL < (1LL << 31), "an INT32 lane could overflow");

// 32 columns from k of the row (I8 sign-extended, I4 codes) as 16 int32 pairs; zeros past cols.
template <bool I4>
inline __m512 pairs16(const uint8_t* row, int64_t k, int64_t cols) {
    if constexpr (I4) return _mm512_castsi512_ps(load32_i16<true, false>(row, k, 0));
    else return _mm512_castsi512_ps(load32_i16<false, true>(row, k, __mmask32(mask64(cols - k))));
}

// Rows [rb, rb + nr) (nr <= 32) into the panel; wsc [ng][32] their scales per group (one group of
// the whole row with one scale per row), wmn [ng][32] (I4) their mins; zeros for rows past nr.
template <bool I4>
void pack_i16(const WeightView& w, int64_t kp, int64_t rb, int64_t nr, uint8_t* panel, float* wsc, float* wmn) {
    const int64_t row_bytes = weight_row_bytes(w), ng = (I4 || w.group_size < w.cols) ? w.cols / w.group_size : 1;
    const uint8_t* wq = static_cast<const uint8_t*>(w.data);
    for (int h = 0; h < 2; ++h) {
        const int64_t vr = std::clamp<int64_t>(nr - 16 * h, 0, 16);
        for (int64_t k = 0; k < kp; k += 32) {
            __m512 v[16];
            for (int i = 0; i < 16; ++i)
                v[i] = i < vr ? pairs16<I4>(wq + (rb + 16 * h + i) * row_bytes, k, w.cols) : _mm512_setzero_ps();
            transpose16(v);  // v[j] = pair j of each of the 16 rows
            for (int j = 0; j < 16; ++j) _mm512_store_ps(reinterpret_cast<float*>(panel + ((k / 2 + j) * 2 + h) * 64), v[j]);
        }
        for (int64_t g = 0; g < ng; ++g)
            for (int i = 0; i < 16; ++i) {
                const int64_t wi = (rb + 16 * h + i) * ng + g;
                wsc[g * 32 + 16 * h + i] = i < vr ? w.scales[wi] : 0.0f;
                if constexpr (I4) wmn[g * 32 + 16 * h + i] = i < vr ? w.mins[wi] : 0.0f;
            }
    }
}

template <int N, bool I4>
void kernel_i16(const I16Acts& a, const uint8_t* panel, const float* wsc, const float* wmn, int64_t g_len, int64_t ng,
                int64_t t0, float* y, int64_t ys, __mmask16 m0, __mmask16 m1, const float* bias) {
    alignas(64) float facc[N][32];  // f32 sums in L1, touched once per segment
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
        _mm512_store_ps(facc[t], _mm512_setzero_ps());
        _mm512_store_ps(facc[t] + 16, _mm512_setzero_ps());
    }
    const int16_t* xq[N];
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) xq[t] = a.q + (t0 + t) * a.kp;
    for (int64_t g = 0; g < ng; ++g) {
        const int64_t g_end = ng == 1 ? a.kp : (g + 1) * g_len;  // one group of the whole row: up to kp
        for (int64_t s0 = g * g_len; s0 < g_end; s0 += kI16GemmFlushCols) {
            const int64_t p0 = s0 / 2, p1 = std::min(g_end, s0 + kI16GemmFlushCols) / 2;
            __m512i acc[N][2];
            SHARDLM_UNROLL for (int t = 0; t < N; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_si512();
            for (int64_t p = p0; p < p1; ++p) {
                const __m512i w0 = _mm512_load_si512(panel + p * 128), w1 = _mm512_load_si512(panel + p * 128 + 64);
                SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
                    int32_t pair;
                    std::memcpy(&pair, xq[t] + 2 * p, 4);
                    const __m512i b = _mm512_set1_epi32(pair);
                    acc[t][0] = dpwssd(acc[t][0], w0, b);
                    acc[t][1] = dpwssd(acc[t][1], w1, b);
                }
            }
            const __m512 sw0 = _mm512_load_ps(wsc + g * 32), sw1 = _mm512_load_ps(wsc + g * 32 + 16);
            SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
                const __m512 sa = _mm512_set1_ps(a.scales[t0 + t]);
                _mm512_store_ps(facc[t], _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t][0]), _mm512_mul_ps(sw0, sa), _mm512_load_ps(facc[t])));
                _mm512_store_ps(facc[t] + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t][1]), _mm512_mul_ps(sw1, sa), _mm512_load_ps(facc[t] + 16)));
            }
        }
        if constexpr (I4) tile_add_mins<N>(facc, wmn + g * 32, a.xsum + t0 * ng + g, ng);  // + min * (f32 sum of x)
    }
    tile_store<N>(facc, y, ys, m0, m1, bias);
}

using KernelI16 = void (*)(const I16Acts&, const uint8_t*, const float*, const float*, int64_t, int64_t, int64_t,
                           float*, int64_t, __mmask16, __mmask16, const float*);
template <bool I4>
constexpr KernelI16 kKernelsI16[NR16 + 1] = {
    nullptr,            kernel_i16<1, I4>,  kernel_i16<2, I4>, kernel_i16<3, I4>, kernel_i16<4, I4>,
    kernel_i16<5, I4>,  kernel_i16<6, I4>,  kernel_i16<7, I4>, kernel_i16<8, I4>, kernel_i16<9, I4>,
    kernel_i16<10, I4>, kernel_i16<11, I4>, kernel_i16<12, I4>};

template <bool I4>
void i16_gemm_rows(const I16Acts& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    const bool grouped = I4 || w.group_size < w.cols;
    const int64_t g_len = grouped ? w.group_size : w.cols, ng = w.cols / g_len;
    const size_t panel_bytes = size_t(a.kp) * 64;  // 32 rows x 2 bytes per column
    uint8_t* mem = scratch(panel_bytes + size_t(ng * 32) * 8);
    float* wsc = reinterpret_cast<float*>(mem + panel_bytes);
    float* wmn = wsc + ng * 32;
    for (int64_t rb = r0; rb < r1; rb += 32) {
        const int64_t nr = std::min<int64_t>(32, r1 - rb);
        pack_i16<I4>(w, a.kp, rb, nr, mem, wsc, wmn);
        const __mmask16 m0 = mask16(nr), m1 = mask16(std::max<int64_t>(0, nr - 16));
        for (int64_t t0 = 0; t0 < a.n; t0 += NR16) {
            const int64_t nt = std::min<int64_t>(NR16, a.n - t0);
            kKernelsI16<I4>[nt](a, mem, wsc, wmn, g_len, ng, t0, y + t0 * w.rows + rb, w.rows, m0, m1,
                                bias ? bias + rb : nullptr);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// INT4 GEMV: R rows x T tokens. Each 16-byte load is a 32-column block of a row (low nibbles the
// first 16 columns, high nibbles the next 16). Codes are summed against x per group without their
// scale, which is applied once per group; the mins' share, sum_g min[r, g] * sum(x in group g), is
// added at the end from per-token group sums of x computed once per call.

// Group sums of x [T][ng] into a per-thread buffer.
const float* group_sums(const float* x, int64_t n, int64_t cols, int64_t g_len) {
    const int64_t ng = cols / g_len;
    float* sums = reinterpret_cast<float*>(kernel_scratch(ScratchSlot::GroupSums, size_t(n * ng) * 4));
    for (int64_t t = 0; t < n; ++t)
        for (int64_t g = 0; g < ng; ++g) {
            __m512 a = _mm512_setzero_ps();
            for (int64_t k = g * g_len; k < (g + 1) * g_len; k += 16) a = _mm512_add_ps(a, _mm512_loadu_ps(x + t * cols + k));
            sums[t * ng + g] = _mm512_reduce_add_ps(a);
        }
    return sums;
}

// The 32 codes of the 16 bytes at p as two vectors of f32 (columns 0..15 and 16..31 of the block).
inline void unpack32(const uint8_t* p, __m512& lo, __m512& hi) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i nib = _mm_set1_epi8(0x0F);
    lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, nib)));
    hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), nib)));
}

template <int R, int T>
void gemv_i4_tile(const float* x, const WeightView& w, int64_t r, const float* bias, float* y, const float* xsum,
                  const uint8_t* pf) {
    const int64_t cols = w.cols, rb = cols / 2, g_len = w.group_size, ng = cols / g_len;
    const uint8_t* wr[R];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) wr[i] = static_cast<const uint8_t*>(w.data) + (r + i) * rb;
    __m512 acc[R][T];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
        __m512 ag[R][T];
        SHARDLM_UNROLL for (int i = 0; i < R; ++i) SHARDLM_UNROLL for (int t = 0; t < T; ++t) ag[i][t] = _mm512_setzero_ps();
        for (int64_t k = g * g_len; k < (g + 1) * g_len; k += 32) {
            if (pf && k % 128 == 0)  // the tile R rows on, at the same pace (R * 64 bytes per 128 columns)
                for (int i = 0; i < R; ++i) _mm_prefetch(reinterpret_cast<const char*>(pf + i * rb + k / 2), _MM_HINT_T1);
            __m512 x0[T], x1[T];
            SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
                x0[t] = _mm512_loadu_ps(x + t * cols + k);
                x1[t] = _mm512_loadu_ps(x + t * cols + k + 16);
            }
            SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
                __m512 lo, hi;
                unpack32(wr[i] + k / 2, lo, hi);
                SHARDLM_UNROLL for (int t = 0; t < T; ++t) ag[i][t] = _mm512_fmadd_ps(hi, x1[t], _mm512_fmadd_ps(lo, x0[t], ag[i][t]));
            }
        }
        SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
            const __m512 sc = _mm512_set1_ps(w.scales[(r + i) * ng + g]);
            SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm512_fmadd_ps(ag[i][t], sc, acc[i][t]);
        }
    }
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        const float* mn = w.mins + (r + i) * ng;
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
            float m = 0.0f;
            for (int64_t g = 0; g < ng; ++g) m += mn[g] * xsum[t * ng + g];
            y[t * w.rows + r + i] = _mm512_reduce_add_ps(acc[i][t]) + m + (bias ? bias[r + i] : 0.0f);
        }
    }
}

// Groups of 128 columns or more (the int4 default): one 64-byte load is a 128-column chunk, 16
// dword lanes of 8 nibbles. vpermps indexes its table with the low 4 bits of each lane, so
// `v >> 4k` and one permute give nibble k of every lane already dequantized, from a table of the 16
// values code * scale + min rebuilt per group: 2 uops per 16 weights against 4.5 for the unpack
// above (hot cache, one thread, n = 1: 19.5 -> 23.6 Gweights/s). Nibble k of lane l holds a column
// of the chunk that the layout fixes (i4_chunk_order's table), so x is reordered once per call.
constexpr int64_t kI4Chunk = 128;

// x [n][cols] reordered per 128-column chunk as [nibble k][lane l], into a per-thread buffer: one
// gather per 16 values (the threads call this once per chunk of rows, so it must stay cheap).
const float* i4_chunk_order(const float* x, int64_t n, int64_t cols) {
    struct Order {
        alignas(64) int32_t col[kI4Chunk];  // [k][l]: the chunk column in nibble k of lane l
        Order() {
            for (int32_t c = 0; c < int32_t(kI4Chunk); ++c) {  // byte b is lane b / 4, nibbles 2 (b % 4) + 0/1
                const int64_t b = int4_byte(c), k = 2 * (b % 4) + int4_shift(c) / 4;
                col[16 * k + b / 4] = c;
            }
        }
    };
    static const Order order;
    float* xp = reinterpret_cast<float*>(kernel_scratch(ScratchSlot::Reordered, size_t(n * cols) * 4));
    for (int64_t t = 0; t < n; ++t)
        for (int64_t c0 = 0; c0 < cols; c0 += kI4Chunk)
            for (int k = 0; k < 8; ++k)
                _mm512_storeu_ps(xp + t * cols + c0 + 16 * k,
                                 _mm512_i32gather_ps(_mm512_load_si512(order.col + 16 * k), x + t * cols + c0, 4));
    return xp;
}

template <int R, int T>
void gemv_i4_chunk_tile(const float* xp, const WeightView& w, int64_t r, const float* bias, float* y,
                        const uint8_t* pf) {
    const int64_t cols = w.cols, rb = cols / 2, g_len = w.group_size, ng = cols / g_len;
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const uint8_t* wr[R];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) wr[i] = static_cast<const uint8_t*>(w.data) + (r + i) * rb;
    __m512 acc[R][T];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
        __m512 table[R];
        SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
            const int64_t gi = (r + i) * ng + g;
            table[i] = _mm512_fmadd_ps(codes, _mm512_set1_ps(w.scales[gi]), _mm512_set1_ps(w.mins[gi]));
        }
        for (int64_t c = g * g_len; c < (g + 1) * g_len; c += kI4Chunk) {
            if (pf)  // the tile R rows on, at the pace this one is read
                for (int i = 0; i < R; ++i) _mm_prefetch(reinterpret_cast<const char*>(pf + i * rb + c / 2), _MM_HINT_T1);
            SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
                const __m512i v = _mm512_loadu_si512(wr[i] + c / 2);
                SHARDLM_UNROLL for (int k = 0; k < 8; ++k) {
                    const __m512 wk = _mm512_permutexvar_ps(k == 0 ? v : _mm512_srli_epi32(v, unsigned(4 * k)), table[i]);
                    SHARDLM_UNROLL for (int t = 0; t < T; ++t)
                        acc[i][t] = _mm512_fmadd_ps(wk, _mm512_loadu_ps(xp + t * cols + c + 16 * k), acc[i][t]);
                }
            }
        }
    }
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        const float b = bias ? bias[r + i] : 0.0f;
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) y[t * w.rows + r + i] = _mm512_reduce_add_ps(acc[i][t]) + b;
    }
}

template <int T>
void gemv_i4_rows(const float* x, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    // 2 * R * T accumulators + 2 * T activations <= 32; one token reads DRAM fastest with 2 rows
    // (Xeon, n=1 from DRAM: 13.3 GB/s with 8, 15.2 with 2).
    constexpr int R = T == 1 ? 2 : T == 2 ? 4 : 2;
    constexpr int64_t kAhead = 2;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const int64_t rb = w.cols / 2;
    int64_t r = r0;
    if (w.group_size % kI4Chunk == 0) {
        const float* xp = i4_chunk_order(x, T, w.cols);
        for (; r + R <= r1; r += R)
            gemv_i4_chunk_tile<R, T>(xp, w, r, bias, y, r + (kAhead + 1) * R <= r1 ? base + (r + kAhead * R) * rb : nullptr);
        for (; r < r1; ++r) gemv_i4_chunk_tile<1, T>(xp, w, r, bias, y, nullptr);
        return;
    }
    const float* xsum = group_sums(x, T, w.cols, w.group_size);
    for (; r + R <= r1; r += R)
        gemv_i4_tile<R, T>(x, w, r, bias, y, xsum, r + (kAhead + 1) * R <= r1 ? base + (r + kAhead * R) * rb : nullptr);
    for (; r < r1; ++r) gemv_i4_tile<1, T>(x, w, r, bias, y, xsum, nullptr);
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
// GEMM for f32 activations: panel [KC][32] f32, x block [n_tiles][KC][NR], y += panel^T x.

constexpr int MR = 32;
constexpr int NR = 12;
constexpr int64_t KC = 256;

// Rows rb .. rb + nr (nr <= 32) of W, columns k0 .. k0 + kc, dequantized into panel[k][0..32)
// (rows past nr are zero).
template <DType DT>
void pack_f32(const WeightView& w, int64_t rb, int64_t nr, int64_t k0, int64_t kc, float* panel) {
    const int64_t cols = w.cols;
    const int64_t ng = w.n_groups(), g_len = w.group_size;
    if constexpr (DT == DType::I4) {  // k0 and kc are multiples of 32 (cols is, and so is KC)
        for (int h = 0; h < 2; ++h) {
            const int64_t vr = std::clamp<int64_t>(nr - 16 * h, 0, 16);
            for (int64_t kk = 0; kk < kc; kk += 32) {
                const int64_t k = k0 + kk;
                __m512 lo[16], hi[16];
                for (int i = 0; i < 16; ++i) {
                    if (i >= vr) {
                        lo[i] = hi[i] = _mm512_setzero_ps();
                        continue;
                    }
                    const int64_t row = rb + 16 * h + i;
                    unpack32(static_cast<const uint8_t*>(w.data) + row * (cols / 2) + k / 2, lo[i], hi[i]);
                    const __m512 s = _mm512_set1_ps(w.scales[row * ng + k / g_len]);
                    const __m512 m = _mm512_set1_ps(w.mins[row * ng + k / g_len]);
                    lo[i] = _mm512_fmadd_ps(lo[i], s, m);
                    hi[i] = _mm512_fmadd_ps(hi[i], s, m);
                }
                transpose16(lo);
                transpose16(hi);
                for (int j = 0; j < 16; ++j) {
                    _mm512_store_ps(panel + (kk + j) * MR + 16 * h, lo[j]);
                    _mm512_store_ps(panel + (kk + 16 + j) * MR + 16 * h, hi[j]);
                }
            }
        }
        return;
    }
    for (int h = 0; h < 2; ++h) {
        const int64_t vr = std::clamp<int64_t>(nr - 16 * h, 0, 16);
        for (int64_t kk = 0; kk < kc; kk += 16) {
            const int64_t len = std::min<int64_t>(16, kc - kk);
            __m512 v[16];
            for (int i = 0; i < 16; ++i) {
                if (i >= vr) {
                    v[i] = _mm512_setzero_ps();
                    continue;
                }
                const int64_t row = rb + 16 * h + i;
                const void* src = static_cast<const uint8_t*>(w.data) + size_t(row * cols) * elem_size<DT>();
                v[i] = len == 16 ? load16<DT>(src, k0 + kk) : load16m<DT>(src, k0 + kk, mask16(len));
                if constexpr (DT == DType::I8) {
                    const float* s = w.scales + row * ng;
                    if (g_len % 16 == 0) {  // the 16 values share one group (k0 is a multiple of 16)
                        v[i] = _mm512_mul_ps(v[i], _mm512_set1_ps(s[(k0 + kk) / g_len]));
                    } else {
                        alignas(64) float sv[16];
                        for (int l = 0; l < 16; ++l) sv[l] = s[std::min(k0 + kk + l, cols - 1) / g_len];
                        v[i] = _mm512_mul_ps(v[i], _mm512_load_ps(sv));
                    }
                }
            }
            transpose16(v);
            for (int64_t j = 0; j < len; ++j) _mm512_store_ps(panel + (kk + j) * MR + 16 * h, v[j]);
        }
    }
}

// y[t, 0..32) (+)= sum_k panel[k][.] * xp[k][t] for t < N; `first` starts from the bias.
template <int N>
void kernel_f32(const float* panel, const float* xp, int64_t kc, float* y, int64_t ys, __mmask16 m0, __mmask16 m1,
                const float* bias, bool first) {
    __m512 acc[N][2];
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; ++k) {
        const __m512 w0 = _mm512_load_ps(panel + k * MR), w1 = _mm512_load_ps(panel + k * MR + 16);
        SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
            const __m512 b = _mm512_set1_ps(xp[k * NR + t]);
            acc[t][0] = _mm512_fmadd_ps(w0, b, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(w1, b, acc[t][1]);
        }
    }
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
        float* yt = y + t * ys;
        __m512 c0, c1;
        if (first) {
            c0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
            c1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
        } else {
            c0 = _mm512_maskz_loadu_ps(m0, yt);
            c1 = _mm512_maskz_loadu_ps(m1, yt + 16);
        }
        _mm512_mask_storeu_ps(yt, m0, _mm512_add_ps(acc[t][0], c0));
        _mm512_mask_storeu_ps(yt + 16, m1, _mm512_add_ps(acc[t][1], c1));
    }
}

using KernelF32 = void (*)(const float*, const float*, int64_t, float*, int64_t, __mmask16, __mmask16, const float*, bool);
constexpr KernelF32 kKernelsF32[NR + 1] = {nullptr,        kernel_f32<1>, kernel_f32<2>,  kernel_f32<3>, kernel_f32<4>,
                                           kernel_f32<5>,  kernel_f32<6>, kernel_f32<7>,  kernel_f32<8>, kernel_f32<9>,
                                           kernel_f32<10>, kernel_f32<11>, kernel_f32<12>};

// Store masks of the two 16-row halves of a block of nr <= 32 rows.
inline std::pair<__mmask16, __mmask16> row_masks(int64_t nr) {
    return {mask16(nr), mask16(std::max<int64_t>(0, nr - 16))};
}

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
// W8A8. vpdpbusd multiplies unsigned by signed bytes, so the panel holds u8 = w + 128 (w xor 0x80)
// and the activations stay signed: sum (w + 128) a = sum w a + 128 sum a, and each segment's
// accumulator starts at -128 * (sum of its activations) (W8A8Prep::seg_sums). Panel layout for a
// 32-row block: internal group e, quad q: 128 bytes [rows 0..16 x 4 bytes][rows 16..32 x 4 bytes]
// at ((e * Q + q) * 2 + half) * 64, Q = ge4 / 4; wsc[e][32] holds the rows' weight scales.

constexpr int NR8 = 8;

// Columns [k, k + len) of an I4 row as u8 codes in column order, zero-padded to 64 (k a multiple of
// 32, len 32 or 64).
inline __m512i unpack_codes64(const uint8_t* row, int64_t k, int64_t len) {
    const __m128i nib = _mm_set1_epi8(0x0F);
    const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
    __m512i v = _mm512_inserti32x4(_mm512_setzero_si512(), _mm_and_si128(b0, nib), 0);
    v = _mm512_inserti32x4(v, _mm_and_si128(_mm_srli_epi16(b0, 4), nib), 1);
    if (len > 32) {
        const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2 + 16));
        v = _mm512_inserti32x4(v, _mm_and_si128(b1, nib), 2);
        v = _mm512_inserti32x4(v, _mm_and_si128(_mm_srli_epi16(b1, 4), nib), 3);
    }
    return v;
}

// I8 (W8A8): the panel holds w + 128; I4 (W4A8): the codes as they are, and wmn[e][32] the mins.
template <bool I4>
void pack_w8a8(const W8A8Prep& a, const WeightView& w, int64_t rb, int64_t nr, uint8_t* panel, float* wsc,
               float* wmn) {
    const int64_t cols = w.cols, ge = a.ge, q_per = a.ge4 / 4, ngw = cols / w.group_size;
    const int64_t row_bytes = weight_row_bytes(w);
    const uint8_t* wq = static_cast<const uint8_t*>(w.data);
    const __m512i flip = I4 ? _mm512_setzero_si512() : _mm512_set1_epi8(char(0x80));
    for (int h = 0; h < 2; ++h) {
        const int64_t vr = std::clamp<int64_t>(nr - 16 * h, 0, 16);
        for (int64_t e = 0; e < a.ng; ++e) {
            for (int64_t c = 0; c < ge; c += 64) {
                const int64_t len = std::min<int64_t>(64, ge - c);
                const __mmask64 m = mask64(len);
                __m512 v[16];
                for (int i = 0; i < 16; ++i) {
                    const uint8_t* row = wq + (rb + 16 * h + i) * row_bytes;
                    if (i >= vr) v[i] = _mm512_setzero_ps();
                    else if constexpr (I4) v[i] = _mm512_castsi512_ps(unpack_codes64(row, e * ge + c, len));
                    else v[i] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi8(m, row + e * ge + c));
                }
                transpose16(v);  // v[j] = quad j (4 bytes) of each of the 16 rows
                const int64_t nq = (len + 3) / 4;
                for (int64_t j = 0; j < nq; ++j)
                    _mm512_store_si512(panel + ((e * q_per + c / 4 + j) * 2 + h) * 64,
                                       _mm512_xor_si512(_mm512_castps_si512(v[j]), flip));
            }
            for (int i = 0; i < 16; ++i) {
                const int64_t wi = (rb + 16 * h + i) * ngw + e * ge / w.group_size;
                wsc[e * MR + 16 * h + i] = i < vr ? w.scales[wi] : 0.0f;
                if constexpr (I4) wmn[e * MR + 16 * h + i] = i < vr ? w.mins[wi] : 0.0f;
            }
        }
    }
}

template <int N, bool I4>
void kernel_w8a8(const W8A8Prep& a, const uint8_t* panel, const float* wsc, const float* wmn, int64_t t0, float* y,
                 int64_t ys, __mmask16 m0, __mmask16 m1, const float* bias) {
    const int64_t q_per = a.ge4 / 4, seg_q = a.seg_len / 4;
    // f32 sums live in L1, touched once per segment; the registers hold only INT32 accumulators.
    alignas(64) float facc[N][MR];
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
        _mm512_store_ps(facc[t], _mm512_setzero_ps());
        _mm512_store_ps(facc[t] + 16, _mm512_setzero_ps());
    }
    const int8_t* xq[N];
    SHARDLM_UNROLL for (int t = 0; t < N; ++t) xq[t] = a.q + (t0 + t) * a.kp;
    for (int64_t e = 0; e < a.ng; ++e) {
        const uint8_t* pe = panel + e * q_per * 128;
        for (int64_t s = 0; s < a.segs; ++s) {
            const int64_t q0 = s * seg_q, q1 = std::min(q_per, q0 + seg_q);
            __m512i acc[N][2];
            SHARDLM_UNROLL for (int t = 0; t < N; ++t)
                acc[t][0] = acc[t][1] = I4 ? _mm512_setzero_si512()
                                           : _mm512_set1_epi32(-128 * a.seg_sums[((t0 + t) * a.ng + e) * a.segs + s]);
            for (int64_t q = q0; q < q1; ++q) {
                const __m512i w0 = _mm512_load_si512(pe + q * 128), w1 = _mm512_load_si512(pe + q * 128 + 64);
                SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
                    int32_t quad;
                    std::memcpy(&quad, xq[t] + e * a.ge4 + 4 * q, 4);
                    const __m512i b = _mm512_set1_epi32(quad);
                    acc[t][0] = dpbusd(acc[t][0], w0, b);
                    acc[t][1] = dpbusd(acc[t][1], w1, b);
                }
            }
            const __m512 sw0 = _mm512_load_ps(wsc + e * MR), sw1 = _mm512_load_ps(wsc + e * MR + 16);
            SHARDLM_UNROLL for (int t = 0; t < N; ++t) {
                const __m512 sa = _mm512_set1_ps(a.scales[(t0 + t) * a.ng + e]);
                _mm512_store_ps(facc[t], _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t][0]), _mm512_mul_ps(sw0, sa), _mm512_load_ps(facc[t])));
                _mm512_store_ps(facc[t] + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t][1]), _mm512_mul_ps(sw1, sa), _mm512_load_ps(facc[t] + 16)));
            }
        }
        // + min * (the group's sum of the dequantized activations)
        if constexpr (I4) tile_add_mins<N>(facc, wmn + e * MR, a.xs + t0 * a.ng + e, a.ng);
    }
    tile_store<N>(facc, y, ys, m0, m1, bias);
}

using KernelW8A8 = void (*)(const W8A8Prep&, const uint8_t*, const float*, const float*, int64_t, float*, int64_t,
                            __mmask16, __mmask16, const float*);
template <bool I4>
constexpr KernelW8A8 kKernelsW8A8[NR8 + 1] = {nullptr,
                                              kernel_w8a8<1, I4>, kernel_w8a8<2, I4>, kernel_w8a8<3, I4>,
                                              kernel_w8a8<4, I4>, kernel_w8a8<5, I4>, kernel_w8a8<6, I4>,
                                              kernel_w8a8<7, I4>, kernel_w8a8<8, I4>};

}  // namespace

void pack_w8a8_panel_avx512(const W8A8Prep& a, const WeightView& w, int64_t rb, int64_t nr, uint8_t* panel,
                            float* wsc, float* wmn) {
    if (a.i4) pack_w8a8<true>(a, w, rb, nr, panel, wsc, wmn);
    else pack_w8a8<false>(a, w, rb, nr, panel, wsc, wmn);
}

namespace {

// The packed W8A8/W4A8 GEMM over rows [r0, r1).
template <bool I4>
void w8a8_gemm_rows(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    const size_t panel_bytes = size_t(a.kp) * MR;  // kp bytes per row
    uint8_t* mem = scratch(panel_bytes + size_t(a.ng * MR) * 8);
    uint8_t* panel = mem;
    float* wsc = reinterpret_cast<float*>(mem + panel_bytes);
    float* wmn = wsc + a.ng * MR;
    for (int64_t rb = r0; rb < r1; rb += MR) {
        const int64_t nr = std::min<int64_t>(MR, r1 - rb);
        pack_w8a8<I4>(a, w, rb, nr, panel, wsc, wmn);
        const __mmask16 m0 = mask16(nr), m1 = mask16(std::max<int64_t>(0, nr - 16));
        for (int64_t t0 = 0; t0 < a.n; t0 += NR8) {
            const int64_t nt = std::min<int64_t>(NR8, a.n - t0);
            kKernelsW8A8<I4>[nt](a, panel, wsc, wmn, t0, y + t0 * w.rows + rb, w.rows, m0, m1, bias ? bias + rb : nullptr);
        }
    }
}

// W8A8 GEMV (n <= kGemvMaxN, internal groups a multiple of 64): no repacking. R rows x T tokens of
// INT32 accumulators along k over one segment (lanes = k mod 64 in quads); the weights are flipped
// to u8 in registers, and at the end of each segment the lanes are summed in INT32 (exact) before
// the -128 * sum(a) fix and the f32 scaling, exactly as in the packed kernel.
template <int R, int T>
void w8a8_gemv_tile(const W8A8Prep& a, const WeightView& w, int64_t r, const float* bias, float* y, const int8_t* pf) {
    const int64_t cols = w.cols, ngw = cols / w.group_size;
    const int8_t* wr[R];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) wr[i] = static_cast<const int8_t*>(w.data) + (r + i) * cols;
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    float out[R][T] = {};
    for (int64_t e = 0; e < a.ng; ++e) {
        float sw[R];
        SHARDLM_UNROLL for (int i = 0; i < R; ++i) sw[i] = w.scales[(r + i) * ngw + e * a.ge / w.group_size];
        for (int64_t s = 0; s < a.segs; ++s) {
            const int64_t k0 = e * a.ge + s * a.seg_len, k1 = std::min(k0 + a.seg_len, (e + 1) * a.ge);
            __m512i acc[R][T];
            SHARDLM_UNROLL for (int i = 0; i < R; ++i)
                SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_si512();
            for (int64_t k = k0; k < k1; k += 64) {
                __m512i xa[T];
                SHARDLM_UNROLL for (int t = 0; t < T; ++t) xa[t] = _mm512_loadu_si512(a.q + t * a.kp + k);
                if (pf)  // as in gemv_step: a later tile of R rows into L2, R * 64 bytes per step
                    SHARDLM_UNROLL for (int i = 0; i < R; ++i) _mm_prefetch(reinterpret_cast<const char*>(pf + k * R + 64 * i), _MM_HINT_T1);
                SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
                    const __m512i wv = _mm512_xor_si512(_mm512_loadu_si512(wr[i] + k), flip);
                    SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = dpbusd(acc[i][t], wv, xa[t]);
                }
            }
            SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
                const float sa = a.scales[t * a.ng + e];
                const int32_t fix = -128 * a.seg_sums[(t * a.ng + e) * a.segs + s];
                SHARDLM_UNROLL for (int i = 0; i < R; ++i)
                    out[i][t] += float(_mm512_reduce_add_epi32(acc[i][t]) + fix) * (sw[i] * sa);
            }
        }
    }
    SHARDLM_UNROLL for (int i = 0; i < R; ++i)
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) y[t * w.rows + r + i] = out[i][t] + (bias ? bias[r + i] : 0.0f);
}

template <int T>
void w8a8_gemv_rows(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int R = T == 1 ? 8 : 4;
    constexpr int64_t kAhead = 2;
    const int8_t* base = static_cast<const int8_t*>(w.data);
    int64_t r = r0;
    for (; r + R <= r1; r += R)
        w8a8_gemv_tile<R, T>(a, w, r, bias, y, r + (kAhead + 1) * R <= r1 ? base + (r + kAhead * R) * w.cols : nullptr);
    for (; r < r1; ++r) w8a8_gemv_tile<1, T>(a, w, r, bias, y, nullptr);
}

// W4A8 GEMV (n <= kGemvMaxN): one 64-byte load holds 128 columns of a row (four 32-column
// blocks); an and and a shift split it into the low-half and high-half codes, each one vpdpbusd
// against the activations laid out in that order (W8A8Prep::xi4), so lane j of the INT32 sum
// belongs to block j / 4. Groups a multiple of 128 sum in INT32 over the whole group and scale
// once; smaller groups scale each chunk's lanes by their block's group (a permuted vector).
template <int R, int T>
void w4a8_gemv_tile(const W8A8Prep& a, const WeightView& w, int64_t r, const float* bias, float* y, const uint8_t* pf) {
    const int64_t cols = w.cols, rb = cols / 2, gw = w.group_size, ngw = cols / gw, ge = a.ge;
    const uint8_t* wr[R];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) wr[i] = static_cast<const uint8_t*>(w.data) + (r + i) * rb;
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m512 acc[R][T];
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) SHARDLM_UNROLL for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_ps();
    if (ge % 128 == 0) {
        for (int64_t e = 0; e < a.ng; ++e) {
            __m512i ia[R][T];
            SHARDLM_UNROLL for (int i = 0; i < R; ++i)
                SHARDLM_UNROLL for (int t = 0; t < T; ++t) ia[i][t] = _mm512_setzero_si512();
            for (int64_t k = e * ge; k < (e + 1) * ge; k += 128) {
                if (pf)  // the tile kAhead tiles on, at the same pace (R * 64 bytes per 128 columns)
                    SHARDLM_UNROLL for (int i = 0; i < R; ++i) _mm_prefetch(reinterpret_cast<const char*>(pf + i * rb + k / 2), _MM_HINT_T1);
                __m512i xl[T], xh[T];
                SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
                    xl[t] = _mm512_loadu_si512(a.xi4 + t * cols + k);
                    xh[t] = _mm512_loadu_si512(a.xi4 + t * cols + k + 64);
                }
                SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
                    const __m512i wv = _mm512_loadu_si512(wr[i] + k / 2);
                    const __m512i lo = _mm512_and_si512(wv, nib), hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nib);
                    SHARDLM_UNROLL for (int t = 0; t < T; ++t) ia[i][t] = dpbusd(dpbusd(ia[i][t], lo, xl[t]), hi, xh[t]);
                }
            }
            SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
                const float sw = w.scales[(r + i) * ngw + e * ge / gw];
                SHARDLM_UNROLL for (int t = 0; t < T; ++t)
                    acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[i][t]), _mm512_set1_ps(sw * a.scales[t * a.ng + e]), acc[i][t]);
            }
        }
    } else {
        const __m512i lane_block = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        for (int64_t k = 0; k < cols; k += 128) {
            const int64_t nb = std::min<int64_t>(4, (cols - k) / 32);
            const __mmask64 m = mask64(16 * nb);
            __m512i xl[T], xh[T];
            SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
                xl[t] = _mm512_maskz_loadu_epi8(m, a.xi4 + t * cols + k);
                xh[t] = _mm512_maskz_loadu_epi8(m, a.xi4 + t * cols + k + 16 * nb);
            }
            SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
                const __m512i wv = _mm512_maskz_loadu_epi8(m, wr[i] + k / 2);
                const __m512i lo = _mm512_and_si512(wv, nib), hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nib);
                SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
                    alignas(16) float s4[4] = {};
                    for (int64_t b = 0; b < nb; ++b) {
                        const int64_t e = (k + 32 * b) / ge;
                        s4[b] = w.scales[(r + i) * ngw + e * ge / gw] * a.scales[t * a.ng + e];
                    }
                    const __m512 sv = _mm512_permutexvar_ps(lane_block, _mm512_castps128_ps512(_mm_load_ps(s4)));
                    const __m512i d = dpbusd(dpbusd(_mm512_setzero_si512(), lo, xl[t]), hi, xh[t]);
                    acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sv, acc[i][t]);
                }
            }
        }
    }
    // + sum over groups of min * (sum of the dequantized activations), then one reduction.
    SHARDLM_UNROLL for (int i = 0; i < R; ++i) {
        const float* mn = w.mins + (r + i) * ngw;
        SHARDLM_UNROLL for (int t = 0; t < T; ++t) {
            const float* xs = a.xs + t * a.ng;
            if (ge == gw) {
                for (int64_t e = 0; e < a.ng; e += 16) {
                    const __mmask16 me = mask16(a.ng - e);
                    acc[i][t] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(me, mn + e), _mm512_maskz_loadu_ps(me, xs + e), acc[i][t]);
                }
                y[t * w.rows + r + i] = _mm512_reduce_add_ps(acc[i][t]) + (bias ? bias[r + i] : 0.0f);
            } else {
                float s = 0.0f;
                for (int64_t e = 0; e < a.ng; ++e) s += mn[e * ge / gw] * xs[e];
                y[t * w.rows + r + i] = _mm512_reduce_add_ps(acc[i][t]) + s + (bias ? bias[r + i] : 0.0f);
            }
        }
    }
}

template <int T>
void w4a8_gemv_rows(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int R = T == 1 ? 8 : T == 2 ? 4 : 2;  // 2 * R * T accumulators + 2 * T activations <= 32
    constexpr int64_t kAhead = 2;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const int64_t rb = w.cols / 2;
    int64_t r = r0;
    for (; r + R <= r1; r += R)
        w4a8_gemv_tile<R, T>(a, w, r, bias, y, r + (kAhead + 1) * R <= r1 ? base + (r + kAhead * R) * rb : nullptr);
    for (; r < r1; ++r) w4a8_gemv_tile<1, T>(a, w, r, bias, y, nullptr);
}

// The activations of tokens [t0, t0 + nt) as a W8A8Prep of their own (views into a's).
W8A8Prep token_slice(const W8A8Prep& a, int64_t t0, int64_t nt) {
    W8A8Prep s = a;
    s.n = nt;
    s.q = a.q + t0 * a.kp;
    s.scales = a.scales + t0 * a.ng;
    s.seg_sums = a.seg_sums + t0 * a.ng * a.segs;
    if (a.xs) s.xs = a.xs + t0 * a.ng;
    if (a.xi4) s.xi4 = a.xi4 + t0 * a.cols;
    s.qt = nullptr;
    return s;
}

// 5-8 tokens (kInt8ActsGemvMaxN): per tile of R rows, tokens 0..3 and then tokens 4.. (T2 of them)
// with the tile's rows still in L1, so the weights stream from memory once. Each token's sums are
// those of a GEMV of at most 4 tokens, bit for bit.
template <int R, int T2, bool I4>
void int8_acts_gemv_rows8(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int64_t kAhead = 2;
    const W8A8Prep lo = token_slice(a, 0, 4), hi = token_slice(a, 4, T2);
    float* y_hi = y + 4 * w.rows;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const int64_t row_bytes = I4 ? w.cols / 2 : w.cols;
    int64_t r = r0;
    for (; r + R <= r1; r += R) {
        const uint8_t* pf = r + (kAhead + 1) * R <= r1 ? base + (r + kAhead * R) * row_bytes : nullptr;
        if constexpr (I4) {
            w4a8_gemv_tile<R, 4>(lo, w, r, bias, y, pf);
            w4a8_gemv_tile<R, T2>(hi, w, r, bias, y_hi, nullptr);
        } else {
            w8a8_gemv_tile<R, 4>(lo, w, r, bias, y, reinterpret_cast<const int8_t*>(pf));
            w8a8_gemv_tile<R, T2>(hi, w, r, bias, y_hi, nullptr);
        }
    }
    for (; r < r1; ++r) {
        if constexpr (I4) {
            w4a8_gemv_tile<1, 4>(lo, w, r, bias, y, nullptr);
            w4a8_gemv_tile<1, T2>(hi, w, r, bias, y_hi, nullptr);
        } else {
            w8a8_gemv_tile<1, 4>(lo, w, r, bias, y, nullptr);
            w8a8_gemv_tile<1, T2>(hi, w, r, bias, y_hi, nullptr);
        }
    }
}

// n <= kInt8ActsGemvMaxN tokens on the GEMV of I4 or I8 weights.
template <bool I4>
void int8_acts_gemv(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    constexpr int R = I4 ? 2 : 4;  // the rows per tile of the 3-4 token GEMVs
    switch (a.n) {
        case 1: return I4 ? w4a8_gemv_rows<1>(a, w, bias, y, r0, r1) : w8a8_gemv_rows<1>(a, w, bias, y, r0, r1);
        case 2: return I4 ? w4a8_gemv_rows<2>(a, w, bias, y, r0, r1) : w8a8_gemv_rows<2>(a, w, bias, y, r0, r1);
        case 3: return I4 ? w4a8_gemv_rows<3>(a, w, bias, y, r0, r1) : w8a8_gemv_rows<3>(a, w, bias, y, r0, r1);
        case 4: return I4 ? w4a8_gemv_rows<4>(a, w, bias, y, r0, r1) : w8a8_gemv_rows<4>(a, w, bias, y, r0, r1);
        case 5: return int8_acts_gemv_rows8<R, 1, I4>(a, w, bias, y, r0, r1);
        case 6: return int8_acts_gemv_rows8<R, 2, I4>(a, w, bias, y, r0, r1);
        case 7: return int8_acts_gemv_rows8<R, 3, I4>(a, w, bias, y, r0, r1);
        default: return int8_acts_gemv_rows8<R, 4, I4>(a, w, bias, y, r0, r1);
    }
}

}  // namespace

void quantize_acts_avx512(const float* x, int64_t t0, int64_t t1, int64_t cols, int64_t g, int8_t* q, float* scales) {
    const int64_t ng = cols / g;
    for (int64_t t = t0; t < t1; ++t)
        for (int64_t e = 0; e < ng; ++e) {
            const float* p = x + t * cols + e * g;
            int8_t* d = q + t * cols + e * g;
            __m512 m = _mm512_setzero_ps();
            for (int64_t k = 0; k < g; k += 16)  // max(|x|, m): a NaN lane keeps m, as std::max does
                m = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(mask16(g - k), p + k)), m);
            const float amax = _mm512_reduce_max_ps(m);
            scales[t * ng + e] = amax / 127.0f;
            const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
            for (int64_t k = 0; k < g; k += 16) {
                const __mmask16 mk = mask16(g - k);
                __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, p + k), inv);
                v = _mm512_max_ps(_mm512_min_ps(v, hi), lo);  // min(NaN, 127) = 127, as the scalar clamp
                _mm512_mask_cvtepi32_storeu_epi8(d + k, mk, _mm512_cvtps_epi32(v));  // round to nearest even
            }
        }
}

void acts_to_i16_avx512(const float* x, int64_t n, int64_t cols, int16_t* q, float* scales, int64_t group,
                        float* xsum) {
    const int64_t kp = i16_acts_stride(cols);
    for (int64_t t = 0; t < n; ++t) {
        const float* p = x + t * cols;
        int16_t* d = q + t * kp;
        __m512 m = _mm512_setzero_ps(), gs = _mm512_setzero_ps();
        __mmask16 bad = 0;  // lanes that held a NaN: max_ps would skip them
        for (int64_t k = 0; k < cols; k += 16) {
            const __m512 v = _mm512_maskz_loadu_ps(mask16(cols - k), p + k);
            bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            m = _mm512_max_ps(_mm512_abs_ps(v), m);
            if (xsum) {  // group a multiple of 32
                gs = _mm512_add_ps(gs, v);
                if ((k + 16) % group == 0) {
                    xsum[t * (cols / group) + k / group] = _mm512_reduce_add_ps(gs);
                    gs = _mm512_setzero_ps();
                }
            }
        }
        const float amax = _mm512_reduce_max_ps(m);
        const bool finite = bad == 0 && std::isfinite(amax);
        scales[t] = finite ? amax / 32767.0f : __builtin_nanf("");
        const __m512 inv = _mm512_set1_ps(finite && amax > 0.0f ? 32767.0f / amax : 0.0f);
        for (int64_t k = 0; k < kp; k += 16) {  // zeros past cols
            const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask16(std::max<int64_t>(0, cols - k)), p + k), inv);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + k), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(v)));
        }
    }
}

void i16_rows_avx512(const I16Acts& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    const bool gemm = i16_gemm_usable(a.n, w);
    if (w.dtype == DType::I4) gemm ? i16_gemm_rows<true>(a, w, bias, y, r0, r1) : i16_rows<true>(a, w, bias, y, r0, r1);
    else gemm ? i16_gemm_rows<false>(a, w, bias, y, r0, r1) : i16_rows<false>(a, w, bias, y, r0, r1);
}

void i16_gemv_rows_avx512(const I16Acts& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    if (w.dtype == DType::I4) i16_rows<true>(a, w, bias, y, r0, r1);
    else i16_rows<false>(a, w, bias, y, r0, r1);
}

void matmul_rows_avx512(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, int64_t r0,
                        int64_t r1) {
    switch (w.dtype) {
        case DType::F16: matmul_rows_dt<DType::F16>(x, n, w, bias, y, r0, r1); break;
        case DType::BF16: matmul_rows_dt<DType::BF16>(x, n, w, bias, y, r0, r1); break;
        case DType::I8: matmul_rows_dt<DType::I8>(x, n, w, bias, y, r0, r1); break;
        case DType::I4: matmul_rows_dt<DType::I4>(x, n, w, bias, y, r0, r1); break;
        default: matmul_rows_dt<DType::F32>(x, n, w, bias, y, r0, r1); break;
    }
}

void w8a8_rows_avx512(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    if (a.n <= kInt8ActsGemvMaxN && a.ge % 64 == 0) return int8_acts_gemv<false>(a, w, bias, y, r0, r1);
    w8a8_gemm_rows<false>(a, w, bias, y, r0, r1);
}

void w4a8_rows_avx512(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    if (a.n <= kInt8ActsGemvMaxN && a.xi4) return int8_acts_gemv<true>(a, w, bias, y, r0, r1);
    w8a8_gemm_rows<true>(a, w, bias, y, r0, r1);
}

}  // namespace shardlm
