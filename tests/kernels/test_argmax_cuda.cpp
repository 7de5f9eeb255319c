// argmax_rows_cuda against the CPU sampler's argmax (runtime/sampler.h): vocabularies up to 256k,
// both load paths, ties, NaN and -inf; skips where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cuda/argmax.h"
#include "kernels/cuda/device.h"
#include "runtime/sampler.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using shardlm::test::DeviceBuffer;

namespace {

// Runs argmax_rows_cuda on rows x vocab logits placed `offset` floats into the device buffer
// (offset 1 forces the scalar path), and compares each row with the CPU argmax.
void check_rows(const std::vector<float>& logits, int64_t rows, int64_t vocab, int64_t offset) {
    std::vector<float> padded(size_t(offset) + logits.size(), 0.0f);
    std::copy(logits.begin(), logits.end(), padded.begin() + offset);
    DeviceBuffer<float> dl(padded);
    DeviceBuffer<int32_t> dout(std::vector<int32_t>(size_t(rows), -7));
    DeviceBuffer<float> dval(std::vector<float>(size_t(rows), -7.0f));
    const int32_t id_offset = offset == 0 ? 0 : 1000;
    argmax_rows_cuda(dl.get() + offset, rows, vocab, id_offset, dval.get(), dout.get(), nullptr);
    const std::vector<int32_t> got = dout.download();
    const std::vector<float> got_val = dval.download();
    for (int64_t r = 0; r < rows; ++r) {
        const int32_t want = argmax(logits.data() + r * vocab, vocab);
        ASSERT_EQ(got[size_t(r)], want + id_offset) << rows << "x" << vocab << " offset " << offset << " row " << r;
        const float want_val = logits[size_t(r * vocab + want)];
        ASSERT_TRUE(std::memcmp(&got_val[size_t(r)], &want_val, sizeof(float)) == 0) << "value of row " << r;
    }
}

}  // namespace

TEST(ArgmaxCuda, MatchesSamplerArgmax) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    const int64_t shapes[][2] = {{1, 1}, {3, 5}, {2, 1023}, {4, 1024}, {4, 1025}, {3, 4099},
                                 {2, 151936}, {1, 256000}, {5, 262147}, {70, 4096}};
    for (const auto& s : shapes) {
        const int64_t rows = s[0], vocab = s[1];
        std::vector<float> logits = test::rand_vec(size_t(rows * vocab), uint32_t(vocab), 30.0f);
        // Plant ties of a value above the random range: row r gets it at several places, so the
        // lowest must win over ones found earlier by other threads or warps.
        for (int64_t r = 0; r < rows; ++r) {
            float* row = logits.data() + r * vocab;
            const int64_t spots[] = {vocab - 1, vocab / 2 + 1, (r * 977) % vocab, vocab - 2, 4 * 1024 % vocab};
            for (int64_t j = 0; j < 5 - (r % 3); ++j)
                if (spots[j] >= 0 && spots[j] < vocab) row[spots[j]] = 50.0f;  // vocab 1: vocab / 2 + 1 is past the row
        }
        for (const int64_t offset : {0, 1}) check_rows(logits, rows, vocab, offset);
    }
}

TEST(ArgmaxCuda, SpecialValues) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    // NaN is never taken over a number, wherever it stands; an all-NaN row gives 0; -inf ties go
    // to the first; -0 and +0 are equal.
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const int64_t vocab = 8;
    const std::vector<std::vector<float>> rows = {
        {nan, 1, 2, 3, 4, 5, 6, 7},           {1, nan, 2, 9, nan, 9, 0, 0},
        {nan, nan, nan, nan, nan, nan, nan, nan}, {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf},
        {-inf, nan, -inf, -inf, -inf, -inf, -inf, -inf}, {-0.0f, 0.0f, -1, -1, -1, -1, -1, -1},
        {1, 2, 3, inf, 4, inf, nan, 5},       {-3, -2, -1, -1, -5, -6, -7, -2},
    };
    const std::vector<int32_t> expected = {7, 3, 0, 0, 0, 0, 3, 2};
    std::vector<float> logits;
    for (const auto& r : rows) logits.insert(logits.end(), r.begin(), r.end());
    for (size_t r = 0; r < rows.size(); ++r) ASSERT_EQ(argmax(rows[r].data(), vocab), expected[r]) << "CPU row " << r;
    for (const int64_t offset : {0, 1}) check_rows(logits, int64_t(rows.size()), vocab, offset);
}
