#include <cmath>
#include <vector>

#include "kernels/cpu/attention.h"

namespace shardlm {
namespace {

// One cache row (head_dim values) as f32.
inline void load_row(const void* base, DType dt, int64_t offset, int64_t d, float* out) {
    switch (dt) {
        case DType::F16: {
            const uint16_t* p = static_cast<const uint16_t*>(base) + offset;
            for (int64_t c = 0; c < d; ++c) out[c] = f16_to_f32(p[c]);
            return;
        }
        case DType::BF16: {
            const uint16_t* p = static_cast<const uint16_t*>(base) + offset;
            for (int64_t c = 0; c < d; ++c) out[c] = bf16_to_f32(p[c]);
            return;
        }
        default: {
            const float* p = static_cast<const float*>(base) + offset;
            for (int64_t c = 0; c < d; ++c) out[c] = p[c];
            return;
        }
    }
}

}  // namespace

void attention_cached(const CachedAttention& a) {
    const int64_t d = a.head_dim;
    const int64_t group = a.n_heads / a.n_kv_heads;
    const int64_t work = a.n_q * a.n_heads;
    const int64_t max_keys = a.q_pos0 + a.n_q;
#pragma omp parallel
    {
        std::vector<float> scores(static_cast<size_t>(max_keys)), row(static_cast<size_t>(d)), acc(static_cast<size_t>(d));
#pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < work; ++w) {
            const int64_t i = w / a.n_heads, h = w % a.n_heads, kh = h / group;
            const int64_t last = a.q_pos0 + i;
            const float* qi = a.q + (i * a.n_heads + h) * d;
            const int64_t head_base = kh * a.capacity * a.row_stride;
            float mx = -INFINITY;
            for (int64_t j = 0; j <= last; ++j) {
                load_row(a.k, a.kv_dtype, head_base + (j % a.capacity) * a.row_stride, d, row.data());
                float s = 0;
#pragma omp simd reduction(+ : s)
                for (int64_t c = 0; c < d; ++c) s += qi[c] * row[size_t(c)];
                s *= a.scale;
                scores[size_t(j)] = s;
                mx = std::max(mx, s);
            }
            float sum = 0;
            for (int64_t j = 0; j <= last; ++j) sum += (scores[size_t(j)] = std::exp(scores[size_t(j)] - mx));
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t j = 0; j <= last; ++j) {
                load_row(a.v, a.kv_dtype, head_base + (j % a.capacity) * a.row_stride, d, row.data());
                const float p = scores[size_t(j)];
#pragma omp simd
                for (int64_t c = 0; c < d; ++c) acc[size_t(c)] += p * row[size_t(c)];
            }
            float* o = a.out + (i * a.n_heads + h) * d;
            const float inv = 1.0f / sum;
            for (int64_t c = 0; c < d; ++c) o[c] = acc[size_t(c)] * inv;
        }
    }
}

}  // namespace shardlm
