// Symmetric INT8 quantization of weights, activations and KV-cache rows.
//
// One group of values x[0..g) gets scale = max|x| / 127 and q[i] = clamp(rne(x[i] * inv), -127, 127)
// with inv = 127 / max|x| (0 when the group is all zeros: scale 0, q 0, never NaN). rne is
// round-to-nearest-even, so |x[i] - q[i] * scale| <= scale / 2 (+ float rounding). -128 is never
// produced, which the VNNI kernels rely on (|q| <= 127 keeps INT32 sums of 127*127 products exact).
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/weights_view.h"

namespace shardlm {

// Quantizes x[0..d) into q, returns its scale. Used for one (token, head) row of the INT8 KV cache.
float quantize_row_int8(const float* x, int64_t d, int8_t* q);

// Weights [rows, cols] of src (f32/f16/bf16) -> q int8 [rows, cols], scales f32 [rows, cols / group_size].
// group_size must divide cols (group_size == cols: per output channel).
void quantize_weights_int8_ref(const WeightView& src, int64_t group_size, int8_t* q, float* scales);
// The same results, threaded over rows and vectorised (whole matrices: the tests' fixtures; the
// loader quantizes its blocks row by row with quantize_rows_int8).
void quantize_weights_int8(const WeightView& src, int64_t group_size, int8_t* q, float* scales);

// The I8 view of what quantize_weights_int8 wrote.
inline WeightView int8_weight_view(const int8_t* q, const float* scales, int64_t rows, int64_t cols,
                                   int64_t group_size) {
    WeightView w;
    w.dtype = DType::I8;
    w.data = q;
    w.rows = rows;
    w.cols = cols;
    w.scales = scales;
    w.group_size = group_size;
    return w;
}

// Asymmetric INT4 of one group of values x[0..g) (AWQ's rounding): the range [min, max] is widened
// to hold 0, scale = (max - min) / 15, zero = rne(-min / scale) in 0..15 and
// q[i] = clamp(rne(x[i] / scale) + zero, 0, 15), one code per byte; x ~= (q - zero) * scale. An all-zero
// group gets scale 0, zero 0 and q 0. A NaN value quantizes to 15.
struct Int4Group {
    float scale = 0.0f;
    int zero = 0;
    float min() const { return -float(zero) * scale; }  // x ~= q * scale + min
};
Int4Group quantize_group_int4(const float* x, int64_t g, uint8_t* q);
// Its scale and zero for a group whose range, widened to hold 0, is [lo, hi] (scale 0 for an empty
// or non-finite range: the group's codes are then all 0); shared with the vectorised variants.
Int4Group int4_group_params(float lo, float hi);

// Weights [rows, cols] of src (f32/f16/bf16) -> packed q [rows, cols / 2] (layout in weights_view.h),
// scales and mins f32 [rows, cols / group_size]. group_size must be a multiple of 32 dividing cols.
void quantize_weights_int4_ref(const WeightView& src, int64_t group_size, uint8_t* q, float* scales, float* mins);
// The same results, threaded over rows and vectorised (whole matrices: AWQ's search; the loader
// quantizes its blocks row by row with quantize_rows_int4).
void quantize_weights_int4(const WeightView& src, int64_t group_size, uint8_t* q, float* scales, float* mins);

// Rows [0, n) of x [n][cols] (f32) into packed q [n][cols / 2], scales and mins [n][cols / group_size]:
// quantize_group_int4 and pack_int4_row bit for bit, by the best variant this CPU runs (`isa` pins
// one for tests), on the calling thread (the loader threads over rows itself).
void quantize_rows_int4(const float* x, int64_t n, int64_t cols, int64_t group_size, uint8_t* q, float* scales,
                        float* mins, CpuIsa isa = CpuIsa::Auto);

// Packs one row of codes (0..15, one per byte; cols a multiple of 32) into the I4 layout.
void pack_int4_row(const uint8_t* codes, int64_t cols, uint8_t* packed);

// The I4 view of what quantize_weights_int4 wrote.
inline WeightView int4_weight_view(const uint8_t* q, const float* scales, const float* mins, int64_t rows,
                                   int64_t cols, int64_t group_size) {
    WeightView w;
    w.dtype = DType::I4;
    w.data = q;
    w.rows = rows;
    w.cols = cols;
    w.scales = scales;
    w.mins = mins;
    w.group_size = group_size;
    return w;
}

// Dynamically quantized activations for W8A8: q int8 [n, cols], scales f32 [n, cols / group_size],
// x[t, c] ~= q[t, c] * scales[t, c / group_size]. group_size == cols: one scale per token.
struct QuantizedActs {
    const int8_t* q = nullptr;
    const float* scales = nullptr;
    int64_t n = 0, cols = 0, group_size = 0;
};

// x f32 [n, cols] -> q, scales as above (one symmetric scale per token per group).
void quantize_acts_int8_ref(const float* x, int64_t n, int64_t cols, int64_t group_size, int8_t* q, float* scales);
// The same results (bit for bit), threaded over tokens and vectorised (what the engine calls before
// matmul_w8a8); `isa` pins a variant for tests.
void quantize_acts_int8(const float* x, int64_t n, int64_t cols, int64_t group_size, int8_t* q, float* scales,
                        CpuIsa isa = CpuIsa::Auto);
// The same on the calling thread (the loader quantizes weight rows with it, threading over rows).
void quantize_rows_int8(const float* x, int64_t n, int64_t cols, int64_t group_size, int8_t* q, float* scales,
                        CpuIsa isa = CpuIsa::Auto);

}  // namespace shardlm
