#include <climits>

#include "core/error.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/launch.h"

namespace shardlm {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 4;  // columns per thread: a block covers 1024 of a row

// Block (x, y): row y, columns [x * 1024, x * 1024 + 1024). Consecutive threads write consecutive
// columns (coalesced); the reads scatter over one row of the input, a few KiB that L1/L2 hold.
// The order is weights (written at upload), so it is read before the wait.
__global__ void gather_columns_kernel(const float* __restrict__ x, int64_t T, int64_t part_cols, int64_t parts,
                                      const int32_t* __restrict__ order, int64_t width, float* __restrict__ out) {
    const int64_t t = blockIdx.y;
    const int64_t j0 = int64_t(blockIdx.x) * kThreads * kPerThread + threadIdx.x;
    int32_t c[kPerThread];
    for (int i = 0; i < kPerThread; ++i) {
        const int64_t j = j0 + int64_t(i) * kThreads;
        c[i] = j < width ? order[j] : 0;
    }
    pdl_wait();
    pdl_launch_dependents();
    const float* row = x + t * part_cols;
    float* o = out + t * width;
    for (int i = 0; i < kPerThread; ++i) {
        const int64_t j = j0 + int64_t(i) * kThreads;
        if (j >= width) break;
        // (parts is the same for every thread: the branch never diverges.)
        o[j] = parts == 1 ? row[c[i]] : row[(c[i] / part_cols) * T * part_cols + c[i] % part_cols];
    }
}

}  // namespace

void gather_columns_cuda(const float* x, int64_t T, int64_t part_cols, int64_t parts, const int32_t* order,
                         int64_t width, float* out, cudaStream_t stream) {
    if (T == 0 || width == 0) return;
    SHARDLM_CHECK(T > 0 && T <= 65535 && width > 0 && part_cols > 0 && parts > 0, "gather_columns_cuda: ", T,
                  " rows of ", width, " columns from ", parts, " parts of ", part_cols, " do not fit one grid");
    const int64_t per_block = int64_t(kThreads) * kPerThread;
    const dim3 grid(static_cast<unsigned>((width + per_block - 1) / per_block), static_cast<unsigned>(T));
    launch_kernel("gather_columns_kernel", gather_columns_kernel, grid, dim3(kThreads), 0, stream, x, T, part_cols,
                  parts, order, width, out);
}

}  // namespace shardlm
