// 32-bit words of a 16-byte register load, for the kernels that unpack 16-byte loads of weights or
// cache rows in registers (gemv.cu, attention.cu). Device code, .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm {

// Word i of v; i must be a compile-time constant after unrolling, so this is a register pick,
// not an indexed (local-memory) access.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

}  // namespace shardlm
