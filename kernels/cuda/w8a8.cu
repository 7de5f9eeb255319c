// W8A8 kernels: activation quantization, the decode GEMV on __dp4a, the prefill GEMM on cuBLAS's
// INT8 tensor cores, and W4A8 prefill's 16-bit input (the quantized activations dequantized;
// w4a8.h). Formulas in w8a8.h; g = min(ga, gw) is the dot group.
//
// Quantization. Each (token, group) segment of x is contiguous, segment i = x[i * ga, (i + 1) * ga),
// so the kernel walks n * cols / ga segments: a warp per segment, or a whole block for segments of
// 1024 columns and more (decode's per-token scale). max|x| is exact in any order; the scale, the
// inverse and each q use the CPU's operations one for one (IEEE division, a product never fused,
// the same NaN-propagating clamps, then round-to-nearest-even, which is what the CPU's
// add-and-subtract-1.5*2^23 computes for |v| <= 127), so the results are bit-identical.
//
// GEMV, vector path (16-byte aligned W and q, cols and g multiples of 16). The layout of gemv.cu:
// a block of 8 warps owns 4 * R rows, each warp is 4 groups of 8 lanes, group j owns R rows, and
// chunk k (16 bytes) of a row goes to warp (k / 8) % 8, lane k % 8 of each group, so one warp load
// fetches four whole 128-byte segments. Per chunk and token a lane loads the token's 16 bytes of
// q (n * cols bytes in all, cached in L1, shared by the 4 groups and R rows) and runs 4 __dp4a,
// 16 MACs, where the I8 W8A16 kernel spends 16 FMAs per token (and 16 conversions) on them.
// A chunk never straddles a dot group; with one group per row (per-channel weights, per-token
// activations) a lane keeps INT32 sums and scales once at the end, otherwise each chunk's INT32
// dot is scaled by act_scale * w_scale into an f32 sum. Lane sums are exact: at most
// 127 * 127 * cols / 64 < 2^31. Sums over lanes and warps are f32 in a fixed order.
//
// GEMV, scalar path (anything else): a warp per row, lanes stride over each dot group's columns.
//
// GEMM. Row-major y[T, rows] = q[T, cols] * W^T in cuBLAS's column-major terms (as gemm.cu): W is
// A [cols, rows] with lda = cols, q is B [cols, T] with ldb = cols, C [rows, T] with ldc = rows;
// OP_T, OP_N ("TN", the layout IMMA takes), m = rows, n = T, k = g, and A, B offset by k0 columns
// for the dot group starting at k0. cuBLAS's conditions for INT8 (CUDA_R_8I in, CUDA_R_32I out,
// CUBLAS_COMPUTE_32I; cublasGemmEx: A, B 4-byte aligned, lda, ldb multiples of 4; cuBLASLt's IMMA
// kernels: TN only, m, k and leading dimensions multiples of 4, 16-byte pointers for full speed)
// are met by asking for rows % 4 == 0, cols and g multiples of 16 and 16-byte aligned W and q, so
// every group's operands stay 16-byte aligned. Anything else runs the scalar GEMV kernel on 8
// tokens at a time. The INT32 dot of one group of 127-bounded values
// is exact when 127 * 127 * g < 2^31 (g <= 133144, checked).
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/act_quant.h"
#include "kernels/cuda/align.h"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gemv_tile.h"
#include "kernels/cuda/half_input.h"
#include "kernels/cuda/w4a8.h"
#include "kernels/cuda/w8a8.h"

namespace shardlm {
namespace {

using namespace gemv_tile;
constexpr int64_t kMaxBlocks = 4096;
constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // as gemm.cu
constexpr int64_t kMaxExactGroup = INT32_MAX / (127 * 127);


// ---- Quantization ----

// TPG threads per segment (32 or kThreads), `group` columns per segment; Vec: float4 loads and
// char4 stores (x 16-byte and q 4-byte aligned, group % 4 == 0).
template <int TPG, bool Vec>
__global__ void __launch_bounds__(kThreads) quantize_acts_kernel(const float* __restrict__ x, int64_t segments,
                                                                 int64_t group, int8_t* __restrict__ q,
                                                                 float* __restrict__ scales) {
    pdl_wait();  // kernels/cuda/launch.h
    pdl_launch_dependents();
    const int sub = int(threadIdx.x) % TPG;
    const int64_t seg = int64_t(blockIdx.x) * (kThreads / TPG) + int(threadIdx.x) / TPG;
    if (seg >= segments) return;  // uniform over the segment's threads (a warp or the block)
    const float* xs = x + seg * group;
    int8_t* qs = q + seg * group;

    float amax = 0.0f;  // fmaxf ignores a NaN like the CPU's std::max(amax, |x|)
    if constexpr (Vec) {
        const float4* x4 = reinterpret_cast<const float4*>(xs);
        for (int64_t i = sub; i < group / 4; i += TPG) {
            amax = abs_max4(amax, x4[i]);
        }
    } else {
        for (int64_t i = sub; i < group; i += TPG) amax = fmaxf(amax, fabsf(xs[i]));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if constexpr (TPG > 32) {
        __shared__ float warp_max[kWarps];
        if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax;
        __syncthreads();
#pragma unroll
        for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, warp_max[w]);
    }
    const float inv = quantize_act_inv(amax);
    if (sub == 0) scales[seg] = quantize_act_scale(amax);

    if constexpr (Vec) {
        const float4* x4 = reinterpret_cast<const float4*>(xs);
        char4* q4 = reinterpret_cast<char4*>(qs);
        for (int64_t i = sub; i < group / 4; i += TPG) {
            q4[i] = quantize_act4(x4[i], inv);
        }
    } else {
        for (int64_t i = sub; i < group; i += TPG) qs[i] = int8_t(quantize_act(xs[i], inv));
    }
}

template <int TPG, bool Vec>
void launch_quantize(const float* x, int64_t segments, int64_t group, int8_t* q, float* scales, cudaStream_t stream) {
    const int64_t blocks = (segments + kThreads / TPG - 1) / (kThreads / TPG);
    SHARDLM_CHECK(blocks <= INT_MAX, "quantize_acts_cuda: ", segments, " groups is too many");
    launch_kernel("quantize_acts_kernel", quantize_acts_kernel<TPG, Vec>, dim3(unsigned(blocks)), dim3(kThreads), 0,
                  stream, x, segments, group, q, scales);
}

// ---- GEMV ----

// Signed INT8 dot of two 16-byte chunks, added to c.
__device__ __forceinline__ int dot16(const uint4& w, const uint4& x, int c) {
    c = __dp4a(int(w.x), int(x.x), c);
    c = __dp4a(int(w.y), int(x.y), c);
    c = __dp4a(int(w.z), int(x.z), c);
    return __dp4a(int(w.w), int(x.w), c);
}

// N token rows (n <= N; rows past n - 1 repeat row n - 1 and are not stored), R rows per group,
// U chunks per row in flight per lane. OneGroup: ga == gw == cols.
template <int N, int R, int U, int MinBlocks, bool OneGroup>
__global__ void __launch_bounds__(kThreads, MinBlocks) gemv_w8a8_vec_kernel(const ActsGemvArgs a) {
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    const int g = lane / kLanesPerRow, lig = lane % kLanesPerRow;
    const int64_t tile_row0 = int64_t(blockIdx.x) * (kGroups * R);

    const int8_t* wrow[R];
    const float* srow[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int64_t row = tile_row<R>(blockIdx.x, g, r, a.rows, 0);
        wrow[r] = static_cast<const int8_t*>(a.w) + row * a.cols;
        srow[r] = a.wscales + row * a.wgroups;
    }
    int toff[N];  // token t's row of q and of its scales (n * cols < 2^31, checked)
    int tsoff[N];
#pragma unroll
    for (int t = 0; t < N; ++t) {
        const int tt = t < a.n ? t : a.n - 1;
        toff[t] = tt * int(a.cols);
        tsoff[t] = tt * int(a.agroups);
    }

    int idot[R][N];   // OneGroup: the lane's exact INT32 sums
    float acc[R][N];  // otherwise: sums of scaled chunk dots
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < N; ++t) {
            idot[r][t] = 0;
            acc[r][t] = 0.0f;
        }

    // The first step's weights (and scales) are loaded before pdl_wait(), as in gemv.cu: they never
    // change, so under PDL they stream in while the kernel ahead (quantize_acts, which writes q and
    // its scales) finishes. q and its scales are read only after the wait.
    int k0 = warp * kLanesPerRow + lig;
    uint4 raw[U][R];
    float wsc[U][R];
    load_step<R, U, !OneGroup>(wrow, srow, k0, a.chunks, a.wshift, a.wgroup_chunks, raw, wsc);
    pdl_wait();
    pdl_launch_dependents();
    while (k0 < a.chunks) {
        // Unconditional arithmetic: a chunk past the row has zero weights (a zero dot) and reads
        // the row's last chunk of q, so the loads above never sink into a branch.
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int kc = min(k0 + u * kChunksPerStep, a.chunks - 1);
            const int8_t* qk = a.q + int64_t(kc) * 16;
            int agi = 0;
            if constexpr (!OneGroup) agi = group_of(kc, a.ashift, a.agroup_chunks);
#pragma unroll
            for (int t = 0; t < N; ++t) {
                const uint4 qv = __ldg(reinterpret_cast<const uint4*>(qk + toff[t]));
                if constexpr (OneGroup) {
#pragma unroll
                    for (int r = 0; r < R; ++r) idot[r][t] = dot16(raw[u][r], qv, idot[r][t]);
                } else {
                    const float as = __ldg(a.ascales + tsoff[t] + agi);
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        acc[r][t] = fmaf(float(dot16(raw[u][r], qv, 0)), wsc[u][r] * as, acc[r][t]);
                }
            }
        }
        k0 += U * kChunksPerStep;
        if (k0 < a.chunks) load_step<R, U, !OneGroup>(wrow, srow, k0, a.chunks, a.wshift, a.wgroup_chunks, raw, wsc);
    }
    if constexpr (OneGroup) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float ws = __ldg(srow[r]);
#pragma unroll
            for (int t = 0; t < N; ++t) acc[r][t] = float(idot[r][t]) * (ws * __ldg(a.ascales + tsoff[t]));
        }
    }

    reduce_store<R, N>(acc, tile_row0, a.rows, a.n, a.bias, a.y);
}

// Any shape and alignment: a warp per row; each lane's INT32 dot over its columns of a dot group
// is scaled into an f32 sum, then the lanes are summed.
__global__ void __launch_bounds__(kThreads) gemv_w8a8_scalar_kernel(const ActsGemvArgs a) {
    const int lane = int(threadIdx.x) & 31;
    const int64_t row = int64_t(blockIdx.x) * kWarps + (int(threadIdx.x) >> 5);
    pdl_wait();
    pdl_launch_dependents();
    if (row >= a.rows) return;  // whole warps only: the shuffles below stay full-warp
    const int8_t* wr = static_cast<const int8_t*>(a.w) + row * a.cols;
    float acc[kMaxTokens];
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) acc[t] = 0.0f;
    for (int64_t k0 = 0; k0 < a.cols; k0 += a.dgroup) {
        int dot[kMaxTokens];
#pragma unroll
        for (int t = 0; t < kMaxTokens; ++t) dot[t] = 0;
        for (int64_t c = k0 + lane; c < k0 + a.dgroup; c += 32) {
            const int wv = wr[c];
#pragma unroll
            for (int t = 0; t < kMaxTokens; ++t)
                if (t < a.n) dot[t] += wv * int(a.q[int64_t(t) * a.cols + c]);
        }
        const float ws = a.wscales[row * a.wgroups + k0 / a.wgroup];
#pragma unroll
        for (int t = 0; t < kMaxTokens; ++t)
            if (t < a.n) acc[t] = fmaf(float(dot[t]), ws * a.ascales[t * a.agroups + k0 / a.agroup], acc[t]);
    }
    warp_row_store(acc, row, a.rows, a.n, a.bias, a.y);
}

// Rows per group R, chunks in flight per row U and the register budget (65536 / (256 * MinBlocks))
// as for gemv.cu's f16 path, whose per-chunk work is as light: n <= 2 asks for 128 bytes of
// weights in flight per lane (R * U = 8 chunks; grouped: with their scales, which need 3 blocks'
// registers, not 4, to stay out of local memory); n >= 4 shares each q load between two rows and
// needs the registers of 2 blocks per SM for the accumulators. n <= 2 uses R = 1 unless
// SHARDLM_GEMV_R forces 2 or 4: gemv.cu measured R = 4 much faster for I8 rows of 2048 columns
// (a lane owns only 2 of their chunks, so U alone cannot fill the 8), but W8A8 has not been
// measured that way yet (bench/gpu_check.sh gemv-r times it).
template <int N, bool OneGroup, int R>
struct VecConfig {
    static_assert(N >= 4 ? R == 2 : (R == 1 || R == 2 || R == 4), "rows per group");
    static constexpr int U = N <= 2 ? 8 / R : N == 4 ? 4 : 2;
    static constexpr int MinBlocks = N >= 4 || R == 4 ? 2 : (R == 2 || !OneGroup) ? 3 : 4;
};

template <int N, bool OneGroup, int R>
void launch_vec(const ActsGemvArgs& args, cudaStream_t stream) {
    using Cfg = VecConfig<N, OneGroup, R>;
    ActsGemvArgs a = args;
    const int64_t tiles = (a.rows + kGroups * R - 1) / (kGroups * R);
    SHARDLM_CHECK(tiles <= INT_MAX, "gemv_w8a8_cuda: ", a.rows, " rows is too many");
    launch_kernel("gemv_w8a8_vec_kernel", gemv_w8a8_vec_kernel<N, R, Cfg::U, Cfg::MinBlocks, OneGroup>,
                  dim3(unsigned(tiles)), dim3(kThreads), 0, stream, a);
}

template <int N, bool OneGroup>
void launch_vec_r(const ActsGemvArgs& a, cudaStream_t stream) {
    const int r = gemv_forced_rows_per_group();
    if (r == 4) return launch_vec<N, OneGroup, 4>(a, stream);
    if (r == 2) return launch_vec<N, OneGroup, 2>(a, stream);
    return launch_vec<N, OneGroup, 1>(a, stream);
}

template <bool OneGroup>
void launch_vec_tokens(const ActsGemvArgs& a, cudaStream_t stream) {
    // n is rounded up to 1, 2, 4 or 8, like gemv_cuda (the decode graphs' batch buckets).
    if (a.n == 1) return launch_vec_r<1, OneGroup>(a, stream);
    if (a.n == 2) return launch_vec_r<2, OneGroup>(a, stream);
    if (a.n <= 4) return launch_vec<4, OneGroup, 2>(a, stream);
    return launch_vec<8, OneGroup, 2>(a, stream);
}

void launch_scalar(const ActsGemvArgs& a, cudaStream_t stream) {
    const int64_t blocks = (a.rows + kWarps - 1) / kWarps;
    SHARDLM_CHECK(blocks <= INT_MAX, "gemv_w8a8_cuda: ", a.rows, " rows is too many");
    launch_kernel("gemv_w8a8_scalar_kernel", gemv_w8a8_scalar_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream,
                  a);
}

// ---- GEMM ----

// y[t, r] = (first ? 0 : y[t, r]) + dots[t, r] * (act_scale[t, ag] * w_scale[r, wg]) (+ bias[r] when
// last): one dot group's INT32 products, scaled and summed in f32 in the CPU's order.
__global__ void w8a8_epilogue_kernel(const int32_t* __restrict__ dots, const float* __restrict__ ascales,
                                     int64_t agroups, int64_t ag, const float* __restrict__ wscales,
                                     int64_t wgroups, int64_t wg, const float* __restrict__ bias, float* y,
                                     int64_t T, int64_t rows, bool first, bool last) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        const float as = ascales[t * agroups + ag];
        for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride) {
            const int64_t i = t * rows + r;
            float v = fmaf(float(dots[i]), as * wscales[r * wgroups + wg], first ? 0.0f : y[i]);
            if (last && bias) v += bias[r];
            y[i] = v;
        }
    }
}

// ---- W4A8 prefill input (w8a8.h dequantize_acts_half_cuda) ----

// Four columns c .. c + 3 of token t per thread: q * act_scale in f32 (one rounding), then to h's
// 16-bit type in h's column order. A group holds whole quads (its size is a multiple of 4).
__global__ void dequantize_acts_half_kernel(const int8_t* __restrict__ q, const float* __restrict__ scales,
                                            int64_t n, int64_t cols, int64_t group_size, HalfInput h) {
    const int64_t quads = n * (cols / 4), stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < quads; i += stride) {
        const int64_t t = i / (cols / 4), c = (i - t * (cols / 4)) * 4;
        const int8_t* p = q + t * cols + c;
        const float s = scales[t * (cols / group_size) + c / group_size];
        store_half_input4(h, t, cols, c, make_float4(float(p[0]) * s, float(p[1]) * s, float(p[2]) * s, float(p[3]) * s));
    }
}

}  // namespace

void check_int8_product(const DeviceMatrix& w, const DeviceActs& a, const char* fn) {
    const bool i4 = w.dtype == DType::I4;
    SHARDLM_CHECK(w.dtype == DType::I8 || i4, "", fn, " needs I8 or I4 weights, got ", dtype_name(w.dtype));
    SHARDLM_CHECK(!w.interleaved, "", fn, " reads the natural column order (the engine interleaves no W8A8 or I4 matrix)");
    SHARDLM_CHECK(w.rows >= 0 && w.cols >= 0 && a.n >= 0, "", fn, ": bad shape ", w.rows, "x", w.cols, ", ", a.n,
                  " tokens");
    SHARDLM_CHECK(a.cols == w.cols, "", fn, ": activations have ", a.cols, " columns, weights ", w.cols);
    SHARDLM_CHECK(w.group_size > 0 && w.cols % w.group_size == 0 && (!i4 || w.group_size % 32 == 0), "", fn,
                  ": weight group ", w.group_size, i4 ? " must be a multiple of 32 dividing" : " must divide",
                  " the row length ", w.cols);
    SHARDLM_CHECK(a.group_size > 0 && a.cols % a.group_size == 0 &&
                      (a.group_size % w.group_size == 0 || w.group_size % a.group_size == 0) &&
                      (!i4 || std::min(a.group_size, w.group_size) % 32 == 0),
                  "", fn, ": activation group ", a.group_size, " and weight group ", w.group_size,
                  " must divide one another and the row length", i4 ? ", the smaller a multiple of 32" : "");
}

void quantize_acts_cuda(const float* x, int64_t n, int64_t cols, int64_t group_size, int8_t* q, float* scales,
                        cudaStream_t stream) {
    SHARDLM_CHECK(n >= 0 && cols >= 0, "quantize_acts_cuda: bad shape ", n, "x", cols);
    SHARDLM_CHECK(group_size > 0 && cols % group_size == 0, "quantize_acts_cuda: group size ", group_size,
                  " must divide the row length ", cols);
    if (n == 0 || cols == 0) return;
    SHARDLM_CHECK(x && q && scales, "quantize_acts_cuda: null pointer");
    const int64_t segments = n * (cols / group_size);
    const bool vec = is_aligned(x, 16) && is_aligned(q, 4) && group_size % 4 == 0;
    // A block per segment from 1024 columns (4 floats per thread and more), else a warp.
    if (group_size >= 1024) {
        if (vec) return launch_quantize<kThreads, true>(x, segments, group_size, q, scales, stream);
        return launch_quantize<kThreads, false>(x, segments, group_size, q, scales, stream);
    }
    if (vec) return launch_quantize<32, true>(x, segments, group_size, q, scales, stream);
    launch_quantize<32, false>(x, segments, group_size, q, scales, stream);
}

void gemv_w8a8_cuda(const DeviceMatrix& w, const DeviceActs& a, const float* bias, float* y,
                    cudaStream_t stream) {
    SHARDLM_CHECK(a.n >= 0 && a.n <= kGemvMaxTokens, "gemv_w8a8_cuda: ", a.n, " token rows, at most ",
                  kGemvMaxTokens);
    SHARDLM_CHECK(w.dtype == DType::I8, "gemv_w8a8_cuda needs I8 weights, got ", dtype_name(w.dtype));
    check_int8_product(w, a, "gemv_w8a8_cuda");
    if (a.n == 0 || w.rows == 0) return;
    SHARDLM_CHECK(w.data && w.scales && a.q && a.scales && y, "gemv_w8a8_cuda: null pointer");

    ActsGemvArgs p = acts_gemv_args(w, a, bias, y);
    const bool vec = w.cols > 0 && w.cols % 16 == 0 && p.dgroup % 16 == 0 && is_aligned(w.data, 16) &&
                     is_aligned(a.q, 16) && a.n * w.cols <= INT_MAX;
    if (!vec) return launch_scalar(p, stream);
    p.chunks = int(w.cols / 16);
    chunk_groups(w.group_size, w.cols, p.wshift, p.wgroup_chunks);
    chunk_groups(a.group_size, a.cols, p.ashift, p.agroup_chunks);
    if (w.group_size == w.cols && a.group_size == a.cols) return launch_vec_tokens<true>(p, stream);
    launch_vec_tokens<false>(p, stream);
}

CublasInt8Gemm::CublasInt8Gemm(cudaStream_t stream, int64_t max_tokens, int64_t max_rows)
    : stream_(stream), max_tokens_(max_tokens), max_rows_(max_rows) {
    SHARDLM_CHECK(max_tokens >= 0 && max_rows >= 0, "CublasInt8Gemm: negative size");
    SHARDLM_CHECK(max_rows == 0 || max_tokens <= (INT64_MAX / 4) / max_rows, "CublasInt8Gemm: scratch size overflows");
    const size_t dots_bytes = size_t(max_tokens * max_rows) * sizeof(int32_t);
    try {
        CUBLAS_CHECK(cublasCreate(&handle_));
        // SetStream resets the handle to cuBLAS's own workspace pool, so the workspace comes after.
        CUBLAS_CHECK(cublasSetStream(handle_, stream_));
        CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
        CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes));
        if (dots_bytes) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dots_), dots_bytes));
    } catch (...) {
        release();
        throw;
    }
    scratch_bytes_ = kWorkspaceBytes + dots_bytes;
}

CublasInt8Gemm::~CublasInt8Gemm() { release(); }

void CublasInt8Gemm::release() noexcept {
    if (handle_) cublasDestroy(handle_);
    for (void* p : {static_cast<void*>(dots_), workspace_})
        if (p) cudaFree(p);
    handle_ = nullptr;
    dots_ = nullptr;
    workspace_ = nullptr;
}

void CublasInt8Gemm::run(const DeviceMatrix& w, const DeviceActs& a, const float* bias, float* y) {
    check_int8_product(w, a, "CublasInt8Gemm");
    SHARDLM_CHECK(w.dtype == DType::I8, "CublasInt8Gemm: I8 weights only (W4A8 prefill: dequantize_acts_half_cuda, "
                  "then CublasGemm)");
    const int64_t T = a.n, rows = w.rows, cols = w.cols;
    SHARDLM_CHECK(T <= max_tokens_, "CublasInt8Gemm: ", T, " tokens, scratch is for ", max_tokens_);
    SHARDLM_CHECK(rows <= max_rows_, "CublasInt8Gemm: ", rows, " rows, scratch is for ", max_rows_);
    SHARDLM_CHECK(rows <= INT_MAX && cols <= INT_MAX && T <= INT_MAX, "CublasInt8Gemm: shape ", rows, "x", cols,
                  " out of cuBLAS's range");
    if (T == 0 || rows == 0) return;
    SHARDLM_CHECK(w.data && w.scales && a.q && a.scales && y, "CublasInt8Gemm: null pointer");

    const int64_t g = std::min(w.group_size, a.group_size);
    const bool imma = cols > 0 && rows % 4 == 0 && cols % 16 == 0 && g % 16 == 0 && is_aligned(w.data, 16) &&
                      is_aligned(a.q, 16);
    if (!imma) {
        // The scalar GEMV kernel, kMaxTokens tokens at a time (y's rows keep their pitch).
        for (int64_t t0 = 0; t0 < T; t0 += kMaxTokens) {
            DeviceActs part = a;
            part.q = a.q + t0 * cols;
            part.scales = a.scales + t0 * (cols / a.group_size);
            part.n = std::min<int64_t>(kMaxTokens, T - t0);
            launch_scalar(acts_gemv_args(w, part, bias, y + t0 * rows), stream_);
        }
        return;
    }
    SHARDLM_CHECK(g <= kMaxExactGroup, "CublasInt8Gemm: dot groups of ", g, " columns could overflow INT32 sums");

    const int32_t one = 1, zero = 0;
    const int8_t* wq = static_cast<const int8_t*>(w.data);
    const dim3 grid(unsigned(std::max<int64_t>(1, std::min<int64_t>((rows + kThreads - 1) / kThreads, kMaxBlocks))),
                    unsigned(std::min<int64_t>(T, 65535)));
    for (int64_t k0 = 0; k0 < cols; k0 += g) {
        CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(T), int(g), &one, wq + k0, CUDA_R_8I,
                                  int(cols), a.q + k0, CUDA_R_8I, int(cols), &zero, dots_, CUDA_R_32I, int(rows),
                                  CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
        launch_plain("w8a8_epilogue_kernel", w8a8_epilogue_kernel, grid, dim3(kThreads), 0, stream_, dots_, a.scales,
                     cols / a.group_size, k0 / a.group_size, w.scales, cols / w.group_size, k0 / w.group_size, bias, y,
                     T, rows, k0 == 0, k0 + g == cols);
    }
}

void dequantize_acts_half_cuda(const DeviceActs& a, const HalfInput& h, cudaStream_t stream) {
    SHARDLM_CHECK(a.n >= 0 && a.cols >= 0 && a.group_size > 0 && a.cols % a.group_size == 0 && a.group_size % 4 == 0,
                  "dequantize_acts_half_cuda: ", a.n, "x", a.cols, " activations in groups of ", a.group_size,
                  " (a multiple of 4 dividing the row length)");
    if (a.n == 0 || a.cols == 0) return;
    SHARDLM_CHECK(a.q && a.scales, "dequantize_acts_half_cuda: null pointer");
    SHARDLM_CHECK(half_input_fits(h, a.cols), "dequantize_acts_half_cuda: the 16-bit input cannot take rows of ",
                  a.cols, " columns");
    const int64_t quads = a.n * (a.cols / 4);
    launch_plain("dequantize_acts_half_kernel", dequantize_acts_half_kernel,
                 dim3(unsigned(std::min<int64_t>((quads + kThreads - 1) / kThreads, kMaxBlocks))), dim3(kThreads), 0,
                 stream, a.q, a.scales, a.n, a.cols, a.group_size, h);
}

}  // namespace shardlm
