#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/nucleus.h"
#include "kernels/cpu/topk.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

using namespace shardlm;

TEST(Sampler, GreedyTakesLowestIndexOnTies) {
    const std::vector<float> lg = {1, 5, 5, 2};
    EXPECT_EQ(argmax(lg.data(), 4), 1);
    SamplerOptions o;
    o.temperature = 0;
    Sampler s(o, 0);
    EXPECT_EQ(s.sample(lg.data(), 4), 1);
}

TEST(Sampler, TopKOneIsGreedy) {
    const std::vector<float> lg = {0.1f, 0.3f, 0.2f};
    SamplerOptions o;
    o.temperature = 1;
    o.top_k = 1;
    Sampler s(o, 0);
    for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(lg.data(), 3), 1);
}

TEST(Sampler, TopPKeepsTheNucleus) {
    // probabilities 0.5, 0.3, 0.2 (log-space): top_p 0.7 keeps ids 0 and 1 only.
    const std::vector<float> lg = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
    SamplerOptions o;
    o.temperature = 1;
    o.top_k = 0;
    o.top_p = 0.7f;
    Sampler s(o, 3);
    std::map<int, int> count;
    for (int i = 0; i < 4000; ++i) count[s.sample(lg.data(), 3)]++;
    EXPECT_EQ(count[2], 0);
    EXPECT_NEAR(double(count[0]) / 4000, 0.625, 0.03);  // 0.5 / 0.8
}

TEST(Sampler, TemperatureMatchesDistributionAndSeedRepeats) {
    const std::vector<float> lg = {0, std::log(3.0f)};
    SamplerOptions o;
    o.temperature = 1;
    o.top_k = 0;
    o.top_p = 1;
    o.seed = 42;
    Sampler a(o, 0), b(o, 0), c(o, 1);
    int ones = 0, same_as_other_stream = 0;
    for (int i = 0; i < 4000; ++i) {
        const int x = a.sample(lg.data(), 2);
        EXPECT_EQ(x, b.sample(lg.data(), 2));
        same_as_other_stream += x == c.sample(lg.data(), 2);
        ones += x;
    }
    EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
    EXPECT_LT(same_as_other_stream, 4000);
}

// min-p keeps the tokens at least min_p times as probable as the first, on every path: top-k
// candidates, the whole row without filters, and top-p without top-k. Probabilities 0.5, 0.3,
// 0.15, 0.05 at min-p 0.2 keep the first three (0.05 / 0.5 = 0.1 < 0.2), renormalised.
TEST(Sampler, MinPDropsTheImprobable) {
    const std::vector<float> lg = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
    struct Opt { int64_t k; float p; };
    for (const Opt o : {Opt{4, 1}, Opt{0, 1}, Opt{0, 0.999f}}) {
        SamplerOptions so;
        so.temperature = 1;
        so.top_k = o.k;
        so.top_p = o.p;
        so.min_p = 0.2f;
        Sampler s(so, 1);
        std::map<int, int> count;
        for (int i = 0; i < 6000; ++i) count[s.sample(lg.data(), 4)]++;
        EXPECT_EQ(count[3], 0) << "k " << o.k << " p " << o.p;
        EXPECT_NEAR(count[0] / 6000.0, 0.5 / 0.95, 0.03) << "k " << o.k << " p " << o.p;
        EXPECT_NEAR(count[2] / 6000.0, 0.15 / 0.95, 0.02) << "k " << o.k << " p " << o.p;
    }
    // At a lower temperature the probabilities sharpen first: T = 0.5 squares the ratios, so 0.15 /
    // 0.5 = 0.3 becomes 0.09 < 0.2 and only the first two stay.
    SamplerOptions so;
    so.temperature = 0.5f;
    so.top_k = 4;
    so.top_p = 1;
    so.min_p = 0.2f;
    Sampler s(so, 2);
    for (int i = 0; i < 500; ++i) EXPECT_LT(s.sample(lg.data(), 4), 2);
    so.min_p = 1;  // only the maximum (and its ties)
    Sampler g(so, 2);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(g.sample(lg.data(), 4), 0);
}

TEST(Sampler, BadOptions) {
    SamplerOptions o;
    o.top_p = 0;
    EXPECT_THROW(Sampler(o, 0), Error);
    o.top_p = 1;
    o.temperature = -1;
    EXPECT_THROW(Sampler(o, 0), Error);
    o.temperature = INFINITY;  // every weight exp(0): silently uniform
    EXPECT_THROW(Sampler(o, 0), Error);
    o.temperature = NAN;
    EXPECT_THROW(Sampler(o, 0), Error);
    o.temperature = 1e30f;  // finite: very flat, as asked
    EXPECT_NO_THROW(Sampler(o, 0));
    for (const float bad : {-0.1f, 1.5f, NAN}) {
        SamplerOptions m;
        m.min_p = bad;
        EXPECT_THROW(Sampler(m, 0), Error) << "min_p " << bad;
    }
    for (const float bad : {0.0f, -1.0f, INFINITY, NAN}) {
        SamplerOptions m;
        m.repetition_penalty = bad;
        EXPECT_THROW(Sampler(m, 0), Error) << "repetition " << bad;
    }
    for (const float bad : {INFINITY, -INFINITY, NAN}) {
        SamplerOptions m;
        m.presence_penalty = bad;
        EXPECT_THROW(Sampler(m, 0), Error) << "presence " << bad;
        m.presence_penalty = 0;
        m.frequency_penalty = bad;
        EXPECT_THROW(Sampler(m, 0), Error) << "frequency " << bad;
    }
    SamplerOptions m;
    m.penalty_last_n = -2;
    EXPECT_THROW(Sampler(m, 0), Error);
    m.penalty_last_n = -1;
    m.repetition_penalty = 0.5f;  // below 1 favours repeats: allowed
    m.presence_penalty = -1;
    EXPECT_NO_THROW(Sampler(m, 0));
}

TEST(Sampler, ArgmaxNeverTakesNaNOverANumber) {
    const float nan = std::nanf("");
    const std::vector<float> a = {nan, 1, 3, 3}, b = {nan, nan}, c = {-INFINITY, nan, -INFINITY};
    EXPECT_EQ(argmax(a.data(), 4), 2);
    EXPECT_EQ(argmax(b.data(), 2), 0);
    EXPECT_EQ(argmax(c.data(), 3), 0);
}

TEST(Sampler, CandidatesNeeded) {
    SamplerOptions o;
    o.temperature = 0;
    EXPECT_EQ(sampler_candidates(o, 100), 1);
    o.temperature = 0.7f;
    o.top_k = 40;
    EXPECT_EQ(sampler_candidates(o, 100), 40);
    EXPECT_EQ(sampler_candidates(o, 30), 30);
    o.top_k = 0;
    EXPECT_EQ(sampler_candidates(o, 100), 0);
}

// Drawing from the first k ranked candidates picks exactly what drawing from the full row picks,
// draw after draw (the generators stay in step), with ties straddling the k-th place and NaN.
TEST(Sampler, TopCandidatesDrawWhatTheFullRowDraws) {
    const int64_t V = 300;
    uint64_t z = 12345;
    auto next = [&] { z = z * 6364136223846793005ull + 1442695040888963407ull; return uint32_t(z >> 33); };
    struct Opt { float t; int64_t k; float p; float min_p; };
    for (const Opt o : {Opt{0, 0, 1, 0}, Opt{1, 1, 1, 0}, Opt{0.8f, 40, 0.95f, 0}, Opt{1.5f, 7, 1, 0},
                        Opt{0.5f, 299, 0.9f, 0}, Opt{1, 400, 0.5f, 0}, Opt{0.8f, 40, 0.95f, 0.1f},
                        Opt{2, 299, 1, 0.5f}, Opt{0, 0, 1, 0.3f}}) {
        SamplerOptions so;
        so.temperature = o.t;
        so.top_k = o.k;
        so.top_p = o.p;
        so.min_p = o.min_p;
        so.seed = 9;
        Sampler full(so, 2), top(so, 2);
        const int64_t k = sampler_candidates(so, V);
        ASSERT_GT(k, 0);
        for (int draw = 0; draw < 200; ++draw) {
            std::vector<float> lg(static_cast<size_t>(V));
            for (auto& v : lg) v = float(next() % 64) / 8.0f;  // many ties
            if (draw % 7 == 0) lg[size_t(next() % V)] = std::nanf("");
            std::vector<float> vals(static_cast<size_t>(k));
            std::vector<int32_t> ids(static_cast<size_t>(k));
            topk_ref(lg.data(), V, k, vals.data(), ids.data());
            ASSERT_EQ(full.sample(lg.data(), V), top.sample_top(vals.data(), ids.data(), k))
                << "t " << o.t << " k " << o.k << " p " << o.p << " min_p " << o.min_p << " draw " << draw;
        }
    }
}

// Without a top-k limit the row is ranked only as far as the nucleus reaches (a growing prefix):
// the same draws as ranking the whole row (top_k = vocab), on peaked and flat rows whose nucleus
// ends inside the first prefix of 64, inside later ones, or takes the whole row; NaN logits have
// probability 0 on both paths (never drawn), and an all-NaN row gives the ranking's first.
TEST(Sampler, NucleusWithoutTopKDrawsWhatTheFullRankingDraws) {
    const int64_t V = 5000;
    uint64_t z = 777;
    auto next = [&] { z = z * 6364136223846793005ull + 1442695040888963407ull; return uint32_t(z >> 33); };
    for (const float p : {0.3f, 0.9f, 0.999f}) {
        for (const float spread : {0.5f, 4.0f, 40.0f}) {
            SamplerOptions lim, all;
            lim.temperature = all.temperature = 0.9f;
            lim.top_p = all.top_p = p;
            lim.top_k = 0;
            all.top_k = V;
            lim.seed = all.seed = 5;
            Sampler a(lim, 1), b(all, 1);
            for (int draw = 0; draw < 40; ++draw) {
                std::vector<float> lg(static_cast<size_t>(V));
                for (auto& v : lg) v = float(next() % 4096) / 4096.0f * spread;
                for (int i = 0; i < 5; ++i) lg[size_t(next() % V)] = std::nanf("");
                const int32_t x = a.sample(lg.data(), V);
                ASSERT_EQ(x, b.sample(lg.data(), V)) << "p " << p << " spread " << spread << " draw " << draw;
                ASSERT_FALSE(std::isnan(lg[size_t(x)])) << "drew a NaN logit";
            }
        }
    }
    SamplerOptions o;
    o.temperature = 1;
    o.top_k = 0;
    for (const float p : {0.6f, 1.0f}) {
        o.top_p = p;
        Sampler s(o, 0);
        const std::vector<float> nan_row(10, std::nanf(""));
        EXPECT_EQ(s.sample(nan_row.data(), 10), 0);
        std::vector<float> one_number = nan_row;
        one_number[7] = -3.0f;
        for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(one_number.data(), 10), 7);
        // NaN beside numbers: the numbers keep their probabilities (not the first one alone).
        std::vector<float> two_numbers = nan_row;
        two_numbers[2] = two_numbers[5] = 1.0f;
        int fives = 0;
        for (int i = 0; i < 400; ++i) {
            const int32_t x = s.sample(two_numbers.data(), 10);
            ASSERT_TRUE(x == 2 || x == 5) << x;
            fives += x == 5;
        }
        EXPECT_NEAR(fives / 400.0, 0.5, 0.1) << "top_p " << p;
    }
}

// Top-p without top-k from the first k ranked candidates and the row's total fixed-point weight
// (what a GPU hands over): the same draws as from the whole row, falling back to the row (-1, no
// draw consumed) exactly when the nucleus reaches past the candidates.
TEST(Sampler, NucleusFromCandidatesDrawsWhatTheRowDraws) {
    const int64_t V = 3000;
    uint64_t z = 99;
    auto next = [&] { z = z * 6364136223846793005ull + 1442695040888963407ull; return uint32_t(z >> 33); };
    int decided = 0, fell_back = 0;
    for (const int64_t k : {int64_t(1), int64_t(16), int64_t(1024)})
    for (const float min_p : {0.0f, 0.02f, 0.5f}) {
        SamplerOptions o;
        o.temperature = 0.7f;
        o.top_k = 0;
        o.top_p = 0.9f;
        o.min_p = min_p;
        o.seed = 4;
        Sampler row(o, 0), cands(o, 0);
        for (int draw = 0; draw < 60; ++draw) {
            std::vector<float> lg(static_cast<size_t>(V));
            const float spread = draw % 3 == 0 ? 1.0f : 30.0f;  // flat rows and peaked ones
            for (auto& v : lg) v = float(next() % 8192) / 8192.0f * spread;
            if (draw % 5 == 0) lg[size_t(next() % V)] = std::nanf("");
            std::vector<float> vals(static_cast<size_t>(k));
            std::vector<int32_t> ids(static_cast<size_t>(k));
            topk_ref(lg.data(), V, k, vals.data(), ids.data());
            uint64_t total = 0;
            for (float x : lg) total += nucleus_weight(x, vals[0], o.temperature);
            int32_t got = cands.sample_nucleus(vals.data(), ids.data(), k, total);
            if (got < 0) {
                ++fell_back;
                got = cands.sample(lg.data(), V);
            } else {
                ++decided;
            }
            ASSERT_EQ(got, row.sample(lg.data(), V)) << "k " << k << " min_p " << min_p << " draw " << draw;
        }
    }
    EXPECT_GT(decided, 60);
    EXPECT_GT(fell_back, 60);
    SamplerOptions topk;
    topk.top_k = 40;
    const float v = 1.0f;
    const int32_t id = 0;
    EXPECT_THROW(Sampler(topk, 0).sample_nucleus(&v, &id, 1, 1), Error);
}

// The row's nucleus found by the weighted radix select (draw_nucleus_row) is the plain walk's:
// sample_nucleus over the whole ranking (k = the vocabulary, so it never falls back) adds ranked
// weights until top_p of the total. Rows with nuclei of one token up to most of a 40k row (flat
// ones pass every prefix the ranking used to grow through), keys that differ only in their low
// bits, long runs of ties, -0 beside +0 (a tie: the lower id first), -inf and NaN.
TEST(Sampler, NucleusRadixSelectIsTheRankedWalk) {
    const int64_t V = 40000;
    uint64_t z = 4242;
    auto next = [&] { z = z * 6364136223846793005ull + 1442695040888963407ull; return uint32_t(z >> 33); };
    for (const float p : {0.05f, 0.5f, 0.95f, 0.9999f})
    for (const float min_p : {0.0f, 0.9f}) {
        SamplerOptions o;
        o.temperature = 0.8f;
        o.top_k = 0;
        o.top_p = p;
        o.min_p = min_p;
        o.seed = 17;
        Sampler row(o, 3), walk(o, 3);
        for (int draw = 0; draw < 12; ++draw) {
            std::vector<float> lg(static_cast<size_t>(V));
            switch (draw % 4) {
                case 0:  // flat: the nucleus is most of the row
                    for (auto& v : lg) v = float(next() % 1000000) * 1e-7f;
                    break;
                case 1:  // few levels: runs of thousands of ties
                    for (auto& v : lg) v = float(next() % 8) * 0.25f;
                    break;
                case 2:  // neighbours in the float order, around zero, with -0 and +0
                    for (auto& v : lg) {
                        const uint32_t r = next() % 64;
                        v = r < 2 ? (r ? 0.0f : -0.0f) : std::nextafter(0.0f, (r & 1) ? 1.0f : -1.0f) * float(r);
                    }
                    break;
                default:  // peaked: one token or a few carry the mass
                    for (auto& v : lg) v = float(next() % 4096) / 1024.0f;
                    for (int i = 0; i < 3; ++i) lg[size_t(next() % V)] = 30.0f + float(i);
                    break;
            }
            for (int i = 0; i < 4; ++i) lg[size_t(next() % V)] = std::nanf("");
            lg[size_t(next() % V)] = -INFINITY;
            std::vector<float> vals(static_cast<size_t>(V));
            std::vector<int32_t> ids(static_cast<size_t>(V));
            topk_ref(lg.data(), V, V, vals.data(), ids.data());
            uint64_t total = 0;
            for (float x : lg) total += nucleus_weight(x, vals[0], o.temperature);
            ASSERT_EQ(row.sample(lg.data(), V), walk.sample_nucleus(vals.data(), ids.data(), V, total))
                << "p " << p << " min_p " << min_p << " draw " << draw;
        }
    }
}

// The vocab-parallel merge (runtime/engine.h): each rank's first min(k, slice) candidates of its
// slice, merged, are the whole row's first k, for slices of every size (empty ones included),
// ties across ranks and NaN.
TEST(Sampler, MergedRankCandidatesAreTheRowsFirstK) {
    uint64_t z = 77;
    auto next = [&] { z = z * 6364136223846793005ull + 1442695040888963407ull; return uint32_t(z >> 33); };
    for (const int64_t V : {int64_t(1), int64_t(5), int64_t(37), int64_t(300)})
        for (const int tp : {1, 2, 3, 4, 8})
            for (const int64_t k : {int64_t(1), int64_t(2), int64_t(7), int64_t(40), V}) {
                if (k > V) continue;
                std::vector<float> row(static_cast<size_t>(V));
                for (auto& v : row) v = float(next() % 16) / 4.0f;  // ties everywhere
                if (V > 3) row[size_t(next() % V)] = std::nanf("");
                const int64_t vpr = (V + tp - 1) / tp;
                std::vector<std::vector<float>> pv(static_cast<size_t>(tp));
                std::vector<std::vector<int32_t>> pi(static_cast<size_t>(tp));
                std::vector<CandidateList> parts;
                for (int r = 0; r < tp; ++r) {
                    const int64_t v0 = std::min<int64_t>(V, r * vpr), slice = std::min(vpr, V - v0);
                    const int64_t m = std::min(k, slice);
                    pv[size_t(r)].resize(size_t(m));
                    pi[size_t(r)].resize(size_t(m));
                    if (m > 0) {
                        topk_ref(row.data() + v0, slice, m, pv[size_t(r)].data(), pi[size_t(r)].data());
                        for (auto& id : pi[size_t(r)]) id += int32_t(v0);
                    }
                    parts.push_back({pv[size_t(r)].data(), pi[size_t(r)].data(), m});
                }
                std::vector<float> got_v(static_cast<size_t>(k)), want_v(static_cast<size_t>(k));
                std::vector<int32_t> got_i(static_cast<size_t>(k)), want_i(static_cast<size_t>(k));
                merge_candidates(parts, k, got_v.data(), got_i.data());
                topk_ref(row.data(), V, k, want_v.data(), want_i.data());
                ASSERT_EQ(got_i, want_i) << "V " << V << " tp " << tp << " k " << k;
            }
    const float v = 1.0f;
    const int32_t id = 0;
    float out_v;
    int32_t out_i;
    EXPECT_THROW(merge_candidates({{&v, &id, 1}}, 2, &out_v, &out_i), Error);
}

// token_logprobs: log-softmax of the row at temperature 1, NaN with probability 0 (as -inf), the
// top n in the ranking's order (ties by the lower id), and a row's probabilities summing to 1.
TEST(Sampler, LogprobsAreTheLogSoftmax) {
    const std::vector<float> lg = {1, 2, std::nanf(""), 3, -INFINITY, 2};
    const double lse = std::log(std::exp(1.0) + 2 * std::exp(2.0) + std::exp(3.0));
    const TokenLogprobs r = token_logprobs(lg.data(), 6, 5, 4);
    EXPECT_EQ(r.token.id, 5);
    EXPECT_NEAR(r.token.logprob, 2 - lse, 1e-6);
    ASSERT_EQ(r.top.size(), 4u);
    const int32_t want_ids[] = {3, 1, 5, 0};
    const double want_lp[] = {3 - lse, 2 - lse, 2 - lse, 1 - lse};
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(r.top[i].id, want_ids[i]) << i;
        EXPECT_NEAR(r.top[i].logprob, want_lp[i], 1e-6) << i;
    }
    // Ranks: 3 first, then 1 and 5 (tied, the lower id first), 0, the -inf 4, the NaN 2 last.
    const int64_t want_rank[] = {4, 2, 6, 1, 5, 3};
    for (int32_t id = 0; id < 6; ++id) EXPECT_EQ(token_logprobs(lg.data(), 6, id, 0).rank, want_rank[id]) << id;
    EXPECT_EQ(token_logprobs(lg.data(), 6, 2, 0).token.logprob, -INFINITY);  // NaN
    EXPECT_EQ(token_logprobs(lg.data(), 6, 4, 0).token.logprob, -INFINITY);
    EXPECT_TRUE(token_logprobs(lg.data(), 6, 0, 0).top.empty());
    // A wide row of large logits: float exp would overflow; double sums them.
    std::vector<float> wide(151936);
    uint64_t x = 7;
    for (float& v : wide) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        v = 80.0f + float(x >> 40) / float(1 << 24) * 20.0f;
    }
    const TokenLogprobs all = token_logprobs(wide.data(), int64_t(wide.size()), 0, int64_t(wide.size()));
    double total = 0;
    for (const Logprob& l : all.top) total += std::exp(double(l.logprob));
    EXPECT_NEAR(total, 1.0, 1e-4);
    for (size_t i = 1; i < all.top.size(); ++i) EXPECT_GE(all.top[i - 1].logprob, all.top[i].logprob);
    for (const size_t i : {size_t(0), size_t(17), all.top.size() - 1})  // the rank is the place in the top list
        EXPECT_EQ(token_logprobs(wide.data(), int64_t(wide.size()), all.top[i].id, 0).rank, int64_t(i) + 1) << i;
    EXPECT_THROW(token_logprobs(lg.data(), 6, 6, 0), Error);
    EXPECT_THROW(token_logprobs(lg.data(), 6, 0, 7), Error);
}
