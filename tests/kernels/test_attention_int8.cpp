// attention_cached: every variant and cache precision against attention_ref, and the INT8 cache
// against FP32 attention within a bound derived from the quantization steps.
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

CachedAttention make_args(const std::vector<float>& q, std::vector<float>& out, const Cache& c, DType dt, int64_t n_q,
                          int64_t n_heads, int64_t n_kv, int64_t d, int64_t q0, int64_t cap, int64_t stride, float scale) {
    CachedAttention a;
    a.q = q.data();
    a.out = out.data();
    a.n_q = n_q;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv;
    a.head_dim = d;
    a.q_pos0 = q0;
    a.k = c.k.data();
    a.v = c.v.data();
    a.kv_dtype = dt;
    a.capacity = cap;
    a.row_stride = stride;
    a.scale = scale;
    if (dt == DType::I8) {
        a.k_scales = c.k_scales.data();
        a.v_scales = c.v_scales.data();
    }
    return a;
}

struct Case {
    int64_t n_heads, n_kv, d, n_k, q0, cap, stride;
};

}  // namespace

TEST(AttentionInt8, EveryVariantMatchesReferenceOnCachedValues) {
    // GQA groups of 1, 2, 3 and 4; odd and vector-sized head dims; decode (one query) and chunks
    // starting mid-sequence; padded rows; a ring slot that wrapped (positions >= capacity are not
    // read by these cases since n_k <= cap).
    const Case cases[] = {{6, 2, 13, 23, 17, 29, 16}, {16, 8, 128, 70, 69, 70, 128}, {4, 4, 64, 33, 0, 40, 64},
                          {8, 2, 40, 100, 90, 128, 48}, {3, 1, 7, 5, 2, 5, 8}};
    for (const Case& cs : cases) {
        const int64_t n_q = cs.n_k - cs.q0;
        const auto q = rand_vec(size_t(n_q * cs.n_heads * cs.d), 1, 2.0f), k = rand_vec(size_t(cs.n_k * cs.n_kv * cs.d), 2, 2.0f),
                   v = rand_vec(size_t(cs.n_k * cs.n_kv * cs.d), 3, 2.0f);
        const float scale = 1 / std::sqrt(float(cs.d));
        for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I8}) {
            const Cache c = fill_cache(dt, k, v, cs.n_k, cs.n_kv, cs.d, cs.cap, cs.stride);
            std::vector<float> want(q.size()), got(q.size());
            attention_ref(q.data(), c.k_back.data(), c.v_back.data(), want.data(), n_q, cs.n_k, cs.n_heads, cs.n_kv, cs.d,
                          cs.q0, scale);
            for (CpuIsa isa : cpu_isas_available()) {
                std::fill(got.begin(), got.end(), NAN);
                CachedAttention a = make_args(q, got, c, dt, n_q, cs.n_heads, cs.n_kv, cs.d, cs.q0, cs.cap, cs.stride, scale);
                a.isa = isa;
                attention_cached(a);
                // f32 scores/softmax/sums against a double reference: outputs are convex combinations
                // of values <= 2 in size, rounded in f32 over up to 100 keys.
                for (size_t i = 0; i < got.size(); ++i)
                    ASSERT_NEAR(got[i], want[i], 2e-5 + 2e-5 * std::fabs(want[i]))
                        << dtype_name(dt) << " " << cpu_isa_name(isa) << " d=" << cs.d << " i=" << i;
            }
        }
    }
}

TEST(AttentionInt8, Int8CacheIsCloseToFp32) {
    // Bound. Keys/values are rounded to within s/2 of their row scale s (quantize.h). For query q
    // the scores move by at most eps = scale * max_j sum_c |q_c| sk_j / 2, which scales each softmax
    // weight by a factor in [e^-2eps, e^2eps], so |p'_j - p_j| <= (e^{2 eps} - 1) p_j; with
    // sum_j (p'_j - p_j) = 0 the output moves by at most (e^{2 eps} - 1) * max_j |v_jc| from the
    // weights plus max_j sv_j / 2 from the values: |o' - o| <= (e^{2 eps} - 1) max|v| + max sv / 2.
    const int64_t n_heads = 16, n_kv = 8, d = 128, n_k = 64, q0 = 48, n_q = n_k - q0, cap = 64;
    const auto q = rand_vec(size_t(n_q * n_heads * d), 4), k = rand_vec(size_t(n_k * n_kv * d), 5, 3.0f),
               v = rand_vec(size_t(n_k * n_kv * d), 6, 3.0f);
    const float scale = 1 / std::sqrt(float(d));
    std::vector<float> ref(q.size()), got(q.size());
    attention_ref(q.data(), k.data(), v.data(), ref.data(), n_q, n_k, n_heads, n_kv, d, q0, scale);
    const Cache c = fill_cache(DType::I8, k, v, n_k, n_kv, d, cap, d);
    int bounded = 0;
    for (CpuIsa isa : cpu_isas_available()) {
        CachedAttention a = make_args(q, got, c, DType::I8, n_q, n_heads, n_kv, d, q0, cap, d, scale);
        a.isa = isa;
        attention_cached(a);
        for (int64_t i = 0; i < n_q; ++i)
            for (int64_t h = 0; h < n_heads; ++h) {
                const int64_t kh = h / (n_heads / n_kv), last = q0 + i;
                double q_l1 = 0, max_sk = 0, max_sv = 0, max_v = 0;
                for (int64_t e = 0; e < d; ++e) q_l1 += std::fabs(q[size_t((i * n_heads + h) * d + e)]);
                for (int64_t j = 0; j <= last; ++j) {
                    max_sk = std::max(max_sk, double(c.k_scales[size_t(kh * cap + j)]));
                    max_sv = std::max(max_sv, double(c.v_scales[size_t(kh * cap + j)]));
                    for (int64_t e = 0; e < d; ++e) max_v = std::max(max_v, double(std::fabs(v[size_t((j * n_kv + kh) * d + e)])));
                }
                const double eps = scale * q_l1 * max_sk / 2;
                const double bound = std::expm1(2 * eps) * max_v + max_sv / 2 + 1e-5;
                for (int64_t e = 0; e < d; ++e) {
                    const size_t o = size_t((i * n_heads + h) * d + e);
                    ASSERT_LE(std::fabs(got[o] - ref[o]), bound) << cpu_isa_name(isa) << " i=" << i << " h=" << h;
                }
                ++bounded;
            }
    }
    EXPECT_GT(bounded, 0);
}

TEST(AttentionInt8, NeedsScales) {
    std::vector<float> q(4), out(4);
    Cache c = fill_cache(DType::I8, std::vector<float>(4), std::vector<float>(4), 1, 1, 4, 1, 4);
    CachedAttention a = make_args(q, out, c, DType::I8, 1, 1, 1, 4, 0, 1, 4, 1.0f);
    a.k_scales = nullptr;
    EXPECT_ANY_THROW(attention_cached(a));
}
