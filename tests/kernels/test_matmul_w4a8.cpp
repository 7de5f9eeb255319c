// matmul_w4a8 (INT4 weights x INT8 activations): a closed form of the reference, every CPU variant
// against the reference on awkward shapes (chunk tails, groups below, at and above 128, activation
// and weight groups that differ), its distance to W4A16, and a wrong min or scale being seen.
//
// Tolerance: the INT32 dots are exact; the kernels round sw * sa, the scaled dot, the min term and
// the f32 sums over groups and lanes, the reference the dequantized weight q * s + min. So each
// output gets (groups + 24) * u * (sum_k |xq_k| sa (15 s + |min|) + |b|) + 1e-7.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

// Largest |got - ref| / bound over all outputs (<= 1 passes).
double worst_w4a8(const QuantizedActs& a, const WeightView& w, const float* bias, const std::vector<float>& got,
                  const std::vector<float>& ref) {
    const int64_t cols = w.cols, ga = a.group_size, gw = w.group_size;
    const int64_t groups = cols / std::min(ga, gw);
    double worst = 0;
    for (int64_t r = 0; r < w.rows; ++r)
        for (int64_t t = 0; t < a.n; ++t) {
            double mag = bias ? std::fabs(bias[r]) : 0.0;
            for (int64_t k = 0; k < cols; ++k) {
                const size_t wi = size_t(r * (cols / gw) + k / gw);
                mag += std::fabs(double(a.q[t * cols + k])) * a.scales[t * (cols / ga) + k / ga] *
                       (15.0 * w.scales[wi] + std::fabs(w.mins[wi]));
            }
            const double bound = double(groups + 24) * kU * mag + 1e-7;
            const size_t i = size_t(t * w.rows + r);
            worst = std::max(worst, std::fabs(double(got[i]) - ref[i]) / bound);
        }
    return worst;
}

}  // namespace

TEST(MatmulW4A8, ReferenceClosedForm) {
    // One row of 32 codes: columns 0..15 in the low nibbles (code 1), 16..31 in the high (code 2),
    // scale 0.5, min -1: w = -0.5 (cols 0..15) and 0 (16..31). Activations q = 3 with scale 0.25
    // (x = 0.75) on every column: y = 16 * -0.5 * 0.75 + 0 = -6, plus bias 1.
    std::vector<uint8_t> codes(16, uint8_t(1 | (2 << 4)));
    const float s = 0.5f, mn = -1.0f, sa = 0.25f, b = 1.0f;
    const std::vector<int8_t> q(32, 3);
    const QuantizedActs a{q.data(), &sa, 1, 32, 32};
    const WeightView w = int4_weight_view(codes.data(), &s, &mn, 1, 32, 32);
    float y = 0;
    matmul_w4a8_ref(a, w, &b, &y);
    EXPECT_EQ(y, -5.0f);
    for (CpuIsa isa : cpu_isas_available()) {
        float z = NAN;
        matmul_w4a8(a, w, &b, &z, isa);
        EXPECT_EQ(z, -5.0f) << cpu_isa_name(isa);
    }
}

TEST(MatmulW4A8, EveryVariantMatchesTheReference) {
    // rows, cols, activation group, weight group: one block; a 3-block tail chunk with per-token
    // activations over groups of 32; groups of 128 (the fast path) and 64; a 1-block tail; a
    // weight group of 256 over activation groups of 128 (and the reverse); a group of 160 whose
    // chunks straddle groups; the shape of a 1.7B model's down_proj input.
    const int64_t shapes[][4] = {{1, 32, 32, 32},     {37, 96, 96, 32},    {70, 256, 128, 128}, {33, 384, 64, 64},
                                 {9, 544, 32, 32},    {65, 512, 128, 256}, {19, 512, 256, 128}, {17, 320, 160, 160},
                                 {40, 640, 640, 128}, {24, 6144, 128, 128}};
    const int64_t tokens[] = {1, 2, 3, 4, 5, 6, 8, 13, 40};  // 5-8: the AVX-512 GEMV in two passes
    for (const auto& s : shapes) {
        const int64_t rows = s[0], cols = s[1], ga = s[2], gw = s[3];
        const Int4Mat m = make_int4(rows, cols, gw, uint32_t(rows * 7 + cols));
        const WeightView w = m.view();
        const std::vector<float> bias = rand_vec(size_t(rows), 11);
        for (int64_t n : tokens) {
            const Acts a = make_acts(n, cols, ga, uint32_t(n * 3 + 1));
            std::vector<float> ref(size_t(n * rows)), got(ref.size());
            matmul_w4a8_ref(a.view, w, bias.data(), ref.data());
            for (CpuIsa isa : cpu_isas_available()) {
                std::fill(got.begin(), got.end(), NAN);
                matmul_w4a8(a.view, w, bias.data(), got.data(), isa);
                ASSERT_LE(worst_w4a8(a.view, w, bias.data(), got, ref), 1.0)
                    << cpu_isa_name(isa) << " n=" << n << " rows=" << rows << " cols=" << cols << " ga=" << ga
                    << " gw=" << gw;
            }
        }
    }
}

TEST(MatmulW4A8, LongPrefillIsBlocked) {
    // More tokens than one GEMM token block, and no bias.
    const int64_t n = 300, rows = 45, cols = 256, g = 128;
    const Int4Mat m = make_int4(rows, cols, g, 77);
    const Acts a = make_acts(n, cols, g, 78);
    std::vector<float> ref(size_t(n * rows)), got(ref.size());
    matmul_w4a8_ref(a.view, m.view(), nullptr, ref.data());
    for (CpuIsa isa : cpu_isas_available()) {
        std::fill(got.begin(), got.end(), NAN);
        matmul_w4a8(a.view, m.view(), nullptr, got.data(), isa);
        ASSERT_LE(worst_w4a8(a.view, m.view(), nullptr, got, ref), 1.0) << cpu_isa_name(isa);
    }
}

TEST(MatmulW4A8, IsCloseToW4A16) {
    // The same 4-bit weights times x or times its INT8 rounding xq * sa: |y16 - y8| <= sum_k |w_k|
    // sa / 2 (+ the f32 rounding of both sides).
    const int64_t n = 5, rows = 48, cols = 512, g = 128;
    const Int4Mat m = make_int4(rows, cols, g, 21);
    const Acts a = make_acts(n, cols, g, 22);
    std::vector<float> y16(size_t(n * rows)), y8(y16.size()), row(static_cast<size_t>(cols));
    matmul_ref(a.f32.data(), n, m.view(), nullptr, y16.data());
    matmul_w4a8(a.view, m.view(), nullptr, y8.data());
    double worst_rel = 0;
    for (int64_t r = 0; r < rows; ++r) {
        weight_row_to_f32(m.view(), r, row.data());
        for (int64_t t = 0; t < n; ++t) {
            double bound = 0, mag = 0;
            for (int64_t k = 0; k < cols; ++k) {
                bound += std::fabs(row[size_t(k)]) * a.scales[size_t(t * (cols / g) + k / g)] / 2;
                mag += std::fabs(row[size_t(k)] * a.f32[size_t(t * cols + k)]);
            }
            bound += 2 * double(cols + 24) * kU * mag + 1e-6;
            const size_t i = size_t(t * rows + r);
            ASSERT_LE(std::fabs(double(y16[i]) - y8[i]), bound) << "t " << t << " r " << r;
            worst_rel = std::max(worst_rel, std::fabs(double(y16[i]) - y8[i]) / bound);
        }
    }
    EXPECT_GT(worst_rel, 0.0);  // the activations were rounded: the two products are not the same
}

TEST(MatmulW4A8, AWrongMinOrScaleIsCaught) {
    // One group's min off by a tenth of a step, or its scale by 1%, must fail the comparison.
    for (int which = 0; which < 2; ++which) {
        Int4Mat m = make_int4(8, 256, 128, 3);
        for (int64_t n : {int64_t(1), int64_t(4), int64_t(9)}) {
            const Acts a = make_acts(n, 256, 128, 5);
            std::vector<float> ref(size_t(n * 8)), got(ref.size());
            matmul_w4a8_ref(a.view, m.view(), nullptr, ref.data());
            Int4Mat bad = m;
            if (which == 0) bad.mins[3] += 0.1f * bad.scales[3];  // row 1, group 1
            else bad.scales[3] *= 1.01f;
            for (CpuIsa isa : cpu_isas_available()) {
                matmul_w4a8(a.view, bad.view(), nullptr, got.data(), isa);
                EXPECT_GT(worst_w4a8(a.view, m.view(), nullptr, got, ref), 1.0)
                    << cpu_isa_name(isa) << " n=" << n << (which == 0 ? " min" : " scale");
            }
        }
    }
}

TEST(MatmulW4A8, BadArgumentsAreRefused) {
    const Int4Mat m = make_int4(2, 128, 64, 1);
    const Acts per32 = make_acts(1, 128, 32, 2), per128 = make_acts(1, 128, 128, 3);
    float y[2];
    EXPECT_NO_THROW(matmul_w4a8(per32.view, m.view(), nullptr, y));   // 32 divides 64
    EXPECT_NO_THROW(matmul_w4a8(per128.view, m.view(), nullptr, y));  // 64 divides 128
    const Acts per16 = make_acts(1, 128, 16, 4);
    EXPECT_ANY_THROW(matmul_w4a8(per16.view, m.view(), nullptr, y));  // a group below one 4-bit block
    EXPECT_ANY_THROW(matmul_w4a8(per128.view, WeightView{}, nullptr, y));  // F32 weights
    const Acts wide = make_acts(1, 256, 128, 5);
    EXPECT_ANY_THROW(matmul_w4a8(wide.view, m.view(), nullptr, y));  // column counts differ
}
