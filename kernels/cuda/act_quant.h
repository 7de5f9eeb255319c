// One activation value quantized to INT8 the way quantize_acts_int8_ref does it (kernels/cpu/
// quantize.h): v = x * inv (inv = 127 / amax, 0 for an all-zero group), clamped to [-127, 127]
// (NaN -> 127, as on the CPU), rounded to nearest even. Shared by the quantize kernel (w8a8.cu)
// and the norm that quantizes its own output (rmsnorm.cu), so both give the same bits.
#pragma once

namespace shardlm {

__device__ __forceinline__ int quantize_act(float x, float inv) {
    float v = __fmul_rn(x, inv);  // never fused with anything
    v = v < 127.0f ? v : 127.0f;
    v = v > -127.0f ? v : -127.0f;
    return __float2int_rn(v);
}

// The reciprocal and the scale of a group whose max |x| is amax, as quantize_acts_int8_ref.
__device__ __forceinline__ float quantize_act_inv(float amax) { return amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f; }
__device__ __forceinline__ float quantize_act_scale(float amax) { return __fdiv_rn(amax, 127.0f); }

// Four values of one group at once (float4 loads, char4 stores).
__device__ __forceinline__ char4 quantize_act4(const float4& v, float inv) {
    return make_char4(static_cast<signed char>(quantize_act(v.x, inv)), static_cast<signed char>(quantize_act(v.y, inv)),
                      static_cast<signed char>(quantize_act(v.z, inv)), static_cast<signed char>(quantize_act(v.w, inv)));
}

// max(m, |v.x|, .., |v.w|); fmaxf ignores a NaN like the CPU's std::max(amax, |x|).
__device__ __forceinline__ float abs_max4(float m, const float4& v) {
    return fmaxf(fmaxf(m, fabsf(v.x)), fmaxf(fabsf(v.y), fmaxf(fabsf(v.z), fabsf(v.w))));
}

// The max over a block of Threads threads of each thread's value, for a row's max |x| (every
// thread must call it; all get the result).
template <int Threads>
__device__ __forceinline__ float block_max(float v) {
    __shared__ float warp_max[Threads / 32];
    __shared__ float all;
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = warp_max[0];
        for (int i = 1; i < Threads / 32; ++i) m = fmaxf(m, warp_max[i]);
        all = m;
    }
    __syncthreads();
    return all;
}

}  // namespace shardlm
