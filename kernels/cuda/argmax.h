// Greedy sampling on the GPU: the index of the largest logit of each row, the lowest index among
// equal maxima, NaN never taken over a number (an all-NaN row gives index 0), as the CPU sampler's
// argmax (runtime/sampler.h) and the first candidate of top-k (kernels/cpu/topk.h). One pass over
// the row: the fast path of Engine::forward_top for k = 1. Pointers are device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm {

// Row r is logits + r * vocab. ids[r] = its argmax + id_offset (the rank's first vocabulary id
// under tensor parallelism); vals[r] = the value there (vals may be null).
void argmax_rows_cuda(const float* logits, int64_t rows, int64_t vocab, int32_t id_offset, float* vals,
                      int32_t* ids, cudaStream_t stream);

}  // namespace shardlm
