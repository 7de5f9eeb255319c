#include <algorithm>
#include <cmath>

#include "kernels/cpu/rope.h"

namespace shardlm {

std::vector<float> rope_inv_freq(const RopeParams& p) {
    const int64_t half = p.head_dim / 2;
    std::vector<float> f(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
        f[size_t(i)] = float(1.0 / std::pow(double(p.theta), double(2 * i) / double(p.head_dim)));
    if (p.freqs == RopeFreqs::Plain) return f;
    if (p.freqs == RopeFreqs::Linear) {
        for (auto& v : f) v = float(double(v) / p.factor);
        return f;
    }
    if (p.freqs == RopeFreqs::Yarn) {
        // The dimension whose wavelength turns `rotations` times over the original context.
        const double d = double(p.head_dim), ctx = double(p.original_max_position);
        auto dim_of = [&](double rotations) {
            return d * std::log(ctx / (rotations * 2.0 * M_PI)) / (2.0 * std::log(double(p.theta)));
        };
        double low = dim_of(p.beta_fast), high = dim_of(p.beta_slow);
        if (p.truncate) {
            low = std::floor(low);
            high = std::ceil(high);
        }
        low = std::max(low, 0.0);
        high = std::min(high, d - 1.0);
        if (low == high) high += 0.001;
        for (int64_t i = 0; i < half; ++i) {
            // ramp 0: the original frequency (extrapolated), 1: slowed by factor (interpolated).
            const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
            const double v = f[size_t(i)];
            f[size_t(i)] = float(v / p.factor * ramp + v * (1.0 - ramp));
        }
        return f;
    }
    // Long wavelengths (beyond the original context / low_freq_factor) are slowed by `factor`,
    // short ones (below ... / high_freq_factor) kept, the band between interpolated smoothly.
    const double old_ctx = double(p.original_max_position);
    const double low_wavelen = old_ctx / p.low_freq_factor;
    const double high_wavelen = old_ctx / p.high_freq_factor;
    for (auto& v : f) {
        const double wavelen = 2.0 * M_PI / v;
        if (wavelen > low_wavelen) {
            v = float(v / p.factor);
        } else if (wavelen >= high_wavelen) {
            const double smooth = (old_ctx / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
            v = float((1.0 - smooth) * v / p.factor + smooth * v);
        }
    }
    return f;
}

void rope_ref(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq) {
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
        // HF forms the angle in FP32 (position * inv_freq) and then takes cos/sin of it.
        const float angle = float(pos) * inv_freq[i];
        const float c = float(std::cos(double(angle))), s = float(std::sin(double(angle)));
        for (int64_t h = 0; h < n_heads; ++h) {
            float* xh = x + h * head_dim;
            const float a = xh[i], b = xh[i + half];
            xh[i] = a * c - b * s;
            xh[i + half] = b * c + a * s;
        }
    }
}

}  // namespace shardlm
