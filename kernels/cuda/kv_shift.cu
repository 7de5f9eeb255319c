#include <algorithm>
#include <climits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_shift.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/rope_head.h"

namespace shardlm {
namespace {

// One warp per (moved row, KV head, K or V): task ((i - i0) * n_kv_heads + h) * 2 + kv. A K warp
// holds the head in its registers (rope_head.h), turns it and stores it as rope_kv does; a V
// warp copies the row's bytes (padding included) and its scale.
//
// The move overlaps itself (destination rows below source rows), so the rows go in waves of at
// most `discard`: wave c moves rows i in [c * discard, (c + 1) * discard) from keep + discard + i
// to keep + i. Inside a wave the rows read and the rows written are disjoint, and a wave writes
// only rows the wave before it has already read (one launch per wave, in order).
constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = 32 * kWarpsPerBlock;
using rope::HeadRegs;

struct ShiftArgs {
    DeviceKVLayer kv;
    int64_t slot, keep, discard, i0, rows;  // this wave: moved rows i0 .. i0 + rows - 1
    int64_t row_bytes;                      // a multiple of 16
    int half;
    const float* inv_freq;
};

template <DType D>
__global__ void __launch_bounds__(kThreads) kv_shift_kernel(ShiftArgs a) {
    const int lane = threadIdx.x & 31;
    const int64_t task = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    pdl_wait();
    pdl_launch_dependents();
    if (task >= a.rows * a.kv.n_kv_heads * 2) return;  // uniform per warp
    const int kv = int(task & 1);
    const int64_t h = (task >> 1) % a.kv.n_kv_heads, i = a.i0 + (task >> 1) / a.kv.n_kv_heads;
    const int64_t block = (a.slot * a.kv.n_kv_heads + h) * a.kv.capacity;
    const int64_t src = block + a.keep + a.discard + i, dst = block + a.keep + i;
    if (kv == 1) {
        const uint4* from = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(a.kv.v) + src * a.row_bytes);
        uint4* to = reinterpret_cast<uint4*>(static_cast<uint8_t*>(a.kv.v) + dst * a.row_bytes);
        for (int64_t c = lane; c < a.row_bytes / 16; c += 32) to[c] = from[c];
        if (D == DType::I8 && lane == 0) a.kv.v_scales[dst] = a.kv.v_scales[src];
        return;
    }
    HeadRegs r = rope::load_cache_row<D>(a.kv.k, a.kv.k_scales, src, a.kv.row_stride, lane, a.half);
    rope::rotate(r, rope::angles(a.inv_freq, float(-a.discard), lane, a.half));
    rope::store_cache_row<D>(r, a.kv.k, a.kv.k_scales, dst, a.kv.row_stride, lane, a.half);
}

}  // namespace

void kv_shift_cuda(const DeviceKVLayer& kv, int64_t slot, int64_t keep, int64_t discard, int64_t len,
                   int64_t head_dim, const float* inv_freq, cudaStream_t stream) {
    SHARDLM_CHECK(slot >= 0 && slot < kv.n_slots && keep >= 0 && discard > 0 && keep + discard <= len &&
                      len <= kv.capacity,
                  "kv_shift_cuda: slot ", slot, ", keep ", keep, ", discard ", discard, " of ", len,
                  " positions (capacity ", kv.capacity, ")");
    SHARDLM_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim <= rope::kMaxHeadDim && kv.row_stride >= head_dim,
                  "kv_shift_cuda: head_dim ", head_dim, " (even, at most ", rope::kMaxHeadDim, ") in rows of ",
                  kv.row_stride);
    const int64_t row_bytes = kv.row_stride * int64_t(dtype_size(kv.dtype));
    SHARDLM_CHECK(row_bytes % 16 == 0, "kv_shift_cuda: KV rows of ", row_bytes, " bytes are not 16-byte multiples");
    SHARDLM_CHECK(kv.dtype != DType::I8 || (kv.k_scales && kv.v_scales), "kv_shift_cuda: an int8 KV cache needs scales");
    const int64_t moved = len - keep - discard;
    for (int64_t i0 = 0; i0 < moved; i0 += discard) {
        const ShiftArgs a{kv, slot, keep, discard, i0, std::min(discard, moved - i0), row_bytes, int(head_dim / 2),
                          inv_freq};
        const int64_t blocks = (a.rows * kv.n_kv_heads * 2 + kWarpsPerBlock - 1) / kWarpsPerBlock;
        SHARDLM_CHECK(blocks <= INT_MAX, "kv_shift_cuda: ", blocks, " blocks do not fit one grid");
        const dim3 grid{unsigned(blocks)}, block{unsigned(kThreads)};
        switch (kv.dtype) {
            case DType::F32: launch_kernel("kv_shift_kernel", kv_shift_kernel<DType::F32>, grid, block, 0, stream, a); break;
            case DType::F16: launch_kernel("kv_shift_kernel", kv_shift_kernel<DType::F16>, grid, block, 0, stream, a); break;
            case DType::BF16: launch_kernel("kv_shift_kernel", kv_shift_kernel<DType::BF16>, grid, block, 0, stream, a); break;
            case DType::I8: launch_kernel("kv_shift_kernel", kv_shift_kernel<DType::I8>, grid, block, 0, stream, a); break;
            default: fail("kv_shift_cuda: unsupported KV cache dtype ", dtype_name(kv.dtype));
        }
    }
}

}  // namespace shardlm
