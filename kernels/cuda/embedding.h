// Embedding gather on the GPU (vocab-parallel aware). Pointers are device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/matrix.h"

namespace shardlm {

// out[i, :] = table[ids[i] - vocab0, :] as f32 (I8 rows dequantized: q * scale of the group) when
// 0 <= ids[i] - vocab0 < table.rows, zeros otherwise (another rank holds that row; the engine's
// all-reduce assembles the full rows). out is [n, table.cols].
void embedding_cuda(const DeviceMatrix& table, const int32_t* ids, int64_t n, int64_t vocab0, float* out,
                    cudaStream_t stream);

}  // namespace shardlm
