// matmul with INT8 weights (W8A16) and matmul_w8a8: closed forms of the references, then every
// CPU variant against the reference on awkward shapes, group sizes and token counts.
//
// Tolerances. f32 sums of K products in any order and blocking differ from an exact sum by at
// most K * u * sum_k |x_k w_k| (u = 2^-24, the classic worst-case bound), so each output gets
// |got - ref| <= (K + 8) * u * (sum_k |x_k w_k| + |b|) + 1e-7: 8 more roundings for scales and
// bias, and a floor for outputs that cancel to ~0. For W8A8 the INT32 dots are exact and only
// the per-segment f32 steps round: (segments + 4) * u * (sum_k |qa qw| sa sw + |b|). The AMX
// variant's BF16 tiles carry each activation within kAmxBf16RelErr (2^-16) of it: + that * sum |x w|.
// Where INT8 weights meet INT16 activations (i16_acts_rounded) each
// x_k moves by at most kI16ActsErr * max|x| (1% more for the f32 rounding of the scale's inverse):
// + that * sum |w|.
// A wrong scale, a dropped group or a misplaced row moves outputs by O(1) relative to these sums,
// far outside the bounds (WrongScaleIsCaught checks this).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"  // kAmxBf16RelErr
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

const int64_t kTokens[] = {1, 2, 3, 4, 5, 8, 12, 16, 17, 64, 100};  // 5-16: the AMX GEMV (I8)

// Largest |got - ref| / bound over all outputs (<= 1 passes).
double worst_w8a16(const float* x, int64_t n, const WeightView& w, const float* bias, const std::vector<float>& got,
                   const std::vector<float>& ref, CpuIsa isa) {
    const double rel = double(w.cols + 8) * kU + (isa == CpuIsa::Amx ? kAmxBf16RelErr : 0.0);
    const bool i16 = i16_acts_rounded(isa, n, w);
    std::vector<float> row(size_t(w.cols));
    double worst = 0;
    for (int64_t r = 0; r < w.rows; ++r) {
        weight_row_to_f32(w, r, row.data());
        for (int64_t t = 0; t < n; ++t) {
            double abs_dot = 0, abs_w = 0, amax = 0;
            for (int64_t k = 0; k < w.cols; ++k) {
                abs_dot += std::fabs(double(x[t * w.cols + k]) * row[size_t(k)]);
                abs_w += std::fabs(row[size_t(k)]);
                amax = std::max(amax, std::fabs(double(x[t * w.cols + k])));
            }
            const double b = bias ? std::fabs(bias[r]) : 0.0;
            const double bound = rel * (abs_dot + b) + (i16 ? 1.01 * kI16ActsErr * amax * abs_w : 0.0) + 1e-7;
            const size_t i = size_t(t * w.rows + r);
            worst = std::max(worst, std::fabs(double(got[i]) - ref[i]) / bound);
        }
    }
    return worst;
}

// matmul on every CPU variant against matmul_ref within worst_w8a16's bound; false (after a failure
// that names the variant and `what`) at the first variant outside it.
bool every_variant_w8a16(const std::vector<float>& x, int64_t n, const WeightView& w, const float* bias,
                         const std::string& what) {
    std::vector<float> ref(size_t(n * w.rows)), got(ref.size());
    matmul_ref(x.data(), n, w, bias, ref.data());
    for (CpuIsa isa : cpu_isas_available()) {
        std::fill(got.begin(), got.end(), NAN);
        matmul(x.data(), n, w, bias, got.data(), isa);
        const double worst = worst_w8a16(x.data(), n, w, bias, got, ref, isa);
        EXPECT_LE(worst, 1.0) << cpu_isa_name(isa) << " " << what;
        if (worst > 1.0) return false;
    }
    return true;
}

double worst_w8a8(const QuantizedActs& a, const WeightView& w, const float* bias, const std::vector<float>& got,
                  const std::vector<float>& ref) {
    const int64_t g = std::min(a.group_size, w.group_size), cols = w.cols;
    const int64_t segs = (cols / g) * ((g + 1023) / 1024);
    const int8_t* wq = static_cast<const int8_t*>(w.data);
    double worst = 0;
    for (int64_t r = 0; r < w.rows; ++r)
        for (int64_t t = 0; t < a.n; ++t) {
            double abs_sum = 0;
            for (int64_t k = 0; k < cols; ++k)
                abs_sum += std::fabs(double(a.q[t * cols + k]) * wq[r * cols + k]) *
                           a.scales[t * (cols / a.group_size) + k / a.group_size] *
                           w.scales[r * (cols / w.group_size) + k / w.group_size];
            const double bound = double(segs + 4) * kU * (abs_sum + (bias ? std::fabs(bias[r]) : 0.0)) + 1e-7;
            const size_t i = size_t(t * w.rows + r);
            worst = std::max(worst, std::fabs(double(got[i]) - ref[i]) / bound);
        }
    return worst;
}


}  // namespace

TEST(MatmulInt8, ReferenceClosedFormW8A16) {
    // q = [[1, 2, 3, 4], [-1, 0, 1, 127]], groups of 2 with scales [[0.5, 2], [1, 0.25]], x = ones:
    // y0 = (1 + 2) * 0.5 + (3 + 4) * 2 = 15.5, y1 = -1 * 1 + 128 * 0.25 = 31; bias [1, -1].
    const int8_t q[] = {1, 2, 3, 4, -1, 0, 1, 127};
    const float s[] = {0.5f, 2, 1, 0.25f}, x[] = {1, 1, 1, 1}, b[] = {1, -1};
    float y[2];
    matmul_ref(x, 1, int8_weight_view(q, s, 2, 4, 2), b, y);
    EXPECT_EQ(y[0], 16.5f);
    EXPECT_EQ(y[1], 30.0f);
}

TEST(MatmulInt8, ReferenceClosedFormW8A8) {
    // Same weights; activations q = [2, -1, 0, 3] with per-token scale 0.5 and weight groups of 2:
    // row 0: (2 - 2) * 0.5 * 0.5 + (0 + 12) * 0.5 * 2 = 12; row 1: (-2 + 0) * 0.5 + (0 + 381) * 0.5 * 0.25.
    const int8_t wq[] = {1, 2, 3, 4, -1, 0, 1, 127}, aq[] = {2, -1, 0, 3};
    const float ws[] = {0.5f, 2, 1, 0.25f}, as[] = {0.5f};
    QuantizedActs a;
    a.q = aq;
    a.scales = as;
    a.n = 1;
    a.cols = 4;
    a.group_size = 4;
    float y[2];
    matmul_w8a8_ref(a, int8_weight_view(wq, ws, 2, 4, 2), nullptr, y);
    EXPECT_EQ(y[0], 12.0f);
    EXPECT_EQ(y[1], -1.0f + 381 * 0.125f);
    for (CpuIsa isa : cpu_isas_available()) {
        float z[2];
        matmul_w8a8(a, int8_weight_view(wq, ws, 2, 4, 2), nullptr, z, isa);
        EXPECT_EQ(z[0], y[0]) << cpu_isa_name(isa);
        EXPECT_EQ(z[1], y[1]) << cpu_isa_name(isa);
    }
}

TEST(MatmulInt8, EveryVariantMatchesReferenceW8A16) {
    // rows, cols, group: odd sizes, per-channel (group == cols), groups of 32/64/128 and groups that
    // are not multiples of the vector width (6, 24, 3).
    const int64_t shapes[][3] = {{1, 1, 1},    {7, 3, 3},       {33, 64, 32},  {31, 100, 100}, {65, 96, 32},
                                 {40, 257, 257}, {100, 384, 128}, {17, 192, 64}, {9, 18, 6},     {5, 72, 24},
                                 {3, 2048, 2048}};
    for (const auto& s : shapes) {
        const int64_t rows = s[0], cols = s[1], group = s[2];
        const QuantMat m = make_quant_mat(rows, cols, group, uint32_t(rows * 31 + cols));
        const WeightView w = m.view();
        const auto bias = rand_vec(size_t(rows), 3);
        for (int64_t n : kTokens) {
            const auto x = rand_vec(size_t(n * cols), uint32_t(n + 11), 2.0f);
            ASSERT_TRUE(every_variant_w8a16(x, n, w, bias.data(),
                                            "n=" + std::to_string(n) + " rows=" + std::to_string(rows) +
                                                " cols=" + std::to_string(cols) + " group=" + std::to_string(group)));
        }
    }
}

TEST(MatmulInt8, Int16ActivationsFlushLongRowsAndKeepSpikes) {
    // Rows of all +127 and all -128 against activations at full scale: without the INT32 flush every
    // kI16FlushCols columns, 12328 columns overflow a lane (770 products of 32767 * 127 > 2^31).
    // Token 1 is one spike among values 10^7 times smaller; token 2 random. Per-row scales with a
    // tail of 8 columns past the last 32; groups of 4128 (longer than one flush segment).
    for (const int64_t group : {int64_t(12328), int64_t(4128)}) {
        const int64_t rows = 7, cols = group == 4128 ? 3 * 4128 : 12328;
        QuantMat m = make_quant_mat(rows, cols, group, 5);
        std::fill(m.q.begin(), m.q.begin() + cols, int8_t(127));
        std::fill(m.q.begin() + cols, m.q.begin() + 2 * cols, int8_t(-128));
        const WeightView w = m.view();
        for (int64_t n : {3, 5, 70}) {
            std::vector<float> x = rand_vec(size_t(n * cols), uint32_t(n), 1e-3f);
            std::fill(x.begin(), x.begin() + cols, 3.0f);
            x[size_t(cols + 17)] = 1e4f;
            ASSERT_TRUE(every_variant_w8a16(x, n, w, nullptr, "n=" + std::to_string(n) + " group=" + std::to_string(group)));
        }
    }
}

TEST(MatmulInt8, NonFiniteActivationsGiveNonFiniteOutputsOfTheirTokenOnly) {
    const int64_t rows = 9, cols = 96, n = 4;
    const QuantMat m = make_quant_mat(rows, cols, cols, 6);
    std::vector<float> x = rand_vec(size_t(n * cols), 7);
    x[size_t(cols + 5)] = NAN;
    x[size_t(2 * cols + 90)] = INFINITY;
    std::vector<float> got(size_t(n * rows));
    for (CpuIsa isa : cpu_isas_available()) {
        matmul(x.data(), n, m.view(), nullptr, got.data(), isa);
        for (int64_t t = 0; t < n; ++t)
            for (int64_t r = 0; r < rows; ++r)
                EXPECT_EQ(std::isfinite(got[size_t(t * rows + r)]), t == 0 || t == 3)
                    << cpu_isa_name(isa) << " token " << t << " row " << r;
    }
}

TEST(MatmulInt8, EveryVariantMatchesReferenceFloatWeights) {
    const int64_t shapes[][2] = {{1, 1}, {7, 3}, {33, 17}, {64, 64}, {100, 31}, {129, 65}, {40, 257}, {37, 600}};
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
        for (const auto& s : shapes) {
            const int64_t rows = s[0], cols = s[1];
            std::vector<float> wf = rand_vec(size_t(rows * cols), uint32_t(rows + cols));
            std::vector<uint16_t> h(wf.size());
            for (size_t i = 0; i < wf.size(); ++i) h[i] = dt == DType::F16 ? f32_to_f16(wf[i]) : f32_to_bf16(wf[i]);
            WeightView w;
            w.dtype = dt;
            w.data = dt == DType::F32 ? static_cast<const void*>(wf.data()) : h.data();
            w.rows = rows;
            w.cols = cols;
            for (int64_t n : kTokens) {
                const auto x = rand_vec(size_t(n * cols), 7);
                ASSERT_TRUE(every_variant_w8a16(x, n, w, nullptr,
                                                std::string(dtype_name(dt)) + " n=" + std::to_string(n) +
                                                    " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols)));
            }
        }
    }
}

TEST(MatmulInt8, EveryVariantMatchesReferenceW8A8) {
    // rows, cols, activation group, weight group: per token x per channel, per-token acts with grouped
    // weights and the reverse, odd cols (padding of VNNI quads), a group of 6 (not a multiple of 4),
    // and groups longer than one 1024-value INT32 segment.
    const int64_t shapes[][4] = {{1, 4, 4, 4},         {7, 12, 12, 12},     {33, 64, 64, 32},    {33, 64, 32, 64},
                                 {31, 100, 100, 100},  {40, 37, 37, 37},    {17, 18, 18, 6},     {100, 384, 384, 128},
                                 {65, 256, 128, 256},  {9, 2500, 2500, 2500}, {3, 96, 32, 32},   {50, 2048, 2048, 2048}};
    for (const auto& s : shapes) {
        const int64_t rows = s[0], cols = s[1], ga = s[2], gw = s[3];
        const QuantMat m = make_quant_mat(rows, cols, gw, uint32_t(rows * 7 + cols));
        const WeightView w = m.view();
        const auto bias = rand_vec(size_t(rows), 4);
        for (int64_t n : kTokens) {
            const Acts a = make_acts(n, cols, ga, uint32_t(n * 3 + 1));
            std::vector<float> ref(size_t(n * rows)), got(ref.size());
            matmul_w8a8_ref(a.view, w, bias.data(), ref.data());
            for (CpuIsa isa : cpu_isas_available()) {
                std::fill(got.begin(), got.end(), NAN);
                matmul_w8a8(a.view, w, bias.data(), got.data(), isa);
                ASSERT_LE(worst_w8a8(a.view, w, bias.data(), got, ref), 1.0)
                    << cpu_isa_name(isa) << " n=" << n << " rows=" << rows << " cols=" << cols << " ga=" << ga << " gw=" << gw;
            }
        }
    }
}

TEST(MatmulInt8, LongPrefillIsBlocked) {
    // More tokens than one GEMM token block (256), INT8 groups and bf16 weights.
    const int64_t n = 300, rows = 45, cols = 160;
    const QuantMat m = make_quant_mat(rows, cols, 32, 77);
    std::vector<uint16_t> h(m.f32.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(m.f32[i]);
    WeightView wb;
    wb.dtype = DType::BF16;
    wb.data = h.data();
    wb.rows = rows;
    wb.cols = cols;
    const auto x = rand_vec(size_t(n * cols), 78);
    const auto bias = rand_vec(size_t(rows), 79);
    for (const WeightView& w : {m.view(), wb}) ASSERT_TRUE(every_variant_w8a16(x, n, w, bias.data(), dtype_name(w.dtype)));
}

TEST(MatmulInt8, WideAndTallProductsAreBlocked) {
    // The AMX GEMM packs row blocks of up to 256 rows and K blocks of up to 2048 columns, carrying the
    // sums of earlier K blocks in y: per-channel rows of 6144 (three K blocks) and 4160 (one long
    // one), groups of 128 across two K blocks, bf16 weights; 600 rows give each thread two row
    // blocks, 40 and 100 tokens a partial last token block.
    struct Shape {
        int64_t rows, cols, group;
        bool bf16;
    };
    for (const Shape sh : {Shape{600, 6144, 6144, false}, Shape{300, 4160, 4160, false}, Shape{600, 4096, 128, false},
                          Shape{600, 6144, 0, true}}) {
        const QuantMat m = make_quant_mat(sh.rows, sh.cols, sh.bf16 ? sh.cols : sh.group, uint32_t(sh.rows + sh.cols));
        std::vector<uint16_t> h(m.f32.size());
        for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(m.f32[i]);
        WeightView w = m.view();
        if (sh.bf16) {
            w = WeightView();
            w.dtype = DType::BF16;
            w.data = h.data();
            w.rows = sh.rows;
            w.cols = sh.cols;
        }
        const auto bias = rand_vec(size_t(sh.rows), 5);
        for (int64_t n : {40, 100}) {
            const auto x = rand_vec(size_t(n * sh.cols), uint32_t(n), 2.0f);
            std::vector<float> ref(size_t(n * sh.rows)), got(ref.size());
            matmul_ref(x.data(), n, w, bias.data(), ref.data());
            for (CpuIsa isa : cpu_isas_available()) {
                if (isa == CpuIsa::Scalar) continue;  // the plain loop has no blocking to get wrong
                std::fill(got.begin(), got.end(), NAN);
                matmul(x.data(), n, w, bias.data(), got.data(), isa);
                ASSERT_LE(worst_w8a16(x.data(), n, w, bias.data(), got, ref, isa), 1.0)
                    << dtype_name(w.dtype) << " " << cpu_isa_name(isa) << " n=" << n << " rows=" << sh.rows
                    << " cols=" << sh.cols << " group=" << sh.group;
            }
        }
    }
}

TEST(MatmulInt8, W8A8IsCloseToFloat) {
    // x w - (qa sa)(qw sw) = x dw + dx w - dx dw with |dw| <= sw / 2, |dx| <= sa / 2 per element, so
    // |y_f32 - y_w8a8| <= sum_k |x| sw/2 + sa/2 |w| + sa sw / 4 (+ f32 rounding of both sides).
    const int64_t n = 5, rows = 48, cols = 256;
    for (int64_t group : {int64_t(64), cols}) {
        const QuantMat m = make_quant_mat(rows, cols, group, 21);
        const Acts a = make_acts(n, cols, group, 22);
        WeightView wf;
        wf.data = m.f32.data();
        wf.rows = rows;
        wf.cols = cols;
        std::vector<float> yf(size_t(n * rows)), yq(yf.size());
        matmul_ref(a.f32.data(), n, wf, nullptr, yf.data());
        matmul_w8a8(a.view, m.view(), nullptr, yq.data());
        for (int64_t t = 0; t < n; ++t)
            for (int64_t r = 0; r < rows; ++r) {
                double bound = 0, abs_dot = 0;
                for (int64_t k = 0; k < cols; ++k) {
                    const double sa = a.scales[size_t(t * (cols / group) + k / group)];
                    const double sw = m.scales[size_t(r * (cols / group) + k / group)];
                    const double x = a.f32[size_t(t * cols + k)], w = m.f32[size_t(r * cols + k)];
                    bound += std::fabs(x) * sw / 2 + sa / 2 * std::fabs(w) + sa * sw / 4;
                    abs_dot += std::fabs(x * w);
                }
                bound += 2 * double(cols + 8) * kU * abs_dot + 1e-6;
                const size_t i = size_t(t * rows + r);
                ASSERT_LE(std::fabs(double(yf[i]) - yq[i]), bound) << "group " << group << " t " << t << " r " << r;
            }
    }
}

TEST(MatmulInt8, WrongScaleIsCaught) {
    // The comparison must fail when one scale is off by 1%: guards against tolerances too loose to
    // see a scale/group indexing bug.
    const int64_t n = 4, rows = 8, cols = 128, group = 32;
    QuantMat m = make_quant_mat(rows, cols, group, 3);
    const auto x = rand_vec(size_t(n * cols), 9);
    std::vector<float> ref(size_t(n * rows)), got(ref.size());
    matmul_ref(x.data(), n, m.view(), nullptr, ref.data());
    const Acts a = make_acts(n, cols, cols, 5);
    std::vector<float> ref8(ref.size()), got8(ref.size());
    matmul_w8a8_ref(a.view, m.view(), nullptr, ref8.data());
    // A prefill-sized product too (the GEMMs, AMX's BF16 tiles among them).
    const int64_t np = 40;
    const auto xp = rand_vec(size_t(np * cols), 10);
    std::vector<float> refp(size_t(np * rows)), gotp(refp.size());
    matmul_ref(xp.data(), np, m.view(), nullptr, refp.data());
    m.scales[5] *= 1.01f;  // row 1, group 1
    for (CpuIsa isa : cpu_isas_available()) {
        matmul(x.data(), n, m.view(), nullptr, got.data(), isa);
        EXPECT_GT(worst_w8a16(x.data(), n, m.view(), nullptr, got, ref, isa), 1.0) << cpu_isa_name(isa);
        matmul(xp.data(), np, m.view(), nullptr, gotp.data(), isa);
        EXPECT_GT(worst_w8a16(xp.data(), np, m.view(), nullptr, gotp, refp, isa), 1.0) << cpu_isa_name(isa);
        matmul_w8a8(a.view, m.view(), nullptr, got8.data(), isa);
        EXPECT_GT(worst_w8a8(a.view, m.view(), nullptr, got8, ref8), 1.0) << cpu_isa_name(isa);
    }
}

TEST(MatmulInt8, VariantsAreListedAndResolved) {
    const auto& v = cpu_isas_available();
    ASSERT_FALSE(v.empty());
    EXPECT_EQ(v.front(), CpuIsa::Scalar);
    EXPECT_NE(std::find(v.begin(), v.end(), cpu_isa_resolve(CpuIsa::Auto)), v.end());
    EXPECT_EQ(std::string(matmul_isa()), cpu_isa_name(cpu_isa_resolve(CpuIsa::Auto)));
    EXPECT_ANY_THROW(matmul_w8a8(QuantizedActs{}, WeightView{}, nullptr, nullptr));  // F32 weights
}

// The AMX tiles' GEMM against the AVX-512 kernel it stands in for, which it must match bit for bit:
// token counts around its 32-token blocks (the last one zero-padded), rows around its 32-row panels,
// per-channel and grouped scales, rows longer than one 1024-value INT32 segment (1088: a 64-value
// last segment), with and without bias; I8 (w + 128 panels) and I4 (codes and mins).
TEST(MatmulAmx, SameBitsAsAvx512) {
    const auto& v = cpu_isas_available();
    if (std::find(v.begin(), v.end(), CpuIsa::Amx) == v.end()) GTEST_SKIP() << "no AMX on this CPU/build";
    const int64_t shapes[][4] = {{7, 64, 64, 64},      {33, 128, 128, 64},  {70, 256, 128, 128},
                                 {32, 1088, 1088, 1088}, {45, 2112, 2112, 2112}, {40, 2048, 64, 128}};
    const int64_t tokens[] = {5, 8, 9, 31, 32, 33, 64, 100};
    for (const auto& s : shapes) {
        const int64_t rows = s[0], cols = s[1], ga = s[2], gw = s[3];
        const QuantMat m8 = make_quant_mat(rows, cols, gw, uint32_t(rows + cols));
        const Int4Mat m4 = make_int4(rows, cols, gw, uint32_t(rows * 3 + cols));
        const auto bias = rand_vec(size_t(rows), 9);
        for (int64_t n : tokens) {
            const Acts a = make_acts(n, cols, ga, uint32_t(n * 5 + 2));
            for (bool i4 : {false, true}) {
                for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
                    std::vector<float> want(size_t(n * rows)), got(want.size(), NAN);
                    if (i4) {
                        matmul_w4a8(a.view, m4.view(), b, want.data(), CpuIsa::Avx512);
                        matmul_w4a8(a.view, m4.view(), b, got.data(), CpuIsa::Amx);
                    } else {
                        matmul_w8a8(a.view, m8.view(), b, want.data(), CpuIsa::Avx512);
                        matmul_w8a8(a.view, m8.view(), b, got.data(), CpuIsa::Amx);
                    }
                    for (size_t i = 0; i < want.size(); ++i)
                        ASSERT_EQ(got[i], want[i]) << (i4 ? "w4a8" : "w8a8") << " n=" << n << " rows=" << rows
                                                   << " cols=" << cols << " ga=" << ga << " gw=" << gw
                                                   << (b ? " bias" : "") << " at " << i;
                }
            }
        }
    }
}
