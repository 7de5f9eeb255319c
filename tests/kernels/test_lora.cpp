#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/lora.h"
#include "tests/kernels/int8_test_util.h"  // rand_vec

using namespace shardlm;

// y += (x A^T) Bt by hand: x [1, 2], A [2, 2] (rank 2), Bt [2, 3].
TEST(LoraAdd, HandComputed) {
    const std::vector<float> x = {1, 2}, a = {1, 0, 1, 1}, bt = {1, 2, 3, -1, 0, 1};
    // x A^T = [1, 3]; [1, 3] Bt = [1 - 3, 2, 3 + 3] = [-2, 2, 6].
    std::vector<float> y = {10, 20, 30}, t(2);
    lora_add_ref(x.data(), 1, 2, a.data(), bt.data(), DType::F32, 2, 3, t.data(), y.data());
    EXPECT_EQ(y, (std::vector<float>{8, 22, 36}));
    EXPECT_EQ(t, (std::vector<float>{1, 3}));
    // The same factors in BF16 (small integers, exact there).
    std::vector<uint16_t> a16, bt16;
    for (float v : a) a16.push_back(f32_to_bf16(v));
    for (float v : bt) bt16.push_back(f32_to_bf16(v));
    std::vector<float> y16 = {10, 20, 30};
    lora_add_ref(x.data(), 1, 2, a16.data(), bt16.data(), DType::BF16, 2, 3, t.data(), y16.data());
    EXPECT_EQ(y16, (std::vector<float>{8, 22, 36}));
}

// Every variant against the reference: ranks 1 to 64, widths around the 16-lane vectors and the
// 512-column blocks, one row (decode) to a prefill's worth (threaded), y accumulated onto.
TEST(LoraAdd, EveryVariantMatchesTheReference) {
    struct Shape {
        int64_t n, in, rank, out;
    };
    for (const Shape s : {Shape{1, 17, 1, 33}, Shape{1, 2048, 16, 6144}, Shape{3, 6144, 8, 2048}, Shape{5, 100, 64, 1025},
                          Shape{64, 512, 16, 513}, Shape{2, 16, 3, 16}, Shape{2, 40, 5, 100}}) {
        const std::vector<float> x = test::rand_vec(size_t(s.n * s.in), uint32_t(s.in), 1.0f);
        const std::vector<float> a = test::rand_vec(size_t(s.rank * s.in), 5, 1.0f / std::sqrt(float(s.in)));
        const std::vector<float> bt = test::rand_vec(size_t(s.rank * s.out), 9, 0.5f);
        const std::vector<float> y0 = test::rand_vec(size_t(s.n * s.out), 13, 2.0f);
        // BF16 factors: the same values rounded, and those roundings in f32 (widening is exact, so
        // the reference gives the same bits for both).
        std::vector<uint16_t> a16, bt16;
        std::vector<float> a_r, bt_r;
        for (float v : a) a_r.push_back(bf16_to_f32(a16.emplace_back(f32_to_bf16(v))));
        for (float v : bt) bt_r.push_back(bf16_to_f32(bt16.emplace_back(f32_to_bf16(v))));
        std::vector<float> ref_r = y0, t(size_t(s.n * s.rank));
        lora_add_ref(x.data(), s.n, s.in, a_r.data(), bt_r.data(), DType::F32, s.rank, s.out, t.data(), ref_r.data());
        for (const DType dt : {DType::F32, DType::BF16}) {
            const bool bf = dt == DType::BF16;
            const void* af = bf ? static_cast<const void*>(a16.data()) : a.data();
            const void* btf = bf ? static_cast<const void*>(bt16.data()) : bt.data();
            std::vector<float> ref = y0;
            lora_add_ref(x.data(), s.n, s.in, af, btf, dt, s.rank, s.out, t.data(), ref.data());
            if (bf) {
                EXPECT_EQ(ref, ref_r);
            }
            for (CpuIsa isa : cpu_isas_available()) {
                std::vector<float> got = y0, tg(t.size());
                lora_add(x.data(), s.n, s.in, af, btf, dt, s.rank, s.out, tg.data(), got.data(), isa);
                float worst = 0;
                for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref[i]) / (1.0f + std::fabs(ref[i])));
                // Only x A^T's dot products are summed in another order (float rounding of in terms).
                EXPECT_LT(worst, 1e-5f) << s.n << "x" << s.in << " rank " << s.rank << " out " << s.out << " "
                                        << cpu_isa_name(isa) << " " << dtype_name(dt);
                EXPECT_NE(got, y0);
            }
        }
    }
}

// Bt's column tiles (lora_bt_index) hold Bt's elements, each once: the reference over a tiled Bt
// gives the plain [rank, out] product's bits, for widths that end inside a tile and on its edge.
TEST(LoraAdd, ColumnTilesHoldBtOnce) {
    for (const int64_t out : {int64_t(1), int64_t(64), int64_t(150), int64_t(192)}) {
        const int64_t n = 2, in = 5, rank = 3;
        const std::vector<float> x = test::rand_vec(size_t(n * in), 3, 1.0f), a = test::rand_vec(size_t(rank * in), 4, 1.0f);
        const std::vector<float> plain = test::rand_vec(size_t(rank * out), 6, 1.0f);
        std::vector<float> tiled(plain.size(), NAN);
        for (int64_t k = 0; k < rank; ++k)
            for (int64_t o = 0; o < out; ++o) {
                const int64_t at = lora_bt_index(k, o, rank, out);
                ASSERT_TRUE(at >= 0 && at < rank * out) << k << "," << o;
                EXPECT_TRUE(std::isnan(tiled[size_t(at)])) << "(" << k << ", " << o << ") shares its place";
                tiled[size_t(at)] = plain[size_t(k * out + o)];
            }
        std::vector<float> t(size_t(n * rank)), got(size_t(n * out), 1.0f), want(size_t(n * out), 1.0f);
        lora_add_ref(x.data(), n, in, a.data(), tiled.data(), DType::F32, rank, out, t.data(), got.data());
        for (int64_t i = 0; i < n; ++i)
            for (int64_t k = 0; k < rank; ++k)
                for (int64_t o = 0; o < out; ++o) want[size_t(i * out + o)] += t[size_t(i * rank + k)] * plain[size_t(k * out + o)];
        EXPECT_EQ(got, want) << "out " << out;
    }
}

// Factors of a type the kernel does not take are refused, naming it.
TEST(LoraAdd, RefusesOtherFactorTypes) {
    const std::vector<float> x = {1, 2}, y0 = {0, 0};
    std::vector<float> y = y0, t(1);
    const std::vector<uint16_t> f = {0, 0};
    EXPECT_THROW(lora_add(x.data(), 1, 2, f.data(), f.data(), DType::F16, 1, 2, t.data(), y.data()), Error);
    EXPECT_THROW(lora_add_ref(x.data(), 1, 2, f.data(), f.data(), DType::I8, 1, 2, t.data(), y.data()), Error);
}

// lora_add_jobs: products of different shapes (q/k/v-like parts of one x, another x, a job of rank
// 0, rows ldy apart inside wider rows) in one call give each one's lora_add bits, on every ISA, in
// f32 and BF16; small calls (one thread) and large (threaded, tasks split across jobs).
TEST(LoraAdd, JobsInOneCallEqualEachAlone) {
    struct Spec {
        int64_t n, in, rank, out, ldy, col;
        bool other_x = false;  // rows of the second input
    };
    for (const std::vector<Spec>& specs :
         {std::vector<Spec>{{1, 37, 5, 150, 240, 0}, {1, 37, 3, 40, 240, 150}, {1, 37, 0, 50, 240, 190}},
          std::vector<Spec>{{2, 37, 5, 150, 150, 0}, {1, 64, 16, 24, 40, 16, true}},
          std::vector<Spec>{{64, 512, 16, 513, 513, 0}, {64, 512, 8, 100, 200, 0, true}, {3, 512, 4, 70, 200, 100, true}}}) {
        for (const DType dt : {DType::F32, DType::BF16}) {
            for (CpuIsa isa : cpu_isas_available()) {
                SCOPED_TRACE(std::string(cpu_isa_name(isa)) + " " + dtype_name(dt) + " " + std::to_string(specs.size()) + " jobs");
                // Two inputs of 64 rows, as wide as the widest job's; outputs of 64 rows of ldy.
                std::vector<std::vector<float>> xs = {test::rand_vec(64 * 512, 1, 1.0f), test::rand_vec(64 * 512, 2, 1.0f)};
                std::vector<std::vector<uint8_t>> a, bt;
                std::vector<std::vector<float>> y0, alone;
                std::vector<LoraJob> jobs;
                int64_t t_size = 0;
                for (size_t j = 0; j < specs.size(); ++j) {
                    const Spec& s = specs[j];
                    const size_t es = dtype_size(dt);
                    auto factors = [&](int64_t count, uint32_t seed) {
                        const std::vector<float> v = test::rand_vec(size_t(count), seed, 0.3f);
                        std::vector<uint8_t> b(size_t(count) * es);
                        for (size_t i = 0; i < v.size(); ++i) {
                            if (dt == DType::F32) std::memcpy(&b[i * 4], &v[i], 4);
                            else reinterpret_cast<uint16_t*>(b.data())[i] = f32_to_bf16(v[i]);
                        }
                        return b;
                    };
                    a.push_back(factors(std::max<int64_t>(s.rank * s.in, 1), uint32_t(10 + j)));
                    bt.push_back(factors(std::max<int64_t>(s.rank * s.out, 1), uint32_t(20 + j)));
                    y0.push_back(test::rand_vec(size_t(s.n * s.ldy), uint32_t(30 + j), 2.0f));
                    t_size += s.n * s.rank;
                }
                std::vector<std::vector<float>> got = y0;
                for (size_t j = 0; j < specs.size(); ++j) {
                    const Spec& s = specs[j];
                    jobs.push_back(LoraJob{xs[s.other_x].data(), s.n, s.in, a[j].data(), bt[j].data(), s.rank, s.out,
                                           got[j].data() + s.col, s.ldy});
                }
                std::vector<float> t(size_t(std::max<int64_t>(t_size, 1)));
                lora_add_jobs(jobs.data(), int64_t(jobs.size()), dt, t.data(), isa);
                for (size_t j = 0; j < specs.size(); ++j) {
                    const Spec& s = specs[j];
                    // Alone: each row through lora_add into a plain [n, out] block, put back in place.
                    std::vector<float> want = y0[j], block(size_t(s.n * s.out)), tj(size_t(std::max<int64_t>(s.n * s.rank, 1)));
                    for (int64_t i = 0; i < s.n; ++i)
                        std::copy_n(want.begin() + i * s.ldy + s.col, s.out, block.begin() + i * s.out);
                    if (s.rank > 0)
                        lora_add(xs[s.other_x].data(), s.n, s.in, a[j].data(), bt[j].data(), dt, s.rank, s.out, tj.data(),
                                 block.data(), isa);
                    for (int64_t i = 0; i < s.n; ++i)
                        std::copy_n(block.begin() + i * s.out, s.out, want.begin() + i * s.ldy + s.col);
                    EXPECT_EQ(std::memcmp(got[j].data(), want.data(), want.size() * 4), 0) << "job " << j;
                    if (s.rank > 0) {
                        EXPECT_NE(got[j], y0[j]) << "job " << j;
                    } else {
                        EXPECT_EQ(got[j], y0[j]) << "job " << j;
                    }
                }
            }
        }
    }
}
