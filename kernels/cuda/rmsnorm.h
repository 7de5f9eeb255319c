// RMSNorm on the GPU, FP32 math: y = x / sqrt(mean(x^2) + eps) * w over rows of `dim`.
// Same contract as rmsnorm_ref in kernels/cpu/rmsnorm.h; pointers are device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/half_input.h"

namespace shardlm {

void rmsnorm_cuda(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                  cudaStream_t stream);

// The residual step of a decoder layer fused with the next norm: x += delta (skipped when delta
// is null), then y = rmsnorm(x) * w, over `rows` rows of `dim`. x is updated in place.
// With `order` (device int32 [dim], each in [0, dim)): y's element j is the normed row's element
// order[j], the bits that gather_columns_cuda(y, rows, dim, 1, order, dim, ...) after the plain
// norm writes: an act-order projection's input without its gather (y must not alias x).
void add_rmsnorm_cuda(float* x, const float* delta, const float* w, float* y, int64_t rows, int64_t dim,
                      float eps, cudaStream_t stream, const int32_t* order = nullptr);

// add_rmsnorm_cuda that also quantizes y per row for a W8A8 projection: q [rows, dim] and
// q_scales [rows], bit for bit what quantize_acts_cuda(y, rows, dim, dim, ...) writes, in the same
// kernel where the row fits the norm's vector path (else the two kernels run in turn).
void add_rmsnorm_quantize_cuda(float* x, const float* delta, const float* w, float* y, int64_t rows, int64_t dim,
                               float eps, int8_t* q, float* q_scales, cudaStream_t stream);

// add_rmsnorm_cuda whose normed rows go only to a prefill GEMM's 16-bit input (half_input.h: the
// bits CublasGemm::run would convert y to), not to an f32 y. Returns false, having done nothing,
// where its vector path does not apply (half_input_fits, dim at most 8192, 16-byte aligned rows):
// then add_rmsnorm_cuda and the GEMM's own conversion.
bool add_rmsnorm_half_cuda(float* x, const float* delta, const float* w, int64_t rows, int64_t dim, float eps,
                           const HalfInput& out, cudaStream_t stream);

// The final norm on the rows whose logits are wanted: y[i] = rmsnorm(x[r] + delta[r]) * w with
// r = rows[i] (device array of n row indexes; delta may be null). x is not modified.
void rmsnorm_rows_cuda(const float* x, const float* delta, const int32_t* rows, int64_t n, const float* w,
                       float* y, int64_t dim, float eps, cudaStream_t stream);

}  // namespace shardlm
