// A weight matrix in device memory as the CUDA kernels read it: row-major [rows, cols], the same
// contract as kernels/cpu/weights_view.h. I8: W[r, c] = data[r, c] * scales[r, c / group_size],
// scales f32 [rows, cols / group_size]; group_size == cols is one scale per output channel.
// I4 (AWQ-style asymmetric): rows of cols / 2 bytes in 32-column blocks of 16 bytes, byte i of a
// block holding column i in its low nibble and column i + 16 in its high one;
// W[r, c] = q * scales[r, g] + mins[r, g] with g = c / group_size (a multiple of 32).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace shardlm {

struct DeviceMatrix {
    DType dtype = DType::F16;  // F32, F16, BF16, I8 or I4
    const void* data = nullptr;
    const float* scales = nullptr;  // I8 and I4
    const float* mins = nullptr;    // I4 only
    int64_t rows = 0, cols = 0;
    int64_t group_size = 0;  // I8 and I4; divides cols
    // Columns stored in the decode GEMV's interleaved order (kernels/cuda/interleave.h); every
    // kernel that reads weights honours it. (Never set for I4.)
    bool interleaved = false;
};

// Bytes of one row: cols / 2 for I4 (which has no per-element size), else cols * element size.
inline int64_t device_row_bytes(const DeviceMatrix& w) {
    return w.dtype == DType::I4 ? w.cols / 2 : w.cols * int64_t(dtype_size(w.dtype));
}

}  // namespace shardlm
