#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/rmsnorm.h"
#include "tests/kernels/int8_test_util.h"  // rand_vec

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

TEST(RmsNorm, EveryVariantMatchesTheReference) {
    // Lengths around the 16-lane vectors, a hidden size, rows of very different scales (the f64
    // mean square must not lose the small ones), in place.
    for (int64_t dim : {1, 15, 16, 17, 100, 128, 2048}) {
        const int64_t rows = 5;
        std::vector<float> x = test::rand_vec(size_t(rows * dim), uint32_t(dim), 3.0f);
        for (int64_t i = 0; i < dim; ++i) {
            x[size_t(dim + i)] *= 1e-18f;
            x[size_t(2 * dim + i)] *= 1e15f;
        }
        const std::vector<float> w = test::rand_vec(size_t(dim), 7);
        std::vector<float> ref(x.size()), got(x.size());
        rmsnorm_ref(x.data(), w.data(), ref.data(), rows, dim, 1e-6f);
        for (CpuIsa isa : cpu_isas_available()) {
            std::vector<float> y = x;
            rmsnorm(y.data(), w.data(), y.data(), rows, dim, 1e-6f, isa);
            for (size_t i = 0; i < y.size(); ++i)  // one f32 rounding of 1/sqrt apart at most
                ASSERT_NEAR(y[i], ref[i], 3e-7 * std::fabs(ref[i]) + 1e-30) << cpu_isa_name(isa) << " dim=" << dim << " i=" << i;
        }
    }
}
