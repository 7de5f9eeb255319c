// SwiGLU: y = silu(gate) * up, silu(g) = g / (1 + exp(-g)). In place allowed (y == gate).
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"

namespace shardlm {

void silu_mul_ref(const float* gate, const float* up, float* y, int64_t n);

// The same with AVX-512 where the CPU has it (rowwise_avx512.cpp): e^-g from a polynomial within
// kSiluExpRelErr of std::exp, the rest as the reference.
void silu_mul(const float* gate, const float* up, float* y, int64_t n, CpuIsa isa = CpuIsa::Auto);
constexpr double kSiluExpRelErr = 4e-7;

}  // namespace shardlm
