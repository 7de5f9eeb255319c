#include <cmath>
#include <vector>

#include "kernels/cpu/attention.h"

namespace shardlm {

void attention_ref(const float* q, const float* k, const float* v, float* out, int64_t n_q, int64_t n_k,
                   int64_t n_heads, int64_t n_kv_heads, int64_t d, int64_t q_pos0, float scale, int64_t window) {
    (void)n_k;
    const int64_t group = n_heads / n_kv_heads;
    std::vector<double> p;
    for (int64_t i = 0; i < n_q; ++i) {
        const int64_t last = q_pos0 + i, lo = window_start(last, window);  // keys lo..last
        for (int64_t h = 0; h < n_heads; ++h) {
            const int64_t kh = h / group;
            const float* qi = q + (i * n_heads + h) * d;
            p.assign(size_t(last + 1), 0.0);
            double mx = -INFINITY;
            for (int64_t j = lo; j <= last; ++j) {
                double s = 0;
                for (int64_t c = 0; c < d; ++c) s += double(qi[c]) * k[(j * n_kv_heads + kh) * d + c];
                p[size_t(j)] = s * scale;
                mx = std::max(mx, p[size_t(j)]);
            }
            double sum = 0;
            for (int64_t j = lo; j <= last; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
            float* o = out + (i * n_heads + h) * d;
            for (int64_t c = 0; c < d; ++c) {
                double acc = 0;
                for (int64_t j = lo; j <= last; ++j) acc += p[size_t(j)] * v[(j * n_kv_heads + kh) * d + c];
                o[c] = float(acc / sum);
            }
        }
    }
}

}  // namespace shardlm
