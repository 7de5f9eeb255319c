// One warp's tensor-core product D = A B + C of shape m16n8k16, FP16 inputs and FP32 accumulators
// (PTX mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32), for the kernels that tile attention on
// tensor cores (attention.cu). Device code, .cu files only.
//
// Fragments follow the PTX ISA's layout ("Matrix Fragments for mma.m16n8k16 with floating point
// type"); with g = lane / 4 and t = lane % 4, each 32-bit register holds two FP16 values, the lower
// index in the low half:
//   A (16 x 16, row-major): a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]
//                           a[2] = A[g][2t+8, 2t+9]  a[3] = A[g+8][2t+8, 2t+9]
//   B (16 x 8, by column):  b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
//   C, D (16 x 8, FP32):    d[0], d[1] = D[g][2t, 2t+1]    d[2], d[3] = D[g+8][2t, 2t+1]
// Every lane of the warp must take part (the call is warp-synchronous, as the instruction is).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace shardlm {

// The same product from shuffles and FP32 arithmetic (each product of two FP16 values is exact in
// FP32; the sums run in k order): the path of devices below sm_80, and the fragment layout above
// stated as code once more, which the layout test compares with the instruction (mma_check.h).
__device__ __forceinline__ void mma_16816_shuffle(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    const int lane = int(threadIdx.x) & 31, t = lane & 3;  // this lane's rows are lane / 4 and + 8
    float ar[2][16], bc[2][16];  // rows g, g+8 of A; columns 2t, 2t+1 of B
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int src_a = (lane & ~3) + q;  // holds A[g][2q, 2q+1] and the rest of row g / g+8
        const uint32_t w[4] = {__shfl_sync(0xffffffffu, a[0], src_a), __shfl_sync(0xffffffffu, a[1], src_a),
                               __shfl_sync(0xffffffffu, a[2], src_a), __shfl_sync(0xffffffffu, a[3], src_a)};
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            __half2 h;
            memcpy(&h, &w[r], 4);
            const float2 f = __half22float2(h);
            const int row = r & 1, col = 2 * q + (r >= 2 ? 8 : 0);
            ar[row][col] = f.x;
            ar[row][col + 1] = f.y;
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int src_b = (2 * t + j) * 4 + q;  // holds B[2q, 2q+1][2t+j] and B[2q+8, 2q+9][2t+j]
            const uint32_t v[2] = {__shfl_sync(0xffffffffu, b[0], src_b), __shfl_sync(0xffffffffu, b[1], src_b)};
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                __half2 h;
                memcpy(&h, &v[r], 4);
                const float2 f = __half22float2(h);
                bc[j][2 * q + 8 * r] = f.x;
                bc[j][2 * q + 8 * r + 1] = f.y;
            }
        }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 16; ++k) s = fmaf(ar[e >> 1][k], bc[e & 1][k], s);
        d[e] += s;
    }
}

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(SHARDLM_CUDA_EMU)
    shardlm_emu::mma_m16n8k16_f16_f32(d, a, b);  // the CPU emulator's model of the instruction
#else
    mma_16816_shuffle(d, a, b);
#endif
}

// Two floats as one register of FP16 values (x in the low half), rounded to nearest.
__device__ __forceinline__ uint32_t pack_half2(float x, float y) {
    const __half2 h = __floats2half2_rn(x, y);
    uint32_t w;
    memcpy(&w, &h, 4);
    return w;
}

// FP16's largest finite value: what a float beyond FP16's range is clamped to before conversion.
constexpr float kHalfMax = 65504.0f;

__device__ __forceinline__ float clamp_half(float x) { return fminf(fmaxf(x, -kHalfMax), kHalfMax); }

// x ~ hi + lo with hi, lo in FP16: the two halves of an FP32 operand that a pair of FP16 products
// multiplies to about 22 significant bits (hi's 11, then the rounding error's). x must already be
// within FP16's range (clamp_half).
__device__ __forceinline__ void split_half2(float x, float y, uint32_t& hi, uint32_t& lo) {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 back = __half22float2(h);
    memcpy(&hi, &h, 4);
    lo = pack_half2(x - back.x, y - back.y);
}

}  // namespace shardlm
