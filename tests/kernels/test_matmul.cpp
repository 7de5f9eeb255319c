#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/matmul.h"

using namespace shardlm;

namespace {

struct Mat {
    std::vector<float> f32;
    std::vector<uint16_t> h16;
    WeightView view(DType dt, int64_t rows, int64_t cols) {
        if (dt == DType::F32) return {dt, f32.data(), rows, cols};
        h16.resize(f32.size());
        for (size_t i = 0; i < f32.size(); ++i) h16[i] = dt == DType::F16 ? f32_to_f16(f32[i]) : f32_to_bf16(f32[i]);
        return {dt, h16.data(), rows, cols};
    }
};

std::vector<float> randv(size_t n, uint32_t seed) {
    std::vector<float> v(n);
    uint32_t s = seed * 2654435761u + 1;
    for (auto& x : v) {
        s = s * 1664525u + 1013904223u;
        x = float(int32_t(s >> 8) % 2001 - 1000) / 1000.0f;
    }
    return v;
}

}  // namespace

TEST(Matmul, ReferenceClosedForm) {
    // W = [[1, 2], [3, 4], [5, 6]], x = [[1, 1], [2, -1]] -> y = x W^T + b
    std::vector<float> w = {1, 2, 3, 4, 5, 6}, x = {1, 1, 2, -1}, b = {0.5f, 0, -1}, y(6);
    matmul_ref(x.data(), 2, {DType::F32, w.data(), 3, 2}, b.data(), y.data());
    const std::vector<float> want = {3.5f, 7, 10, 0.5f, 2, 3};
    EXPECT_EQ(y, want);
}

TEST(Matmul, OptimisedMatchesReferenceOnAwkwardShapes) {
    // n = 5..8: the GEMVs' second pass over each tile; 9 and 70: the GEMMs.
    const int64_t shapes[][3] = {{1, 1, 1},     {1, 7, 3},    {3, 33, 17},   {4, 64, 64},  {5, 100, 31}, {6, 9, 40},
                                 {7, 37, 24},   {8, 70, 33},  {9, 129, 65},  {70, 40, 257}, {1, 2048, 300}};
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
        for (const auto& s : shapes) {
            const int64_t n = s[0], rows = s[1], cols = s[2];
            Mat m{randv(size_t(rows * cols), uint32_t(rows + cols)), {}};
            const WeightView w = m.view(dt, rows, cols);
            const auto x = randv(size_t(n * cols), 7);
            const auto bias = randv(size_t(rows), 9);
            std::vector<float> ref(static_cast<size_t>(n * rows)), got(size_t(n * rows));
            matmul_ref(x.data(), n, w, bias.data(), ref.data());
            for (CpuIsa isa : cpu_isas_available()) {
                std::fill(got.begin(), got.end(), NAN);
                matmul(x.data(), n, w, bias.data(), got.data(), isa);
                for (size_t i = 0; i < ref.size(); ++i)
                    ASSERT_NEAR(got[i], ref[i], 1e-5 + 1e-5 * std::fabs(ref[i]) + 2e-6 * double(cols))
                        << dtype_name(dt) << " " << cpu_isa_name(isa) << " n=" << n << " rows=" << rows
                        << " cols=" << cols << " i=" << i;
            }
        }
    }
}

TEST(Matmul, ReportsItsIsa) {
    const std::string isa = matmul_isa();
    EXPECT_TRUE(isa == "amx" || isa == "avx512" || isa == "avx2" || isa == "scalar") << isa;
}

// values_to_f32 (what the loader and the quantizers widen rows with): every F16 bit pattern, from a
// byte-misaligned source, against the scalar conversion (a NaN stays NaN; F16C quiets a signalling
// one); BF16 and F32 exactly.
TEST(ValuesToF32, EveryHalfPatternFromAMisalignedSource) {
    const int64_t n = 65536 + 5;  // a tail past the 8-value vectors
    std::vector<uint8_t> bytes(size_t(n) * 2 + 1);
    for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = uint16_t(i);
        std::memcpy(bytes.data() + 1 + 2 * i, &h, 2);
    }
    std::vector<float> out(static_cast<size_t>(n));
    values_to_f32(DType::F16, bytes.data() + 1, n, out.data());
    for (int64_t i = 0; i < n; ++i) {
        const float want = f16_to_f32(uint16_t(i));
        if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(out[size_t(i)])) << i;
        } else {
            uint32_t a, b;
            std::memcpy(&a, &want, 4);
            std::memcpy(&b, &out[size_t(i)], 4);
            ASSERT_EQ(a, b) << "f16 pattern " << i;
        }
    }
    values_to_f32(DType::BF16, bytes.data() + 1, n, out.data());
    for (int64_t i = 0; i < n; ++i) {
        const float want = bf16_to_f32(uint16_t(i));
        ASSERT_EQ(0, std::memcmp(&want, &out[size_t(i)], 4)) << "bf16 pattern " << i;
    }
    const std::vector<float> f = {1.5f, -0.0f, 3e38f};
    values_to_f32(DType::F32, f.data(), 3, out.data());
    EXPECT_EQ(0, std::memcmp(f.data(), out.data(), 12));
    EXPECT_ANY_THROW(values_to_f32(DType::I8, f.data(), 3, out.data()));
}
