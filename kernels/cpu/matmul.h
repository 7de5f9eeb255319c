// Linear layer y = x * W^T (+ b): x [n, cols] f32, W [rows, cols] (f32/f16/bf16), y [n, rows] f32.
// matmul_ref is the plain truth; matmul is the threaded, vectorised one the engine uses.
#pragma once

#include <cstdint>

#include "kernels/cpu/weights_view.h"

namespace shardlm {

void matmul_ref(const float* x, int64_t n, const WeightView& w, const float* bias, float* y);
void matmul(const float* x, int64_t n, const WeightView& w, const float* bias, float* y);

// Which vectorised inner loop `matmul` picked on this CPU ("avx2", "scalar").
const char* matmul_isa();

}  // namespace shardlm
