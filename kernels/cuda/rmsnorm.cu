#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rmsnorm.h"

namespace shardlm {
namespace {

constexpr int kThreads = 256;

// One block per row: each thread sums squares over a strided slice, the block reduces through
// warp shuffles and one shared slot per warp, then every thread scales its slice.
__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                               int64_t dim, float eps) {
    const float* xr = x + blockIdx.x * dim;
    float* yr = y + blockIdx.x * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    __shared__ float warp_sums[kThreads / 32];
    __shared__ float inv;
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int i = 0; i < kThreads / 32; ++i) total += warp_sums[i];
        inv = rsqrtf(total / float(dim) + eps);
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = (xr[i] * inv) * w[i];
}

}  // namespace

void rmsnorm_cuda(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                  cudaStream_t stream) {
    if (rows == 0) return;
    rmsnorm_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, w, y, dim, eps);
    cuda_after_launch(stream, "rmsnorm_kernel");
}

}  // namespace shardlm
