// LoRA's update on the GPU, with each token row under its own adapter (vLLM's multi-LoRA
// serving; the CPU engine's kernels/cpu/lora.h, whose factor layout it reads):
//   y[i, 0:out] += (x[i] A_s^T) Bt_s   for every row i with s = row_adapter[i] >= 0,
// where slots[s] holds adapter s's factors of this matrix: A [rank, in] and Bt [rank, out] in
// kernels/cpu/lora.h's column tiles, F32 or BF16 (`factors`, one type for every adapter). Rows
// under the base model (s < 0) and slots of rank 0 (the adapter leaves the matrix alone) are not
// touched; y's rows are ldy floats apart, so the update can go into a part of a fused q|k|v or
// gate|up output.
//
// Up to kLoraMaxParts matrices of one input (q, k and v; gate and up) go in one call, as vLLM
// stacks their slices: two launches for all of them, where a decode step's launches cost more
// than its few hundred KB of factors take to read.
//
// Two kernels, Punica's shrink and expand (its BGMV: one launch for every adapter of the step, the
// adapter read per row, so a captured decode graph replays whatever adapters its rows run under):
//   shrink: t[part, i, k] = x[i] . A_s[k], one block per (row, k, part) for k < rank_s, its
//           threads splitting the `in` terms (16-byte loads where in is a multiple of 8: then every
//           slot's A must start 16-byte aligned, as cudaMalloc and the engine's slots place it);
//   expand: y[i, o] += sum over k < rank_s of t[part, i, k] Bt_s[k, o], one thread per (part, row,
//           o), in k's order from y's value (the CPU reference's order; only the dot products of
//           the shrink are summed in another one).
// t is [kLoraMaxParts, T, max_rank] f32 scratch, max_rank >= every slot's rank. As on the CPU the
// work is reading A and Bt: each row reads them (from L2 after the first row of an adapter).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace shardlm {

// One adapter's factors of one matrix, in device memory.
struct LoraSlot {
    const void* a = nullptr;
    const void* bt = nullptr;
    int32_t rank = 0;
};

constexpr int kLoraMaxParts = 3;

// One matrix of a call: its adapters' slots (device memory, indexed by row_adapter's values) and
// where its update goes.
struct LoraPart {
    const LoraSlot* slots = nullptr;
    float* y = nullptr;
    int64_t out = 0, ldy = 0;
};

// The parts of one call, by value (kernel arguments).
struct LoraParts {
    LoraPart p[kLoraMaxParts];
    int n = 0;
};

// x [T, in]; row_adapter [T] is device memory (values < 0: the base model).
void lora_add_cuda(const float* x, int64_t T, int64_t in, const LoraParts& parts, const int32_t* row_adapter,
                   DType factors, int64_t max_rank, float* t, cudaStream_t stream);

}  // namespace shardlm
