#include <cstdio>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_memory.h"

namespace shardlm {

namespace {
void warn_if(cudaError_t e, const char* what) {
    if (e != cudaSuccess) std::fprintf(stderr, "shardlm: warning: %s: %s\n", what, cudaGetErrorString(e));
}
double gib(size_t b) { return double(b) / (1024.0 * 1024.0 * 1024.0); }
}  // namespace

void device_memory_info(size_t* free_bytes, size_t* total_bytes) {
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

DeviceBuffer::DeviceBuffer(size_t bytes) : n_(bytes) {
    if (bytes == 0) return;
    const cudaError_t e = cudaMalloc(&p_, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        int dev = -1;
        cudaGetDevice(&dev);
        p_ = nullptr;
        fail("cannot allocate ", gib(bytes), " GiB on CUDA device ", dev, " (", gib(free_b), " GiB free of ",
             gib(total_b), "): ", cudaGetErrorString(e));
    }
}

DeviceBuffer::~DeviceBuffer() {
    if (p_) warn_if(cudaFree(p_), "cudaFree");
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
        if (p_) warn_if(cudaFree(p_), "cudaFree");
        p_ = std::exchange(o.p_, nullptr);
        n_ = std::exchange(o.n_, 0);
    }
    return *this;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : n_(bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMallocHost(&p_, bytes));
}

PinnedBuffer::~PinnedBuffer() {
    if (p_) warn_if(cudaFreeHost(p_), "cudaFreeHost");
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
        if (p_) warn_if(cudaFreeHost(p_), "cudaFreeHost");
        p_ = std::exchange(o.p_, nullptr);
        n_ = std::exchange(o.n_, 0);
    }
    return *this;
}

CudaStream::CudaStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
CudaStream::~CudaStream() { warn_if(cudaStreamDestroy(s_), "cudaStreamDestroy"); }

CudaEvent::CudaEvent() { CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
CudaEvent::~CudaEvent() { warn_if(cudaEventDestroy(e_), "cudaEventDestroy"); }

void* DeviceArena::take(size_t bytes) {
    const size_t at = (used_ + 255) & ~size_t(255);
    used_ = at + bytes;
    if (sizing()) return reinterpret_cast<void*>(at);  // an offset; never dereferenced
    SHARDLM_CHECK(used_ <= buf_.size(), "device arena overflow: ", used_, " > ", buf_.size(), " bytes");
    return static_cast<char*>(buf_.get()) + at;
}

}  // namespace shardlm
