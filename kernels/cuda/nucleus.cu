#include <climits>

#include "core/error.h"
#include "kernels/cpu/nucleus.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/nucleus.h"

namespace shardlm {
namespace {

constexpr int kThreads = 256;

// One block per row: each thread sums its strided logits' weights, then a tree over shared
// memory. Integer sums, so the order changes nothing.
__global__ void __launch_bounds__(kThreads) nucleus_mass_kernel(const float* __restrict__ x, int64_t n,
                                                                const float* __restrict__ row_max, int64_t max_stride,
                                                                float temperature, uint64_t* __restrict__ mass) {
    __shared__ uint64_t part[kThreads];
    pdl_wait();
    pdl_launch_dependents();
    const int64_t r = blockIdx.x;
    const float* xr = x + r * n;
    const float mx = row_max[r * max_stride];
    uint64_t sum = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) sum += nucleus_weight(xr[i], mx, temperature);
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
        if (int(threadIdx.x) < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) mass[r] = part[0];
}

}  // namespace

void nucleus_mass_rows_cuda(const float* x, int64_t rows, int64_t n, const float* row_max, int64_t max_stride,
                            float temperature, uint64_t* mass, cudaStream_t stream) {
    if (rows == 0) return;
    SHARDLM_CHECK(rows > 0 && rows <= INT_MAX && n > 0 && n <= kNucleusMaxRow && temperature > 0.0f,
                  "nucleus_mass_rows_cuda: ", rows, " rows of ", n, " logits at temperature ", temperature);
    launch_kernel("nucleus_mass_kernel", nucleus_mass_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, stream, x, n,
                  row_max, max_stride, temperature, mass);
}

}  // namespace shardlm
