// A read-only matrix of weights as the kernels see it: row-major [rows, cols], rows contiguous,
// elements of one dtype (f32, f16 or bf16). Usually points into a memory-mapped checkpoint.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace shardlm {

struct WeightView {
    DType dtype = DType::F32;
    const void* data = nullptr;
    int64_t rows = 0;  // output features
    int64_t cols = 0;  // input features
};

// Row r of `w` as floats into `out[0..cols)`.
void weight_row_to_f32(const WeightView& w, int64_t r, float* out);

}  // namespace shardlm
