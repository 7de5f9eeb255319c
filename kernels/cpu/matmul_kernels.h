// Internal to kernels/cpu: what each vectorised variant provides to matmul.cpp, which owns the
// threading (OpenMP over output rows) and the run-time choice of variant.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/weights_view.h"

// Fully unrolls the short loops over a register tile before GCC's scalar replacement runs; without
// it GCC -O3 keeps a stack copy of each accumulator array in sync inside the hot loop.
#define SHARDLM_UNROLL _Pragma("GCC unroll 16")

namespace shardlm {

// Decode-sized batches (n <= kGemvMaxN) take the GEMV path: weights streamed once, row-major, with
// vectors across k, all tokens' sums in registers. Larger n packs weight panels and runs a
// register-blocked GEMM, except on the AVX-512 and AVX2 GEMVs (up to 2 * kGemvMaxN tokens in two
// passes per tile of rows; INT4 weights on AVX2 keep kGemvMaxN) and the AMX tile GEMV (up to 16,
// amx_gemv_usable).
constexpr int64_t kGemvMaxN = 4;

// Activations of matmul_w8a8 and matmul_w4a8 prepared once per call, shared by all threads.
// The dot products run over "internal groups" of ge = min(act group, weight group) values, so each
// has one activation scale and one weight scale. Group e's values sit at q[t * kp + e * ge4 ...],
// zero-padded to ge4 = round_up(ge, 4) (one VNNI quad never straddles two groups). Each group is
// cut into segments of at most seg_len values (a multiple of 4) after which INT32 sums are flushed
// to f32, which keeps them exact for any group length.
struct W8A8Prep {
    const int8_t* q = nullptr;         // [n][kp]
    const float* scales = nullptr;     // [n][ng]: activation scale of internal group e
    const int32_t* seg_sums = nullptr; // [n][ng * segs]: sum of q over each segment (VNNI offset fix)
    int64_t n = 0, cols = 0, kp = 0;
    int64_t ge = 0, ge4 = 0, ng = 0, segs = 0, seg_len = 0;
    int64_t gw = 0;  // weight group size: weight scale of internal group e is scales[r, e * ge / gw]
    // W4A8 (I4 weights) only. The codes are unsigned, so no offset fix; the mins add
    // min[r, e * ge / gw] * xs[t][e] per internal group, xs = act scale * sum of q over the group.
    bool i4 = false;
    const float* xs = nullptr;   // [n][ng]
    // The GEMV's activations in the order one 64-byte load of I4 weights unpacks to (n <= kInt8ActsGemvMaxN):
    // per chunk of 128 columns (the last may hold fewer 32-column blocks, nb), the low halves
    // (columns 0..15) of its nb blocks, then their high halves (16..31). [n][cols]
    const int8_t* xi4 = nullptr;
    // The AMX GEMM's activations (amx_tiles_usable): q in tile order, [n / 32 rounded up][kp / 64][32][64],
    // so that the two A tiles of one 32-token block and 64 columns are one contiguous 2 KB (rows past
    // n zero).
    const int8_t* qt = nullptr;
    // The AVX2 GEMM's activations (avx2_w8a8_gemm_usable): q widened to int16, [n][kp].
    const int16_t* q16 = nullptr;
};

// The AVX-512 W8A8/W4A8 GEMVs also take 5-8 tokens, in two passes per tile of rows (4 tokens, then
// the rest, the rows still in L1), so the weights are read from memory once: the packed GEMM there
// took 1.6-1.75x the time of 4 tokens. The AVX2 W8A8 GEMV takes them in one pass (a row per tile),
// its W4A8 GEMV keeps kGemvMaxN.
constexpr int64_t kInt8ActsGemvMaxN = 2 * kGemvMaxN;

// Whether the AVX2 variant runs this W8A8 product on its INT16 GEMM (matmul_avx2.cpp), the int8
// activations widened once per call, exactly: the sign trick of its packed W8A8 GEMM
// (maddubs(|w|, sign(a, w)), then madd) spends three multiply-port instructions per 8 rows x 4
// columns where vpmaddwd on int16 pairs spends two. kernels_bench --what prefill, 256 tokens,
// SHARDLM_CPU_ISA=avx2, the 2-core EPYC: w8a8 3.17 s against 2.44 for int8 (W8A16) on that GEMM.
// W4A8 keeps the packed GEMM: its codes are unsigned, no sign trick (2.49 s).
inline bool avx2_w8a8_gemm_usable(const W8A8Prep& a) { return !a.i4 && a.n > kInt8ActsGemvMaxN && a.ge % 32 == 0; }

// Whether the AMX variant runs this product on tiles (else on the AVX-512 kernels): prefill sizes,
// internal groups a whole number of 64-column tile rows.
inline bool amx_tiles_usable(const W8A8Prep& a) { return a.n > kInt8ActsGemvMaxN && a.ge4 % 64 == 0; }

// Rows [r0, r1) of y [n, w.rows] (all n tokens). Called by each thread on its own row range.
void matmul_rows_avx2(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
void matmul_rows_avx512(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
void w8a8_rows_avx2(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
void w8a8_rows_avx512(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
void w4a8_rows_avx2(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
void w4a8_rows_avx512(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);

// The W8A8/W4A8 GEMM's weight panel (matmul_avx512.cpp), for the AMX kernel: rows [rb, rb + nr) of w,
// nr <= 32, as VNNI quads of 16 rows, quad q of internal group e at panel + (e * ge4 / 4 + q) * 128:
// 64 bytes for rows 0..15 (4 bytes each), then 64 for rows 16..31; I8 weights stored as u8 = w + 128,
// I4 codes as they are; rows past nr zero. wsc[e][32] (and for I4 wmn[e][32]) the rows' weight
// scales (mins) of internal group e. panel holds kp * 32 bytes, 64-byte aligned.
void pack_w8a8_panel_avx512(const W8A8Prep& a, const WeightView& w, int64_t rb, int64_t nr, uint8_t* panel,
                            float* wsc, float* wmn);
// matmul_w8a8 and matmul_w4a8 (by a.i4) with AMX-INT8 tiles for the GEMM when a.ge4 is a multiple of
// 64; the GEMV and other group sizes run the AVX-512 kernels. The same bits as the AVX-512 variant.
void int8_acts_rows_amx(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);

// AMX-BF16 GEMM of matmul (prefill) for I8 weights (W8A16; groups a multiple of 32), I4 weights
// (W4A16) and BF16 weights: the weights exact in bf16 (int8 values and 4-bit codes as they are, the
// scales applied per group after, I4's mins times the group's sum of activations), each
// activation carried as two bf16 parts, hi + lo, within 2^-16 of it (kAmxBf16RelErr), products and
// sums in f32 on the tiles.
// Not I8 at 5-8 tokens: amx_gemv_usable takes 6-16 and the AVX-512 GEMV's two passes the rest.
inline bool amx_bf16_usable(int64_t n, const WeightView& w) {
    return n > kGemvMaxN && w.cols % 32 == 0 &&
           ((w.dtype == DType::I8 && w.group_size % 32 == 0 && n > 2 * kGemvMaxN) || w.dtype == DType::I4 ||
            w.dtype == DType::BF16);
}
constexpr int kAmxBf16Parts = 2;  // bf16 parts per activation: x ~ hi + lo
// |x - (hi + lo)| <= kAmxBf16RelErr * |x|: hi = bf16(x) is within 2^-8 |x| (round to nearest, 8
// significant bits), lo = bf16(x - hi) within 2^-8 of that exact difference.
constexpr double kAmxBf16RelErr = 1.0 / 65536;
// Tokens [t0, t1) of x [n][cols] as two bf16 parts in tile order,
// xt [n / 32 rounded up][cols / 32][2 parts][32][32] (a 32-token x 32-column block of one part = two
// A tiles, 2 KB); the caller zeroes the rows past n. With xsum (I4 weights, group a multiple of 16)
// also each token's f32 sum of x over each group, xsum[t][cols / group].
void acts_to_bf16_tiles_amx(const float* x, int64_t cols, int64_t t0, int64_t t1, uint16_t* xt, int64_t group = 0,
                            float* xsum = nullptr);
// Rows [r0, r1) of y [n, w.rows] from the activations in tile order; for I4 weights xsum [n][groups]
// holds each token's sum of x over each weight group (nullptr otherwise).
void matmul_rows_amx(const uint16_t* xt, const float* xsum, int64_t n, const WeightView& w, const float* bias,
                     float* y, int64_t r0, int64_t r1);

// AMX-BF16 GEMV of matmul for I4 weights at 3-16 tokens and I8 weights at 6-16 (groups a multiple
// of 64): the weights are the A operand as they lie, a 64-column chunk of 32 rows widened to exact
// bf16 values in registers (I4: two vpermw per row through a table of the 16 codes; I8: int8 ->
// f32 -> bf16), and the tokens' activations the B operand, two bf16 parts each as in the prefill
// GEMM (kAmxBf16RelErr). Nothing is packed, so the weights are read once at any of these token
// counts.
//  - I4 at 3-4 tokens: the AVX-512 GEMV spends one FMA per 16 weights and token and is bound by
//    them beyond two tokens (kernels_bench decode, the 1.7B shape: n = 4 129.5 ms on AVX-512, 94.6
//    on tiles); at 1-2 tokens it is faster (n = 1 69-77 ms against 86-87) and stays.
//  - I8 at 1-5 tokens keeps the AVX-512 GEMVs (n = 4 84-90 ms on the f32 GEMV, at most 1.3x of
//    n = 1; I8 needs no unpacking there to speak of; 3-5 now on the INT16 GEMV below, not yet set
//    against these tiles on an AMX machine).
//  - Both up to 16 tokens: the packed prefill GEMM converted and transposed every weight into a
//    panel for one 32-token block, about 2.2x the time of 4 tokens on the GEMV (one 6144 x 2048
//    INT8 matrix: 0.92 ms at n = 5-16 against 0.43 at n = 4). I8 rows cost this GEMV ~5 conversion
//    uops per 32 weights whatever n is (kernels_bench decode 131-142 ms at n = 2-8), so the AVX-512
//    GEMV, two passes of at most 4 tokens, stays ahead up to 5 tokens (n = 5 114-121 ms against
//    132-137; n = 6 even; n = 8 161-167 against 133-138).
inline bool amx_gemv_usable(int64_t n, const WeightView& w) {
    const bool shape = w.group_size % 64 == 0 && w.cols % 64 == 0;
    return shape && n <= 16 && ((w.dtype == DType::I4 && n >= 3) || (w.dtype == DType::I8 && n >= 6));
}
// Tokens padded to a divisor of 16 (3 -> 4, 5..8 -> 8, 9..16 -> 16): the B and C tiles' width.
inline int64_t amx_gemv_tokens(int64_t n) { return n <= 4 ? (n == 3 ? 4 : n) : n <= 8 ? 8 : 16; }
// x [n][cols] as the GEMV's B tiles, xb [cols / 32 steps][2 parts][16 pairs][np tokens][2] with np =
// amx_gemv_tokens(n) (zeros past n), in the column order of w's unpacked chunks; for I4 also
// xsum [groups][np], each token's sum of x over each weight group (for the mins).
void acts_to_gemv_tiles_amx(const float* x, int64_t n, const WeightView& w, uint16_t* xb, float* xsum);
void gemv_rows_amx(const uint16_t* xb, const float* xsum, int64_t n, const WeightView& w, const float* bias, float* y,
                   int64_t r0, int64_t r1);

// W8A16 of I8 (and W4A16 of I4) weights on 16-bit integer activations (AVX-512 VNNI; the avx512
// variant at 3 tokens and more, the amx variant where its tiles do not take the product; the avx2
// variant likewise with vpmaddwd, see below): each token's x is rounded once
// per call to int16 on a scale of its own, s = max|x| / 32767, and vpdpwssd sums 32 weight x
// activation products per instruction exactly in INT32. The f32 kernels spent a widening and one
// FMA per 16 weights and token, so beyond two tokens they were bound by the FMAs, not by memory
// (kernels_bench, the 1.7B shape, 2-core EPYC: GEMV at 4 tokens 46 -> 37 ms a step, 1 token 32-37;
// 8 tokens 97 -> 66; the f32 GEMM at 512 tokens 5.1-5.2 -> 2.9-3.3 s). One and two tokens of I8
// weights are memory-bound either way and keep the f32 GEMV and its exact activations.
// Rows are read in tiles of 4 by each token block of kI16TokenBlock (4 tokens per pass over the
// tile, the later passes from L1), so a block's activations stay in L2 (32 and 128 were slower).
// The rounding moves each activation by at most s / 2 = kI16ActsErr * max|x| (no more than rounding
// it to bf16 would for any |x_k| above max|x| / 128); a token with a NaN or an infinity gets NaN
// outputs. Weights I8 with one scale per row or groups a multiple of 32; INT32 sums are flushed to
// f32 per group and at least every kI16FlushCols columns (each lane then holds at most 256
// products of |w| <= 128 and |q| <= 32767, under 2^31; 512 in the AVX2 kernel, still under).
// The AVX2 kernel (vpmaddwd, then an add) replaces a widening, a conversion and an FMA per 8
// weights and token by two instructions per 16; the 2-core EPYC, SHARDLM_CPU_ISA=avx2: see
// matmul_avx2.cpp.
constexpr double kI16ActsErr = 1.0 / 65534;
constexpr int64_t kI16FlushCols = 4096;
constexpr int64_t kI16MinN = 3;
constexpr int64_t kI16TokenBlock = 64;
// I4 weights (codes widened to int16, mins from f32 group sums of x) up to kI16MaxNI4 tokens: each
// 4-token pass unpacks the codes again, where the f32 GEMM unpacks a panel once for all tokens
// (kernels_bench int4 on the EPYC: n = 4 127-130 -> 59-65 ms, n = 8 228-238 -> 131-134, n = 16
// 345-349 -> 240-275; n = 32 even; n = 64 and the 256-token prefill faster on the GEMM).
// Unlike I8, from one token: the f32 GEMV's unpacking (a shift, a mask, two widenings and a
// dequantizing FMA per 8 codes) kept it off the memory bandwidth even there (EPYC, 1 token:
// avx512 50-53 -> 38-39 ms, avx2 68-72 -> 50-55; 2 tokens 48-51 -> 43, 77-85 -> 57-59), and the
// activations' rounding is far below the 4-bit weights' own. Beyond kI16MaxNI4 the INT16 GEMM
// below takes them, which unpacks each panel once too: 16 at first (against the f32 GEMM), 8
// since the AVX2 INT16 GEMM (kernels_bench decode, int4, 2-core EPYC, two alternating runs:
// avx2 n = 8 152-162 ms on this kernel against 181-182 on the GEMM, n = 10-12 even, n = 16 298-436
// against 266-312; avx512 even at 10-16).
constexpr int64_t kI16MaxNI4 = 8;
inline bool i16_gemv_usable(int64_t n, const WeightView& w) {
    if (w.dtype == DType::I4) return n <= kI16MaxNI4;
    return w.dtype == DType::I8 && n >= kI16MinN && (w.group_size == w.cols || w.group_size % 32 == 0);
}
// Prefill-sized products run as a GEMM on packed int16 panels (matmul_avx512.cpp, and since
// 2026-12-03 matmul_avx2.cpp): INT8 weights from kI16GemmMinN tokens (even with the kernel above at
// 32-48 tokens), INT4 beyond kI16MaxNI4 (where the f32 GEMM took them). kernels_bench, 2-core EPYC:
// avx512 512 tokens INT8 3.88 / 3.48 -> 2.99 / 2.92 s, INT4 5.19 / 5.06 -> 3.55 / 3.53 s; INT4 at
// 32 tokens 482 / 459 -> 327 / 313 ms. avx2 256 tokens INT8 2.98 / 3.66 -> 2.67 / 2.78 s, INT4
// 4.22 / 4.83 -> 3.11 / 3.04 s; INT4 at 32 tokens 741 / 925 -> 429 / 548 ms; its INT8 GEMM at 16
// and 32 tokens lost to the kernel above (191-219 against 261-272 ms, 350-385 against 401-425),
// at 64 won (742-759 against 656-702).
constexpr int64_t kI16GemmMinN = 64;
inline bool i16_gemm_usable(int64_t n, const WeightView& w) {
    if (w.dtype == DType::I4) return n > kI16MaxNI4;
    return n >= kI16GemmMinN && i16_gemv_usable(n, w);
}
// Whether matmul on this (resolved) variant rounds x to int16 for these weights: its dispatch,
// and the bound the tests add. For amx a superset: its tiles take some of these products first.
inline bool i16_acts_rounded(CpuIsa isa, int64_t n, const WeightView& w) {
    if (isa == CpuIsa::Scalar) return false;
    return i16_gemv_usable(n, w) || i16_gemm_usable(n, w);
}
// Activations of the INT16 kernels, prepared once per call: q [n][kp] (kp = cols rounded up to 32,
// zeros past cols), scales [n]; for I4 weights xsum [n][cols / group], each token's f32 sum of x
// over each weight group (the mins' share, as in the f32 kernels).
struct I16Acts {
    const int16_t* q = nullptr;
    const float* scales = nullptr;
    const float* xsum = nullptr;
    int64_t n = 0, cols = 0, kp = 0;
};
inline int64_t i16_acts_stride(int64_t cols) { return (cols + 31) / 32 * 32; }
// Tokens x [n][cols] into q and scales (and with xsum, the sums over groups of `group`, a multiple of 32).
void acts_to_i16_avx512(const float* x, int64_t n, int64_t cols, int16_t* q, float* scales, int64_t group = 0,
                        float* xsum = nullptr);
void i16_rows_avx512(const I16Acts& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
// The GEMV of i16_rows_* for any number of tokens (never the GEMM): matmul's batch-invariant path.
void i16_gemv_rows_avx512(const I16Acts& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
void acts_to_i16_avx2(const float* x, int64_t n, int64_t cols, int16_t* q, float* scales, int64_t group = 0,
                      float* xsum = nullptr);
void i16_rows_avx2(const I16Acts& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
void i16_gemv_rows_avx2(const I16Acts& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);

// quantize_acts_int8 for tokens [t0, t1): the rounding of quantize.h, bit for bit.
void quantize_acts_avx2(const float* x, int64_t t0, int64_t t1, int64_t cols, int64_t g, int8_t* q, float* scales);
void quantize_acts_avx512(const float* x, int64_t t0, int64_t t1, int64_t cols, int64_t g, int8_t* q, float* scales);
// values_to_f32 of F16 values (F16C), the first n rounded down to 8; returns how many it wrote.
int64_t f16_to_f32_avx2(const uint8_t* p, int64_t n, float* out);

// One group of quantize_rows_int4 (quantize_avx2.cpp, quantize_avx512.cpp): quantize_group_int4 of
// x[0..g) (g a multiple of 32) packed straight into the I4 layout at `packed`, bit for bit.
Int4Group quantize_group_int4_avx2(const float* x, int64_t g, uint8_t* packed);
Int4Group quantize_group_int4_avx512(const float* x, int64_t g, uint8_t* packed);

}  // namespace shardlm
