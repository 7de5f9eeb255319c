#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "kernels/cpu/attention.h"

using namespace shardlm;

namespace {
std::vector<float> randv(size_t n, uint32_t seed) {
    std::vector<float> v(n);
    uint32_t s = seed * 2654435761u + 7;
    for (auto& x : v) {
        s = s * 1664525u + 1013904223u;
        x = float(int32_t(s >> 8) % 2001 - 1000) / 500.0f;
    }
    return v;
}
}  // namespace

TEST(Attention, HandComputedCausal) {
    // One head, d = 1. Keys 0 and 1, values 10 and 20, query 1 at position 1.
    // scores = [q*k0, q*k1] * scale = [0, ln 3] -> softmax [1/4, 3/4] -> out = 17.5
    const float q[] = {1}, k[] = {0, std::log(3.0f)}, v[] = {10, 20};
    float out = 0;
    attention_ref(q, k, v, &out, 1, 2, 1, 1, 1, 1, 1.0f);
    EXPECT_NEAR(out, 17.5f, 1e-5);
    // The same query at position 0 sees only key 0.
    attention_ref(q, k, v, &out, 1, 2, 1, 1, 1, 0, 1.0f);
    EXPECT_NEAR(out, 10.0f, 1e-6);
}

TEST(Attention, CachedMatchesReference) {
    // GQA (6 heads over 2 KV heads), odd head_dim, a chunk of queries starting mid-sequence,
    // every cache precision, and a ring capacity larger than the sequence.
    const int64_t n_heads = 6, n_kv = 2, d = 13, n_k = 23, q0 = 17, n_q = n_k - q0, cap = 29;
    const auto q = randv(size_t(n_q * n_heads * d), 1), k = randv(size_t(n_k * n_kv * d), 2),
               v = randv(size_t(n_k * n_kv * d), 3);
    std::vector<float> ref(q.size());
    const float scale = 1 / std::sqrt(float(d));
    attention_ref(q.data(), k.data(), v.data(), ref.data(), n_q, n_k, n_heads, n_kv, d, q0, scale);
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
        const int64_t stride = 16;  // padded rows
        const size_t es = dtype_size(dt);
        Buffer kc(size_t(n_kv * cap * stride) * es), vc(size_t(n_kv * cap * stride) * es);
        std::vector<float> kq(k.size()), vq(v.size());  // the values as the cache holds them
        for (int64_t j = 0; j < n_k; ++j)
            for (int64_t h = 0; h < n_kv; ++h)
                for (int64_t c = 0; c < d; ++c) {
                    const size_t src = size_t((j * n_kv + h) * d + c), dst = size_t((h * cap + j % cap) * stride + c);
                    for (int kv = 0; kv < 2; ++kv) {
                        const float x = (kv ? v : k)[src];
                        float& back = (kv ? vq : kq)[src];
                        uint8_t* base = (kv ? vc : kc).data();
                        if (dt == DType::F32) { reinterpret_cast<float*>(base)[dst] = x; back = x; }
                        else if (dt == DType::F16) { auto h16 = f32_to_f16(x); reinterpret_cast<uint16_t*>(base)[dst] = h16; back = f16_to_f32(h16); }
                        else { auto b16 = f32_to_bf16(x); reinterpret_cast<uint16_t*>(base)[dst] = b16; back = bf16_to_f32(b16); }
                    }
                }
        std::vector<float> want(q.size()), got(q.size());
        attention_ref(q.data(), kq.data(), vq.data(), want.data(), n_q, n_k, n_heads, n_kv, d, q0, scale);
        CachedAttention a;
        a.q = q.data();
        a.out = got.data();
        a.n_q = n_q;
        a.n_heads = n_heads;
        a.n_kv_heads = n_kv;
        a.head_dim = d;
        a.q_pos0 = q0;
        a.k = kc.data();
        a.v = vc.data();
        a.kv_dtype = dt;
        a.capacity = cap;
        a.row_stride = stride;
        a.scale = scale;
        attention_cached(a);
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5 + 1e-5 * std::fabs(want[i])) << dtype_name(dt);
        if (dt == DType::F32) {
            for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-5 + 1e-5 * std::fabs(ref[i]));
        }
    }
}
