#include <climits>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/align.h"
#include "kernels/cuda/argmax.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"

namespace shardlm {
namespace {

// One block per row, 1024 threads: a 152k..256k vocabulary is 37..63 float4 loads per thread, all
// independent, so one block streams its row at close to an SM's bandwidth.
constexpr int kThreads = 1024;
constexpr unsigned kFull = 0xffffffffu;
static_assert(kThreads == 32 * 32, "the second reduction stage gives one warp slot to each lane");

// The running best (v, i) takes candidate (cv, ci) when it is larger, or equal with a lower index.
// NaN compares false both ways, so a NaN is never taken (it is not greater than anything); the
// start (-inf, INT_MAX) is taken by any non-NaN value, -inf included. On non-NaN candidates this
// is a total order, so the tree reduction gives the lowest index of the maximum whatever the order.
__device__ __forceinline__ void take(float& v, int& i, float cv, int ci) {
    if (cv > v || (cv == v && ci < i)) {
        v = cv;
        i = ci;
    }
}

template <bool kVec4>
__global__ void __launch_bounds__(kThreads) argmax_rows_kernel(const float* __restrict__ logits, int vocab,
                                                                 int32_t id_offset, float* __restrict__ vals,
                                                                 int32_t* __restrict__ ids) {
    pdl_wait();
    pdl_launch_dependents();
    const float* row = logits + int64_t(blockIdx.x) * vocab;
    float v = -INFINITY;
    int i = INT_MAX;
    // Each thread scans its indices in increasing order, so strict ">" alone would keep its lowest.
    if constexpr (kVec4) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        for (int j = threadIdx.x; j < vocab / 4; j += kThreads) {
            const float4 x = row4[j];
            take(v, i, x.x, 4 * j);
            take(v, i, x.y, 4 * j + 1);
            take(v, i, x.z, 4 * j + 2);
            take(v, i, x.w, 4 * j + 3);
        }
    } else {
        for (int j = threadIdx.x; j < vocab; j += kThreads) take(v, i, row[j], j);
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(kFull, v, off);
        const int oi = __shfl_xor_sync(kFull, i, off);
        take(v, i, ov, oi);
    }
    __shared__ float warp_v[kThreads / 32];
    __shared__ int warp_i[kThreads / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        warp_v[warp] = v;
        warp_i[warp] = i;
    }
    __syncthreads();
    if (warp == 0) {  // kThreads / 32 == 32: one slot per lane
        v = warp_v[lane];
        i = warp_i[lane];
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(kFull, v, off);
            const int oi = __shfl_xor_sync(kFull, i, off);
            take(v, i, ov, oi);
        }
        // An all-NaN row leaves the start untouched: index 0 (NaN ties go to the lowest index).
        if (lane == 0) {
            if (i == INT_MAX) i = 0;
            ids[blockIdx.x] = i + id_offset;
            if (vals) vals[blockIdx.x] = row[i];
        }
    }
}

}  // namespace

void argmax_rows_cuda(const float* logits, int64_t rows, int64_t vocab, int32_t id_offset, float* vals,
                      int32_t* ids, cudaStream_t stream) {
    if (rows == 0) return;
    SHARDLM_CHECK(rows > 0 && rows <= INT_MAX, "argmax_rows_cuda: ", rows, " rows do not fit one grid");
    SHARDLM_CHECK(vocab > 0 && vocab <= INT_MAX - kThreads && id_offset >= 0 && id_offset <= INT_MAX - vocab,
                  "argmax_rows_cuda: vocabulary of ", vocab, " from id ", id_offset);
    // Rows are 16-byte aligned when the base is and a row is a whole number of float4.
    const bool vec = vocab % 4 == 0 && is_aligned(logits, 16);
    if (vec)
        launch_kernel("argmax_rows_kernel", argmax_rows_kernel<true>, dim3(unsigned(rows)), dim3(kThreads), 0, stream,
                      logits, int(vocab), id_offset, vals, ids);
    else
        launch_kernel("argmax_rows_kernel", argmax_rows_kernel<false>, dim3(unsigned(rows)), dim3(kThreads), 0, stream,
                      logits, int(vocab), id_offset, vals, ids);
}

}  // namespace shardlm
