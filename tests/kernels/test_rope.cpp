#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/rope.h"

using namespace shardlm;

TEST(Rope, InvFreqDefault) {
    RopeParams p;
    p.head_dim = 4;
    p.theta = 10000;
    const auto f = rope_inv_freq(p);
    ASSERT_EQ(f.size(), 2u);
    EXPECT_FLOAT_EQ(f[0], 1.0f);
    EXPECT_FLOAT_EQ(f[1], 0.01f);  // 1 / 10000^(2/4)
}

TEST(Rope, RotateHalfLayout) {
    // head_dim 4: pairs (0, 2) with inv_freq 1 and (1, 3) with inv_freq 0.01.
    RopeParams p;
    p.head_dim = 4;
    const auto f = rope_inv_freq(p);
    std::vector<float> x = {1, 2, 3, 4};
    rope_ref(x.data(), 1, 4, 2, f.data());
    const float c0 = std::cos(2.0f), s0 = std::sin(2.0f), c1 = std::cos(0.02f), s1 = std::sin(0.02f);
    EXPECT_NEAR(x[0], 1 * c0 - 3 * s0, 1e-6);
    EXPECT_NEAR(x[2], 3 * c0 + 1 * s0, 1e-6);
    EXPECT_NEAR(x[1], 2 * c1 - 4 * s1, 1e-6);
    EXPECT_NEAR(x[3], 4 * c1 + 2 * s1, 1e-6);
}

TEST(Rope, PositionZeroIsIdentityAndNormIsKept) {
    RopeParams p;
    p.head_dim = 8;
    const auto f = rope_inv_freq(p);
    std::vector<float> x = {1, -2, 3, 0.5f, 7, 1, -1, 2}, y = x;
    rope_ref(y.data(), 1, 8, 0, f.data());
    EXPECT_EQ(x, y);
    rope_ref(y.data(), 1, 8, 123, f.data());
    double nx = 0, ny = 0;
    for (size_t i = 0; i < x.size(); ++i) nx += x[i] * x[i], ny += y[i] * y[i];
    EXPECT_NEAR(nx, ny, 1e-4);
}

TEST(Rope, Llama3Bands) {
    // Llama 3.2 parameters; the three bands of the rescaling, checked against the formula.
    RopeParams p;
    p.head_dim = 64;
    p.theta = 500000;
    p.freqs = RopeFreqs::Llama3;
    p.factor = 32;
    p.low_freq_factor = 1;
    p.high_freq_factor = 4;
    p.original_max_position = 8192;
    RopeParams plain = p;
    plain.freqs = RopeFreqs::Plain;
    const auto f = rope_inv_freq(p), g = rope_inv_freq(plain);
    int high = 0, low = 0, mid = 0;
    for (size_t i = 0; i < f.size(); ++i) {
        const double wavelen = 2 * M_PI / g[i];
        if (wavelen < 8192.0 / 4) {
            EXPECT_EQ(f[i], g[i]);
            ++high;
        } else if (wavelen > 8192.0) {
            EXPECT_FLOAT_EQ(f[i], g[i] / 32);
            ++low;
        } else {
            const double smooth = (8192.0 / wavelen - 1) / 3;
            EXPECT_NEAR(f[i], (1 - smooth) * g[i] / 32 + smooth * g[i], 1e-6 * g[i]);
            ++mid;
        }
    }
    EXPECT_GT(high, 0);
    EXPECT_GT(low, 0);
    EXPECT_GT(mid, 0);
}

// YaRN (HF's _compute_yarn_parameters, factor as given): values worked out apart from this code
// (Python, double precision, HF's formula) for Qwen3's yarn settings (head_dim 128, theta 1e6,
// factor 4 over 32768 positions: the ramp runs from dimension 23 to 40) and for a small head
// without truncation (the ramp from 12.88 to 20.11, beta 16 and 2). Linear divides every one.
TEST(Rope, YarnAndLinear) {
    RopeParams p;
    p.head_dim = 128;
    p.theta = 1e6f;
    p.freqs = RopeFreqs::Yarn;
    p.factor = 4;
    p.original_max_position = 32768;
    const auto f = rope_inv_freq(p);
    const std::pair<int, double> want[] = {{0, 1.0},           {10, 0.115478198},     {17, 0.0254829675},
                                           {20, 0.0133352143}, {30, 0.00106436098},   {40, 4.44569853e-05},
                                           {41, 3.58253143e-05}, {63, 3.1023444e-07}};
    for (const auto& [i, v] : want) EXPECT_NEAR(f[size_t(i)], v, 2e-6 * v) << i;
    RopeParams q;
    q.head_dim = 64;
    q.theta = 10000;
    q.freqs = RopeFreqs::Yarn;
    q.factor = 8;
    q.original_max_position = 4096;
    q.beta_fast = 16;
    q.beta_slow = 2;
    q.truncate = false;
    const auto g = rope_inv_freq(q);
    const std::pair<int, double> want_q[] = {{0, 1.0},  {5, 0.237137371},     {8, 0.1},
                                             {12, 0.0316227766}, {20, 0.000435575476}, {31, 1.66690179e-05}};
    for (const auto& [i, v] : want_q) EXPECT_NEAR(g[size_t(i)], v, 2e-6 * v) << i;
    RopeParams lin = q, plain = q;
    lin.freqs = RopeFreqs::Linear;
    plain.freqs = RopeFreqs::Plain;
    const auto l = rope_inv_freq(lin), base = rope_inv_freq(plain);
    for (size_t i = 0; i < l.size(); ++i) EXPECT_FLOAT_EQ(l[i], base[i] / 8) << i;
}
