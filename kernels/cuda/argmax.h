// Greedy sampling on the GPU: the index of the largest logit of each row (the lowest index among
// equal maxima, as the CPU sampler picks). Pointers are device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm {

void argmax_rows_cuda(const float* logits, int64_t rows, int64_t vocab, int32_t* out, cudaStream_t stream);

}  // namespace shardlm
