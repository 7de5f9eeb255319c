// INT4 weights (AWQ-style asymmetric, group-wise; kernels/cpu/weights_view.h) on the GPU against
// the CPU reference (matmul_ref): the decode GEMV (vector and scalar paths, both grids, the SwiGLU
// epilogue, 1..8 token rows) and the prefill product (CublasGemm's dequantization to f16, in row
// blocks, staged or not) on awkward shapes and group sizes 32, 64, 128 and whole rows. Skips
// where no GPU is usable (the host-side checks run everywhere).
//
// Tolerance. matmul_ref sums in double over W = float(q) * scale + min (two f32 roundings). The
// GEMV forms each 32-column chunk's sum(q x) and sum(x) in f32 and scales them, or dequantizes with
// one FMA, so beside the f32 bound of test_gemv_cuda.cpp each weight carries a rounding relative
// to |q| scale + |min| rather than to |W| (where q * scale and min cancel):
//   |got - ref| <= (K + 16) u (sum_k |x_k| (|W_k| + |min_g| + 15 scale_g) + |b|) + 1e-6.
// The prefill product rounds x and the dequantized weights to f16 (2 * 2^-11 of sum |x W|) and
// accumulates on tensor cores (four times the f32 term). A swapped nibble, a wrong group, scale
// or min moves an output by O(scale * |x|) per weight, far outside these bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

constexpr int64_t kN = kGemvMaxTokens;
constexpr uint32_t kUntouched = 0xffffffffu;  // a NaN the kernels must never write

// An I4 matrix in host memory: packed codes, scales and mins (quantize_weights_int4 of random
// values, some skewed so zero points sit away from 8).
struct Int4Host {
    int64_t rows = 0, cols = 0, group = 0;
    std::vector<uint8_t> q;
    std::vector<float> scales, mins;
    WeightView view() const { return int4_weight_view(q.data(), scales.data(), mins.data(), rows, cols, group); }
};

Int4Host make_i4(int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
    Int4Host m;
    m.rows = rows, m.cols = cols, m.group = group;
    std::vector<float> f = rand_vec(size_t(rows * cols), seed);
    for (size_t i = 0; i < f.size(); i += 7) f[i] += 0.5f;
    WeightView src;
    src.data = f.data();
    src.rows = rows;
    src.cols = cols;
    m.q.resize(size_t(rows * cols / 2));
    m.scales.resize(size_t(rows * (cols / group)));
    m.mins.resize(m.scales.size());
    quantize_weights_int4(src, group, m.q.data(), m.scales.data(), m.mins.data());
    return m;
}

std::string describe(const Int4Host& m) {
    return "I4 " + std::to_string(m.rows) + "x" + std::to_string(m.cols) + " group " + std::to_string(m.group);
}

// The matrix on the device; `offset` bytes moves the codes off 16-byte alignment; `interleave`
// rewrites them into the interleaved column order (interleave.h) first.
struct DeviceInt4 {
    DeviceBuffer<uint8_t> q;
    DeviceBuffer<float> scales, mins;
    DeviceMatrix dm;
    DeviceInt4(const Int4Host& m, size_t offset = 0, bool interleave = false)
        : q(m.q.size() + 32), scales(m.scales), mins(m.mins) {
        CUDA_CHECK(cudaMemcpy(q.get() + offset, m.q.data(), m.q.size(), cudaMemcpyHostToDevice));
        dm.dtype = DType::I4;
        dm.data = q.get() + offset;
        dm.rows = m.rows;
        dm.cols = m.cols;
        dm.scales = scales.get();
        dm.mins = mins.get();
        dm.group_size = m.group;
        if (interleave) {
            EXPECT_TRUE(gemv_interleave_cuda(dm, nullptr)) << describe(m);
            EXPECT_TRUE(dm.interleaved);
        }
    }
};

// x [T, cols], bias [rows], the references with and without bias, and each output's bound (f32
// term: acc; 16-bit roundings of the prefill product: h) without its bias term.
struct Reference {
    int64_t T = 0;
    std::vector<float> x, bias, y, y_bias;
    std::vector<double> bound;  // [T, rows]
    double bias_factor = 0;     // times |b|
};

Reference make_reference(const Int4Host& m, int64_t T, uint32_t seed, double acc, double h) {
    Reference ref;
    const int64_t R = m.rows, K = m.cols;
    ref.T = T;
    ref.x = rand_vec(size_t(T * K), seed, 2.0f);
    ref.bias = rand_vec(size_t(R), seed + 1, 0.5f);
    ref.y.resize(size_t(T * R));
    ref.y_bias.resize(ref.y.size());
    ref.bound.resize(ref.y.size());
    ref.bias_factor = acc;
    const WeightView w = m.view();
    matmul_ref(ref.x.data(), T, w, nullptr, ref.y.data());
    matmul_ref(ref.x.data(), T, w, ref.bias.data(), ref.y_bias.data());
    std::vector<float> row(static_cast<size_t>(K));
    const int64_t groups = K / m.group;
    for (int64_t r = 0; r < R; ++r) {
        weight_row_to_f32(w, r, row.data());
        for (int64_t t = 0; t < T; ++t) {
            double abs_dot = 0, spread = 0;
            for (int64_t k = 0; k < K; ++k) {
                const double xa = std::fabs(double(ref.x[size_t(t * K + k)]));
                const size_t g = size_t(r * groups + k / m.group);
                abs_dot += xa * std::fabs(row[size_t(k)]);
                spread += xa * (std::fabs(m.mins[g]) + 15.0 * m.scales[g]);
            }
            ref.bound[size_t(t * R + r)] = (acc + h) * abs_dot + acc * spread + 1e-6;
        }
    }
    return ref;
}

double gemv_acc(int64_t K) { return double(K + 16) * kU; }
double gemm_acc(int64_t K) { return 4.0 * double(K + 16) * kU; }
constexpr double kGemmHalf = 2.0 / 2048;  // x and the dequantized weights rounded to f16

// got's first n token rows against the reference (rows n.. must be untouched when `untouched`).
void expect_close(const Reference& ref, int64_t R, int64_t n, bool with_bias, const std::vector<float>& got,
                  bool untouched) {
    const std::vector<float>& want = with_bias ? ref.y_bias : ref.y;
    for (int64_t t = 0; t < ref.T; ++t)
        for (int64_t r = 0; r < R; ++r) {
            const size_t i = size_t(t * R + r);
            if (t >= n) {
                if (!untouched) continue;
                uint32_t bits;
                std::memcpy(&bits, &got[i], 4);
                ASSERT_EQ(bits, kUntouched) << "wrote token row " << t << " >= n at output " << r;
                continue;
            }
            const double b = with_bias ? ref.bias_factor * std::fabs(ref.bias[size_t(r)]) : 0.0;
            ASSERT_NEAR(got[i], want[i], ref.bound[i] + b) << "token " << t << " output " << r;
        }
}

// gemv_cuda for n = 1..8, without and with bias. x_offset (floats) moves x off 16-byte alignment
// and w_offset (bytes) the codes: either sends the GEMV down its scalar path.
void check_gemv(const Int4Host& m, uint32_t seed, GemvGrid grid = GemvGrid::PerTile, size_t w_offset = 0,
                size_t x_offset = 0, bool interleave = false) {
    const Reference ref = make_reference(m, kN, seed, gemv_acc(m.cols), 0.0);
    DeviceInt4 d(m, w_offset, interleave);
    DeviceBuffer<float> dx(ref.x.size() + 4), db(ref.bias), dy(ref.y.size());
    float* x = dx.get() + x_offset;
    CUDA_CHECK(cudaMemcpy(x, ref.x.data(), ref.x.size() * 4, cudaMemcpyHostToDevice));
    for (int64_t n = 1; n <= kN; ++n)
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            SCOPED_TRACE(describe(m) + " n=" + std::to_string(n) + (with_bias ? " bias" : "") +
                         (grid == GemvGrid::Persistent ? " persistent grid" : "") + (interleave ? " interleaved" : "") +
                         " w_offset=" + std::to_string(w_offset) + " x_offset=" + std::to_string(x_offset));
            CUDA_CHECK(cudaMemset(dy.get(), 0xff, dy.size() * 4));
            gemv_cuda(d.dm, x, n, with_bias ? db.get() : nullptr, dy.get(), nullptr, grid);
            expect_close(ref, m.rows, n, with_bias != 0, dy.download(), true);
            if (::testing::Test::HasFatalFailure()) return;
        }
}

bool have_gpu() { return cuda_usable_device_count() > 0; }

}  // namespace

// Row lengths pick the rows per lane group (gemv.cu rows_per_group): up to 2048 columns R = 4,
// 6144 R = 2, 16384 R = 1; with n <= R the kernel sums q * x and x per chunk, beyond it
// dequantizes each weight, so every (n, R) pairing runs one of the two.
TEST(Int4Cuda, GemvMatchesReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 1;
    for (int64_t rows : {int64_t(1), int64_t(7), int64_t(33), int64_t(100), int64_t(255)})
        for (int64_t cols : {int64_t(32), int64_t(64), int64_t(96), int64_t(160), int64_t(384), int64_t(1024)})
            for (int64_t group : {int64_t(32), int64_t(64), int64_t(128), int64_t(0)}) {
                if (group == 0 && cols <= 128) continue;  // whole rows: already among the above
                if (group == 0) group = cols;
                if (cols % group != 0) continue;
                check_gemv(make_i4(rows, cols, group, seed), seed + 1000);
                ++seed;
                if (HasFatalFailure()) return;
            }
    check_gemv(make_i4(1000, 2048, 128, 50), 51);
    if (HasFatalFailure()) return;
    check_gemv(make_i4(37, 6144, 128, 52), 53);  // R = 2
    if (HasFatalFailure()) return;
    check_gemv(make_i4(9, 16384, 64, 54), 55);  // R = 1
}

TEST(Int4Cuda, GemvScalarPathMatchesReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 100;
    for (const auto& s : {std::pair<int64_t, int64_t>{7, 64}, {33, 256}, {100, 1024}}) {
        const Int4Host m = make_i4(s.first, s.second, 32, seed++);
        check_gemv(m, seed, GemvGrid::PerTile, 1, 0);  // codes one byte off
        if (HasFatalFailure()) return;
        check_gemv(m, seed, GemvGrid::PerTile, 0, 1);  // x one float off
        if (HasFatalFailure()) return;
    }
}

// The persistent grid against the reference, then bit for bit against one block per tile.
TEST(Int4Cuda, GemvPersistentGridMatchesPerTile) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 200;
    for (const auto& s : {std::pair<int64_t, int64_t>{1000, 2048}, {777, 384}, {300, 6144}}) {
        const Int4Host m = make_i4(s.first, s.second, 128, seed++);
        check_gemv(m, seed, GemvGrid::Persistent);
        if (HasFatalFailure()) return;
        DeviceInt4 d(m);
        DeviceBuffer<float> dx(rand_vec(size_t(kN * m.cols), seed, 2.0f)), dy(size_t(kN * m.rows));
        for (int64_t n = 1; n <= kN; ++n) {
            gemv_cuda(d.dm, dx.get(), n, nullptr, dy.get(), nullptr, GemvGrid::PerTile);
            const std::vector<float> per_tile = dy.download();
            gemv_cuda(d.dm, dx.get(), n, nullptr, dy.get(), nullptr, GemvGrid::Persistent);
            const std::vector<float> persistent = dy.download();
            ASSERT_EQ(std::memcmp(per_tile.data(), persistent.data(), size_t(n * m.rows) * 4), 0)
                << describe(m) << " n=" << n;
        }
    }
}

// The interleaved column order (interleave.h: 128-column blocks, groups of whole blocks) on every
// rows-per-group choice (R = 4, 2, 1 by row length), both grids and the scalar path (x one float
// off), against the same reference as the natural order.
TEST(Int4Cuda, InterleavedGemvMatchesReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 250;
    struct Shape {
        int64_t rows, cols, group;
    };
    for (const Shape s : {Shape{1, 128, 128}, Shape{7, 256, 128}, Shape{33, 384, 128}, Shape{100, 1024, 256},
                          Shape{1000, 2048, 128}, Shape{37, 6144, 128}, Shape{9, 16384, 128}, Shape{5, 512, 512}}) {
        const Int4Host m = make_i4(s.rows, s.cols, s.group, seed++);
        for (GemvGrid grid : {GemvGrid::PerTile, GemvGrid::Persistent}) {
            check_gemv(m, seed, grid, 0, 0, true);
            if (HasFatalFailure()) return;
        }
        if (s.cols <= 1024) check_gemv(m, seed, GemvGrid::PerTile, 0, 1, true);
        if (HasFatalFailure()) return;
    }
}

// gemv_swiglu_cuda on a stacked [gate; up] I4 matrix against the reference and SwiGLU in double
// (the bound carried through silu(g) * u as in test_gemv_cuda.cpp).
TEST(Int4Cuda, GemvSwiGLUEpilogueMatchesReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 300;
    for (const auto& s : {std::pair<int64_t, int64_t>{1, 32}, {7, 256}, {33, 1024}, {100, 128}, {500, 2048}})
      for (const bool interleave : {false, true}) {
        const int64_t H = s.first, K = s.second, R = 2 * H;
        if (interleave && K % 128 != 0) continue;
        const Int4Host m = make_i4(R, K, K >= 128 ? 128 : K, seed++);
        const Reference ref = make_reference(m, kN, seed, gemv_acc(K), 0.0);
        DeviceInt4 d(m, 0, interleave);
        DeviceBuffer<float> dx(ref.x), db(ref.bias), dy(size_t(kN * H));
        for (GemvGrid grid : {GemvGrid::PerTile, GemvGrid::Persistent})
            for (int64_t n = 1; n <= kN; ++n)
                for (int with_bias = 0; with_bias < 2; ++with_bias) {
                    SCOPED_TRACE(describe(m) + " n=" + std::to_string(n) + (with_bias ? " bias" : "") +
                                 (grid == GemvGrid::Persistent ? " persistent" : "") +
                                 (interleave ? " interleaved" : ""));
                    CUDA_CHECK(cudaMemset(dy.get(), 0xff, dy.size() * 4));
                    ASSERT_TRUE(gemv_swiglu_cuda(d.dm, dx.get(), n, with_bias ? db.get() : nullptr, dy.get(), nullptr,
                                                 grid));
                    const std::vector<float> got = dy.download();
                    const std::vector<float>& y = with_bias ? ref.y_bias : ref.y;
                    for (int64_t t = 0; t < kN; ++t)
                        for (int64_t j = 0; j < H; ++j) {
                            const size_t i = size_t(t * H + j);
                            if (t >= n) {
                                uint32_t bits;
                                std::memcpy(&bits, &got[i], 4);
                                ASSERT_EQ(bits, kUntouched) << "wrote token row " << t << " >= n";
                                continue;
                            }
                            const size_t gi = size_t(t * R + j), ui = size_t(t * R + H + j);
                            const double g = y[gi], u = y[ui];
                            const double bb = with_bias ? ref.bias_factor : 0.0;
                            const double bg = ref.bound[gi] + bb * std::fabs(ref.bias[size_t(j)]);
                            const double bu = ref.bound[ui] + bb * std::fabs(ref.bias[size_t(H + j)]);
                            const double silu = g / (1.0 + std::exp(-g)), want = silu * u;
                            const double bound =
                                1.1 * bg * (std::fabs(u) + bu) + std::fabs(silu) * bu + 8 * kU * std::fabs(want) + 1e-6;
                            ASSERT_NEAR(got[i], want, bound) << "token " << t << " output " << j;
                        }
                }
      }
}

// What the GEMV and the interleaving refuse or leave alone.
TEST(Int4Cuda, GemvArgumentsAndInterleave) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    alignas(16) static char buf[8192];
    DeviceMatrix m;
    m.dtype = DType::I4;
    m.data = buf;
    m.rows = 16;
    m.cols = 256;  // 2048 bytes of codes
    m.group_size = 64;
    m.scales = reinterpret_cast<const float*>(buf + 2048);  // 16 x 4 floats each
    m.mins = reinterpret_cast<const float*>(buf + 2304);
    DeviceMatrix i = m;
    DeviceBuffer<uint8_t> dw(size_t(2048));
    i.data = dw.get();
    EXPECT_FALSE(gemv_interleave_cuda(i, nullptr));  // 64-column groups: a block would hold two
    EXPECT_FALSE(i.interleaved);
    DeviceMatrix odd = i;
    odd.cols = 192;  // groups of 64 x 3: not whole blocks either
    odd.group_size = 192;
    EXPECT_FALSE(gemv_interleave_cuda(odd, nullptr));
    DeviceBuffer<float> dx(size_t(kN * 256)), dy(size_t(kN * 16));
    DeviceMatrix bad = i;
    bad.group_size = 48;  // no multiple of 32
    EXPECT_THROW(gemv_cuda(bad, dx.get(), 1, nullptr, dy.get(), nullptr), Error);
    bad = i;
    bad.mins = nullptr;
    EXPECT_THROW(gemv_cuda(bad, dx.get(), 1, nullptr, dy.get(), nullptr), Error);
    bad = i;
    bad.interleaved = true;
    EXPECT_THROW(gemv_cuda(bad, dx.get(), 1, nullptr, dy.get(), nullptr), Error);
}

namespace {

// CublasGemm::run on T = 1, 9 and ref.T token rows, with and without bias.
void check_gemm(CublasGemm& gemm, const Int4Host& m, const Reference& ref, size_t w_offset = 0,
                bool interleave = false) {
    DeviceInt4 d(m, w_offset, interleave);
    DeviceBuffer<float> dx(ref.x), db(ref.bias), dy(ref.y.size());
    for (int64_t T : {int64_t(1), int64_t(9), ref.T})
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            SCOPED_TRACE(describe(m) + " T=" + std::to_string(T) + (with_bias ? " bias" : "") +
                         " w_offset=" + std::to_string(w_offset) + (interleave ? " interleaved" : ""));
            CUDA_CHECK(cudaMemset(dy.get(), 0xff, dy.size() * 4));
            gemm.run(d.dm, dx.get(), T, with_bias ? db.get() : nullptr, dy.get());
            CUDA_CHECK(cudaDeviceSynchronize());
            expect_close(ref, m.rows, T, with_bias != 0, dy.download(), false);
            if (::testing::Test::HasFatalFailure()) return;
        }
}

Reference gemm_reference(const Int4Host& m, int64_t T, uint32_t seed) {
    return make_reference(m, T, seed, gemm_acc(m.cols), kGemmHalf);
}

constexpr int64_t kMaxT = 100;
constexpr int64_t kMaxCols = 2048;

}  // namespace

TEST(Int4Cuda, GemmMatchesReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasGemm gemm(nullptr, kMaxT, kMaxCols, 1000 * 2048);
    uint32_t seed = 500;
    for (const auto& s : {std::pair<int64_t, int64_t>{1, 32}, {7, 64}, {255, 96}, {100, 256}, {33, 1024}, {64, 2048}})
        for (int64_t group : {int64_t(32), int64_t(64), int64_t(128), int64_t(0)}) {
            if (group == 0 && s.second <= 128) continue;  // whole rows: already among the above
            if (group == 0) group = s.second;
            if (s.second % group != 0) continue;
            const Int4Host m = make_i4(s.first, s.second, group, seed);
            check_gemm(gemm, m, gemm_reference(m, kMaxT, seed + 1000));
            ++seed;
            if (HasFatalFailure()) return;
        }
}

// The prefill product of interleaved I4 weights: dequantized in their stored order, x converted
// into it (gemm.cu convert_x), the same reference.
TEST(Int4Cuda, InterleavedGemmMatchesReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasGemm gemm(nullptr, kMaxT, kMaxCols, 1000 * 2048);
    uint32_t seed = 550;
    struct Shape {
        int64_t rows, cols, group;
    };
    for (const Shape s : {Shape{7, 128, 128}, Shape{100, 256, 256}, Shape{33, 1024, 128}, Shape{64, 2048, 128}}) {
        const Int4Host m = make_i4(s.rows, s.cols, s.group, seed);
        check_gemm(gemm, m, gemm_reference(m, kMaxT, seed + 1000), 0, true);
        ++seed;
        if (HasFatalFailure()) return;
    }
}

// Scratch for three rows of the widest matrix: several blocks, the last one partial; and codes
// off 16-byte alignment (the element-wise dequantization).
TEST(Int4Cuda, GemmInRowBlocksAndMisaligned) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasGemm gemm(nullptr, 33, kMaxCols, 3 * kMaxCols);
    uint32_t seed = 600;
    for (const auto& s : {std::pair<int64_t, int64_t>{7, 64}, {100, 256}, {10, 2048}}) {
        const Int4Host m = make_i4(s.first, s.second, 64, seed);
        const Reference ref = gemm_reference(m, 33, seed + 1000);
        check_gemm(gemm, m, ref);
        if (HasFatalFailure()) return;
        check_gemm(gemm, m, ref, 1);
        if (HasFatalFailure()) return;
        ++seed;
    }
    const Int4Host m = make_i4(8, 64, 32, seed);
    DeviceInt4 d(m);
    DeviceBuffer<float> dx(size_t(33 * 64)), dy(size_t(33 * 8));
    DeviceMatrix bad = d.dm;
    bad.mins = nullptr;
    EXPECT_THROW(gemm.run(bad, dx.get(), 33, nullptr, dy.get()), Error);
    bad = d.dm;
    bad.group_size = 16;
    EXPECT_THROW(gemm.run(bad, dx.get(), 33, nullptr, dy.get()), Error);
}

// Staged I4 products (dequantized ahead on the side stream) give the unstaged products' bits.
TEST(Int4Cuda, StagedGemmEqualsUnstaged) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    {
        CublasGemm staged(stream, 64, 1024, 300 * 1024, 300 * 1024), plain(stream, 64, 1024, 300 * 1024);
        const Int4Host a = make_i4(300, 1024, 128, 700), b = make_i4(200, 512, 32, 701);
        DeviceInt4 da(a), db(b);
        DeviceBuffer<float> dx(rand_vec(size_t(64 * 1024), 702, 2.0f)), want(size_t(64 * 300)), got(size_t(64 * 300));
        for (const DeviceInt4* d : {&da, &db}) {
            plain.run(d->dm, dx.get(), 64, nullptr, want.get());
            CUDA_CHECK(cudaStreamSynchronize(stream));
            const std::vector<float> w = want.download();
            EXPECT_TRUE(staged.stage(d->dm));
            staged.run(d->dm, dx.get(), 64, nullptr, got.get());
            CUDA_CHECK(cudaStreamSynchronize(stream));
            const std::vector<float> g = got.download();
            ASSERT_EQ(std::memcmp(w.data(), g.data(), size_t(64 * d->dm.rows) * 4), 0) << d->dm.rows;
        }
        // And against the reference once.
        const Reference ref = gemm_reference(b, 64, 703);
        DeviceBuffer<float> dx2(ref.x);
        EXPECT_TRUE(staged.stage(db.dm));
        staged.run(db.dm, dx2.get(), 64, nullptr, got.get());
        CUDA_CHECK(cudaStreamSynchronize(stream));
        expect_close(ref, b.rows, 64, false, got.download(), false);
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
}
