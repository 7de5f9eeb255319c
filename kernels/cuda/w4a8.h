// W4A8 on the GPU: INT4 weights (AWQ-style codes with a scale and a min per group, matrix.h) times
// dynamically quantized INT8 activations (quantize_acts_cuda, w8a8.h). The CPU is the truth
// (matmul_w4a8_ref, kernels/cpu/matmul.h):
//
//   y[t, r] = sum over dot groups k0 of g = min(ga, gw) columns of
//             act_scale[t, k0 / ga] * (w_scale[r, k0 / gw] * D + w_min[r, k0 / gw] * S), + bias[r]
//   D = INT32 sum_{k0 <= c < k0 + g} q[t, c] * code[r, c],   S = INT32 sum of the same q[t, c]
//
// i.e. the dequantized weights times the dequantized activations, with both integer sums exact.
// ga and gw divide one another and cols, and the smaller is a multiple of 32 (one 16-byte block
// of codes), as on the CPU. Decode runs gemv_w4a8_cuda below, with exact D and S; prefill
// dequantizes the quantized activations to f16 (dequantize_acts_half_cuda, w8a8.h) and runs the
// INT4 matrix through CublasGemm (gemm.h: codes dequantized to f16, FP16 tensor cores), which forms
// the same sum of products up to a 16-bit rounding of each factor. (One INT8 GEMM per dot group,
// the exact way, cost 52 ms for a Qwen3-1.7B pp512 on the H200 against 8 ms for W4A16's prefill.)
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/gemv.h"
#include "kernels/cuda/matrix.h"
#include "kernels/cuda/w8a8.h"

namespace shardlm {

// Decode: y f32 [a.n, w.rows] for a.n <= kGemvMaxTokens, every weight byte read once (__dp4a on
// the codes, 0..15, as signed bytes). bias [w.rows] or null.
void gemv_w4a8_cuda(const DeviceMatrix& w, const DeviceActs& a, const float* bias, float* y, cudaStream_t stream);

}  // namespace shardlm
