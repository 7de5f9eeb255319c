// Prefill matrix products through cuBLAS: y[T, rows] = x[T, cols] * W^T (+ bias), x and y f32.
// F32 weights run SGEMM in full FP32 (no TF32: results comparable with the CPU backend); F16/BF16
// weights convert x to the weights' type and run GemmEx with FP32 accumulation; I8 weights are
// dequantized into an F16 scratch matrix first (W8A16 prefill is compute-bound, so the extra pass
// over the weights is cheap next to the product). Bias is added by a small kernel after.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/matrix.h"

struct cublasContext;

namespace shardlm {

class CublasGemm {
public:
    // Scratch for the largest product the engine will ask for: max_tokens rows of at most
    // max_cols inputs; I8 weights are dequantized max_weight_elems elements (whole rows) at a time.
    CublasGemm(cudaStream_t stream, int64_t max_tokens, int64_t max_cols, int64_t max_weight_elems);
    ~CublasGemm();
    CublasGemm(const CublasGemm&) = delete;
    CublasGemm& operator=(const CublasGemm&) = delete;

    void run(const DeviceMatrix& w, const float* x, int64_t T, const float* bias, float* y);
    size_t scratch_bytes() const { return scratch_bytes_; }

private:
    cudaStream_t stream_ = nullptr;
    cublasContext* handle_ = nullptr;
    void* x_half_ = nullptr;     // [max_tokens, max_cols] f16/bf16 copy of x
    void* w_half_ = nullptr;     // [max_weight_elems] f16 dequantized I8 weights
    void* workspace_ = nullptr;  // cuBLAS workspace (set so products can be graph-captured)
    int64_t max_tokens_ = 0, max_cols_ = 0, max_weight_elems_ = 0;
    size_t scratch_bytes_ = 0;
};

}  // namespace shardlm
