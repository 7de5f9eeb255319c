#include <climits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/rope_head.h"
#include "kernels/cuda/rope_kv.h"

namespace shardlm {
namespace {

// One warp per (token, head), the head in its registers (rope_head.h): no shared memory and no
// __syncthreads. Heads of a token are tasks t * (n_heads + n_kv_heads) + h: h < n_heads is a q
// head, otherwise k head h - n_heads, whose warp also stores v head h - n_heads.
constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = 32 * kWarpsPerBlock;
using rope::HeadRegs;

// The loads are ordered for latency: the q/k norm weights before pdl_wait(), under the previous
// kernel's tail (inv_freq is read beside the position, which the angle needs anyway); a KV warp
// loads its k and v heads together, before its first store (the compiler cannot move a load above
// a store that may alias it).
template <DType D>
__global__ void __launch_bounds__(kThreads) rope_kv_kernel(RopeKVParams p) {
    const int lane = threadIdx.x & 31;
    const int64_t heads = p.n_heads + p.n_kv_heads;
    const int64_t task = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    if (task >= p.T * heads) return;  // uniform per warp: the shuffles below see full warps
    const int64_t t = task / heads, h = task % heads;
    const int half = int(p.head_dim / 2);
    const bool is_q = h < p.n_heads;
    const float* norm_w = is_q ? p.q_norm : p.k_norm;
    const HeadRegs w = norm_w ? rope::load_head(norm_w, lane, half) : HeadRegs{};
    pdl_wait();
    pdl_launch_dependents();
    const rope::Angles ang = rope::angles(p.inv_freq, float(p.pos[t]), lane, half);

    const int64_t q_row = p.row_stride ? p.row_stride : p.n_heads * p.head_dim;
    const int64_t kv_row = p.row_stride ? p.row_stride : p.n_kv_heads * p.head_dim;
    if (is_q) {
        float* x = p.q + t * q_row + h * p.head_dim;
        HeadRegs r = rope::load_head(x, lane, half);
        if (norm_w) rope::norm_head(r, w, half, p.eps);
        rope::rotate(r, ang);
        rope::store_head(r, p.q_out ? p.q_out + (t * p.n_heads + h) * p.head_dim : x, lane, half);
        return;
    }

    const int64_t kh = h - p.n_heads;
    float* x = p.k + t * kv_row + kh * p.head_dim;
    HeadRegs r = rope::load_head(x, lane, half);
    const HeadRegs v = rope::load_head(p.v + t * kv_row + kh * p.head_dim, lane, half);
    // K/V are [n_slots][n_kv_heads][capacity][row_stride]; position pos lives in row pos % capacity.
    const int64_t cache_row = (int64_t(p.slot[t]) * p.kv.n_kv_heads + kh) * p.kv.capacity +
                              int64_t(p.pos[t]) % p.kv.capacity;
    if (norm_w) rope::norm_head(r, w, half, p.eps);
    rope::rotate(r, ang);
    rope::store_head(r, x, lane, half);
    rope::store_cache_row<D>(r, p.kv.k, p.kv.k_scales, cache_row, p.kv.row_stride, lane, half);
    rope::store_cache_row<D>(v, p.kv.v, p.kv.v_scales, cache_row, p.kv.row_stride, lane, half);
}

}  // namespace

void rope_kv_cuda(const RopeKVParams& p, cudaStream_t stream) {
    if (p.T == 0) return;
    SHARDLM_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0 && p.head_dim <= rope::kMaxHeadDim,
                  "rope_kv_cuda: head_dim ", p.head_dim, " must be even and at most ", rope::kMaxHeadDim);
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
