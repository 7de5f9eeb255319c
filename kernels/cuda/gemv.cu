// Decode GEMV: y[t, r] = sum_c x[t, c] * W[r, c] (+ bias[r]) for t < n <= 8, W read once.
//
// Vector path (16-byte aligned W and x, row pitch a multiple of 16 bytes, I8 groups a multiple
// of 16 columns). A block of 8 warps owns 4 * R rows: each warp is 4 groups of 8 lanes, group g
// owns R rows, and the block's 64 lanes of a row walk it in 16-byte chunks,
//
//   chunk k of a row (bytes [16k, 16k + 16)) -> warp (k / 8) % 8, lane k % 8 of each group,
//
// so one warp load fetches four whole 128-byte segments (one per group) and a block step reads
// 1 KB of each of its rows. Why this should stream at HBM speed:
// - weights move only in 128-bit loads (4 f32, 8 f16/bf16, 16 i8), predicated in straight-line
//   code so R * U of them are in flight per lane (VecConfig), with L1::no_allocate so the
//   stream does not evict x. Tens of KB in flight per SM, above the ~25 KB that Little's law asks
//   of 4.3 TB/s at ~700 ns loaded latency over 132 SMs.
// - x (f32, n * cols * 4 bytes, at most 192 KB) is read through L1 with float4 loads rather than
//   staged in shared memory: staging would need up to 192 KB per block (one block per SM, and a
//   bubble before the first weight load) and every block would copy it again. The 4 groups of a
//   warp read the same x addresses (a broadcast) and one x load feeds R rows, so L1 serves
//   n * 4 / (4 * R * sizeof(w)) bytes per weight byte, at most 4 (i8, n = 8), against ~8x the
//   SM's share of HBM bandwidth.
// - I8 dequantizes in registers: (byte ^ 0x80) becomes the mantissa of 2^23 by one PRMT, one FADD
//   of -(2^23 + 128) gives the integer exactly; a chunk's 16 products are summed, then scaled once
//   (a chunk never straddles a group). f16 -> f32 is exact, bf16 -> f32 a shift or a mask.
// - per weight a lane spends n FMAs plus ~1-2 instructions (conversion, loads), so up to n = 4
//   memory sets the pace. At n = 8 the FP32 FMA rate caps I8 near 70% of HBM bandwidth on H200
//   (8 FMAs per byte); f16 at n = 8 needs ~70% of the issue rate.
// - I4 (W = q * scale + min per group, weights_view.h): a 16-byte chunk is exactly one 32-column
//   block, so it never straddles a group either. Quad q of the chunk is word q & 3's low nibbles
//   (q < 4) or high nibbles (columns 4q.. either way): one AND (and a shift) per four codes, then
//   the I8 trick without the bias, 0x4B00000q = 2^23 + q exactly. With no more token rows than
//   rows per group (n <= R) the chunk's sums over q * x are scaled once and the min joins as
//   min * sum(x) (x's chunk sum, shared by the R rows): n + n/R + ~2.3 instructions per weight.
//   With more token rows each weight is dequantized by one FMA (q * scale + min) before its n
//   FMAs: n + ~3.3. At 4 bits per weight these kernels are near the issue limit at n = 1 where
//   I8 is not; untimed (no GPU yet).
// Sums: shuffles within a group, then the 8 warps through shared memory, in a fixed order
// (results are the same run to run).
//
// Scalar path (anything else: odd cols, misaligned pointers, odd I8 groups): one warp per row,
// lanes stride over columns. Plainly right, not fast; the shapes of real models never take it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "kernels/cuda/align.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gemv_tile.h"
#include "kernels/cuda/interleave.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/words.h"

namespace shardlm {
namespace {

using namespace gemv_tile;

enum class WKind { F32, F16, BF16, I8, I4 };

// Columns in one 16-byte chunk of weights.
template <WKind K>
constexpr int chunk_cols() {
    return K == WKind::F32 ? 4 : K == WKind::I8 ? 16 : K == WKind::I4 ? 32 : 8;
}

struct GemvArgs {
    const char* w;          // [rows, cols] row-major, row pitch row_bytes
    const float* scales;    // I8, I4: [rows, groups]
    const float* mins;      // I4: [rows, groups]
    const float* x;         // [n, cols]
    const float* bias;      // [rows] or null
    float* y;               // [n, rows]
    int64_t rows, cols, row_bytes;
    int n;
    int chunks;             // 16-byte chunks per row (vector path)
    int64_t groups;         // I8/I4 scales per row
    int group_chunks;       // I8/I4 chunks per group (vector path)
    int group_shift;        // chunk -> group: k >> shift when >= 0 (31: one group), else k / group_chunks
    int64_t group_size;     // I8/I4 columns per group (scalar path)
    // Where a lane's x starts and how far apart its float4s are (vector path), in floats: chunk k
    // reads x[(k >> block_shift) * block_cols + (k & (2^block_shift - 1)) * lane_stride +
    // q * quad_stride ..] for its quad q. Natural order: (3, 8C, C, 4); interleaved (interleave.h)
    // with B chunks per block: (log2 B, BC, 4, 4B).
    int block_shift, block_cols, lane_stride, quad_stride;
    int interleave_c;       // scalar path: C when the weights are interleaved, else 0
    int64_t swiglu_half;    // > 0: W is [gate; up], half rows each, y = silu(gate) * up [n, half]
    int64_t tiles;          // vector path: row tiles; block b takes tiles b, b + gridDim.x, ...
    const float* norm_w;    // GemvFuse::norm_w: the input is rmsnorm(x) * norm_w (null: x)
    float eps;              // GemvFuse::eps
    int accumulate;         // GemvFuse::accumulate: y += the result
};

__device__ __forceinline__ float2 f16x2_to_f32(uint32_t bits) {
    __half2 h;
    static_assert(sizeof(h) == sizeof(bits), "half2 is 4 bytes");
    memcpy(&h, &bits, sizeof(bits));
    return __half22float2(h);
}

// Columns [4q, 4q + 4) of a 16-byte chunk as floats (q < chunk_cols<K>() / 4): one float4 of x
// meets these four weights.
template <WKind K>
__device__ __forceinline__ void quad_to_f32(const uint4& v, int q, float (&f)[4]) {
    if constexpr (K == WKind::F32) {
        f[0] = __uint_as_float(v.x);
        f[1] = __uint_as_float(v.y);
        f[2] = __uint_as_float(v.z);
        f[3] = __uint_as_float(v.w);
    } else if constexpr (K == WKind::F16) {
        const float2 lo = f16x2_to_f32(word_of(v, 2 * q)), hi = f16x2_to_f32(word_of(v, 2 * q + 1));
        f[0] = lo.x;  // little-endian: the low half is the lower column
        f[1] = lo.y;
        f[2] = hi.x;
        f[3] = hi.y;
    } else if constexpr (K == WKind::BF16) {
        const uint32_t lo = word_of(v, 2 * q), hi = word_of(v, 2 * q + 1);
        f[0] = __uint_as_float(lo << 16);
        f[1] = __uint_as_float(lo & 0xffff0000u);
        f[2] = __uint_as_float(hi << 16);
        f[3] = __uint_as_float(hi & 0xffff0000u);
    } else if constexpr (K == WKind::I8) {
        // int8 b -> float: bits 0x4B0000uu with uu = b + 128 is 2^23 + b + 128, exactly.
        const uint32_t u = word_of(v, q) ^ 0x80808080u;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            f[j] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u | unsigned(j))) - 8388736.0f;
    } else {
        // The codes (0..15, not yet scaled): byte j of word q & 3 holds column j + 4q of the chunk
        // in its low nibble for q < 4, column j + 4q (= 16 + j + 4(q - 4)) in its high nibble else.
        const uint32_t w = word_of(v, q & 3);
        const uint32_t u = (q < 4 ? w : w >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            f[j] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u | unsigned(j))) - 8388608.0f;
    }
}

// R rows per group, N token rows (n <= N; rows of x past n - 1 repeat row n - 1, never stored),
// U chunks per row in flight per lane. Block b computes row tile b; on a persistent grid (GemvGrid)
// also tiles b + gridDim.x, b + 2 * gridDim.x, ..., each tile's first weights loaded before the
// previous tile's reduction, so the SM's loads stay in flight across tiles instead of pausing for
// the reduction, the block's exit and the next block's start. (A template parameter: the one-tile
// kernels keep the registers they had without the loop.)
// Normed (GemvFuse::norm_w): x is the residual stream and the product's input rmsnorm(x) * norm_w.
// Each float4 of x is multiplied by norm_w's as it is loaded and the finished sums are scaled by
// 1 / rms (a common factor of each row's products), so no norm kernel runs between the product
// writing x and this one. The sums of squares come with the first tile's loads: a group's lanes
// of the block's 8 warps read every column of x exactly once per tile (chunk k -> warp, lane
// above), so group 0's squares of the x it loads anyway, summed over the block, are each token
// row's sum of squares, with no pass over x and no barrier before the weights stream.
// a.accumulate: y += the result; each tile's old y values are loaded when the tile starts, so the
// epilogue's read does not add a round trip after the reduction.
template <WKind K, int N, int R, int U, int MinBlocks, bool Persistent, bool Normed>
__global__ void __launch_bounds__(kThreads, MinBlocks) gemv_vec_kernel(const GemvArgs a) {
    constexpr int C = chunk_cols<K>();
    constexpr bool kI4 = K == WKind::I4;
    constexpr bool kScaled = K == WKind::I8 || kI4;
    // I4 with more token rows than rows per group: dequantize each weight (q * scale + min) rather
    // than summing x per chunk for the mins (see the header).
    constexpr bool kI4Dequant = kI4 && N > R;
    // The chunk's sums are formed apart and scaled once (a chunk never straddles a group).
    constexpr bool kPart = K == WKind::I8 || (kI4 && !kI4Dequant);
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    const int g = lane / kLanesPerRow, lig = lane % kLanesPerRow;
    const int k_first = warp * kLanesPerRow + lig;  // the lane's first chunk of each row
    const char* wrow[R];
    const float* srow[R];
    const float* mrow[R];
    auto point_at = [&](int64_t tile) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t row = tile_row<R>(tile, g, r, a.rows, a.swiglu_half);
            wrow[r] = a.w + row * a.row_bytes;
            srow[r] = kScaled ? a.scales + row * a.groups : nullptr;
            mrow[r] = kI4 ? a.mins + row * a.groups : nullptr;
        }
    };
    // One step's weights, scales and (I4) mins at chunk k0.
    uint4 raw[U][R];
    float scale[U][R], mn[U][R];
    auto load = [&](int k0) {
        load_step<R, U, kScaled>(wrow, srow, k0, a.chunks, a.group_shift, a.group_chunks, raw, scale);
        if constexpr (kI4) load_mins<R, U>(mrow, k0, a.chunks, a.group_shift, a.group_chunks, mn);
    };
    int xoff[N];  // row t of x (n * cols < 2^31, checked); rows past n - 1 repeat the last one
#pragma unroll
    for (int t = 0; t < N; ++t) xoff[t] = (t < a.n ? t : a.n - 1) * int(a.cols);

    // The first step's weights are loaded before pdl_wait(): they never change during a session,
    // so under PDL (kernels/cuda/launch.h) they stream in while the kernel ahead (the norm that
    // writes x) finishes. x is read only after the wait.
    int64_t tile = blockIdx.x;
    point_at(tile);
    load(k_first);
    pdl_wait();
    pdl_launch_dependents();
    __shared__ float tok_inv[N];            // Normed: 1 / rms of each token row
    __shared__ float warp_ss[kWarps][N];    // Normed: group 0's sums of squares per warp
    static_assert(kGroups * R * N <= kThreads, "reduce_store: one output per thread");
    bool first = true;
    for (;;) {
        // The old y of the output reduce_store gives this thread (a.accumulate; not SwiGLU's).
        float y_old = 0.0f;
        if (a.accumulate && int(threadIdx.x) < kGroups * R * N) {
            const int64_t row = tile * (kGroups * R) + int(threadIdx.x) / N;
            const int t = int(threadIdx.x) % N;
            if (row < a.rows && t < a.n) y_old = a.y[int64_t(t) * a.rows + row];
        }
        float ss[N];  // Normed: this lane's sum of x^2 over the columns it reads
#pragma unroll
        for (int t = 0; t < N; ++t) ss[t] = 0.0f;
        float acc[R][N];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < N; ++t) acc[r][t] = 0.0f;
        int k0 = k_first;
        while (k0 < a.chunks) {
            // Unconditional arithmetic (a chunk past the row has zero weights and reads the row's
            // last x chunk): a guarded use would let the compiler sink each load into its guard and
            // serialise them. Four columns at a time: one float4 of x per token row feeds R rows.
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int kc = min(k0 + u * kChunksPerStep, a.chunks - 1);
                const float live = k0 + u * kChunksPerStep < a.chunks ? 1.0f : 0.0f;  // not a re-read of the last chunk
                const int xcol = (kc >> a.block_shift) * a.block_cols + (kc & ((1 << a.block_shift) - 1)) * a.lane_stride;
                const float* xk = a.x + xcol;
                float part[R][N];  // kPart: the chunk's sums, scaled once
                float xsum[N];     // I4 without kI4Dequant: the chunk's sum of x, for the mins
#pragma unroll
                for (int q = 0; q < C / 4; ++q) {
                    float4 gv;  // Normed: the norm's weights of these four columns
                    if constexpr (Normed)
                        gv = __ldg(reinterpret_cast<const float4*>(a.norm_w + xcol + q * a.quad_stride));
                    float wf[R][4];
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        quad_to_f32<K>(raw[u][r], q, wf[r]);
                        if constexpr (kI4Dequant)
#pragma unroll
                            for (int j = 0; j < 4; ++j) wf[r][j] = fmaf(wf[r][j], scale[u][r], mn[u][r]);
                    }
#pragma unroll
                    for (int t = 0; t < N; ++t) {
                        float4 xv = __ldg(reinterpret_cast<const float4*>(xk + xoff[t] + q * a.quad_stride));
                        if constexpr (Normed) {
                            ss[t] = fmaf(live, fmaf(xv.x, xv.x, fmaf(xv.y, xv.y, fmaf(xv.z, xv.z, xv.w * xv.w))), ss[t]);
                            xv = make_float4(xv.x * gv.x, xv.y * gv.y, xv.z * gv.z, xv.w * gv.w);
                        }
                        if constexpr (kI4 && !kI4Dequant) {
                            const float s4 = (xv.x + xv.y) + (xv.z + xv.w);
                            xsum[t] = q == 0 ? s4 : xsum[t] + s4;
                        }
#pragma unroll
                        for (int r = 0; r < R; ++r) {
                            float& s = kPart ? part[r][t] : acc[r][t];
                            if (kPart && q == 0) s = 0.0f;
                            s = fmaf(wf[r][0], xv.x, s);
                            s = fmaf(wf[r][1], xv.y, s);
                            s = fmaf(wf[r][2], xv.z, s);
                            s = fmaf(wf[r][3], xv.w, s);
                        }
                    }
                }
                if constexpr (kPart) {
#pragma unroll
                    for (int r = 0; r < R; ++r)
#pragma unroll
                        for (int t = 0; t < N; ++t) {
                            acc[r][t] = fmaf(part[r][t], scale[u][r], acc[r][t]);
                            if constexpr (kI4) acc[r][t] = fmaf(xsum[t], mn[u][r], acc[r][t]);
                        }
                }
            }
            k0 += U * kChunksPerStep;
            if (k0 < a.chunks) load(k0);
        }
        const int64_t next = tile + gridDim.x;
        if (Persistent && next < a.tiles) {  // in flight during the reduction below
            point_at(next);
            load(k_first);
        }
        const int64_t tile_row0 = tile * (a.swiglu_half > 0 ? kGroups / 2 * R : kGroups * R);
        if constexpr (Normed) {
            if (first) {  // 1 / rms of each token row from group 0's squares (every tile sees the same x)
#pragma unroll
                for (int t = 0; t < N; ++t) {
                    float v = ss[t];
#pragma unroll
                    for (int off = kLanesPerRow / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
                    if (lane == 0) warp_ss[warp][t] = v;
                }
                __syncthreads();
                if (int(threadIdx.x) < N) {
                    float total = 0.0f;
#pragma unroll
                    for (int w = 0; w < kWarps; ++w) total += warp_ss[w][threadIdx.x];
                    tok_inv[threadIdx.x] = rsqrtf(total / float(a.cols) + a.eps);
                }
                // (reduce_store's first __syncthreads orders tok_inv before its reads.)
            }
        }
        reduce_store<R, N>(acc, tile_row0, a.rows, a.n, a.bias, a.y, a.swiglu_half, Normed ? tok_inv : nullptr,
                           a.accumulate != 0, y_old);
        first = false;
        if (!Persistent || next >= a.tiles) break;
        __syncthreads();  // the next reduction rewrites the shared partial sums this one read
        tile = next;
    }
}

__device__ __forceinline__ float load_weight(WKind kind, const GemvArgs& a, int64_t row, int64_t c) {
    if (kind == WKind::I4) {
        // Stored column s (its group is c's: interleaving keeps columns inside their group).
        const int64_t s = a.interleave_c ? interleaved_col(c, a.interleave_c) : c;
        const uint8_t b = reinterpret_cast<const uint8_t*>(a.w)[row * a.row_bytes + (s / 32) * 16 + s % 16];
        const int64_t g = row * a.groups + c / a.group_size;
        return float(s % 32 >= 16 ? b >> 4 : b & 15) * a.scales[g] + a.mins[g];
    }
    const int64_t i = row * a.cols + (a.interleave_c ? interleaved_col(c, a.interleave_c) : c);
    switch (kind) {
        case WKind::F32:
            return reinterpret_cast<const float*>(a.w)[i];
        case WKind::F16:
            return __half2float(reinterpret_cast<const __half*>(a.w)[i]);
        case WKind::BF16:
            return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.w)[i]);
        default:
            return float(reinterpret_cast<const int8_t*>(a.w)[i]) * a.scales[row * a.groups + c / a.group_size];
    }
}

// Any shape and alignment: one warp per row, lanes stride over the columns.
__global__ void __launch_bounds__(kThreads) gemv_scalar_kernel(const GemvArgs a, const WKind kind) {
    const int lane = int(threadIdx.x) & 31;
    const int64_t row = int64_t(blockIdx.x) * kWarps + (int(threadIdx.x) >> 5);
    pdl_wait();
    pdl_launch_dependents();
    if (row >= a.rows) return;  // whole warps only: the shuffles below stay full-warp
    // The fused norm (GemvFuse::norm_w): each warp finds the token rows' 1 / rms itself.
    float inv[kMaxTokens];
    if (a.norm_w)
#pragma unroll
        for (int t = 0; t < kMaxTokens; ++t) {
            float ss = 0.0f;
            if (t < a.n)
                for (int64_t c = lane; c < a.cols; c += 32) ss = fmaf(a.x[t * a.cols + c], a.x[t * a.cols + c], ss);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
            inv[t] = rsqrtf(ss / float(a.cols) + a.eps);
        }
    float acc[kMaxTokens];
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) acc[t] = 0.0f;
    for (int64_t c = lane; c < a.cols; c += 32) {
        const float wv = load_weight(kind, a, row, c);
        const float g = a.norm_w ? a.norm_w[c] : 1.0f;
#pragma unroll
        for (int t = 0; t < kMaxTokens; ++t)
            if (t < a.n) acc[t] = fmaf(wv, a.x[int64_t(t) * a.cols + c] * g, acc[t]);
    }
    warp_row_store(acc, row, a.rows, a.n, a.bias, a.y, a.norm_w ? inv : nullptr, a.accumulate != 0);
}

// Row blockIdx.x of w (row_bytes each) rewritten in place in the interleaved order (interleave.h),
// through a shared-memory copy of the row. Q is one quad of columns: 4 bytes of I8, 8 of F16/BF16.
// Runs once per matrix at load time.
template <typename Q>
__global__ void interleave_kernel(char* w, int64_t row_bytes, int C) {
    SHARDLM_DYNAMIC_SMEM(unsigned char, row_copy);  // extern __shared__ (launch.h)
    Q* row = reinterpret_cast<Q*>(w + int64_t(blockIdx.x) * row_bytes);
    Q* natural = reinterpret_cast<Q*>(row_copy);
    const int quads = int(row_bytes / int64_t(sizeof(Q)));
    for (int i = int(threadIdx.x); i < quads; i += int(blockDim.x)) natural[i] = row[i];
    __syncthreads();
    // Stored quad j * (C/4) + q of a block of 2C quads holds natural quad 8q + j (column 32q + 4j).
    const int block_quads = 2 * C, chunk_quads = C / 4;
    for (int d = int(threadIdx.x); d < quads; d += int(blockDim.x)) {
        const int b = d / block_quads, r = d % block_quads, j = r / chunk_quads, q = r % chunk_quads;
        row[d] = natural[b * block_quads + 8 * q + j];
    }
}

// I4 row blockIdx.x (row_bytes of packed codes, weights_view.h) rewritten in place in the
// interleaved order (interleave.h: blocks of 4 chunks, 128 columns), through a shared-memory copy
// of the row: each stored byte gathers its two codes, stored columns s (low nibble) and s + 16.
__global__ void interleave_i4_kernel(unsigned char* w, int64_t row_bytes) {
    SHARDLM_DYNAMIC_SMEM(unsigned char, natural);  // extern __shared__ (launch.h)
    unsigned char* row = w + int64_t(blockIdx.x) * row_bytes;
    const int n = int(row_bytes);
    for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) natural[i] = row[i];
    __syncthreads();
    // The code of natural column c: byte (c / 32) * 16 + c % 16, high nibble for c % 32 >= 16.
    auto code = [&](int c) {
        const unsigned char b = natural[(c / 32) * 16 + c % 16];
        return c % 32 >= 16 ? b >> 4 : b & 15;
    };
    // Stored column s holds natural column natural_col(s, 32) (interleave.h).
    for (int d = int(threadIdx.x); d < n; d += int(blockDim.x)) {
        const int s = (d / 16) * 32 + d % 16;
        row[d] = (unsigned char)(code(int(natural_col(s, 32))) | (code(int(natural_col(s + 16, 32))) << 4));
    }
}

WKind kind_of(DType t) {
    switch (t) {
        case DType::F32: return WKind::F32;
        case DType::F16: return WKind::F16;
        case DType::BF16: return WKind::BF16;
        case DType::I8: return WKind::I8;
        case DType::I4: return WKind::I4;
        default: fail("gemv_cuda: weights must be f32/f16/bf16/i8/i4, not ", dtype_name(t));
    }
}

// Rows per group R, 16-byte chunks in flight per row U, and the register budget per thread
// (65536 / (256 * MinBlocks)), chosen so the compiler neither spills nor starves the loads.
// n >= 4 shares each x load between two rows (L1 traffic) and needs the registers of 2 blocks
// per SM for the accumulators: 16 warps with 32-64 bytes in flight per lane, where the FMAs
// rather than the memory set the pace.
// n <= 2 is the decode step of one or two sequences, where the weights' bytes set the pace; what
// counts is the bytes a lane has in flight, R * min(U, chunks it owns per row) * 16. A lane owns
// ceil(chunks / 64) chunks of a row: a 2048-column row is 2 chunks of I8 or 4 of f16. With R = 1
// such rows leave only 32-64 bytes in flight per lane whatever U is, and each block streams just
// 8-16 KB before its reduction: the H200 measured I8 at 18-25% of HBM bandwidth and the f16
// 2048-column shapes at 35-55%, while lm_head-sized f16 work reached 79%. So rows_per_group()
// picks R = 4, 2 or 1 to bring every lane near 128 bytes in flight (R * U = 8 chunks), which also
// shares each x load among R rows. H200, n = 1, interleaved weights, R = 1 -> the rule's R
// (bench/gpu_check.sh gemv-r, which times all three): I8 lm_head 173.5 -> 89.5 us (R = 4: 3491
// GB/s, 72% of the theoretical 4814), gate/up 8.5 -> 6.5 us, 2048x2048 3.1 -> 2.7 us; f16
// lm_head 164.1 -> 136.6 us (R = 2: 95%), gate/up 9.3 -> 8.0 us. The rule's R was the fastest of
// the three or within 0.3 us of it on every Qwen3-1.7B shape (down_proj's 6144 columns keep R = 1).
template <WKind K, int N, int R>
struct VecConfig {
    static_assert(N >= 4 ? R == 2 : (R == 1 || R == 2 || R == 4), "rows per group");
    // I4 as I8: a chunk holds twice the columns (more work per load, so no more loads needed in
    // flight per lane); kI4Dequant's per-weight FMAs keep the n >= 4 accumulators' budget.
    static constexpr bool kQuant = K == WKind::I8 || K == WKind::I4;
    static constexpr int U = N >= 4 ? (kQuant ? (N == 4 ? 2 : 1) : (N == 4 ? 4 : 2))
                                    : (kQuant && R == 1 ? 4 : 8 / R);
    // I4 keeps a scale and a min per chunk in flight beside its 16 bytes, and its wider chunks
    // more partial sums: 2-3 blocks per SM (ptxas spilled at 3-4), still 32-48 KB in flight per SM.
    static constexpr int MinBlocks = N >= 4 || R == 4 ? 2 : K == WKind::I4 ? (R == 2 ? 2 : 3) : (R == 2 ? 3 : 4);
};

// How many blocks of `kernel` (kThreads each, static shared memory only) one SM holds at once.
int resident_blocks_per_sm(const void* kernel) {
    int blocks = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0));
    return blocks > 0 ? blocks : 1;
}

// The persistent grid for `tiles` tiles: no more blocks than the GPU holds at once, spread so
// that every block gets the same number of tiles give or take one (no last round of a few blocks).
int64_t persistent_blocks(int64_t tiles, int per_sm) {
    const int64_t resident = int64_t(cuda_sm_count()) * per_sm;
    const int64_t rounds = (tiles + resident - 1) / resident;
    return (tiles + rounds - 1) / rounds;
}

template <WKind K, int N, int R, bool Normed>
void launch_vec(const GemvArgs& args, GemvGrid grid, cudaStream_t stream) {
    using Cfg = VecConfig<K, N, R>;
    GemvArgs a = args;
    const int64_t per_tile = a.swiglu_half > 0 ? kGroups / 2 * R : kGroups * R;  // outputs per tile
    const int64_t out_rows = a.swiglu_half > 0 ? a.swiglu_half : a.rows;
    a.tiles = (out_rows + per_tile - 1) / per_tile;
    SHARDLM_CHECK(a.tiles <= INT_MAX, "gemv_cuda: ", a.rows, " rows is too many");
    if (grid == GemvGrid::PerTile && !Normed) {
        launch_kernel("gemv_vec_kernel", gemv_vec_kernel<K, N, R, Cfg::U, Cfg::MinBlocks, false, false>,
                      dim3(unsigned(a.tiles)), dim3(kThreads), 0, stream, a);
        return;
    }
    // (The fused norm is compiled for the persistent kernel only; a block per tile runs it too.)
    const auto kernel = gemv_vec_kernel<K, N, R, Cfg::U, Cfg::MinBlocks, true, Normed>;
    // A property of the compiled kernel, asked once (the query is not free on every launch).
    static const int per_sm = resident_blocks_per_sm(reinterpret_cast<const void*>(kernel));
    const int64_t blocks = grid == GemvGrid::PerTile ? a.tiles : persistent_blocks(a.tiles, per_sm);
    launch_kernel("gemv_vec_kernel", kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, a);
}

template <WKind K, int N, bool Normed>
void launch_vec_r(const GemvArgs& a, GemvGrid grid, cudaStream_t stream) {
    const int r = rows_per_group(a.chunks);
    if (r == 4) return launch_vec<K, N, 4, Normed>(a, grid, stream);
    if (r == 2) return launch_vec<K, N, 2, Normed>(a, grid, stream);
    return launch_vec<K, N, 1, Normed>(a, grid, stream);
}

template <WKind K, bool Normed>
void launch_vec_tokens(const GemvArgs& a, GemvGrid grid, cudaStream_t stream) {
    // n is rounded up to 1, 2, 4 or 8 (the batch buckets of the decode graphs); extra rows of x
    // repeat the last one and are not stored.
    if (a.n == 1) return launch_vec_r<K, 1, Normed>(a, grid, stream);
    if (a.n == 2) return launch_vec_r<K, 2, Normed>(a, grid, stream);
    if (a.n <= 4) return launch_vec<K, 4, 2, Normed>(a, grid, stream);
    return launch_vec<K, 8, 2, Normed>(a, grid, stream);
}

template <WKind K>
void launch_vec_kind(const GemvArgs& a, GemvGrid grid, cudaStream_t stream) {
    if (a.norm_w) launch_vec_tokens<K, true>(a, grid, stream);
    else launch_vec_tokens<K, false>(a, grid, stream);
}


}  // namespace

namespace {

// gemv_cuda, or with swiglu_half > 0 gemv_swiglu_cuda; false (and nothing launched) when SwiGLU
// would need the scalar path.
bool run_gemv(const DeviceMatrix& w, const float* x, int64_t n, const float* bias, float* y, int64_t swiglu_half,
              const GemvFuse& fuse, GemvGrid grid, cudaStream_t stream) {
    SHARDLM_CHECK(n >= 0 && n <= kGemvMaxTokens, "gemv_cuda: ", n, " token rows, at most ", kGemvMaxTokens);
    SHARDLM_CHECK(w.rows >= 0 && w.cols >= 0, "gemv_cuda: bad shape ", w.rows, "x", w.cols);
    const WKind kind = kind_of(w.dtype);
    if (kind == WKind::I8)
        SHARDLM_CHECK(w.scales && w.group_size > 0 && w.cols % w.group_size == 0,
                      "gemv_cuda: I8 weights need scales and a group size dividing cols (", w.group_size, ", ",
                      w.cols, ")");
    if (kind == WKind::I4)
        SHARDLM_CHECK(w.scales && w.mins && w.group_size > 0 && w.group_size % 32 == 0 && w.cols % w.group_size == 0 &&
                          (!w.interleaved || w.group_size % interleave_block_cols(32) == 0),
                      "gemv_cuda: I4 weights need scales, mins and a group size that is a multiple of 32 dividing "
                      "cols (", w.group_size, ", ", w.cols, "), and of 128 when interleaved");
    SHARDLM_CHECK(!(fuse.accumulate && swiglu_half > 0), "gemv_swiglu_cuda: SwiGLU's output cannot accumulate");
    if (n == 0 || w.rows == 0) return true;
    SHARDLM_CHECK(w.data && x && y, "gemv_cuda: null pointer");

    GemvArgs a{};
    a.w = static_cast<const char*>(w.data);
    a.scales = w.scales;
    a.mins = w.mins;
    a.x = x;
    a.bias = bias;
    a.y = y;
    a.rows = w.rows;
    a.cols = w.cols;
    a.n = int(n);
    a.swiglu_half = swiglu_half;
    a.norm_w = fuse.norm_w;
    a.eps = fuse.eps;
    a.accumulate = fuse.accumulate ? 1 : 0;
    a.row_bytes = device_row_bytes(w);
    a.interleave_c = w.interleaved ? interleave_chunk_cols(w.dtype) : 0;
    SHARDLM_CHECK(!w.interleaved || (a.interleave_c > 0 && w.cols % interleave_block_cols(a.interleave_c) == 0),
                  "gemv_cuda: interleaved ", dtype_name(w.dtype), " weights of ", w.cols, " columns");
    if (kind == WKind::I8 || kind == WKind::I4) {
        a.group_size = w.group_size;
        a.groups = w.cols / w.group_size;
    }

    const int64_t chunk_c = kind == WKind::F32 ? 4 : kind == WKind::I8 ? 16 : kind == WKind::I4 ? 32 : 8;
    const bool vec = is_aligned(w.data, 16) && is_aligned(x, 16) && a.row_bytes % 16 == 0 && n * w.cols <= INT_MAX &&
                     (kind != WKind::I8 || w.group_size % 16 == 0) && (!fuse.norm_w || is_aligned(fuse.norm_w, 16));
    if (!vec) {
        if (swiglu_half > 0) return false;
        const int64_t blocks = (w.rows + kWarps - 1) / kWarps;
        SHARDLM_CHECK(blocks <= INT_MAX, "gemv_cuda: ", w.rows, " rows is too many");
        launch_kernel("gemv_scalar_kernel", gemv_scalar_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream,
                      a, kind);
        return true;
    }
    a.chunks = int(a.cols / chunk_c);
    const int block_chunks = w.interleaved ? interleave_block_chunks(int(chunk_c)) : 8;
    a.block_shift = block_chunks == 4 ? 2 : 3;
    a.block_cols = block_chunks * int(chunk_c);
    a.lane_stride = w.interleaved ? 4 : int(chunk_c);
    a.quad_stride = w.interleaved ? 4 * block_chunks : 4;
    if (kind == WKind::I8) chunk_groups(w.group_size, w.cols, a.group_shift, a.group_chunks);
    // chunk_groups counts 16-byte chunks of 16 one-byte columns: I4 groups and rows in bytes.
    if (kind == WKind::I4) chunk_groups(w.group_size / 2, w.cols / 2, a.group_shift, a.group_chunks);
    switch (kind) {
        case WKind::F32: launch_vec_kind<WKind::F32>(a, grid, stream); break;
        case WKind::F16: launch_vec_kind<WKind::F16>(a, grid, stream); break;
        case WKind::BF16: launch_vec_kind<WKind::BF16>(a, grid, stream); break;
        case WKind::I8: launch_vec_kind<WKind::I8>(a, grid, stream); break;
        case WKind::I4: launch_vec_kind<WKind::I4>(a, grid, stream); break;
    }
    return true;
}

}  // namespace

void gemv_cuda(const DeviceMatrix& w, const float* x, int64_t n, const float* bias, float* y, cudaStream_t stream,
               GemvGrid grid) {
    run_gemv(w, x, n, bias, y, 0, GemvFuse{}, grid, stream);
}

void gemv_cuda(const DeviceMatrix& w, const float* x, int64_t n, const float* bias, float* y, const GemvFuse& fuse,
               cudaStream_t stream, GemvGrid grid) {
    run_gemv(w, x, n, bias, y, 0, fuse, grid, stream);
}

bool gemv_swiglu_cuda(const DeviceMatrix& w, const float* x, int64_t n, const float* bias, float* y,
                      cudaStream_t stream, GemvGrid grid) {
    return gemv_swiglu_cuda(w, x, n, bias, y, GemvFuse{}, stream, grid);
}

bool gemv_swiglu_cuda(const DeviceMatrix& w, const float* x, int64_t n, const float* bias, float* y,
                      const GemvFuse& fuse, cudaStream_t stream, GemvGrid grid) {
    SHARDLM_CHECK(w.rows % 2 == 0, "gemv_swiglu_cuda: ", w.rows, " rows are not gate and up halves");
    if (w.rows == 0) return true;
    return run_gemv(w, x, n, bias, y, w.rows / 2, fuse, grid, stream);
}

bool gemv_norm_fused_default() {
    static const bool on =
        cuda_tuning_env("SHARDLM_FUSED_NORM", {"0", "1"}, "the decode norms fused into the GEMVs") != "0";
    return on;
}

GemvGrid gemv_default_grid() {
    static const GemvGrid grid =
        cuda_tuning_env("SHARDLM_GEMV_GRID", {"tiles", "persistent"}, "the decode GEMV's grid") == "tiles"
            ? GemvGrid::PerTile
            : GemvGrid::Persistent;
    return grid;
}

int gemv_forced_rows_per_group() {
    static const int forced = [] {
        const std::string v = cuda_tuning_env("SHARDLM_GEMV_R", {"1", "2", "4"}, "the decode GEMV's rows per group");
        return v.empty() ? 0 : v[0] - '0';
    }();
    return forced;
}

bool gemv_interleave_cuda(DeviceMatrix& w, cudaStream_t stream) {
    if (w.interleaved) return true;
    const int C = interleave_chunk_cols(w.dtype);
    if (C == 0) return false;  // F32 stays in the natural order
    const int64_t row_bytes = device_row_bytes(w), block = interleave_block_cols(C);
    if (w.rows <= 0 || w.rows > INT_MAX || w.cols <= 0 || w.cols % block != 0 || !is_aligned(w.data, 16) ||
        row_bytes > 48 * 1024)
        return false;
    // Quantized groups must hold whole blocks, so that a chunk keeps one scale (and min).
    if ((w.dtype == DType::I8 || w.dtype == DType::I4) && (w.group_size <= 0 || w.group_size % block != 0))
        return false;
    char* data = static_cast<char*>(const_cast<void*>(w.data));
    if (w.dtype == DType::I4)
        launch_plain("interleave_i4_kernel", interleave_i4_kernel, dim3(unsigned(w.rows)), dim3(kThreads),
                     size_t(row_bytes), stream, reinterpret_cast<unsigned char*>(data), row_bytes);
    else if (w.dtype == DType::I8)
        launch_plain("interleave_kernel", interleave_kernel<uint32_t>, dim3(unsigned(w.rows)), dim3(kThreads),
                     size_t(row_bytes), stream, data, row_bytes, C);
    else
        launch_plain("interleave_kernel", interleave_kernel<uint2>, dim3(unsigned(w.rows)), dim3(kThreads),
                     size_t(row_bytes), stream, data, row_bytes, C);
    w.interleaved = true;
    return true;
}

}  // namespace shardlm
