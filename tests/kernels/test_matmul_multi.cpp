// matmul_multi / matmul_int8_acts_multi: several weights of one input in one threaded product must
// give the bits of one matmul call per weight, on every variant and path (the AVX-512 and AMX
// GEMVs, the AMX GEMM, W8A8/W4A8), with rows that end mid-block so that one weight's last block and
// the next weight's first one fall to the same thread.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

constexpr int64_t kCols = 256, kGroup = 64;
const int64_t kRows[] = {40, 8, 96};                        // 144 rows: 5 blocks of 32, two ends mid-block
const int64_t kTokens[] = {1, 2, 3, 4, 5, 6, 8, 16, 40};  // GEMVs, the AMX tile GEMV, the GEMMs

struct Floats {  // an f32 matrix and its 16-bit copies
    std::vector<float> f32;
    std::vector<uint16_t> h;
    WeightView view(DType dt) const {
        WeightView w;
        w.dtype = dt;
        w.data = dt == DType::F32 ? static_cast<const void*>(f32.data()) : h.data();
        w.rows = int64_t(f32.size()) / kCols;
        w.cols = kCols;
        return w;
    }
};

// Each output of outs against a matmul of its own, bit for bit.
void expect_same_bits(const std::vector<MatmulOut>& outs, const std::vector<std::vector<float>>& want,
                      const std::string& what) {
    for (size_t i = 0; i < outs.size(); ++i)
        ASSERT_EQ(std::memcmp(outs[i].y, want[i].data(), want[i].size() * sizeof(float)), 0)
            << what << ": weight " << i << " (" << outs[i].w->rows << " rows) differs from its own call";
}

}  // namespace

TEST(MatmulMulti, SameBitsAsOneCallPerWeight) {
    std::vector<QuantMat> q8;
    std::vector<Int4Mat> q4;
    std::vector<Floats> fl;
    std::vector<std::vector<float>> bias;
    for (int64_t r : kRows) {
        q8.push_back(make_quant_mat(r, kCols, kGroup, uint32_t(r)));
        q4.push_back(make_int4(r, kCols, kGroup, uint32_t(r + 1)));
        Floats f;
        f.f32 = rand_vec(size_t(r * kCols), uint32_t(r + 2));
        for (float v : f.f32) f.h.push_back(f32_to_bf16(v));
        fl.push_back(std::move(f));
        bias.push_back(rand_vec(size_t(r), uint32_t(r + 3)));
    }
    for (const char* fmt : {"f32", "bf16", "int8", "int4", "w8a8", "w4a8"}) {
        const std::string f = fmt;
        std::vector<WeightView> ws;
        for (size_t i = 0; i < q8.size(); ++i)
            ws.push_back(f == "f32"    ? fl[i].view(DType::F32)
                         : f == "bf16" ? fl[i].view(DType::BF16)
                         : f == "int8" || f == "w8a8" ? q8[i].view()
                                                       : q4[i].view());
        const bool int8_acts = f == "w8a8" || f == "w4a8";
        for (int64_t n : kTokens) {
            const Acts a = make_acts(n, kCols, kCols, uint32_t(n * 7));
            for (CpuIsa isa : cpu_isas_available()) {
                std::vector<std::vector<float>> want, got;
                std::vector<MatmulOut> outs;
                for (size_t i = 0; i < ws.size(); ++i) {
                    const float* b = i == 1 ? nullptr : bias[i].data();  // one weight without bias
                    want.emplace_back(size_t(n * ws[i].rows));
                    got.emplace_back(want.back().size(), NAN);
                    if (int8_acts && ws[i].dtype == DType::I8) matmul_w8a8(a.view, ws[i], b, want[i].data(), isa);
                    else if (int8_acts) matmul_w4a8(a.view, ws[i], b, want[i].data(), isa);
                    else matmul(a.f32.data(), n, ws[i], b, want[i].data(), isa);
                }
                for (size_t i = 0; i < ws.size(); ++i) outs.push_back(MatmulOut{&ws[i], i == 1 ? nullptr : bias[i].data(), got[i].data()});
                if (int8_acts) matmul_int8_acts_multi(a.view, outs.data(), int(outs.size()), isa);
                else matmul_multi(a.f32.data(), n, outs.data(), int(outs.size()), isa);
                expect_same_bits(outs, want, f + " " + cpu_isa_name(isa) + " n=" + std::to_string(n));
            }
        }
    }
}

// Weights of different kinds (an INT8 q beside a BF16 k kept by --keep-fp16) or shapes run one
// call each; a weight without rows is skipped; bad weights are refused like matmul's.
TEST(MatmulMulti, MixedKindsAndEdges) {
    const QuantMat m8 = make_quant_mat(40, kCols, kGroup, 1);
    Floats f;
    f.f32 = rand_vec(size_t(33 * kCols), 2);
    for (float v : f.f32) f.h.push_back(f32_to_bf16(v));
    const WeightView wf = f.view(DType::BF16), w8 = m8.view();
    WeightView none = w8;
    none.rows = 0;
    const int64_t n = 3;
    const auto x = rand_vec(size_t(n * kCols), 5);
    std::vector<float> want8(size_t(n * 40)), wantf(size_t(n * 33)), got8(want8.size(), NAN), gotf(wantf.size(), NAN);
    matmul(x.data(), n, w8, nullptr, want8.data());
    matmul(x.data(), n, wf, nullptr, wantf.data());
    const std::vector<MatmulOut> outs = {{&w8, nullptr, got8.data()}, {&none, nullptr, nullptr}, {&wf, nullptr, gotf.data()}};
    matmul_multi(x.data(), n, outs.data(), int(outs.size()));
    expect_same_bits({outs[0], outs[2]}, {want8, wantf}, "int8 + bf16");
    matmul_multi(x.data(), n, outs.data(), 0);  // nothing to do

    WeightView bad = w8;
    bad.scales = nullptr;
    const std::vector<MatmulOut> with_bad = {{&w8, nullptr, got8.data()}, {&bad, nullptr, got8.data()}};
    EXPECT_ANY_THROW(matmul_multi(x.data(), n, with_bad.data(), 2));
    const Acts a = make_acts(n, kCols, kCols, 3);
    const std::vector<MatmulOut> float_weights = {{&wf, nullptr, gotf.data()}};
    EXPECT_ANY_THROW(matmul_int8_acts_multi(a.view, float_weights.data(), 1));  // BF16 weights, INT8 acts
}
