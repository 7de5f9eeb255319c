#include <cmath>

#include "kernels/cpu/activation.h"

namespace shardlm {

void silu_mul_ref(const float* gate, const float* up, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        y[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

}  // namespace shardlm
