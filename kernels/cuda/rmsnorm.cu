#include <climits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/rmsnorm.h"

namespace shardlm {
namespace {

constexpr int kThreads = 256;  // every kernel here is launched with exactly this block size

// 1 / sqrt(mean(x^2) + eps) of a row from each thread's partial sum of squares: warp shuffles,
// then one shared slot per warp summed by thread 0. Every thread of the block must call it (it
// holds two __syncthreads); all get the same result.
__device__ float block_inv_rms(float ss, int64_t dim, float eps) {
    __shared__ float warp_sums[kThreads / 32];
    __shared__ float inv;
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int i = 0; i < kThreads / 32; ++i) total += warp_sums[i];
        inv = rsqrtf(total / float(dim) + eps);
    }
    __syncthreads();
    return inv;
}

// One block per row; each thread owns the strided elements i = threadIdx.x + k * kThreads in both
// passes, so in-place use (y == x, as rmsnorm_ref allows) and aliasing of y with delta are safe:
// no element is read by one thread after another wrote it. Hence no __restrict__ on x/y/delta.
__global__ void rmsnorm_kernel(const float* x, const float* __restrict__ w, float* y, int64_t dim, float eps) {
    pdl_wait();
    pdl_launch_dependents();
    const float* xr = x + int64_t(blockIdx.x) * dim;
    float* yr = y + int64_t(blockIdx.x) * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) ss += xr[i] * xr[i];
    const float inv = block_inv_rms(ss, dim, eps);
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) yr[i] = (xr[i] * inv) * w[i];
}

// x += delta (when delta is set), then y = rmsnorm(x) * w; the second pass re-reads the x this
// same thread just wrote.
__global__ void add_rmsnorm_kernel(float* x, const float* delta, const float* __restrict__ w, float* y,
                                   int64_t dim, float eps) {
    pdl_wait();
    pdl_launch_dependents();
    float* xr = x + int64_t(blockIdx.x) * dim;
    float* yr = y + int64_t(blockIdx.x) * dim;
    float ss = 0.0f;
    if (delta) {
        const float* dr = delta + int64_t(blockIdx.x) * dim;
        for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
            const float v = xr[i] + dr[i];
            xr[i] = v;
            ss += v * v;
        }
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += kThreads) ss += xr[i] * xr[i];
    }
    const float inv = block_inv_rms(ss, dim, eps);
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) yr[i] = (xr[i] * inv) * w[i];
}

// y[b] = rmsnorm(x[r] + delta[r]) * w with r = rows[b]; x is only read, so the sum is formed in
// both passes.
__global__ void rmsnorm_rows_kernel(const float* __restrict__ x, const float* __restrict__ delta,
                                    const int32_t* __restrict__ rows, const float* __restrict__ w,
                                    float* __restrict__ y, int64_t dim, float eps) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t r = rows[blockIdx.x];
    const float* xr = x + r * dim;
    const float* dr = delta ? delta + r * dim : nullptr;
    float* yr = y + int64_t(blockIdx.x) * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
        const float v = dr ? xr[i] + dr[i] : xr[i];
        ss += v * v;
    }
    const float inv = block_inv_rms(ss, dim, eps);
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
        const float v = dr ? xr[i] + dr[i] : xr[i];
        yr[i] = (v * inv) * w[i];
    }
}

void check_rows(int64_t rows, const char* who) {
    SHARDLM_CHECK(rows > 0 && rows <= INT_MAX, "rows of ", who, ": ", rows, " do not fit one grid");
}

}  // namespace

void rmsnorm_cuda(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                  cudaStream_t stream) {
    if (rows == 0) return;
    check_rows(rows, "rmsnorm_cuda");
    launch_kernel("rmsnorm_kernel", rmsnorm_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, stream, x, w, y, dim, eps);
}

void add_rmsnorm_cuda(float* x, const float* delta, const float* w, float* y, int64_t rows, int64_t dim,
                      float eps, cudaStream_t stream) {
    if (rows == 0) return;
    check_rows(rows, "add_rmsnorm_cuda");
    launch_kernel("add_rmsnorm_kernel", add_rmsnorm_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, stream,
                  x, delta, w, y, dim, eps);
}

void rmsnorm_rows_cuda(const float* x, const float* delta, const int32_t* rows, int64_t n, const float* w,
                       float* y, int64_t dim, float eps, cudaStream_t stream) {
    if (n == 0) return;
    check_rows(n, "rmsnorm_rows_cuda");
    launch_kernel("rmsnorm_rows_kernel", rmsnorm_rows_kernel, dim3(unsigned(n)), dim3(kThreads), 0, stream,
                  x, delta, rows, w, y, dim, eps);
}

}  // namespace shardlm
