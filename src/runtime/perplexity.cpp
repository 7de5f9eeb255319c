#include "runtime/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "runtime/sampler.h"

namespace shardlm {

double PerplexityResult::perplexity() const { return scored ? std::exp(nll_sum / double(scored)) : 0.0; }

void check_perplexity_options(const PerplexityOptions& opt) {
    if (opt.ctx < 2) fail("--ctx must be at least 2");
    if (opt.chunk < 1) fail("--prefill-chunk must be at least 1");
}

void check_perplexity(const ModelConfig& cfg, const std::vector<int32_t>& tokens, const PerplexityOptions& opt,
                      const std::string& source) {
    check_perplexity_options(opt);
    for (int32_t id : tokens)
        if (id < 0 || id >= cfg.vocab) fail(source, ": token id ", id, " outside the vocabulary [0, ", cfg.vocab, ")");
    if (tokens.size() < 2) fail(source, ": needs at least 2 tokens, got ", tokens.size());
}

namespace {

// log-sum-exp of one row, in double.
double log_sum_exp(const float* x, int64_t n) {
    double mx = x[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, double(x[i]));
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - mx);
    return mx + std::log(s);
}

// Tokens per forward step: a window holds at most ctx tokens, so a larger --prefill-chunk changes
// nothing (and must not size buffers).
int64_t step_tokens(const PerplexityOptions& opt) { return std::min(opt.chunk, opt.ctx); }

// Calls visit(row logits, next token) for every scored position, window by window.
template <typename Visit>
void for_each_window(Engine& e, const std::vector<int32_t>& tokens, const PerplexityOptions& opt,
                     std::vector<float>& logits, Visit visit) {
    const int64_t V = e.config().vocab;
    const int64_t total = int64_t(tokens.size());
    for (int64_t w0 = 0; w0 + 1 < total; w0 += opt.ctx) {
        const int64_t wn = std::min(opt.ctx, total - w0);
        for (int64_t c0 = 0; c0 < wn; c0 += step_tokens(opt)) {
            const int64_t cn = std::min(step_tokens(opt), wn - c0);
            SeqChunk ch;
            ch.slot = 0;
            ch.tokens = tokens.data() + w0 + c0;
            ch.n = cn;
            ch.pos = c0;
            ch.all_logits = true;
            e.forward({ch}, logits.data());
            for (int64_t i = 0; i < cn; ++i) {
                const int64_t at = c0 + i;  // position in the window; predicts the next token
                if (at + 1 >= wn) break;
                visit(logits.data() + i * V, tokens[size_t(w0 + at + 1)]);
            }
        }
    }
}

// check_perplexity, and the engine sized for the windows and steps (the caller's contract).
void check(const Engine& e, const std::vector<int32_t>& tokens, const PerplexityOptions& opt) {
    check_perplexity(e.config(), tokens, opt);
    SHARDLM_CHECK(e.options().ctx >= opt.ctx && e.options().max_step_tokens >= step_tokens(opt) &&
                  e.options().max_logit_rows >= step_tokens(opt));
}

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

PerplexityResult perplexity(Engine& e, const std::vector<int32_t>& tokens, const PerplexityOptions& opt) {
    check(e, tokens, opt);
    const int64_t V = e.config().vocab;
    std::vector<float> logits(size_t(step_tokens(opt) * V));
    PerplexityResult r;
    const double t0 = now_ms();
    for_each_window(e, tokens, opt, logits, [&](const float* row, int32_t next) {
        r.nll_sum += log_sum_exp(row, V) - double(row[next]);
        r.scored += 1;
    });
    r.ms = now_ms() - t0;
    return r;
}

LogitComparison compare_logits(Engine& ref, Engine& cand, const std::vector<int32_t>& tokens,
                               const PerplexityOptions& opt) {
    check(ref, tokens, opt);
    check(cand, tokens, opt);
    const int64_t V = ref.config().vocab;
    // The reference's rows are kept for one window at a time: window by window, both engines.
    LogitComparison c;
    std::vector<float> a(size_t(step_tokens(opt) * V)), b(a.size());
    std::vector<float> ref_rows;
    std::vector<int32_t> next_ids;
    for (int64_t w0 = 0; w0 + 1 < int64_t(tokens.size()); w0 += opt.ctx) {
        const int64_t wn = std::min<int64_t>(opt.ctx, int64_t(tokens.size()) - w0);
        const std::vector<int32_t> window(tokens.begin() + w0, tokens.begin() + w0 + wn);
        ref_rows.clear();
        next_ids.clear();
        double t0 = now_ms();
        for_each_window(ref, window, opt, a, [&](const float* row, int32_t next) {
            c.ref.nll_sum += log_sum_exp(row, V) - double(row[next]);
            c.ref.scored += 1;
            ref_rows.insert(ref_rows.end(), row, row + V);
            next_ids.push_back(next);
        });
        c.ref.ms += now_ms() - t0;
        size_t k = 0;
        t0 = now_ms();
        for_each_window(cand, window, opt, b, [&](const float* row, int32_t next) {
            const float* rr = ref_rows.data() + k * size_t(V);
            const double lr = log_sum_exp(rr, V), lc = log_sum_exp(row, V);
            c.cand.nll_sum += lc - double(row[next]);
            c.cand.scored += 1;
            double kl = 0;
            for (int64_t i = 0; i < V; ++i) {
                const double pr = double(rr[i]) - lr;  // log p_ref
                kl += std::exp(pr) * (pr - (double(row[i]) - lc));
                c.max_abs_err = std::max(c.max_abs_err, std::fabs(double(rr[i]) - double(row[i])));
            }
            c.kl_sum += std::max(0.0, kl);
            c.top1_agree += argmax(rr, V) == argmax(row, V) ? 1 : 0;
            ++k;
        });
        c.cand.ms += now_ms() - t0;
    }
    return c;
}

}  // namespace shardlm
