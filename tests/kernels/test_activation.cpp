#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/activation.h"
#include "tests/kernels/int8_test_util.h"  // rand_vec

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

TEST(SiluMul, EveryVariantMatchesTheReference) {
    // Gates across the exponential's range: large of both signs (e^-g overflows to infinity or
    // vanishes), around zero, and the 16-lane tails; NaN stays NaN.
    std::vector<float> g = test::rand_vec(1003, 3, 30.0f), u = test::rand_vec(1003, 4, 2.0f);
    g[0] = -100.0f;
    g[1] = 100.0f;
    g[2] = -87.5f;
    g[3] = 0.0f;
    g[4] = 1e-30f;
    g[5] = NAN;
    for (size_t i = 6; i < 200; ++i) g[i] *= 0.01f;
    std::vector<float> ref(g.size());
    silu_mul_ref(g.data(), u.data(), ref.data(), int64_t(g.size()));
    for (CpuIsa isa : cpu_isas_available())
        for (int64_t n : {int64_t(1003), int64_t(16), int64_t(7)}) {
            std::vector<float> y(size_t(n), -1.0f);
            silu_mul(g.data(), u.data(), y.data(), n, isa);
            for (int64_t i = 0; i < n; ++i) {
                if (std::isnan(ref[size_t(i)])) {
                    EXPECT_TRUE(std::isnan(y[size_t(i)])) << cpu_isa_name(isa) << " i=" << i;
                    continue;
                }
                // e^-g within kSiluExpRelErr, then an add, a divide and a multiply rounded in f32
                ASSERT_NEAR(y[size_t(i)], ref[size_t(i)], (kSiluExpRelErr + 4.0 / (1 << 24)) * std::fabs(ref[size_t(i)]) + 1e-37)
                    << cpu_isa_name(isa) << " g=" << g[size_t(i)] << " i=" << i;
            }
        }
}
