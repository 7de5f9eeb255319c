// Owning, 128-byte-aligned host buffer (RAII). 128 bytes covers AVX-512 lines and matches the
// KV-cache row alignment of the design.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sys/mman.h>
#include <new>
#include <utility>

namespace shardlm {

constexpr size_t kAlign = 128;
// Buffers of this size and more (weights, KV cache, large workspaces) are aligned to it and ask the
// kernel for transparent huge pages (MADV_HUGEPAGE; Debian's THP mode is "madvise", so without
// asking they get 4 KB pages). Streaming through 4 KB pages read ~30% slower on our build machine
// (a read stream 22-25 -> 34 GB/s) and cost INT8 decode 8% (kernels_bench, 67 -> 62 ms per step).
constexpr size_t kHugePage = size_t(2) << 20;

inline size_t align_up(size_t n, size_t a = kAlign) { return (n + a - 1) / a * a; }

class Buffer {
public:
    Buffer() = default;
    explicit Buffer(size_t bytes) : size_(bytes) {
        if (bytes == 0) return;
        // Only the whole huge pages are advised: a tail on 4 KB pages costs no more memory than it
        // holds (a 2.1 MB buffer on two huge pages would take 4 MB).
        const size_t a = bytes >= kHugePage ? kHugePage : kAlign;
        void* p = nullptr;  // posix_memalign: unlike aligned_alloc, any size for an alignment
        if (posix_memalign(&p, a, align_up(bytes, kAlign)) != 0) throw std::bad_alloc();
        data_ = static_cast<uint8_t*>(p);
#ifdef MADV_HUGEPAGE
        if (a == kHugePage) madvise(data_, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice: failure is harmless
#endif
    }
    ~Buffer() { std::free(data_); }
    Buffer(Buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    Buffer& operator=(Buffer&& o) noexcept {
        std::swap(data_, o.data_);
        std::swap(size_, o.size_);
        return *this;
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;

    uint8_t* data() { return data_; }
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    template <typename T> T* as() { return reinterpret_cast<T*>(data_); }
    template <typename T> const T* as() const { return reinterpret_cast<const T*>(data_); }

private:
    uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace shardlm
