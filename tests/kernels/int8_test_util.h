// Helpers shared by the INT8/INT4 kernel tests: deterministic random data, quantized matrices and
// quantized activations.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/quantize.h"

namespace shardlm::test {

// Uniform-ish values in [-amp, amp], deterministic per seed.
inline std::vector<float> rand_vec(size_t n, uint32_t seed, float amp = 1.0f) {
    std::vector<float> v(n);
    uint32_t s = seed * 2654435761u + 12345u;
    for (auto& x : v) {
        s = s * 1664525u + 1013904223u;
        x = amp * float(int32_t(s >> 8) % 20001 - 10000) / 10000.0f;
    }
    return v;
}

// A weight matrix quantized to INT8, plus its f32 source.
struct QuantMat {
    std::vector<float> f32;
    std::vector<int8_t> q;
    std::vector<float> scales;
    int64_t rows = 0, cols = 0, group = 0;
    WeightView view() const { return int8_weight_view(q.data(), scales.data(), rows, cols, group); }
};

inline QuantMat make_quant_mat(int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
    QuantMat m;
    m.rows = rows;
    m.cols = cols;
    m.group = group;
    m.f32 = rand_vec(size_t(rows * cols), seed);
    m.q.resize(m.f32.size());
    m.scales.resize(size_t(rows * (cols / group)));
    WeightView src;
    src.dtype = DType::F32;
    src.data = m.f32.data();
    src.rows = rows;
    src.cols = cols;
    quantize_weights_int8(src, group, m.q.data(), m.scales.data());
    return m;
}

// A weight matrix quantized to INT4 (kernels/cpu/weights_view.h), plus its f32 source; every 7th
// value is shifted by 0.5 so that groups are skewed and zero points sit away from 8.
struct Int4Mat {
    std::vector<float> f32, scales, mins;
    std::vector<uint8_t> q;
    int64_t rows = 0, cols = 0, group = 0;
    WeightView view() const { return int4_weight_view(q.data(), scales.data(), mins.data(), rows, cols, group); }
};

inline Int4Mat make_int4(int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
    Int4Mat m;
    m.rows = rows, m.cols = cols, m.group = group;
    m.f32 = rand_vec(size_t(rows * cols), seed);
    for (size_t i = 0; i < m.f32.size(); i += 7) m.f32[i] += 0.5f;
    m.q.resize(size_t(rows * cols / 2));
    m.scales.resize(size_t(rows * (cols / group)));
    m.mins.resize(m.scales.size());
    WeightView src;
    src.data = m.f32.data();
    src.rows = rows;
    src.cols = cols;
    quantize_weights_int4(src, group, m.q.data(), m.scales.data(), m.mins.data());
    return m;
}

// Activations quantized to INT8 per token and group (quantize_acts_int8), plus their f32 source.
struct Acts {
    std::vector<float> f32, scales;
    std::vector<int8_t> q;
    QuantizedActs view;
};

inline Acts make_acts(int64_t n, int64_t cols, int64_t group, uint32_t seed) {
    Acts a;
    a.f32 = rand_vec(size_t(n * cols), seed, 2.0f);
    a.q.resize(a.f32.size());
    a.scales.resize(size_t(n * (cols / group)));
    quantize_acts_int8(a.f32.data(), n, cols, group, a.q.data(), a.scales.data());
    a.view = QuantizedActs{a.q.data(), a.scales.data(), n, cols, group};
    return a;
}

constexpr double kU = 1.0 / (1 << 24);  // unit roundoff of f32

}  // namespace shardlm::test
