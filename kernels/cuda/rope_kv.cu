#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/rope_kv.h"

namespace shardlm {
namespace {

// One warp per (token, head): lane l holds the rotate-half pairs (i, i + d/2) for
// i = l, l + 32, l + 64, l + 96 (i < d/2), so head_dim <= 2 * 32 * kMaxPairs = 256 fits in
// registers and every reduction (the q/k norm's sum of squares, INT8's max |x|) is a warp shuffle:
// no shared memory and no __syncthreads. Heads of a token are tasks t * (n_heads + n_kv_heads) + h:
// h < n_heads is a q head, otherwise k head h - n_heads, whose warp also stores v head h - n_heads.
constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = 32 * kWarpsPerBlock;
constexpr int kMaxPairs = 4;
constexpr unsigned kFull = 0xffffffffu;

// The values of one head as this lane holds them: a[j] = x[i], b[j] = x[i + half], i = lane + 32 j;
// lanes past the end hold zeros (neutral for both sums of squares and max |x|).
struct HeadRegs {
    float a[kMaxPairs], b[kMaxPairs];
};

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
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
// w holds the norm weights as load_head holds a head.
__device__ __forceinline__ void norm_head(HeadRegs& r, const HeadRegs& w, int half, float eps) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) ss += r.a[j] * r.a[j] + r.b[j] * r.b[j];
    const float inv = rsqrtf(warp_sum(ss) / float(2 * half) + eps);
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
        r.a[j] = (r.a[j] * inv) * w.a[j];
        r.b[j] = (r.b[j] * inv) * w.b[j];
    }
}

// Rotate-half RoPE as rope_ref: angle = float(pos) * inv_freq[i] in FP32 (freq[j] = inv_freq[i],
// i = lane + 32 j), precise sincosf, and the products rounded separately (__fmul_rn/__fadd_rn keep
// nvcc from contracting them into FMAs) so the result tracks the CPU's a*c - b*s to within the
// cos/sin difference.
__device__ __forceinline__ void rope_head(HeadRegs& r, const float (&freq)[kMaxPairs], float fpos, int lane,
                                          int half) {
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
        const int i = lane + 32 * j;
        if (i < half) {
            float s, c;
            sincosf(fpos * freq[j], &s, &c);
            const float a = r.a[j], b = r.b[j];
            r.a[j] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
            r.b[j] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
        }
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

// Writes one head into cache row `row` (index over [n_slots][n_kv_heads][capacity]) of `cache`,
// its INT8 scale into scales[row] (I8 only). Every lane of the warp must call it (the INT8 path
// reduces across the warp).
template <DType D>
__device__ __forceinline__ void store_cache_row(const HeadRegs& r, void* cache, float* scales, int64_t row,
                                                int64_t row_stride, int lane, int half) {
    if constexpr (D == DType::I8) {
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxPairs; ++j) amax = fmaxf(amax, fmaxf(fabsf(r.a[j]), fabsf(r.b[j])));
        amax = warp_max(amax);
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

// The loads are ordered for latency: the session constants (inv_freq, the q/k norm weights) before
// pdl_wait(), under the previous kernel's tail; a KV warp loads its k and v heads together, before
// its first store (the compiler cannot move a load above a store that may alias it).
template <DType D>
__global__ void __launch_bounds__(kThreads) rope_kv_kernel(RopeKVParams p) {
    const int lane = threadIdx.x & 31;
    const int64_t heads = p.n_heads + p.n_kv_heads;
    const int64_t task = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    if (task >= p.T * heads) return;  // uniform per warp: the shuffles below see full warps
    const int64_t t = task / heads, h = task % heads;
    const int half = int(p.head_dim / 2);
    const bool is_q = h < p.n_heads;
    float freq[kMaxPairs];
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) freq[j] = lane + 32 * j < half ? p.inv_freq[lane + 32 * j] : 0.0f;
    const float* norm_w = is_q ? p.q_norm : p.k_norm;
    const HeadRegs w = norm_w ? load_head(norm_w, lane, half) : HeadRegs{};
    pdl_wait();
    pdl_launch_dependents();
    const float fpos = float(p.pos[t]);

    const int64_t q_row = p.row_stride ? p.row_stride : p.n_heads * p.head_dim;
    const int64_t kv_row = p.row_stride ? p.row_stride : p.n_kv_heads * p.head_dim;
    if (is_q) {
        float* x = p.q + t * q_row + h * p.head_dim;
        HeadRegs r = load_head(x, lane, half);
        if (norm_w) norm_head(r, w, half, p.eps);
        rope_head(r, freq, fpos, lane, half);
        store_head(r, p.q_out ? p.q_out + (t * p.n_heads + h) * p.head_dim : x, lane, half);
        return;
    }

    const int64_t kh = h - p.n_heads;
    float* x = p.k + t * kv_row + kh * p.head_dim;
    HeadRegs r = load_head(x, lane, half);
    const HeadRegs v = load_head(p.v + t * kv_row + kh * p.head_dim, lane, half);
    // K/V are [n_slots][n_kv_heads][capacity][row_stride]; position pos lives in row pos % capacity.
    const int64_t cache_row = (int64_t(p.slot[t]) * p.kv.n_kv_heads + kh) * p.kv.capacity +
                              int64_t(p.pos[t]) % p.kv.capacity;
    if (norm_w) norm_head(r, w, half, p.eps);
    rope_head(r, freq, fpos, lane, half);
    store_head(r, x, lane, half);
    store_cache_row<D>(r, p.kv.k, p.kv.k_scales, cache_row, p.kv.row_stride, lane, half);
    store_cache_row<D>(v, p.kv.v, p.kv.v_scales, cache_row, p.kv.row_stride, lane, half);
}

}  // namespace

void rope_kv_cuda(const RopeKVParams& p, cudaStream_t stream) {
    if (p.T == 0) return;
    SHARDLM_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0 && p.head_dim <= 2 * 32 * kMaxPairs,
                  "rope_kv_cuda: head_dim ", p.head_dim, " must be even and at most ", 2 * 32 * kMaxPairs);
    SHARDLM_CHECK(p.kv.n_kv_heads == p.n_kv_heads && p.kv.capacity > 0 && p.kv.row_stride >= p.head_dim,
                  "rope_kv_cuda: KV cache layout (", p.kv.n_kv_heads, " heads, capacity ", p.kv.capacity,
                  ", row stride ", p.kv.row_stride, ") does not fit ", p.n_kv_heads, " heads of ", p.head_dim);
    if (p.kv.dtype == DType::I8)
        SHARDLM_CHECK(p.kv.k_scales && p.kv.v_scales, "rope_kv_cuda: an int8 KV cache needs scales");
    const int64_t warps = p.T * (p.n_heads + p.n_kv_heads);
    const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
    SHARDLM_CHECK(blocks > 0 && blocks <= INT_MAX, "rope_kv_cuda: ", warps, " heads do not fit one grid");
    const dim3 grid(static_cast<unsigned>(blocks));
    switch (p.kv.dtype) {
        case DType::F32: launch_kernel("rope_kv_kernel", rope_kv_kernel<DType::F32>, grid, dim3(kThreads), 0, stream,
                                       p); break;
        case DType::F16: launch_kernel("rope_kv_kernel", rope_kv_kernel<DType::F16>, grid, dim3(kThreads), 0, stream,
                                       p); break;
        case DType::BF16: launch_kernel("rope_kv_kernel", rope_kv_kernel<DType::BF16>, grid, dim3(kThreads), 0, stream,
                                        p); break;
        case DType::I8: launch_kernel("rope_kv_kernel", rope_kv_kernel<DType::I8>, grid, dim3(kThreads), 0, stream,
                                      p); break;
        default: fail("rope_kv_cuda: unsupported KV cache dtype ", dtype_name(p.kv.dtype));
    }
}

}  // namespace shardlm
