// A weight matrix in device memory as the CUDA kernels read it: row-major [rows, cols], the same
// contract as kernels/cpu/weights_view.h. I8: W[r, c] = data[r, c] * scales[r, c / group_size],
// scales f32 [rows, cols / group_size]; group_size == cols is one scale per output channel.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace shardlm {

struct DeviceMatrix {
    DType dtype = DType::F16;  // F32, F16, BF16 or I8
    const void* data = nullptr;
    const float* scales = nullptr;  // I8 only
    int64_t rows = 0, cols = 0;
    int64_t group_size = 0;  // I8 only; divides cols
    // Columns stored in the decode GEMV's interleaved order (kernels/cuda/interleave.h); every
    // kernel that reads weights honours it.
    bool interleaved = false;
};

}  // namespace shardlm
