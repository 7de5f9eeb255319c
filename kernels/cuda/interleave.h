// The interleaved column order of decode weights (DeviceMatrix::interleaved).
//
// The decode GEMV (gemv.cu) has groups of 8 lanes each read one 128-byte segment of a row: lane j
// takes the 16-byte chunk j, C columns (C = 16 for I8, 8 for F16/BF16). In the natural order those
// C columns are consecutive, so lane j needs x[C*j .. C*j + C): as float4 loads, the 8 lanes of a
// load sit 4*C bytes apart and touch 4 (I8) or 2 (F16) 128-byte lines of x where one would do,
// and L1 spends most of its time on x, not on the weights (4 wavefronts of x per weight wavefront
// for I8). Interleaved, quad q (4 columns) of lane j's chunk holds natural columns
// 32q + 4j .. 32q + 4j + 3 of the 8C-column block, so the 8 lanes' q-th float4 loads of x are one
// contiguous 128-byte line. Within each 8C-column block:
//
//   stored column j*C + 4q + i  holds  natural column 32q + 4j + i     (j < 8, q < C/4, i < 4)
//
// Columns never leave their 8C-column block, so an INT8 group of a multiple of 8C columns keeps its
// columns (and its scale).
//
// I4 (C = 32: a 16-byte chunk holds 32 codes, weights_view.h) takes blocks of 4 chunks, 128
// columns, so that AWQ's 128-column groups keep their columns: a block of 8 chunks would be 256
// columns, two groups in one chunk. Lanes j and j + 4 of a group of 8 then read two 64-byte halves
// of x's lines, 2 wavefronts per load where the natural order needs 8 (each lane's 32 codes meet
// 128 bytes of x). Within each 128-column block:
//
//   stored column j*32 + 4q + i  holds  natural column 16q + 4j + i       (j < 4, q < 8, i < 4)
//
// and the stored columns are packed into nibbles as natural ones are. In general a block holds B
// chunks (B = 8, or 4 for I4): stored j*C + 4q + i holds natural 4B*q + 4j + i.
//
// The engine interleaves F16/BF16/I8 matrices, and I4 ones of W4A16 whose groups are multiples of
// 128 columns, after upload when the shape allows (gemv_interleave_cuda in gemv.h); the GEMV, the
// prefill GEMM's conversions and the embedding lookup read either order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace shardlm {

// Columns of one lane's 16-byte chunk: the C above (0 for types that are never interleaved).
__host__ __device__ constexpr int interleave_chunk_cols(DType t) {
    return t == DType::I8 ? 16 : (t == DType::F16 || t == DType::BF16) ? 8 : t == DType::I4 ? 32 : 0;
}

// Chunks per interleaved block (B above) and the block's columns, for chunk columns C.
__host__ __device__ constexpr int interleave_block_chunks(int C) { return C == 32 ? 4 : 8; }
__host__ __device__ constexpr int interleave_block_cols(int C) { return interleave_block_chunks(C) * C; }

// Where natural column c is stored (C = interleave_chunk_cols of the matrix).
__host__ __device__ inline int64_t interleaved_col(int64_t c, int C) {
    const int B = interleave_block_chunks(C);
    const int64_t block = c / (B * C), within = c % (B * C);
    const int64_t q = within / (4 * B), j = (within % (4 * B)) / 4, i = within % 4;
    return block * (B * C) + j * C + 4 * q + i;
}

// The inverse: which natural column stored column s holds (stored j*C + 4q + i holds natural
// 4B*q + 4j + i of its block).
__host__ __device__ inline int64_t natural_col(int64_t s, int C) {
    const int B = interleave_block_chunks(C);
    const int64_t block = s / (B * C), within = s % (B * C);
    const int64_t j = within / C, q = (within % C) / 4, i = within % 4;
    return block * (B * C) + 4 * B * q + 4 * j + i;
}

}  // namespace shardlm
