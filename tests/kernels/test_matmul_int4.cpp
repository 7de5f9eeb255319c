// INT4 (AWQ-style asymmetric, group-wise) weights: the quantizer's closed form and packing, then
// matmul with I4 weights on every CPU variant against the reference on awkward shapes.
//
// Tolerance as in test_matmul_int8.cpp: f32 sums of K products in any order differ from the exact
// sum by at most K * u * sum_k |x_k w_k|; the vectorised kernels also round the dequantization
// (q * s + min fused, or sum(q x) * s + min * sum(x) per group), a few more roundings per product,
// so the bound is (K + 16) * u * (sum |x w| + sum |x| (|min| + 15 s) + |b|) + 1e-7, and on AMX's BF16
// tiles, which carry each activation within kAmxBf16RelErr of it, that term times the same sum on top.
// Where the codes meet INT16 activations (i16_acts_rounded), each x_k
// moves by at most kI16ActsErr * max|x| (1% more for the scale's f32 inverse) against codes times
// scales of at most 15 s: + that * max|x| * sum 15 s.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"  // kAmxBf16RelErr
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

WeightView f32_view(const float* data, int64_t rows, int64_t cols) {
    WeightView v;
    v.data = data;
    v.rows = rows;
    v.cols = cols;
    return v;
}

}  // namespace

TEST(QuantizeInt4, ClosedFormOfOneGroup) {
    // Range [-1, 2]: scale 3/15 = 0.2, zero rne(1 / 0.2) = 5; q = rne(x / 0.2) + 5, clamped to 0..15.
    const float x[8] = {-1.0f, 2.0f, 0.0f, 0.12f, 0.34f, -0.45f, 1.99f, 1.0f};
    uint8_t q[8];
    const Int4Group g = quantize_group_int4(x, 8, q);
    EXPECT_FLOAT_EQ(g.scale, 3.0f / 15.0f);
    EXPECT_EQ(g.zero, 5);
    EXPECT_FLOAT_EQ(g.min(), -5.0f * g.scale);
    // x / 0.2 = -5, 10, 0, 0.6, 1.7, -2.25, 9.95, 5 -> rounded + 5, 9.95 + 5 clamped to 15.
    const uint8_t want[8] = {0, 15, 5, 6, 7, 3, 15, 10};
    for (int i = 0; i < 8; ++i) EXPECT_EQ(q[i], want[i]) << i;
}

TEST(QuantizeInt4, AllZeroAndOneSignedGroups) {
    const float zeros[4] = {0, 0, 0, 0};
    uint8_t q[4] = {9, 9, 9, 9};
    Int4Group g = quantize_group_int4(zeros, 4, q);
    EXPECT_EQ(g.scale, 0.0f);
    EXPECT_EQ(g.zero, 0);
    for (uint8_t c : q) EXPECT_EQ(c, 0);
    // All positive: the range is widened to 0, so zero = 0 and the largest value is exact.
    const float pos[4] = {0.5f, 1.5f, 3.0f, 3.0f};
    g = quantize_group_int4(pos, 4, q);
    EXPECT_EQ(g.zero, 0);
    EXPECT_EQ(q[2], 15);
    EXPECT_FLOAT_EQ(float(q[2]) * g.scale + g.min(), 3.0f);
    // All negative: zero = 15, and the most negative value is code 0.
    const float neg[4] = {-3.0f, -1.0f, -0.2f, -2.0f};
    g = quantize_group_int4(neg, 4, q);
    EXPECT_EQ(g.zero, 15);
    EXPECT_EQ(q[0], 0);
    EXPECT_FLOAT_EQ(float(q[0]) * g.scale + g.min(), -3.0f);
}

TEST(QuantizeInt4, PackedLayoutAndRoundTrip) {
    const int64_t rows = 5, cols = 96, group = 32;
    const Int4Mat m = make_int4(rows, cols, group, 3);
    const WeightView w = m.view();
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
        weight_row_to_f32(w, r, row.data());
        for (int64_t c = 0; c < cols; ++c) {
            const float s = m.scales[size_t(r * (cols / group) + c / group)];
            // Within half a step of the source (plus float rounding).
            EXPECT_LE(std::fabs(row[size_t(c)] - m.f32[size_t(r * cols + c)]), 0.5f * s * (1 + 1e-5f) + 1e-6f)
                << r << "," << c;
            // Column c sits in byte c/32*16 + c%16 of the row, high nibble for c%32 >= 16.
            const uint8_t byte = m.q[size_t(r * cols / 2 + c / 32 * 16 + c % 16)];
            const int code = c % 32 >= 16 ? byte >> 4 : byte & 15;
            EXPECT_EQ(row[size_t(c)], float(code) * s + m.mins[size_t(r * (cols / group) + c / group)]);
        }
    }
    // Threaded and reference quantizers agree bit for bit.
    std::vector<uint8_t> q(m.q.size());
    std::vector<float> sc(m.scales.size()), mn(m.mins.size());
    quantize_weights_int4_ref(f32_view(m.f32.data(), rows, cols), group, q.data(), sc.data(), mn.data());
    EXPECT_EQ(q, m.q);
    EXPECT_EQ(sc, m.scales);
    EXPECT_EQ(mn, m.mins);
}

TEST(QuantizeInt4, GroupMustBeAMultipleOf32ThatDividesCols) {
    const std::vector<float> f(64 * 2, 1.0f);
    std::vector<uint8_t> q(64);
    std::vector<float> s(8), m(8);
    EXPECT_THROW(quantize_weights_int4(f32_view(f.data(), 2, 64), 16, q.data(), s.data(), m.data()), std::exception);
    EXPECT_THROW(quantize_weights_int4(f32_view(f.data(), 2, 64), 48, q.data(), s.data(), m.data()), std::exception);
    EXPECT_NO_THROW(quantize_weights_int4(f32_view(f.data(), 2, 64), 64, q.data(), s.data(), m.data()));
}

TEST(MatmulInt4, EveryVariantMatchesTheReference) {
    const int64_t tokens[] = {1, 2, 3, 4, 5, 8, 13, 16, 40};  // 3-16: the AMX GEMV
    struct Shape {
        int64_t rows, cols, group;
    };
    for (const Shape sh : {Shape{1, 32, 32}, Shape{37, 96, 32}, Shape{70, 256, 128}, Shape{33, 384, 64}, Shape{9, 544, 32},
                          Shape{19, 640, 128}, Shape{11, 512, 256},
                          Shape{600, 4096, 128}}) {  // the last: two K blocks and row blocks of the AMX GEMM
        const Int4Mat m = make_int4(sh.rows, sh.cols, sh.group, uint32_t(sh.rows * 7 + sh.cols));
        const WeightView w = m.view();
        const std::vector<float> bias = rand_vec(size_t(sh.rows), 11);
        std::vector<float> row(size_t(sh.cols));
        for (int64_t n : tokens) {
            const std::vector<float> x = rand_vec(size_t(n * sh.cols), uint32_t(n + 5));
            std::vector<float> ref(size_t(n * sh.rows));
            matmul_ref(x.data(), n, w, bias.data(), ref.data());
            for (CpuIsa isa : cpu_isas_available()) {
                std::vector<float> got(ref.size(), NAN);
                matmul(x.data(), n, w, bias.data(), got.data(), isa);
                double worst = 0;
                const bool i16 = i16_acts_rounded(isa, n, w);
                for (int64_t r = 0; r < sh.rows; ++r) {
                    weight_row_to_f32(w, r, row.data());
                    const int64_t ng = sh.cols / sh.group;
                    for (int64_t t = 0; t < n; ++t) {
                        double mag = std::fabs(bias[size_t(r)]), amax = 0, codes = 0;
                        for (int64_t k = 0; k < sh.cols; ++k) {
                            const double xv = std::fabs(x[size_t(t * sh.cols + k)]);
                            const size_t gi = size_t(r * ng + k / sh.group);
                            mag += xv * (std::fabs(row[size_t(k)]) + std::fabs(m.mins[gi]) + 15.0 * m.scales[gi]);
                            amax = std::max(amax, xv);
                            codes += 15.0 * m.scales[gi];
                        }
                        const double bound =
                            (double(sh.cols + 16) * kU + (isa == CpuIsa::Amx ? kAmxBf16RelErr : 0.0)) * mag +
                            (i16 ? 1.01 * kI16ActsErr * amax * codes : 0.0) + 1e-7;
                        const size_t i = size_t(t * sh.rows + r);
                        worst = std::max(worst, std::fabs(double(got[i]) - ref[i]) / bound);
                    }
                }
                EXPECT_LE(worst, 1.0) << cpu_isa_name(isa) << " n=" << n << " rows=" << sh.rows << " cols=" << sh.cols
                                      << " group=" << sh.group;
            }
        }
    }
}

TEST(MatmulInt4, AWrongMinIsCaught) {
    // The bound above is tight enough to see one group's min off by a tenth of a step: groups of 32
    // (the unpacking GEMV) and of 128 (the chunked one), for 1 and 4 tokens.
    for (const int64_t group : {32, 128})
        for (const int64_t n : {1, 4}) {
            Int4Mat m = make_int4(8, 256, group, 21);
            const std::vector<float> x = rand_vec(size_t(256 * n), 2);
            std::vector<float> ref(size_t(8 * n)), got(size_t(8 * n));
            matmul_ref(x.data(), n, m.view(), nullptr, ref.data());
            const size_t gi = size_t(256 / group + 1);  // row 1, group 1
            m.mins[gi] += 0.1f * m.scales[gi];
            for (CpuIsa isa : cpu_isas_available()) {
                matmul(x.data(), n, m.view(), nullptr, got.data(), isa);
                double worst = 0;
                for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - ref[i]));
                EXPECT_GT(worst, 1e-3) << cpu_isa_name(isa) << " group " << group << " n=" << n;
            }
        }
}
