#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/stream_read.h"

namespace shardlm {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread: 64 bytes, 16 KB per block
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ uint32_t words(const uint4& v) { return v.x + v.y + v.z + v.w; }

__global__ void __launch_bounds__(kThreads) stream_read_kernel(const uint4* __restrict__ p, int64_t n,
                                                               uint32_t* __restrict__ sum) {
    const int64_t stride = int64_t(gridDim.x) * kThreads;
    int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
    uint32_t s = 0;
    // The first round before the wait: the buffer never depends on the kernel before.
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = i + u * stride < n ? __ldg(p + i + u * stride) : make_uint4(0, 0, 0, 0);
    pdl_wait();
    pdl_launch_dependents();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) s += words(v[u]);
    for (i += kUnroll * stride; i < n; i += kUnroll * stride) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = i + u * stride < n ? __ldg(p + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) s += words(v[u]);
    }
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(kFull, s, off);
    if ((threadIdx.x & 31) == 0) atomicAdd(sum, s);
}

}  // namespace

void stream_read_cuda(const void* p, size_t bytes, uint32_t* sum, cudaStream_t stream) {
    SHARDLM_CHECK(bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0, "stream_read_cuda: ", bytes,
                  " bytes at ", p, " are not whole 16-byte words");
    const int64_t n = int64_t(bytes / 16);
    if (n == 0) return;
    // Every SM full (2048 threads each), fewer blocks for a buffer too small to give each thread a round.
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(int64_t(cuda_sm_count()) * (2048 / kThreads),
                                                                  (n + kThreads * kUnroll - 1) / (kThreads * kUnroll)));
    launch_kernel("stream_read_kernel", stream_read_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream,
                  static_cast<const uint4*>(p), n, sum);
}

}  // namespace shardlm
