// Gathering a layer's input columns into the order its weight columns are stored in: act-order
// checkpoints (GPTQ's desc_act, model/hf_quant.h act_order) sort their columns by group, and the
// product then reads x[order[0]], x[order[1]], ... The CPU engine's gather, and the reference of
// kernels/cuda/gather.h.
#pragma once

#include <cstdint>

namespace shardlm {

// out[t, j] = element order[j] of row t of the input, for t < T and j < width (out is [T, width]).
// The input is `parts` blocks of [T, part_cols] one after the other, an all-gather's result (a
// row-parallel layer split over ranks): its element c of row t lies in block c / part_cols, column
// c % part_cols. One part is a plain [T, part_cols] matrix. Every order[j] lies in
// [0, parts * part_cols): the loader checked it. Rows run in parallel (OpenMP) when large.
void gather_columns(const float* x, int64_t T, int64_t part_cols, int64_t parts, const int32_t* order, int64_t width,
                    float* out);

}  // namespace shardlm
