// apply_penalties_cuda against apply_penalties_ref (kernels/cpu/penalty.h), bit for bit (a NaN
// only as a NaN: x86 passes the input's payload through, the GPU returns its canonical NaN): random
// rows and entries with ids inside and outside a rank's slice, repetition above and below 1,
// special values, and a product whose rounding a fused multiply-add would change.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/cuda/penalty.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using shardlm::test::DeviceBuffer;

namespace {

void check(const std::vector<float>& logits, int64_t vocab, int32_t id_offset, const std::vector<PenaltyEntry>& e) {
    std::vector<float> want = logits;
    apply_penalties_ref(want.data(), vocab, id_offset, e.data(), int64_t(e.size()));
    DeviceBuffer<float> dl(logits);
    DeviceBuffer<PenaltyEntry> de(e);
    apply_penalties_cuda(dl.get(), vocab, id_offset, de.get(), int64_t(e.size()), nullptr);
    const std::vector<float> got = dl.download();
    for (size_t i = 0; i < want.size(); ++i)
        ASSERT_TRUE(std::isnan(want[i]) ? std::isnan(got[i]) : std::memcmp(&got[i], &want[i], sizeof(float)) == 0)
            << "logit " << i << " of " << want.size() << ": " << got[i] << " vs " << want[i];
}

}  // namespace

TEST(PenaltyCuda, MatchesReferenceOnRandomRows) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    std::mt19937 rng(7);
    for (const int64_t vocab : {int64_t(1), int64_t(37), int64_t(1000), int64_t(75968)}) {
        for (const int32_t id_offset : {0, 5000}) {
            const int64_t rows = 3;
            const std::vector<float> logits = test::rand_vec(size_t(rows * vocab), uint32_t(vocab), 20.0f);
            std::vector<PenaltyEntry> e;
            for (int32_t r = 0; r < rows; ++r) {
                // Distinct ids per row: a shuffled stretch around the slice, some outside it.
                std::vector<int32_t> ids;
                for (int64_t j = -3; j < std::min<int64_t>(vocab, 600) + 3; ++j) ids.push_back(int32_t(id_offset + j));
                std::shuffle(ids.begin(), ids.end(), rng);
                ids.resize(std::min<size_t>(ids.size(), 300));
                std::uniform_real_distribution<float> rep(0.5f, 2.0f), off(-1.0f, 3.0f);
                for (int32_t id : ids) {
                    if (id < 0) continue;
                    e.push_back({r, id, rep(rng), off(rng)});
                }
            }
            check(logits, vocab, id_offset, e);
        }
    }
}

TEST(PenaltyCuda, SpecialValuesAndSeparateRounding) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const float x = -(1.0f + std::ldexp(1.0f, -23)), r = 1.0f + std::ldexp(1.0f, -23);
    const float off = -(1.0f + std::ldexp(1.0f, -22));
    const std::vector<float> logits = {inf, -inf, nan, 0.0f, -0.0f, x, 1e-40f, -1e-40f};
    const std::vector<PenaltyEntry> e = {{0, 0, 2.0f, 1.0f}, {0, 1, 2.0f, 1.0f}, {0, 2, 2.0f, 1.0f},
                                         {0, 3, 1.3f, 0.1f}, {0, 4, 1.3f, 0.0f}, {0, 5, r, off},
                                         {0, 6, 3.0f, 0.0f}, {0, 7, 3.0f, 0.0f}};
    check(logits, 8, 0, e);
}
