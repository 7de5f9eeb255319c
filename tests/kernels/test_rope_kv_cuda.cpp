// rope_kv_cuda against the CPU chain it fuses (per-head rmsnorm_ref, rope_ref, quantize_row_int8 /
// f32_to_f16 / f32_to_bf16) for every cache dtype on awkward shapes; skips where no GPU is usable.
//
// Three checks per case: q and k against the references (FP32 tolerance: sincosf and rsqrtf
// differ from the CPU by a few ulp); every written cache row against the GPU's own k and v
// converted on the CPU (bit-exact: the conversions are the same float operations); and the
// dequantized rows against the CPU references (one rounding step of the cache dtype, since a
// last-bit difference in k can flip a rounding tie). Unwritten rows, the padding of written rows
// and unwritten scales must keep their sentinel bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/rope_kv.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using shardlm::test::DeviceBuffer;

namespace {

constexpr float kEps = 1e-6f;
constexpr uint8_t kSentinel = 0xA5;  // as f32 0xA5A5A5A5 ~ -2.9e-16, as f16/bf16 a small negative

struct Case {
    int64_t T, n_heads, n_kv_heads, head_dim, n_slots, capacity;
    int32_t pos0;  // token t sits at position pos0 + t / n_slots of slot t % n_slots
    bool qk_norm, llama3;
};

// The value a cache element of `dtype` decodes to (I8 handled by the caller).
float decode(DType dtype, const uint8_t* row, int64_t i) {
    if (dtype == DType::F32) {
        float v;
        std::memcpy(&v, row + 4 * i, 4);
        return v;
    }
    uint16_t h;
    std::memcpy(&h, row + 2 * i, 2);
    return dtype == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

// x rounded to the cache dtype and back, the CPU's way (the bit-exact expectation).
float round_trip(DType dtype, float x) {
    if (dtype == DType::F16) return f16_to_f32(f32_to_f16(x));
    if (dtype == DType::BF16) return bf16_to_f32(f32_to_bf16(x));
    return x;
}

// Checks one written cache row (head_dim values + padding) against `own` (the GPU's k or v head,
// converted here bit-exactly) and `ref` (the CPU chain's head, within one rounding step).
void check_row(DType dtype, const uint8_t* row, int64_t row_stride, const float* scale, const float* own,
               const float* ref, int64_t hd, const char* what) {
    const size_t es = dtype_size(dtype);
    for (size_t b = size_t(hd) * es; b < size_t(row_stride) * es; ++b)
        ASSERT_EQ(row[b], kSentinel) << what << ": padding byte " << b << " was written";
    if (dtype == DType::I8) {
        std::vector<int8_t> q_own(static_cast<size_t>(hd)), q_ref(q_own.size());
        const float s_own = quantize_row_int8(own, hd, q_own.data());
        const float s_ref = quantize_row_int8(ref, hd, q_ref.data());
        ASSERT_EQ(*scale, s_own) << what << ": scale";
        ASSERT_NEAR(*scale, s_ref, 1e-5 * s_ref + 1e-12) << what << ": scale vs reference";
        for (int64_t i = 0; i < hd; ++i) {
            const int8_t q = static_cast<int8_t>(row[i]);
            ASSERT_EQ(q, q_own[size_t(i)]) << what << ": int8 at " << i;
            ASSERT_NEAR(float(q) * *scale, ref[i], s_ref + 1e-5) << what << ": dequantized at " << i;
        }
        return;
    }
    // One rounding step of the dtype, relative; f32 keeps the FP32 tolerance of q and k.
    const double step = dtype == DType::F16 ? 1.0 / 1024 : dtype == DType::BF16 ? 1.0 / 128 : 0.0;
    for (int64_t i = 0; i < hd; ++i) {
        const float got = decode(dtype, row, i);
        ASSERT_EQ(got, round_trip(dtype, own[i])) << what << ": element " << i;
        ASSERT_NEAR(got, ref[i], 1e-5 + (1e-5 + step) * std::fabs(ref[i])) << what << ": vs reference at " << i;
    }
}

// fused: q, k, v are read from one [T, q | k | v] buffer (a fused QKV projection's output) with
// row_stride, and the rotated q goes to a packed q_out.
void check_rope_kv(DType dtype, const Case& c, bool fused = false) {
    const int64_t T = c.T, nh = c.n_heads, nkv = c.n_kv_heads, hd = c.head_dim;
    const size_t es = dtype_size(dtype);
    const int64_t row_stride = (hd * int64_t(es) + 127) / 128 * 128 / int64_t(es);  // rows of 128 bytes
    const int64_t cache_rows = c.n_slots * nkv * c.capacity;

    std::vector<float> q = test::rand_vec(size_t(T * nh * hd), uint32_t(hd + 1), 2.0f);
    std::vector<float> k = test::rand_vec(size_t(T * nkv * hd), uint32_t(hd + 2), 2.0f);
    const std::vector<float> v = test::rand_vec(size_t(T * nkv * hd), uint32_t(hd + 3), 2.0f);
    std::vector<float> q_norm(static_cast<size_t>(hd)), k_norm(q_norm.size());
    for (int64_t i = 0; i < hd; ++i) {
        q_norm[size_t(i)] = 1.0f + 0.05f * std::sin(float(i));
        k_norm[size_t(i)] = 0.8f + 0.03f * std::cos(float(i));
    }
    if (!k.empty()) std::fill(k.begin(), k.begin() + hd, 0.0f);  // an all-zero head: scale 0, q 0
    RopeParams rp;
    rp.head_dim = hd;
    rp.theta = c.llama3 ? 500000.0f : 1000000.0f;
    rp.freqs = c.llama3 ? RopeFreqs::Llama3 : RopeFreqs::Plain;
    rp.factor = 32;
    const std::vector<float> inv_freq = rope_inv_freq(rp);

    std::vector<int32_t> pos(static_cast<size_t>(T)), slot(pos.size());
    std::map<int64_t, int64_t> writer;  // cache row (of head 0) -> token
    for (int64_t t = 0; t < T; ++t) {
        slot[size_t(t)] = int32_t(t % c.n_slots);
        pos[size_t(t)] = c.pos0 + int32_t(t / c.n_slots);
        const int64_t row = (slot[size_t(t)] * nkv) * c.capacity + pos[size_t(t)] % c.capacity;
        ASSERT_TRUE(writer.emplace(row, t).second) << "test case writes one cache row twice";
    }

    // The CPU chain.
    std::vector<float> q_ref = q, k_ref = k;
    if (c.qk_norm) {
        rmsnorm_ref(q_ref.data(), q_norm.data(), q_ref.data(), T * nh, hd, kEps);
        rmsnorm_ref(k_ref.data(), k_norm.data(), k_ref.data(), T * nkv, hd, kEps);
    }
    for (int64_t t = 0; t < T; ++t) {
        rope_ref(q_ref.data() + t * nh * hd, nh, hd, pos[size_t(t)], inv_freq.data());
        rope_ref(k_ref.data() + t * nkv * hd, nkv, hd, pos[size_t(t)], inv_freq.data());
    }

    DeviceBuffer<float> dq(q), dk(k), dv(v), dqn(q_norm), dkn(k_norm), dfreq(inv_freq);
    DeviceBuffer<int32_t> dpos(pos), dslot(slot);
    const std::vector<uint8_t> blank(size_t(cache_rows * row_stride) * es, kSentinel);
    DeviceBuffer<uint8_t> dkc(blank), dvc(blank);
    const std::vector<uint8_t> blank_scales(size_t(cache_rows) * 4, kSentinel);
    DeviceBuffer<float> dks(cache_rows), dvs(cache_rows);
    CUDA_CHECK(cudaMemcpy(dks.get(), blank_scales.data(), blank_scales.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dvs.get(), blank_scales.data(), blank_scales.size(), cudaMemcpyHostToDevice));

    RopeKVParams p;
    const int64_t W = (nh + 2 * nkv) * hd;
    std::vector<float> qkv(static_cast<size_t>(T * W));
    for (int64_t t = 0; t < T; ++t) {
        std::copy(q.begin() + t * nh * hd, q.begin() + (t + 1) * nh * hd, qkv.begin() + t * W);
        std::copy(k.begin() + t * nkv * hd, k.begin() + (t + 1) * nkv * hd, qkv.begin() + t * W + nh * hd);
        std::copy(v.begin() + t * nkv * hd, v.begin() + (t + 1) * nkv * hd, qkv.begin() + t * W + (nh + nkv) * hd);
    }
    DeviceBuffer<float> dqkv(qkv), dqout(q.size());
    p.q = fused ? dqkv.get() : dq.get();
    p.k = fused ? dqkv.get() + nh * hd : dk.get();
    p.v = fused ? dqkv.get() + (nh + nkv) * hd : dv.get();
    p.row_stride = fused ? W : 0;
    p.q_out = fused ? dqout.get() : nullptr;
    p.T = T;
    p.n_heads = nh;
    p.n_kv_heads = nkv;
    p.head_dim = hd;
    p.pos = dpos.get();
    p.slot = dslot.get();
    p.inv_freq = dfreq.get();
    p.q_norm = c.qk_norm ? dqn.get() : nullptr;
    p.k_norm = c.qk_norm ? dkn.get() : nullptr;
    p.eps = kEps;
    p.kv.k = dkc.get();
    p.kv.v = dvc.get();
    p.kv.k_scales = dtype == DType::I8 ? dks.get() : nullptr;
    p.kv.v_scales = dtype == DType::I8 ? dvs.get() : nullptr;
    p.kv.dtype = dtype;
    p.kv.n_slots = c.n_slots;
    p.kv.n_kv_heads = nkv;
    p.kv.capacity = c.capacity;
    p.kv.row_stride = row_stride;
    rope_kv_cuda(p, nullptr);

    const std::vector<float> q_got = fused ? dqout.download() : dq.download();
    std::vector<float> k_got = dk.download();
    if (fused) {
        const std::vector<float> all = dqkv.download();
        for (int64_t t = 0; t < T; ++t)
            std::copy(all.begin() + t * W + nh * hd, all.begin() + t * W + (nh + nkv) * hd, k_got.begin() + t * nkv * hd);
    }
    const std::vector<uint8_t> kc = dkc.download(), vc = dvc.download();
    const std::vector<float> ks = dks.download(), vs = dvs.download();
    const auto tag = [&](const char* what) {
        return ::testing::Message() << dtype_name(dtype) << " T" << T << " heads " << nh << "/" << nkv << " hd "
                                    << hd << " " << what;
    };
    for (size_t i = 0; i < q_got.size(); ++i)
        ASSERT_NEAR(q_got[i], q_ref[i], 1e-5 + 1e-5 * std::fabs(q_ref[i])) << tag("q") << " at " << i;
    for (size_t i = 0; i < k_got.size(); ++i)
        ASSERT_NEAR(k_got[i], k_ref[i], 1e-5 + 1e-5 * std::fabs(k_ref[i])) << tag("k") << " at " << i;

    const size_t row_bytes = size_t(row_stride) * es;
    for (int64_t slot_i = 0; slot_i < c.n_slots; ++slot_i)
        for (int64_t h = 0; h < nkv; ++h)
            for (int64_t r = 0; r < c.capacity; ++r) {
                const int64_t row = (slot_i * nkv + h) * c.capacity + r;
                const auto w = writer.find((slot_i * nkv) * c.capacity + r);
                if (w == writer.end()) {
                    for (size_t b = 0; b < row_bytes; ++b) {
                        ASSERT_EQ(kc[size_t(row) * row_bytes + b], kSentinel) << tag("unwritten K row ") << row;
                        ASSERT_EQ(vc[size_t(row) * row_bytes + b], kSentinel) << tag("unwritten V row ") << row;
                    }
                    if (dtype == DType::I8) {
                        ASSERT_EQ(std::memcmp(&ks[size_t(row)], blank_scales.data(), 4), 0) << tag("K scale ") << row;
                        ASSERT_EQ(std::memcmp(&vs[size_t(row)], blank_scales.data(), 4), 0) << tag("V scale ") << row;
                    }
                    continue;
                }
                const int64_t head = (w->second * nkv + h) * hd;  // offset of this head in k / v
                SCOPED_TRACE(tag("cache row") << " " << row << " token " << w->second << " head " << h);
                check_row(dtype, &kc[size_t(row) * row_bytes], row_stride, &ks[size_t(row)], &k_got[size_t(head)],
                          &k_ref[size_t(head)], hd, "K");
                check_row(dtype, &vc[size_t(row) * row_bytes], row_stride, &vs[size_t(row)], &v[size_t(head)],
                          &v[size_t(head)], hd, "V");
                if (::testing::Test::HasFatalFailure()) return;
            }
}

}  // namespace

TEST(RopeKVCuda, MatchesReferenceEveryCacheDtype) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    const Case cases[] = {
        // T, heads, kv heads, head_dim, slots, capacity, pos0, qk_norm, llama3
        {1, 1, 1, 2, 1, 1, 0, false, false},        // smallest: one pair, one lane busy
        {5, 4, 2, 64, 2, 7, 12, true, false},       // ring wrap: positions 12..14 in rows 5..0
        {3, 16, 8, 128, 3, 40, 40000, true, false}, // Qwen3-1.7B heads at a large position
        {2, 3, 1, 256, 1, 5, 3, false, false},      // the largest head: 4 pairs per lane
        {17, 6, 2, 34, 2, 9, 0, true, false},       // odd half (17), padded rows
        {2, 32, 8, 128, 2, 1000, 131000, false, true},  // Llama 3 frequencies near 128k
        {9, 5, 5, 96, 9, 3, 1, false, false},       // one token per slot, half = 48 (1.5 warps)
    };
    for (const DType dtype : {DType::F32, DType::F16, DType::BF16, DType::I8})
        for (const Case& c : cases) {
            check_rope_kv(dtype, c);
            if (::testing::Test::HasFatalFailure()) return;
            check_rope_kv(dtype, c, true);  // the fused-QKV layout
            if (::testing::Test::HasFatalFailure()) return;
        }
}
