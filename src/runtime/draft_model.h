// Draft tokens for speculative decoding from a smaller model of the same vocabulary (vLLM's
// draft-model speculator, llama.cpp's --model-draft): the draft runs each decoding sequence k
// tokens ahead, greedily, and the target verifies them in one step (runtime/batcher.h). Greedy
// proposals are single tokens, so the verifying rule the batcher applies to prompt lookup's
// keeps the target's tokens exactly as they would be without speculation, seeded draws included.
//
// The draft has its own engine with a KV slot per target slot. What each slot's cache holds is
// tracked as tokens: before proposing, a sequence's tokens are compared with them and only the
// part after the common start is run (the tokens the last verify step confirmed, a new prompt in
// full, in chunks), so rejected proposals, reused slots, preempted and resumed sequences and a
// conversation's later turns need nothing else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace shardlm {

class DraftModel {
public:
    // `draft` runs with at least as many slots as the batcher and the target's ctx; `vocab`: the
    // target's (proposals at or past it end the proposal). prefill_chunk: tokens per draft step.
    // p_min > 0 (llama.cpp's --draft-p-min): a proposal ends before a token the draft gives less
    // than this probability (softmax at temperature 1), so a step verifies only what the draft is
    // sure of; 0 proposes all k tokens.
    DraftModel(Engine& draft, int64_t vocab, int64_t prefill_chunk, float p_min = 0.0f);

    struct Query {
        int64_t slot = 0;
        const int32_t* seq = nullptr;  // the sequence so far (prompt and tokens), n >= 1
        int64_t n = 0;
        int64_t k = 0;                 // tokens wanted, >= 1
        std::string salt;              // its cache_salt: a slot's cache is shared within one salt only
        std::vector<int32_t> out;      // the proposals (up to k)
    };
    // Proposes for every query at once: one draft step per chunk of catching up, then k - 1
    // single-token steps for all of them.
    void propose(std::vector<Query>& qs);
    double ms() const { return ms_; }  // time spent in the draft's steps so far

private:
    // One draft step over `chunks`: the greedy choice of each want_logits chunk, in order, and
    // (p_min_ > 0) its probability in `p`.
    std::vector<int32_t> run(const std::vector<SeqChunk>& chunks, std::vector<double>& p);

    Engine& e_;
    int64_t vocab_, chunk_;
    float p_min_;
    std::vector<std::vector<int32_t>> held_;  // per slot: the tokens its cache holds at [0, size)
    std::vector<std::string> held_salt_;      // and the salt of the sequence that ran them
    double ms_ = 0;
};

}  // namespace shardlm
