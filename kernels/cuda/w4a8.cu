// W4A8 decode GEMV: INT4 codes times INT8 activations on __dp4a. Formulas in w4a8.h.
//
// Vector path (16-byte aligned codes and q; I4 rows are always a multiple of 32 columns, 16
// bytes). The tile of gemv_tile.h: chunk k of a row is its 16-byte block of 32 codes, byte i
// holding column 32k + i in its low nibble and 32k + 16 + i in its high one (matrix.h), so
// word j's low nibbles (one AND) are columns 4j.. and its high nibbles (a shift and an AND)
// columns 16 + 4j.., each meeting one word of the token's two 16-byte loads of q. Codes 0..15
// are valid signed bytes, so the signed __dp4a takes them as they are: 8 per chunk, row and
// token, plus 8 more per chunk and token (shared by the R rows) for S, the sum of the 32 q. A
// chunk never straddles a dot group (g is a multiple of 32), so each chunk's exact INT32 D and S
// are scaled on the spot, act_scale * fma(w_scale, D, w_min * S), into the lane's f32 sum; chunks
// past the row have zero codes and a zero min (load_mins), so they add nothing. The W8A8 GEMV's
// lane keeps INT32 sums over a whole row when there is one group per row; W4A8 always has
// groups, and a lane's consecutive chunks lie 2048 columns apart, in different groups.
//
// Scalar path (misaligned pointers): a warp per row, lanes striding over each dot group.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/align.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv_tile.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/w4a8.h"

namespace shardlm {
namespace {

using namespace gemv_tile;

constexpr uint32_t kLowNibbles = 0x0F0F0F0Fu;

// D of one chunk: its 32 codes against q0 (the chunk's columns 0-15) and q1 (16-31), added to c.
__device__ __forceinline__ int dot_codes(const uint4& w, const uint4& q0, const uint4& q1, int c) {
    c = __dp4a(int(w.x & kLowNibbles), int(q0.x), c);
    c = __dp4a(int(w.y & kLowNibbles), int(q0.y), c);
    c = __dp4a(int(w.z & kLowNibbles), int(q0.z), c);
    c = __dp4a(int(w.w & kLowNibbles), int(q0.w), c);
    c = __dp4a(int((w.x >> 4) & kLowNibbles), int(q1.x), c);
    c = __dp4a(int((w.y >> 4) & kLowNibbles), int(q1.y), c);
    c = __dp4a(int((w.z >> 4) & kLowNibbles), int(q1.z), c);
    return __dp4a(int((w.w >> 4) & kLowNibbles), int(q1.w), c);
}

// S of one chunk: the sum of its 32 activations.
__device__ __forceinline__ int sum_acts(const uint4& q0, const uint4& q1) {
    constexpr int kOnes = 0x01010101;
    int c = __dp4a(kOnes, int(q0.x), 0);
    c = __dp4a(kOnes, int(q0.y), c);
    c = __dp4a(kOnes, int(q0.z), c);
    c = __dp4a(kOnes, int(q0.w), c);
    c = __dp4a(kOnes, int(q1.x), c);
    c = __dp4a(kOnes, int(q1.y), c);
    c = __dp4a(kOnes, int(q1.z), c);
    return __dp4a(kOnes, int(q1.w), c);
}

// N token rows (n <= N; rows past n - 1 repeat row n - 1 and are not stored), R rows per group,
// U chunks per row in flight per lane.
template <int N, int R, int U, int MinBlocks>
__global__ void __launch_bounds__(kThreads, MinBlocks) gemv_w4a8_vec_kernel(const ActsGemvArgs a) {
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    const int g = lane / kLanesPerRow, lig = lane % kLanesPerRow;
    const int64_t tile_row0 = int64_t(blockIdx.x) * (kGroups * R);

    const uint8_t* wrow[R];
    const float* srow[R];
    const float* mrow[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int64_t row = tile_row<R>(blockIdx.x, g, r, a.rows, 0);
        wrow[r] = static_cast<const uint8_t*>(a.w) + row * (a.cols / 2);
        srow[r] = a.wscales + row * a.wgroups;
        mrow[r] = a.wmins + row * a.wgroups;
    }
    int toff[N];  // token t's row of q and of its scales (n * cols < 2^31, checked)
    int tsoff[N];
#pragma unroll
    for (int t = 0; t < N; ++t) {
        const int tt = t < a.n ? t : a.n - 1;
        toff[t] = tt * int(a.cols);
        tsoff[t] = tt * int(a.agroups);
    }
    float acc[R][N];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < N; ++t) acc[r][t] = 0.0f;

    // The first step's codes, scales and mins never change: loaded before pdl_wait() (launch.h),
    // while the quantization of q finishes; q and its scales are read only after the wait.
    int k0 = warp * kLanesPerRow + lig;
    uint4 raw[U][R];
    float wsc[U][R], wmn[U][R];
    load_step<R, U, true>(wrow, srow, k0, a.chunks, a.wshift, a.wgroup_chunks, raw, wsc);
    load_mins<R, U>(mrow, k0, a.chunks, a.wshift, a.wgroup_chunks, wmn);
    pdl_wait();
    pdl_launch_dependents();
    while (k0 < a.chunks) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int kc = min(k0 + u * kChunksPerStep, a.chunks - 1);
            const int8_t* qk = a.q + int64_t(kc) * 32;
            const int agi = group_of(kc, a.ashift, a.agroup_chunks);
#pragma unroll
            for (int t = 0; t < N; ++t) {
                const uint4 q0 = __ldg(reinterpret_cast<const uint4*>(qk + toff[t]));
                const uint4 q1 = __ldg(reinterpret_cast<const uint4*>(qk + toff[t] + 16));
                const float s = float(sum_acts(q0, q1));
                const float as = __ldg(a.ascales + tsoff[t] + agi);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const float d = float(dot_codes(raw[u][r], q0, q1, 0));
                    acc[r][t] = fmaf(as, fmaf(wsc[u][r], d, wmn[u][r] * s), acc[r][t]);
                }
            }
        }
        k0 += U * kChunksPerStep;
        if (k0 < a.chunks) {
            load_step<R, U, true>(wrow, srow, k0, a.chunks, a.wshift, a.wgroup_chunks, raw, wsc);
            load_mins<R, U>(mrow, k0, a.chunks, a.wshift, a.wgroup_chunks, wmn);
        }
    }
    reduce_store<R, N>(acc, tile_row0, a.rows, a.n, a.bias, a.y);
}

// Any alignment: a warp per row; each lane's D and S over its columns of a dot group are scaled
// into an f32 sum, then the lanes are summed.
__global__ void __launch_bounds__(kThreads) gemv_w4a8_scalar_kernel(const ActsGemvArgs a) {
    const int lane = int(threadIdx.x) & 31;
    const int64_t row = int64_t(blockIdx.x) * kWarps + (int(threadIdx.x) >> 5);
    pdl_wait();
    pdl_launch_dependents();
    if (row >= a.rows) return;  // whole warps only: the shuffles below stay full-warp
    const uint8_t* wr = static_cast<const uint8_t*>(a.w) + row * (a.cols / 2);
    float acc[kMaxTokens];
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) acc[t] = 0.0f;
    for (int64_t k0 = 0; k0 < a.cols; k0 += a.dgroup) {
        int dot[kMaxTokens], sum[kMaxTokens];
#pragma unroll
        for (int t = 0; t < kMaxTokens; ++t) dot[t] = sum[t] = 0;
        for (int64_t c = k0 + lane; c < k0 + a.dgroup; c += 32) {
            const int code = (wr[c / 32 * 16 + c % 16] >> (c % 32 >= 16 ? 4 : 0)) & 15;
#pragma unroll
            for (int t = 0; t < kMaxTokens; ++t)
                if (t < a.n) {
                    const int qv = a.q[int64_t(t) * a.cols + c];
                    dot[t] += code * qv;
                    sum[t] += qv;
                }
        }
        const int64_t wi = row * a.wgroups + k0 / a.wgroup;
        const float ws = a.wscales[wi], wm = a.wmins[wi];
#pragma unroll
        for (int t = 0; t < kMaxTokens; ++t)
            if (t < a.n)
                acc[t] = fmaf(a.ascales[t * a.agroups + k0 / a.agroup], fmaf(ws, float(dot[t]), wm * float(sum[t])),
                              acc[t]);
    }
    warp_row_store(acc, row, a.rows, a.n, a.bias, a.y);
}

// Chunks in flight per lane as gemv.cu's I4 (VecConfig there): rows of 2048 columns are one chunk
// per lane, so R (rows_per_group) rather than U fills the 8 in flight at n <= 2. The extra D
// and S work per chunk is a few instructions; untimed (no GPU lent since this kernel was written).
template <int N, int R>
struct VecConfig {
    static_assert(N >= 4 ? R == 2 : (R == 1 || R == 2 || R == 4), "rows per group");
    static constexpr int U = N >= 4 ? (N == 4 ? 2 : 1) : (R == 1 ? 4 : 8 / R);
    static constexpr int MinBlocks = N >= 4 || R >= 2 ? 2 : 3;
};

template <int N, int R>
void launch_vec(const ActsGemvArgs& args, cudaStream_t stream) {
    using Cfg = VecConfig<N, R>;
    ActsGemvArgs a = args;
    const int64_t tiles = (a.rows + kGroups * R - 1) / (kGroups * R);
    SHARDLM_CHECK(tiles <= INT_MAX, "gemv_w4a8_cuda: ", a.rows, " rows is too many");
    launch_kernel("gemv_w4a8_vec_kernel", gemv_w4a8_vec_kernel<N, R, Cfg::U, Cfg::MinBlocks>, dim3(unsigned(tiles)),
                  dim3(kThreads), 0, stream, a);
}

template <int N>
void launch_vec_r(const ActsGemvArgs& a, cudaStream_t stream) {
    const int r = rows_per_group(a.chunks);
    if (r == 4) return launch_vec<N, 4>(a, stream);
    if (r == 2) return launch_vec<N, 2>(a, stream);
    return launch_vec<N, 1>(a, stream);
}

void launch_vec_tokens(const ActsGemvArgs& a, cudaStream_t stream) {
    // n is rounded up to 1, 2, 4 or 8, like gemv_cuda (the decode graphs' batch buckets).
    if (a.n == 1) return launch_vec_r<1>(a, stream);
    if (a.n == 2) return launch_vec_r<2>(a, stream);
    if (a.n <= 4) return launch_vec<4, 2>(a, stream);
    launch_vec<8, 2>(a, stream);
}

void launch_scalar(const ActsGemvArgs& a, cudaStream_t stream) {
    const int64_t blocks = (a.rows + kWarps - 1) / kWarps;
    SHARDLM_CHECK(blocks <= INT_MAX, "gemv_w4a8_cuda: ", a.rows, " rows is too many");
    launch_kernel("gemv_w4a8_scalar_kernel", gemv_w4a8_scalar_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0,
                  stream, a);
}

}  // namespace

void gemv_w4a8_cuda(const DeviceMatrix& w, const DeviceActs& a, const float* bias, float* y,
                    cudaStream_t stream) {
    SHARDLM_CHECK(a.n >= 0 && a.n <= kGemvMaxTokens, "gemv_w4a8_cuda: ", a.n, " token rows, at most ",
                  kGemvMaxTokens);
    SHARDLM_CHECK(w.dtype == DType::I4, "gemv_w4a8_cuda needs I4 weights, got ", dtype_name(w.dtype));
    check_int8_product(w, a, "gemv_w4a8_cuda");
    if (a.n == 0 || w.rows == 0) return;
    SHARDLM_CHECK(w.data && w.scales && w.mins && a.q && a.scales && y, "gemv_w4a8_cuda: null pointer");

    ActsGemvArgs p = acts_gemv_args(w, a, bias, y);
    const bool vec = w.cols > 0 && is_aligned(w.data, 16) && is_aligned(a.q, 16) && a.n * w.cols <= INT_MAX;
    if (!vec) return launch_scalar(p, stream);
    p.chunks = int(w.cols / 32);
    // chunk_groups counts 16-byte chunks of 16 one-byte columns: in bytes of codes, as gemv.cu's I4.
    chunk_groups(w.group_size / 2, w.cols / 2, p.wshift, p.wgroup_chunks);
    chunk_groups(a.group_size / 2, a.cols / 2, p.ashift, p.agroup_chunks);
    launch_vec_tokens(p, stream);
}

}  // namespace shardlm
