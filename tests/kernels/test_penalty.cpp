// apply_penalties_ref (kernels/cpu/penalty.h) on values worked out by hand: the repetition
// penalty divides positive logits and multiplies the others, the offset is subtracted after it,
// each rounded on its own; ids outside the rank's slice are skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/penalty.h"

using namespace shardlm;

namespace {
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }
}  // namespace

TEST(Penalty, RepetitionDividesPositiveAndMultipliesTheRestThenOffset) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(penalize(3.0f, 1.5f, 0.0f), 2.0f);
    EXPECT_EQ(penalize(-3.0f, 1.5f, 0.0f), -4.5f);
    EXPECT_EQ(penalize(3.0f, 0.5f, 0.0f), 6.0f);  // a repetition below 1 favours the token
    EXPECT_EQ(penalize(0.0f, 2.0f, 0.75f), -0.75f);
    EXPECT_EQ(penalize(4.0f, 2.0f, 0.5f), 1.5f);
    EXPECT_EQ(penalize(4.0f, 1.0f, -1.0f), 5.0f);  // a negative offset favours the token
    EXPECT_EQ(penalize(inf, 2.0f, 1.0f), inf);
    EXPECT_EQ(penalize(-inf, 2.0f, 1.0f), -inf);
    EXPECT_TRUE(std::isnan(penalize(nan, 2.0f, 1.0f)));
    // Rounded separately: x * r = -(1 + 2^-22 + 2^-46) rounds to -(1 + 2^-22), and subtracting
    // -(1 + 2^-22) leaves exactly 0; a fused multiply-add would keep -2^-46.
    const float x = -(1.0f + std::ldexp(1.0f, -23)), r = 1.0f + std::ldexp(1.0f, -23);
    const float off = -(1.0f + std::ldexp(1.0f, -22));
    EXPECT_TRUE(same_bits(penalize(x, r, off), 0.0f)) << penalize(x, r, off);
    EXPECT_NE(std::fma(x, r, -off), 0.0f);
}

TEST(Penalty, EntriesHitTheirRowsAndOnlyTheSlice) {
    // Two rows of the slice [100, 106).
    std::vector<float> logits = {1, 2, 3, 4, 5, 6, -1, -2, -3, -4, -5, -6};
    const std::vector<PenaltyEntry> entries = {
        {0, 100, 2.0f, 0.0f},  // row 0, first of the slice: 1 / 2
        {0, 105, 1.0f, 1.5f},  // row 0, last: 6 - 1.5
        {1, 103, 2.0f, 1.0f},  // row 1: -4 * 2 - 1
        {1, 99, 2.0f, 1.0f},   // below the slice: skipped
        {1, 106, 2.0f, 1.0f},  // above it: skipped
        {0, 103, 4.0f, 0.0f},  // row 0: 4 / 4
    };
    apply_penalties_ref(logits.data(), 6, 100, entries.data(), int64_t(entries.size()));
    const std::vector<float> want = {0.5f, 2, 3, 1, 5, 4.5f, -1, -2, -3, -9, -5, -6};
    EXPECT_EQ(logits, want);
}
