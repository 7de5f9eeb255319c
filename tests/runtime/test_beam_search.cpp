// BeamSearch (runtime/beam_search.h) over toy models whose next-token log-probabilities are a
// function of the sequence: wide enough to prune nothing it is exhaustive search; width 1 is
// greedy; a hand-made model where the second-best first token leads to the best pair.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "core/error.h"
#include "runtime/beam_search.h"

using namespace shardlm;

namespace {

using Model = std::function<std::vector<float>(const std::vector<int32_t>&)>;  // logits of the next token

// A model of `vocab` ids whose logits hash the sequence.
Model hashed(int64_t vocab) {
    return [vocab](const std::vector<int32_t>& seq) {
        uint64_t h = 1469598103934665603ull;
        for (const int32_t t : seq) h = (h ^ uint64_t(t + 1)) * 1099511628211ull;
        std::vector<float> lg(static_cast<size_t>(vocab));
        for (float& x : lg) {
            h = h * 6364136223846793005ull + 1442695040888963407ull;
            x = float(h >> 40) / float(1 << 24) * 6.0f;
        }
        return lg;
    };
}

// Runs the search to its end, scoring each step's sequences with the model.
std::vector<std::vector<Beam>> run(const Model& m, const std::vector<std::vector<int32_t>>& prompts, const BeamOptions& o,
                                   int64_t vocab) {
    BeamSearch s(prompts, o);
    while (!s.done()) {
        std::vector<TokenLogprobs> scored;
        for (const std::vector<int32_t>& seq : s.step()) {
            const std::vector<float> lg = m(seq);
            scored.push_back(token_logprobs(lg.data(), vocab, 0, std::min(vocab, s.candidates())));
        }
        s.advance(scored);
    }
    std::vector<std::vector<Beam>> out;
    for (size_t p = 0; p < prompts.size(); ++p) out.push_back(s.best(p));
    return out;
}

double logprob_of(const Model& m, std::vector<int32_t> seq, const std::vector<int32_t>& tokens, int64_t vocab) {
    double total = 0;
    for (const int32_t t : tokens) {
        const std::vector<float> lg = m(seq);
        total += token_logprobs(lg.data(), vocab, t, 0).token.logprob;
        seq.push_back(t);
    }
    return total;
}

}  // namespace

// Width 27 over 3 non-final ids and 3 steps never prunes: the answer is every sequence that ends
// at the end-of-sequence id 0 or after 3 tokens, ranked by score, for two prompts at once and
// three length penalties.
TEST(BeamSearch, WideEnoughIsExhaustive) {
    const int64_t vocab = 4;
    const Model m = hashed(vocab);
    const std::vector<std::vector<int32_t>> prompts = {{1, 2}, {3, 1, 1, 2, 3}};
    for (const double penalty : {0.0, 1.0, 2.5}) {
        BeamOptions o;
        o.width = 27;
        o.max_tokens = 3;
        o.length_penalty = penalty;
        o.eos_ids = {0};
        const std::vector<std::vector<Beam>> got = run(m, prompts, o, vocab);
        for (size_t p = 0; p < prompts.size(); ++p) {
            // Every ending: 0 after 0-2 other ids, or 3 other ids.
            std::vector<std::pair<double, std::vector<int32_t>>> all;
            std::function<void(std::vector<int32_t>)> grow = [&](std::vector<int32_t> t) {
                for (int32_t id = 0; id < vocab; ++id) {
                    std::vector<int32_t> u = t;
                    u.push_back(id);
                    const bool stop = id == 0;
                    if (!stop && u.size() < 3) {
                        grow(u);
                        continue;
                    }
                    const double len = double(prompts[p].size() + u.size() - (stop ? 1 : 0));
                    all.push_back({logprob_of(m, prompts[p], u, vocab) / std::pow(len, penalty), u});
                }
            };
            grow({});
            std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
            ASSERT_EQ(all.size(), 40u);  // 0, x0, xy0 and xyz: 1 + 3 + 9 + 27
            ASSERT_EQ(got[p].size(), 27u);
            for (size_t i = 0; i < got[p].size(); ++i) {
                EXPECT_EQ(got[p][i].tokens, all[i].second) << "prompt " << p << ", beam " << i << ", penalty " << penalty;
                EXPECT_NEAR(got[p][i].logprob, logprob_of(m, prompts[p], got[p][i].tokens, vocab), 1e-5);
                EXPECT_EQ(got[p][i].finish, got[p][i].tokens.back() == 0 ? "stop" : "length");
            }
        }
    }
}

// Width 1 follows the argmax when no id finishes a beam: no end-of-sequence ids, or ignore_eos.
// (With one, a finished beam and the beam that went on with the second choice both stay in the
// running, as vLLM's do, so width 1 is not greedy then.)
TEST(BeamSearch, WidthOneIsGreedy) {
    const int64_t vocab = 50;
    const Model m = hashed(vocab);
    std::vector<int32_t> seq = {4, 5}, greedy;
    for (int i = 0; i < 12; ++i) {
        const std::vector<float> lg = m(seq);
        greedy.push_back(argmax(lg.data(), vocab));
        seq.push_back(greedy.back());
    }
    ASSERT_NE(std::find(greedy.begin(), greedy.end(), 7), greedy.end());  // (an id the model picks)
    for (const bool ignore : {false, true}) {
        BeamOptions o;
        o.width = 1;
        o.max_tokens = 12;
        if (ignore) o.eos_ids = {7};
        o.ignore_eos = ignore;
        const std::vector<Beam> got = run(m, {{4, 5}}, o, vocab)[0];
        ASSERT_EQ(got.size(), 1u);
        EXPECT_EQ(got[0].tokens, greedy);
        EXPECT_EQ(got[0].finish, "length");
    }
}

// A model where greedy takes id 1 first and then finds nothing better than -2, while id 2 (a
// little less probable first) is followed by id 3 at -0.1: width 2 finds [2, 3], width 1 does not.
// A stop id finishes a beam, its length not counting it.
TEST(BeamSearch, KeepsTheSecondBestFirstToken) {
    const int64_t vocab = 5;
    const std::map<std::vector<int32_t>, std::vector<float>> table = {
        {{9}, {-9, -0.5f, -0.6f, -4, -9}},
        {{9, 1}, {-9, -2, -2.1f, -2.2f, -9}},
        {{9, 2}, {-9, -3, -4, -0.1f, -9}},
    };
    const Model m = [&](const std::vector<int32_t>& seq) {
        const auto it = table.find(seq);
        return it != table.end() ? it->second : std::vector<float>{0, -1, -2, -3, -4};
    };
    // Logits made log-probabilities: each row's exp sum is not 1, so compare after token_logprobs.
    BeamOptions o;
    o.max_tokens = 2;
    o.length_penalty = 0;
    o.width = 1;
    EXPECT_EQ(run(m, {{9}}, o, vocab)[0][0].tokens, (std::vector<int32_t>{1, 1}));
    o.width = 2;
    const std::vector<Beam> two = run(m, {{9}}, o, vocab)[0];
    ASSERT_EQ(two.size(), 2u);
    EXPECT_EQ(two[0].tokens, (std::vector<int32_t>{2, 3}));
    EXPECT_EQ(two[1].tokens, (std::vector<int32_t>{1, 1}));
    EXPECT_GT(two[0].logprob, two[1].logprob);
    // Score: cumulative logprob over the length to the power length_penalty, a stop id not counted.
    BeamOptions lp;
    lp.length_penalty = 1;
    BeamSearch s({{1, 2, 3, 4}}, lp);
    EXPECT_DOUBLE_EQ(s.score(Beam{{5, 6}, -3.0, "length"}, 4), -0.5);
    EXPECT_DOUBLE_EQ(s.score(Beam{{5, 0}, -3.0, "stop"}, 4), -0.6);
    o.stop_ids = {3};
    const std::vector<Beam> stopped = run(m, {{9}}, o, vocab)[0];
    EXPECT_EQ(stopped[0].tokens, (std::vector<int32_t>{2, 3}));
    EXPECT_EQ(stopped[0].finish, "stop");
}

TEST(BeamSearch, Misuse) {
    BeamOptions o;
    o.width = 0;
    EXPECT_THROW(BeamSearch({{1}}, o), Error);
    o.width = 2;
    BeamSearch s({{1}, {2}}, o);
    EXPECT_THROW(s.best(0), Error);
    EXPECT_EQ(s.step().size(), 2u);
    EXPECT_THROW(s.advance({TokenLogprobs{}}), Error);
}
