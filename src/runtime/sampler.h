// Token choice from logits: greedy at temperature 0, else temperature, top-k, then top-p
// (nucleus) and a draw from a seeded generator. Each sequence owns its generator so a batch
// samples exactly what its sequences would sample alone.
#pragma once

#include <cstdint>
#include <vector>

namespace shardlm {

struct SamplerOptions {
    float temperature = 0.8f;
    int64_t top_k = 40;   // 0: no limit
    float top_p = 0.95f;  // 1: no limit
    uint64_t seed = 0;
};

// Index of the largest value; the lowest index among ties.
int32_t argmax(const float* logits, int64_t n);

class Sampler {
public:
    Sampler(const SamplerOptions& opt, uint64_t stream);  // stream: the sequence's index
    int32_t sample(const float* logits, int64_t vocab);

private:
    double uniform();  // [0, 1), from splitmix64: fully specified, same on every platform
    SamplerOptions opt_;
    uint64_t state_;
    std::vector<std::pair<float, int32_t>> cand_;
};

}  // namespace shardlm
