// Top-k of logits rows on the GPU, so a top-k (or greedy) sampler reads k candidates per row
// instead of the whole vocabulary. Exactly topk_ref (kernels/cpu/topk.h): value descending, ties
// by the lower index, NaN after every number, -0.0 == +0.0; values bit for bit. Deterministic and
// CUDA-Graph capturable (no allocation, no host sync; the launches depend only on rows, n, k).
// Pointers are device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace shardlm {

constexpr int64_t kTopKMax = 1024;

// Device scratch bytes topk_rows_cuda needs for rows x n with this k. Enough for any fewer rows
// and any smaller k with the same n, so one buffer sized for the largest case serves every call;
// k may exceed n here (it is clamped), 1 <= k <= kTopKMax. 0 when the rows need none.
size_t topk_scratch_bytes(int64_t rows, int64_t n, int64_t k);

// Row r of x is x + r * n (f32, any 4-byte alignment). Writes vals [rows, k] and ids [rows, k]
// (int32: the index within the row plus id_offset), each row in ranking order.
// 1 <= k <= min(n, kTopKMax); scratch: topk_scratch_bytes(rows, n, k) bytes, 4-byte aligned.
void topk_rows_cuda(const float* x, int64_t rows, int64_t n, int64_t k, int32_t id_offset, float* vals,
                    int32_t* ids, void* scratch, cudaStream_t stream);

}  // namespace shardlm
