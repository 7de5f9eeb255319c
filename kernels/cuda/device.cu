#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"

namespace shardlm {

int cuda_usable_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no driver" error
        return 0;
    }
    // A listed device may still refuse a context (e.g. compute mode prohibited).
    if (n > 0 && cudaFree(nullptr) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

std::string cuda_device_description(int index) {
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, index));
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f GiB", double(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
    return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " + mem + ")";
}

void cuda_after_launch(cudaStream_t stream, const char* kernel) {
    const cudaError_t e = cudaGetLastError();
    SHARDLM_CHECK_GEN("CUDA launch", e == cudaSuccess, kernel, cudaGetErrorString(e));
    const char* sync = std::getenv("SHARDLM_DEBUG_SYNC");
    if (sync && sync[0] == '1') {
        const cudaError_t s = cudaStreamSynchronize(stream);
        SHARDLM_CHECK_GEN("CUDA kernel", s == cudaSuccess, kernel, cudaGetErrorString(s));
    }
}

}  // namespace shardlm
