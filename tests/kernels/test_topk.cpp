// topk_ref and topk_before (kernels/cpu/topk.h) against a brute-force full sort written without
// them: small random rows full of ties, signed zeros, infinities and NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/topk.h"

using namespace shardlm;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// The whole ranking by a full sort on (is NaN, -value with -0 read as +0, index).
std::vector<int32_t> brute_ranking(const std::vector<float>& x) {
    std::vector<std::tuple<int, float, int32_t>> t;
    for (size_t i = 0; i < x.size(); ++i) {
        const bool nan = std::isnan(x[i]);
        t.emplace_back(nan ? 1 : 0, nan ? 0.0f : -(x[i] + 0.0f), int32_t(i));
    }
    std::sort(t.begin(), t.end());
    std::vector<int32_t> ids;
    for (const auto& e : t) ids.push_back(std::get<2>(e));
    return ids;
}

}  // namespace

TEST(TopK, BeforeOrdersValuesThenIndices) {
    EXPECT_TRUE(topk_before(2.0f, 9, 1.0f, 0));
    EXPECT_FALSE(topk_before(1.0f, 0, 2.0f, 9));
    EXPECT_TRUE(topk_before(1.0f, 3, 1.0f, 4));  // ties: the lower index first
    EXPECT_FALSE(topk_before(1.0f, 4, 1.0f, 3));
    EXPECT_FALSE(topk_before(1.0f, 4, 1.0f, 4));
    EXPECT_TRUE(topk_before(-0.0f, 1, 0.0f, 2));  // -0 == +0
    EXPECT_TRUE(topk_before(0.0f, 1, -0.0f, 2));
    EXPECT_FALSE(topk_before(-0.0f, 2, 0.0f, 1));
    EXPECT_TRUE(topk_before(-kInf, 7, kNaN, 0));  // NaN after every number, -inf included
    EXPECT_FALSE(topk_before(kNaN, 0, -kInf, 7));
    EXPECT_TRUE(topk_before(kNaN, 0, -kNaN, 1));  // NaNs tie with each other, whatever the sign
    EXPECT_FALSE(topk_before(kNaN, 1, kNaN, 0));
    EXPECT_TRUE(topk_before(kInf, 5, std::numeric_limits<float>::max(), 0));
}

TEST(TopK, RefMatchesFullSort) {
    const float pool[] = {-2.0f, -1.0f, -0.0f, 0.0f, 0.5f, 1.0f, 1.0f, 3.0f, kInf, -kInf, kNaN, -kNaN,
                          std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min()};
    const int pool_n = int(sizeof(pool) / sizeof(pool[0]));
    uint32_t s = 12345;
    auto next = [&s] { return (s = s * 1664525u + 1013904223u) >> 8; };
    for (int trial = 0; trial < 400; ++trial) {
        const int64_t n = 1 + int64_t(next() % 120);
        std::vector<float> x(static_cast<size_t>(n));
        // Some rows draw from a small pool (many ties and special values), others are mostly NaN
        // or mostly one value.
        const int mode = trial % 4;
        for (auto& v : x) {
            const int r = int(next() % 100);
            if (mode == 0) v = pool[next() % uint32_t(pool_n)];
            else if (mode == 1) v = r < 80 ? kNaN : float(int(next() % 7) - 3);
            else if (mode == 2) v = r < 70 ? 1.0f : pool[next() % uint32_t(pool_n)];
            else v = float(int(next() % 2001) - 1000) / 100.0f;
        }
        const std::vector<int32_t> want = brute_ranking(x);
        for (const int64_t k : {int64_t(1), int64_t(2), n / 2 + 1, n - 1, n}) {
            if (k < 1 || k > n) continue;
            std::vector<float> vals(static_cast<size_t>(k));
            std::vector<int32_t> ids(static_cast<size_t>(k));
            topk_ref(x.data(), n, k, vals.data(), ids.data());
            for (int64_t i = 0; i < k; ++i) {
                ASSERT_EQ(ids[size_t(i)], want[size_t(i)]) << "trial " << trial << " n " << n << " k " << k << " #" << i;
                ASSERT_TRUE(same_bits(vals[size_t(i)], x[size_t(want[size_t(i)])])) << "trial " << trial << " #" << i;
            }
        }
    }
}

TEST(TopK, RefSpecialRows) {
    // Fewer numbers than k: the NaNs follow, lowest index first, with their own bits.
    const float neg_nan = -kNaN;
    const std::vector<float> x = {kNaN, 2.0f, neg_nan, -kInf, -0.0f, kNaN, 0.0f};
    std::vector<float> vals(7);
    std::vector<int32_t> ids(7);
    topk_ref(x.data(), 7, 7, vals.data(), ids.data());
    EXPECT_EQ(ids, (std::vector<int32_t>{1, 4, 6, 3, 0, 2, 5}));
    for (size_t i = 0; i < 7; ++i) EXPECT_TRUE(same_bits(vals[i], x[size_t(ids[i])])) << i;
    EXPECT_TRUE(std::signbit(vals[1]));  // -0.0 at index 4 comes back as -0.0
}

TEST(TopK, RefRejectsBadK) {
    const std::vector<float> x = {1, 2, 3};
    float v[4];
    int32_t i[4];
    EXPECT_THROW(topk_ref(x.data(), 3, 0, v, i), Error);
    EXPECT_THROW(topk_ref(x.data(), 3, 4, v, i), Error);
    EXPECT_THROW(topk_ref(x.data(), 0, 1, v, i), Error);
    EXPECT_NO_THROW(topk_ref(x.data(), 3, 3, v, i));
}
