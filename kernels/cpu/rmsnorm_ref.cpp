#include <cmath>

#include "kernels/cpu/rmsnorm.h"

namespace shardlm {

void rmsnorm_ref(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * dim;
        float* yr = y + r * dim;
        double ss = 0;  // HF computes the mean square in FP32; double keeps ours at least as exact
        for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
        const float inv = 1.0f / std::sqrt(float(ss / double(dim)) + eps);
        for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] * inv) * w[i];
    }
}

}  // namespace shardlm
