// The device KV cache of one layer as the CUDA kernels see it (runtime/ owns the memory).
// K and V are each [n_slots][n_kv_heads][capacity][row_stride] elements of `dtype`; a row holds
// head_dim values padded to a multiple of 128 bytes. Position p of the sequence in slot s lives
// in row p % capacity (ring buffer). INT8 rows are symmetric with one f32 scale per (slot, head,
// row): k_scales/v_scales are [n_slots][n_kv_heads][capacity] (quantize_row_int8's contract:
// scale = max|x| / 127, q = clamp(rne(x * 127 / max|x|), -127, 127), scale 0 for an all-zero row).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace shardlm {

struct DeviceKVLayer {
    void* k = nullptr;
    void* v = nullptr;
    float* k_scales = nullptr;  // I8 only
    float* v_scales = nullptr;  // I8 only
    DType dtype = DType::F16;   // F32, F16, BF16 or I8
    int64_t n_slots = 0, n_kv_heads = 0, capacity = 0, row_stride = 0;  // row_stride in elements
};

// One run of consecutive tokens of one sequence inside a step: query rows row0 .. row0+n-1 of the
// step's [T, ...] activations sit at positions pos0 .. pos0+n-1 of the sequence in `slot`, and
// each attends to positions [0, its own]. Lives in device memory (written before each step).
struct AttnChunk {
    int32_t slot, pos0, n, row0;
};

}  // namespace shardlm
