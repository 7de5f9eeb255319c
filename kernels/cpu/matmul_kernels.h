// Internal to kernels/cpu: what each vectorised variant provides to matmul.cpp, which owns the
// threading (OpenMP over output rows) and the run-time choice of variant.
#pragma once

#include <cstdint>

#include "kernels/cpu/quantize.h"
#include "kernels/cpu/weights_view.h"

// Fully unrolls the short loops over a register tile before GCC's scalar replacement runs; without
// it GCC -O3 keeps a stack copy of each accumulator array in sync inside the hot loop.
#define SHARDLM_UNROLL _Pragma("GCC unroll 16")

namespace shardlm {

// Decode-sized batches (n <= kGemvMaxN) take the GEMV path: weights streamed once, row-major, with
// vectors across k. Larger n packs weight panels and runs a register-blocked GEMM.
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
    // The GEMV's activations in the order one 64-byte load of I4 weights unpacks to (n <= kGemvMaxN):
    // per chunk of 128 columns (the last may hold fewer 32-column blocks, nb), the low halves
    // (columns 0..15) of its nb blocks, then their high halves (16..31). [n][cols]
    const int8_t* xi4 = nullptr;
};

// Rows [r0, r1) of y [n, w.rows] (all n tokens). Called by each thread on its own row range.
void matmul_rows_avx2(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
void matmul_rows_avx512(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
void w8a8_rows_avx2(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
void w8a8_rows_avx512(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
void w4a8_rows_avx2(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);
void w4a8_rows_avx512(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1);

// quantize_acts_int8 for tokens [t0, t1): the rounding of quantize.h, bit for bit.
void quantize_acts_avx2(const float* x, int64_t t0, int64_t t1, int64_t cols, int64_t g, int8_t* q, float* scales);
void quantize_acts_avx512(const float* x, int64_t t0, int64_t t1, int64_t cols, int64_t g, int8_t* q, float* scales);

}  // namespace shardlm
