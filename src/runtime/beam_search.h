// Beam search (vLLM's use_beam_search, as its engine runs it): each step every live beam of a
// prompt is scored once (a request of its whole sequence that generates one token, with the
// 2 x width most probable next tokens and their log-probabilities: what the prefix cache makes
// a one-token prefill), every candidate continues its beam, and the width best new beams by
// score live on. A candidate that is an end-of-sequence id finishes its beam ("stop") instead.
// After max_tokens steps the live beams finish ("length"), and the width best of all finished
// beams are the answer, best first.
//
// Score: cumulative log-probability over the sequence's length (prompt included, a final
// end-of-sequence id not counted) to the power length_penalty, as vLLM's
// get_beam_search_score. Ties keep the earlier candidate (a beam's first, then its more probable
// ones). This holds only the beams: running the steps is the caller's (serve's handler, through
// the engine loop like any request).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/sampler.h"

namespace shardlm {

struct BeamOptions {
    int64_t width = 1;
    int64_t max_tokens = 16;
    double length_penalty = 1.0;
    // Ids that finish a beam (the model's end-of-sequence ids and a request's stop ids), unless
    // ignore_eos (then the end-of-sequence ids are plain tokens; stop ids still finish).
    std::vector<int32_t> eos_ids, stop_ids;
    bool ignore_eos = false;
};

struct Beam {
    std::vector<int32_t> tokens;  // generated (a finishing id included)
    double logprob = 0;           // cumulative
    std::string finish;           // "stop" or "length" once finished
};

class BeamSearch {
public:
    BeamSearch(std::vector<std::vector<int32_t>> prompts, const BeamOptions& opt);
    // The candidates each live beam's scoring must list (TokenLogprobs::top).
    int64_t candidates() const { return 2 * opt_.width; }
    // The sequences to score this step: each live beam's prompt and tokens, prompt by prompt.
    std::vector<std::vector<int32_t>> step() const;
    // One scoring per entry of step(), in its order: each lists the next tokens' log-probabilities
    // (token_logprobs' top; candidates with -inf are dropped). Ends the search after max_tokens
    // steps or when no beam lives.
    void advance(const std::vector<TokenLogprobs>& scored);
    bool done() const { return done_; }
    // Once done: prompt p's width best beams, best first.
    std::vector<Beam> best(size_t p) const;
    // A beam's score (get_beam_search_score) for a prompt of n tokens.
    double score(const Beam& b, size_t prompt_tokens) const;

private:
    std::vector<std::vector<int32_t>> prompts_;
    BeamOptions opt_;
    std::vector<std::vector<Beam>> live_, finished_;  // per prompt
    int64_t steps_ = 0;
    bool done_ = false;
};

}  // namespace shardlm
