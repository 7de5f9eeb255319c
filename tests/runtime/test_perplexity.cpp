#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "comm/communicator.h"
#include "core/error.h"
#include "fixtures.h"
#include "runtime/perplexity.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

std::unique_ptr<Session> session(const std::string& dir, int64_t ctx, int64_t chunk, WeightFormat wf, Communicator& comm) {
    SessionOptions so;
    so.model_dir = dir;
    so.ctx = ctx;
    so.prefill_chunk = chunk;
    so.max_logit_rows = chunk;
    so.load.format = wf;
    return open_session(so, comm);
}

double log_softmax_at(const std::vector<float>& lg, int32_t id) {
    double mx = lg[0];
    for (float v : lg) mx = std::max(mx, double(v));
    double s = 0;
    for (float v : lg) s += std::exp(double(v) - mx);
    return double(lg[size_t(id)]) - mx - std::log(s);
}

}  // namespace

TEST(Perplexity, EqualsNextTokenLogLikelihoodsFromGeneration) {
    TempDir d;
    const ModelConfig c = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(d.path(), c, {DType::F32, 1, 41});
    const auto tokens = make_prompt(29, c.vocab, 3);
    // By hand: each prefix's last-position logits from a fresh prefill, window of 12 tokens.
    const int64_t ctx = 12;
    double nll = 0;
    int64_t scored = 0;
    for (size_t w0 = 0; w0 + 1 < tokens.size(); w0 += ctx) {
        const size_t wn = std::min<size_t>(ctx, tokens.size() - w0);
        for (size_t i = 1; i < wn; ++i) {
            const std::vector<int32_t> prefix(tokens.begin() + long(w0), tokens.begin() + long(w0 + i));
            const GenerateResult r = run_greedy(d.path(), {prefix}, 1);
            nll -= log_softmax_at(r.seqs[0].prompt_logits, tokens[w0 + i]);
            ++scored;
        }
    }
    SingleRank comm;
    for (int64_t chunk : {1, 5, 12}) {
        auto s = session(d.path(), ctx, chunk, WeightFormat::Auto, comm);
        const PerplexityResult p = perplexity(*s->engine, tokens, {ctx, chunk});
        EXPECT_EQ(p.scored, scored);
        EXPECT_NEAR(p.nll_sum, nll, 1e-4 * std::fabs(nll)) << "chunk " << chunk;
        EXPECT_NEAR(p.perplexity(), std::exp(nll / double(scored)), 1e-3 * p.perplexity());
    }
}

TEST(Perplexity, ComparisonOfAModelWithItselfIsExact) {
    TempDir d;
    const ModelConfig c = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), c, {DType::BF16, 1, 42});
    const auto tokens = make_prompt(40, c.vocab, 4);
    SingleRank comm;
    auto a = session(d.path(), 16, 8, WeightFormat::Auto, comm);
    auto b = session(d.path(), 16, 8, WeightFormat::Auto, comm);
    const LogitComparison same = compare_logits(*a->engine, *b->engine, tokens, {16, 8});
    EXPECT_EQ(same.mean_kl(), 0.0);
    EXPECT_EQ(same.top1(), 1.0);
    EXPECT_EQ(same.max_abs_err, 0.0);
    EXPECT_EQ(same.ref.nll_sum, same.cand.nll_sum);
    auto f16 = session(d.path(), 16, 8, WeightFormat::F16, comm);
    const LogitComparison diff = compare_logits(*a->engine, *f16->engine, tokens, {16, 8});
    EXPECT_GT(diff.max_abs_err, 0.0);
    EXPECT_LT(diff.max_abs_err, 0.5);
    EXPECT_GE(diff.mean_kl(), 0.0);
    EXPECT_LT(diff.mean_kl(), 1e-2);
}

// The library calls run the checks the CLI runs before its load (check_perplexity), by the same
// function: ids beyond the vocabulary (which row[next] would have read past) and fewer than 2 tokens.
TEST(Perplexity, LibraryCallsRunTheCliChecks) {
    TempDir d;
    const ModelConfig c = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), c, {DType::BF16, 1, 43});
    SingleRank comm;
    auto s = session(d.path(), 8, 4, WeightFormat::Auto, comm);
    const std::vector<int32_t> beyond = {5, 6, int32_t(c.vocab), 7};
    const std::string vocab_error = "perplexity: token id " + std::to_string(c.vocab) + " outside the vocabulary";
    for (const auto& call : std::vector<std::function<void()>>{
             [&] { check_perplexity(c, beyond, {8, 4}); }, [&] { perplexity(*s->engine, beyond, {8, 4}); },
             [&] { compare_logits(*s->engine, *s->engine, beyond, {8, 4}); }}) {
        try {
            call();
            ADD_FAILURE() << "no error";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(vocab_error), std::string::npos) << e.what();
        }
    }
    try {
        perplexity(*s->engine, {5}, {8, 4});
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("perplexity: needs at least 2 tokens, got 1"), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(check_perplexity(c, {5, 6}, {8, 4}, "ids.txt"));
}
