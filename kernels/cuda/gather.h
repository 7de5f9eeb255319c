// Gathering a layer's input columns into the order of its weight columns on the GPU: act-order
// checkpoints (model/hf_quant.h act_order) store their columns sorted by group. Same contract as
// gather_columns in kernels/cpu/gather.h. Pointers are device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm {

// out[t, j] = element order[j] of row t of the input ([T, width]); the input is `parts` blocks of
// [T, part_cols] one after the other (an all-gather's result), element c of row t in block
// c / part_cols at column c % part_cols. Every order[j] lies in [0, parts * part_cols).
void gather_columns_cuda(const float* x, int64_t T, int64_t part_cols, int64_t parts, const int32_t* order,
                         int64_t width, float* out, cudaStream_t stream);

}  // namespace shardlm
