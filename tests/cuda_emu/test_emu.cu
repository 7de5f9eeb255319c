// Tests of the CPU CUDA emulator itself: that it computes what CUDA defines (shuffles with widths,
// votes, matches, barriers, dynamic shared memory, graphs) and that it stops, naming the kernel,
// at the bugs it exists to find (a missing barrier, a divergent or deadlocked collective, a lane
// that left a shuffle's mask, an overrun of shared memory, a host pointer given to a kernel).
// Device code, compiled like kernels/cuda/*.cu (as C++ with cuda_emu.h force-included).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"

using namespace shardlm;

namespace {

template <typename T>
struct Dev {
    explicit Dev(size_t n) : n(n) { CUDA_CHECK(cudaMalloc(&p, n * sizeof(T))); }
    ~Dev() { cudaFree(p); }
    std::vector<T> get() const {
        std::vector<T> h(n);
        CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
    T* p = nullptr;
    size_t n;
};

// out[k * 64 + lane]: the k-th collective's result in each lane of two warps.
__global__ void warp_ops_kernel(int* out) {
    const int lane = int(threadIdx.x) & 31, t = int(threadIdx.x);
    const int v = 100 * (t / 32) + lane;
    int k = 0;
    out[64 * k++ + t] = __shfl_xor_sync(0xffffffffu, v, 5);
    out[64 * k++ + t] = __shfl_xor_sync(0xffffffffu, v, 4, 8);
    out[64 * k++ + t] = __shfl_down_sync(0xffffffffu, v, 3, 8);
    out[64 * k++ + t] = __shfl_up_sync(0xffffffffu, v, 2, 16);
    out[64 * k++ + t] = __shfl_sync(0xffffffffu, v, 9, 8);
    out[64 * k++ + t] = __shfl_sync(0xffffffffu, v, 33);
    out[64 * k++ + t] = int(__ballot_sync(0xffffffffu, lane % 3 == 0));
    out[64 * k++ + t] = __any_sync(0xffffffffu, t == 40);
    out[64 * k++ + t] = __all_sync(0xffffffffu, lane < 31);
    out[64 * k++ + t] = int(__match_any_sync(0xffffffffu, lane / 4 + (t / 32)));
    // Two half-warps meeting at separate collectives with their own masks.
    if (lane < 16) out[64 * k + t] = __shfl_xor_sync(0x0000ffffu, v, 1);
    else out[64 * k + t] = __shfl_down_sync(0xffff0000u, v, 1, 16);
}

TEST(CudaEmulator, WarpCollectivesFollowCudaDefinitions) {
    constexpr int K = 11;
    Dev<int> out(64 * K);
    launch_plain("warp_ops_kernel", warp_ops_kernel, dim3(1), dim3(64), 0, nullptr, out.p);
    const std::vector<int> got = out.get();
    for (int t = 0; t < 64; ++t) {
        const int lane = t & 31, w = 100 * (t / 32);
        auto val = [&](int l) { return w + l; };
        const int base8 = lane & ~7, base16 = lane & ~15;
        unsigned ballot = 0;
        for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
        unsigned match = 0;
        for (int l = 0; l < 32; ++l)
            if (l / 4 == lane / 4) match |= 1u << l;
        const int want[K] = {val(lane ^ 5),
                             val(lane ^ 4),
                             lane + 3 < base8 + 8 ? val(lane + 3) : val(lane),
                             lane - 2 >= base16 ? val(lane - 2) : val(lane),
                             val(base8 + 1),
                             val(1),
                             int(ballot),
                             t >= 32,
                             0,
                             int(match),
                             lane < 16 ? val(lane ^ 1) : (lane + 1 < 32 ? val(lane + 1) : val(lane))};
        for (int k = 0; k < K; ++k) EXPECT_EQ(got[size_t(64 * k + t)], want[k]) << "collective " << k << " thread " << t;
    }
}

// out[t] = the value thread (t + 1) % n wrote, read after a barrier (or without one).
template <bool kBarrier>
__global__ void neighbour_kernel(int* out, int seed) {
    __shared__ int s[256];
    const int t = int(threadIdx.x), n = int(blockDim.x);
    s[t] = seed + t;
    if (kBarrier) __syncthreads();
    out[t] = s[(t + 1) % n];
}

TEST(CudaEmulator, BarrierMakesSharedWritesVisible) {
    Dev<int> out(256);
    launch_plain("neighbour_kernel", neighbour_kernel<true>, dim3(1), dim3(256), 0, nullptr, out.p, 1000);
    const std::vector<int> got = out.get();
    for (int t = 0; t < 256; ++t) EXPECT_EQ(got[size_t(t)], 1000 + (t + 1) % 256);
}

// Without the barrier a thread reads its neighbour's slot before (forward order: all but the
// last thread) or, for the wrap-around, after (reverse order) it is written: some read is stale
// in either order, which is how the emulator shows a missing __syncthreads.
TEST(CudaEmulator, MissingBarrierShowsInEitherOrder) {
    Dev<int> out(256);
    launch_plain("neighbour_kernel", neighbour_kernel<false>, dim3(1), dim3(256), 0, nullptr, out.p, 5000);
    const std::vector<int> got = out.get();
    int stale = 0;
    for (int t = 0; t < 256; ++t) stale += got[size_t(t)] != 5000 + (t + 1) % 256;
    EXPECT_GT(stale, 0);
}

// Two rounds of a block sum through shared memory: each warp adds up its lanes by shuffles and
// lane 0 stores the warp's sum in s[warp]; after a barrier warp 0 adds up s[]. Without the barrier
// at the end of a round, a warp that runs on through the next round's shuffles rewrites its s[]
// slot before warp 0 has read it.
template <bool kEndBarrier>
__global__ void two_round_sum_kernel(int* out) {
    __shared__ int s[8];
    const int t = int(threadIdx.x), warp = t >> 5, lane = t & 31, warps = int(blockDim.x) >> 5;
    for (int round = 0; round < 2; ++round) {
        int v = (round + 1) * 1000 + t;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) s[warp] = v;
        __syncthreads();
        if (t == 0) {
            int sum = 0;
            for (int w = 0; w < warps; ++w) sum += s[w];
            out[round] = sum;
        }
        if (kEndBarrier) __syncthreads();
    }
}

// The forward order moves the warps in lockstep (every collective ends a sweep), so it cannot
// show the second barrier missing; the reverse order lets each warp run ahead through its
// shuffles to its next block-wide wait, and the stale read appears.
TEST(CudaEmulator, ReverseOrderLetsAWarpRunAheadThroughItsShuffles) {
    const char* order = std::getenv("SHARDLM_EMU_ORDER");
    const bool reverse = order && std::string(order) == "reverse";
    const int want[2] = {256 * 1000 + 255 * 128, 256 * 2000 + 255 * 128};
    Dev<int> out(2);
    launch_plain("two_round_sum_kernel", two_round_sum_kernel<true>, dim3(1), dim3(256), 0, nullptr, out.p);
    std::vector<int> got = out.get();
    EXPECT_EQ(got[0], want[0]);
    EXPECT_EQ(got[1], want[1]);
    launch_plain("two_round_sum_kernel", two_round_sum_kernel<false>, dim3(1), dim3(256), 0, nullptr, out.p);
    got = out.get();
    if (reverse) EXPECT_NE(got[0], want[0]) << "the missing barrier went unnoticed";
    else EXPECT_EQ(got[0], want[0]);
    EXPECT_EQ(got[1], want[1]);
}

__global__ void dynamic_smem_kernel(float* out, int n) {
    SHARDLM_DYNAMIC_SMEM(float, buf);
    for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) buf[i] = float(i + int(blockIdx.x));
    __syncthreads();
    const int t = int(threadIdx.x);
    if (t < n) out[int(blockIdx.x) * n + t] = buf[n - 1 - t];
}

TEST(CudaEmulator, DynamicSharedMemoryPerBlockAndItsLimit) {
    const int n = 20000;  // 80000 bytes: more than the default 48 KiB
    Dev<float> out(size_t(3) * n);
    EXPECT_THROW(launch_plain("dynamic_smem_kernel", dynamic_smem_kernel, dim3(3), dim3(1024), size_t(n) * 4, nullptr,
                              out.p, n),
                 Error);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);  // a failed launch is also the last error
    auto kernel = dynamic_smem_kernel;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4));
    launch_plain("dynamic_smem_kernel", dynamic_smem_kernel, dim3(3), dim3(1024), size_t(n) * 4, nullptr, out.p, n);
    const std::vector<float> got = out.get();
    for (int b = 0; b < 3; ++b)
        for (int t = 0; t < 1024; ++t) ASSERT_EQ(got[size_t(b * n + t)], float(n - 1 - t + b));
}

TEST(CudaEmulator, LaunchConfigurationsAreChecked) {
    Dev<int> out(2048);
    EXPECT_THROW(launch_plain("neighbour_kernel", neighbour_kernel<true>, dim3(1), dim3(2048), 0, nullptr, out.p, 0),
                 Error);
    EXPECT_THROW(launch_plain("neighbour_kernel", neighbour_kernel<true>, dim3(1, 70000), dim3(32), 0, nullptr, out.p, 0),
                 Error);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
}

__global__ void add_kernel(float* x, float v, int n) {
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) x[i] += v;
}

TEST(CudaEmulator, GraphsReplayCapturedWorkAndRejectSynchronousCalls) {
    const int n = 100;
    Dev<float> x(n);
    CUDA_CHECK(cudaMemset(x.p, 0, n * 4));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    launch_plain("add_kernel", add_kernel, dim3(4), dim3(32), 0, s, x.p, 2.0f, n);  // 2.0 is captured
    CUDA_CHECK(cudaMemsetAsync(x.p, 0, 4, s));
    cudaGraph_t g;
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    EXPECT_EQ(x.get()[1], 0.0f);  // nothing ran during the capture
    cudaGraphExec_t e;
    CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    for (int i = 0; i < 3; ++i) CUDA_CHECK(cudaGraphLaunch(e, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    const std::vector<float> got = x.get();
    EXPECT_EQ(got[0], 0.0f);
    EXPECT_EQ(got[1], 6.0f);
    EXPECT_EQ(got[99], 6.0f);
    CUDA_CHECK(cudaGraphExecDestroy(e));
    CUDA_CHECK(cudaGraphDestroy(g));

    // A synchronous copy during a capture fails and invalidates it, as on a GPU.
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    float h = 0.0f;
    EXPECT_NE(cudaMemcpy(&h, x.p, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaGetLastError();
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(CudaEmulator, CopiesStayInsideAllocations) {
    Dev<float> x(10);
    std::vector<float> h(20);
    EXPECT_EQ(cudaMemcpy(x.p, h.data(), 40, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_NE(cudaMemcpy(x.p, h.data(), 44, cudaMemcpyHostToDevice), cudaSuccess);            // past the end
    EXPECT_NE(cudaMemcpy(h.data(), h.data() + 10, 40, cudaMemcpyDeviceToHost), cudaSuccess);  // not device memory
    EXPECT_NE(cudaMemset(x.p + 5, 0, 24), cudaSuccess);
    cudaGetLastError();
}

// ---- The faults the emulator stops at (death tests: each runs in a child process).

__global__ void deadlock_kernel(int* out) {
    if (threadIdx.x < 16) __syncthreads();
    else __syncwarp();
    out[threadIdx.x] = 1;
}

__global__ void exited_lane_kernel(int* out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, int(threadIdx.x), 1);
}

__global__ void outside_mask_kernel(int* out) {
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, int(threadIdx.x), 20);
}

__global__ void smem_overrun_kernel(float* out) {
    SHARDLM_DYNAMIC_SMEM(float, buf);
    buf[16 + threadIdx.x] = 1.0f;  // 64 bytes (16 floats) were asked for
    out[threadIdx.x] = buf[0];
}

__global__ void barrier_after_exit_kernel(int* out) {
    if (threadIdx.x >= 32) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void overrun_kernel(const float* x, float* out, int n) {
    out[threadIdx.x] = x[threadIdx.x + n];  // one past the end for the last thread
}

__global__ void misaligned_kernel(const float* x, float* out) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(x + 1));
    out[0] = v.x;
}

TEST(CudaEmulatorDeathTest, StopsAtBugsNamingTheKernel) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    Dev<int> out(64);
    Dev<float> f(64);
    EXPECT_DEATH(launch_plain("deadlock_kernel", deadlock_kernel, dim3(1), dim3(32), 0, nullptr, out.p),
                 "deadlock_kernel.*(deadlock|different)");
    EXPECT_DEATH(launch_plain("exited_lane_kernel", exited_lane_kernel, dim3(1), dim3(32), 0, nullptr, out.p),
                 "exited_lane_kernel.*have exited");
    EXPECT_DEATH(launch_plain("outside_mask_kernel", outside_mask_kernel, dim3(1), dim3(32), 0, nullptr, out.p),
                 "outside_mask_kernel.*not in the mask");
    EXPECT_DEATH(launch_plain("smem_overrun_kernel", smem_overrun_kernel, dim3(1), dim3(32), 64, nullptr, f.p),
                 "smem_overrun_kernel.*past the end|SEGV");
    EXPECT_DEATH(launch_plain("misaligned_kernel", misaligned_kernel, dim3(1), dim3(1), 0, nullptr, f.p, f.p),
                 "misaligned_kernel.*misaligned");
    EXPECT_DEATH(launch_plain("barrier_after_exit_kernel", barrier_after_exit_kernel, dim3(1), dim3(64), 0, nullptr,
                              out.p),
                 "barrier_after_exit_kernel.*__syncthreads reached after other threads of the block exited");
#if defined(__SANITIZE_ADDRESS__)
    // Device memory is an exact-size heap block: ASan sees a read one element past it.
    EXPECT_DEATH(launch_plain("overrun_kernel", overrun_kernel, dim3(1), dim3(32), 0, nullptr, f.p + 32, f.p, 1),
                 "heap-buffer-overflow");
#endif
    std::vector<float> host(64);
    EXPECT_DEATH(launch_plain("add_kernel", add_kernel, dim3(1), dim3(32), 0, nullptr, host.data(), 1.0f, 64),
                 "add_kernel, argument 0 .*host pointer");
}

}  // namespace
