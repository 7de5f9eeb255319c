// One attention head in the registers of one warp, and the operations of the RoPE prologue on it
// (per-head RMSNorm, rotate-half RoPE, the KV-cache write with its INT8 quantization). Shared by
// rope_kv.cu and by the decode attention that fuses the prologue (attention.cu): both run these
// same float operations, so the two paths write the same cache bits and attend with the same q.
//
// Lane l holds the rotate-half pairs (i, i + d/2) for i = l, l + 32, l + 64, l + 96 (i < d/2), so
// head_dim <= 2 * 32 * kMaxPairs = 256 fits and every reduction (the norm's sum of squares, INT8's
// max |x|) is a warp shuffle. Every lane of the warp must call the functions that reduce.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace shardlm::rope {

constexpr int kMaxPairs = 4;
constexpr int kMaxHeadDim = 2 * 32 * kMaxPairs;

// a[j] = x[i], b[j] = x[i + half], i = lane + 32 j; lanes past the end hold zeros (neutral for
// both sums of squares and max |x|).
struct HeadRegs {
    float a[kMaxPairs], b[kMaxPairs];
};

// cos and sin of the angle of this lane's pairs (1 and 0 past the end: rotate() leaves them be).
struct Angles {
    float c[kMaxPairs], s[kMaxPairs];
};

__device__ __forceinline__ float lanes_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float lanes_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ HeadRegs load_head(const float* x, int lane, int half) {
    HeadRegs r;
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
        const int i = lane + 32 * j;
        r.a[j] = i < half ? x[i] : 0.0f;
        r.b[j] = i < half ? x[i + half] : 0.0f;
    }
    return r;
}

__device__ __forceinline__ void store_head(const HeadRegs& r, float* x, int lane, int half) {
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
        const int i = lane + 32 * j;
        if (i < half) {
            x[i] = r.a[j];
            x[i + half] = r.b[j];
        }
    }
}

// Per-head RMSNorm, rmsnorm_ref's float operations: (x * inv) * w, inv = rsqrt(mean(x^2) + eps);
// w holds the norm weights as load_head holds a head. The sum of squares is written as explicit
// FMAs so that no compiler contracts it differently in the two kernels that share it.
__device__ __forceinline__ void norm_head(HeadRegs& r, const HeadRegs& w, int half, float eps) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) ss = fmaf(r.b[j], r.b[j], fmaf(r.a[j], r.a[j], ss));
    const float inv = rsqrtf(lanes_sum(ss) / float(2 * half) + eps);
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
        r.a[j] = (r.a[j] * inv) * w.a[j];
        r.b[j] = (r.b[j] * inv) * w.b[j];
    }
}

// Angle float(pos) * inv_freq[i] in FP32 and precise sincosf, as rope_ref. Needs only the
// position, so a kernel can compute it before it waits for its inputs.
__device__ __forceinline__ Angles angles(const float* inv_freq, float fpos, int lane, int half) {
    Angles g;
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
        const int i = lane + 32 * j;
        g.c[j] = 1.0f;
        g.s[j] = 0.0f;
        if (i < half) sincosf(fpos * inv_freq[i], &g.s[j], &g.c[j]);
    }
    return g;
}

// Rotate-half RoPE with the products rounded separately (__fmul_rn/__fadd_rn keep nvcc from
// contracting them into FMAs), so the result tracks the CPU's a*c - b*s to within the cos/sin
// difference.
__device__ __forceinline__ void rotate(HeadRegs& r, const Angles& g) {
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
        const float a = r.a[j], b = r.b[j], c = g.c[j], s = g.s[j];
        r.a[j] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        r.b[j] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
}

template <DType D>
struct CacheElem;
template <>
struct CacheElem<DType::F32> { using type = float; };
template <>
struct CacheElem<DType::F16> { using type = __half; };
template <>
struct CacheElem<DType::BF16> { using type = __nv_bfloat16; };

// f32 -> cache element, round to nearest even (as f32_to_f16 / f32_to_bf16 on the CPU).
template <typename T>
__device__ __forceinline__ T to_elem(float v) {
    if constexpr (std::is_same_v<T, float>) {
        return v;
    } else if constexpr (std::is_same_v<T, __half>) {
        return __float2half_rn(v);
    } else {
        return __float2bfloat16_rn(v);
    }
}

// quantize_row_int8's float operations: scale = amax / 127, inv = 127 / amax (0 for an all-zero
// row), v = x * inv clamped to [-127, 127] (a NaN clamps to 127, as on the CPU), then rounded to
// nearest even (the CPU's magic-number add equals __float2int_rn for |v| <= 127).
__device__ __forceinline__ int8_t quantize_elem(float x, float inv) {
    float v = x * inv;
    v = v < 127.0f ? v : 127.0f;
    v = v > -127.0f ? v : -127.0f;
    return static_cast<int8_t>(__float2int_rn(v));
}

// Writes one head into row `row` (row_stride elements apart) of `cache`, its INT8 scale into
// scales[row] (I8 only). Only the head_dim values are written, never the row's padding.
template <DType D>
__device__ __forceinline__ void store_cache_row(const HeadRegs& r, void* cache, float* scales, int64_t row,
                                                int64_t row_stride, int lane, int half) {
    if constexpr (D == DType::I8) {
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxPairs; ++j) amax = fmaxf(amax, fmaxf(fabsf(r.a[j]), fabsf(r.b[j])));
        amax = lanes_max(amax);
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int8_t* q = static_cast<int8_t*>(cache) + row * row_stride;
#pragma unroll
        for (int j = 0; j < kMaxPairs; ++j) {
            const int i = lane + 32 * j;
            if (i < half) {
                q[i] = quantize_elem(r.a[j], inv);
                q[i + half] = quantize_elem(r.b[j], inv);
            }
        }
        if (lane == 0) scales[row] = amax / 127.0f;
    } else {
        using Elem = typename CacheElem<D>::type;
        Elem* out = static_cast<Elem*>(cache) + row * row_stride;
#pragma unroll
        for (int j = 0; j < kMaxPairs; ++j) {
            const int i = lane + 32 * j;
            if (i < half) {
                out[i] = to_elem<Elem>(r.a[j]);
                out[i + half] = to_elem<Elem>(r.b[j]);
            }
        }
    }
}

// The inverse of store_cache_row: row `row` of `cache` as a head in registers, decoded to f32
// (INT8: q * scales[row]), zeros past head_dim.
template <DType D>
__device__ __forceinline__ HeadRegs load_cache_row(const void* cache, const float* scales, int64_t row,
                                                   int64_t row_stride, int lane, int half) {
    HeadRegs r;
    const float sc = D == DType::I8 ? scales[row] : 1.0f;
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
        const int i = lane + 32 * j;
        float a = 0.0f, b = 0.0f;
        if (i < half) {
            if constexpr (D == DType::I8) {
                const int8_t* q = static_cast<const int8_t*>(cache) + row * row_stride;
                a = float(q[i]) * sc;  // kv_row_load's float(q) * scale (kernels/cpu/kv_shift.h)
                b = float(q[i + half]) * sc;
            } else if constexpr (D == DType::F32) {
                const float* x = static_cast<const float*>(cache) + row * row_stride;
                a = x[i];
                b = x[i + half];
            } else if constexpr (D == DType::F16) {
                const __half* x = static_cast<const __half*>(cache) + row * row_stride;
                a = __half2float(x[i]);
                b = __half2float(x[i + half]);
            } else {
                const __nv_bfloat16* x = static_cast<const __nv_bfloat16*>(cache) + row * row_stride;
                a = __bfloat162float(x[i]);
                b = __bfloat162float(x[i + half]);
            }
        }
        r.a[j] = a;
        r.b[j] = b;
    }
    return r;
}

}  // namespace shardlm::rope
