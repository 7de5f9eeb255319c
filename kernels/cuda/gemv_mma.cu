// The decode GEMV on tensor cores, for 1-8 token rows of x against interleaved INT8, FP16 or BF16
// weights (gemv.h, gemv_mma_cuda; SHARDLM_GEMV_MMA=1 takes it from 3 rows, =all always). Why:
// with 4 or 8 token rows the vector kernel does 2-8 FP32 FMAs per weight byte, plus the
// conversions, and its instruction issue, not HBM, bounds it (INT8 batch 4 decode took 1.64
// ms/token on the H200 against 1.03 at batch 1 for the same bytes, FP16 1.80 against 1.33). An
// m16n8k16 mma does 16 x 8 x 16 of those products in one instruction.
//
// Mapping. A warp computes one or two 16-row tiles (two under SwiGLU: 16 gate rows and the 16
// matching up rows, so the epilogue has both) against all n token rows (the mma's 8 columns: lane
// (g, t) brings token g, tokens past n repeat the last and are never stored). The 8 warps of a
// block split the columns: warp w takes the 64-byte steps w, w + 8, ... and the block
// sums the warps' tiles in shared memory at the end. In a step, lane t of a quad loads the 16-byte
// chunk t (of the step's 4) of rows g and g + 8 of each tile: stored columns 4m .. 4m + 3 of a
// chunk (INT8: word m; FP16/BF16: words 2m, 2m + 1) are exactly the lane's A fragment of the
// step's m-th mma (mma.h), so the weights go from the load to the tensor core as they are (INT8:
// one byte permutation and HSUB2 per pair). The interleaved order (interleave.h) puts natural
// columns 32m + 4j .. +3 of the 8C-column block in those columns of chunk j: the B fragment of
// the same mma is one float4 of x.
// Precision: INT8 and FP16 values are exact in FP16, BF16 ones within FP16's range (beyond 65504
// they clamp; below 2^-14 they keep an absolute error under 2^-25); each x value is split into
// FP16 hi + lo (mma.h) and multiplied twice, FP32 sums: ~22 significant bits, within the vector
// kernel's test bounds. An INT8 group scale (groups of a multiple of 128 columns) multiplies each
// step's sums.
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/align.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gemv_tile.h"
#include "kernels/cuda/interleave.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mma.h"
#include "kernels/cuda/mma_check.h"
#include "kernels/cuda/words.h"

namespace shardlm {
namespace {

constexpr int kMmaWarps = 8, kMmaThreads = 32 * kMmaWarps;
constexpr int kStepBytes = 64;  // per row and step: 4 lanes x 16-byte chunks

struct MmaArgs {
    const char* w;        // rows of cols * dtype size bytes
    const float* scales;  // I8: [rows, groups]
    const float* x;       // [n, cols], natural column order
    const float* bias;    // [rows] or null
    float* y;             // [n, rows] or, SwiGLU, [n, half]
    int64_t rows, cols, row_bytes, groups, group_size;
    int64_t swiglu_half;  // > 0: tile 0 gate rows j0.., tile 1 up rows half + j0..
    int n, steps;
};

// Two INT8 weights (bytes 2h, 2h + 1 of w) as an FP16 pair, exactly: the byte b ^ 0x80 under
// the FP16 exponent of 1024 is 1024 + b + 128, and subtracting 1152 leaves b.
__device__ __forceinline__ uint32_t i8_pair_to_f16x2(uint32_t w, int h) {
    const uint32_t biased = __byte_perm(w ^ 0x80808080u, 0x64646464u, h ? 0x4342u : 0x4140u);
    __half2 v;
    memcpy(&v, &biased, 4);
    v = __hsub2(v, __floats2half2_rn(1152.0f, 1152.0f));
    uint32_t r;
    memcpy(&r, &v, 4);
    return r;
}

// Columns 4m .. 4m + 3 of a 16-byte chunk of W as the two A registers of one row.
template <DType W>
__device__ __forceinline__ void a_pairs(const uint4& c, int m, uint32_t& lo, uint32_t& hi) {
    if constexpr (W == DType::I8) {
        lo = i8_pair_to_f16x2(word_of(c, m), 0);
        hi = i8_pair_to_f16x2(word_of(c, m), 1);
    } else if constexpr (W == DType::F16) {
        lo = word_of(c, 2 * m);
        hi = word_of(c, 2 * m + 1);
    } else {  // BF16 -> FP16
        const uint32_t w0 = word_of(c, 2 * m), w1 = word_of(c, 2 * m + 1);
        lo = pack_half2(clamp_half(__uint_as_float(w0 << 16)), clamp_half(__uint_as_float(w0 & 0xffff0000u)));
        hi = pack_half2(clamp_half(__uint_as_float(w1 << 16)), clamp_half(__uint_as_float(w1 & 0xffff0000u)));
    }
}

// RT 16-row tiles per warp (2 under SwiGLU: gate and up), U steps in flight: RT * U = 4, so that
// a lane keeps 128 bytes of weights in flight either way.
template <DType W, int RT, int U>
__global__ void __launch_bounds__(kMmaThreads) gemv_mma_kernel(const MmaArgs a) {
    constexpr int C = W == DType::I8 ? 16 : 8, NM = C / 4;  // columns per chunk, mmas per step
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
    int64_t row[RT][2];  // [tile][g, g + 8]
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const int64_t base = a.swiglu_half > 0 ? (r == 0 ? 0 : a.swiglu_half) + int64_t(blockIdx.x) * 16
                                               : int64_t(blockIdx.x) * (16 * RT) + 16 * r;
        row[r][0] = base + g;
        row[r][1] = base + g + 8;
    }
    const char* wr[RT][2];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) wr[r][h] = a.w + row[r][h] * a.row_bytes + 16 * t;

    // The first steps' weights before pdl_wait(): they never change (gemv.cu does the same).
    uint4 raw[U][RT][2];
    auto load = [&](int s0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = s0 + u * kMmaWarps;
#pragma unroll
            for (int r = 0; r < RT; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    raw[u][r][h] = gemv_tile::load_weights_if(wr[r][h] + int64_t(s) * kStepBytes, s < a.steps);
        }
    };
    int s0 = warp;
    load(s0);
    pdl_wait();
    pdl_launch_dependents();

    const float* xr = a.x + int64_t(min(g, a.n - 1)) * a.cols;
    float acc[RT][4] = {};
    while (s0 < a.steps) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = s0 + u * kMmaWarps;
            if (s >= a.steps) break;  // warp-uniform: s depends on the warp only
            // B fragments of the step's NM mmas: chunk j = 4 (s % 2) + t of 8C-column block s / 2.
            const float* xs = xr + int64_t(s >> 1) * (8 * C) + 4 * (((s & 1) << 2) + t);
            uint32_t bh[NM][2], bl[NM][2];
#pragma unroll
            for (int m = 0; m < NM; ++m) {
                const float4 v = __ldg(reinterpret_cast<const float4*>(xs + 32 * m));
                split_half2(clamp_half(v.x), clamp_half(v.y), bh[m][0], bl[m][0]);
                split_half2(clamp_half(v.z), clamp_half(v.w), bh[m][1], bl[m][1]);
            }
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int m = 0; m < NM; ++m) {
                    uint32_t af[4];
                    a_pairs<W>(raw[u][r][0], m, af[0], af[2]);  // row g
                    a_pairs<W>(raw[u][r][1], m, af[1], af[3]);  // row g + 8
                    mma_16816(d, af, bh[m]);
                    mma_16816(d, af, bl[m]);
                }
                if constexpr (W == DType::I8) {
                    const int64_t gi = int64_t(s) * (4 * C) / a.group_size;
                    const float s_g = __ldg(a.scales + row[r][0] * a.groups + gi);
                    const float s_g8 = __ldg(a.scales + row[r][1] * a.groups + gi);
                    acc[r][0] = fmaf(d[0], s_g, acc[r][0]);
                    acc[r][1] = fmaf(d[1], s_g, acc[r][1]);
                    acc[r][2] = fmaf(d[2], s_g8, acc[r][2]);
                    acc[r][3] = fmaf(d[3], s_g8, acc[r][3]);
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[r][e] += d[e];
                }
            }
        }
        s0 += U * kMmaWarps;
        if (s0 < a.steps) load(s0);
    }

    // The warps' partial tiles, summed in a fixed order (results repeat run to run).
    __shared__ float part[kMmaWarps][RT][4][32];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[warp][r][e][lane] = acc[r][e];
    __syncthreads();
    if (warp != 0) return;
    float sum[RT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = 0.0f;
            for (int w = 0; w < kMmaWarps; ++w) v += part[w][r][e][lane];
            sum[r][e] = v + (a.bias ? a.bias[row[r][e >> 1]] : 0.0f);
        }
    // Lane (g, t) holds rows g and g + 8 of each tile for tokens 2t and 2t + 1.
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int tok = 2 * t + (e & 1);
        if (tok >= a.n) continue;
        if constexpr (RT == 2) {
            if (a.swiglu_half > 0) {
                a.y[int64_t(tok) * a.swiglu_half + row[0][e >> 1]] = silu_mul(sum[0][e], sum[RT - 1][e]);
                continue;
            }
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) a.y[int64_t(tok) * a.rows + row[r][e >> 1]] = sum[r][e];
    }
}

template <DType W>
void launch_mma(const MmaArgs& a, bool two, int64_t blocks, cudaStream_t stream) {
    const dim3 grid{unsigned(blocks)}, block{unsigned(kMmaThreads)};
    if (two) launch_kernel("gemv_mma_kernel", gemv_mma_kernel<W, 2, 2>, grid, block, 0, stream, a);
    else launch_kernel("gemv_mma_kernel", gemv_mma_kernel<W, 1, 4>, grid, block, 0, stream, a);
}

}  // namespace

bool gemv_mma_cuda(const DeviceMatrix& w, const float* x, int64_t n, const float* bias, float* y,
                   int64_t swiglu_half, cudaStream_t stream) {
    SHARDLM_CHECK(n >= 0 && n <= kGemvMaxTokens, "gemv_mma_cuda: ", n, " token rows, at most ", kGemvMaxTokens);
    const int64_t out_rows = swiglu_half > 0 ? swiglu_half : w.rows;
    const bool i8 = w.dtype == DType::I8;
    const int64_t block_cols = 8 * interleave_chunk_cols(w.dtype);  // 128 (I8) or 64 (F16/BF16)
    if (!(i8 || w.dtype == DType::F16 || w.dtype == DType::BF16) || !w.interleaved || n < 1 || w.cols <= 0 ||
        w.cols % block_cols != 0 ||
        (i8 && (!w.scales || w.group_size <= 0 || w.group_size % 128 != 0 || w.cols % w.group_size != 0)) ||
        out_rows <= 0 || out_rows % 16 != 0 || (swiglu_half > 0 && w.rows != 2 * swiglu_half) ||
        !is_aligned(w.data, 16) || !is_aligned(x, 16) || n * w.cols > INT_MAX)
        return false;
    SHARDLM_CHECK(y, "gemv_mma_cuda: null output");
    MmaArgs a{};
    a.w = static_cast<const char*>(w.data);
    a.scales = w.scales;
    a.x = x;
    a.bias = bias;
    a.y = y;
    a.rows = w.rows;
    a.cols = w.cols;
    a.row_bytes = w.cols * int64_t(dtype_size(w.dtype));
    a.group_size = w.group_size;
    a.groups = i8 ? w.cols / w.group_size : 0;
    a.swiglu_half = swiglu_half;
    a.n = int(n);
    a.steps = int(w.cols * int64_t(dtype_size(w.dtype)) / kStepBytes);
    // Two tiles per warp where that still gives every SM two blocks (and always under SwiGLU,
    // whose tiles pair gate with up rows); else one, for twice the blocks (a 2048-row down_proj
    // would fill 64 of the H200's 132 SMs with two).
    const bool two = swiglu_half > 0 || (w.rows % 32 == 0 && w.rows / 32 >= 2 * int64_t(cuda_sm_count()));
    const int64_t blocks = swiglu_half > 0 ? out_rows / 16 : w.rows / (two ? 32 : 16);
    SHARDLM_CHECK(blocks <= INT_MAX, "gemv_mma_cuda: ", w.rows, " rows is too many");
    switch (w.dtype) {
        case DType::I8: launch_mma<DType::I8>(a, two, blocks, stream); break;
        case DType::F16: launch_mma<DType::F16>(a, two, blocks, stream); break;
        default: launch_mma<DType::BF16>(a, two, blocks, stream); break;
    }
    return true;
}

int gemv_mma_min_tokens() {
    static const int min_tokens = [] {
        const std::string v = cuda_tuning_env("SHARDLM_GEMV_MMA", {"0", "1", "all"}, "the decode GEMV on tensor cores");
        if (v.empty() || v == "0") return 0;
        return !mma_layout_holds() ? 0 : v == "1" ? 3 : 1;
    }();
    return min_tokens;
}

}  // namespace shardlm
