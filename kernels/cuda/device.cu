#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/mma_check.h"

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

double cuda_peak_gbps() {
    int dev = 0, khz = 0, bits = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev));
    return 2.0 * double(khz) * 1e3 * double(bits) / 8.0 / 1e9;
}

bool pdl_enabled() {
    // Read once per process: every rank drives one device, and this runs at every launch.
    static const bool on = [] {
        const char* v = std::getenv("SHARDLM_PDL");
        if (v && v[0] == '0') return false;
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
        return major >= 9;
    }();
    return on;
}
std::string cuda_tuning_env(const char* name, std::initializer_list<const char*> allowed, const char* what) {
    const char* v = std::getenv(name);
    if (!v || !*v) return "";
    std::string list;
    for (const char* a : allowed) {
        if (std::strcmp(v, a) == 0) return v;
        list += (list.empty() ? "" : ", ") + std::string(a);
    }
    fail(name, "=", v, ": ", what, " must be one of ", list, " (or unset)");
}

bool prefill_tensor_cores() {
    static const bool on = [] {
        if (cuda_tuning_env("SHARDLM_PREFILL_TC", {"0", "1"}, "attention prefill on tensor cores") == "0") return false;
        int dev = 0, major = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        return major >= 8 && mma_layout_holds();
    }();
    return on;
}

bool decode_rope_fused() {
    static const bool on =
        cuda_tuning_env("SHARDLM_FUSED_ROPE", {"0", "1"}, "the RoPE prologue fused into decode attention") != "0";
    return on;
}

bool int8_gemm_staging() {
    static const bool on =
        cuda_tuning_env("SHARDLM_GEMM_STAGE", {"0", "1"}, "INT8 prefill dequantization staged ahead") == "1";
    return on;
}

int cuda_sm_count() {
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
}

void cuda_after_launch(cudaStream_t stream, const char* kernel) {
    const cudaError_t e = cudaGetLastError();
    SHARDLM_CHECK_GEN("CUDA launch", e == cudaSuccess, kernel, cudaGetErrorString(e));
    // Read once: this runs after every launch of every step (eager decode runs ~200 per step).
    static const bool debug_sync = [] {
        const char* v = std::getenv("SHARDLM_DEBUG_SYNC");
        return v && v[0] == '1';
    }();
    if (!debug_sync) return;
    // A stream being captured into a graph cannot be synchronised; the replay is checked instead.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) return;
    const cudaError_t s = cudaStreamSynchronize(stream);
    SHARDLM_CHECK_GEN("CUDA kernel", s == cudaSuccess, kernel, cudaGetErrorString(s));
}

}  // namespace shardlm
