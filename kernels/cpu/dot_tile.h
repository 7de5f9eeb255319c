// Inner loop of the CPU matmul: dots of one weight row with up to kTile activation rows,
// sharing each weight load (converted to f32 in registers) across the tile.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace shardlm {

constexpr int kTile = 4;

// out[t] = sum_i x[t * x_stride + i] * w[i] for t < nt (1 <= nt <= kTile).
using DotTileFn = void (*)(const float* x, int64_t x_stride, int nt, const void* w, DType wt,
                           int64_t cols, float* out);

void dot_tile_scalar(const float* x, int64_t x_stride, int nt, const void* w, DType wt, int64_t cols,
                     float* out);
// Defined only when the build compiles the AVX2/FMA/F16C unit (x86-64).
void dot_tile_avx2(const float* x, int64_t x_stride, int nt, const void* w, DType wt, int64_t cols,
                   float* out);

}  // namespace shardlm
