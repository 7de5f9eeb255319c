#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/act_quant.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/align.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/half_input.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/w8a8.h"

namespace shardlm {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;  // enough to fill any GPU; the loops are grid-strided

// Element i is read and written by the same thread, so out may alias gate (no __restrict__ there).
__global__ void silu_mul_kernel(const float* gate, const float* __restrict__ up, float* out, int64_t n) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = silu_mul(gate[i], up[i]);
}

// The same over float4 when gate, up and out are all 16-byte aligned: n / 4 vectors, then the
// n % 4 tail elements by the first threads of the grid.
__global__ void silu_mul_vec4_kernel(const float* gate, const float* __restrict__ up, float* out, int64_t n) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t n4 = n / 4;
    const float4* g4 = reinterpret_cast<const float4*>(gate);
    const float4* u4 = reinterpret_cast<const float4*>(up);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (int64_t i = first; i < n4; i += stride) {
        const float4 g = g4[i], u = u4[i];
        o4[i] = make_float4(silu_mul(g.x, u.x), silu_mul(g.y, u.y), silu_mul(g.z, u.z), silu_mul(g.w, u.w));
    }
    const int64_t tail = n4 * 4 + first;
    if (tail < n) out[tail] = silu_mul(gate[tail], up[tail]);
}

// One token row per blockIdx.y, columns strided over x: reads gate and up halves of the row.
__global__ void silu_mul_rows_kernel(const float* __restrict__ gu, int64_t inter, float* __restrict__ out) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t t = blockIdx.y;
    const float* g = gu + t * 2 * inter;
    float* o = out + t * inter;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < inter; i += int64_t(gridDim.x) * blockDim.x)
        o[i] = silu_mul(g[i], g[inter + i]);
}

// silu_mul_rows_kernel with the row's quantization, one block of kRowThreads per token row: each
// thread loads its V float4s of the gate and up halves at once (one memory latency per row, not
// one per element), keeps the products in registers for the block's max |x|, then quantizes them
// (act_quant.h, quantize_acts_kernel's operations).
constexpr int kRowThreads = 512;

template <int V>
__global__ void __launch_bounds__(kRowThreads) silu_mul_quantize_kernel(const float* __restrict__ gu, int64_t inter,
                                                                        float* __restrict__ out, int8_t* __restrict__ q,
                                                                        float* __restrict__ q_scales) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t t = blockIdx.x;
    const int n4 = int(inter / 4);
    const float4* g4 = reinterpret_cast<const float4*>(gu + t * 2 * inter);
    const float4* u4 = g4 + n4;
    float4 g[V], u[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = int(threadIdx.x) + k * kRowThreads;
        g[k] = i < n4 ? g4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        u[k] = i < n4 ? u4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float4* o4 = reinterpret_cast<float4*>(out + t * inter);
    float amax = 0.0f;  // fmaxf ignores a NaN like the CPU's std::max(amax, |x|)
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = int(threadIdx.x) + k * kRowThreads;
        g[k] = make_float4(silu_mul(g[k].x, u[k].x), silu_mul(g[k].y, u[k].y), silu_mul(g[k].z, u[k].z),
                           silu_mul(g[k].w, u[k].w));
        if (i < n4) {
            o4[i] = g[k];
            amax = abs_max4(amax, g[k]);
        }
    }
    amax = block_max<kRowThreads>(amax);
    if (threadIdx.x == 0) q_scales[t] = quantize_act_scale(amax);
    const float inv = quantize_act_inv(amax);
    char4* q4 = reinterpret_cast<char4*>(q + t * inter);
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = int(threadIdx.x) + k * kRowThreads;
        if (i < n4) q4[i] = quantize_act4(g[k], inv);
    }
}

// SwiGLU of a fused gate/up row straight into a prefill GEMM's 16-bit input (half_input.h): one
// token row per blockIdx.y, float4s of the row strided over x.
__global__ void silu_mul_rows_half_kernel(const float* __restrict__ gu, int64_t inter, HalfInput out) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t t = blockIdx.y, n4 = inter / 4;
    const float4* g4 = reinterpret_cast<const float4*>(gu + t * 2 * inter);
    const float4* u4 = g4 + n4;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
        const float4 g = g4[i], u = u4[i];
        store_half_input4(out, t, inter, 4 * i,
                          make_float4(silu_mul(g.x, u.x), silu_mul(g.y, u.y), silu_mul(g.z, u.z), silu_mul(g.w, u.w)));
    }
}

}  // namespace

bool silu_mul_rows_half_cuda(const float* gate_up, int64_t T, int64_t inter, const HalfInput& out,
                             cudaStream_t stream) {
    if (T <= 0 || inter <= 0) return true;
    if (!half_input_fits(out, inter) || !is_aligned(gate_up, 16) || T > 65535) return false;
    const int64_t blocks = std::min<int64_t>((inter / 4 + kThreads - 1) / kThreads, 1024);
    launch_kernel("silu_mul_rows_half_kernel", silu_mul_rows_half_kernel, dim3(unsigned(blocks), unsigned(T)),
                  dim3(kThreads), 0, stream, gate_up, inter, out);
    return true;
}

void silu_mul_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    const bool vec = is_aligned(gate, 16) && is_aligned(up, 16) && is_aligned(out, 16);
    const int64_t work = vec ? (n + 3) / 4 : n;
    const int64_t blocks = std::min<int64_t>((work + kThreads - 1) / kThreads, kMaxBlocks);
    if (vec)
        launch_kernel("silu_mul_vec4_kernel", silu_mul_vec4_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream,
                      gate, up, out, n);
    else
        launch_kernel("silu_mul_kernel", silu_mul_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream,
                      gate, up, out, n);
}

void silu_mul_rows_cuda(const float* gate_up, int64_t T, int64_t inter, float* out, cudaStream_t stream) {
    if (T <= 0 || inter <= 0) return;
    SHARDLM_CHECK(T <= 65535, "silu_mul_rows_cuda: ", T, " rows exceed one grid's y dimension");
    const int64_t blocks = std::min<int64_t>((inter + kThreads - 1) / kThreads, 1024);
    launch_kernel("silu_mul_rows_kernel", silu_mul_rows_kernel,
                  dim3(unsigned(blocks), unsigned(T)), dim3(kThreads), 0, stream,
                  gate_up, inter, out);
}

void silu_mul_rows_quantize_cuda(const float* gate_up, int64_t T, int64_t inter, float* out, int8_t* q,
                                 float* q_scales, cudaStream_t stream) {
    if (T <= 0 || inter <= 0) return;
    SHARDLM_CHECK(q && q_scales, "silu_mul_rows_quantize_cuda: null output");
    const int64_t per_thread = (inter / 4 + kRowThreads - 1) / kRowThreads;  // float4s per thread
    if (inter % 4 != 0 || per_thread > 16 || T > INT_MAX || !is_aligned(gate_up, 16) || !is_aligned(out, 16) ||
        !is_aligned(q, 4)) {
        silu_mul_rows_cuda(gate_up, T, inter, out, stream);
        quantize_acts_cuda(out, T, inter, inter, q, q_scales, stream);
        return;
    }
    const auto launch = [&](auto kernel) {
        launch_kernel("silu_mul_quantize_kernel", kernel, dim3(unsigned(T)), dim3(kRowThreads), 0, stream, gate_up,
                      inter, out, q, q_scales);
    };
    if (per_thread <= 1) launch(silu_mul_quantize_kernel<1>);
    else if (per_thread <= 2) launch(silu_mul_quantize_kernel<2>);
    else if (per_thread <= 4) launch(silu_mul_quantize_kernel<4>);
    else if (per_thread <= 8) launch(silu_mul_quantize_kernel<8>);
    else launch(silu_mul_quantize_kernel<16>);
}

}  // namespace shardlm
