// rmsnorm_cuda, add_rmsnorm_cuda and rmsnorm_rows_cuda against rmsnorm_ref on awkward shapes, and
// add_rmsnorm_quantize_cuda against the two kernels it fuses; skips where no GPU is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/gather.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/w8a8.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using shardlm::test::DeviceBuffer;

namespace {

constexpr float kEps = 1e-6f;
// Vector path (dim % 4 == 0, <= 8192): 4 ... 8192 with full and partial float4s per thread; the rest scalar.
const int64_t kShapes[][2] = {{1, 1}, {3, 7}, {5, 33}, {2, 255}, {2, 4}, {3, 1028}, {7, 2048}, {2, 4100},
                              {1, 5000}, {64, 129}, {3, 8192}, {1, 8196}};

std::vector<float> norm_weights(int64_t dim) {
    std::vector<float> w(static_cast<size_t>(dim));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 1.0f + 0.01f * float(i % 17);
    return w;
}

// FP32 block reduction against the reference's double sum, and rsqrtf (2 ulp): a few 1e-6 relative.
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, int64_t dim, const char* what) {
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], ref[i], 1e-5 + 1e-5 * std::fabs(ref[i]))
            << what << " dim " << dim << " row " << int64_t(i) / dim << " col " << int64_t(i) % dim;
}

}  // namespace

TEST(RmsNormCuda, MatchesReference) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (const auto& s : kShapes) {
        const int64_t rows = s[0], dim = s[1];
        std::vector<float> x(size_t(rows * dim)), ref(x.size());
        for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.37f) * 3.0f;
        const std::vector<float> w = norm_weights(dim);
        rmsnorm_ref(x.data(), w.data(), ref.data(), rows, dim, kEps);
        DeviceBuffer<float> dx(x), dw(w), dy(x.size());
        rmsnorm_cuda(dx.get(), dw.get(), dy.get(), rows, dim, kEps, nullptr);
        expect_close(dy.download(), ref, dim, "rmsnorm");
        // In place, as the reference allows.
        rmsnorm_cuda(dx.get(), dw.get(), dx.get(), rows, dim, kEps, nullptr);
        expect_close(dx.download(), ref, dim, "rmsnorm in place");
    }
}

TEST(RmsNormCuda, AddRmsNormUpdatesResidualAndNorms) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (const auto& s : kShapes) {
        const int64_t rows = s[0], dim = s[1];
        const std::vector<float> x = test::rand_vec(size_t(rows * dim), uint32_t(dim), 4.0f);
        const std::vector<float> delta = test::rand_vec(x.size(), uint32_t(dim + 1), 2.0f);
        const std::vector<float> w = norm_weights(dim);
        for (const bool with_delta : {true, false}) {
            std::vector<float> sum = x, ref(x.size());
            if (with_delta)
                for (size_t i = 0; i < sum.size(); ++i) sum[i] = x[i] + delta[i];
            rmsnorm_ref(sum.data(), w.data(), ref.data(), rows, dim, kEps);
            DeviceBuffer<float> dx(x), dd(delta), dw(w), dy(x.size());
            add_rmsnorm_cuda(dx.get(), with_delta ? dd.get() : nullptr, dw.get(), dy.get(), rows, dim, kEps, nullptr);
            // One float addition per element: the residual must be exact.
            const std::vector<float> got_x = dx.download();
            for (size_t i = 0; i < sum.size(); ++i)
                ASSERT_EQ(got_x[i], sum[i]) << "residual dim " << dim << " delta " << with_delta << " at " << i;
            expect_close(dy.download(), ref, dim, with_delta ? "add_rmsnorm" : "add_rmsnorm without delta");
        }
    }
}

// The norm that writes its output in an act-order projection's input order: bit for bit the plain
// norm followed by gather_columns_cuda (x's residual too), on every shape of both paths (an order
// that reverses the row and then swaps neighbours: every element moves, across threads and float4s),
// and within the reference's bounds of rmsnorm_ref followed by the CPU gather.
TEST(RmsNormCuda, AddRmsNormInAnOrderIsTheNormGathered) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (const auto& s : kShapes) {
        const int64_t rows = s[0], dim = s[1];
        const std::vector<float> x = test::rand_vec(size_t(rows * dim), uint32_t(dim + 7), 4.0f);
        const std::vector<float> delta = test::rand_vec(x.size(), uint32_t(dim + 8), 2.0f);
        const std::vector<float> w = norm_weights(dim);
        std::vector<int32_t> order(static_cast<size_t>(dim));
        for (int64_t j = 0; j < dim; ++j) order[size_t(j)] = int32_t(dim - 1 - ((j ^ 1) < dim ? (j ^ 1) : j));
        for (const bool with_delta : {true, false}) {
            const float* d = nullptr;
            DeviceBuffer<float> dd(delta), dw(w), plain_x(x), plain_y(x.size()), gathered(x.size()), ox(x), oy(x.size());
            DeviceBuffer<int32_t> dorder(order);
            if (with_delta) d = dd.get();
            add_rmsnorm_cuda(plain_x.get(), d, dw.get(), plain_y.get(), rows, dim, kEps, nullptr);
            gather_columns_cuda(plain_y.get(), rows, dim, 1, dorder.get(), dim, gathered.get(), nullptr);
            add_rmsnorm_cuda(ox.get(), d, dw.get(), oy.get(), rows, dim, kEps, nullptr, dorder.get());
            const std::string what = "dim " + std::to_string(dim) + (with_delta ? " with delta" : " without");
            ASSERT_EQ(ox.download(), plain_x.download()) << what;
            ASSERT_EQ(oy.download(), gathered.download()) << what;
            std::vector<float> sum = x, normed(x.size()), ref(x.size());
            if (with_delta)
                for (size_t i = 0; i < sum.size(); ++i) sum[i] = x[i] + delta[i];
            rmsnorm_ref(sum.data(), w.data(), normed.data(), rows, dim, kEps);
            gather_columns(normed.data(), rows, dim, 1, order.data(), dim, ref.data());
            expect_close(oy.download(), ref, dim, "add_rmsnorm in an order");
        }
    }
}

// The norm that also quantizes its output for a W8A8 projection: x, y, q and the scales bit for
// bit those of add_rmsnorm_cuda followed by quantize_acts_cuda (one kernel on the vector path, the
// two in turn elsewhere), and q, scales those of quantize_acts_int8_ref on the GPU's y. A zero row
// (scale 0, q 0) rides along.
TEST(RmsNormCuda, AddRmsNormQuantizeEqualsTheTwoKernels) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (const auto& s : kShapes) {
        const int64_t rows = s[0] + 1, dim = s[1];
        std::vector<float> x = test::rand_vec(size_t(rows * dim), uint32_t(dim + 5), 4.0f);
        std::fill(x.end() - dim, x.end(), 0.0f);
        std::vector<float> delta = test::rand_vec(x.size(), uint32_t(dim + 6), 2.0f);
        std::fill(delta.end() - dim, delta.end(), 0.0f);
        const std::vector<float> w = norm_weights(dim);
        for (const bool with_delta : {true, false}) {
            const size_t n_rows = size_t(rows);
            DeviceBuffer<float> dx(x), dx2(x), dd(delta), dw(w), dy(x.size()), dy2(x.size()), ds(n_rows), ds2(n_rows);
            DeviceBuffer<int8_t> dq(x.size()), dq2(x.size());
            const float* d = with_delta ? dd.get() : nullptr;
            add_rmsnorm_quantize_cuda(dx.get(), d, dw.get(), dy.get(), rows, dim, kEps, dq.get(), ds.get(), nullptr);
            add_rmsnorm_cuda(dx2.get(), d, dw.get(), dy2.get(), rows, dim, kEps, nullptr);
            quantize_acts_cuda(dy2.get(), rows, dim, dim, dq2.get(), ds2.get(), nullptr);
            const std::string what = "dim " + std::to_string(dim) + (with_delta ? " delta" : "");
            EXPECT_EQ(dx.download(), dx2.download()) << what << ": residual";
            const std::vector<float> y = dy.download();
            EXPECT_EQ(y, dy2.download()) << what << ": y";
            const std::vector<int8_t> q = dq.download();
            const std::vector<float> sc = ds.download();
            EXPECT_EQ(q, dq2.download()) << what << ": q";
            EXPECT_EQ(sc, ds2.download()) << what << ": scales";
            std::vector<int8_t> q_ref(q.size());
            std::vector<float> s_ref(n_rows);
            quantize_acts_int8_ref(y.data(), rows, dim, dim, q_ref.data(), s_ref.data());
            EXPECT_EQ(q, q_ref) << what << ": q against the CPU";
            EXPECT_EQ(sc, s_ref) << what << ": scales against the CPU";
            EXPECT_EQ(sc.back(), 0.0f) << what << ": the zero row";
            if (HasFailure()) return;
        }
    }
}

// The norm writing a prefill GEMM's 16-bit input (add_rmsnorm_half_cuda): the residual as
// add_rmsnorm_cuda leaves it, and the normed rows as the GEMM's conversion would write them (both
// types, natural and interleaved column order), bit for bit; shapes the vector path cannot take
// are handed back (false) untouched.
TEST(RmsNormCuda, HalfOutputIsTheGemmsConversion) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    struct Shape { int64_t rows, dim; int ic; };
    for (const Shape sh : {Shape{5, 36, 0}, Shape{3, 2048, 16}, Shape{2, 1024, 8}, Shape{7, 8192, 16}, Shape{1, 128, 8}})
        for (const DType t : {DType::F16, DType::BF16}) {
            const int64_t rows = sh.rows, dim = sh.dim;
            const std::vector<float> x = test::rand_vec(size_t(rows * dim), uint32_t(dim + 11), 4.0f);
            const std::vector<float> delta = test::rand_vec(x.size(), uint32_t(dim + 12), 2.0f);
            const std::vector<float> w = norm_weights(dim);
            DeviceBuffer<float> dx(x), dx2(x), dd(delta), dw(w), dy(x.size());
            DeviceBuffer<uint16_t> dh(x.size());
            const HalfInput h{dh.get(), t, sh.ic};
            ASSERT_TRUE(add_rmsnorm_half_cuda(dx.get(), dd.get(), dw.get(), rows, dim, kEps, h, nullptr));
            add_rmsnorm_cuda(dx2.get(), dd.get(), dw.get(), dy.get(), rows, dim, kEps, nullptr);
            const std::string what = "dim " + std::to_string(dim) + " " + dtype_name(t) + " ic " + std::to_string(sh.ic);
            EXPECT_EQ(dx.download(), dx2.download()) << what << ": residual";
            EXPECT_EQ(dh.download(), test::half_input_ref(dy.download(), dim, t, sh.ic)) << what;
            if (HasFailure()) return;
        }
    DeviceBuffer<float> x(64), w(64);
    DeviceBuffer<uint16_t> h(64);
    EXPECT_FALSE(add_rmsnorm_half_cuda(x.get(), nullptr, w.get(), 2, 30, kEps, {h.get(), DType::F16, 0}, nullptr));
    EXPECT_FALSE(add_rmsnorm_half_cuda(x.get(), nullptr, w.get(), 2, 32, kEps, {h.get(), DType::F16, 16}, nullptr));
    EXPECT_FALSE(add_rmsnorm_half_cuda(x.get(), nullptr, w.get(), 2, 32, kEps, {h.get(), DType::F32, 0}, nullptr));
}

TEST(RmsNormCuda, RowsGathersAndLeavesXAlone) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (const auto& s : kShapes) {
        const int64_t rows = s[0], dim = s[1];
        const std::vector<float> x = test::rand_vec(size_t(rows * dim), uint32_t(3 * dim), 4.0f);
        const std::vector<float> delta = test::rand_vec(x.size(), uint32_t(3 * dim + 1), 2.0f);
        const std::vector<float> w = norm_weights(dim);
        // Last row first, then every other row, then the last row again (a repeat).
        std::vector<int32_t> idx = {int32_t(rows - 1)};
        for (int64_t r = 0; r < rows; r += 2) idx.push_back(int32_t(r));
        idx.push_back(int32_t(rows - 1));
        const int64_t n = int64_t(idx.size());
        for (const bool with_delta : {true, false}) {
            std::vector<float> picked(size_t(n * dim)), ref(picked.size());
            for (int64_t b = 0; b < n; ++b)
                for (int64_t i = 0; i < dim; ++i) {
                    const size_t src = size_t(idx[size_t(b)] * dim + i);
                    picked[size_t(b * dim + i)] = with_delta ? x[src] + delta[src] : x[src];
                }
            rmsnorm_ref(picked.data(), w.data(), ref.data(), n, dim, kEps);
            DeviceBuffer<float> dx(x), dd(delta), dw(w), dy(picked.size());
            DeviceBuffer<int32_t> di(idx);
            rmsnorm_rows_cuda(dx.get(), with_delta ? dd.get() : nullptr, di.get(), n, dw.get(), dy.get(), dim, kEps,
                              nullptr);
            expect_close(dy.download(), ref, dim, with_delta ? "rmsnorm_rows" : "rmsnorm_rows without delta");
            EXPECT_EQ(dx.download(), x) << "rmsnorm_rows must not modify x";
        }
    }
}
