#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"

namespace shardlm {

namespace {
inline uint16_t half_at(const uint8_t* p, int64_t i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    return h;
}
}  // namespace

void values_to_f32(DType dtype, const void* src, int64_t n, float* out) {
    switch (dtype) {
        case DType::F32: std::memcpy(out, src, size_t(n) * 4); return;
        case DType::F16: {
            const uint8_t* p = static_cast<const uint8_t*>(src);  // a mapped tensor may be only byte-aligned
            int64_t i = 0;
#if defined(SHARDLM_HAVE_AVX2)
            if (cpu_isa_resolve(CpuIsa::Auto) != CpuIsa::Scalar) i = f16_to_f32_avx2(p, n, out);
#endif
            for (; i < n; ++i) out[i] = f16_to_f32(half_at(p, i));
            return;
        }
        case DType::BF16: {
            const uint8_t* p = static_cast<const uint8_t*>(src);
            for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(half_at(p, i));
            return;
        }
        default: SHARDLM_CHECK(false, "values_to_f32: ", dtype_name(dtype), " is not a float type");
    }
}

void check_weight_view(const WeightView& w) {
    SHARDLM_CHECK(w.rows >= 0 && w.cols >= 0 && (w.data || w.rows * w.cols == 0), "empty weight view");
    if (w.dtype == DType::I8) {
        SHARDLM_CHECK(w.scales || w.rows * w.cols == 0, "I8 weights need scales");
        SHARDLM_CHECK(w.group_size > 0 && w.cols % w.group_size == 0, "I8 group size ", w.group_size,
                      " must divide cols ", w.cols);
    } else if (w.dtype == DType::I4) {
        SHARDLM_CHECK((w.scales && w.mins) || w.rows * w.cols == 0, "I4 weights need scales and mins");
        SHARDLM_CHECK(w.group_size > 0 && w.group_size % 32 == 0 && w.cols % w.group_size == 0, "I4 group size ",
                      w.group_size, " must be a multiple of 32 that divides cols ", w.cols);
    } else {
        SHARDLM_CHECK(w.dtype == DType::F32 || w.dtype == DType::F16 || w.dtype == DType::BF16,
                      "matmul weights must be f32/f16/bf16/i8/i4, not ", dtype_name(w.dtype));
    }
}

void weight_row_to_f32(const WeightView& w, int64_t r, float* out) {
    const int64_t c = w.cols;
    switch (w.dtype) {
        case DType::F32:
        case DType::F16:
        case DType::BF16:
            values_to_f32(w.dtype, static_cast<const uint8_t*>(w.data) + size_t(r * c) * dtype_size(w.dtype), c, out);
            return;
        case DType::I8: {
            const int8_t* p = static_cast<const int8_t*>(w.data) + r * c;
            const float* s = w.scales + r * w.n_groups();
            for (int64_t i = 0; i < c; ++i) out[i] = float(p[i]) * s[i / w.group_size];
            return;
        }
        case DType::I4: {
            const uint8_t* p = static_cast<const uint8_t*>(w.data) + r * (c / 2);
            const float* s = w.scales + r * w.n_groups();
            const float* m = w.mins + r * w.n_groups();
            for (int64_t i = 0; i < c; ++i) {
                const int q = (p[int4_byte(i)] >> int4_shift(i)) & 15;
                out[i] = float(q) * s[i / w.group_size] + m[i / w.group_size];
            }
            return;
        }
        default:
            break;
    }
}

void matmul_ref(const float* x, int64_t n, const WeightView& w, const float* bias, float* y) {
    check_weight_view(w);
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

void matmul_w8a8_ref(const QuantizedActs& a, const WeightView& w, const float* bias, float* y) {
    check_weight_view(w);
    SHARDLM_CHECK(w.dtype == DType::I8 && a.cols == w.cols, "w8a8: I8 weights with cols == activation cols");
    const int64_t ga = a.group_size, gw = w.group_size;
    SHARDLM_CHECK(ga > 0 && a.cols % ga == 0 && (ga % gw == 0 || gw % ga == 0),
                  "w8a8: activation group ", ga, " and weight group ", gw, " must divide one another");
    const int64_t g = std::min(ga, gw), cols = w.cols;
    const int8_t* wq = static_cast<const int8_t*>(w.data);
    for (int64_t t = 0; t < a.n; ++t) {
        for (int64_t r = 0; r < w.rows; ++r) {
            double acc = 0;
            for (int64_t k0 = 0; k0 < cols; k0 += g) {
                int64_t dot = 0;  // exact
                for (int64_t k = k0; k < k0 + g; ++k) dot += int64_t(a.q[t * cols + k]) * wq[r * cols + k];
                acc += double(dot) * a.scales[t * (cols / ga) + k0 / ga] * w.scales[r * (cols / gw) + k0 / gw];
            }
            y[t * w.rows + r] = float(acc) + (bias ? bias[r] : 0.0f);
        }
    }
}

void matmul_w4a8_ref(const QuantizedActs& a, const WeightView& w, const float* bias, float* y) {
    check_weight_view(w);
    SHARDLM_CHECK(w.dtype == DType::I4 && a.cols == w.cols, "w4a8: I4 weights with cols == activation cols");
    const int64_t ga = a.group_size, gw = w.group_size, cols = w.cols;
    SHARDLM_CHECK(ga > 0 && cols % ga == 0 && (ga % gw == 0 || gw % ga == 0) && std::min(ga, gw) % 32 == 0,
                  "w4a8: activation group ", ga, " and weight group ", gw,
                  " must divide one another, the smaller a multiple of 32");
    // The plain definition: the dequantized weights times the dequantized activations, in double.
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < w.rows; ++r) {
        weight_row_to_f32(w, r, row.data());
        for (int64_t t = 0; t < a.n; ++t) {
            double acc = 0;
            for (int64_t k = 0; k < cols; ++k)
                acc += double(row[size_t(k)]) * (double(a.q[t * cols + k]) * a.scales[t * (cols / ga) + k / ga]);
            y[t * w.rows + r] = float(acc) + (bias ? bias[r] : 0.0f);
        }
    }
}

}  // namespace shardlm
