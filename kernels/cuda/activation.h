// SwiGLU on the GPU: out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)), FP32.
// Same contract as silu_mul_ref in kernels/cpu/activation.h; out may alias gate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm {

void silu_mul_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

}  // namespace shardlm
