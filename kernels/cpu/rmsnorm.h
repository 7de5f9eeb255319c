// RMSNorm in FP32: y = x / sqrt(mean(x^2) + eps) * w, over `rows` rows of `dim` values.
// In place is allowed (y == x).
#pragma once

#include <cstdint>

namespace shardlm {

void rmsnorm_ref(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps);

}  // namespace shardlm
