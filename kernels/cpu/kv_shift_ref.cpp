#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/kv_shift.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/rope.h"

namespace shardlm {

namespace {
uint8_t* row_ptr(const KVSlotView& s, int kv, int64_t h, int64_t row) {
    return static_cast<uint8_t*>(kv ? s.v : s.k) + size_t((h * s.capacity + row) * s.row_stride) * dtype_size(s.dtype);
}
}  // namespace

void kv_row_load(const KVSlotView& s, int kv, int64_t h, int64_t row, float* x) {
    const uint8_t* p = row_ptr(s, kv, h, row);
    switch (s.dtype) {
        case DType::F16:
            for (int64_t c = 0; c < s.head_dim; ++c) x[c] = f16_to_f32(reinterpret_cast<const uint16_t*>(p)[c]);
            break;
        case DType::BF16:
            for (int64_t c = 0; c < s.head_dim; ++c) x[c] = bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[c]);
            break;
        case DType::I8: {
            const float sc = (kv ? s.v_scales : s.k_scales)[h * s.capacity + row];
            for (int64_t c = 0; c < s.head_dim; ++c) x[c] = float(reinterpret_cast<const int8_t*>(p)[c]) * sc;
            break;
        }
        default: std::memcpy(x, p, size_t(s.head_dim) * sizeof(float)); break;
    }
}

void kv_row_store(const KVSlotView& s, int kv, int64_t h, int64_t row, const float* x) {
    uint8_t* p = row_ptr(s, kv, h, row);
    switch (s.dtype) {
        case DType::F16:
            for (int64_t c = 0; c < s.head_dim; ++c) reinterpret_cast<uint16_t*>(p)[c] = f32_to_f16(x[c]);
            break;
        case DType::BF16:
            for (int64_t c = 0; c < s.head_dim; ++c) reinterpret_cast<uint16_t*>(p)[c] = f32_to_bf16(x[c]);
            break;
        case DType::I8:
            (kv ? s.v_scales : s.k_scales)[h * s.capacity + row] =
                quantize_row_int8(x, s.head_dim, reinterpret_cast<int8_t*>(p));
            break;
        default: std::memcpy(p, x, size_t(s.head_dim) * sizeof(float)); break;
    }
}

void kv_shift_ref(const KVSlotView& s, int64_t keep, int64_t discard, int64_t len, const float* inv_freq) {
    SHARDLM_CHECK(keep >= 0 && discard > 0 && keep + discard <= len && len <= s.capacity, "KV shift: keep ", keep,
                  ", discard ", discard, " of ", len, " positions (capacity ", s.capacity, ")");
    const size_t es = dtype_size(s.dtype);
    const int64_t moved = len - keep - discard;
    std::vector<float> x(size_t(s.head_dim));
    for (int kv = 0; kv < 2; ++kv)
        for (int64_t h = 0; h < s.n_kv_heads; ++h) {
            // A head's rows are contiguous: one overlapping move (destination below source).
            std::memmove(row_ptr(s, kv, h, keep), row_ptr(s, kv, h, keep + discard), size_t(moved * s.row_stride) * es);
            if (float* sc = kv ? s.v_scales : s.k_scales)
                std::memmove(sc + h * s.capacity + keep, sc + h * s.capacity + keep + discard, size_t(moved) * sizeof(float));
            if (kv == 1) continue;
            for (int64_t r = keep; r < keep + moved; ++r) {
                kv_row_load(s, 0, h, r, x.data());
                rope_ref(x.data(), 1, s.head_dim, -discard, inv_freq);
                kv_row_store(s, 0, h, r, x.data());
            }
        }
}

}  // namespace shardlm
