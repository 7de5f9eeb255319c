// Teacher-forced evaluation: perplexity of a token sequence, and the distance between two
// precisions of the same model on the same tokens (KL divergence, top-1 agreement, logit error).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "runtime/engine.h"

namespace shardlm {

struct PerplexityOptions {
    int64_t ctx = 512;    // tokens per window; windows do not overlap, each starts with an empty cache
    int64_t chunk = 64;   // tokens per forward step inside a window
};

struct PerplexityResult {
    double nll_sum = 0;     // sum of -log p(token | prefix) over scored tokens (natural log)
    int64_t scored = 0;     // tokens scored: every token of a window but its first
    double ms = 0;
    double perplexity() const;
};

// Distance of a candidate's next-token distributions from a reference's, over the same positions.
struct LogitComparison {
    PerplexityResult ref, cand;
    double kl_sum = 0;          // sum over positions of KL(ref || cand), natural log
    int64_t top1_agree = 0;     // positions where both argmaxes agree
    double max_abs_err = 0;     // largest |logit_ref - logit_cand|
    double mean_kl() const { return ref.scored ? kl_sum / double(ref.scored) : 0.0; }
    double top1() const { return ref.scored ? double(top1_agree) / double(ref.scored) : 0.0; }
};

// The checks perplexity() and compare_logits() make before they run anything, on the options,
// the tokens and the config alone (throws Error): check_perplexity_options the flags (--ctx at
// least 2, --prefill-chunk at least 1), check_perplexity those and the tokens too (at least 2,
// each within [0, cfg.vocab)); `source`, where the tokens came from (a file), begins the token
// errors. The CLI calls them before loading the weights.
void check_perplexity_options(const PerplexityOptions& opt);
void check_perplexity(const ModelConfig& cfg, const std::vector<int32_t>& tokens, const PerplexityOptions& opt,
                      const std::string& source = "perplexity");

// The engines need max_batch >= 1, ctx >= opt.ctx, max_step_tokens and max_logit_rows >= opt.chunk.
PerplexityResult perplexity(Engine& engine, const std::vector<int32_t>& tokens, const PerplexityOptions& opt);
LogitComparison compare_logits(Engine& ref, Engine& cand, const std::vector<int32_t>& tokens,
                               const PerplexityOptions& opt);

}  // namespace shardlm
