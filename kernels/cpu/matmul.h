// Linear layer y = x * W^T (+ b): x [n, cols] f32, W [rows, cols], y [n, rows] f32 (row-major).
//
// W may be f32/f16/bf16, I8 with per-group scales or I4 with per-group scales and mins (W8A16/W4A16:
// weights dequantized in the inner loop, activations and accumulation stay f32; except that on
// AVX-512 VNNI, I8 weights at 3 tokens and more and I4 at 3-16 meet 16-bit integer activations,
// each token rounded on its own scale, within kI16ActsErr * max|x| of x, with exact INT32 sums:
// matmul_kernels.h). W8A8 and W4A8 take INT8 activations too: INT32 dot products per group, then
// * act_scale * weight_scale, summed over groups in f32.
//
// *_ref are the plain truths; the others are threaded (OpenMP over output rows) and vectorised, the
// variant picked at run time (cpu_isa.h) unless one is named.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/weights_view.h"

namespace shardlm {

void matmul_ref(const float* x, int64_t n, const WeightView& w, const float* bias, float* y);
void matmul(const float* x, int64_t n, const WeightView& w, const float* bias, float* y);
void matmul(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, CpuIsa isa,
            bool batch_invariant = false);

// y [a.n, w.rows] = sum over groups of (INT32 dot of a.q and w's int8) * a_scale * w_scale, + bias.
// w must be I8 with w.cols == a.cols; the two group sizes must divide one another (the dot runs
// over the smaller groups). Integer sums are exact (the kernels flush INT32 partial sums to f32 at
// least every 1024 products).
void matmul_w8a8_ref(const QuantizedActs& a, const WeightView& w, const float* bias, float* y);
void matmul_w8a8(const QuantizedActs& a, const WeightView& w, const float* bias, float* y,
                 CpuIsa isa = CpuIsa::Auto);

// W4A8: I4 weights (codes q, a scale and a min per group, see weights_view.h) times INT8
// activations: y [a.n, w.rows] = sum over groups of a_scale * (w_scale * dot(q, a) + w_min * sum(a))
// (+ bias), i.e. the dequantized weights times the dequantized activations, with the dots exact in
// INT32 (q in 0..15 is the unsigned operand of VNNI as it is). The two group sizes must divide one
// another and the smaller be a multiple of 32 (a 4-bit block).
void matmul_w4a8_ref(const QuantizedActs& a, const WeightView& w, const float* bias, float* y);
void matmul_w4a8(const QuantizedActs& a, const WeightView& w, const float* bias, float* y,
                 CpuIsa isa = CpuIsa::Auto);

// One of several products of the same input: y [n, w->rows] = x * W^T (+ bias).
struct MatmulOut {
    const WeightView* w = nullptr;
    const float* bias = nullptr;
    float* y = nullptr;
};
// matmul (matmul_w8a8 / matmul_w4a8 by each weight's dtype) of one input with several weights,
// the same bits as one call per weight: when the weights share dtype, row length and group size
// (a layer's q/k/v or gate/up), their rows are one threaded run and the activations are prepared
// once; otherwise one call each.
//
// batch_invariant: each token's outputs are the same bits whatever other tokens the call holds
// (a sequence's logits then do not depend on the sequences batched with it, vLLM's batch
// invariance): one kind of kernel for every number of tokens, chosen by the weights alone (the
// GEMVs over blocks of tokens, INT8 and INT4 weights always on INT16 activations, no AMX tiles;
// W8A8 keeps its kernels, all exact in INT32 per group). Prefill runs slower; decode about as fast.
void matmul_multi(const float* x, int64_t n, const MatmulOut* outs, int count, CpuIsa isa = CpuIsa::Auto,
                  bool batch_invariant = false);
void matmul_int8_acts_multi(const QuantizedActs& a, const MatmulOut* outs, int count, CpuIsa isa = CpuIsa::Auto,
                            bool batch_invariant = false);
// Which variant `matmul` uses on this CPU ("avx512", "avx2", "scalar").
const char* matmul_isa();

}  // namespace shardlm
