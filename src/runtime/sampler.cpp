#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/topk.h"

namespace shardlm {

int32_t argmax(const float* logits, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (topk_before(logits[i], int32_t(i), logits[best], int32_t(best))) best = i;
    return int32_t(best);
}

int64_t sampler_candidates(const SamplerOptions& opt, int64_t vocab) {
    if (opt.temperature == 0.0f) return 1;
    return opt.top_k > 0 ? std::min(opt.top_k, vocab) : 0;
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
    auto ranked = [](const auto& a, const auto& b) { return topk_before(a.first, a.second, b.first, b.second); };
    const size_t keep = size_t(sampler_candidates(opt_, vocab));
    if (keep > 0 && keep < cand_.size()) {
        std::partial_sort(cand_.begin(), cand_.begin() + long(keep), cand_.end(), ranked);
        cand_.resize(keep);
    } else {
        std::sort(cand_.begin(), cand_.end(), ranked);
    }
    return draw();
}

int32_t Sampler::sample_top(const float* vals, const int32_t* ids, int64_t k) {
    SHARDLM_CHECK(k > 0, "sample_top: no candidates");
    if (opt_.temperature == 0.0f) return ids[0];
    SHARDLM_CHECK(opt_.top_k > 0, "sample_top: top-k sampling needs the whole row (--top-k 0)");
    cand_.resize(size_t(std::min(k, opt_.top_k)));
    for (size_t i = 0; i < cand_.size(); ++i) cand_[i] = {vals[i], ids[i]};
    return draw();
}

int32_t Sampler::draw() {
    const size_t keep = cand_.size();
    const double mx = cand_[0].first;
    p_.resize(keep);
    double sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += (p_[i] = std::exp((double(cand_[i].first) - mx) / opt_.temperature));
    // Nucleus: the smallest prefix whose probability mass reaches top_p.
    size_t n = keep;
    if (opt_.top_p < 1.0f) {
        double cum = 0;
        for (size_t i = 0; i < keep; ++i) {
            cum += p_[i] / sum;
            if (cum >= opt_.top_p) { n = i + 1; break; }
        }
    }
    double mass = 0;
    for (size_t i = 0; i < n; ++i) mass += p_[i];
    double r = uniform() * mass;
    for (size_t i = 0; i < n; ++i) {
        r -= p_[i];
        if (r < 0) return cand_[i].second;
    }
    return cand_[n - 1].second;
}

}  // namespace shardlm
