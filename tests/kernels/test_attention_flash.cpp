// attention_cached_flash: a closed form across many key tiles, then every variant against
// attention_ref (on the values as the cache holds them) and against attention_cached on awkward
// shapes: 1, 3, 17 and 300 queries (block and tile edges), prefixes 0, 5 and 129, head dims 13,
// 16, 64 and 128, GQA groups 1, 2 and 4, all four cache precisions, padded rows and a wrapped ring.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/buffer.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/quantize.h"
#include "tests/kernels/attention_cache_util.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

struct Shape {
    int64_t n_q, q0, d, group, n_kv = 2, cap = 0, stride = 0;  // cap/stride 0: n_k / d
    int64_t window = 0;                                          // sliding window (0: none)
};

CachedAttention make_args(const Shape& s, const std::vector<float>& q, std::vector<float>& out, const Cache& c,
                          DType dt) {
    CachedAttention a;
    a.q = q.data();
    a.out = out.data();
    a.n_q = s.n_q;
    a.n_heads = s.n_kv * s.group;
    a.n_kv_heads = s.n_kv;
    a.head_dim = s.d;
    a.q_pos0 = s.q0;
    a.window = s.window;
    a.k = c.k.data();
    a.v = c.v.data();
    a.kv_dtype = dt;
    a.capacity = s.cap ? s.cap : s.q0 + s.n_q;
    a.row_stride = s.stride ? s.stride : s.d;
    a.scale = 1 / std::sqrt(float(s.d));
    if (dt == DType::I8) {
        a.k_scales = c.k_scales.data();
        a.v_scales = c.v_scales.data();
    }
    return a;
}

// Every variant of attention_cached_flash against attention_ref on the cached values and against
// attention_cached. Tolerance: f32 scores, online softmax and sums against a double reference;
// outputs are convex combinations of values <= 2 in size over up to 429 keys.
void check_shape(const Shape& s, uint32_t seed) {
    const int64_t n_k = s.q0 + s.n_q, n_heads = s.n_kv * s.group;
    const int64_t cap = s.cap ? s.cap : n_k, stride = s.stride ? s.stride : s.d;
    const auto q = rand_vec(size_t(s.n_q * n_heads * s.d), seed, 2.0f),
               k = rand_vec(size_t(n_k * s.n_kv * s.d), seed + 1, 2.0f),
               v = rand_vec(size_t(n_k * s.n_kv * s.d), seed + 2, 2.0f);
    for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I8}) {
        const Cache c = fill_cache(dt, k, v, n_k, s.n_kv, s.d, cap, stride);
        std::vector<float> want(q.size()), naive(q.size()), got(q.size());
        attention_ref(q.data(), c.k_back.data(), c.v_back.data(), want.data(), s.n_q, n_k, n_heads, s.n_kv, s.d, s.q0,
                      1 / std::sqrt(float(s.d)), s.window);
        for (CpuIsa isa : cpu_isas_available()) {
            std::fill(got.begin(), got.end(), NAN);
            CachedAttention a = make_args(s, q, got, c, dt);
            a.isa = isa;
            attention_cached_flash(a);
            a.out = naive.data();
            attention_cached(a);
            for (size_t i = 0; i < got.size(); ++i) {
                const auto where = [&] {
                    return testing::Message() << dtype_name(dt) << " " << cpu_isa_name(isa) << " n_q=" << s.n_q
                                              << " q0=" << s.q0 << " d=" << s.d << " group=" << s.group
                                              << " window=" << s.window << " i=" << i;
                };
                ASSERT_NEAR(got[i], want[i], 3e-5 + 3e-5 * std::fabs(want[i])) << where();
                ASSERT_NEAR(got[i], naive[i], 3e-5 + 3e-5 * std::fabs(naive[i])) << where();
            }
        }
    }
}

}  // namespace

TEST(AttentionFlash, UniformWeightsAverageThePrefix) {
    // q = 0: every visible key weighs the same, so query i (position i) returns the mean of values
    // 0 .. i, which is i / 2 for value rows V_j = j. 300 positions cross four 64-key tiles and
    // several query blocks, in every variant.
    const int64_t n = 300, d = 8;
    std::vector<float> q(size_t(n * d), 0.0f), k(size_t(n * d)), v(size_t(n * d)), out(q.size());
    for (int64_t j = 0; j < n; ++j)
        for (int64_t c = 0; c < d; ++c) {
            k[size_t(j * d + c)] = float((j * 7 + c) % 5) - 2.0f;
            v[size_t(j * d + c)] = float(j);
        }
    for (CpuIsa isa : cpu_isas_available()) {
        CachedAttention a;
        a.q = q.data();
        a.out = out.data();
        a.n_q = n;
        a.n_heads = a.n_kv_heads = 1;
        a.head_dim = d;
        a.k = k.data();
        a.v = v.data();
        a.capacity = n;
        a.row_stride = d;
        a.isa = isa;
        attention_cached_flash(a);
        for (int64_t i = 0; i < n; ++i)
            for (int64_t c = 0; c < d; ++c)
                ASSERT_NEAR(out[size_t(i * d + c)], float(i) / 2, 1e-5 * (1 + i)) << cpu_isa_name(isa) << " i=" << i;
    }
}

TEST(AttentionFlash, MatchesReferenceOnAwkwardShapes) {
    uint32_t seed = 10;
    for (int64_t d : {16, 64, 128})
        for (int64_t group : {1, 2, 4})
            for (int64_t n_q : {1, 3, 17})
                for (int64_t q0 : {0, 5, 129}) check_shape({n_q, q0, d, group}, seed += 3);
}

TEST(AttentionFlash, LongChunks) {
    // 300 queries: several query blocks per head (64 rows / group queries each) and a ragged last
    // block; prefix 129 starts the chunk two tiles in.
    uint32_t seed = 200;
    for (int64_t group : {1, 2, 4})
        for (int64_t q0 : {0, 5, 129}) check_shape({300, q0, group == 2 ? 128 : 16, group}, seed += 3);
    check_shape({300, 129, 64, 4, 1}, seed += 3);
}

TEST(AttentionFlash, OddHeadDimPaddedRowsAndWrappedRing) {
    // head_dim 13 (vector tails), rows padded to 16 elements, 3 query heads per KV head.
    check_shape({17, 5, 13, 3, 2, 0, 16}, 300);
    // Capacity 100 below 150 positions: positions p and p + 100 share a slot, as the engine's ring
    // does (attention_ref reads what the slot holds, like both kernels).
    check_shape({20, 130, 64, 2, 2, 100, 64}, 301);
    // Capacity larger than the sequence, rows padded to 128-byte alignment for f32.
    check_shape({9, 60, 40, 2, 2, 80, 64}, 302);
}

TEST(AttentionFlash, SlidingWindowOverAWrappedRing) {
    // Query at p sees keys p - window + 1 .. p only. The ring holds window + n_q - 1 positions (what
    // the engine keeps for a sliding-window model), far fewer than the sequence: every key a query
    // sees is still in its slot, and the first key of a window starts anywhere in a tile and in the
    // ring. Decode (one query: the per-query loops and the flash kernel's direct path), prefill
    // chunks across tiles and query blocks, a window of 1 (each query sees itself), and windows
    // longer than the sequence (no effect).
    uint32_t seed = 400;
    for (int64_t group : {1, 2, 4}) {
        check_shape({1, 200, 64, group, 2, 50, 64, 50}, seed += 3);
        check_shape({20, 130, 64, group, 2, 56, 64, 37}, seed += 3);
        check_shape({300, 5, 16, group, 2, 369, 16, 70}, seed += 3);
        check_shape({17, 90, 13, group, 2, 17, 16, 1}, seed += 3);
        check_shape({9, 60, 40, group, 2, 0, 64, 500}, seed += 3);
    }
    check_shape({300, 700, 128, 2, 2, 427, 128, 128}, seed += 3);
}

TEST(AttentionFlash, NeedsScalesAndValidHeads) {
    std::vector<float> q(4), out(4), kv(4);
    CachedAttention a;
    a.q = q.data();
    a.out = out.data();
    a.n_q = a.n_heads = a.n_kv_heads = 1;
    a.head_dim = 4;
    a.k = a.v = kv.data();
    a.capacity = 1;
    a.row_stride = 4;
    a.kv_dtype = DType::I8;
    EXPECT_ANY_THROW(attention_cached_flash(a));
    a.kv_dtype = DType::F32;
    a.n_heads = 3;
    a.n_kv_heads = 2;
    EXPECT_ANY_THROW(attention_cached_flash(a));
}
