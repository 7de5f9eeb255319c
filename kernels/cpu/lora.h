// LoRA's low-rank update of a Linear layer's output, for adapters kept beside the weights and
// chosen per sequence (model/lora_weights.h):
//   y [n, out] += (x [n, in] A^T) Bt     A [rank, in], Bt [rank, out] (B transposed, scaled)
// t [n, rank] is the caller's scratch (it receives x A^T). Two thin products: the rank is far
// below in and out, so the work is reading A and Bt once per call, and the matmul kernels (built
// for long rows of one matrix) would spend it on rows of `rank` elements.
//
// Bt is kept in column tiles (lora_bt_index): tile j holds columns [64j, 64j + 64) of every one of
// its rank rows, row after row (the last tile as wide as the columns left), so `y += t Bt` reads
// each tile as one stream; over rank rows of [rank, out] it walked rank streams a few cache lines
// at a time. With out <= 64 the tiles are the plain [rank, out].
//
// The factors are F32, or BF16 (half the bytes a decode step reads; widened to f32 as they are
// loaded, the sums in f32). lora_add_ref is the plain truth; lora_add threads over A's rows and
// then over Bt's column tiles (vectorised, the AVX-512 build picked at run time), each y
// element summed over k in the reference's order: only x A^T's dot products are summed in another
// order.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/cpu_isa.h"

namespace shardlm {

constexpr int64_t kLoraTile = 64;

// Where Bt's element (k, o) lies in its column tiles. (constexpr: the GPU's kernel,
// kernels/cuda/lora.h, reads the same layout.)
constexpr int64_t lora_bt_index(int64_t k, int64_t o, int64_t rank, int64_t out) {
    const int64_t o0 = o / kLoraTile * kLoraTile, w = out - o0 < kLoraTile ? out - o0 : kLoraTile;
    return rank * o0 + k * w + (o - o0);
}

// a [rank, in] and bt (column tiles) hold `factors` (DType::F32 or DType::BF16) values.
void lora_add_ref(const float* x, int64_t n, int64_t in, const void* a, const void* bt, DType factors, int64_t rank,
                  int64_t out, float* t, float* y);
void lora_add(const float* x, int64_t n, int64_t in, const void* a, const void* bt, DType factors, int64_t rank,
              int64_t out, float* t, float* y, CpuIsa isa = CpuIsa::Auto);

// One product of a lora_add_jobs call: y [n, out] (rows ldy apart) += (x [n, in] A^T) Bt.
struct LoraJob {
    const float* x = nullptr;
    int64_t n = 0, in = 0;
    const void* a = nullptr;
    const void* bt = nullptr;
    int64_t rank = 0, out = 0;
    float* y = nullptr;
    int64_t ldy = 0;
};
// lora_add for several products in one threaded pass: every job's x A^T, one barrier, then every
// job's y += t Bt, each job's elements summed as lora_add sums them. A decode step's LoRA work is
// a few hundred small products; one call per layer input (q/k/v or gate/up of every adapter run
// of the step) forks once where one call per product forked for each. t: scratch of the jobs'
// sum of n * rank floats. (lora_add is the call of one job.)
void lora_add_jobs(const LoraJob* jobs, int64_t n_jobs, DType factors, float* t, CpuIsa isa = CpuIsa::Auto);

}  // namespace shardlm
