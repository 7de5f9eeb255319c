// SwiGLU on the GPU: out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)), FP32.
// Same contract as silu_mul_ref in kernels/cpu/activation.h; out may alias gate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/half_input.h"

namespace shardlm {

// Device code: nvcc's, or the CPU emulator's that compiles the .cu files as C++ (tests/cuda_emu).
#if defined(__CUDACC__) || defined(SHARDLM_CUDA_EMU)
// silu_mul_ref's float operations: g / (1 + exp(-g)) * up, with the precise expf (not __expf) so
// the result tracks the CPU's std::exp to a few ulp. Large negative g gives exp = inf and -0.
// Shared by the SwiGLU kernels and the decode GEMV's fused SwiGLU epilogue (gemv.h).
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
#endif

void silu_mul_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

// The same after a fused gate/up projection: gate_up is [T, 2 * inter] with each token's gate
// columns then its up columns; out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i], [T, inter].
void silu_mul_rows_cuda(const float* gate_up, int64_t T, int64_t inter, float* out, cudaStream_t stream);

// silu_mul_rows_cuda whose rows go only to a prefill GEMM's 16-bit input (half_input.h: the bits
// CublasGemm::run would convert out to). Returns false, having done nothing, where it does not
// apply (half_input_fits, gate_up 16-byte aligned, T <= 65535): then silu_mul_rows_cuda.
bool silu_mul_rows_half_cuda(const float* gate_up, int64_t T, int64_t inter, const HalfInput& out,
                             cudaStream_t stream);

// silu_mul_rows_cuda that also quantizes each output row for a W8A8 projection: q [T, inter] and
// q_scales [T], bit for bit what quantize_acts_cuda(out, T, inter, inter, ...) writes, in the same
// kernel where the row fits its vector path (inter % 4 == 0, at most 32768, aligned), else the two
// kernels in turn.
void silu_mul_rows_quantize_cuda(const float* gate_up, int64_t T, int64_t inter, float* out, int8_t* q,
                                 float* q_scales, cudaStream_t stream);

}  // namespace shardlm
