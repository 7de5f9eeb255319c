// nucleus_mass_rows_cuda against the same sum on the CPU (kernels/cpu/nucleus.h): equal integers,
// since every weight is computed with operations that round alike on both and the sum is exact.
// Rows of 1 to 151936 logits with ties, NaN and -inf, three temperatures, the row maximum read at
// a stride (as from ranked candidates). Skips where no GPU is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/nucleus.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/nucleus.h"
#include "runtime/sampler.h"
#include "tests/kernels/cuda_test_util.h"

using namespace shardlm;
using shardlm::test::DeviceBuffer;

TEST(NucleusCuda, RowMassEqualsTheCpuSum) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    uint64_t z = 2024;
    auto next = [&] { z = z * 6364136223846793005ull + 1442695040888963407ull; return uint32_t(z >> 33); };
    for (const int64_t n : {int64_t(1), int64_t(7), int64_t(1000), int64_t(151936)}) {
        const int64_t rows = n > 10000 ? 1 : 3, stride = 5;
        for (const float t : {0.3f, 1.0f, 2.0f}) {
            std::vector<float> x(static_cast<size_t>(rows * n));
            for (auto& v : x) v = float(int(next() % 4001) - 2000) / 100.0f;  // ties, spread 40
            if (n > 1) {
                x[size_t(next() % x.size())] = std::nanf("");
                x[size_t(next() % x.size())] = -std::numeric_limits<float>::infinity();
            }
            std::vector<float> maxes(static_cast<size_t>(rows * stride), 0.0f);
            std::vector<uint64_t> want(static_cast<size_t>(rows), 0);
            for (int64_t r = 0; r < rows; ++r) {
                const float* xr = x.data() + r * n;
                const float mx = xr[argmax(xr, n)];
                maxes[size_t(r * stride)] = mx;
                for (int64_t i = 0; i < n; ++i) want[size_t(r)] += nucleus_weight(xr[i], mx, t);
            }
            DeviceBuffer<float> dx(x), dmax(maxes);
            DeviceBuffer<uint64_t> dmass(static_cast<size_t>(rows));
            nucleus_mass_rows_cuda(dx.get(), rows, n, dmax.get(), stride, t, dmass.get(), nullptr);
            EXPECT_EQ(dmass.download(), want) << "n " << n << " t " << t;
            EXPECT_GT(want[0], 0u);
        }
    }
    DeviceBuffer<float> one(std::vector<float>{1.0f});
    DeviceBuffer<uint64_t> mass(1);
    EXPECT_THROW(nucleus_mass_rows_cuda(one.get(), 1, kNucleusMaxRow + 1, one.get(), 1, 1.0f, mass.get(), nullptr),
                 Error);
    EXPECT_THROW(nucleus_mass_rows_cuda(one.get(), 1, 1, one.get(), 1, 0.0f, mass.get(), nullptr), Error);
}
