// gather_columns_cuda against gather_columns (kernels/cpu/gather.h), and that against the element
// each index names, on awkward shapes: one part, several parts (an all-gather's blocks), a rank's
// share of a longer order, widths around the kernel's 1024-column blocks. Skips where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/gather.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gather.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using shardlm::test::DeviceBuffer;

namespace {

struct Case {
    int64_t T, part_cols, parts;
    int64_t width;  // the first `width` entries of a permutation of every column (a rank's share: fewer)
};

void check_gather(const Case& c) {
    SCOPED_TRACE("T " + std::to_string(c.T) + ", " + std::to_string(c.parts) + " parts of " +
                 std::to_string(c.part_cols) + ", width " + std::to_string(c.width));
    const int64_t cols = c.parts * c.part_cols;
    const std::vector<float> x = test::rand_vec(size_t(c.T * cols), uint32_t(c.T * 131 + cols), 3.0f);
    std::vector<int32_t> perm(static_cast<size_t>(cols));
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937 rng(uint32_t(cols + c.width));
    std::shuffle(perm.begin(), perm.end(), rng);
    const std::vector<int32_t> order(perm.begin(), perm.begin() + c.width);

    std::vector<float> cpu(static_cast<size_t>(c.T * c.width));
    gather_columns(x.data(), c.T, c.part_cols, c.parts, order.data(), c.width, cpu.data());
    for (int64_t t = 0; t < c.T; ++t)
        for (int64_t j = 0; j < c.width; ++j) {
            const int64_t col = order[size_t(j)], part = col / c.part_cols;
            const float want = x[size_t(part * c.T * c.part_cols + t * c.part_cols + col % c.part_cols)];
            ASSERT_EQ(cpu[size_t(t * c.width + j)], want) << "cpu row " << t << " column " << j;
        }

    DeviceBuffer<float> dx(x), dout(cpu.size());
    DeviceBuffer<int32_t> dorder(order);
    gather_columns_cuda(dx.get(), c.T, c.part_cols, c.parts, dorder.get(), c.width, dout.get(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(dout.download(), cpu);  // a copy: bit for bit
}

}  // namespace

TEST(GatherCuda, OnePart) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (const Case& c : {Case{1, 2048, 1, 2048}, Case{3, 1, 1, 1}, Case{7, 1100, 1, 1100}, Case{2, 1025, 1, 1025},
                          Case{5, 96, 1, 96}})
        check_gather(c);
}

// A row-parallel layer split over ranks: every rank's [T, part_cols] block, each rank reading its
// share of the columns sorted by group (width below the whole input).
TEST(GatherCuda, SeveralParts) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (const Case& c : {Case{1, 1536, 4, 1536}, Case{3, 37, 3, 111}, Case{4, 64, 2, 64}, Case{9, 300, 4, 1031}})
        check_gather(c);
}
