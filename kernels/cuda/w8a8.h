// W8A8 on the GPU: INT8 weights times dynamically quantized INT8 activations, INT32 dot products
// per group, scaled and summed in f32. The CPU functions are the truth (kernels/cpu/quantize.h,
// kernels/cpu/matmul.h):
//
//   x[t, c] ~= q[t, c] * act_scale[t, c / ga]            (quantize_acts_int8_ref, bit for bit)
//   y[t, r]  = sum over dot groups k0 of g = min(ga, gw) columns of
//              (INT32 sum_{k0 <= c < k0 + g} q[t, c] * w[r, c]) * (act_scale[t, k0 / ga] * w_scale[r, k0 / gw])
//              in f32, + bias[r]                         (matmul_w8a8_ref)
//
// ga and gw (activation and weight group sizes) must divide one another and cols, as on the CPU.
// Decode runs one pass over the weights with __dp4a; prefill runs cuBLAS's INT8 tensor-core GEMM
// once per dot group into an INT32 scratch and scales in an epilogue kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/gemv.h"
#include "kernels/cuda/half_input.h"
#include "kernels/cuda/matrix.h"

struct cublasContext;

namespace shardlm {

// Device INT8 activations: q [n, cols] int8, scales [n, cols / group_size] f32.
struct DeviceActs {
    const int8_t* q = nullptr;
    const float* scales = nullptr;
    int64_t n = 0, cols = 0, group_size = 0;
};

// The checks of the CPU's matmul_w8a8 / matmul_w4a8 (kernels/cpu/matmul.cpp) on w (I8 or I4) and
// a, naming `fn` in the error.
void check_int8_product(const DeviceMatrix& w, const DeviceActs& a, const char* fn);

// x f32 [n, cols] (device) -> q, scales as above; bit-identical to quantize_acts_int8_ref.
// group_size divides cols (== cols: one scale per token).
void quantize_acts_cuda(const float* x, int64_t n, int64_t cols, int64_t group_size, int8_t* q, float* scales,
                        cudaStream_t stream);

// Decode: y f32 [a.n, w.rows] for a.n <= kGemvMaxTokens (gemv.h), every weight byte read once.
// w must be I8 with w.cols == a.cols; bias [w.rows] or null.
void gemv_w8a8_cuda(const DeviceMatrix& w, const DeviceActs& a, const float* bias, float* y, cudaStream_t stream);

// Prefill: y f32 [a.n, w.rows] through cuBLAS's INT8 GEMM (INT32 results), for a.n <= max_tokens
// and w.rows <= max_rows. Shapes or pointers cuBLAS's INT8 kernels do not take (rows or group not
// a multiple of 16 / 4, misaligned pointers) run a plain kernel instead. run() allocates and
// synchronises nothing, so it can be captured in a CUDA graph. I8 weights only (W4A8 prefill:
// dequantize_acts_half_cuda below).
// W4A8 prefill's input: the quantized activations a dequantized, q * act_scale (one f32 rounding),
// rounded to h's 16-bit type and stored in h's column order (CublasGemm::input_for the I4 matrix),
// so that CublasGemm::run(w, nullptr, ...) forms sum (q * act_scale) * (code * w_scale + w_min) on
// FP16 tensor cores: matmul_w4a8_ref's products up to a 16-bit rounding of each factor (2^-11),
// where an INT8 GEMM would need one INT32 product per dot group. a.group_size a multiple of 4.
void dequantize_acts_half_cuda(const DeviceActs& a, const HalfInput& h, cudaStream_t stream);

class CublasInt8Gemm {
public:
    CublasInt8Gemm(cudaStream_t stream, int64_t max_tokens, int64_t max_rows);
    ~CublasInt8Gemm();
    CublasInt8Gemm(const CublasInt8Gemm&) = delete;
    CublasInt8Gemm& operator=(const CublasInt8Gemm&) = delete;

    void run(const DeviceMatrix& w, const DeviceActs& a, const float* bias, float* y);
    size_t scratch_bytes() const { return scratch_bytes_; }

private:
    void release() noexcept;

    cudaStream_t stream_ = nullptr;
    cublasContext* handle_ = nullptr;
    int32_t* dots_ = nullptr;    // [max_tokens, max_rows] INT32 products of one dot group
    void* workspace_ = nullptr;  // cuBLAS workspace (set so products can be graph-captured)
    int64_t max_tokens_ = 0, max_rows_ = 0;
    size_t scratch_bytes_ = 0;
};

}  // namespace shardlm
