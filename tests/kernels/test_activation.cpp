#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/activation.h"

using namespace shardlm;

TEST(SiluMul, HandComputed) {
    const std::vector<float> g = {0, 1, -2, 10}, u = {5, 2, 1, 0.5f};
    std::vector<float> y(4);
    silu_mul_ref(g.data(), u.data(), y.data(), 4);
    EXPECT_EQ(y[0], 0.0f);
    EXPECT_NEAR(y[1], 2 * 0.7310585786f, 1e-6);
    EXPECT_NEAR(y[2], -2 * 0.1192029220f, 1e-6);
    EXPECT_NEAR(y[3], 0.5f * 10 * 0.9999546021f, 1e-5);
}
