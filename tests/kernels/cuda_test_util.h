// Helpers shared by the CUDA kernel tests: an RAII device buffer with host copies in and out.
// Copies use cudaMemcpy on the legacy default stream, so a download waits for the kernels the
// launchers queued on stream 0 and reports their asynchronous faults.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/interleave.h"

namespace shardlm::test {

template <typename T>
class DeviceBuffer {
public:
    explicit DeviceBuffer(size_t n) : n_(n) {
        if (n_ > 0) CUDA_CHECK(cudaMalloc(&p_, n_ * sizeof(T)));
    }
    explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
    ~DeviceBuffer() {
        if (p_) cudaFree(p_);  // no throw from a destructor
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    T* get() const { return p_; }
    size_t size() const { return n_; }

    void upload(const std::vector<T>& host) {
        SHARDLM_CHECK(host.size() == n_, "upload of ", host.size(), " elements into ", n_);
        if (n_ > 0) CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
        // From pageable memory cudaMemcpy returns once the data is staged, possibly before the DMA
        // lands, and work on a non-blocking stream does not wait for it: a graph replayed right
        // after read half-old inputs once on the H200 (TopKCuda.GraphReplayFollowsInputs).
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    std::vector<T> download() const {
        std::vector<T> host(n_);
        if (n_ > 0) CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }

private:
    T* p_ = nullptr;
    size_t n_ = 0;
};

// Rows of `cols` f32 values as a prefill GEMM's 16-bit input (kernels/cuda/half_input.h): each
// value rounded to `t` (F16 or BF16) the CPU's way, column c stored at interleaved_col(c, ic)
// (ic 0: natural). What CublasGemm's conversion writes, bit for bit.
inline std::vector<uint16_t> half_input_ref(const std::vector<float>& x, int64_t cols, DType t, int ic) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const int64_t r = int64_t(i) / cols, c = int64_t(i) % cols;
        h[size_t(r * cols + (ic ? interleaved_col(c, ic) : c))] = t == DType::BF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
    }
    return h;
}

}  // namespace shardlm::test
