#include "kernels/cuda/lora.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cpu/lora.h"
#include "kernels/cuda/launch.h"

namespace shardlm {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kShrinkThreads = 128;  // split one dot product of `in` terms
constexpr int kExpandThreads = 128;  // columns per expand block

// A factor as f32: BF16's 16 bits are the top half of an f32's.
template <bool BF16>
__device__ __forceinline__ float factor(const void* p, int64_t i) {
    if (BF16) return __uint_as_float(uint32_t(static_cast<const uint16_t*>(p)[i]) << 16);
    return static_cast<const float*>(p)[i];
}

// Eight factors from 16 (BF16) or 32 (F32) aligned bytes at element i (a multiple of 8), as f32.
template <bool BF16>
__device__ __forceinline__ void factor8(const void* p, int64_t i, float (&f)[8]) {
    if (BF16) {
        const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + i);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        for (int j = 0; j < 4; ++j) {
            f[2 * j] = __uint_as_float(w[j] << 16);
            f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        }
    } else {
        const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
        const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i + 4);
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    }
}

// Block (row i = blockIdx.x of T = gridDim.x, k = blockIdx.y, part = blockIdx.z): its threads
// split x[i] . A[k] over the `in` terms, eight at a time with 16-byte loads where `vec` (in a
// multiple of 8 and the rows aligned), then sum their parts. A decode step's few rows have a block
// per (row, k, part): dozens of blocks reading each A row in two loads per thread, where a warp per
// k walked 4 KB rows 64 bytes at a time.
template <bool BF16>
__global__ void __launch_bounds__(kShrinkThreads)
    lora_shrink_kernel(const float* __restrict__ x, int64_t in, LoraParts parts, const int32_t* __restrict__ row_adapter,
                       int64_t max_rank, float* __restrict__ t, bool vec) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t i = blockIdx.x, k = blockIdx.y;
    const int s = row_adapter[i];
    if (s < 0) return;  // the whole block: the barrier below sees all its threads or none
    const LoraSlot slot = parts.p[blockIdx.z].slots[s];
    if (k >= slot.rank) return;
    const float* xr = x + i * in;
    const int64_t a0 = k * in;
    float sum = 0.0f;
    if (vec) {
        for (int64_t c = int64_t(threadIdx.x) * 8; c < in; c += int64_t(kShrinkThreads) * 8) {
            float a[8];
            factor8<BF16>(slot.a, a0 + c, a);
            const float4 x0 = *reinterpret_cast<const float4*>(xr + c), x1 = *reinterpret_cast<const float4*>(xr + c + 4);
            sum += x0.x * a[0] + x0.y * a[1] + x0.z * a[2] + x0.w * a[3] + x1.x * a[4] + x1.y * a[5] + x1.z * a[6] +
                   x1.w * a[7];
        }
    } else {
        for (int64_t c = threadIdx.x; c < in; c += kShrinkThreads) sum += xr[c] * factor<BF16>(slot.a, a0 + c);
    }
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(kFull, sum, off);
    __shared__ float warp_sums[kShrinkThreads / 32];
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < kShrinkThreads / 32; ++w) total += warp_sums[w];
        t[(int64_t(blockIdx.z) * gridDim.x + i) * max_rank + k] = total;
    }
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
    const int64_t blocks = (widest + kExpandThreads - 1) / kExpandThreads;
    SHARDLM_CHECK(max_rank <= 65535 && blocks <= 65535, "lora_add_cuda: rank ", max_rank, " or out ", widest, " too large");
    // 16-byte loads: x's rows and every slot's A rows start at multiples of 16 bytes when `in` is
    // a multiple of 8 (the engine's slots place each matrix at a 256-byte offset), x checked here.
    const bool vec = in % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const dim3 shrink{unsigned(T), unsigned(max_rank), unsigned(parts.n)}, expand{unsigned(T), unsigned(blocks), unsigned(parts.n)};
    if (factors == DType::BF16) {
        launch_kernel("lora_shrink", lora_shrink_kernel<true>, shrink, dim3(kShrinkThreads), 0, stream, x, in, parts,
                      row_adapter, max_rank, t, vec);
        launch_kernel("lora_expand", lora_expand_kernel<true>, expand, dim3(kExpandThreads), 0, stream, t, parts,
                      row_adapter, max_rank);
    } else {
        launch_kernel("lora_shrink", lora_shrink_kernel<false>, shrink, dim3(kShrinkThreads), 0, stream, x, in, parts,
                      row_adapter, max_rank, t, vec);
        launch_kernel("lora_expand", lora_expand_kernel<false>, expand, dim3(kExpandThreads), 0, stream, t, parts,
                      row_adapter, max_rank);
    }
}

}  // namespace shardlm
