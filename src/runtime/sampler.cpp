#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/nucleus.h"
#include "kernels/cpu/topk.h"

namespace shardlm {

int32_t argmax(const float* logits, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (topk_before(logits[i], int32_t(i), logits[best], int32_t(best))) best = i;
    return int32_t(best);
}

namespace {

// nucleus_weight over a row into w (by id), returning the sum. Built twice (GCC target_clones,
// picked at load time by the CPU's features): with FMA instructions, where each fma is one
// instruction instead of a libm call (3.5 -> 0.8 ms per Qwen row), and for any x86-64; the same
// bits either way, since an fma rounds once.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("fma", "default")))
#endif
uint64_t nucleus_weights(const float* logits, int64_t n, float mx, float temperature, uint64_t* w) {
    uint64_t total = 0;
    for (int64_t i = 0; i < n; ++i) total += (w[i] = nucleus_weight(logits[i], mx, temperature));
    return total;
}

// The sampler's ranking as a function object, so that the sorts inline it.
struct Ranked {
    bool operator()(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) const {
        return topk_before(a.first, a.second, b.first, b.second);
    }
};
constexpr Ranked ranked{};

// A logit's place in the ranking as an unsigned key, larger first: the float's bits in an order
// that integer comparison keeps (sign flipped for numbers >= 0, all bits for negative ones); -0
// counts as +0 (they tie, as topk_before says) and NaN ranks below -inf.
uint32_t rank_key(float x) {
    if (std::isnan(x)) return 0;
    if (x == 0.0f) x = 0.0f;
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace

int64_t sampler_candidates(const SamplerOptions& opt, int64_t vocab) {
    if (opt.temperature == 0.0f) return 1;
    return opt.top_k > 0 ? std::min(opt.top_k, vocab) : 0;
}

bool penalties_enabled(const SamplerOptions& opt) {
    return opt.penalty_last_n != 0 &&
           (opt.repetition_penalty != 1.0f || opt.presence_penalty != 0.0f || opt.frequency_penalty != 0.0f);
}

Sampler::Sampler(const SamplerOptions& opt, uint64_t stream)
    : opt_(opt), state_(opt.seed ^ (0x9e3779b97f4a7c15ull * (stream + 1))) {
    if (!(opt.temperature >= 0) || std::isinf(opt.temperature)) fail("--temperature must be a finite number >= 0");
    if (opt.top_k < 0) fail("--top-k must be >= 0");
    if (!(opt.top_p > 0 && opt.top_p <= 1)) fail("--top-p must be in (0, 1]");
    if (!(opt.min_p >= 0 && opt.min_p <= 1)) fail("--min-p must be in [0, 1]");
    if (!(opt.repetition_penalty > 0) || std::isinf(opt.repetition_penalty))
        fail("--repetition-penalty must be a finite number > 0");
    if (!std::isfinite(opt.presence_penalty)) fail("--presence-penalty must be a finite number");
    if (!std::isfinite(opt.frequency_penalty)) fail("--frequency-penalty must be a finite number");
    if (opt.penalty_last_n < -1) fail("--penalty-last-n must be >= -1");
    std::vector<int32_t> ids;
    for (const auto& [id, bias] : opt.logit_bias) {
        if (id < 0) fail("--logit-bias: token id ", id, " is negative");
        if (!(bias >= -100.0f && bias <= 100.0f)) fail("--logit-bias: the bias of token ", id, " must be in [-100, 100]");
        ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    const auto dup = std::adjacent_find(ids.begin(), ids.end());
    if (dup != ids.end()) fail("--logit-bias: token ", *dup, " is biased twice");
}

// min-p on fixed-point weights (kernels/cpu/nucleus.h: the row's maximum weighs exactly
// 2^kNucleusBits): whether a candidate of weight q stays.
static bool min_p_keeps(uint64_t q, float min_p) { return double(q) >= double(min_p) * 0x1p45; }
static_assert(kNucleusBits == 45, "min_p_keeps's threshold is min_p times the maximum's weight");

double Sampler::uniform() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return double(z >> 11) * (1.0 / 9007199254740992.0);  // 53 random bits
}

// The unnormalised probability of a logit: exp((x - mx) / T) in double; 0 for NaN, so a NaN
// logit is never drawn over a number.
double Sampler::weight(float x, double mx) const {
    const double w = std::exp((double(x) - mx) / opt_.temperature);
    return std::isnan(w) ? 0.0 : w;
}

TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t id, int64_t n_top) {
    SHARDLM_CHECK(id >= 0 && id < vocab && n_top >= 0 && n_top <= vocab, "token_logprobs: id ", id, ", top ", n_top,
                  " of ", vocab);
    // log(sum exp(x)) around the largest number, in double: a 152k-entry sum in float would lose
    // the small terms.
    double mx = -INFINITY;
    for (int64_t i = 0; i < vocab; ++i)
        if (!std::isnan(logits[i])) mx = std::max(mx, double(logits[i]));
    double sum = 0;
    if (std::isfinite(mx))
        for (int64_t i = 0; i < vocab; ++i)
            if (!std::isnan(logits[i])) sum += std::exp(double(logits[i]) - mx);
    const double lse = mx + std::log(sum);
    auto lp = [&](int32_t i) {
        const float x = logits[i];
        return std::isnan(x) || !std::isfinite(lse) ? -INFINITY : float(double(x) - lse);
    };
    TokenLogprobs r;
    r.token = {id, lp(id)};
    for (int64_t i = 0; i < vocab; ++i) r.rank += topk_before(logits[i], int32_t(i), logits[id], id);
    if (n_top > 0) {
        std::vector<float> vals(static_cast<size_t>(n_top));
        std::vector<int32_t> ids(static_cast<size_t>(n_top));
        topk_ref(logits, vocab, n_top, vals.data(), ids.data());
        for (const int32_t i : ids) r.top.push_back({i, lp(i)});
    }
    return r;
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
    if (opt_.temperature == 0.0f) return argmax(logits, vocab);
    const size_t keep = size_t(sampler_candidates(opt_, vocab));
    if (keep == 0 && opt_.top_p >= 1.0f) return draw_all(logits, vocab);
    if (keep == 0) return draw_nucleus_row(logits, vocab);
    cand_.resize(size_t(vocab));
    for (int64_t i = 0; i < vocab; ++i) cand_[size_t(i)] = {logits[i], int32_t(i)};
    if (keep < cand_.size()) {
        std::partial_sort(cand_.begin(), cand_.begin() + long(keep), cand_.end(), ranked);
        cand_.resize(keep);
    } else {
        std::sort(cand_.begin(), cand_.end(), ranked);
    }
    return draw();
}

template <typename Weight>
int32_t Sampler::draw_fixed(size_t n, Weight w) {
    uint64_t mass = 0;
    for (size_t i = 0; i < n; ++i) mass += w(i);
    double r = uniform() * double(mass);
    for (size_t i = 0; i < n; ++i) {
        r -= double(w(i));
        if (r < 0) return cand_[i].second;
    }
    return cand_[n - 1].second;
}

// No filter at all: draw in id order, nothing ranked (the same distribution as a ranked walk).
int32_t Sampler::draw_all(const float* logits, int64_t vocab) {
    const int32_t top = argmax(logits, vocab);
    const double mx = logits[top];
    p_.resize(size_t(vocab));  // weights by id
    double sum = 0;
    // min-p: weights are relative to the maximum's (1), so the cut is a comparison with min_p.
    for (int64_t i = 0; i < vocab; ++i) {
        const double w = weight(logits[i], mx);
        sum += (p_[size_t(i)] = w < opt_.min_p ? 0.0 : w);
    }
    if (!(sum > 0) || !std::isfinite(sum)) return top;  // +-inf or all-NaN rows: the ranking's first
    double r = uniform() * sum;
    int32_t last = top;
    for (int64_t i = 0; i < vocab; ++i) {
        if (p_[size_t(i)] == 0) continue;
        last = int32_t(i);
        r -= p_[size_t(i)];
        if (r < 0) return last;
    }
    return last;
}

// Top-p without a top-k limit: the nucleus needs the mass of the whole row but only the ranking of
// its own members. Its boundary is found by a radix select on the ranking keys that sums weights
// instead of counting: three passes over the row (11, 11 and 10 bits of the key, the later ones
// only over the keys that share the chosen prefix) find the key k* at which the ranked cumulative
// weight first reaches top_p of the total; the nucleus is every logit above k* and the first ones
// at k* in id order (ties), and only those are sorted. O(V + n log n) for a nucleus of n, with no
// pass that depends on n: ranking growing prefixes instead cost a sort of the whole row once the
// nucleus passed 16k tokens (22 ms for a flat Qwen row). The weights are kernels/cpu/nucleus.h's
// fixed-point integers, which an engine can sum on the GPU: sample_nucleus() then draws the same
// from the row's candidates, walking the same ranked prefix.
int32_t Sampler::draw_nucleus_row(const float* logits, int64_t vocab) {
    SHARDLM_CHECK(vocab <= kNucleusMaxRow, "top-p sampling without top-k: a row of ", vocab, " logits is too long");
    const int32_t top = argmax(logits, vocab);
    const float mx = logits[top];
    q_.resize(size_t(vocab));  // fixed-point weights by id
    const uint64_t total = nucleus_weights(logits, vocab, mx, opt_.temperature, q_.data());
    if (total == 0) return top;  // a +inf or all-NaN row
    keys_.resize(size_t(vocab));
    for (int64_t i = 0; i < vocab; ++i) keys_[size_t(i)] = rank_key(logits[i]);
    // reached(c): whether a ranked prefix of weight c completes the nucleus; monotone in c.
    const auto reached = [&](uint64_t c) { return nucleus_reached(c, total, opt_.top_p); };
    uint32_t prefix = 0, mask = 0;
    uint64_t above = 0;  // the weight of every key above the prefix's bucket
    for (const int shift : {21, 10, 0}) {
        const uint32_t digits = shift == 0 ? 1024u : 2048u;
        hist_.assign(digits, 0);
        for (int64_t i = 0; i < vocab; ++i) {
            const uint32_t k = keys_[size_t(i)];
            if ((k & mask) == prefix) hist_[(k >> shift) & (digits - 1)] += q_[size_t(i)];
        }
        // The highest digit whose bucket completes the nucleus (one does: the whole row does).
        uint32_t d = digits - 1;
        while (!reached(above + hist_[d])) above += hist_[d--];
        prefix |= d << shift;
        mask |= (digits - 1) << shift;
    }
    // Every logit at key `prefix` has the same weight w > 0 (else a higher key would have completed
    // the nucleus); the first `ties` of them in id order complete it.
    const uint64_t w = q_[size_t(std::find(keys_.begin(), keys_.end(), prefix) - keys_.begin())];
    size_t ties = 1;
    while (!reached(above + ties * w)) ++ties;
    cand_.clear();
    for (int64_t i = 0; i < vocab; ++i) {
        const uint32_t k = keys_[size_t(i)];
        if (k == prefix && ties > 0) --ties;
        else if (k <= prefix) continue;
        cand_.push_back({logits[i], int32_t(i)});
    }
    std::sort(cand_.begin(), cand_.end(), ranked);
    size_t n = 1;  // min-p: the ranked prefix that stays (the first always does: it weighs the most)
    while (n < cand_.size() && min_p_keeps(q_[size_t(cand_[n].second)], opt_.min_p)) ++n;
    return draw_fixed(n, [&](size_t i) { return q_[size_t(cand_[i].second)]; });
}

int32_t Sampler::sample_nucleus(const float* vals, const int32_t* ids, int64_t k, uint64_t total) {
    SHARDLM_CHECK(k > 0 && opt_.temperature > 0.0f && opt_.top_k == 0 && opt_.top_p < 1.0f,
                  "sample_nucleus: for top-p sampling without a top-k limit, from at least one candidate");
    if (total == 0) return ids[0];
    cand_.resize(size_t(k));
    q_.resize(size_t(k));  // fixed-point weights by rank here
    uint64_t cum = 0;
    for (size_t i = 0; i < cand_.size(); ++i) {
        cand_[i] = {vals[i], ids[i]};
        cum += (q_[i] = nucleus_weight(vals[i], vals[0], opt_.temperature));
        // Weights fall along the ranking, so the first candidate min-p drops ends the draw's range
        // wherever the nucleus would end, as in draw_nucleus_row.
        if (i > 0 && !min_p_keeps(q_[i], opt_.min_p)) return draw_fixed(i, [&](size_t j) { return q_[j]; });
        if (nucleus_reached(cum, total, opt_.top_p)) return draw_fixed(i + 1, [&](size_t j) { return q_[j]; });
    }
    return -1;  // the nucleus reaches past the candidates
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
    for (size_t i = 0; i < keep; ++i) sum += (p_[i] = weight(cand_[i].first, mx));
    if (!(sum > 0) || !std::isfinite(sum)) return cand_[0].second;
    // Nucleus: the smallest prefix whose probability mass reaches top_p.
    size_t n = keep;
    if (opt_.top_p < 1.0f) {
        double cum = 0;
        for (size_t i = 0; i < keep; ++i) {
            cum += p_[i] / sum;
            if (cum >= opt_.top_p) { n = i + 1; break; }
        }
    }
    // min-p: p_ is relative to the maximum (p_[0] == 1), so the cut is a comparison with min_p.
    size_t m = 1;
    while (m < n && p_[m] >= opt_.min_p) ++m;
    n = m;
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
