// silu_mul_cuda against silu_mul_ref: sizes around the float4 split and the grid-stride cap,
// aligned and misaligned pointers, in place; the rows variant with its W8A8 quantization against
// the two kernels it fuses; skips where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/w8a8.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using shardlm::test::DeviceBuffer;

namespace {

// expf is within 2 ulp on the GPU and std::exp within 1 on the CPU; the rest is one division and
// one product rounded the same way: a few ulp relative.
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, const char* what) {
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], ref[i], 1e-30 + 2e-6 * std::fabs(ref[i])) << what << " n " << ref.size() << " at " << i;
}

// gate and up of n values, the first few extreme: +-0, large negative (exp overflows to inf, the
// result is -0), large positive (silu(g) = g).
void make_inputs(int64_t n, std::vector<float>& gate, std::vector<float>& up) {
    gate = test::rand_vec(size_t(n), uint32_t(n), 12.0f);
    up = test::rand_vec(size_t(n), uint32_t(n + 1), 3.0f);
    const float extremes[] = {0.0f, -0.0f, -100.0f, 100.0f, -88.0f, 89.0f, 1e-20f, -1e-20f};
    for (size_t i = 0; i < gate.size() && i < 8; ++i) gate[i] = extremes[i];
}

}  // namespace

TEST(SiluMulCuda, MatchesReference) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    // Around the float4 tail, a block, and past 65535 blocks (the grid-stride loop of both kernels:
    // 65535 * 256 scalar elements, 4x that as float4).
    const int64_t sizes[] = {1, 3, 4, 5, 31, 33, 1000, 12289, 65535 * 256 + 77, 4 * 65535 * 256 + 7};
    for (const int64_t n : sizes) {
        std::vector<float> gate, up, ref(static_cast<size_t>(n));
        make_inputs(n, gate, up);
        silu_mul_ref(gate.data(), up.data(), ref.data(), n);
        // Aligned (cudaMalloc'ed, the float4 kernel).
        DeviceBuffer<float> dg(gate), du(up), dout(ref.size());
        silu_mul_cuda(dg.get(), du.get(), dout.get(), n, nullptr);
        expect_close(dout.download(), ref, "aligned");
        // In place: out == gate.
        silu_mul_cuda(dg.get(), du.get(), dg.get(), n, nullptr);
        expect_close(dg.download(), ref, "in place");
        if (n > 65535 * 256 + 77) continue;  // the largest only aligned (memory)
        // Misaligned by one float (the scalar kernel).
        std::vector<float> g1(gate.size() + 1), u1(up.size() + 1);
        std::copy(gate.begin(), gate.end(), g1.begin() + 1);
        std::copy(up.begin(), up.end(), u1.begin() + 1);
        DeviceBuffer<float> dg1(g1), du1(u1), dout1(g1.size());
        silu_mul_cuda(dg1.get() + 1, du1.get() + 1, dout1.get() + 1, n, nullptr);
        std::vector<float> got = dout1.download();
        got.erase(got.begin());
        expect_close(got, ref, "misaligned");
    }
}

TEST(SiluMulCuda, RowsOfAFusedGateUp) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (const auto& s : {std::pair<int64_t, int64_t>{1, 1}, {3, 33}, {8, 6144}, {300, 257}}) {
        const int64_t T = s.first, inter = s.second;
        std::vector<float> gate, up, ref(static_cast<size_t>(T * inter)), gu(static_cast<size_t>(2 * T * inter));
        make_inputs(T * inter, gate, up);
        silu_mul_ref(gate.data(), up.data(), ref.data(), T * inter);
        for (int64_t t = 0; t < T; ++t) {  // [T, gate | up]
            std::copy(gate.begin() + t * inter, gate.begin() + (t + 1) * inter, gu.begin() + 2 * t * inter);
            std::copy(up.begin() + t * inter, up.begin() + (t + 1) * inter, gu.begin() + (2 * t + 1) * inter);
        }
        DeviceBuffer<float> dgu(gu), dout(ref.size());
        silu_mul_rows_cuda(dgu.get(), T, inter, dout.get(), nullptr);
        expect_close(dout.download(), ref, "rows");
    }
}

// SwiGLU writing a prefill GEMM's 16-bit input (silu_mul_rows_half_cuda): silu_mul_rows_cuda's
// rows as the GEMM's conversion would write them (both types, natural and interleaved column
// order), bit for bit; shapes it cannot take are handed back (false).
TEST(SiluMulCuda, RowsHalfOutputIsTheGemmsConversion) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    struct Shape { int64_t T, inter; int ic; };
    for (const Shape sh : {Shape{3, 36, 0}, Shape{9, 6144, 16}, Shape{2, 512, 8}, Shape{300, 256, 16}})
        for (const DType t : {DType::F16, DType::BF16}) {
            const int64_t T = sh.T, inter = sh.inter;
            const std::vector<float> gu = test::rand_vec(size_t(T * 2 * inter), uint32_t(inter + 3), 6.0f);
            DeviceBuffer<float> dgu(gu), out(size_t(T * inter));
            DeviceBuffer<uint16_t> dh(size_t(T * inter));
            ASSERT_TRUE(silu_mul_rows_half_cuda(dgu.get(), T, inter, {dh.get(), t, sh.ic}, nullptr));
            silu_mul_rows_cuda(dgu.get(), T, inter, out.get(), nullptr);
            EXPECT_EQ(dh.download(), test::half_input_ref(out.download(), inter, t, sh.ic))
                << "inter " << inter << " " << dtype_name(t) << " ic " << sh.ic;
            if (HasFailure()) return;
        }
    DeviceBuffer<float> gu(128);
    DeviceBuffer<uint16_t> h(64);
    EXPECT_FALSE(silu_mul_rows_half_cuda(gu.get(), 2, 30, {h.get(), DType::F16, 0}, nullptr));
    EXPECT_FALSE(silu_mul_rows_half_cuda(gu.get() + 1, 2, 28, {h.get(), DType::F16, 0}, nullptr));  // misaligned
}

// SwiGLU that quantizes its rows for a W8A8 projection: out, q and the scales bit for bit those of
// silu_mul_rows_cuda followed by quantize_acts_cuda, on the vector path (1 to 16 float4s per
// thread) and the fallback (inter % 4 != 0, rows beyond 32768); a zero row gives scale 0.
TEST(SiluMulCuda, RowsQuantizedEqualTheTwoKernels) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (const int64_t inter : {int64_t(4), int64_t(100), int64_t(2052), int64_t(6144), int64_t(32768), int64_t(7),
                                int64_t(32772)}) {
        const int64_t T = 3;
        std::vector<float> gu = test::rand_vec(size_t(T * 2 * inter), uint32_t(inter), 6.0f);
        std::fill(gu.begin() + 2 * 2 * inter, gu.end(), 0.0f);  // the last row: silu(0) * 0
        DeviceBuffer<float> dgu(gu), out(size_t(T * inter)), out2(size_t(T * inter)), sc(3), sc2(3);
        DeviceBuffer<int8_t> q(size_t(T * inter)), q2(size_t(T * inter));
        silu_mul_rows_quantize_cuda(dgu.get(), T, inter, out.get(), q.get(), sc.get(), nullptr);
        silu_mul_rows_cuda(dgu.get(), T, inter, out2.get(), nullptr);
        quantize_acts_cuda(out2.get(), T, inter, inter, q2.get(), sc2.get(), nullptr);
        EXPECT_EQ(out.download(), out2.download()) << "inter " << inter;
        EXPECT_EQ(q.download(), q2.download()) << "inter " << inter;
        const std::vector<float> scales = sc.download();
        EXPECT_EQ(scales, sc2.download()) << "inter " << inter;
        EXPECT_GT(scales[0], 0.0f) << "inter " << inter;
        EXPECT_EQ(scales[2], 0.0f) << "inter " << inter;
        if (HasFailure()) return;
    }
}

TEST(SiluMulCuda, ClosedForm) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    // silu(0) = 0, silu(x) -> x for large x, -> -0 for very negative x; silu(1) = 1 / (1 + 1/e).
    const std::vector<float> gate = {0.0f, 100.0f, -200.0f, 1.0f}, up = {5.0f, 2.0f, 3.0f, 1.0f};
    DeviceBuffer<float> dg(gate), du(up), dout(gate.size());
    silu_mul_cuda(dg.get(), du.get(), dout.get(), 4, nullptr);
    const std::vector<float> got = dout.download();
    EXPECT_EQ(got[0], 0.0f);
    EXPECT_EQ(got[1], 200.0f);
    EXPECT_EQ(got[2], 0.0f);
    EXPECT_TRUE(std::signbit(got[2]));
    EXPECT_NEAR(got[3], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}
