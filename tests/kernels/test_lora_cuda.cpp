// lora_add_cuda against lora_add_ref row by row: rows under different adapters of different ranks,
// base-model rows and an adapter that leaves the matrix alone (rank 0) in one call, F32 and BF16
// factors, y inside wider rows (a fused q|k|v output), a last column tile narrower than 64, and a
// prefill-sized call; skips where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/lora.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/lora.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using shardlm::test::DeviceBuffer;

namespace {

// One adapter's factors of one matrix as bytes of `dt` (A [rank, in], Bt [rank, out] in column
// tiles), random in [-1, 1], and the same with every sign cleared (abs): lora_add_ref over |x| and
// them bounds what a different order of the sums can change.
struct Factors {
    int64_t rank = 0;
    std::vector<uint8_t> a, bt, abs_a, abs_bt;
};

std::vector<uint8_t> to_bytes(const std::vector<float>& v, DType dt) {
    std::vector<uint8_t> b(v.size() * dtype_size(dt));
    for (size_t i = 0; i < v.size(); ++i) {
        if (dt == DType::F32) {
            std::memcpy(&b[i * 4], &v[i], 4);
        } else {
            const uint16_t h = f32_to_bf16(v[i]);
            std::memcpy(&b[i * 2], &h, 2);
        }
    }
    return b;
}

Factors make_factors(DType dt, int64_t rank, int64_t in, int64_t out, uint32_t seed) {
    Factors f;
    f.rank = rank;
    const std::vector<float> a = test::rand_vec(size_t(rank * in), seed, 1.0f);
    const std::vector<float> bt = test::rand_vec(size_t(rank * out), seed + 7, 1.0f);
    std::vector<float> abs_a(a.size()), abs_bt(bt.size());
    for (size_t i = 0; i < a.size(); ++i) abs_a[i] = std::fabs(a[i]);
    for (size_t i = 0; i < bt.size(); ++i) abs_bt[i] = std::fabs(bt[i]);
    f.a = to_bytes(a, dt);
    f.bt = to_bytes(bt, dt);
    f.abs_a = to_bytes(abs_a, dt);
    f.abs_bt = to_bytes(abs_bt, dt);
    return f;
}

// One matrix of a call: its adapters' factors, and where its update goes in y's rows.
struct PartSpec {
    int64_t out = 0, col = 0;
    std::vector<Factors> adapters;
};

// Runs T rows (row_adapter[i] indexes each part's adapters, or is -1) through one lora_add_cuda
// call whose parts write into y's rows of `ldy` at their columns, and checks every row against
// lora_add_ref part by part: the updates within the rounding bound, every other element (and
// every column of a row left alone) bit for bit.
void check(DType dt, int64_t in, int64_t ldy, const std::vector<PartSpec>& parts, const std::vector<int32_t>& row_adapter,
           int64_t max_rank) {
    const int64_t T = int64_t(row_adapter.size());
    const std::vector<float> x = test::rand_vec(size_t(T * in), uint32_t(T + in), 2.0f);
    const std::vector<float> y0 = test::rand_vec(size_t(T * ldy), uint32_t(ldy + 3), 3.0f);

    std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> held;
    DeviceBuffer<int32_t> d_rows(row_adapter);
    DeviceBuffer<float> dx(x), dy(y0), dt_(size_t(std::max<int64_t>(kLoraMaxParts * T * max_rank, 1)));
    LoraParts lp;
    for (const PartSpec& ps : parts) {
        std::vector<LoraSlot> slots;
        for (const Factors& f : ps.adapters) {
            held.push_back(std::make_unique<DeviceBuffer<uint8_t>>(f.a));
            held.push_back(std::make_unique<DeviceBuffer<uint8_t>>(f.bt));
            slots.push_back(LoraSlot{held[held.size() - 2]->get(), held.back()->get(), int32_t(f.rank)});
        }
        std::vector<uint8_t> slot_bytes(slots.size() * sizeof(LoraSlot));
        std::memcpy(slot_bytes.data(), slots.data(), slot_bytes.size());
        held.push_back(std::make_unique<DeviceBuffer<uint8_t>>(slot_bytes));
        lp.p[lp.n++] = LoraPart{reinterpret_cast<const LoraSlot*>(held.back()->get()), dy.get() + ps.col, ps.out, ldy};
    }
    lora_add_cuda(dx.get(), T, in, lp, d_rows.get(), dt, max_rank, dt_.get(), nullptr);
    const std::vector<float> got = dy.download();

    std::vector<float> x_abs(x.size());
    for (size_t i = 0; i < x.size(); ++i) x_abs[i] = std::fabs(x[i]);
    std::vector<float> t(size_t(std::max<int64_t>(max_rank, 1)));
    for (int64_t i = 0; i < T; ++i) {
        const int32_t s = row_adapter[size_t(i)];
        std::vector<float> ref(y0.begin() + i * ldy, y0.begin() + (i + 1) * ldy);
        std::vector<float> bound(size_t(ldy), 0.0f);
        for (const PartSpec& ps : parts) {
            if (s < 0 || ps.adapters[size_t(s)].rank == 0) continue;
            const Factors& f = ps.adapters[size_t(s)];
            lora_add_ref(x.data() + i * in, 1, in, f.a.data(), f.bt.data(), dt, f.rank, ps.out, t.data(), ref.data() + ps.col);
            std::vector<float> m(size_t(ps.out), 0.0f);
            lora_add_ref(x_abs.data() + i * in, 1, in, f.abs_a.data(), f.abs_bt.data(), dt, f.rank, ps.out, t.data(), m.data());
            for (int64_t o = 0; o < ps.out; ++o) bound[size_t(ps.col + o)] = 4.0f * float(in + f.rank) * 6e-8f * m[size_t(o)];
        }
        for (int64_t o = 0; o < ldy; ++o) {
            const float g = got[size_t(i * ldy + o)], r = ref[size_t(o)];
            if (bound[size_t(o)] == 0.0f)
                ASSERT_EQ(std::memcmp(&g, &r, 4), 0) << "row " << i << " (adapter " << s << ") column " << o << " changed";
            else
                ASSERT_NEAR(g, r, bound[size_t(o)]) << "row " << i << " (adapter " << s << ") column " << o;
        }
    }
}

}  // namespace

TEST(LoraCuda, RowsUnderTheirOwnAdaptersMatchTheReference) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (const DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(dtype_name(dt));
        // in 37 (no multiple of 32), out 150 (tiles of 64, 64 and 22) inside rows of 171 from column
        // 13; ranks 5 and 9 (max_rank 9: the last group of four k's part empty) and an adapter of
        // rank 0; base rows between.
        const int64_t in = 37, out = 150;
        const PartSpec one{out, 13, {make_factors(dt, 5, in, out, 1), make_factors(dt, 9, in, out, 2), Factors{}}};
        check(dt, in, 171, {one}, {0, -1, 1, 1, 2, 0, -1}, 9);
        // max_rank above every slot's (the engine's scratch is for the largest adapter it holds).
        check(dt, in, 171, {one}, {1, 0}, 12);
        // Only base rows: nothing moves.
        check(dt, in, 171, {one}, {-1, -1, -1}, 9);
        // out below one tile (a k/v slice of a small model), rank 1.
        check(dt, 64, 40, {PartSpec{24, 16, {make_factors(dt, 1, 64, 24, 3)}}}, {0, 0, -1}, 1);
        // Three parts of one input, as q|k|v: a fused row of 96 + 40 + 40 columns, each part with its
        // own adapters' factors (adapter 1 leaves k alone), the expand's blocks past k's and v's
        // columns idle.
        // (in 37: the shrink's scalar loads; 96: its 16-byte loads.)
        for (const int64_t w : {in, int64_t(96)}) {
            const PartSpec q{96, 0, {make_factors(dt, 3, w, 96, 4), make_factors(dt, 6, w, 96, 5)}};
            const PartSpec k{40, 96, {make_factors(dt, 3, w, 40, 6), Factors{}}};
            const PartSpec v{40, 136, {make_factors(dt, 3, w, 40, 7), make_factors(dt, 6, w, 40, 8)}};
            check(dt, w, 176, {q, k, v}, {1, 0, -1, 1, 0}, 6);
        }
    }
}

TEST(LoraCuda, PrefillRowsMatchTheReference) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    // 70 rows, two adapters of rank 16 over a 320-wide input (the shrink's 16-byte loads, 40 per
    // row for 128 threads) into 192 and 64 columns (gate|up-like, whole tiles), in runs as the
    // batcher lays out chunks.
    const int64_t in = 320;
    const PartSpec gate{192, 0, {make_factors(DType::BF16, 16, in, 192, 4), make_factors(DType::BF16, 16, in, 192, 5)}};
    const PartSpec up{64, 192, {make_factors(DType::BF16, 16, in, 64, 6), make_factors(DType::BF16, 16, in, 64, 7)}};
    std::vector<int32_t> rows;
    for (int i = 0; i < 70; ++i) rows.push_back(i < 30 ? 0 : i < 45 ? -1 : 1);
    check(DType::BF16, in, 256, {gate, up}, rows, 16);
}

TEST(LoraCuda, RefusesWhatItCannotRun) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    float y[8] = {};
    const LoraSlot* slots = reinterpret_cast<const LoraSlot*>(y);  // never read: every call below is refused
    LoraParts p;
    p.p[p.n++] = LoraPart{slots, y, 8, 8};
    EXPECT_THROW(lora_add_cuda(y, 1, 8, p, nullptr, DType::F16, 4, y, nullptr), Error);
    // y's rows narrower than the update; no parts.
    p.p[0].ldy = 7;
    EXPECT_THROW(lora_add_cuda(y, 1, 8, p, nullptr, DType::BF16, 4, y, nullptr), Error);
    EXPECT_THROW(lora_add_cuda(y, 1, 8, LoraParts{}, nullptr, DType::BF16, 4, y, nullptr), Error);
}
