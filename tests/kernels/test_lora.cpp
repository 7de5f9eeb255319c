#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/lora.h"
#include "tests/kernels/int8_test_util.h"  // rand_vec

using namespace shardlm;

// y += (x A^T) Bt by hand: x [1, 2], A [2, 2] (rank 2), Bt [2, 3].
TEST(LoraAdd, HandComputed) {
    const std::vector<float> x = {1, 2}, a = {1, 0, 1, 1}, bt = {1, 2, 3, -1, 0, 1};
    // x A^T = [1, 3]; [1, 3] Bt = [1 - 3, 2, 3 + 3] = [-2, 2, 6].
    std::vector<float> y = {10, 20, 30}, t(2);
    lora_add_ref(x.data(), 1, 2, a.data(), bt.data(), 2, 3, t.data(), y.data());
    EXPECT_EQ(y, (std::vector<float>{8, 22, 36}));
    EXPECT_EQ(t, (std::vector<float>{1, 3}));
}

// Every variant against the reference: ranks 1 to 64, widths around the 16-lane vectors and the
// 512-column blocks, one row (decode) to a prefill's worth (threaded), y accumulated onto.
TEST(LoraAdd, EveryVariantMatchesTheReference) {
    struct Shape {
        int64_t n, in, rank, out;
    };
    for (const Shape s : {Shape{1, 17, 1, 33}, Shape{1, 2048, 16, 6144}, Shape{3, 6144, 8, 2048}, Shape{5, 100, 64, 1025},
                          Shape{64, 512, 16, 513}, Shape{2, 16, 3, 16}}) {
        const std::vector<float> x = test::rand_vec(size_t(s.n * s.in), uint32_t(s.in), 1.0f);
        const std::vector<float> a = test::rand_vec(size_t(s.rank * s.in), 5, 1.0f / std::sqrt(float(s.in)));
        const std::vector<float> bt = test::rand_vec(size_t(s.rank * s.out), 9, 0.5f);
        const std::vector<float> y0 = test::rand_vec(size_t(s.n * s.out), 13, 2.0f);
        std::vector<float> ref = y0, t(size_t(s.n * s.rank));
        lora_add_ref(x.data(), s.n, s.in, a.data(), bt.data(), s.rank, s.out, t.data(), ref.data());
        for (CpuIsa isa : cpu_isas_available()) {
            std::vector<float> got = y0, tg(t.size());
            lora_add(x.data(), s.n, s.in, a.data(), bt.data(), s.rank, s.out, tg.data(), got.data(), isa);
            float worst = 0;
            for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref[i]) / (1.0f + std::fabs(ref[i])));
            // Only x A^T's dot products are summed in another order (float rounding of in terms).
            EXPECT_LT(worst, 1e-5f) << s.n << "x" << s.in << " rank " << s.rank << " out " << s.out << " " << cpu_isa_name(isa);
            EXPECT_NE(got, y0);
        }
    }
}
