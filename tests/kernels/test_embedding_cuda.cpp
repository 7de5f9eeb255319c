// embedding_cuda against embedding_ref for every table dtype on awkward shapes, with ids on and
// off this rank's vocabulary slice; skips where no GPU is usable.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemv.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using shardlm::test::DeviceBuffer;

namespace {

struct Case {
    int64_t rows, cols, group;  // group: I8 group size (0: per output channel)
    int64_t n, vocab0;
};

// The table in `dtype` on the host: raw bytes plus (I8) scales, and its WeightView.
struct HostTable {
    std::vector<uint8_t> bytes;
    std::vector<float> scales;
    int64_t group = 0;
};

HostTable make_table(DType dtype, const std::vector<float>& src, int64_t rows, int64_t cols, int64_t group) {
    HostTable t;
    const size_t n = src.size();
    t.bytes.resize(n * dtype_size(dtype));
    if (dtype == DType::F32) {
        std::memcpy(t.bytes.data(), src.data(), n * 4);
    } else if (dtype == DType::F16 || dtype == DType::BF16) {
        auto* h = reinterpret_cast<uint16_t*>(t.bytes.data());
        for (size_t i = 0; i < n; ++i) h[i] = dtype == DType::F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
    } else {
        t.group = group > 0 ? group : cols;
        t.scales.resize(size_t(rows * (cols / t.group)));
        WeightView s;
        s.dtype = DType::F32;
        s.data = src.data();
        s.rows = rows;
        s.cols = cols;
        quantize_weights_int8_ref(s, t.group, reinterpret_cast<int8_t*>(t.bytes.data()), t.scales.data());
    }
    return t;
}

// interleave: the table stored in the decode GEMV's column order first (a tied lm_head's).
void check_embedding(DType dtype, const Case& c, bool interleave = false) {
    const std::vector<float> src = test::rand_vec(size_t(c.rows * c.cols), uint32_t(c.rows + 7 * c.cols), 2.0f);
    const HostTable t = make_table(dtype, src, c.rows, c.cols, c.group);

    // Ids around the slice [vocab0, vocab0 + rows): below, inside (first, last, middle), above.
    std::vector<int32_t> ids(static_cast<size_t>(c.n));
    for (int64_t i = 0; i < c.n; ++i)
        ids[size_t(i)] = int32_t(c.vocab0 - 2 + (i * 7919) % (c.rows + 4));
    ids[0] = int32_t(c.vocab0);
    ids[size_t(c.n - 1)] = int32_t(c.vocab0 + c.rows - 1);

    WeightView view;
    view.dtype = dtype;
    view.data = t.bytes.data();
    view.rows = c.rows;
    view.cols = c.cols;
    view.scales = t.scales.data();
    view.group_size = t.group;
    std::vector<float> ref(size_t(c.n * c.cols), 0.0f);
    for (int64_t i = 0; i < c.n; ++i) {
        const int32_t local = int32_t(ids[size_t(i)] - c.vocab0);
        if (local >= 0 && local < c.rows) embedding_ref(view, &local, 1, ref.data() + i * c.cols);
    }

    DeviceBuffer<uint8_t> d_table(t.bytes);
    DeviceBuffer<float> d_scales(t.scales);
    DeviceBuffer<int32_t> d_ids(ids);
    DeviceBuffer<float> d_out(std::vector<float>(ref.size(), -1.0f));  // stale values must be overwritten
    DeviceMatrix m;
    m.dtype = dtype;
    m.data = d_table.get();
    m.scales = d_scales.get();
    m.rows = c.rows;
    m.cols = c.cols;
    m.group_size = t.group;
    if (interleave) {
        ASSERT_TRUE(gemv_interleave_cuda(m, nullptr));
    }
    embedding_cuda(m, d_ids.get(), c.n, c.vocab0, d_out.get(), nullptr);
    const std::vector<float> got = d_out.download();
    // A gather and an exact conversion (I8: one product q * scale): bit-identical to the reference.
    for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], ref[i]) << dtype_name(dtype) << (interleave ? " interleaved " : " ") << c.rows << "x" << c.cols
                                  << " group " << c.group
                                  << " token " << int64_t(i) / c.cols << " col " << int64_t(i) % c.cols;
}

}  // namespace

TEST(EmbeddingCuda, MatchesReferenceEveryDtype) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    const Case cases[] = {
        {1, 1, 0, 1, 0},          {7, 33, 11, 5, 0},        {50, 129, 43, 17, 100},
        {300, 2048, 128, 64, 0},  {1000, 4096, 0, 3, 5000}, {2, 5000, 1000, 9, 1},
    };
    for (const DType dtype : {DType::F32, DType::F16, DType::BF16, DType::I8})
        for (const Case& c : cases) check_embedding(dtype, c);
}

TEST(EmbeddingCuda, RowsOfOtherRanksAreZero) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    // vocab0 = 10, 4 rows: ids 9 and 14 belong to other ranks.
    const std::vector<float> table = {1, 2, 3, 4, 5, 6, 7, 8};  // [4, 2]
    const std::vector<int32_t> ids = {9, 10, 13, 14};
    DeviceBuffer<float> d_table(table);
    DeviceBuffer<int32_t> d_ids(ids);
    DeviceBuffer<float> d_out(std::vector<float>(8, -1.0f));
    DeviceMatrix m;
    m.dtype = DType::F32;
    m.data = d_table.get();
    m.rows = 4;
    m.cols = 2;
    embedding_cuda(m, d_ids.get(), 4, 10, d_out.get(), nullptr);
    EXPECT_EQ(d_out.download(), (std::vector<float>{0, 0, 1, 2, 7, 8, 0, 0}));
}

TEST(EmbeddingCuda, InterleavedTablesReadInNaturalOrder) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    const Case cases[] = {{300, 2048, 128, 64, 0}, {50, 256, 256, 17, 100}};
    for (const DType dtype : {DType::F16, DType::BF16, DType::I8})
        for (const Case& c : cases) check_embedding(dtype, c, true);
}
