#include "kernels/cuda/lora.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cpu/lora.h"
#include "kernels/cuda/launch.h"

namespace shardlm {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kShrinkWarps = 4;     // k's per shrink block
constexpr int kExpandThreads = 128; // columns per expand block

// A factor as f32: BF16's 16 bits are the top half of an f32's.
template <bool BF16>
__device__ __forceinline__ float factor(const void* p, int64_t i) {
    if (BF16) return __uint_as_float(uint32_t(static_cast<const uint16_t*>(p)[i]) << 16);
    return static_cast<const float*>(p)[i];
}

// Block (row i = blockIdx.x of T = gridDim.x, group of kShrinkWarps k's, part); warp w takes
// k = group * kShrinkWarps + w.
template <bool BF16>
__global__ void lora_shrink_kernel(const float* __restrict__ x, int64_t in, LoraParts parts,
                                   const int32_t* __restrict__ row_adapter, int64_t max_rank, float* __restrict__ t) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t i = blockIdx.x;
    const int s = row_adapter[i];
    if (s < 0) return;
    const LoraSlot slot = parts.p[blockIdx.z].slots[s];
    const int64_t k = int64_t(blockIdx.y) * kShrinkWarps + threadIdx.x / 32;
    if (k >= slot.rank) return;  // a whole warp: the shuffles below see all its lanes or none
    const int lane = threadIdx.x % 32;
    const float* xr = x + i * in;
    const int64_t a0 = k * in;
    float sum = 0.0f;
    for (int64_t c = lane; c < in; c += 32) sum += xr[c] * factor<BF16>(slot.a, a0 + c);
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(kFull, sum, off);
    if (lane == 0) t[(int64_t(blockIdx.z) * gridDim.x + i) * max_rank + k] = sum;
}

// Block (row i, kExpandThreads columns, part): y[i, o] += t[part, i, :rank] Bt[:rank, o].
template <bool BF16>
__global__ void lora_expand_kernel(const float* __restrict__ t, LoraParts parts, const int32_t* __restrict__ row_adapter,
                                   int64_t max_rank) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t i = blockIdx.x;
    const int s = row_adapter[i];
    const LoraPart& part = parts.p[blockIdx.z];
    const int64_t o = int64_t(blockIdx.y) * kExpandThreads + threadIdx.x;
    if (s < 0 || o >= part.out) return;
    const LoraSlot slot = part.slots[s];
    const float* tr = t + (int64_t(blockIdx.z) * gridDim.x + i) * max_rank;
    float* y = part.y + i * part.ldy + o;
    float acc = *y;
    for (int64_t k = 0; k < slot.rank; ++k) acc += tr[k] * factor<BF16>(slot.bt, lora_bt_index(k, o, slot.rank, part.out));
    *y = acc;
}

}  // namespace

void lora_add_cuda(const float* x, int64_t T, int64_t in, const LoraParts& parts, const int32_t* row_adapter,
                   DType factors, int64_t max_rank, float* t, cudaStream_t stream) {
    SHARDLM_CHECK(factors == DType::F32 || factors == DType::BF16, "lora_add_cuda: factors of ", dtype_name(factors));
    SHARDLM_CHECK(parts.n >= 1 && parts.n <= kLoraMaxParts && T >= 0 && T <= int64_t(INT32_MAX) && in > 0 && max_rank >= 0,
                  "lora_add_cuda: ", parts.n, " parts, T ", T, " in ", in, " max_rank ", max_rank);
    int64_t widest = 0;
    for (int j = 0; j < parts.n; ++j) {
        const LoraPart& p = parts.p[j];
        SHARDLM_CHECK(p.out > 0 && p.ldy >= p.out && p.slots && p.y, "lora_add_cuda: part ", j, " out ", p.out, " ldy ", p.ldy);
        widest = std::max(widest, p.out);
    }
    if (T == 0 || max_rank == 0) return;
    const int64_t groups = (max_rank + kShrinkWarps - 1) / kShrinkWarps, blocks = (widest + kExpandThreads - 1) / kExpandThreads;
    SHARDLM_CHECK(groups <= 65535 && blocks <= 65535, "lora_add_cuda: rank ", max_rank, " or out ", widest, " too large");
    const dim3 shrink{unsigned(T), unsigned(groups), unsigned(parts.n)}, expand{unsigned(T), unsigned(blocks), unsigned(parts.n)};
    if (factors == DType::BF16) {
        launch_kernel("lora_shrink", lora_shrink_kernel<true>, shrink, dim3(32 * kShrinkWarps), 0, stream, x, in, parts,
                      row_adapter, max_rank, t);
        launch_kernel("lora_expand", lora_expand_kernel<true>, expand, dim3(kExpandThreads), 0, stream, t, parts,
                      row_adapter, max_rank);
    } else {
        launch_kernel("lora_shrink", lora_shrink_kernel<false>, shrink, dim3(32 * kShrinkWarps), 0, stream, x, in, parts,
                      row_adapter, max_rank, t);
        launch_kernel("lora_expand", lora_expand_kernel<false>, expand, dim3(kExpandThreads), 0, stream, t, parts,
                      row_adapter, max_rank);
    }
}

}  // namespace shardlm
