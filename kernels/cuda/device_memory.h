// RAII owners of CUDA resources: device memory, pinned host memory, streams and events. Each
// frees what it owns in its destructor (errors there are reported on stderr, never thrown) and
// moves but does not copy.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace shardlm {

class DeviceBuffer {
public:
    DeviceBuffer() = default;
    // Throws Error naming the bytes asked for and the bytes free on the device when it fails.
    explicit DeviceBuffer(size_t bytes);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void* get() const { return p_; }
    size_t size() const { return n_; }

private:
    void* p_ = nullptr;
    size_t n_ = 0;
};

// Page-locked host memory: the staging area of weight uploads and the step's small transfers.
class PinnedBuffer {
public:
    PinnedBuffer() = default;
    explicit PinnedBuffer(size_t bytes);
    ~PinnedBuffer();
    PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
    PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;

    void* get() const { return p_; }
    size_t size() const { return n_; }
    template <class T> T* as() const { return static_cast<T*>(p_); }

private:
    void* p_ = nullptr;
    size_t n_ = 0;
};

class CudaStream {
public:
    CudaStream();  // non-blocking with respect to the legacy default stream
    ~CudaStream();
    CudaStream(const CudaStream&) = delete;
    CudaStream& operator=(const CudaStream&) = delete;
    cudaStream_t get() const { return s_; }

private:
    cudaStream_t s_ = nullptr;
};

class CudaEvent {
public:
    CudaEvent();
    ~CudaEvent();
    CudaEvent(const CudaEvent&) = delete;
    CudaEvent& operator=(const CudaEvent&) = delete;
    cudaEvent_t get() const { return e_; }

private:
    cudaEvent_t e_ = nullptr;
};

// One allocation carved into many: the engine lays out weights, KV cache and workspace with
// take() twice, first on an unallocated arena to learn the total (pointers are then offsets from
// null and must not be used), then on one that owns a DeviceBuffer of that size.
class DeviceArena {
public:
    DeviceArena() = default;               // sizing pass
    explicit DeviceArena(size_t bytes) : buf_(bytes) {}
    void* take(size_t bytes);              // 256-byte aligned; throws when the arena is full
    template <class T> T* take_n(size_t n) { return static_cast<T*>(take(n * sizeof(T))); }
    size_t used() const { return used_; }
    bool sizing() const { return buf_.get() == nullptr; }

private:
    DeviceBuffer buf_;
    size_t used_ = 0;
};

// Free and total memory of the current device.
void device_memory_info(size_t* free_bytes, size_t* total_bytes);

}  // namespace shardlm
