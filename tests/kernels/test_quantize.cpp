// Symmetric INT8 quantization: closed forms, rounding, zero groups, the round-trip bound, and the
// threaded versions against the references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

TEST(QuantizeInt8, ClosedFormRoundsToNearestEven) {
    // max|x| = 254 -> scale 2, x / scale: 62.5 -> 62 (even), 63.5 -> 64, 1.5 -> 2, 0.5 -> 0, -127.
    const float x[] = {125, 127, 3, 1, -254, 0, -3};
    int8_t q[7];
    const float s = quantize_row_int8(x, 7, q);
    EXPECT_EQ(s, 2.0f);
    const int8_t want[] = {62, 64, 2, 0, -127, 0, -2};
    for (int i = 0; i < 7; ++i) EXPECT_EQ(q[i], want[i]) << i;
}

TEST(QuantizeInt8, ZeroGroupHasZeroScaleAndNoNaN) {
    const float x[] = {0, 0, 0, 0, 1, -0.5f, 0.25f, 0};
    int8_t q[8];
    float s[2];
    quantize_acts_int8_ref(x, 1, 8, 4, q, s);
    EXPECT_EQ(s[0], 0.0f);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(q[i], 0);
    EXPECT_FLOAT_EQ(s[1], 1.0f / 127);
    EXPECT_EQ(q[4], 127);
    EXPECT_EQ(q[5], -64);  // -63.5 -> -64 (even)
    EXPECT_EQ(q[6], 32);   // 31.75
    for (float v : s) EXPECT_FALSE(std::isnan(v));
}

TEST(QuantizeInt8, WeightScalesLayoutPerGroup) {
    // rows 2, cols 4, group 2: scales [row][group].
    const std::vector<float> w = {1, -2, 0.5f, 0.25f, 0, 0, 2, -4};
    std::vector<int8_t> q(8);
    std::vector<float> s(4);
    WeightView v;
    v.data = w.data();
    v.rows = 2;
    v.cols = 4;
    quantize_weights_int8_ref(v, 2, q.data(), s.data());
    EXPECT_FLOAT_EQ(s[0], 2.0f / 127);
    EXPECT_FLOAT_EQ(s[1], 0.5f / 127);
    EXPECT_EQ(s[2], 0.0f);
    EXPECT_FLOAT_EQ(s[3], 4.0f / 127);
    const std::vector<int8_t> want = {64, -127, 127, 64, 0, 0, 64, -127};  // every 63.5 rounds to 64
    EXPECT_EQ(q, want);
}

TEST(QuantizeInt8, RoundTripWithinHalfAStep) {
    // |w - q * scale| <= scale / 2, up to the f32 rounding of w * (127 / max) (relative 2^-23 of
    // |w| on each side), and every non-zero group uses the full range (max |q| = 127).
    for (int64_t group : {1, 3, 32, 64, 128, 192}) {
        const int64_t rows = 7, cols = 384;
        const QuantMat m = make_quant_mat(rows, cols, group, uint32_t(group));
        std::vector<float> deq(static_cast<size_t>(cols));
        for (int64_t r = 0; r < rows; ++r) {
            weight_row_to_f32(m.view(), r, deq.data());
            for (int64_t g = 0; g < cols / group; ++g) {
                const float s = m.scales[size_t(r * (cols / group) + g)];
                int maxq = 0;
                for (int64_t c = g * group; c < (g + 1) * group; ++c) {
                    const float w = m.f32[size_t(r * cols + c)];
                    maxq = std::max(maxq, std::abs(int(m.q[size_t(r * cols + c)])));
                    ASSERT_LE(std::fabs(w - deq[size_t(c)]), s / 2 + 4 * kU * std::fabs(w) + 1e-12)
                        << "group " << group << " r " << r << " c " << c;
                }
                if (s > 0) {
                    EXPECT_EQ(maxq, 127);
                }
            }
        }
    }
}

TEST(QuantizeInt8, ThreadedMatchesReference) {
    const int64_t rows = 203, cols = 96;
    const auto w = rand_vec(size_t(rows * cols), 5);
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
        std::vector<uint16_t> h(w.size());
        for (size_t i = 0; i < w.size(); ++i) h[i] = dt == DType::F16 ? f32_to_f16(w[i]) : f32_to_bf16(w[i]);
        WeightView v;
        v.dtype = dt;
        v.data = dt == DType::F32 ? static_cast<const void*>(w.data()) : h.data();
        v.rows = rows;
        v.cols = cols;
        for (int64_t group : {int64_t(32), cols}) {
            std::vector<int8_t> q1(w.size()), q2(w.size());
            std::vector<float> s1(size_t(rows * cols / group)), s2(s1.size());
            quantize_weights_int8_ref(v, group, q1.data(), s1.data());
            quantize_weights_int8(v, group, q2.data(), s2.data());
            EXPECT_EQ(q1, q2);
            EXPECT_EQ(s1, s2);
        }
    }
    // Activations: every variant, groups with and without a vector tail, a zero group, and ties.
    const int64_t n = 300;
    auto x = rand_vec(size_t(n * cols), 6, 3.0f);
    std::fill(x.begin() + 32, x.begin() + 64, 0.0f);
    x[100] = 3.0f;  // with max 3 at token 1: 1.5 / (3 / 127) = 63.5 exactly -> 64
    x[101] = 1.5f;
    x[2 * cols + 5] = std::nanf("");  // a NaN is skipped by the max and rounds to 127 (the loader's weights)
    x[3 * cols + 7] = INFINITY;       // an infinite max: scale inf, every value 0 except the infinity
    x[4 * cols + 90] = -INFINITY;
    for (int64_t group : {int64_t(32), int64_t(24), int64_t(19), cols}) {
        if (cols % group) continue;
        std::vector<int8_t> q1(x.size()), q2(x.size());
        std::vector<float> s1(size_t(n * (cols / group))), s2(s1.size());
        quantize_acts_int8_ref(x.data(), n, cols, group, q1.data(), s1.data());
        for (CpuIsa isa : cpu_isas_available()) {
            std::fill(q2.begin(), q2.end(), int8_t(99));
            quantize_acts_int8(x.data(), n, cols, group, q2.data(), s2.data(), isa);
            EXPECT_EQ(q1, q2) << cpu_isa_name(isa) << " group " << group;
            EXPECT_EQ(s1, s2) << cpu_isa_name(isa) << " group " << group;
        }
    }
    // One row of the KV cache is one group of one token.
    int8_t qr[96], qa[96];
    float sa = 0;
    quantize_acts_int8_ref(x.data(), 1, 96, 96, qa, &sa);
    EXPECT_EQ(quantize_row_int8(x.data(), 96, qr), sa);
    EXPECT_EQ(std::vector<int8_t>(qr, qr + 96), std::vector<int8_t>(qa, qa + 96));
}

// quantize_rows_int4 (what the loader quantizes --weights int4 with) on every variant against the
// reference's groups and packing, bit for bit: random groups, a zero group, constant and one-signed
// groups, -0, NaN, an infinity, and values on rounding ties.
TEST(QuantizeInt4, RowsOnEveryVariantMatchTheReference) {
    const int64_t rows = 37, cols = 384;
    auto x = rand_vec(size_t(rows * cols), 8, 2.0f);
    std::fill(x.begin(), x.begin() + 32, 0.0f);                  // row 0, group of 32 all zeros
    std::fill(x.begin() + 64, x.begin() + 96, 1.25f);            // constant positive
    std::fill(x.begin() + 96, x.begin() + 128, -0.75f);          // constant negative
    x[cols + 3] = -0.0f;
    x[2 * cols + 40] = std::nanf("");
    x[6 * cols + cols - 1] = std::nanf("");  // in the last vector of every group size
    x[3 * cols + 200] = INFINITY;
    x[4 * cols + 10] = -INFINITY;
    for (int64_t c = 0; c < 32; ++c) x[size_t(5 * cols + c)] = float(c % 16) * 0.5f - 2.5f;  // scale 0.5: ties
    for (int64_t group : {int64_t(32), int64_t(128), cols}) {
        const int64_t ng = cols / group;
        std::vector<uint8_t> q1(size_t(rows * cols / 2)), q2(q1.size()), codes(static_cast<size_t>(cols));
        std::vector<float> s1(size_t(rows * ng)), m1(s1.size()), s2(s1.size()), m2(s1.size());
        for (int64_t r = 0; r < rows; ++r) {
            for (int64_t g = 0; g < ng; ++g) {
                const Int4Group p = quantize_group_int4(x.data() + r * cols + g * group, group, codes.data() + g * group);
                s1[size_t(r * ng + g)] = p.scale;
                m1[size_t(r * ng + g)] = p.min();
            }
            pack_int4_row(codes.data(), cols, q1.data() + r * cols / 2);
        }
        for (CpuIsa isa : cpu_isas_available()) {
            std::fill(q2.begin(), q2.end(), uint8_t(0xAA));
            quantize_rows_int4(x.data(), rows, cols, group, q2.data(), s2.data(), m2.data(), isa);
            EXPECT_EQ(q1, q2) << cpu_isa_name(isa) << " group " << group;
            // Bit patterns: an infinite range gives a NaN min (-zero * inf) in both.
            auto bits = [](const std::vector<float>& v) {
                std::vector<uint32_t> b(v.size());
                std::memcpy(b.data(), v.data(), v.size() * 4);
                return b;
            };
            EXPECT_EQ(bits(s1), bits(s2)) << cpu_isa_name(isa) << " group " << group;
            EXPECT_EQ(bits(m1), bits(m2)) << cpu_isa_name(isa) << " group " << group;
        }
    }
    std::vector<uint8_t> q(16);
    std::vector<float> s(1), m(1);
    EXPECT_ANY_THROW(quantize_rows_int4(x.data(), 1, 48, 48, q.data(), s.data(), m.data()));  // not a multiple of 32
}

TEST(QuantizeInt8, GroupMustDivideCols) {
    std::vector<float> x(10), s(3);
    std::vector<int8_t> q(10);
    EXPECT_ANY_THROW(quantize_acts_int8_ref(x.data(), 1, 10, 4, q.data(), s.data()));
}
