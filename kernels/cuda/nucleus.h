// Each logits row's total nucleus weight on the GPU (kernels/cpu/nucleus.h), for top-p sampling
// without a top-k limit: the host then draws from the row's first candidates alone what it would
// draw from the whole row (runtime/sampler.h Sampler::sample_nucleus). Exact: integer sums.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm {

// mass[r] = sum over x[r * n .. r * n + n) of nucleus_weight(x, row_max[r * max_stride], T), for
// r < rows; row_max is device memory (e.g. the first of each row's ranked candidates) and n must
// be below kNucleusMaxRow.
void nucleus_mass_rows_cuda(const float* x, int64_t rows, int64_t n, const float* row_max, int64_t max_stride,
                            float temperature, uint64_t* mass, cudaStream_t stream);

}  // namespace shardlm
