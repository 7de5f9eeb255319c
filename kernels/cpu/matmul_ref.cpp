#include "kernels/cpu/matmul.h"

#include <cstring>
#include <vector>

namespace shardlm {

void weight_row_to_f32(const WeightView& w, int64_t r, float* out) {
    const int64_t c = w.cols;
    switch (w.dtype) {
        case DType::F32:
            std::memcpy(out, static_cast<const float*>(w.data) + r * c, size_t(c) * 4);
            return;
        case DType::F16: {
            const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * c;
            for (int64_t i = 0; i < c; ++i) out[i] = f16_to_f32(p[i]);
            return;
        }
        case DType::BF16: {
            const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * c;
            for (int64_t i = 0; i < c; ++i) out[i] = bf16_to_f32(p[i]);
            return;
        }
        default:
            break;
    }
}

void matmul_ref(const float* x, int64_t n, const WeightView& w, const float* bias, float* y) {
    std::vector<float> row(static_cast<size_t>(w.cols));
    for (int64_t r = 0; r < w.rows; ++r) {
        weight_row_to_f32(w, r, row.data());
        for (int64_t t = 0; t < n; ++t) {
            double acc = 0;  // double: the reference should not have its own rounding story
            for (int64_t i = 0; i < w.cols; ++i) acc += double(x[t * w.cols + i]) * row[i];
            y[t * w.rows + r] = float(acc) + (bias ? bias[r] : 0.0f);
        }
    }
}

}  // namespace shardlm
