#include <climits>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/act_quant.h"
#include "kernels/cuda/align.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/half_input.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/w8a8.h"

namespace shardlm {
namespace {

constexpr int kThreads = 256;  // every kernel here is launched with exactly this block size

// 1 / sqrt(mean(x^2) + eps) of a row from each thread's partial sum of squares: warp shuffles,
// then one shared slot per warp summed by thread 0. Every thread of the block must call it (it
// holds two __syncthreads); all get the same result.
__device__ float block_inv_rms(float ss, int64_t dim, float eps) {
    __shared__ float warp_sums[kThreads / 32];
    __shared__ float inv;
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int i = 0; i < kThreads / 32; ++i) total += warp_sums[i];
        inv = rsqrtf(total / float(dim) + eps);
    }
    __syncthreads();
    return inv;
}

// One block per row; each thread owns the strided elements i = threadIdx.x + k * kThreads in both
// passes, so in-place use (y == x, as rmsnorm_ref allows) and aliasing of y with delta are safe:
// no element is read by one thread after another wrote it. Hence no __restrict__ on x/y/delta.
__global__ void rmsnorm_kernel(const float* x, const float* __restrict__ w, float* y, int64_t dim, float eps) {
    pdl_wait();
    pdl_launch_dependents();
    const float* xr = x + int64_t(blockIdx.x) * dim;
    float* yr = y + int64_t(blockIdx.x) * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) ss += xr[i] * xr[i];
    const float inv = block_inv_rms(ss, dim, eps);
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) yr[i] = (xr[i] * inv) * w[i];
}

// x += delta (when delta is set), then y = rmsnorm(x) * w; the second pass re-reads the x this
// same thread just wrote. With `order`, y[j] = rmsnorm(x)[order[j]] * w[order[j]]: the second pass
// reads the elements other threads wrote, seen after block_inv_rms's __syncthreads (y never
// aliases x then).
__global__ void add_rmsnorm_kernel(float* x, const float* delta, const float* __restrict__ w, float* y,
                                   int64_t dim, float eps, const int32_t* __restrict__ order) {
    pdl_wait();
    pdl_launch_dependents();
    float* xr = x + int64_t(blockIdx.x) * dim;
    float* yr = y + int64_t(blockIdx.x) * dim;
    float ss = 0.0f;
    if (delta) {
        const float* dr = delta + int64_t(blockIdx.x) * dim;
        for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
            const float v = xr[i] + dr[i];
            xr[i] = v;
            ss += v * v;
        }
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += kThreads) ss += xr[i] * xr[i];
    }
    const float inv = block_inv_rms(ss, dim, eps);
    if (order) {
        for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
            const int64_t o = order[i];
            yr[i] = (xr[o] * inv) * w[o];
        }
        return;
    }
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) yr[i] = (xr[i] * inv) * w[i];
}

// y[b] = rmsnorm(x[r] + delta[r]) * w with r = rows[b]; x is only read, so the sum is formed in
// both passes.
__global__ void rmsnorm_rows_kernel(const float* __restrict__ x, const float* __restrict__ delta,
                                    const int32_t* __restrict__ rows, const float* __restrict__ w,
                                    float* __restrict__ y, int64_t dim, float eps) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t r = rows[blockIdx.x];
    const float* xr = x + r * dim;
    const float* dr = delta ? delta + r * dim : nullptr;
    float* yr = y + int64_t(blockIdx.x) * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
        const float v = dr ? xr[i] + dr[i] : xr[i];
        ss += v * v;
    }
    const float inv = block_inv_rms(ss, dim, eps);
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
        const float v = dr ? xr[i] + dr[i] : xr[i];
        yr[i] = (v * inv) * w[i];
    }
}

// The vector path of all three norms, for rows of dim % 4 == 0 floats (at most 4 * kThreads * V)
// at 16-byte aligned addresses: row b reads x[r] (+ delta[r]) with r = rows ? rows[b] : b, writes
// the sum back to x[r] when write_x, and y[b] = rmsnorm(sum) * w. Each thread holds its V float4s
// of the row in registers: all its loads are issued before the first use, so a row costs one
// memory latency instead of one per element (the scalar kernels above cannot batch their loads:
// x, delta and y may alias, so every load waits for the store before it), and the second pass
// reads registers. w is constant during a session: loaded before pdl_wait(), under the previous
// kernel's tail.
struct NormArgs {
    float* x;
    const float* delta;
    const int32_t* rows;
    const float* w;
    float* y;
    int64_t dim;
    float eps;
    bool write_x;
    // When set, y is also quantized per row for a W8A8 projection: q [rows, dim] and one scale
    // per row, quantize_acts_cuda's bits (act_quant.h).
    int8_t* q = nullptr;
    float* q_scales = nullptr;
    // When half.data is set, y is also (or, with y null, only) written as a prefill GEMM's 16-bit
    // input (half_input.h).
    HalfInput half = {};
    // When set (with write_x, y and neither q nor half): y[b, j] = the normed row's element
    // order[j] (an act-order projection's input order, gather.h), read back from x once written.
    const int32_t* order = nullptr;
};

template <int V>
__global__ void __launch_bounds__(kThreads) norm_vec_kernel(NormArgs a) {
    const int n4 = int(a.dim / 4);
    float4 wv[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = int(threadIdx.x) + k * kThreads;
        wv[k] = i < n4 ? __ldg(reinterpret_cast<const float4*>(a.w) + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    pdl_wait();
    pdl_launch_dependents();
    const int64_t r = a.rows ? int64_t(a.rows[blockIdx.x]) : int64_t(blockIdx.x);
    float4* xr = reinterpret_cast<float4*>(a.x + r * a.dim);
    const float4* dr = a.delta ? reinterpret_cast<const float4*>(a.delta + r * a.dim) : nullptr;
    float4 v[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = int(threadIdx.x) + k * kThreads;
        v[k] = i < n4 ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (dr) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const int i = int(threadIdx.x) + k * kThreads;
            if (i < n4) {
                const float4 d = dr[i];
                v[k].x += d.x;
                v[k].y += d.y;
                v[k].z += d.z;
                v[k].w += d.w;
            }
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < V; ++k) ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    if (a.write_x) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const int i = int(threadIdx.x) + k * kThreads;
            if (i < n4) xr[i] = v[k];
        }
    }
    const float inv = block_inv_rms(ss, a.dim, a.eps);
    if (a.order) {  // (x's row as written above, every thread's part seen after the barrier)
        const float* xs = a.x + r * a.dim;
        float* ys = a.y + int64_t(blockIdx.x) * a.dim;
        for (int64_t i = threadIdx.x; i < a.dim; i += kThreads) {
            const int64_t o = a.order[i];
            ys[i] = (xs[o] * inv) * a.w[o];
        }
        return;
    }
    float4* yr = a.y ? reinterpret_cast<float4*>(a.y + int64_t(blockIdx.x) * a.dim) : nullptr;
    float amax = 0.0f;  // fmaxf ignores a NaN like the CPU's std::max(amax, |x|)
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = int(threadIdx.x) + k * kThreads;
        v[k] = make_float4((v[k].x * inv) * wv[k].x, (v[k].y * inv) * wv[k].y, (v[k].z * inv) * wv[k].z,
                           (v[k].w * inv) * wv[k].w);
        if (i < n4) {
            if (yr) yr[i] = v[k];
            if (a.half.data) store_half_input4(a.half, blockIdx.x, a.dim, 4 * int64_t(i), v[k]);
            amax = abs_max4(amax, v[k]);
        }
    }
    if (!a.q) return;  // uniform over the grid
    amax = block_max<kThreads>(amax);
    const float qinv = quantize_act_inv(amax);
    if (threadIdx.x == 0) a.q_scales[blockIdx.x] = quantize_act_scale(amax);
    char4* qr = reinterpret_cast<char4*>(a.q + int64_t(blockIdx.x) * a.dim);
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = int(threadIdx.x) + k * kThreads;
        if (i < n4) qr[i] = quantize_act4(v[k], qinv);
    }
}


// Launches the vector path when the row fits it (see norm_vec_kernel); false: use the scalar one.
bool launch_norm_vec(const NormArgs& a, int64_t n_rows, cudaStream_t stream) {
    if (a.dim % 4 != 0 || a.dim > int64_t(4) * kThreads * 8) return false;
    if (!is_aligned(a.x, 16) || !is_aligned(a.delta, 16) || !is_aligned(a.w, 16) || !is_aligned(a.y, 16) ||
        !is_aligned(a.q, 4))
        return false;
    const int64_t per_thread = (a.dim / 4 + kThreads - 1) / kThreads;  // float4s per thread
    const dim3 grid{unsigned(n_rows)}, block{unsigned(kThreads)};
    if (per_thread <= 1) launch_kernel("norm_vec_kernel", norm_vec_kernel<1>, grid, block, 0, stream, a);
    else if (per_thread <= 2) launch_kernel("norm_vec_kernel", norm_vec_kernel<2>, grid, block, 0, stream, a);
    else if (per_thread <= 4) launch_kernel("norm_vec_kernel", norm_vec_kernel<4>, grid, block, 0, stream, a);
    else launch_kernel("norm_vec_kernel", norm_vec_kernel<8>, grid, block, 0, stream, a);
    return true;
}

void check_rows(int64_t rows, const char* who) {
    SHARDLM_CHECK(rows > 0 && rows <= INT_MAX, "rows of ", who, ": ", rows, " do not fit one grid");
}

}  // namespace

void rmsnorm_cuda(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                  cudaStream_t stream) {
    if (rows == 0) return;
    check_rows(rows, "rmsnorm_cuda");
    if (launch_norm_vec(NormArgs{const_cast<float*>(x), nullptr, nullptr, w, y, dim, eps, false}, rows, stream))
        return;
    launch_kernel("rmsnorm_kernel", rmsnorm_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, stream, x, w, y, dim, eps);
}

void add_rmsnorm_cuda(float* x, const float* delta, const float* w, float* y, int64_t rows, int64_t dim,
                      float eps, cudaStream_t stream, const int32_t* order) {
    if (rows == 0) return;
    check_rows(rows, "add_rmsnorm_cuda");
    SHARDLM_CHECK(!order || (y && y != x), "add_rmsnorm_cuda: an ordered output must not be x");
    NormArgs a{x, delta, nullptr, w, y, dim, eps, true};
    a.order = order;
    if (launch_norm_vec(a, rows, stream)) return;
    launch_kernel("add_rmsnorm_kernel", add_rmsnorm_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, stream,
                  x, delta, w, y, dim, eps, order);
}

void add_rmsnorm_quantize_cuda(float* x, const float* delta, const float* w, float* y, int64_t rows, int64_t dim,
                               float eps, int8_t* q, float* q_scales, cudaStream_t stream) {
    if (rows == 0) return;
    check_rows(rows, "add_rmsnorm_quantize_cuda");
    SHARDLM_CHECK(q && q_scales, "add_rmsnorm_quantize_cuda: null output");
    NormArgs a{x, delta, nullptr, w, y, dim, eps, true};
    a.q = q;
    a.q_scales = q_scales;
    if (launch_norm_vec(a, rows, stream)) return;
    add_rmsnorm_cuda(x, delta, w, y, rows, dim, eps, stream, nullptr);
    quantize_acts_cuda(y, rows, dim, dim, q, q_scales, stream);
}

bool add_rmsnorm_half_cuda(float* x, const float* delta, const float* w, int64_t rows, int64_t dim, float eps,
                           const HalfInput& out, cudaStream_t stream) {
    if (rows == 0) return true;
    check_rows(rows, "add_rmsnorm_half_cuda");
    if (!half_input_fits(out, dim)) return false;
    NormArgs a{x, delta, nullptr, w, nullptr, dim, eps, true};
    a.half = out;
    return launch_norm_vec(a, rows, stream);
}

void rmsnorm_rows_cuda(const float* x, const float* delta, const int32_t* rows, int64_t n, const float* w,
                       float* y, int64_t dim, float eps, cudaStream_t stream) {
    if (n == 0) return;
    check_rows(n, "rmsnorm_rows_cuda");
    // (x is only read: the const_cast never writes through it, write_x is false.)
    if (launch_norm_vec(NormArgs{const_cast<float*>(x), delta, rows, w, y, dim, eps, false}, n, stream)) return;
    launch_kernel("rmsnorm_rows_kernel", rmsnorm_rows_kernel, dim3(unsigned(n)), dim3(kThreads), 0, stream,
                  x, delta, rows, w, y, dim, eps);
}

}  // namespace shardlm
