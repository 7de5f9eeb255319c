// RMSNorm on the GPU, FP32 math: y = x / sqrt(mean(x^2) + eps) * w over `rows` rows of `dim`.
// Same contract as rmsnorm_ref in kernels/cpu/rmsnorm.h; pointers are device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm {

void rmsnorm_cuda(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                  cudaStream_t stream);

}  // namespace shardlm
