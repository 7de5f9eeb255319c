// Rotary position embedding, Hugging Face "rotate half" layout: within a head of size d the pairs
// are (i, i + d/2), rotated by angle pos * inv_freq[i]:
//   y[i]       = x[i] * cos - x[i + d/2] * sin
//   y[i + d/2] = x[i + d/2] * cos + x[i] * sin
#pragma once

#include <cstdint>
#include <vector>

namespace shardlm {

// How the inverse frequencies are rescaled for a longer context (HF's rope_type): Llama 3.1's
// bands of wavelength (llama3), all slowed by `factor` (linear), or YaRN's ramp between the
// original frequencies (short wavelengths, below beta_fast rotations over the original context)
// and those slowed by `factor` (long ones, beyond beta_slow rotations).
enum class RopeFreqs { Plain, Llama3, Linear, Yarn };

struct RopeParams {
    int64_t head_dim = 0;
    float theta = 10000.0f;
    RopeFreqs freqs = RopeFreqs::Plain;
    float factor = 1.0f, low_freq_factor = 1.0f, high_freq_factor = 4.0f;  // llama3 (factor: llama3, linear, yarn)
    int64_t original_max_position = 8192;                                // llama3, yarn
    float beta_fast = 32.0f, beta_slow = 1.0f;                           // yarn
    bool truncate = true;  // yarn: the ramp's ends rounded to whole dimensions (HF's default)
};

// inv_freq[i] = 1 / theta^(2i/d), i < d/2, rescaled as HF's _compute_llama3_parameters,
// _compute_linear_scaling_rope_parameters or _compute_yarn_parameters (with the factor as given,
// as vLLM's YaRN takes it).
std::vector<float> rope_inv_freq(const RopeParams& p);

// Rotates `n_heads` heads of one token (x is [n_heads, head_dim]) in place.
void rope_ref(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq);

}  // namespace shardlm
