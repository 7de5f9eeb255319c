// The KV cache's context shift (--context-overflow slide), plain reference: one (layer, slot)'s
// cache loses positions [keep, keep + discard), the positions after them move down by `discard`,
// and their keys turn back by `discard` positions. RoPE rotations compose (R(-d) R(p) = R(p - d),
// rope.h), so the moved keys are what RoPE at their new positions would have given, up to the
// rounding of one more rotation (and, for INT8, of one more quantization); values only move. The
// CUDA kernel (kernels/cuda/kv_shift.cu) is tested against this.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace shardlm {

// One (layer, slot) of a KV cache: K and V are [n_kv_heads][capacity][row_stride] elements of dtype
// (F32, F16, BF16 or I8), position p in row p; I8 rows have one f32 scale each, k_scales/v_scales
// [n_kv_heads][capacity] (quantize_row_int8's contract).
struct KVSlotView {
    void* k = nullptr;
    void* v = nullptr;
    float* k_scales = nullptr;
    float* v_scales = nullptr;
    DType dtype = DType::F32;
    int64_t n_kv_heads = 0, capacity = 0, row_stride = 0, head_dim = 0;
};

// Row `row` of head h in K (kv 0) or V (kv 1): head_dim values decoded to f32, or encoded from f32
// (INT8: quantized, its scale written). Only the head_dim values are touched, never the padding.
void kv_row_load(const KVSlotView& s, int kv, int64_t h, int64_t row, float* x);
void kv_row_store(const KVSlotView& s, int kv, int64_t h, int64_t row, const float* x);

// Positions [keep + discard, len) -> [keep, len - discard) in K and V (with their scales), the keys
// rotated by -discard positions (inv_freq [head_dim / 2], rope.h). Rows from len - discard on keep
// stale contents (never read: the sequence goes on at len - discard), and the padding of a moved
// key row is unspecified (never read either). Needs 0 <= keep, 0 < discard,
// keep + discard <= len <= capacity.
void kv_shift_ref(const KVSlotView& s, int64_t keep, int64_t discard, int64_t len, const float* inv_freq);

}  // namespace shardlm
