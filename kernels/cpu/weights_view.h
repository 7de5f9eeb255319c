// A read-only matrix of weights as the kernels see it: row-major [rows, cols], rows contiguous,
// elements of one dtype. Usually points into a memory-mapped checkpoint or a quantized copy.
//
// INT8 (dtype I8): data is int8 [rows, cols]; `scales` is f32 [rows, cols / group_size] and
// W[r, c] = data[r, c] * scales[r, c / group_size] (symmetric, no zero point; see quantize.h).
// group_size == cols means one scale per output channel. Nothing else is precomputed: the
// vectorised kernels repack small panels on the fly (see matmul_avx512.cpp).
//
// INT4 (dtype I4, AWQ-style asymmetric 4-bit): a row is cols / 2 bytes in blocks of 32 columns;
// byte i of a block holds column i in its low nibble and column i + 16 in its high nibble (one
// 16-byte load unpacks into two runs of 16 consecutive columns with an and and a shift). `scales`
// and `mins` are f32 [rows, cols / group_size] and W[r, c] = q[r, c] * scale + min, q in 0..15;
// min = -zero * scale with an integer zero point (see quantize.h). group_size is a multiple of 32.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace shardlm {

struct WeightView {
    DType dtype = DType::F32;
    const void* data = nullptr;
    int64_t rows = 0;  // output features
    int64_t cols = 0;  // input features
    // INT8 and INT4.
    const float* scales = nullptr;  // [rows, cols / group_size]
    int64_t group_size = 0;         // divides cols; == cols for per-output-channel
    const float* mins = nullptr;    // INT4 only: [rows, cols / group_size]

    int64_t n_groups() const { return group_size > 0 ? cols / group_size : 1; }
    bool quantized() const { return dtype == DType::I8 || dtype == DType::I4; }
};

// Bytes of one row (I4: cols / 2).
inline int64_t weight_row_bytes(const WeightView& w) {
    return w.dtype == DType::I4 ? w.cols / 2 : w.cols * int64_t(dtype_size(w.dtype));
}

// Column c of an I4 row: its byte offset in the row and whether it sits in the high nibble.
inline int64_t int4_byte(int64_t c) { return c / 32 * 16 + c % 16; }
inline int int4_shift(int64_t c) { return c % 32 >= 16 ? 4 : 0; }

// Row r of `w` as floats into `out[0..cols)` (INT8 rows are dequantized: q * scale).
void weight_row_to_f32(const WeightView& w, int64_t r, float* out);
// n values of an F32, F16 or BF16 array as floats, exactly (F16 through F16C where the CPU has it:
// the scalar conversion took ~1.7 ns a value, ~1.4 s of a 1.7B FP16 checkpoint's quantize-on-load).
void values_to_f32(DType dtype, const void* src, int64_t n, float* out);

// Throws (SHARDLM_CHECK) unless `w` is well-formed: data set, I8 with scales and a group size
// that divides cols, I4 with scales, mins and a group size that is a multiple of 32 dividing
// cols, F32/F16/BF16 otherwise.
void check_weight_view(const WeightView& w);

}  // namespace shardlm
