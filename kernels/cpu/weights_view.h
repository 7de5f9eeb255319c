// A read-only matrix of weights as the kernels see it: row-major [rows, cols], rows contiguous,
// elements of one dtype. Usually points into a memory-mapped checkpoint or a quantized copy.
//
// INT8 (dtype I8): data is int8 [rows, cols]; `scales` is f32 [rows, cols / group_size] and
// W[r, c] = data[r, c] * scales[r, c / group_size] (symmetric, no zero point; see quantize.h).
// group_size == cols means one scale per output channel. Nothing else is precomputed: the
// vectorised kernels repack small panels on the fly (see matmul_avx512.cpp).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace shardlm {

struct WeightView {
    DType dtype = DType::F32;
    const void* data = nullptr;
    int64_t rows = 0;  // output features
    int64_t cols = 0;  // input features
    // INT8 only.
    const float* scales = nullptr;  // [rows, cols / group_size]
    int64_t group_size = 0;         // divides cols; == cols for per-output-channel

    int64_t n_groups() const { return group_size > 0 ? cols / group_size : 1; }
};

// Row r of `w` as floats into `out[0..cols)` (INT8 rows are dequantized: q * scale).
void weight_row_to_f32(const WeightView& w, int64_t r, float* out);

// Throws (SHARDLM_CHECK) unless `w` is well-formed: data set, I8 with scales and a group size
// that divides cols, F32/F16/BF16 otherwise.
void check_weight_view(const WeightView& w);

}  // namespace shardlm
