// Decode-time matrix-vector products on the GPU: y[n, rows] = x[n, cols] * W^T (+ bias) for a
// handful of token rows (n <= kGemvMaxTokens) in one pass over the weights, which is what bounds
// a decode step: every weight byte is read once per step whatever n is. x, y, bias are f32 device
// memory; W is F32/F16/BF16, I8 (dequantized in registers, per channel or per group) or I4
// (asymmetric, per group: scales and mins, dequantized in registers too).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/matrix.h"

namespace shardlm {

constexpr int64_t kGemvMaxTokens = 8;

// How the vector path's row tiles meet blocks. PerTile: a block per tile, each making one or a few
// rounds of loads and leaving. Persistent: only as many blocks as the GPU holds at once, each
// looping over tiles with the next tile's weights in flight during this one's reduction.
enum class GemvGrid { PerTile, Persistent };

// SHARDLM_GEMV_GRID = tiles | persistent (read once per process; unset: persistent), so that whole
// decode runs can be compared (bench/gpu_check.sh). Persistent is the default since the H200
// timed both (2026-12-04, Qwen3-1.7B shape, ms/token tiles -> persistent: FP16 batch 1 1.363 ->
// 1.298, batch 4 1.833 -> 1.792; INT8 weights and KV batch 1 1.074 -> 1.088, batch 4 1.713 -> 1.645).
GemvGrid gemv_default_grid();

void gemv_cuda(const DeviceMatrix& w, const float* x, int64_t n, const float* bias, float* y, cudaStream_t stream,
               GemvGrid grid = gemv_default_grid());

// What a decode step at tensor parallelism 1 folds into its GEMVs, so that no kernel runs between
// two products (where a projection's output needs no all-reduce before it joins the residual):
// - norm_w: x is the residual stream ([n, cols], not modified) and the product's input is
//   rmsnorm(x) * norm_w, with eps: y = (rmsnorm(x) * norm_w) W^T + bias. Each block finds the
//   token rows' 1 / rms itself and the sums are scaled by it before the bias, so the results are
//   rmsnorm_cuda then gemv_cuda's up to f32 rounding (not bit for bit). norm_w is [cols] floats.
// - accumulate: y += x W^T + bias, the residual add of o_proj and down_proj in their epilogue (bit
//   for bit gemv_cuda into a delta, then y + delta).
struct GemvFuse {
    const float* norm_w = nullptr;
    float eps = 0.0f;
    bool accumulate = false;
};
void gemv_cuda(const DeviceMatrix& w, const float* x, int64_t n, const float* bias, float* y, const GemvFuse& fuse,
               cudaStream_t stream, GemvGrid grid = gemv_default_grid());

// SHARDLM_FUSED_NORM = 0 | 1 (read once per process; unset: 1): whether a TP=1 decode step folds
// its norms and residual adds into the GEMVs (GemvFuse), for the A/B runs of bench/gpu_check.sh.
bool gemv_norm_fused_default();

// The MLP's first half in one pass: w is gate_proj's rows stacked on up_proj's ([2 * inter, cols],
// bias likewise), y[n, inter] = silu(x W_gate^T + b_gate) * (x W_up^T + b_up), the SwiGLU applied
// in the GEMV's epilogue instead of a second kernel over [n, 2 * inter]. Returns false, having done
// nothing, for shapes or pointers the vector path does not take (the caller then runs gemv_cuda
// and silu_mul_rows_cuda).
bool gemv_swiglu_cuda(const DeviceMatrix& w, const float* x, int64_t n, const float* bias, float* y,
                      cudaStream_t stream, GemvGrid grid = gemv_default_grid());
// The same with GemvFuse's norm (accumulate is refused: SwiGLU's output is no residual).
bool gemv_swiglu_cuda(const DeviceMatrix& w, const float* x, int64_t n, const float* bias, float* y,
                      const GemvFuse& fuse, cudaStream_t stream, GemvGrid grid = gemv_default_grid());

// Rewrites w's rows in place into the interleaved column order (kernels/cuda/interleave.h) and
// sets w.interleaved, when the shape allows it: F16/BF16/I8/I4, 16-byte aligned, columns (and
// INT8/INT4 groups) a multiple of the interleaved block (interleave_block_cols: 128 columns for I8
// and I4, 64 for F16/BF16), rows of at most 48 KB. Returns whether it did; a matrix it leaves
// alone (F32 always) keeps working in the natural order.
bool gemv_interleave_cuda(DeviceMatrix& w, cudaStream_t stream);

// SHARDLM_GEMV_R = 1, 2 or 4 (read once per process; 0 when unset, any other value an error):
// the rows per lane group that the decode GEMVs (this one and gemv_w8a8_cuda) use for 1-2 token
// rows, forced for the A/B runs of bench/gemv_bench_cuda (bench/gpu_check.sh gemv-r). Unset,
// gemv_cuda picks by row length and gemv_w8a8_cuda uses 1.
int gemv_forced_rows_per_group();

}  // namespace shardlm
