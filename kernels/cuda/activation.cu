#include <algorithm>
#include <cstdint>

#include "kernels/cuda/align.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"

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


}  // namespace

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

}  // namespace shardlm
