// Token choice from logits: greedy at temperature 0, else temperature, top-k, then top-p
// (nucleus), min-p and a draw from a seeded generator. Each sequence owns its generator so a batch
// samples exactly what its sequences would sample alone.
//
// Logits are ranked by value, highest first, ties by the lower id, NaN below every number
// (kernels/cpu/topk.h: topk_before); a NaN logit has probability 0. A sampler with top_k > 0 (or greedy) only ever looks at the
// first top_k (or 1) of that ranking, so it can draw from those candidates alone, as an engine
// that selects them on the GPU hands them over (Engine::forward_top): sample_top() then picks
// exactly what sample() picks from the full row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace shardlm {

struct SamplerOptions {
    float temperature = 0.8f;
    int64_t top_k = 40;   // 0: no limit
    float top_p = 0.95f;  // 1: no limit
    // After top-p: keep only the tokens at least min_p times as probable (at `temperature`) as the
    // most probable one (0: off), as Hugging Face's and vLLM's min-p.
    float min_p = 0.0f;
    uint64_t seed = 0;
    // Token penalties on the logits before any of the above (greedy included), over the last
    // penalty_last_n tokens of the sequence, prompt and generated alike (-1: as many as the
    // context holds; 0: none), as llama.cpp applies them (kernels/cpu/penalty.h, runtime/generate.h).
    float repetition_penalty = 1.0f;  // 1: none
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    int64_t penalty_last_n = 64;
    // Added to the logits of these ids with the penalties (OpenAI's logit_bias, llama.cpp's
    // --logit-bias): distinct ids, each bias in [-100, 100] (-100 all but bans a token, 100 all
    // but forces it). A biased id that is also penalised gets the bias after the repetition
    // penalty (the same as before it while repetition_penalty is 1).
    std::vector<std::pair<int32_t, float>> logit_bias;
};

// Whether the options penalise any token (runtime/generate.h builds the penalties).
bool penalties_enabled(const SamplerOptions& opt);

// Index of the largest value; the lowest index among ties; NaN is never taken over a number
// (an all-NaN row gives 0). The first entry of the top-k ranking.
int32_t argmax(const float* logits, int64_t n);

// How many ranked candidates per row a sampler with these options reads: 1 when greedy, top_k
// (at most the vocabulary), or 0 when it needs the whole row (no top-k limit).
int64_t sampler_candidates(const SamplerOptions& opt, int64_t vocab);

// --logprobs: a token's log-probability under the model's distribution over its logits row
// (log-softmax at temperature 1, after any token penalties, before temperature and the filters),
// with the row's n most probable tokens in the ranking's order. NaN logits have probability 0.
struct Logprob {
    int32_t id = 0;
    float logprob = 0;
};
struct TokenLogprobs {
    Logprob token;
    std::vector<Logprob> top;
    // The token's place in the row's ranking, 1 for the first (vLLM's rank): 1 plus the ids
    // ranked before it.
    int64_t rank = 1;
};
TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t id, int64_t n_top);

class Sampler {
public:
    Sampler(const SamplerOptions& opt, uint64_t stream);  // stream: the sequence's index
    int32_t sample(const float* logits, int64_t vocab);
    // The same choice from the row's first k ranked candidates (values and ids in ranking order),
    // k >= sampler_candidates(opt, vocab) > 0 (the caller's duty: fewer would change the draw).
    int32_t sample_top(const float* vals, const int32_t* ids, int64_t k);
    // Top-p without a top-k limit (temperature > 0, top_k 0, top_p < 1) from the row's first k
    // ranked candidates and `total`, the sum of nucleus_weight() over the whole row
    // (kernels/cpu/nucleus.h): what sample() draws from the row, or -1, drawing nothing, when the
    // nucleus reaches past the k candidates (then sample() the row).
    int32_t sample_nucleus(const float* vals, const int32_t* ids, int64_t k, uint64_t total);

private:
    int32_t draw();    // from cand_ (ranked, already cut to top_k)
    int32_t draw_all(const float* logits, int64_t vocab);          // no top-k, no top-p
    int32_t draw_nucleus_row(const float* logits, int64_t vocab);  // top-p alone
    template <typename Weight>
    int32_t draw_fixed(size_t n, Weight w);  // from cand_'s first n, fixed-point weights w(i)
    double weight(float x, double mx) const;
    double uniform();  // [0, 1), from splitmix64: fully specified, same on every platform
    SamplerOptions opt_;
    uint64_t state_;
    std::vector<std::pair<float, int32_t>> cand_;
    std::vector<double> p_;
    std::vector<uint64_t> q_;
    std::vector<uint32_t> keys_;  // draw_nucleus_row: ranking keys by id
    std::vector<uint64_t> hist_;  // draw_nucleus_row: weight per key digit
};

}  // namespace shardlm
