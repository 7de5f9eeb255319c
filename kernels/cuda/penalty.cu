#include <climits>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/penalty.h"

namespace shardlm {
namespace {

constexpr int kThreads = 256;

// One thread per entry: a few hundred scattered logits per step, so there is nothing to tile.
// __fdiv_rn, __fmul_rn and __fsub_rn round each operation once (no fused multiply-add, no fast
// division), as penalize() does on the CPU.
__global__ void __launch_bounds__(kThreads) apply_penalties_kernel(float* __restrict__ logits, int64_t vocab,
                                                                     int32_t id_offset,
                                                                     const PenaltyEntry* __restrict__ entries, int n) {
    pdl_wait();
    pdl_launch_dependents();
    const int i = int(blockIdx.x) * kThreads + int(threadIdx.x);
    if (i >= n) return;
    const PenaltyEntry e = entries[i];
    const int64_t j = int64_t(e.id) - id_offset;
    if (j < 0 || j >= vocab) return;
    float* p = logits + int64_t(e.row) * vocab + j;
    const float x = *p;
    const float scaled = x > 0.0f ? __fdiv_rn(x, e.repetition) : __fmul_rn(x, e.repetition);
    *p = __fsub_rn(scaled, e.offset);
}

}  // namespace

void apply_penalties_cuda(float* logits, int64_t vocab, int32_t id_offset, const PenaltyEntry* entries, int64_t n,
                          cudaStream_t stream) {
    if (n == 0) return;
    SHARDLM_CHECK(n > 0 && n <= INT_MAX - kThreads, "apply_penalties_cuda: ", n, " entries do not fit one grid");
    SHARDLM_CHECK(vocab > 0, "apply_penalties_cuda: vocabulary slice of ", vocab);
    const unsigned blocks = unsigned((n + kThreads - 1) / kThreads);
    launch_kernel("apply_penalties_kernel", apply_penalties_kernel, dim3(blocks), dim3(kThreads), 0, stream, logits,
                  vocab, id_offset, entries, int(n));
}

}  // namespace shardlm
