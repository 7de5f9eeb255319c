// matmul's batch_invariant: a token's outputs must be the same bits whatever other tokens the call
// holds, for every weight format and every variant this CPU runs (AMX falls back to AVX-512),
// across the sizes where the ordinary dispatch changes kernel (GEMV, INT16 GEMV, the GEMMs, the
// AMX tiles), with rows that end mid-tile and several row chunks; and the outputs must still be
// the product (near the plain reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

const int64_t kTokens[] = {1, 2, 3, 4, 5, 8, 9, 17, 64, 70};

// An f32 matrix with its 16-bit copies.
struct Floats {
    std::vector<float> f32;
    std::vector<uint16_t> bf16, f16;
    int64_t rows = 0, cols = 0;
    WeightView view(DType dt) const {
        WeightView w;
        w.dtype = dt;
        w.data = dt == DType::F32 ? static_cast<const void*>(f32.data()) : dt == DType::BF16 ? bf16.data() : f16.data();
        w.rows = rows;
        w.cols = cols;
        return w;
    }
};
Floats make_floats(int64_t rows, int64_t cols, uint32_t seed) {
    Floats f;
    f.rows = rows, f.cols = cols;
    f.f32 = rand_vec(size_t(rows * cols), seed);
    for (float v : f.f32) {
        f.bf16.push_back(f32_to_bf16(v));
        f.f16.push_back(f32_to_f16(v));
    }
    return f;
}

// Rows t0 .. t0 + n of a token-major [n][cols] buffer.
std::vector<float> token_rows(const std::vector<float>& v, int64_t cols, int64_t t0, int64_t n) {
    return std::vector<float>(v.begin() + t0 * cols, v.begin() + (t0 + n) * cols);
}

// The batch-invariant product of `n` tokens against each token's alone, bit for bit, and against
// the reference within `tol` of the largest output.
void check(const std::string& what, const WeightView& w, const std::vector<float>& bias, bool int8_acts, int64_t act_group,
           double tol) {
    for (CpuIsa isa : cpu_isas_available())
        for (int64_t n : kTokens) {
            const std::string at = what + " " + cpu_isa_name(isa) + " n=" + std::to_string(n);
            const Acts a = make_acts(n, w.cols, act_group, uint32_t(n * 31 + 7));
            std::vector<float> all(size_t(n * w.rows), NAN), ref(all.size());
            if (int8_acts) {
                const MatmulOut o{&w, bias.data(), all.data()};
                matmul_int8_acts_multi(a.view, &o, 1, isa, true);
                if (w.dtype == DType::I4) matmul_w4a8_ref(a.view, w, bias.data(), ref.data());
                else matmul_w8a8_ref(a.view, w, bias.data(), ref.data());
            } else {
                matmul(a.f32.data(), n, w, bias.data(), all.data(), isa, true);
                matmul_ref(a.f32.data(), n, w, bias.data(), ref.data());
            }
            double top = 0, err = 0;
            for (size_t i = 0; i < all.size(); ++i) {
                top = std::max(top, double(std::fabs(ref[i])));
                err = std::max(err, double(std::fabs(all[i] - ref[i])));
            }
            EXPECT_LE(err, tol * top) << at << ": not the product";
            for (int64_t t = 0; t < n; ++t) {
                std::vector<float> one(size_t(w.rows), NAN);
                if (int8_acts) {
                    std::vector<int8_t> q(a.q.begin() + t * w.cols, a.q.begin() + (t + 1) * w.cols);
                    std::vector<float> sc(a.scales.begin() + t * (w.cols / act_group), a.scales.begin() + (t + 1) * (w.cols / act_group));
                    const QuantizedActs v{q.data(), sc.data(), 1, w.cols, act_group};
                    const MatmulOut o{&w, bias.data(), one.data()};
                    matmul_int8_acts_multi(v, &o, 1, isa, true);
                } else {
                    const std::vector<float> x = token_rows(a.f32, w.cols, t, 1);
                    matmul(x.data(), 1, w, bias.data(), one.data(), isa, true);
                }
                ASSERT_EQ(std::memcmp(one.data(), all.data() + t * w.rows, one.size() * sizeof(float)), 0)
                    << at << ": token " << t << " differs from the same token alone";
            }
        }
}

}  // namespace

// 16-bit and f32 weights: the f32 GEMVs over token blocks; 1030 rows (not a multiple of 4) of 512
// columns: two row chunks for f32.
TEST(MatmulBatchInvariant, FloatWeights) {
    const Floats f = make_floats(1030, 512, 1);
    const std::vector<float> bias = rand_vec(1030, 2);
    check("f32", f.view(DType::F32), bias, false, 512, 1e-5);
    check("bf16", f.view(DType::BF16), bias, false, 512, 1e-5);
    check("f16", f.view(DType::F16), bias, false, 512, 1e-5);
}

// INT8 weights per channel and per group, INT4 weights: the INT16 GEMV for every n (or the f32
// GEMV where the INT16 kernels do not take the groups).
TEST(MatmulBatchInvariant, IntegerWeights) {
    const std::vector<float> bias = rand_vec(300, 3);
    const QuantMat channel = make_quant_mat(300, 256, 256, 4), grouped = make_quant_mat(300, 256, 64, 5),
                   odd = make_quant_mat(300, 240, 48, 6);
    check("int8 per channel", channel.view(), bias, false, 256, 1e-3);
    check("int8 group 64", grouped.view(), bias, false, 256, 1e-3);
    check("int8 group 48", odd.view(), bias, false, 240, 1e-3);
    const Int4Mat q4 = make_int4(300, 256, 64, 7);
    check("int4", q4.view(), bias, false, 256, 1e-3);
}

// W8A8 and W4A8: INT8 activations per token and per group.
TEST(MatmulBatchInvariant, Int8Activations) {
    const std::vector<float> bias = rand_vec(300, 8);
    const QuantMat channel = make_quant_mat(300, 256, 256, 9), grouped = make_quant_mat(300, 256, 32, 10);
    check("w8a8", channel.view(), bias, true, 256, 1e-5);
    check("w8a8 act groups 64", channel.view(), bias, true, 64, 1e-5);
    check("w8a8 weight groups 32", grouped.view(), bias, true, 256, 1e-5);
    const Int4Mat q4 = make_int4(300, 256, 64, 11);
    check("w4a8", q4.view(), bias, true, 256, 1e-5);
}
