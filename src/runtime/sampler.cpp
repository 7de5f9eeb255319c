#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace shardlm {

int32_t argmax(const float* logits, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (logits[i] > logits[best]) best = i;
    return int32_t(best);
}

Sampler::Sampler(const SamplerOptions& opt, uint64_t stream)
    : opt_(opt), state_(opt.seed ^ (0x9e3779b97f4a7c15ull * (stream + 1))) {
    if (!(opt.temperature >= 0)) fail("--temperature must be >= 0");
    if (opt.top_k < 0) fail("--top-k must be >= 0");
    if (!(opt.top_p > 0 && opt.top_p <= 1)) fail("--top-p must be in (0, 1]");
}

double Sampler::uniform() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return double(z >> 11) * (1.0 / 9007199254740992.0);  // 53 random bits
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
    if (opt_.temperature == 0.0f) return argmax(logits, vocab);
    cand_.resize(size_t(vocab));
    for (int64_t i = 0; i < vocab; ++i) cand_[size_t(i)] = {logits[i], int32_t(i)};
    // Highest logits first, ties by lower id, so the order (and the draw) is deterministic.
    auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
    size_t keep = cand_.size();
    if (opt_.top_k > 0 && size_t(opt_.top_k) < keep) {
        keep = size_t(opt_.top_k);
        std::partial_sort(cand_.begin(), cand_.begin() + long(keep), cand_.end(), by_logit);
    } else {
        std::sort(cand_.begin(), cand_.end(), by_logit);
    }
    cand_.resize(keep);
    const double mx = cand_[0].first;
    std::vector<double> p(keep);
    double sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += (p[i] = std::exp((double(cand_[i].first) - mx) / opt_.temperature));
    // Nucleus: the smallest prefix whose probability mass reaches top_p.
    size_t n = keep;
    if (opt_.top_p < 1.0f) {
        double cum = 0;
        for (size_t i = 0; i < keep; ++i) {
            cum += p[i] / sum;
            if (cum >= opt_.top_p) { n = i + 1; break; }
        }
    }
    double mass = 0;
    for (size_t i = 0; i < n; ++i) mass += p[i];
    double r = uniform() * mass;
    for (size_t i = 0; i < n; ++i) {
        r -= p[i];
        if (r < 0) return cand_[i].second;
    }
    return cand_[n - 1].second;
}

}  // namespace shardlm
