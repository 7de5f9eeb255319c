#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/rmsnorm.h"

using namespace shardlm;

TEST(RmsNorm, HandComputed) {
    // x = [3, 4]: mean square 12.5, 1/sqrt(12.5) = 0.282842712...
    const std::vector<float> x = {3, 4}, w = {1, 2};
    std::vector<float> y(2);
    rmsnorm_ref(x.data(), w.data(), y.data(), 1, 2, 0.0f);
    EXPECT_NEAR(y[0], 3 * 0.28284271f, 1e-6);
    EXPECT_NEAR(y[1], 8 * 0.28284271f, 1e-6);
}

TEST(RmsNorm, EpsAndRowsAndInPlace) {
    std::vector<float> x = {1, 1, 1, 0, 0, 0};
    const std::vector<float> w = {1, 1, 1};
    rmsnorm_ref(x.data(), w.data(), x.data(), 2, 3, 1.0f);
    // row 0: 1/sqrt(1 + 1); row 1 stays zero
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(x[size_t(i)], 1 / std::sqrt(2.0f), 1e-6);
    for (int i = 3; i < 6; ++i) EXPECT_EQ(x[size_t(i)], 0.0f);
}
