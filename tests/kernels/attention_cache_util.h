// A CPU KV-cache block filled for the attention tests, shared by the INT8 and flash suites.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "kernels/cpu/quantize.h"

namespace shardlm::test {

// A cache [n_kv][cap][stride] of one dtype holding k/v [n_k][n_kv][d] (position j in slot j % cap,
// later positions overwriting earlier ones), and what position j reads back from its slot, in
// attention_ref's contiguous layout.
struct Cache {
    Buffer k, v;
    std::vector<float> k_scales, v_scales, k_back, v_back;
};

inline Cache fill_cache(DType dt, const std::vector<float>& k, const std::vector<float>& v, int64_t n_k, int64_t n_kv,
                 int64_t d, int64_t cap, int64_t stride) {
    Cache c;
    const size_t es = dtype_size(dt);
    c.k = Buffer(size_t(n_kv * cap * stride) * es);
    c.v = Buffer(size_t(n_kv * cap * stride) * es);
    c.k_scales.assign(size_t(n_kv * cap), 0.0f);
    c.v_scales.assign(size_t(n_kv * cap), 0.0f);
    c.k_back.resize(k.size());
    c.v_back.resize(v.size());
    for (int kv = 0; kv < 2; ++kv) {
        uint8_t* base = (kv ? c.v : c.k).data();
        std::fill(base, base + size_t(n_kv * cap * stride) * es, uint8_t(0xff));  // NaN in f32/f16/bf16 padding
        float* scales = (kv ? c.v_scales : c.k_scales).data();
        std::vector<float> held(size_t(n_kv * cap * d));  // slot contents as floats
        for (int64_t j = 0; j < n_k; ++j)
            for (int64_t h = 0; h < n_kv; ++h) {
                const float* x = (kv ? v : k).data() + (j * n_kv + h) * d;
                const size_t row = size_t((h * cap + j % cap) * stride);
                float* back = held.data() + (h * cap + j % cap) * d;
                if (dt == DType::I8) {
                    int8_t* q = reinterpret_cast<int8_t*>(base) + row;
                    const float s = scales[h * cap + j % cap] = quantize_row_int8(x, d, q);
                    for (int64_t e = 0; e < d; ++e) back[e] = float(q[e]) * s;
                    continue;
                }
                for (int64_t e = 0; e < d; ++e) {
                    const size_t o = row + size_t(e);
                    if (dt == DType::F32) reinterpret_cast<float*>(base)[o] = back[e] = x[e];
                    else if (dt == DType::F16) back[e] = f16_to_f32(reinterpret_cast<uint16_t*>(base)[o] = f32_to_f16(x[e]));
                    else back[e] = bf16_to_f32(reinterpret_cast<uint16_t*>(base)[o] = f32_to_bf16(x[e]));
                }
            }
        std::vector<float>& back = kv ? c.v_back : c.k_back;
        for (int64_t j = 0; j < n_k; ++j)
            for (int64_t h = 0; h < n_kv; ++h)
                std::copy_n(held.data() + (h * cap + j % cap) * d, d, back.data() + (j * n_kv + h) * d);
    }
    return c;
}

}  // namespace shardlm::test
