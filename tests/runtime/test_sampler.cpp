#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "core/error.h"
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

TEST(Sampler, BadOptions) {
    SamplerOptions o;
    o.top_p = 0;
    EXPECT_THROW(Sampler(o, 0), Error);
    o.top_p = 1;
    o.temperature = -1;
    EXPECT_THROW(Sampler(o, 0), Error);
}
