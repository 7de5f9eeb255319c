// The tensor-core fragment layout of kernels/cuda/mma.h: one m16n8k16 product through it, by the
// instruction and by the shuffle form, against a plain product. The values are multiples of 1/8
// up to 4 in magnitude, so every product and every partial sum is exact in FP32 and the results
// must be equal, not close: a fragment register read from the wrong row or column changes some
// element. On a GPU (sm_80 and later) the first product is the hardware's; on the CPU emulator it is
// the emulator's model of the instruction (tests/cuda_emu/cuda_emu.h), written from the same table
// independently of the shuffle form. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/mma_check.h"
#include "tests/kernels/cuda_test_util.h"

using namespace shardlm;
using shardlm::test::DeviceBuffer;

namespace {

std::vector<float> eighths(size_t n, uint32_t seed) {
    std::vector<float> v(n);
    uint32_t s = seed * 2654435761u + 11;
    for (auto& x : v) {
        s = s * 1664525u + 1013904223u;
        x = float(int32_t(s >> 9) % 65 - 32) / 8.0f;  // -4 .. 4 in steps of 1/8
    }
    return v;
}

std::vector<uint16_t> to_f16(const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f16(v[i]);
    return h;
}

}  // namespace

TEST(MmaCuda, FragmentLayoutGivesThePlainProduct) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (uint32_t seed = 1; seed <= 4; ++seed) {
        const std::vector<float> a = eighths(16 * 16, seed), b = eighths(16 * 8, seed + 100),
                                 c = eighths(16 * 8, seed + 200);
        std::vector<float> want(16 * 8);
        for (int i = 0; i < 16; ++i)
            for (int j = 0; j < 8; ++j) {
                double s = c[size_t(i * 8 + j)];
                for (int k = 0; k < 16; ++k) s += double(a[size_t(i * 16 + k)]) * b[size_t(k * 8 + j)];
                want[size_t(i * 8 + j)] = float(s);
            }
        DeviceBuffer<uint16_t> da(to_f16(a)), db(to_f16(b));
        DeviceBuffer<float> dc(c), d_mma(16 * 8), d_shuffle(16 * 8);
        mma_product_cuda(da.get(), db.get(), dc.get(), d_mma.get(), d_shuffle.get(), nullptr);
        const std::vector<float> got_mma = d_mma.download(), got_shuffle = d_shuffle.download();
        for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ(got_mma[i], want[i]) << "instruction, seed " << seed << ", D[" << i / 8 << "][" << i % 8 << "]";
            ASSERT_EQ(got_shuffle[i], want[i]) << "shuffle form, seed " << seed << ", D[" << i / 8 << "][" << i % 8 << "]";
        }
    }
}

// The start-up check the tensor-core paths rely on (mma_check.h: prefill_tensor_cores() and the
// tensor-core GEMV are off where it fails): it must hold where the layout test above passes.
TEST(MmaCuda, StartupLayoutCheckHolds) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    EXPECT_TRUE(mma_layout_holds());
}
