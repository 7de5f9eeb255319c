// The CUDA runtime API the project calls, on host memory: one emulated device ("shardlm CUDA
// emulator", compute capability 9.0), device memory from the host heap, synchronous streams,
// events, and graphs recorded by stream capture.
//
// Streams run every operation at the call, in call order, so any order a stream, an event or a
// synchronisation would impose holds. A stream being captured records its operations instead
// (kernel arguments copied at capture, copies and sets by their pointers), and cudaGraphLaunch
// replays them in order, reading memory as it is at the replay: what a real graph does.
//
// The checks a real device makes are made here too, with the same errors: launch configurations,
// memcpy and memset ranges inside one allocation (and no host pointer where a device pointer
// belongs), and the calls that break a capture in global and thread-local mode (a synchronous
// copy, a malloc, a device synchronisation), which invalidate it as CUDA does.
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <cstring>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "tests/cuda_emu/emu.h"
#include "tests/cuda_emu/emu_internal.h"

// The runtime's opaque handles, defined here (the headers only declare them).
struct CUstream_st {
    unsigned flags = 0;
    bool capturing = false, invalidated = false;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::vector<std::function<void()>> captured;
};

struct CUevent_st {
    unsigned flags = 0;
    bool recorded = false;
    std::chrono::steady_clock::time_point when;
};

struct CUgraph_st {
    std::vector<std::function<void()>> ops;
};

struct CUgraphExec_st {
    std::shared_ptr<const std::vector<std::function<void()>>> ops;
};

namespace shardlm_emu {
namespace {

constexpr size_t kDeviceBytes = size_t(16) << 30;  // what cudaMemGetInfo reports as total
constexpr int kSMs = 8;
constexpr size_t kSmemDefault = size_t(48) << 10, kSmemOptin = size_t(227) << 10;

// The emulated device. One host thread drives it (the emulator runs kernels on the caller).
struct Device {
    std::map<uintptr_t, size_t> allocs;  // device allocations: start -> bytes
    std::map<uintptr_t, size_t> pinned;  // cudaMallocHost: start -> bytes
    size_t used = 0;
    std::set<cudaStream_t> streams;
    std::set<cudaEvent_t> events;
    std::map<const void*, size_t> smem_limit;  // cudaFuncAttributeMaxDynamicSharedMemorySize
    int captures = 0;  // streams capturing in global or thread-local mode
    cudaError_t last = cudaSuccess;
};

Device dev;

cudaError_t fail(cudaError_t e) {
    dev.last = e;
    return e;
}

bool poison_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("SHARDLM_EMU_POISON");
        return !(v && v[0] == '0');
    }();
    return on;
}

// The allocation holding p, or allocs.end().
std::map<uintptr_t, size_t>::const_iterator find_alloc(const void* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = dev.allocs.upper_bound(a);
    if (it == dev.allocs.begin()) return dev.allocs.end();
    --it;
    return a < it->first + std::max<size_t>(it->second, 1) ? it : dev.allocs.end();
}

bool valid_stream(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread || dev.streams.count(s); }

// A call that a capture in global or thread-local mode forbids (it would synchronise with, or
// allocate under, the capturing stream): CUDA fails it and invalidates every such capture.
cudaError_t capture_forbids(cudaError_t e) {
    if (dev.captures == 0) return cudaSuccess;
    for (cudaStream_t s : dev.streams)
        if (s->capturing && s->mode != cudaStreamCaptureModeRelaxed) s->invalidated = true;
    return fail(e);
}

// What a copy's pointers must be: device memory where `kind` says so (the whole range inside one
// allocation), and not device memory where it says host.
cudaError_t check_side(const void* p, size_t bytes, bool device) {
    if (bytes == 0) return cudaSuccess;
    const bool in = is_device_range(p, bytes);
    if (device && !in) return cudaErrorInvalidValue;
    if (!device && find_alloc(p) != dev.allocs.end()) return cudaErrorInvalidValue;
    return cudaSuccess;
}

cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    bool dd, sd;
    switch (kind) {
        case cudaMemcpyHostToHost: dd = sd = false; break;
        case cudaMemcpyHostToDevice: dd = true, sd = false; break;
        case cudaMemcpyDeviceToHost: dd = false, sd = true; break;
        case cudaMemcpyDeviceToDevice: dd = sd = true; break;
        case cudaMemcpyDefault:
            dd = find_alloc(dst) != dev.allocs.end();
            sd = find_alloc(src) != dev.allocs.end();
            break;
        default: return cudaErrorInvalidMemcpyDirection;
    }
    if (check_side(dst, bytes, dd) != cudaSuccess || check_side(src, bytes, sd) != cudaSuccess) {
        std::fprintf(stderr, "shardlm CUDA emulator: cudaMemcpy of %zu bytes from %p to %p (kind %d): %s\n", bytes, src,
                     dst, int(kind), "a pointer is outside device memory, or a host pointer is device memory");
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

cudaError_t copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                    cudaMemcpyKind kind) {
    if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
    if (height == 0 || width == 0) return cudaSuccess;
    const size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
    cudaError_t e = check_copy(dst, src, 0, kind);
    if (e == cudaSuccess) {
        const bool dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
        const bool sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
        if (check_side(dst, dspan, dd) != cudaSuccess || check_side(src, sspan, sd) != cudaSuccess) e = cudaErrorInvalidValue;
    }
    return e;
}

const char* error_name(cudaError_t e) {
    switch (e) {
#define NAME(x) \
    case x: return #x;
        NAME(cudaSuccess) NAME(cudaErrorInvalidValue) NAME(cudaErrorMemoryAllocation) NAME(cudaErrorInvalidConfiguration)
        NAME(cudaErrorInvalidPitchValue) NAME(cudaErrorInvalidMemcpyDirection) NAME(cudaErrorInvalidDevice)
        NAME(cudaErrorInvalidResourceHandle) NAME(cudaErrorNotReady) NAME(cudaErrorNotSupported)
        NAME(cudaErrorIllegalState) NAME(cudaErrorStreamCaptureUnsupported) NAME(cudaErrorStreamCaptureInvalidated)
        NAME(cudaErrorStreamCaptureImplicit) NAME(cudaErrorStreamCaptureUnmatched) NAME(cudaErrorNoDevice)
        NAME(cudaErrorInvalidDeviceFunction) NAME(cudaErrorLaunchOutOfResources)
#undef NAME
        default: return "cudaErrorUnknown";
    }
}

}  // namespace

void announce() {
    static const bool once = [] {
        std::fprintf(stderr, "shardlm CUDA emulator (tests/cuda_emu): CUDA calls run on the CPU, not on a GPU "
                             "(schedule order %s)\n", reverse_order() ? "reverse" : "forward");
        return true;
    }();
    (void)once;
}

bool is_device_range(const void* p, size_t bytes) {
    const auto it = find_alloc(p);
    if (it == dev.allocs.end()) return false;
    return reinterpret_cast<uintptr_t>(p) + bytes <= it->first + it->second;
}

void check_pointer_argument(const char* kernel, int index, const void* p) {
    if (!p) return;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    for (const auto* m : {&dev.allocs, &dev.pinned}) {
        auto it = m->upper_bound(a);
        if (it != m->begin() && a <= std::prev(it)->first + std::prev(it)->second) return;
    }
    std::fprintf(stderr, "shardlm CUDA emulator: kernel %s, argument %d is %p, which is neither device memory nor "
                 "pinned host memory (a host pointer the GPU cannot read)\n", kernel, index, p);
    std::fflush(stderr);
    std::abort();
}

size_t max_dynamic_smem(const void* fn) {
    const auto it = dev.smem_limit.find(fn);
    return it == dev.smem_limit.end() ? kSmemDefault : it->second;
}

cudaError_t enqueue(cudaStream_t s, std::function<void()> op) {
    if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
    if (s && s != cudaStreamLegacy && s != cudaStreamPerThread && s->capturing) {
        s->captured.push_back(std::move(op));
        return cudaSuccess;
    }
    // The legacy stream synchronises with every blocking stream, a capturing one included.
    if (s == nullptr || s == cudaStreamLegacy)
        for (cudaStream_t c : dev.streams)
            if (c->capturing && !(c->flags & cudaStreamNonBlocking)) {
                c->invalidated = true;
                return fail(cudaErrorStreamCaptureImplicit);
            }
    op();
    return cudaSuccess;
}

cudaError_t submit_launch(const char* name, const void* fn, const cudaLaunchConfig_t& cfg, std::function<void()> body) {
    announce();
    const dim3 g = cfg.gridDim, b = cfg.blockDim;
    const uint64_t threads = uint64_t(b.x) * b.y * b.z;
    if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535 || threads == 0 ||
        threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64) {
        std::fprintf(stderr, "shardlm CUDA emulator: launch of %s with grid (%u,%u,%u), block (%u,%u,%u)\n", name, g.x,
                     g.y, g.z, b.x, b.y, b.z);
        return fail(cudaErrorInvalidConfiguration);
    }
    if (cfg.dynamicSmemBytes > max_dynamic_smem(fn)) {
        std::fprintf(stderr, "shardlm CUDA emulator: launch of %s with %zu bytes of dynamic shared memory, %zu allowed "
                     "(cudaFuncSetAttribute raises the 48 KiB default)\n", name, cfg.dynamicSmemBytes,
                     max_dynamic_smem(fn));
        return fail(cudaErrorInvalidValue);
    }
    for (unsigned i = 0; i < cfg.numAttrs; ++i)
        if (cfg.attrs[i].id != cudaLaunchAttributeProgrammaticStreamSerialization) return fail(cudaErrorNotSupported);
    const size_t smem = cfg.dynamicSmemBytes;
    return enqueue(cfg.stream, [name, g, b, smem, body = std::move(body)] { run_grid(name, g, b, smem, body); });
}

}  // namespace shardlm_emu

using namespace shardlm_emu;

// ---- Device and errors.

namespace {

// SHARDLM_EMU_DEVICES=N (1..64, default 1) emulated devices, all backed by this process's memory:
// a tensor-parallel test under mpirun gives each rank of the node "its own GPU" (the session's
// one-rank-per-GPU check) while the ranks' data plane is the MPI communicator on host memory.
int device_count() {
    static const int n = [] {
        const char* e = std::getenv("SHARDLM_EMU_DEVICES");
        if (!e || !*e) return 1;
        char* end = nullptr;
        const long v = std::strtol(e, &end, 10);
        if (*end != '\0' || v < 1 || v > 64) {
            std::fprintf(stderr, "shardlm CUDA emulator: SHARDLM_EMU_DEVICES=%s is not a count in 1..64\n", e);
            std::abort();
        }
        return int(v);
    }();
    return n;
}
int current_device = 0;

}  // namespace

cudaError_t cudaGetDeviceCount(int* count) {
    announce();
    *count = device_count();
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    std::memset(p, 0, sizeof *p);
    std::snprintf(p->name, sizeof p->name, "shardlm CUDA emulator");
    p->totalGlobalMem = kDeviceBytes;
    p->sharedMemPerBlock = kSmemDefault;
    p->sharedMemPerBlockOptin = kSmemOptin;
    p->sharedMemPerMultiprocessor = size_t(228) << 10;
    p->regsPerBlock = p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = kSMs;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxBlocksPerMultiProcessor = 32;
    p->memoryBusWidth = 64;
    p->l2CacheSize = 1 << 20;
    p->unifiedAddressing = 1;
    p->concurrentKernels = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    switch (attr) {
        case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
        case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
        case cudaDevAttrMultiProcessorCount: *value = kSMs; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = int(kSmemDefault); break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(kSmemOptin); break;
        case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
        case cudaDevAttrWarpSize: *value = 32; break;
        case cudaDevAttrMemoryClockRate: *value = 1000000; break;  // kHz: with 64 bits, 16 GB/s "peak"
        case cudaDevAttrGlobalMemoryBusWidth: *value = 64; break;
        case cudaDevAttrL2CacheSize: *value = 1 << 20; break;
        default:
            std::fprintf(stderr, "shardlm CUDA emulator: cudaDeviceGetAttribute(%d) is not emulated\n", int(attr));
            return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
    if (dev.captures > 0) return capture_forbids(cudaErrorStreamCaptureUnsupported);
    return cudaSuccess;
}

cudaError_t cudaGetLastError() {
    const cudaError_t e = dev.last;
    dev.last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError() { return dev.last; }

const char* cudaGetErrorName(cudaError_t e) { return error_name(e); }

const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorMemoryAllocation: return "out of memory (shardlm CUDA emulator)";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument (shardlm CUDA emulator)";
        case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture (shardlm CUDA emulator)";
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (shardlm CUDA emulator)";
        case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream (shardlm CUDA emulator)";
        default: return error_name(e);
    }
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    if (!func) return fail(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || size_t(value) > kSmemOptin) return fail(cudaErrorInvalidValue);
        dev.smem_limit[func] = size_t(value);
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    return fail(cudaErrorNotSupported);
}

// The emulator has no register file or shared-memory carveout to model: one block of any kernel
// per SM, so a grid sized by occupancy (gemv_cuda's persistent grid) is as small as it gets here
// and its blocks loop over the most work.
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, const void* func, int block_size,
                                                          size_t dynamic_smem) {
    if (!func) return fail(cudaErrorInvalidDeviceFunction);
    if (block_size <= 0 || block_size > 1024 || dynamic_smem > max_dynamic_smem(func)) return fail(cudaErrorInvalidValue);
    *num_blocks = 1;
    return cudaSuccess;
}

// Untyped launches cannot be emulated (the argument types are gone): kernels/cuda/launch.h calls
// shardlm_emu::launch instead.
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t*, const void*, void**) {
    std::fprintf(stderr, "shardlm CUDA emulator: untyped launch (cudaLaunchKernelExC); launch through kernels/cuda/launch.h\n");
    return fail(cudaErrorNotSupported);
}

cudaError_t cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t) {
    std::fprintf(stderr, "shardlm CUDA emulator: untyped launch (cudaLaunchKernel); launch through kernels/cuda/launch.h\n");
    return fail(cudaErrorNotSupported);
}

// ---- Memory.

cudaError_t cudaMalloc(void** p, size_t bytes) {
    announce();
    *p = nullptr;
    if (dev.captures > 0) return capture_forbids(cudaErrorStreamCaptureUnsupported);
    if (bytes == 0) return cudaSuccess;
    if (bytes > kDeviceBytes - dev.used) return fail(cudaErrorMemoryAllocation);
    // Exactly `bytes` (AddressSanitizer then sees an overrun past the end), 256-byte aligned as
    // cudaMalloc promises.
    if (posix_memalign(p, 256, bytes) != 0) {
        *p = nullptr;
        return fail(cudaErrorMemoryAllocation);
    }
    // Fresh device memory is not zeroed; all bits set (NaN as floats) makes a read of it show.
    std::memset(*p, poison_enabled() ? 0xff : 0, bytes);
    dev.allocs[reinterpret_cast<uintptr_t>(*p)] = bytes;
    dev.used += bytes;
    return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
    announce();
    if (!p) return cudaSuccess;
    if (dev.captures > 0) return capture_forbids(cudaErrorStreamCaptureUnsupported);
    const auto it = dev.allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == dev.allocs.end()) return fail(cudaErrorInvalidValue);
    dev.used -= it->second;
    dev.allocs.erase(it);
    std::free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    if (posix_memalign(p, 256, bytes) != 0) {
        *p = nullptr;
        return fail(cudaErrorMemoryAllocation);
    }
    dev.pinned[reinterpret_cast<uintptr_t>(*p)] = bytes;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) { return cudaMallocHost(p, bytes); }

cudaError_t cudaFreeHost(void* p) {
    if (!p) return cudaSuccess;
    if (!dev.pinned.erase(reinterpret_cast<uintptr_t>(p))) return fail(cudaErrorInvalidValue);
    std::free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    *free_bytes = kDeviceBytes - dev.used;
    *total = kDeviceBytes;
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    if (const cudaError_t e = check_copy(dst, src, bytes, kind); e != cudaSuccess) return fail(e);
    return enqueue(s, [dst, src, bytes] { std::memmove(dst, src, bytes); });
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (dev.captures > 0) return capture_forbids(cudaErrorStreamCaptureImplicit);
    return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t s) {
    if (const cudaError_t e = copy_2d(dst, dpitch, src, spitch, width, height, kind); e != cudaSuccess) return fail(e);
    return enqueue(s, [=] {
        for (size_t r = 0; r < height; ++r)
            std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    });
}

cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind kind) {
    if (dev.captures > 0) return capture_forbids(cudaErrorStreamCaptureImplicit);
    return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
    if (bytes > 0 && !is_device_range(p, bytes)) {
        std::fprintf(stderr, "shardlm CUDA emulator: cudaMemset of %zu bytes at %p: not inside one device allocation\n",
                     bytes, p);
        return fail(cudaErrorInvalidValue);
    }
    return enqueue(s, [p, value, bytes] { std::memset(p, value, bytes); });
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
    if (dev.captures > 0) return capture_forbids(cudaErrorStreamCaptureImplicit);
    return cudaMemsetAsync(p, value, bytes, nullptr);
}

// ---- Streams and events.

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    announce();
    *s = new CUstream_st;
    (*s)->flags = flags;
    dev.streams.insert(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!dev.streams.count(s)) return fail(cudaErrorInvalidResourceHandle);
    if (s->capturing) return fail(cudaErrorIllegalState);
    dev.streams.erase(s);
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
    if (s && s != cudaStreamLegacy && s != cudaStreamPerThread && s->capturing) {
        s->invalidated = true;
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if ((s == nullptr || s == cudaStreamLegacy) && dev.captures > 0) return capture_forbids(cudaErrorStreamCaptureImplicit);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
    *e = new CUevent_st;
    (*e)->flags = flags;
    dev.events.insert(*e);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!dev.events.erase(e)) return fail(cudaErrorInvalidResourceHandle);
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!dev.events.count(e)) return fail(cudaErrorInvalidResourceHandle);
    return enqueue(s, [e] {
        e->recorded = true;
        e->when = std::chrono::steady_clock::now();
    });
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!dev.events.count(e)) return fail(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    if (!dev.events.count(a) || !dev.events.count(b)) return fail(cudaErrorInvalidResourceHandle);
    if ((a->flags | b->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
    if (!a->recorded || !b->recorded) return fail(cudaErrorNotReady);
    *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
    if (!valid_stream(s) || !dev.events.count(e)) return fail(cudaErrorInvalidResourceHandle);
    return cudaSuccess;  // the event's work is done: everything runs at the call
}

// ---- Graphs by stream capture.

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    if (s == nullptr || s == cudaStreamLegacy) return fail(cudaErrorStreamCaptureUnsupported);
    if (!dev.streams.count(s)) return fail(cudaErrorInvalidResourceHandle);
    if (s->capturing) return fail(cudaErrorIllegalState);
    s->capturing = true;
    s->invalidated = false;
    s->mode = mode;
    s->captured.clear();
    if (mode != cudaStreamCaptureModeRelaxed) ++dev.captures;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
    if (!dev.streams.count(s)) return fail(cudaErrorInvalidResourceHandle);
    if (!s->capturing) return fail(cudaErrorIllegalState);
    s->capturing = false;
    if (s->mode != cudaStreamCaptureModeRelaxed) --dev.captures;
    *graph = nullptr;
    if (s->invalidated) {
        s->captured.clear();
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *graph = new CUgraph_st;
    (*graph)->ops = std::move(s->captured);
    s->captured.clear();
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
    if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
    *status = cudaStreamCaptureStatusNone;
    if (s && s != cudaStreamLegacy && s != cudaStreamPerThread && s->capturing)
        *status = s->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
    if (!graph) return fail(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st;
    (*exec)->ops = std::make_shared<const std::vector<std::function<void()>>>(graph->ops);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (!exec) return fail(cudaErrorInvalidValue);
    return enqueue(s, [ops = exec->ops] {
        for (const auto& op : *ops) op();
    });
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}
