// A prefill GEMM's input in the form CublasGemm::run converts its f32 x to (gemm.h): the weights'
// 16-bit type (F16 for I8 weights) with each row's columns in the order the weights store theirs
// (interleave.h; 0: natural). The kernel that produces the activation (the norm before q/k/v and
// gate/up, SwiGLU before down) can write it there itself, saving the product a conversion kernel
// and a round trip of the activation through memory; the values are the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cuda/interleave.h"

#if defined(__CUDACC__) || defined(SHARDLM_CUDA_EMU)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace shardlm {

struct HalfInput {
    void* data = nullptr;  // [T, cols] elements of `type`
    DType type = DType::F16;  // F16 or BF16
    int interleave_c = 0;     // the weights' interleave_chunk_cols, or 0
};

#if defined(__CUDACC__) || defined(SHARDLM_CUDA_EMU)
// Columns c .. c + 3 (c a multiple of 4) of a row of `cols`, rounded to nearest as the GEMM's own
// conversion rounds them (__float2half_rn / __float2bfloat16_rn), stored where the weights keep
// those columns: four consecutive natural columns stay consecutive under interleaving, so one
// 8-byte store (`row` 8-byte aligned).
__device__ __forceinline__ void store_half_input4(const HalfInput& h, int64_t row, int64_t cols, int64_t c, float4 v) {
    const int64_t sc = h.interleave_c == 16  ? interleaved_col(c, 16)
                       : h.interleave_c == 8 ? interleaved_col(c, 8)
                       : h.interleave_c == 32 ? interleaved_col(c, 32)
                                              : c;
    uint2 bits;
    if (h.type == DType::BF16) {
        const __nv_bfloat16 e[4] = {__float2bfloat16_rn(v.x), __float2bfloat16_rn(v.y), __float2bfloat16_rn(v.z),
                                    __float2bfloat16_rn(v.w)};
        memcpy(&bits, e, sizeof(bits));
    } else {
        const __half e[4] = {__float2half_rn(v.x), __float2half_rn(v.y), __float2half_rn(v.z), __float2half_rn(v.w)};
        memcpy(&bits, e, sizeof(bits));
    }
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(h.data) + row * cols + sc) = bits;
}
#endif

// Whether a producer's vector path can write rows of `cols` into h: F16/BF16, 8-byte aligned, cols
// a multiple of 4 (and of the interleaved block, interleave_block_cols).
inline bool half_input_fits(const HalfInput& h, int64_t cols) {
    return h.data && (h.type == DType::F16 || h.type == DType::BF16) && cols % 4 == 0 &&
           reinterpret_cast<uintptr_t>(h.data) % 8 == 0 &&
           (h.interleave_c == 0 || ((h.interleave_c == 8 || h.interleave_c == 16 || h.interleave_c == 32) &&
                                    cols % interleave_block_cols(h.interleave_c) == 0));
}

}  // namespace shardlm
