// Token penalties (repetition, presence, frequency) on logits rows on the GPU: the same operation
// and the same bits as apply_penalties_ref (kernels/cpu/penalty.h), applied to a step's logits
// before the sampler's selection (argmax, top-k, nucleus mass) reads them. Pointers are device
// memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/penalty.h"

namespace shardlm {

// Row r is logits + r * vocab and holds ids [id_offset, id_offset + vocab); entries [0, n) are
// applied, those outside the slice skipped. Within a row the ids must be distinct (one thread
// per entry writes its logit).
void apply_penalties_cuda(float* logits, int64_t vocab, int32_t id_offset, const PenaltyEntry* entries, int64_t n,
                          cudaStream_t stream);

}  // namespace shardlm
