// SwiGLU: y = silu(gate) * up, silu(g) = g / (1 + exp(-g)). In place allowed (y == gate).
#pragma once

#include <cstdint>

namespace shardlm {

void silu_mul_ref(const float* gate, const float* up, float* y, int64_t n);

}  // namespace shardlm
