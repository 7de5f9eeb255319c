// LoRA's low-rank update of a Linear layer's output, for adapters kept beside the weights and
// chosen per sequence (model/lora_weights.h):
//   y [n, out] += (x [n, in] A^T) Bt     A [rank, in], Bt [rank, out] (B transposed, scaled)
// t [n, rank] is the caller's scratch (it receives x A^T). Two thin products: the rank is far
// below in and out, so the work is reading A and Bt once per call, and the matmul kernels (built
// for long rows of one matrix) would spend it on rows of `rank` elements.
//
// lora_add_ref is the plain truth; lora_add threads over A's rows and then over blocks of y's
// columns (vectorised, the AVX-512 build picked at run time), each y element summed over k in the
// reference's order: only x A^T's dot products are summed in another order.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"

namespace shardlm {

void lora_add_ref(const float* x, int64_t n, int64_t in, const float* a, const float* bt, int64_t rank, int64_t out,
                  float* t, float* y);
void lora_add(const float* x, int64_t n, int64_t in, const float* a, const float* bt, int64_t rank, int64_t out, float* t,
              float* y, CpuIsa isa = CpuIsa::Auto);

}  // namespace shardlm
