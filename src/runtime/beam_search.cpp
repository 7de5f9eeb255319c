#include "runtime/beam_search.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace shardlm {

BeamSearch::BeamSearch(std::vector<std::vector<int32_t>> prompts, const BeamOptions& opt)
    : prompts_(std::move(prompts)), opt_(opt), live_(prompts_.size()), finished_(prompts_.size()) {
    SHARDLM_CHECK(opt.width >= 1 && opt.max_tokens >= 1, "BeamSearch: width ", opt.width, ", max_tokens ", opt.max_tokens);
    for (std::vector<Beam>& l : live_) l.push_back(Beam{});
    done_ = prompts_.empty();
}

std::vector<std::vector<int32_t>> BeamSearch::step() const {
    std::vector<std::vector<int32_t>> seqs;
    for (size_t p = 0; p < prompts_.size(); ++p)
        for (const Beam& b : live_[p]) {
            seqs.push_back(prompts_[p]);
            seqs.back().insert(seqs.back().end(), b.tokens.begin(), b.tokens.end());
        }
    return seqs;
}

double BeamSearch::score(const Beam& b, size_t prompt_tokens) const {
    // The finishing id is not counted (vLLM counts the prompt, not a final end-of-sequence id).
    const double len = double(prompt_tokens + b.tokens.size() - (b.finish == "stop" ? 1 : 0));
    return b.logprob / std::pow(len, opt_.length_penalty);
}

void BeamSearch::advance(const std::vector<TokenLogprobs>& scored) {
    size_t live = 0;
    for (const std::vector<Beam>& l : live_) live += l.size();
    SHARDLM_CHECK(!done_ && scored.size() == live, "BeamSearch::advance: ", scored.size(), " scorings for ", live,
                  " live beams", done_ ? " (the search is done)" : "");
    auto ends = [&](int32_t id) {
        const auto in = [id](const std::vector<int32_t>& v) { return std::find(v.begin(), v.end(), id) != v.end(); };
        return in(opt_.stop_ids) || (!opt_.ignore_eos && in(opt_.eos_ids));
    };
    size_t k = 0;
    bool any = false;
    for (size_t p = 0; p < prompts_.size(); ++p) {
        const size_t n = prompts_[p].size();
        std::vector<Beam> next;
        for (const Beam& b : live_[p]) {
            for (const Logprob& c : scored[k].top) {
                if (!(c.logprob > -INFINITY)) continue;  // banned (or NaN): not a continuation
                Beam nb = b;
                nb.tokens.push_back(c.id);
                nb.logprob += c.logprob;
                if (ends(c.id)) {
                    nb.finish = "stop";
                    finished_[p].push_back(std::move(nb));
                } else {
                    next.push_back(std::move(nb));
                }
            }
            ++k;
        }
        std::stable_sort(next.begin(), next.end(), [&](const Beam& a, const Beam& b) { return score(a, n) > score(b, n); });
        if (int64_t(next.size()) > opt_.width) next.resize(size_t(opt_.width));
        live_[p] = std::move(next);
        any = any || !live_[p].empty();
    }
    if (++steps_ < opt_.max_tokens && any) return;
    for (size_t p = 0; p < prompts_.size(); ++p) {
        for (Beam& b : live_[p]) {
            b.finish = "length";
            finished_[p].push_back(std::move(b));
        }
        live_[p].clear();
    }
    done_ = true;
}

std::vector<Beam> BeamSearch::best(size_t p) const {
    SHARDLM_CHECK(done_ && p < prompts_.size(), "BeamSearch::best: prompt ", p, " of ", prompts_.size(),
                  done_ ? "" : " before the search is done");
    std::vector<Beam> all = finished_[p];
    const size_t n = prompts_[p].size();
    std::stable_sort(all.begin(), all.end(), [&](const Beam& a, const Beam& b) { return score(a, n) > score(b, n); });
    if (int64_t(all.size()) > opt_.width) all.resize(size_t(opt_.width));
    return all;
}

}  // namespace shardlm
