// Pulling the next matrix of a decode step into L2 while the current kernels run.
//
// A batch-1 decode step alternates bandwidth-bound GEMVs with latency-bound small kernels (norms,
// RoPE, attention, its merge): while the small ones run, HBM idles, and each GEMV then starts cold,
// one load latency per round of its blocks. A GEMV that is given the next GEMV's weights (an
// L2Prefetch) has its first blocks hand them to the copy engine as bulk L2 prefetches
// (cp.async.bulk.prefetch.L2, sm_90): the bytes stream in during this GEMV and the kernels after
// it, and the next GEMV finds them in L2. A prefetch is only a hint: it changes no result, only
// where the bytes come from. Older GPUs skip it; the CPU emulator checks and counts it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#ifdef SHARDLM_CUDA_EMU
namespace shardlm_emu {
// The CPU emulator (tests/cuda_emu) checks a prefetch's range (16-byte aligned, inside one device
// allocation) and counts its bytes, where a GPU would only move them.
void l2_prefetch(const void* p, size_t bytes);
}  // namespace shardlm_emu
#endif

namespace shardlm {

// A byte range to prefetch: 16-byte aligned, a multiple of 16 bytes (l2_prefetch_range makes one).
struct L2Prefetch {
    const void* data = nullptr;
    int64_t bytes = 0;
};

// The 16-byte-aligned part of [p, p + bytes), at most `cap` bytes of it from its start; empty
// when nothing is left.
inline L2Prefetch l2_prefetch_range(const void* p, int64_t bytes, int64_t cap) {
    if (!p || bytes <= 0 || cap < 16) return {};
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uintptr_t begin = (a + 15) & ~uintptr_t(15), end = (a + uintptr_t(bytes)) & ~uintptr_t(15);
    if (end <= begin) return {};
    const int64_t n = int64_t(end - begin) < cap ? int64_t(end - begin) : cap & ~int64_t(15);
    return {reinterpret_cast<const void*>(begin), n};
}

// Part `part` of `parts` of r, split on 16-byte boundaries, prefetched by the calling thread (one
// thread per block is enough: the copy engine does the work, the thread only issues).
__device__ __forceinline__ void l2_prefetch_part(const L2Prefetch& r, int64_t part, int64_t parts) {
    const int64_t units = r.bytes / 16;
    const int64_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    if (u1 <= u0) return;
#if defined(SHARDLM_CUDA_EMU)
    shardlm_emu::l2_prefetch(static_cast<const char*>(r.data) + u0 * 16, size_t(u1 - u0) * 16);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const char* p = static_cast<const char*>(r.data) + u0 * 16;
    for (int64_t u = u0; u < u1;) {  // one instruction per 1 GiB (its size operand is 32 bits)
        const int64_t n = u1 - u < (int64_t(1) << 26) ? u1 - u : (int64_t(1) << 26);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(uint32_t(n * 16)) : "memory");
        p += n * 16;
        u += n;
    }
#endif  // below sm_90 there is no bulk prefetch: nothing to issue
}

}  // namespace shardlm
