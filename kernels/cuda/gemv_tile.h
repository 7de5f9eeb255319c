// The tile both decode GEMVs share (gemv.cu: f32 activations; w8a8.cu: int8 activations), device
// code for .cu files only. A block of 8 warps owns kGroups * R rows: each warp is kGroups groups of
// kLanesPerRow lanes, group g owns R rows, and the block's 64 lanes of a row walk it in 16-byte
// chunks (chunk k -> warp (k / 8) % 8, lane k % 8 of each group), so one warp load fetches four
// whole 128-byte segments, one per group. gemv.cu's header says why this streams weights well.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/w8a8.h"

namespace shardlm::gemv_tile {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kLanesPerRow = 8;                        // one 128-byte segment per group and load
constexpr int kGroups = 32 / kLanesPerRow;             // row groups per warp
constexpr int kChunksPerStep = kWarps * kLanesPerRow;  // 16-byte chunks of a row per block step
constexpr int kMaxTokens = int(kGemvMaxTokens);

// 16 bytes of weights when `pred`, else zeros. Streamed (read once, so they should not evict the
// activations from L1) and predicated inside one asm statement: straight-line code lets all loads
// of a step issue before the first use instead of each waiting in a branch of its own. Volatile so
// loads placed ahead of pdl_wait() (launch.h, also volatile asm) stay there.
__device__ __forceinline__ uint4 load_weights_if(const void* p, bool pred) {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
#ifdef SHARDLM_CUDA_EMU
    // The CPU emulator (tests/cuda_emu) has no PTX: the same predicated, 16-byte aligned load.
    if (pred) v = __ldg(static_cast<const uint4*>(p));
#else
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\t"
        "@p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
        : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
        : "l"(p), "r"(int(pred)));
#endif
    return v;
}

// Chunk k's group for groups of group_chunks chunks: k >> shift when shift >= 0 (31: one group per
// row), else a division. chunk_groups() sets both for a group of `group` columns (a multiple of
// 16) in rows of `cols`.
__device__ __forceinline__ int group_of(int k, int shift, int group_chunks) {
    return shift >= 0 ? (k >> shift) : k / group_chunks;
}

inline void chunk_groups(int64_t group, int64_t cols, int& shift, int& group_chunks) {
    group_chunks = int(group / 16);
    shift = -1;
    if (group == cols) {
        shift = 31;  // chunk indices are < 2^31: every chunk maps to group 0
    } else if ((group_chunks & (group_chunks - 1)) == 0) {
        shift = 0;
        while ((1 << shift) < group_chunks) ++shift;
    }
}

// All U * R weight chunks of the step at chunk k0 (rows wrow, `chunks` chunks each), issued
// together so they are in flight at once; chunks past the row read as zeros. Scaled: also each
// chunk's group scale from srow (group_of above).
template <int R, int U, bool Scaled, class W>
__device__ __forceinline__ void load_step(W* const (&wrow)[R], const float* const (&srow)[R], int k0, int chunks,
                                          int shift, int group_chunks, uint4 (&raw)[U][R], float (&scale)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int k = k0 + u * kChunksPerStep;
        const int kc = min(k, chunks - 1);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            raw[u][r] = load_weights_if(wrow[r] + int64_t(kc) * 16, k < chunks);
            if constexpr (Scaled) scale[u][r] = __ldg(srow[r] + group_of(kc, shift, group_chunks));
        }
    }
}

// The arguments of the GEMVs on INT8 activations (w8a8.cu: I8 weights; w4a8.cu: I4 codes with
// mins): y [n, rows] = W [rows, cols] times q [n, cols] (+ bias), groups of wgroup and agroup
// columns, dot groups of min(wgroup, agroup).
struct ActsGemvArgs {
    const void* w;           // [rows, cols] int8, or [rows, cols / 2] bytes of I4 codes
    const float* wscales;    // [rows, wgroups]
    const float* wmins;      // [rows, wgroups] (I4)
    const int8_t* q;         // [n, cols]
    const float* ascales;    // [n, agroups]
    const float* bias;       // [rows] or null
    float* y;                // [n, rows]
    int64_t rows, cols;
    int n;
    int chunks;              // 16-byte chunks per row (vector paths)
    int64_t wgroups, agroups;
    int64_t wgroup, agroup;  // group sizes (scalar paths)
    int64_t dgroup;          // dot group min(wgroup, agroup) (scalar paths)
    // chunk k -> group as group_of (vector paths)
    int wshift, ashift, wgroup_chunks, agroup_chunks;
};

// The fields that follow from the operands; chunks and shifts are the vector paths'.
inline ActsGemvArgs acts_gemv_args(const DeviceMatrix& w, const DeviceActs& a, const float* bias, float* y) {
    ActsGemvArgs p{};
    p.w = w.data;
    p.wscales = w.scales;
    p.wmins = w.mins;
    p.q = a.q;
    p.ascales = a.scales;
    p.bias = bias;
    p.y = y;
    p.rows = w.rows;
    p.cols = w.cols;
    p.n = int(a.n);
    p.wgroup = w.group_size;
    p.agroup = a.group_size;
    p.dgroup = w.group_size < a.group_size ? w.group_size : a.group_size;
    p.wgroups = w.cols / w.group_size;
    p.agroups = a.cols / a.group_size;
    return p;
}

// I4 (gemv.cu, w4a8.cu): each chunk's group min (as load_step loads its scale), 0 for chunks past
// the row, whose zero codes would otherwise dequantize to the min instead of to 0 (and, against
// INT8 activations, add min * sum(q) of the row's last chunk).
template <int R, int U>
__device__ __forceinline__ void load_mins(const float* const (&mrow)[R], int k0, int chunks, int shift,
                                          int group_chunks, float (&mn)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int k = k0 + u * kChunksPerStep;
        const int kc = min(k, chunks - 1);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float m = __ldg(mrow[r] + group_of(kc, shift, group_chunks));
            mn[u][r] = k < chunks ? m : 0.0f;
        }
    }
}

// R for n <= 2 in a row of `chunks` 16-byte chunks (gemv.cu's VecConfig says why): 8 chunks in
// flight per lane where the row has them, unless SHARDLM_GEMV_R forces it
// (gemv_forced_rows_per_group in gemv.h).
inline int rows_per_group(int chunks) {
    if (const int forced = gemv_forced_rows_per_group()) return forced;
    const int lane_chunks = (chunks + kChunksPerStep - 1) / kChunksPerStep;
    return lane_chunks <= 2 ? 4 : lane_chunks <= 4 ? 2 : 1;
}

// The block's outputs: acc[r][t] of each lane summed over the 8 lanes of its group (xor 4, 2, 1
// stays inside the group), then over the warps through shared memory in a fixed order (results
// repeat run to run); y[t, row] = sum (+ bias[row]) for the tile's rows below `rows` and t < n.
// With swiglu_half > 0 the tile is SwiGLU's (tile_swiglu_row): groups 0-1 hold gate rows j0 + s,
// groups 2-3 the up rows half + j0 + s, and y[t, j0 + s] = silu(gate) * up, y [n, half].
// tok_scale (shared or global memory, [n]): each sum is scaled by tok_scale[t] before the bias is
// added (the fused norm's 1 / rms, gemv.cu). accumulate: y[t, row] = y_old + the result, y_old
// being the old y[t, row] of the one output this thread stores (thread i < kGroups * R * N stores
// slot i / N, token i % N; the caller loads it early). Every thread of the block must call it.
template <int R, int N>
__device__ __forceinline__ void reduce_store(const float (&acc)[R][N], int64_t tile_row0, int64_t rows, int n,
                                             const float* bias, float* y, int64_t swiglu_half = 0,
                                             const float* tok_scale = nullptr, bool accumulate = false,
                                             float y_old = 0.0f) {
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    const int g = lane / kLanesPerRow, lig = lane % kLanesPerRow;
    __shared__ float partial[kWarps][kGroups * R][N];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < N; ++t) {
            float v = acc[r][t];
#pragma unroll
            for (int off = kLanesPerRow / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lig == 0) partial[warp][g * R + r][t] = v;
        }
    __syncthreads();
    if (swiglu_half > 0) {
        constexpr int S = kGroups / 2 * R;  // gate slots; the up slots follow
        for (int i = int(threadIdx.x); i < S * N; i += kThreads) {
            const int slot = i / N, t = i % N;
            const int64_t j = tile_row0 + slot;
            if (j >= swiglu_half || t >= n) continue;
            float gate = 0.0f, up = 0.0f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) {
                gate += partial[w][slot][t];
                up += partial[w][S + slot][t];
            }
            if (tok_scale) {
                gate *= tok_scale[t];
                up *= tok_scale[t];
            }
            if (bias) {
                gate += bias[j];
                up += bias[swiglu_half + j];
            }
            y[int64_t(t) * swiglu_half + j] = silu_mul(gate, up);
        }
        return;
    }
    for (int i = int(threadIdx.x); i < kGroups * R * N; i += kThreads) {
        const int slot = i / N, t = i % N;
        const int64_t row = tile_row0 + slot;
        if (row >= rows || t >= n) continue;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) s += partial[w][slot][t];
        if (tok_scale) s *= tok_scale[t];
        if (bias) s += bias[row];
        y[int64_t(t) * rows + row] = accumulate ? y_old + s : s;
    }
}

// The scalar paths' output (a warp per row, each lane a partial sum per token): summed over the
// warp, y[t, row] = sum * tok_scale[t] (when set) + bias[row] (when set) for t < n, or += with
// accumulate (as reduce_store). Every lane of the warp must call it.
__device__ __forceinline__ void warp_row_store(const float (&acc)[kMaxTokens], int64_t row, int64_t rows, int n,
                                               const float* bias, float* y, const float* tok_scale = nullptr,
                                               bool accumulate = false) {
    const int lane = int(threadIdx.x) & 31;
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) {
        float v = acc[t];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane != 0 || t >= n) continue;
        if (tok_scale) v *= tok_scale[t];
        if (bias) v += bias[row];
        float& out = y[int64_t(t) * rows + row];
        out = accumulate ? out + v : v;
    }
}

// The matrix row group g's r-th row stands for in tile `tile`: kGroups * R consecutive rows, or
// for SwiGLU (half > 0: gate rows then up rows, `half` each) gate rows j0.. for groups 0-1 and
// the same up rows for groups 2-3, j0 = tile * kGroups / 2 * R. Rows past the end read the last
// valid one (their results are never stored).
template <int R>
__device__ __forceinline__ int64_t tile_row(int64_t tile, int g, int r, int64_t rows, int64_t half) {
    if (half <= 0) return min(tile * (kGroups * R) + g * R + r, rows - 1);
    const int h = g / (kGroups / 2);  // 0: gate, 1: up
    const int64_t j = min(tile * (kGroups / 2 * R) + (g % (kGroups / 2)) * R + r, half - 1);
    return h * half + j;
}

}  // namespace shardlm::gemv_tile
