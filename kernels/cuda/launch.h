// Kernel launches with programmatic dependent launch (PDL, sm_90 and later).
//
// A decode step is ~300 small dependent kernels; between two of them the GPU normally drains the
// first grid completely before it starts scheduling the second, a gap of a few microseconds each
// that adds up to a good part of a step at batch 1. Launched with the programmatic-serialization
// attribute, the next kernel's blocks are scheduled as soon as every block of the running one has
// signalled (pdl_launch_dependents) or exited; they set up, prefetch what does not depend on the
// running kernel (the GEMV's weights), and block in pdl_wait() until the running grid has
// completed and its writes are visible. The attribute is recorded by stream capture, so CUDA
// Graph replays keep the overlap.
//
// The contract for every kernel launched through launch_kernel(): call pdl_wait() before the
// first read of anything an earlier kernel wrote and before the first write of anything an
// earlier kernel reads. Every such kernel waits, so the guarantee is transitive: when kernel C
// passes its wait, B has completed, and B could not complete before its own wait saw A complete.
// Each also waits before it signals, so a kernel's blocks start only once the kernel two back
// has completed: data older than the kernel just before (weights, an earlier step's KV rows, the
// step's tables copied in before it) may be read before the wait (the decode GEMV and attention do).
// (Kernels launched the plain way, launch_plain below, cuBLAS's and memcpys included, keep full
// serialisation.)
// Without PDL (older GPUs, SHARDLM_PDL=0 for A/B measurements) both calls are no-ops.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"

namespace shardlm {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel's blocks be scheduled (they still wait in pdl_wait() for this grid to finish).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when `pdl`, and the
// launch checked like every other (cuda_after_launch). Under the CPU emulator (tests/cuda_emu,
// SHARDLM_CUDA_EMU) the emulator runs the kernel: it needs the argument types, which
// cudaLaunchKernelEx's untyped C call loses.
template <typename... Params, typename... Args>
void launch_checked(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                    cudaStream_t stream, bool pdl, Args&&... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
#ifdef SHARDLM_CUDA_EMU
    const cudaError_t e = ::shardlm_emu::launch(name, cfg, kernel, std::forward<Args>(args)...);
#else
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
#endif
    SHARDLM_CHECK_GEN("CUDA launch", e == cudaSuccess, name, cudaGetErrorString(e));
    cuda_after_launch(stream, name);
}

// The launch of every kernel that follows the pdl_wait() contract above: with the PDL attribute
// when pdl_enabled() (kernels/cuda/device.h).
template <typename... Params, typename... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
    launch_checked(name, kernel, grid, block, smem, stream, pdl_enabled(), std::forward<Args>(args)...);
}

// kernel<<<grid, block, smem, stream>>>(args...) exactly: no PDL attribute, for kernels that do
// not call pdl_wait() (they keep full serialisation with the kernel before them). A function
// rather than <<<>>> so that g++ compiles these files for the emulator, which sees every launch.
template <typename... Params, typename... Args>
void launch_plain(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                  cudaStream_t stream, Args&&... args) {
    launch_checked(name, kernel, grid, block, smem, stream, false, std::forward<Args>(args)...);
}

}  // namespace shardlm

// Declares `name`, the launch's dynamic shared memory as an array of T (16-byte aligned):
// `extern __shared__` under nvcc; under the emulator a pointer to the running block's buffer
// (an extern array cannot be one buffer per block on the CPU).
#ifdef SHARDLM_CUDA_EMU
#define SHARDLM_DYNAMIC_SMEM(T, name) T* const name = static_cast<T*>(::shardlm_emu::dynamic_smem())
#else
#define SHARDLM_DYNAMIC_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif
