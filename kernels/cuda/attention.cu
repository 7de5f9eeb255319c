// attention_cuda: causal GQA over the device KV cache (F32/F16/BF16/I8 rows), FP32 math:
//   flash_prefill_kernel  FlashAttention-2 style; a block owns 32 (query, head) rows of one chunk
//                         and one KV head (every query head of the group shares the K/V tiles,
//                         staged as f32 in shared memory 16 bytes of a row at a time).
//   flash_prefill_mma_kernel  the same tiling on tensor cores (sm_80+, 16-bit and INT8 caches,
//                         head_dim <= 128), 64 rows per block, FP32-accurate split operands.
//   flash_decode_kernel   split-KV for one-token chunks, K/V pieces dequantized in registers;
//                         partials merged by flash_merge_kernel. Optionally runs the RoPE
//                         prologue itself (AttentionCuda::rope) instead of rope_kv_cuda.
//   naive_kernel          one block per (query, head), three passes (max, sum, weighted values).
// Cache row addresses: block (slot, kv head) = (slot * n_kv_heads + kvh) * capacity rows; position
// p lives in row p % capacity; a row is row_stride * dtype_size bytes, a multiple of 16 (128 by
// contract), so a 16-byte load that starts before head_dim stays inside the row. Columns at or
// beyond head_dim (the padding, possibly garbage) and rows past the causal end are never used:
// they become zeros (selected, not multiplied, so NaN garbage cannot leak).
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/align.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mma.h"
#include "kernels/cuda/rope_head.h"
#include "kernels/cuda/words.h"

namespace shardlm {
namespace {

// Split-KV plan, a function of the capacity alone: a captured graph stays valid as sequences grow.
// Short splits give a batch-1 decode enough blocks (8 KV heads x 20 splits at a 640 capacity);
// 32 keys is one round of the decode kernel at head_dim 128 (INT8 and 16-bit caches).
constexpr int64_t kMinKeysPerSplit = 32, kMaxSplits = 32, kSplitAlign = 16;
static_assert(kMaxSplits <= 32, "flash_merge_kernel gives each split a lane of one warp");

struct SplitPlan {
    int n_splits, keys_per_split;
};

SplitPlan split_plan(int64_t capacity) {
    int64_t n = (capacity + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
    n = n < 1 ? 1 : (n > kMaxSplits ? kMaxSplits : n);
    int64_t per = (capacity + n - 1) / n;
    per = (per + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
    n = (capacity + per - 1) / per;
    return {int(n < 1 ? 1 : n), int(per)};
}

// What the kernels need, flattened from AttentionCuda (passed by value as a kernel parameter).
struct Args {
    const float* q;    // [T, n_heads * head_dim]
    float* out;        // [T, n_heads * head_dim]
    const AttnChunk* chunks;
    const uint8_t* k;  // [n_slots][n_kv_heads][capacity] rows of row_bytes
    const uint8_t* v;
    const float* k_scales;  // I8: [n_slots][n_kv_heads][capacity]
    const float* v_scales;
    DType dtype;
    int n_heads, n_kv_heads, group, head_dim;
    int64_t capacity, row_bytes;
    float scale;
    int window;  // sliding window (0: none): the query at p sees keys window_lo(p, window) .. p
    // Split-KV partials: record ((chunk * n_heads + h) * n_splits + split) is
    // [m, l, acc[head_dim]] (head_dim + 2 floats): running max, sum of exp, unnormalised output.
    float* partials;
    int n_splits, keys_per_split;
    // Decode with the RoPE prologue fused (AttentionCuda::rope): raw q, k, v rows of the step's
    // tokens (row t at t * q_stride / kv_stride floats), the rotation and norm constants, and the
    // cache again, writable, for the newest k and v rows.
    struct {
        bool on;
        const float *q, *k, *v;
        int64_t q_stride, kv_stride;
        const float *inv_freq, *q_norm, *k_norm;
        float eps;
        uint8_t *k_cache, *v_cache;
        float *k_scales, *v_scales;
        int64_t row_stride;  // elements
    } rope;
};

// The first key a query at position p sees (kernels/cpu/attention.h window_start).
__device__ __forceinline__ int window_lo(int p, int window) { return window > 0 && p >= window ? p - window + 1 : 0; }

// Whether the query at position p sees key `key`: 0 <= p - key < span, span = the window or, with
// none, INT_MAX (one unsigned comparison: a key after p wraps to a huge distance).
__device__ __forceinline__ bool key_visible(int p, int key, unsigned span) { return unsigned(p - key) < span; }
__device__ __forceinline__ unsigned window_span(int window) { return window > 0 ? unsigned(window) : 0x7fffffffu; }

__device__ __forceinline__ int64_t cache_row(const Args& a, int64_t block, int p) {
    return block + (p < a.capacity ? int64_t(p) : int64_t(p) % a.capacity);
}

// Writes e floats (x masked to columns < head_dim) at dst, 16-byte aligned.
template <int E>
__device__ __forceinline__ void store_masked(float* dst, const float (&x)[E], int col0, int head_dim) {
#pragma unroll
    for (int i = 0; i < E; i += 4) {
        float4 o;
        o.x = col0 + i + 0 < head_dim ? x[i + 0] : 0.0f;
        o.y = col0 + i + 1 < head_dim ? x[i + 1] : 0.0f;
        o.z = col0 + i + 2 < head_dim ? x[i + 2] : 0.0f;
        o.w = col0 + i + 3 < head_dim ? x[i + 3] : 0.0f;
        *reinterpret_cast<float4*>(dst + i) = o;
    }
}

__device__ __forceinline__ void store_zeros(float* dst, int e) {
    for (int i = 0; i < e; i += 4) *reinterpret_cast<float4*>(dst + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

__device__ __forceinline__ int chunk_elems(DType t) { return t == DType::F32 ? 4 : (t == DType::I8 ? 16 : 8); }

// Dequantizes the 16-byte piece c of a cache row (elements c*E .. c*E+E-1, E = 16 / dtype size)
// into dst. I8 values are float(q) * scale, as on the CPU.
__device__ __forceinline__ void stage_piece(const uint8_t* row, float scale, DType t, int c, int head_dim,
                                            float* dst) {
    const uint4 raw = *reinterpret_cast<const uint4*>(row + int64_t(c) * 16);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    switch (t) {
        case DType::F32: {
            const float x[4] = {__uint_as_float(w[0]), __uint_as_float(w[1]), __uint_as_float(w[2]),
                                __uint_as_float(w[3])};
            store_masked<4>(dst, x, c * 4, head_dim);
            break;
        }
        case DType::F16: {
            float x[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                __half2 h;
                memcpy(&h, &w[i], 4);
                const float2 f = __half22float2(h);  // low half = first element
                x[2 * i] = f.x;
                x[2 * i + 1] = f.y;
            }
            store_masked<8>(dst, x, c * 8, head_dim);
            break;
        }
        case DType::BF16: {
            float x[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                x[2 * i] = __uint_as_float(w[i] << 16);
                x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
            }
            store_masked<8>(dst, x, c * 8, head_dim);
            break;
        }
        default: {  // I8
            float x[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) x[i] = float(int8_t(uint8_t(w[i / 4] >> (8 * (i % 4))))) * scale;
            store_masked<16>(dst, x, c * 16, head_dim);
            break;
        }
    }
}

// Stages cache positions [p0, p0 + rows) of one (slot, KV head) block into s[rows][DP + 4] as f32;
// positions >= p_end and columns >= head_dim become zeros. All NT threads take part.
template <int DP, int NT>
__device__ __forceinline__ void stage_tile(const Args& a, const uint8_t* base, const float* scales, int64_t block,
                                           int p0, int rows, int p_end, float* s) {
    const int e = chunk_elems(a.dtype), pieces = DP / e;  // pieces per staged row (a power of two)
#pragma unroll 4
    for (int w = threadIdx.x; w < rows * pieces; w += NT) {
        const int r = w / pieces, c = w - r * pieces, p = p0 + r;
        float* dst = s + r * (DP + 4) + c * e;
        if (p < p_end && c * e < a.head_dim) {
            const int64_t row = cache_row(a, block, p);
            stage_piece(base + row * a.row_bytes, scales ? scales[row] : 1.0f, a.dtype, c, a.head_dim, dst);
        } else {
            store_zeros(dst, e);
        }
    }
}

__device__ __forceinline__ float warp_max(float x, int width) {
    for (int off = width / 2; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

__device__ __forceinline__ float warp_sum(float x, int width) {
    for (int off = width / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float s) {
    s = fmaf(a.x, b.x, s);
    s = fmaf(a.y, b.y, s);
    s = fmaf(a.z, b.z, s);
    return fmaf(a.w, b.w, s);
}

__device__ __forceinline__ float get(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// The exp reference of an online-softmax row: a row that has seen only masked keys keeps
// m = -inf, and exp(-inf - -inf) would be NaN; 0 makes every exp of it 0 instead.
__device__ __forceinline__ float safe_max(float m) { return m == -INFINITY ? 0.0f : m; }

// Elements c, c + 1 of prefill row rr = i * group + g (query i of the chunk, head g of KV head
// kvh's group); zeros for rows past the chunk and columns past head_dim (even, so both or neither).
__device__ __forceinline__ float2 q_pair(const Args& a, const AttnChunk& ch, int kvh, int rr, int rows_total, int c) {
    if (rr >= rows_total || c >= a.head_dim) return make_float2(0.0f, 0.0f);
    const int i = rr / a.group, h = kvh * a.group + rr % a.group;
    return *reinterpret_cast<const float2*>(a.q + (int64_t(ch.row0 + i) * a.n_heads + h) * a.head_dim + c);
}

// ---------------------------------------------------------------------------------------------
// Prefill. Block (tile, kv head, chunk); 256 threads; the block's 32 rows are the chunk's
// (query i, group head g) pairs r = i * group + g, r in [tile * 32, tile * 32 + 32). Thread
// (ti = tid / 16, tj = tid % 16) owns rows 2ti and 2ti+1: their scores at keys tj + 16u of each
// key tile and their outputs at columns tj*4 + 64u .. +3. Per key tile of BK keys:
//   stage K, V  ->  S = Q K^T (registers)  ->  mask, online softmax, P to shared  ->  O += P V.
// Shared: Q [32][DP+4], K and V [BK][DP+4], P [32][BK+4] f32 (the +4 keeps 16-byte rows and
// spreads rows over banks). Cost ~4 * rows * keys * DP flops on the FP32 pipes: expect a few
// TFLOP/s (~10-25% of the H200's 67 TFLOP/s FP32 peak), i.e. a 2k-token prefill of 32 heads x 128
// in roughly 3-6 ms per layer; tensor cores would be the next step.
template <int DP, int BK>
__global__ void __launch_bounds__(256) flash_prefill_kernel(Args a) {
    pdl_wait();
    pdl_launch_dependents();
    constexpr int NT = 256, BQ = 32, LD = DP + 4, LDP = BK + 4, NU = BK / 16, NV = DP / 64;
    SHARDLM_DYNAMIC_SMEM(float4, smem4);  // extern __shared__ (launch.h)
    float* sQ = reinterpret_cast<float*>(smem4);
    float* sK = sQ + BQ * LD;
    float* sV = sK + BK * LD;
    float* sP = sV + BK * LD;

    const AttnChunk ch = a.chunks[blockIdx.z];
    const int kvh = blockIdx.y, rows_total = ch.n * a.group;
    const int r0 = int(gridDim.x - 1 - blockIdx.x) * BQ;  // the longest tiles first
    if (r0 >= rows_total) return;                          // whole block: before any barrier
    const int tid = threadIdx.x, ti = tid >> 4, tj = tid & 15;
    const int kv_end = ch.pos0 + (min(rows_total, r0 + BQ) - 1) / a.group + 1;  // keys [0, kv_end)

    for (int w = tid; w < BQ * (DP / 2); w += NT) {
        const int r = w / (DP / 2), c = (w % (DP / 2)) * 2;
        *reinterpret_cast<float2*>(sQ + r * LD + c) = q_pair(a, ch, kvh, r0 + r, rows_total, c);
    }
    int qpos[2];  // rows past the chunk act as its last query (zero q, never written)
    for (int t = 0; t < 2; ++t) qpos[t] = ch.pos0 + min(r0 + 2 * ti + t, rows_total - 1) / a.group;
    const unsigned span = window_span(a.window);
    // Keys from the block's first row's first key (a sliding window skips the older tiles).
    const int kv_begin = window_lo(ch.pos0 + r0 / a.group, a.window);

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, acc[2][NV][4] = {};
    const int64_t block = (int64_t(ch.slot) * a.n_kv_heads + kvh) * a.capacity;
    for (int p0 = kv_begin; p0 < kv_end; p0 += BK) {
        stage_tile<DP, NT>(a, a.k, a.k_scales, block, p0, BK, kv_end, sK);
        stage_tile<DP, NT>(a, a.v, a.v_scales, block, p0, BK, kv_end, sV);
        __syncthreads();

        float s[2][NU] = {};
#pragma unroll 4
        for (int c = 0; c < DP; c += 4) {
            const float4 q0 = *reinterpret_cast<const float4*>(sQ + (2 * ti) * LD + c);
            const float4 q1 = *reinterpret_cast<const float4*>(sQ + (2 * ti + 1) * LD + c);
#pragma unroll
            for (int u = 0; u < NU; ++u) {
                const float4 kk = *reinterpret_cast<const float4*>(sK + (tj + 16 * u) * LD + c);
                s[0][u] = dot4(q0, kk, s[0][u]);
                s[1][u] = dot4(q1, kk, s[1][u]);
            }
        }
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            float mx = -INFINITY;
#pragma unroll
            for (int u = 0; u < NU; ++u) {
                s[t][u] = key_visible(qpos[t], p0 + tj + 16 * u, span) ? s[t][u] * a.scale : -INFINITY;
                mx = fmaxf(mx, s[t][u]);
            }
            mx = warp_max(mx, 16);  // the 16 lanes of a half-warp share the row
            const float m_new = fmaxf(m[t], mx), ref = safe_max(m_new), alpha = expf(m[t] - ref);
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < NU; ++u) {
                const float e = expf(s[t][u] - ref);
                sP[(2 * ti + t) * LDP + tj + 16 * u] = e;
                sum += e;
            }
            l[t] = l[t] * alpha + warp_sum(sum, 16);
            m[t] = m_new;
#pragma unroll
            for (int u = 0; u < NV; ++u)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[t][u][e] *= alpha;
        }
        __syncwarp();  // rows 2ti, 2ti+1 of P are written and read by the same half-warp

#pragma unroll 2
        for (int j = 0; j < BK; j += 4) {
            const float4 pa = *reinterpret_cast<const float4*>(sP + (2 * ti) * LDP + j);
            const float4 pb = *reinterpret_cast<const float4*>(sP + (2 * ti + 1) * LDP + j);
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const float x0 = get(pa, jj), x1 = get(pb, jj);
#pragma unroll
                for (int u = 0; u < NV; ++u) {
                    const float4 vv = *reinterpret_cast<const float4*>(sV + (j + jj) * LD + tj * 4 + 64 * u);
                    acc[0][u][0] = fmaf(x0, vv.x, acc[0][u][0]);
                    acc[0][u][1] = fmaf(x0, vv.y, acc[0][u][1]);
                    acc[0][u][2] = fmaf(x0, vv.z, acc[0][u][2]);
                    acc[0][u][3] = fmaf(x0, vv.w, acc[0][u][3]);
                    acc[1][u][0] = fmaf(x1, vv.x, acc[1][u][0]);
                    acc[1][u][1] = fmaf(x1, vv.y, acc[1][u][1]);
                    acc[1][u][2] = fmaf(x1, vv.z, acc[1][u][2]);
                    acc[1][u][3] = fmaf(x1, vv.w, acc[1][u][3]);
                }
            }
        }
        __syncthreads();  // K, V, P are restaged next iteration
    }

#pragma unroll
    for (int t = 0; t < 2; ++t) {
        const int rr = r0 + 2 * ti + t;
        if (rr >= rows_total) continue;
        const int i = rr / a.group, h = kvh * a.group + rr % a.group;
        float* o = a.out + (int64_t(ch.row0 + i) * a.n_heads + h) * a.head_dim;
        const float inv = 1.0f / l[t];  // l >= 1: the row's maximum contributes exp(0)
#pragma unroll
        for (int u = 0; u < NV; ++u)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                const int c = tj * 4 + 64 * u + e;  // even, so c < head_dim implies c + 1 < head_dim
                if (c < a.head_dim)
                    *reinterpret_cast<float2*>(o + c) = make_float2(acc[t][u][e] * inv, acc[t][u][e + 1] * inv);
            }
    }
}

// ---------------------------------------------------------------------------------------------
// Prefill on tensor cores (sm_80 and later; F16, BF16 and I8 caches, head_dim <= 128). Block (tile,
// kv head, chunk) as above, but 64 rows in 4 warps of 16 (rows r = i * group + g again); per key
// tile of 64 keys:
//   stage K as FP16 [key][dim] and V transposed [dim][key]  ->  S = Q K^T (mma_16816, mma.h)  ->
//   mask, online softmax on the accumulators  ->  O += P V (P's A fragments are S's registers).
// Precision: the reference computes in FP32, and one FP16 product would keep ~3 decimal digits, so
// each FP32 operand (q scaled by the softmax scale, and p) is split into FP16 hi + lo and multiplied
// twice: products are exact and sums FP32, ~22 significant bits in all (the tokens match the CPU's
// as the FP32 kernel's do). The cache side is exact in FP16: F16 is; I8 values are integers, their
// row scales multiply S (K) and P before P V (V); BF16 converts exactly within FP16's range (beyond
// |x| = 65504 it clamps, as q does; below 2^-14 it keeps an absolute error under 2^-25). Twice the
// tensor work of plain FP16 is still far below what the FP32 pipes of the kernel above take.
// Shared: Q hi, Q lo, K [64][DP+8] and V^T [DP][64+8] FP16 (the +8 puts the 8 rows a fragment load
// touches in 8 different bank quads), and I8's row scales.
template <int DP, DType KT>
__device__ __forceinline__ void stage_tile_mma(const Args& a, int64_t block, int p0, int p_end, __half* sK,
                                               __half* sVt, float* sKs, float* sVs) {
    constexpr int NT = 128, BK = 64, E = KT == DType::I8 ? 16 : 8, PIECES = DP / E, LQ = DP + 8, LV = BK + 8;
    // Key r of piece c: consecutive threads take consecutive keys, so that the transposed V
    // stores of a warp fill consecutive halves of one row of V^T (the loads read 16 bytes from
    // each of 32 rows, still whole sectors of L2).
#pragma unroll 2
    for (int w = threadIdx.x; w < BK * PIECES; w += NT) {
        const int c = w / BK, r = w - c * BK, p = p0 + r;
        uint4 kr = make_uint4(0u, 0u, 0u, 0u), vr = kr;
        if (p < p_end && c * E < a.head_dim) {
            const int64_t row = cache_row(a, block, p) * a.row_bytes + int64_t(c) * 16;
            kr = *reinterpret_cast<const uint4*>(a.k + row);
            vr = *reinterpret_cast<const uint4*>(a.v + row);
        }
        float kx[E], vx[E];
#pragma unroll
        for (int e = 0; e < E; ++e) {
            if (KT == DType::I8) {
                kx[e] = float(int8_t(uint8_t(word_of(kr, e / 4) >> (8 * (e % 4)))));
                vx[e] = float(int8_t(uint8_t(word_of(vr, e / 4) >> (8 * (e % 4)))));
            } else if (KT == DType::BF16) {
                const int sh = e % 2 ? 0 : 16;
                kx[e] = clamp_half(__uint_as_float((word_of(kr, e / 2) << sh) & 0xffff0000u));
                vx[e] = clamp_half(__uint_as_float((word_of(vr, e / 2) << sh) & 0xffff0000u));
            } else {
                __half2 hk, hv;
                const uint32_t wk = word_of(kr, e / 2), wv = word_of(vr, e / 2);
                memcpy(&hk, &wk, 4);
                memcpy(&hv, &wv, 4);
                kx[e] = e % 2 ? __high2float(hk) : __low2float(hk);
                vx[e] = e % 2 ? __high2float(hv) : __low2float(hv);
            }
            if (c * E + e >= a.head_dim) kx[e] = vx[e] = 0.0f;  // the row padding may hold anything
        }
#pragma unroll
        for (int e = 0; e < E; e += 8)
            *reinterpret_cast<uint4*>(sK + r * LQ + c * E + e) =
                make_uint4(pack_half2(kx[e], kx[e + 1]), pack_half2(kx[e + 2], kx[e + 3]),
                           pack_half2(kx[e + 4], kx[e + 5]), pack_half2(kx[e + 6], kx[e + 7]));
#pragma unroll
        for (int e = 0; e < E; ++e) sVt[(c * E + e) * LV + r] = __float2half_rn(vx[e]);
    }
    if (KT == DType::I8)
        for (int r = threadIdx.x; r < BK; r += NT) {
            const int p = p0 + r;
            const int64_t row = p < p_end ? cache_row(a, block, p) : 0;
            sKs[r] = p < p_end ? a.k_scales[row] : 0.0f;
            sVs[r] = p < p_end ? a.v_scales[row] : 0.0f;
        }
}

__device__ __forceinline__ uint32_t ld_half2(const __half* p) { return *reinterpret_cast<const uint32_t*>(p); }

template <int DP, DType KT>
__global__ void __launch_bounds__(128) flash_prefill_mma_kernel(Args a) {
    pdl_wait();
    pdl_launch_dependents();
    constexpr int NT = 128, BQ = 64, BK = 64, LQ = DP + 8, LV = BK + 8, NJ = BK / 8, ND = DP / 8;
    SHARDLM_DYNAMIC_SMEM(float4, smem4);
    __half* sQh = reinterpret_cast<__half*>(smem4);
    __half* sQl = sQh + BQ * LQ;
    __half* sK = sQl + BQ * LQ;
    __half* sVt = sK + BK * LQ;
    float* sKs = reinterpret_cast<float*>(sVt + DP * LV);
    float* sVs = sKs + BK;

    const AttnChunk ch = a.chunks[blockIdx.z];
    const int kvh = blockIdx.y, rows_total = ch.n * a.group;
    const int r0 = int(gridDim.x - 1 - blockIdx.x) * BQ;  // the longest tiles first
    if (r0 >= rows_total) return;                          // whole block: before any barrier
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int kv_end = ch.pos0 + (min(rows_total, r0 + BQ) - 1) / a.group + 1;  // keys [0, kv_end)

    for (int w = tid; w < BQ * (DP / 2); w += NT) {
        const int r = w / (DP / 2), c = (w % (DP / 2)) * 2;
        const float2 x = q_pair(a, ch, kvh, r0 + r, rows_total, c);
        uint32_t hi, lo;
        split_half2(clamp_half(x.x * a.scale), clamp_half(x.y * a.scale), hi, lo);
        *reinterpret_cast<uint32_t*>(sQh + r * LQ + c) = hi;
        *reinterpret_cast<uint32_t*>(sQl + r * LQ + c) = lo;
    }
    // This thread's rows are warp * 16 + g and + 8 (rows past the chunk act as its last query:
    // zero q, never written); the warp's last query bounds the key tiles it has any work in.
    const int wr0 = r0 + warp * 16;
    int qpos[2];
    for (int h = 0; h < 2; ++h) qpos[h] = ch.pos0 + min(wr0 + g + 8 * h, rows_total - 1) / a.group;
    const int warp_last = ch.pos0 + min(wr0 + 15, rows_total - 1) / a.group;
    const int warp_lo = window_lo(ch.pos0 + min(wr0, rows_total - 1) / a.group, a.window);  // its first row's
    const unsigned span = window_span(a.window);
    // Keys from the block's first row's first key (a sliding window skips the older tiles).
    const int kv_begin = window_lo(ch.pos0 + r0 / a.group, a.window);

    float o[ND][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const int64_t block = (int64_t(ch.slot) * a.n_kv_heads + kvh) * a.capacity;
    for (int p0 = kv_begin; p0 < kv_end; p0 += BK) {
        stage_tile_mma<DP, KT>(a, block, p0, kv_end, sK, sVt, sKs, sVs);
        __syncthreads();
        if (p0 <= warp_last && p0 + BK > warp_lo) {  // warp-uniform: every lane takes part in the mma below
            float s[NJ][4] = {};
            const __half* qh = sQh + (warp * 16 + g) * LQ + 2 * t;
            const __half* ql = sQl + (warp * 16 + g) * LQ + 2 * t;
#pragma unroll
            for (int kk = 0; kk < DP; kk += 16) {
                const uint32_t ah[4] = {ld_half2(qh + kk), ld_half2(qh + 8 * LQ + kk), ld_half2(qh + kk + 8),
                                        ld_half2(qh + 8 * LQ + kk + 8)};
                const uint32_t al[4] = {ld_half2(ql + kk), ld_half2(ql + 8 * LQ + kk), ld_half2(ql + kk + 8),
                                        ld_half2(ql + 8 * LQ + kk + 8)};
#pragma unroll
                for (int j = 0; j < NJ; ++j) {
                    const __half* kr = sK + (j * 8 + g) * LQ + kk + 2 * t;
                    const uint32_t b[2] = {ld_half2(kr), ld_half2(kr + 8)};
                    mma_16816(s[j], ah, b);
                    mma_16816(s[j], al, b);
                }
            }
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < NJ; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = j * 8 + 2 * t + (e & 1);
                    float x = s[j][e];
                    if (KT == DType::I8) x *= sKs[key];
                    x = key_visible(qpos[e >> 1], p0 + key, span) ? x : -INFINITY;
                    s[j][e] = x;
                    mx[e >> 1] = fmaxf(mx[e >> 1], x);
                }
            float ref[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mx[h] = warp_max(mx[h], 4);  // the 4 lanes of a quad share the row
                const float m_new = fmaxf(m[h], mx[h]);
                ref[h] = safe_max(m_new);
                const float alpha = expf(m[h] - ref[h]);
                m[h] = m_new;
                l[h] *= alpha;  // this lane's part of the row sum (the quad's parts add up at the end)
#pragma unroll
                for (int n = 0; n < ND; ++n) {
                    o[n][2 * h] *= alpha;
                    o[n][2 * h + 1] *= alpha;
                }
            }
#pragma unroll
            for (int j = 0; j < NJ; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float p = expf(s[j][e] - ref[e >> 1]);
                    l[e >> 1] += p;
                    s[j][e] = KT == DType::I8 ? clamp_half(p * sVs[j * 8 + 2 * t + (e & 1)]) : p;
                }
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                // S's accumulators of key tiles 2kk and 2kk+1 are exactly P's A fragment of keys 16kk..16kk+15.
                uint32_t ph[4], pl[4];
                split_half2(s[2 * kk][0], s[2 * kk][1], ph[0], pl[0]);
                split_half2(s[2 * kk][2], s[2 * kk][3], ph[1], pl[1]);
                split_half2(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[2], pl[2]);
                split_half2(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[3], pl[3]);
#pragma unroll
                for (int n = 0; n < ND; ++n) {
                    const __half* vr = sVt + (n * 8 + g) * LV + kk * 16 + 2 * t;
                    const uint32_t b[2] = {ld_half2(vr), ld_half2(vr + 8)};
                    mma_16816(o[n], ph, b);
                    mma_16816(o[n], pl, b);
                }
            }
        }
        __syncthreads();  // K, V are restaged next iteration
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = warp_sum(l[h], 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int rr = wr0 + g + 8 * h;
        if (rr >= rows_total) continue;
        const int i = rr / a.group, head = kvh * a.group + rr % a.group;
        float* out = a.out + (int64_t(ch.row0 + i) * a.n_heads + head) * a.head_dim;
        const float inv = 1.0f / l[h];  // l >= 1: the row's maximum contributes exp(0)
#pragma unroll
        for (int n = 0; n < ND; ++n) {
            const int c = n * 8 + 2 * t;  // even, so c < head_dim implies c + 1 < head_dim
            if (c < a.head_dim) *reinterpret_cast<float2*>(out + c) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decode (one-token chunks), split-KV, registers only. Block (split, KV head x head subgroup,
// chunk); 128 threads; GB query heads of one KV group (1, 2 or 4; a larger group takes several
// subgroups, which re-read the group's rows from L2). A cache row is cut into PR = DP/16 pieces of
// 16 elements; thread t owns piece c = t % PR of the rows r = t / PR + KP j (KP = 128 / PR rows
// per pass) and keeps its query pieces, its K/V pieces and its 16 output columns per head in
// registers. Per round of KR = NR * KP keys (NR passes, at most 32 registers of raw K/V):
//   load K, V and scales of every pass at once -> 16-element dots, summed over the PR lanes of a
//   row by shuffles -> round max over the block (one barrier, double-buffered) -> rescale, P V.
// At the end the rows' partial outputs are summed (shuffles, then the four warps through shared
// memory) into the split's record. One global round trip per round, where staging tiles in
// shared memory cost a K/V load, then scores, softmax and P V phases with a barrier each.
// The first round's rows other than the newest position were written by earlier steps, so they
// are loaded before pdl_wait(): that latency overlaps the tail of the kernel before (rope_kv,
// which writes q and the newest row). Every kernel waits before it lets the next one start, so
// when this block runs, everything older than that kernel has completed.
constexpr int kv_bytes(DType t) { return t == DType::F32 ? 4 : (t == DType::I8 ? 1 : 2); }

// 16 consecutive elements of a cache row as S 16-byte words (S = the element size).
template <DType KT>
struct Piece {
    uint4 w[kv_bytes(KT)];
};

// One key's pieces and scales (1 for the float dtypes). Zeros unless loaded.
template <DType KT>
struct KeyPieces {
    Piece<KT> k, v;
    float ks, vs;
};

// Piece c (elements 16c .. 16c+15) of the rows of position `key`. A 16-byte word that starts at or
// past head_dim is not read (one that starts before it stays inside the 16-byte-multiple row).
template <DType KT>
__device__ __forceinline__ void load_key(const Args& a, int64_t block, int key, int c, KeyPieces<KT>& kp) {
    constexpr int S = kv_bytes(KT), EW = 16 / S;
    const int64_t row = cache_row(a, block, key);
    const uint4* kr = reinterpret_cast<const uint4*>(a.k + row * a.row_bytes) + c * S;
    const uint4* vr = reinterpret_cast<const uint4*>(a.v + row * a.row_bytes) + c * S;
#pragma unroll
    for (int s = 0; s < S; ++s) {
        const bool in = c * 16 + s * EW < a.head_dim;
        kp.k.w[s] = in ? __ldg(kr + s) : make_uint4(0, 0, 0, 0);
        kp.v.w[s] = in ? __ldg(vr + s) : make_uint4(0, 0, 0, 0);
    }
    if constexpr (KT == DType::I8) {
        kp.ks = __ldg(a.k_scales + row);
        kp.vs = __ldg(a.v_scales + row);
    }
}

// The same piece of the newest rows as the fused RoPE prologue made them in shared memory (one head
// each in the cache's format; scales[0] and scales[1] for I8).
template <DType KT>
__device__ __forceinline__ void load_new_key(const uint8_t* k_row, const uint8_t* v_row, const float* scales,
                                             int head_dim, int c, KeyPieces<KT>& kp) {
    constexpr int S = kv_bytes(KT), EW = 16 / S;
    const uint4* kr = reinterpret_cast<const uint4*>(k_row) + c * S;
    const uint4* vr = reinterpret_cast<const uint4*>(v_row) + c * S;
#pragma unroll
    for (int s = 0; s < S; ++s) {
        const bool in = c * 16 + s * EW < head_dim;
        kp.k.w[s] = in ? kr[s] : make_uint4(0, 0, 0, 0);
        kp.v.w[s] = in ? vr[s] : make_uint4(0, 0, 0, 0);
    }
    if constexpr (KT == DType::I8) {
        kp.ks = scales[0];
        kp.vs = scales[1];
    }
}

template <DType KT>
__device__ __forceinline__ KeyPieces<KT> no_key() {
    KeyPieces<KT> kp;
#pragma unroll
    for (int s = 0; s < kv_bytes(KT); ++s) kp.k.w[s] = kp.v.w[s] = make_uint4(0, 0, 0, 0);
    kp.ks = kp.vs = 1.0f;
    return kp;
}

// The piece as floats; I8 values are float(q) * scale, as on the CPU.
template <DType KT>
__device__ __forceinline__ void piece_floats(const Piece<KT>& p, float scale, float (&x)[16]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        if constexpr (KT == DType::F32) {
            x[i] = __uint_as_float(word_of(p.w[i / 4], i % 4));
        } else if constexpr (KT == DType::F16) {
            const uint32_t u = word_of(p.w[i / 8], (i / 2) % 4);
            x[i] = __half2float(__ushort_as_half(uint16_t(i % 2 ? u >> 16 : u & 0xffffu)));  // low half first
        } else if constexpr (KT == DType::BF16) {
            const uint32_t u = word_of(p.w[i / 8], (i / 2) % 4);
            x[i] = __uint_as_float(i % 2 ? u & 0xffff0000u : u << 16);
        } else {
            x[i] = float(int8_t(uint8_t(word_of(p.w[0], i / 4) >> (8 * (i % 4))))) * scale;
        }
    }
}

template <int DP, int GB, DType KT>
__global__ void __launch_bounds__(128) flash_decode_kernel(Args a, int n_sub) {
    constexpr int NT = 128, NW = NT / 32, PR = DP / 16, KP = NT / PR;
    constexpr int NR = KT == DType::F32 ? 1 : (32 / KP < 4 / kv_bytes(KT) ? 32 / KP : 4 / kv_bytes(KT));
    constexpr int KR = NR * KP;
    static_assert(PR >= 4 && PR <= 16 && NR >= 1, "DP is 64, 128 or 256");
    __shared__ float s_max[2][NW][GB];
    __shared__ float s_l[NW][GB];
    __shared__ __align__(16) float s_red[NW][GB][DP];
    __shared__ __align__(16) float s_q[GB][DP];                     // fused RoPE: rotated q heads
    __shared__ __align__(16) uint8_t s_new[2][DP * kv_bytes(KT)];  // fused RoPE: newest K, V rows
    __shared__ float s_new_scale[2];

    // The chunk table is written before the step starts (see above).
    const AttnChunk ch = a.chunks[blockIdx.z];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, c = tid % PR, r = tid / PR;
    const int kvh = blockIdx.y / n_sub, g0 = int(blockIdx.y % n_sub) * GB;
    const int n_g = min(GB, a.group - g0), h0 = kvh * a.group + g0;
    const int kv_len = ch.pos0 + 1, newest = ch.pos0;
    // Splits from the query's first key: the window's (or position 0), so that the splits of a
    // capacity cover every key it sees.
    const int k_begin = window_lo(newest, a.window) + int(blockIdx.x) * a.keys_per_split;
    const int k_end = min(k_begin + a.keys_per_split, kv_len);
    const int64_t block = (int64_t(ch.slot) * a.n_kv_heads + kvh) * a.capacity;
    const bool active = ch.n >= 1 && k_begin < k_end;  // uniform over the block

    KeyPieces<KT> kv[NR];
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        kv[j] = no_key<KT>();
        const int key = k_begin + j * KP + r;
        if (active && key < k_end && key != newest) load_key(a, block, key, c, kv[j]);
    }
    const int hd2 = a.head_dim / 2;  // rope pairs (i, i + hd2)
    rope::Angles ang{};
    if (a.rope.on && ch.n >= 1) ang = rope::angles(a.rope.inv_freq, float(newest), lane, hd2);
    pdl_wait();
    pdl_launch_dependents();
    if (ch.n < 1) return;
    const int64_t rec0 = (int64_t(blockIdx.z) * a.n_heads + h0) * a.n_splits + blockIdx.x;  // head g: + g n_splits
    const int64_t rec_size = a.head_dim + 2;
    if (!active) {  // an empty split (whole block, before any barrier)
        if (tid < n_g) {
            float* rec = a.partials + (rec0 + int64_t(tid) * a.n_splits) * rec_size;
            rec[0] = -INFINITY;
            rec[1] = 0.0f;
        }
        return;
    }
    const bool has_newest = newest >= k_begin && newest < k_end;
    if (a.rope.on) {
        // The RoPE prologue (rope_kv_kernel's operations), one warp per head: the block's query
        // heads into s_q and, in the split holding the newest position, its k (normed, rotated)
        // and v in the cache's format into s_new; subgroup 0's block also writes them to the
        // cache. The global rows are only written here: every block reads the newest key from
        // its own copy in s_new, in whichever round it falls.
        const int tasks = n_g + (has_newest ? 2 : 0);
        for (int task = warp; task < tasks; task += NW) {
            if (task < n_g) {
                const float* x = a.rope.q + int64_t(ch.row0) * a.rope.q_stride + int64_t(h0 + task) * a.head_dim;
                rope::HeadRegs h = rope::load_head(x, lane, hd2);
                if (a.rope.q_norm) rope::norm_head(h, rope::load_head(a.rope.q_norm, lane, hd2), hd2, a.rope.eps);
                rope::rotate(h, ang);
                rope::store_head(h, s_q[task], lane, hd2);
                continue;
            }
            const bool is_k = task == n_g;
            const float* x = (is_k ? a.rope.k : a.rope.v) + int64_t(ch.row0) * a.rope.kv_stride +
                             int64_t(kvh) * a.head_dim;
            rope::HeadRegs h = rope::load_head(x, lane, hd2);
            if (is_k) {
                if (a.rope.k_norm) rope::norm_head(h, rope::load_head(a.rope.k_norm, lane, hd2), hd2, a.rope.eps);
                rope::rotate(h, ang);
            }
            const int i = is_k ? 0 : 1;
            rope::store_cache_row<KT>(h, s_new[i], &s_new_scale[i], 0, 0, lane, hd2);
            if (g0 == 0)
                rope::store_cache_row<KT>(h, is_k ? a.rope.k_cache : a.rope.v_cache,
                                          is_k ? a.rope.k_scales : a.rope.v_scales, cache_row(a, block, newest),
                                          a.rope.row_stride, lane, hd2);
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        if (k_begin + j * KP + r != newest) continue;
        if (a.rope.on) load_new_key(s_new[0], s_new[1], s_new_scale, a.head_dim, c, kv[j]);
        else load_key(a, block, newest, c, kv[j]);
    }

    // This thread's query pieces (zeros past head_dim and for heads past the group).
    float q[GB][16];
#pragma unroll
    for (int g = 0; g < GB; ++g) {
        const float* qr = a.rope.on ? s_q[g] : a.q + (int64_t(ch.row0) * a.n_heads + h0 + g) * a.head_dim;
#pragma unroll
        for (int i = 0; i < 16; i += 2) {
            const int col = c * 16 + i;  // head_dim is even: a pair is wholly in or out
            const float2 x = g < n_g && col < a.head_dim ? *reinterpret_cast<const float2*>(qr + col)
                                                         : make_float2(0.0f, 0.0f);
            q[g][i] = x.x;
            q[g][i + 1] = x.y;
        }
    }

    float m_run[GB], l_run[GB], acc[GB][16];
#pragma unroll
    for (int g = 0; g < GB; ++g) {
        m_run[g] = -INFINITY;
        l_run[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) acc[g][i] = 0.0f;
    }
    int parity = 0;
    for (int p0 = k_begin; p0 < k_end; p0 += KR) {
        if (p0 != k_begin) {
#pragma unroll
            for (int j = 0; j < NR; ++j) {
                kv[j] = no_key<KT>();
                const int key = p0 + j * KP + r;
                // The fused prologue's newest row: this block's own copy (another block may be the
                // one writing it to the cache, and this kernel's loads are not ordered after that).
                if (a.rope.on && key == newest) load_new_key(s_new[0], s_new[1], s_new_scale, a.head_dim, c, kv[j]);
                else if (key < k_end) load_key(a, block, key, c, kv[j]);
            }
        }
        float s[NR][GB];
#pragma unroll
        for (int j = 0; j < NR; ++j) {
            float x[16];
            piece_floats(kv[j].k, kv[j].ks, x);
#pragma unroll
            for (int g = 0; g < GB; ++g) s[j][g] = 0.0f;
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                // Selected, not multiplied: padding past head_dim may hold NaN.
                const float xi = c * 16 + i < a.head_dim ? x[i] : 0.0f;
#pragma unroll
                for (int g = 0; g < GB; ++g) s[j][g] = fmaf(q[g][i], xi, s[j][g]);
            }
        }
        float mr[GB];
#pragma unroll
        for (int g = 0; g < GB; ++g) {
            mr[g] = -INFINITY;
#pragma unroll
            for (int j = 0; j < NR; ++j) {
                float x = s[j][g];
#pragma unroll
                for (int off = 1; off < PR; off <<= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
                x = p0 + j * KP + r < k_end ? x * a.scale : -INFINITY;
                s[j][g] = x;
                mr[g] = fmaxf(mr[g], x);
            }
#pragma unroll
            for (int off = PR; off < 32; off <<= 1) mr[g] = fmaxf(mr[g], __shfl_xor_sync(0xffffffffu, mr[g], off));
        }
        if (lane == 0)
#pragma unroll
            for (int g = 0; g < GB; ++g) s_max[parity][warp][g] = mr[g];
        __syncthreads();  // double-buffered: round n + 2 rewrites this buffer only after every warp
                          // has passed round n + 1's barrier, hence finished reading it
        float ref[GB];
#pragma unroll
        for (int g = 0; g < GB; ++g) {
            float m_new = m_run[g];
#pragma unroll
            for (int w = 0; w < NW; ++w) m_new = fmaxf(m_new, s_max[parity][w][g]);
            ref[g] = safe_max(m_new);
            const float alpha = expf(m_run[g] - ref[g]);
            m_run[g] = m_new;
            l_run[g] *= alpha;
#pragma unroll
            for (int i = 0; i < 16; ++i) acc[g][i] *= alpha;
        }
#pragma unroll
        for (int j = 0; j < NR; ++j) {
            float x[16];
            piece_floats(kv[j].v, kv[j].vs, x);  // padding columns only reach output columns never stored
#pragma unroll
            for (int g = 0; g < GB; ++g) {
                const float p = expf(s[j][g] - ref[g]);  // a masked key: exp(-inf) = 0, its V is zeros
                l_run[g] += p;
#pragma unroll
                for (int i = 0; i < 16; ++i) acc[g][i] = fmaf(p, x[i], acc[g][i]);
            }
        }
        parity ^= 1;
    }

    // Sum over the rows: the lanes of a warp holding the same piece (xor PR .. 16), then the warps.
    // Every lane of a row counted that row's keys in l_run, so l sums one lane per row.
#pragma unroll
    for (int g = 0; g < GB; ++g) {
#pragma unroll
        for (int off = PR; off < 32; off <<= 1) {
            l_run[g] += __shfl_xor_sync(0xffffffffu, l_run[g], off);
#pragma unroll
            for (int i = 0; i < 16; ++i) acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], off);
        }
    }
    if (lane < PR) {
#pragma unroll
        for (int g = 0; g < GB; ++g)
#pragma unroll
            for (int i = 0; i < 16; i += 4)
                *reinterpret_cast<float4*>(&s_red[warp][g][c * 16 + i]) =
                    make_float4(acc[g][i], acc[g][i + 1], acc[g][i + 2], acc[g][i + 3]);
    }
    if (lane == 0)
#pragma unroll
        for (int g = 0; g < GB; ++g) s_l[warp][g] = l_run[g];
    __syncthreads();
    for (int o = tid; o < GB * DP; o += NT) {
        const int g = o / DP, col = o % DP;
        if (g >= n_g || col >= a.head_dim) continue;
        float x = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; ++w) x += s_red[w][g][col];
        a.partials[(rec0 + int64_t(g) * a.n_splits) * rec_size + 2 + col] = x;
    }
#pragma unroll
    for (int g = 0; g < GB; ++g) {
        if (tid != g || g >= n_g) continue;
        float l = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; ++w) l += s_l[w][g];
        float* rec = a.partials + (rec0 + int64_t(g) * a.n_splits) * rec_size;
        rec[0] = m_run[g];  // the same in every thread: every round took the block's max
        rec[1] = l;
    }
}

// out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M = max_s m_s. Empty splits (m = -inf)
// weigh 0: their acc was never written and is dropped by a select. Block (head, chunk), 128
// threads; thread t owns columns t and t + 128 (head_dim <= 256). One global round trip: every
// thread loads its columns of every split while warp 0 loads each split's m and l (lane s: split
// s; n_splits <= kMaxSplits = 32), rather than weights first and columns after.
__global__ void __launch_bounds__(128) flash_merge_kernel(Args a) {
    const AttnChunk ch = a.chunks[blockIdx.y];  // written before the step (see flash_decode_kernel)
    pdl_wait();
    pdl_launch_dependents();
    if (ch.n < 1) return;
    const int h = blockIdx.x, tid = int(threadIdx.x);
    const int64_t rec_size = a.head_dim + 2;
    const float* recs = a.partials + (int64_t(blockIdx.y) * a.n_heads + h) * a.n_splits * rec_size;
    __shared__ float weight[kMaxSplits];
    __shared__ float inv_l;
    float v[2][kMaxSplits];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int c = tid + 128 * k;
#pragma unroll
        for (int sp = 0; sp < kMaxSplits; ++sp)
            v[k][sp] = sp < a.n_splits && c < a.head_dim ? recs[sp * rec_size + 2 + c] : 0.0f;
    }
    if (tid < 32) {
        const float m = tid < a.n_splits ? recs[tid * rec_size] : -INFINITY;
        const float ls = tid < a.n_splits ? recs[tid * rec_size + 1] : 0.0f;
        const float mx = warp_max(m, 32);  // every lane: a shuffle
        const float w = m == -INFINITY ? 0.0f : expf(m - mx);
        const float l = warp_sum(w * ls, 32);
        weight[tid] = w;
        if (tid == 0) inv_l = 1.0f / l;  // split 0 holds key 0, so l >= 1
    }
    __syncthreads();
    float* o = a.out + (int64_t(ch.row0) * a.n_heads + h) * a.head_dim;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int c = tid + 128 * k;
        float x = 0.0f;
#pragma unroll
        for (int sp = 0; sp < kMaxSplits; ++sp) x = weight[sp] != 0.0f ? fmaf(v[k][sp], weight[sp], x) : x;
        if (c < a.head_dim) o[c] = x * inv_l;
    }
}

// ---------------------------------------------------------------------------------------------
// Naive: block (query i, head, chunk), 128 threads. Pass 1: max score; pass 2: sum of exp;
// pass 3: for each run of 128 keys the threads recompute their key's weight into shared memory,
// then each thread accumulates its columns. No scratch; any chunk shape; head_dim <= 256.
constexpr int kNaiveThreads = 128, kMaxHeadDim = 256;

__device__ __forceinline__ float cache_elem(const uint8_t* row, int c, DType t, float scale) {
    switch (t) {
        case DType::F32: return reinterpret_cast<const float*>(row)[c];
        case DType::F16: return __half2float(reinterpret_cast<const __half*>(row)[c]);
        case DType::BF16: return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(row)[c]) << 16);
        default: return float(reinterpret_cast<const int8_t*>(row)[c]) * scale;
    }
}

__device__ __forceinline__ float naive_score(const Args& a, const float* sq, int64_t block, int j) {
    const int64_t row = cache_row(a, block, j);
    const uint8_t* kr = a.k + row * a.row_bytes;
    const float ks = a.k_scales ? a.k_scales[row] : 1.0f;
    float s = 0.0f;
    for (int c = 0; c < a.head_dim; ++c) s = fmaf(sq[c], cache_elem(kr, c, a.dtype, ks), s);
    return s * a.scale;
}

template <bool IsMax>
__device__ float block_reduce(float x, float* red) {
    x = IsMax ? warp_max(x, 32) : warp_sum(x, 32);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < kNaiveThreads / 32; ++w) r = IsMax ? fmaxf(r, red[w]) : r + red[w];
    __syncthreads();  // red is reused by the next reduction
    return r;
}

__global__ void __launch_bounds__(kNaiveThreads) naive_kernel(Args a) {
    pdl_wait();
    pdl_launch_dependents();
    const AttnChunk ch = a.chunks[blockIdx.z];
    const int i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    if (i >= ch.n) return;  // whole block
    __shared__ float sq[kMaxHeadDim], sp[kNaiveThreads], red[kNaiveThreads / 32];
    const float* q = a.q + (int64_t(ch.row0 + i) * a.n_heads + h) * a.head_dim;
    for (int c = tid; c < a.head_dim; c += kNaiveThreads) sq[c] = q[c];
    __syncthreads();
    const int n_keys = ch.pos0 + i + 1, j_lo = window_lo(ch.pos0 + i, a.window);  // keys [j_lo, n_keys)
    const int64_t block = (int64_t(ch.slot) * a.n_kv_heads + h / a.group) * a.capacity;

    float mx = -INFINITY;
    for (int j = j_lo + tid; j < n_keys; j += kNaiveThreads) mx = fmaxf(mx, naive_score(a, sq, block, j));
    mx = block_reduce<true>(mx, red);
    float sum = 0.0f;
    for (int j = j_lo + tid; j < n_keys; j += kNaiveThreads) sum += expf(naive_score(a, sq, block, j) - mx);
    sum = block_reduce<false>(sum, red);

    float acc[kMaxHeadDim / kNaiveThreads] = {};
    for (int j0 = j_lo; j0 < n_keys; j0 += kNaiveThreads) {
        const int j = j0 + tid;
        sp[tid] = j < n_keys ? expf(naive_score(a, sq, block, j) - mx) : 0.0f;
        __syncthreads();
        const int n = min(kNaiveThreads, n_keys - j0);
        for (int jj = 0; jj < n; ++jj) {
            const int64_t row = cache_row(a, block, j0 + jj);
            const uint8_t* vr = a.v + row * a.row_bytes;
            const float vs = a.v_scales ? a.v_scales[row] : 1.0f;
#pragma unroll
            for (int t = 0; t < kMaxHeadDim / kNaiveThreads; ++t) {
                const int c = tid + t * kNaiveThreads;
                if (c < a.head_dim) acc[t] = fmaf(sp[jj], cache_elem(vr, c, a.dtype, vs), acc[t]);
            }
        }
        __syncthreads();  // sp is rewritten by the next run
    }
    float* o = a.out + (int64_t(ch.row0 + i) * a.n_heads + h) * a.head_dim;
    const float inv = 1.0f / sum;
#pragma unroll
    for (int t = 0; t < kMaxHeadDim / kNaiveThreads; ++t) {
        const int c = tid + t * kNaiveThreads;
        if (c < a.head_dim) o[c] = acc[t] * inv;
    }
}

// ---------------------------------------------------------------------------------------------
// Host side.

// Opts a kernel into more than 48 KB of dynamic shared memory, once per device (`done` holds one
// bit per device and belongs to the caller's instantiation; every kernel here has the same type).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, std::atomic<uint64_t>& done) {
    if (bytes <= 48 * 1024) return;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const uint64_t bit = uint64_t(1) << (dev & 63);
    if (done.load() & bit) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    done.fetch_or(bit);
}

template <int DP>
void launch_prefill(const Args& args, const AttentionCuda& a, cudaStream_t stream) {
    constexpr int BK = DP >= 256 ? 32 : 64, BQ = 32;
    const size_t smem = size_t(BQ * (DP + 4) + 2 * BK * (DP + 4) + BQ * (BK + 4)) * sizeof(float);
    auto kernel = flash_prefill_kernel<DP, BK>;
    static std::atomic<uint64_t> smem_done{0};
    allow_smem(kernel, smem, smem_done);
    const int64_t tiles = (a.max_chunk_n * args.group + BQ - 1) / BQ;
    SHARDLM_CHECK(tiles < (int64_t(1) << 31), "attention: chunk of ", a.max_chunk_n, " tokens is too long");
    const dim3 grid(unsigned(tiles), unsigned(a.n_kv_heads), unsigned(a.n_chunks));
    launch_kernel("flash_prefill_kernel", kernel, grid, dim3(256), smem, stream, args);
}

template <int DP, DType KT>
void launch_prefill_mma(const Args& args, const AttentionCuda& a, cudaStream_t stream) {
    constexpr int BQ = 64, BK = 64;
    const size_t smem = size_t(2 * BQ * (DP + 8) + BK * (DP + 8) + DP * (BK + 8)) * sizeof(__half) + 2 * BK * sizeof(float);
    auto kernel = flash_prefill_mma_kernel<DP, KT>;
    static std::atomic<uint64_t> smem_done{0};
    allow_smem(kernel, smem, smem_done);
    const int64_t tiles = (a.max_chunk_n * args.group + BQ - 1) / BQ;
    SHARDLM_CHECK(tiles < (int64_t(1) << 31), "attention: chunk of ", a.max_chunk_n, " tokens is too long");
    const dim3 grid(unsigned(tiles), unsigned(a.n_kv_heads), unsigned(a.n_chunks));
    launch_kernel("flash_prefill_mma_kernel", kernel, grid, dim3(128), smem, stream, args);
}

template <int DP>
void launch_prefill_mma_dp(const Args& args, const AttentionCuda& a, cudaStream_t stream) {
    switch (args.dtype) {
        case DType::F16: launch_prefill_mma<DP, DType::F16>(args, a, stream); break;
        case DType::BF16: launch_prefill_mma<DP, DType::BF16>(args, a, stream); break;
        default: launch_prefill_mma<DP, DType::I8>(args, a, stream); break;
    }
}

template <int DP, int GB, DType KT>
void launch_decode(const Args& args, const AttentionCuda& a, cudaStream_t stream) {
    const int n_sub = (args.group + GB - 1) / GB;
    const int64_t ys = a.n_kv_heads * n_sub;
    SHARDLM_CHECK(ys <= 65535, "attention: too many heads for the decode grid");
    launch_kernel("flash_decode_kernel", flash_decode_kernel<DP, GB, KT>,
                  dim3(unsigned(args.n_splits), unsigned(ys), unsigned(a.n_chunks)), dim3(128), 0, stream, args,
                  n_sub);
    launch_kernel("flash_merge_kernel", flash_merge_kernel, dim3(unsigned(a.n_heads), unsigned(a.n_chunks)),
                  dim3(128), 0, stream, args);
}

// GB = query heads per block: the whole group up to 4 (registers: 32 per head for q and the
// output); larger groups are cut into subgroups of 4.
template <int DP, DType KT>
void launch_decode_gb(const Args& args, const AttentionCuda& a, cudaStream_t stream) {
    if (args.group == 1) launch_decode<DP, 1, KT>(args, a, stream);
    else if (args.group == 2) launch_decode<DP, 2, KT>(args, a, stream);
    else launch_decode<DP, 4, KT>(args, a, stream);
}

template <int DP>
void launch_decode_dp(const Args& args, const AttentionCuda& a, cudaStream_t stream) {
    switch (args.dtype) {
        case DType::F32: launch_decode_gb<DP, DType::F32>(args, a, stream); break;
        case DType::F16: launch_decode_gb<DP, DType::F16>(args, a, stream); break;
        case DType::BF16: launch_decode_gb<DP, DType::BF16>(args, a, stream); break;
        default: launch_decode_gb<DP, DType::I8>(args, a, stream); break;
    }
}

}  // namespace

size_t attention_scratch_bytes(int64_t max_chunks, int64_t n_heads, int64_t head_dim, int64_t capacity) {
    return size_t(max_chunks * n_heads * split_plan(capacity).n_splits * (head_dim + 2)) * sizeof(float);
}

void attention_cuda(const AttentionCuda& a, AttentionKind kind, cudaStream_t stream) {
    if (a.n_chunks == 0 || a.max_chunk_n == 0) return;
    const DeviceKVLayer& kv = a.kv;
    SHARDLM_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "attention: ", a.n_heads, " heads over ",
                  a.n_kv_heads, " KV heads");
    SHARDLM_CHECK(a.head_dim >= 2 && a.head_dim <= kMaxHeadDim && a.head_dim % 2 == 0, "attention: head_dim ",
                  a.head_dim, " (even, at most 256)");
    SHARDLM_CHECK(kv.dtype == DType::F32 || kv.dtype == DType::F16 || kv.dtype == DType::BF16 ||
                      kv.dtype == DType::I8,
                  "attention: KV cache dtype ", dtype_name(kv.dtype));
    SHARDLM_CHECK(kv.dtype != DType::I8 || (kv.k_scales && kv.v_scales), "attention: INT8 KV cache needs scales");
    SHARDLM_CHECK(kv.n_kv_heads == a.n_kv_heads && kv.capacity > 0 && kv.capacity < (int64_t(1) << 31),
                  "attention: KV layer shape");
    const int64_t row_bytes = kv.row_stride * int64_t(dtype_size(kv.dtype));
    SHARDLM_CHECK(kv.row_stride >= a.head_dim && row_bytes % 16 == 0, "attention: KV row stride ", kv.row_stride);
    SHARDLM_CHECK(is_aligned(kv.k, 16) && is_aligned(kv.v, 16) && (a.rope || is_aligned(a.q, 8)) &&
                      is_aligned(a.out, 8),
                  "attention: misaligned q, out or KV cache");
    SHARDLM_CHECK(a.n_chunks <= 65535 && a.n_heads <= 65535 && a.max_chunk_n < (int64_t(1) << 31),
                  "attention: ", a.n_chunks, " chunks x ", a.n_heads, " heads exceed the grid");
    SHARDLM_CHECK(a.window >= 0 && a.window < (int64_t(1) << 31), "attention: window ", a.window);

    const SplitPlan plan = split_plan(kv.capacity);
    Args args{};
    args.q = a.q;
    args.out = a.out;
    args.chunks = a.chunks;
    args.k = static_cast<const uint8_t*>(kv.k);
    args.v = static_cast<const uint8_t*>(kv.v);
    args.k_scales = kv.dtype == DType::I8 ? kv.k_scales : nullptr;
    args.v_scales = kv.dtype == DType::I8 ? kv.v_scales : nullptr;
    args.dtype = kv.dtype;
    args.n_heads = int(a.n_heads);
    args.n_kv_heads = int(a.n_kv_heads);
    args.group = int(a.n_heads / a.n_kv_heads);
    args.head_dim = int(a.head_dim);
    args.capacity = kv.capacity;
    args.row_bytes = row_bytes;
    args.scale = a.scale;
    args.window = int(a.window);
    args.partials = static_cast<float*>(a.scratch);
    args.n_splits = plan.n_splits;
    args.keys_per_split = plan.keys_per_split;

    if (a.rope) {
        const RopeKVParams& r = *a.rope;
        SHARDLM_CHECK(kind != AttentionKind::Naive && a.max_chunk_n == 1,
                      "attention: the fused RoPE prologue is for Flash decode steps (one-token chunks)");
        SHARDLM_CHECK(r.n_heads == a.n_heads && r.n_kv_heads == a.n_kv_heads && r.head_dim == a.head_dim &&
                          r.kv.k == kv.k && r.kv.v == kv.v && r.kv.k_scales == kv.k_scales &&
                          r.kv.v_scales == kv.v_scales && r.kv.row_stride == kv.row_stride,
                      "attention: the fused RoPE parameters describe other heads or another cache");
        SHARDLM_CHECK(r.q && r.k && r.v && r.inv_freq, "attention: the fused RoPE needs q, k, v and inv_freq");
        args.rope.on = true;
        args.rope.q = r.q;
        args.rope.k = r.k;
        args.rope.v = r.v;
        args.rope.q_stride = r.row_stride ? r.row_stride : r.n_heads * r.head_dim;
        args.rope.kv_stride = r.row_stride ? r.row_stride : r.n_kv_heads * r.head_dim;
        args.rope.inv_freq = r.inv_freq;
        args.rope.q_norm = r.q_norm;
        args.rope.k_norm = r.k_norm;
        args.rope.eps = r.eps;
        args.rope.k_cache = static_cast<uint8_t*>(kv.k);
        args.rope.v_cache = static_cast<uint8_t*>(kv.v);
        args.rope.k_scales = kv.k_scales;
        args.rope.v_scales = kv.v_scales;
        args.rope.row_stride = kv.row_stride;
    }

    if (kind == AttentionKind::Naive) {
        const dim3 grid(unsigned(a.max_chunk_n), unsigned(a.n_heads), unsigned(a.n_chunks));
        launch_kernel("naive_kernel", naive_kernel, grid, dim3(kNaiveThreads), 0, stream, args);
        return;
    }
    const int dp = a.head_dim <= 64 ? 64 : (a.head_dim <= 128 ? 128 : 256);
    if (a.max_chunk_n == 1) {
        SHARDLM_CHECK(a.scratch && is_aligned(a.scratch, 8),
                      "attention: decode needs attention_scratch_bytes() of scratch");
        if (dp == 64) launch_decode_dp<64>(args, a, stream);
        else if (dp == 128) launch_decode_dp<128>(args, a, stream);
        else launch_decode_dp<256>(args, a, stream);
    } else if (kind == AttentionKind::Flash && dp <= 128 && kv.dtype != DType::F32 && prefill_tensor_cores()) {
        if (dp == 64) launch_prefill_mma_dp<64>(args, a, stream);
        else launch_prefill_mma_dp<128>(args, a, stream);
    } else {
        if (dp == 64) launch_prefill<64>(args, a, stream);
        else if (dp == 128) launch_prefill<128>(args, a, stream);
        else launch_prefill<256>(args, a, stream);
    }
}

}  // namespace shardlm
