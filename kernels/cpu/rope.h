// Rotary position embedding, Hugging Face "rotate half" layout: within a head of size d the pairs
// are (i, i + d/2), rotated by angle pos * inv_freq[i]:
//   y[i]       = x[i] * cos - x[i + d/2] * sin
//   y[i + d/2] = x[i + d/2] * cos + x[i] * sin
#pragma once

#include <cstdint>
#include <vector>

namespace shardlm {

struct RopeParams {
    int64_t head_dim = 0;
    float theta = 10000.0f;
    bool llama3 = false;  // Llama 3.1+ frequency rescaling by wavelength band
    float factor = 1.0f, low_freq_factor = 1.0f, high_freq_factor = 4.0f;
    int64_t original_max_position = 8192;
};

// inv_freq[i] = 1 / theta^(2i/d), i < d/2, rescaled for llama3 as HF's _compute_llama3_parameters.
std::vector<float> rope_inv_freq(const RopeParams& p);

// Rotates `n_heads` heads of one token (x is [n_heads, head_dim]) in place.
void rope_ref(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq);

}  // namespace shardlm
