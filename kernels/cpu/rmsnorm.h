// RMSNorm in FP32: y = x / sqrt(mean(x^2) + eps) * w, over `rows` rows of `dim` values.
// In place is allowed (y == x).
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"

namespace shardlm {

void rmsnorm_ref(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps);

// The same with AVX-512 where the CPU has it (rowwise_avx512.cpp): the mean square still summed in
// f64 (in 16 lanes, so in another order), then the reference's f32 steps, so outputs differ from
// rmsnorm_ref only where that f64 sum's last bits move 1/sqrt across an f32 rounding boundary.
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
             CpuIsa isa = CpuIsa::Auto);

}  // namespace shardlm
