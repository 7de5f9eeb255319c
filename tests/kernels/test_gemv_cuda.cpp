// gemv_cuda against the CPU reference (matmul_ref) on awkward shapes: every weight dtype, 1..8
// token rows, bias on and off, I8 group sizes, and pointers or pitches that force the scalar path.
// Skips where no GPU is usable (the argument checks run everywhere).
//
// Tolerance. matmul_ref sums in double: it is the exact dot rounded once. f32 sums of K products
// in any order and blocking are within K * u * sum_k |x_k w_k| of exact (u = 2^-24); I8 adds a
// rounding or two per term (the reference's q * scale, the kernel's per-chunk scale), so each
// output gets |got - ref| <= (K + 8) * u * (sum_k |x_k w_k| + |b|) + 1e-6. A wrong row, chunk,
// group or scale moves an output by O(1) against these sums, far outside the bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/interleave.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/host_matrix.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

constexpr int64_t kN = kGemvMaxTokens;
constexpr uint32_t kUntouched = 0xffffffffu;  // a NaN the kernel must never write

// Whether an output the kernel must not write (a token row past n) still holds kUntouched.
bool untouched(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    return bits == kUntouched;
}

std::string describe(const HostMat& m) {
    std::string s = std::string(dtype_name(m.dtype)) + " " + std::to_string(m.rows) + "x" + std::to_string(m.cols);
    if (m.dtype == DType::I8) s += " group " + std::to_string(m.group);
    return s;
}

// The DeviceMatrix of m's bytes at w (device), I8 scales at scales, in the interleaved column
// order first when asked (gemv_interleave_cuda rewrites the device copy).
DeviceMatrix device_matrix(const HostMat& m, void* w, const float* scales, bool interleave) {
    DeviceMatrix dm;
    dm.dtype = m.dtype;
    dm.data = w;
    dm.rows = m.rows;
    dm.cols = m.cols;
    if (m.dtype == DType::I8) {
        dm.scales = scales;
        dm.group_size = m.group;
    }
    if (interleave) {
        EXPECT_TRUE(gemv_interleave_cuda(dm, nullptr)) << describe(m);
    }
    return dm;
}

// The references for kN token rows (row t of y depends only on row t of x, so the first n rows
// serve every n) and each output's error bound without its bias term.
struct Reference {
    std::vector<float> x, bias, y, y_bias;
    std::vector<double> bound;  // [kN, rows]
};

Reference make_reference(const HostMat& m, uint32_t seed) {
    Reference ref;
    const int64_t R = m.rows, K = m.cols;
    ref.x = rand_vec(size_t(kN * K), seed, 2.0f);
    ref.bias = rand_vec(size_t(R), seed + 1, 0.5f);
    ref.y.resize(size_t(kN * R));
    ref.y_bias.resize(ref.y.size());
    ref.bound.resize(ref.y.size());
    const WeightView w = m.view();
    matmul_ref(ref.x.data(), kN, w, nullptr, ref.y.data());
    matmul_ref(ref.x.data(), kN, w, ref.bias.data(), ref.y_bias.data());
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t r = 0; r < R; ++r) {
        weight_row_to_f32(w, r, row.data());
        for (int64_t t = 0; t < kN; ++t) {
            double abs_dot = 0;
            for (int64_t k = 0; k < K; ++k) abs_dot += std::fabs(double(ref.x[size_t(t * K + k)]) * row[size_t(k)]);
            ref.bound[size_t(t * R + r)] = double(K + 8) * kU * abs_dot;
        }
    }
    return ref;
}

// Runs gemv_cuda for n = 1..8, without and with bias, and compares with the reference. w_offset
// (bytes) and x_offset (floats) move the device pointers off 16-byte alignment.
// interleave: rewrite the device copy into the interleaved column order first (interleave.h).
// grid: how gemv_cuda's row tiles meet blocks (gemv.h).
void check_gemv(const HostMat& m, size_t w_offset = 0, size_t x_offset = 0, uint32_t seed = 7, bool interleave = false,
                GemvGrid grid = GemvGrid::PerTile) {
    const Reference ref = make_reference(m, seed);
    const int64_t R = m.rows, K = m.cols;
    DeviceBuffer<uint8_t> dw(m.bytes.size() + 64);
    DeviceBuffer<float> ds(m.scales), dx(ref.x.size() + 8), db(ref.bias), dy(ref.y.size());
    uint8_t* w_dev = dw.get() + w_offset;
    float* x_dev = dx.get() + x_offset;
    CUDA_CHECK(cudaMemcpy(w_dev, m.bytes.data(), m.bytes.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(x_dev, ref.x.data(), ref.x.size() * 4, cudaMemcpyHostToDevice));
    const DeviceMatrix dm = device_matrix(m, w_dev, ds.get(), interleave);
    if (::testing::Test::HasFailure()) return;
    for (int64_t n = 1; n <= kN; ++n)
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            SCOPED_TRACE(describe(m) + (interleave ? " interleaved" : "") + " n=" + std::to_string(n) +
                         (with_bias ? " bias" : "") + " w_offset=" + std::to_string(w_offset) +
                         " x_offset=" + std::to_string(x_offset) +
                         (grid == GemvGrid::Persistent ? " persistent grid" : ""));
            CUDA_CHECK(cudaMemset(dy.get(), 0xff, dy.size() * 4));
            gemv_cuda(dm, x_dev, n, with_bias ? db.get() : nullptr, dy.get(), nullptr, grid);
            const std::vector<float> got = dy.download();
            const std::vector<float>& want = with_bias ? ref.y_bias : ref.y;
            for (int64_t t = 0; t < kN; ++t)
                for (int64_t r = 0; r < R; ++r) {
                    const size_t i = size_t(t * R + r);
                    if (t >= n) {
                        ASSERT_TRUE(untouched(got[i])) << "wrote token row " << t << " >= n at output " << r;
                        continue;
                    }
                    const double b = with_bias ? std::fabs(ref.bias[size_t(r)]) * (K + 8) * kU : 0.0;
                    ASSERT_NEAR(got[i], want[i], ref.bound[i] + b + 1e-6) << "token " << t << " output " << r;
                }
        }
}

const int64_t kRows[] = {1, 7, 33, 100, 255, 1000};
const int64_t kCols[] = {1, 7, 8, 16, 33, 48, 100, 192, 255, 256, 1000, 2048};

bool have_gpu() { return cuda_usable_device_count() > 0; }

// A matrix of a table-driven test: dtype, shape, I8 group, and whether it is interleaved.
struct GemvCase {
    DType dtype;
    int64_t rows, cols, group;
    bool interleave;
};

}  // namespace

TEST(GemvCuda, FloatWeightsMatchReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 1;
    for (DType dt : {DType::F32, DType::F16, DType::BF16})
        for (int64_t rows : kRows)
            for (int64_t cols : kCols) {
                check_gemv(make_mat(dt, rows, cols, 0, seed++));
                if (HasFatalFailure()) return;
            }
}

TEST(GemvCuda, Int8WeightsMatchReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 100;
    for (int64_t rows : kRows)
        for (int64_t cols : kCols)
            for (int64_t group : {int64_t(0), int64_t(16), int64_t(32), int64_t(48), int64_t(64), int64_t(128),
                                  int64_t(11), int64_t(25)}) {
                // 0: one group per row. 48: 3 chunks per group (a division, not a shift). 11, 25:
                // groups that are no multiple of 16 (scalar path), on a few shapes.
                if (group == 0) group = cols;
                else if (group >= cols || cols % group != 0) continue;
                if ((group == 11 || group == 25) && rows > 100) continue;
                check_gemv(make_mat(DType::I8, rows, cols, group, seed++));
                if (HasFatalFailure()) return;
            }
}

TEST(GemvCuda, QwenSizedMatrices) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    // down_proj of Qwen3-1.7B: the largest x (8 x 6144 floats) and the longest rows.
    check_gemv(make_mat(DType::F16, 2048, 6144, 0, 11));
    if (HasFatalFailure()) return;
    check_gemv(make_mat(DType::BF16, 2048, 6144, 0, 12));
    if (HasFatalFailure()) return;
    check_gemv(make_mat(DType::I8, 2048, 6144, 6144, 13));
    if (HasFatalFailure()) return;
    check_gemv(make_mat(DType::I8, 2048, 6144, 128, 14));
}

TEST(GemvCuda, MisalignedPointersTakeTheScalarPath) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 200;
    for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I8})
        for (const auto& s : {std::pair<int64_t, int64_t>{33, 256}, {100, 1024}, {7, 2048}}) {
            const HostMat m = make_mat(dt, s.first, s.second, dt == DType::I8 ? 64 : 0, seed++);
            check_gemv(m, dtype_size(dt), 0);  // weights one element off
            if (HasFatalFailure()) return;
            check_gemv(m, 0, 1);  // x one float off
            if (HasFatalFailure()) return;
        }
}

TEST(GemvCuda, InterleavedColumnOrderIsAPermutationOfEachBlock) {
    // Host side of interleave.h, no GPU needed: each block of B chunks (BC columns: 128 for I8
    // and I4, 64 for F16/BF16) maps onto itself one to one.
    for (DType dt : {DType::I8, DType::F16, DType::BF16, DType::I4}) {
        const int C = interleave_chunk_cols(dt), B = interleave_block_chunks(C), BC = interleave_block_cols(C);
        ASSERT_EQ(BC, dt == DType::F16 || dt == DType::BF16 ? 64 : 128) << dtype_name(dt);
        std::vector<int> hits(size_t(3 * BC), 0);
        for (int64_t c = 0; c < 3 * BC; ++c) {
            const int64_t s = interleaved_col(c, C);
            ASSERT_EQ(s / BC, c / BC) << dtype_name(dt) << " column " << c;
            hits[size_t(s)]++;
        }
        for (int h : hits) ASSERT_EQ(h, 1) << dtype_name(dt);
        for (int64_t c = 0; c < 3 * BC; ++c) ASSERT_EQ(natural_col(interleaved_col(c, C), C), c) << dtype_name(dt);
        // Lane j's quad q holds columns 4Bq + 4j ..: the B lanes' q-th float4s of x are contiguous.
        for (int j = 0; j < B; ++j)
            for (int q = 0; q < C / 4; ++q) ASSERT_EQ(interleaved_col(4 * B * q + 4 * j, C), j * C + 4 * q);
    }
    EXPECT_EQ(interleave_chunk_cols(DType::F32), 0);
}

TEST(GemvCuda, InterleavedWeightsMatchReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 400;
    for (DType dt : {DType::F16, DType::BF16, DType::I8})
        for (const auto& s : {std::pair<int64_t, int64_t>{1, 128}, {7, 256}, {33, 1024}, {100, 2048}, {255, 384}}) {
            for (int64_t group : {int64_t(0), int64_t(128), int64_t(256)}) {
                if (dt != DType::I8 && group != 0) continue;
                if (group > s.second || (group && s.second % group)) continue;
                const HostMat m = make_mat(dt, s.first, s.second, dt == DType::I8 ? (group ? group : s.second) : 0, seed++);
                check_gemv(m, 0, 0, seed, true);
                if (HasFatalFailure()) return;
                check_gemv(m, 0, 1, seed, true);  // x one float off: the scalar path reads the same order
                if (HasFatalFailure()) return;
            }
        }
    check_gemv(make_mat(DType::I8, 2048, 6144, 128, 430), 0, 0, 431, true);
}

TEST(GemvCuda, InterleaveLeavesShapesItCannotTake) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    DeviceBuffer<uint8_t> buf(size_t(64) << 10);
    DeviceBuffer<float> scales(size_t(1024));
    DeviceMatrix m;
    m.data = buf.get();
    m.rows = 4;
    for (const auto& c : {std::tuple<DType, int64_t, int64_t>{DType::F32, 256, 0}, {DType::F16, 100, 0},
                          {DType::I8, 192, 192}, {DType::I8, 256, 64}, {DType::F16, 32768, 0}}) {
        m.dtype = std::get<0>(c);
        m.cols = std::get<1>(c);
        m.group_size = std::get<2>(c);
        m.scales = m.dtype == DType::I8 ? scales.get() : nullptr;
        m.interleaved = false;
        EXPECT_FALSE(gemv_interleave_cuda(m, nullptr)) << dtype_name(m.dtype) << " " << m.cols;
        EXPECT_FALSE(m.interleaved);
    }
}

namespace {

// gemv_swiglu_cuda on the stacked [gate; up] matrix m (2 * inter rows) against matmul_ref of the
// whole matrix and SwiGLU in double. Bound: the GEMV's bound on gate (bg) and up (bu) carried
// through silu(g) * u (|silu'| < 1.1), plus a few f32 roundings of the epilogue itself.
void check_swiglu(const HostMat& m, bool interleave, uint32_t seed, GemvGrid grid = GemvGrid::PerTile) {
    const int64_t R = m.rows, K = m.cols, H = R / 2;
    const Reference ref = make_reference(m, seed);
    DeviceBuffer<uint8_t> dw(m.bytes);
    DeviceBuffer<float> ds(m.scales), dx(ref.x), db(ref.bias), dy(size_t(kN * H));
    const DeviceMatrix dm = device_matrix(m, dw.get(), ds.get(), interleave);
    if (::testing::Test::HasFailure()) return;
    for (int64_t n = 1; n <= kN; ++n)
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            SCOPED_TRACE(describe(m) + (interleave ? " interleaved" : "") + " n=" + std::to_string(n) +
                         (with_bias ? " bias" : "") + (grid == GemvGrid::Persistent ? " persistent grid" : ""));
            CUDA_CHECK(cudaMemset(dy.get(), 0xff, dy.size() * 4));
            ASSERT_TRUE(gemv_swiglu_cuda(dm, dx.get(), n, with_bias ? db.get() : nullptr, dy.get(), nullptr, grid));
            const std::vector<float> got = dy.download();
            const std::vector<float>& y = with_bias ? ref.y_bias : ref.y;
            for (int64_t t = 0; t < kN; ++t)
                for (int64_t j = 0; j < H; ++j) {
                    const size_t i = size_t(t * H + j);
                    if (t >= n) {
                        ASSERT_TRUE(untouched(got[i])) << "wrote token row " << t << " >= n at output " << j;
                        continue;
                    }
                    const size_t gi = size_t(t * R + j), ui = size_t(t * R + H + j);
                    const double g = y[gi], u = y[ui];
                    const double bias_b = with_bias ? (K + 8) * kU : 0.0;
                    const double bg = ref.bound[gi] + bias_b * std::fabs(ref.bias[size_t(j)]) + 1e-6;
                    const double bu = ref.bound[ui] + bias_b * std::fabs(ref.bias[size_t(H + j)]) + 1e-6;
                    const double silu = g / (1.0 + std::exp(-g)), want = silu * u;
                    const double bound =
                        1.1 * bg * (std::fabs(u) + bu) + std::fabs(silu) * bu + 8 * kU * std::fabs(want) + 1e-6;
                    ASSERT_NEAR(got[i], want, bound) << "token " << t << " output " << j;
                }
        }
}

}  // namespace

TEST(GemvCuda, SwiGLUEpilogueMatchesReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 600;
    for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::I8})
        for (const auto& s : {std::pair<int64_t, int64_t>{1, 16}, {7, 256}, {33, 1024}, {100, 128}, {1000, 2048}}) {
            const int64_t group = dt == DType::I8 ? (s.second >= 128 ? 128 : s.second) : 0;
            const HostMat m = make_mat(dt, 2 * s.first, s.second, group, seed++);
            check_swiglu(m, false, seed);
            if (HasFatalFailure()) return;
            if (dt != DType::F32 && s.second % 128 == 0) check_swiglu(m, true, seed);
            if (HasFatalFailure()) return;
        }
}

// The persistent grid (a block loops over tiles, the next tile's weights loaded before this one's
// reduction) against the reference, on shapes with many more tiles than resident blocks (the
// emulator holds one block per SM, 8 SMs: up to 64 tiles per block here) and tile counts that do
// not divide evenly; then bit for bit against the grid of one block per tile, since each tile's
// sums are formed in the same order whichever block computes them.
TEST(GemvCuda, PersistentGridMatchesReferenceAndPerTile) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    const GemvCase cases[] = {{DType::F32, 1000, 192, 0, false},   {DType::F16, 255, 2048, 0, false},
                          {DType::F16, 1000, 256, 0, true},    {DType::BF16, 100, 1000, 0, false},
                          {DType::I8, 1000, 2048, 128, true},  {DType::I8, 2048, 6144, 6144, true},
                          {DType::I8, 777, 384, 48, false}};
    uint32_t seed = 900;
    for (const GemvCase& c : cases) {
        const HostMat m = make_mat(c.dtype, c.rows, c.cols, c.group, seed++);
        check_gemv(m, 0, 0, seed, c.interleave, GemvGrid::Persistent);
        if (HasFatalFailure()) return;
        DeviceBuffer<uint8_t> dw(m.bytes);
        DeviceBuffer<float> ds(m.scales), dx(rand_vec(size_t(kN * c.cols), seed, 2.0f)), dy(size_t(kN * c.rows));
        const DeviceMatrix dm = device_matrix(m, dw.get(), ds.get(), c.interleave);
        for (int64_t n = 1; n <= kN; ++n) {
            gemv_cuda(dm, dx.get(), n, nullptr, dy.get(), nullptr, GemvGrid::PerTile);
            const std::vector<float> per_tile = dy.download();
            gemv_cuda(dm, dx.get(), n, nullptr, dy.get(), nullptr, GemvGrid::Persistent);
            const std::vector<float> persistent = dy.download();
            ASSERT_EQ(std::memcmp(per_tile.data(), persistent.data(), size_t(n * c.rows) * 4), 0)
                << describe(m) << " n=" << n;
        }
    }
    for (DType dt : {DType::F16, DType::I8}) {
        const HostMat m = make_mat(dt, 2 * 1000, 2048, dt == DType::I8 ? 128 : 0, seed++);
        check_swiglu(m, true, seed, GemvGrid::Persistent);
        if (HasFatalFailure()) return;
    }
}

TEST(GemvCuda, SwiGLUDeclinesWhatTheVectorPathCannotTake) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    const HostMat m = make_mat(DType::F16, 64, 100, 0, 700);  // 100 f16 columns: 200-byte rows
    DeviceBuffer<uint8_t> dw(m.bytes);
    DeviceBuffer<float> dx(size_t(100 * kN)), dy(std::vector<float>(size_t(32 * kN), 7.0f));
    DeviceMatrix dm;
    dm.dtype = DType::F16;
    dm.data = dw.get();
    dm.rows = 64;
    dm.cols = 100;
    EXPECT_FALSE(gemv_swiglu_cuda(dm, dx.get(), 1, nullptr, dy.get(), nullptr));
    for (float v : dy.download()) ASSERT_EQ(v, 7.0f);
    dm.rows = 63;
    EXPECT_THROW(gemv_swiglu_cuda(dm, dx.get(), 1, nullptr, dy.get(), nullptr), Error);
}

TEST(GemvCuda, CapturedInAGraph) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    const HostMat m = make_mat(DType::I8, 1000, 2048, 128, 300);
    const Reference ref = make_reference(m, 301);
    DeviceBuffer<uint8_t> dw(m.bytes);
    DeviceBuffer<float> ds(m.scales), dx(ref.x), db(ref.bias), dy(ref.y.size());
    const DeviceMatrix dm = device_matrix(m, dw.get(), ds.get(), false);

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // One eager run first (lazily loaded kernels load outside the capture), then y is cleared so
    // only the graph's work is checked.
    gemv_cuda(dm, dx.get(), kN, db.get(), dy.get(), stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemsetAsync(dy.get(), 0, dy.size() * 4, stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    gemv_cuda(dm, dx.get(), kN, db.get(), dy.get(), stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<float> got = dy.download();
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    CUDA_CHECK(cudaStreamDestroy(stream));
    for (size_t i = 0; i < got.size(); ++i) {
        const double b = std::fabs(ref.bias[i % size_t(m.rows)]) * (m.cols + 8) * kU;
        ASSERT_NEAR(got[i], ref.y_bias[i], ref.bound[i] + b + 1e-6) << "at " << i;
    }
}

// Argument checks happen before any CUDA call, so they run without a GPU.
TEST(GemvCuda, RejectsBadArguments) {
    DeviceMatrix w;
    w.dtype = DType::F16;
    w.rows = 4;
    w.cols = 16;
    float* fake = reinterpret_cast<float*>(uintptr_t(256));  // never dereferenced: each call throws first
    w.data = fake;
    EXPECT_THROW(gemv_cuda(w, fake, kGemvMaxTokens + 1, nullptr, fake, nullptr), Error);
    EXPECT_THROW(gemv_cuda(w, fake, -1, nullptr, fake, nullptr), Error);
    w.dtype = DType::I32;
    EXPECT_THROW(gemv_cuda(w, fake, 1, nullptr, fake, nullptr), Error);
    w.dtype = DType::I8;
    w.group_size = 16;
    EXPECT_THROW(gemv_cuda(w, fake, 1, nullptr, fake, nullptr), Error);  // no scales
    w.scales = fake;
    w.group_size = 5;
    EXPECT_THROW(gemv_cuda(w, fake, 1, nullptr, fake, nullptr), Error);  // 5 does not divide 16
    w.group_size = 0;
    EXPECT_THROW(gemv_cuda(w, fake, 1, nullptr, fake, nullptr), Error);
    w.group_size = 16;
    EXPECT_NO_THROW(gemv_cuda(w, fake, 0, nullptr, fake, nullptr));  // n = 0: nothing to do, no launch
}

namespace {

// GemvFuse's norm (gemv.h): y = (rmsnorm(x) * g) W^T + b against the same in double. The kernel
// sums w * (x * g) in f32 (the GEMV's bound on those products) and scales by 1 / rms from an f32
// sum of squares (relative error within cols * u / 2 and rsqrtf's 2 ulp), so each output gets
// (2 cols + 16) * u * sum_k |w_k h_k| + the bias's rounding. A missing g, a wrong row's rms or an
// unscaled sum is off by O(1) against these sums.
void check_fused_norm(const HostMat& m, bool interleave, size_t x_offset, uint32_t seed, GemvGrid grid) {
    const int64_t R = m.rows, K = m.cols;
    const std::vector<float> x = rand_vec(size_t(kN * K), seed, 2.0f), g = rand_vec(size_t(K), seed + 1, 1.5f),
                             bias = rand_vec(size_t(R), seed + 2, 0.5f);
    const float eps = 1e-5f;
    std::vector<double> h(size_t(kN * K));
    for (int64_t t = 0; t < kN; ++t) {
        double ss = 0;
        for (int64_t k = 0; k < K; ++k) ss += double(x[size_t(t * K + k)]) * x[size_t(t * K + k)];
        const double inv = 1.0 / std::sqrt(ss / double(K) + eps);
        for (int64_t k = 0; k < K; ++k) h[size_t(t * K + k)] = x[size_t(t * K + k)] * inv * g[size_t(k)];
    }
    const WeightView wv = m.view();
    std::vector<float> row(static_cast<size_t>(K));
    std::vector<double> want(size_t(kN * R)), abs_sum(size_t(kN * R));
    for (int64_t r = 0; r < R; ++r) {
        weight_row_to_f32(wv, r, row.data());
        for (int64_t t = 0; t < kN; ++t) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < K; ++k) {
                s += double(row[size_t(k)]) * h[size_t(t * K + k)];
                a += std::fabs(double(row[size_t(k)]) * h[size_t(t * K + k)]);
            }
            want[size_t(t * R + r)] = s;
            abs_sum[size_t(t * R + r)] = a;
        }
    }
    DeviceBuffer<uint8_t> dw(m.bytes);
    DeviceBuffer<float> ds(m.scales), dx(x.size() + 8), dg(g), db(bias), dy(size_t(kN * R));
    float* x_dev = dx.get() + x_offset;
    CUDA_CHECK(cudaMemcpy(x_dev, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    const DeviceMatrix dm = device_matrix(m, dw.get(), ds.get(), interleave);
    if (::testing::Test::HasFailure()) return;
    const GemvFuse fuse{dg.get(), eps, false};
    for (int64_t n = 1; n <= kN; ++n)
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            SCOPED_TRACE(describe(m) + (interleave ? " interleaved" : "") + " n=" + std::to_string(n) +
                         (with_bias ? " bias" : "") + " x_offset=" + std::to_string(x_offset) +
                         (grid == GemvGrid::Persistent ? " persistent grid" : " per-tile grid"));
            CUDA_CHECK(cudaMemset(dy.get(), 0xff, dy.size() * 4));
            gemv_cuda(dm, x_dev, n, with_bias ? db.get() : nullptr, dy.get(), fuse, nullptr, grid);
            const std::vector<float> got = dy.download();
            for (int64_t t = 0; t < kN; ++t)
                for (int64_t r = 0; r < R; ++r) {
                    const size_t i = size_t(t * R + r);
                    if (t >= n) {
                        ASSERT_TRUE(untouched(got[i])) << "wrote token row " << t << " >= n at output " << r;
                        continue;
                    }
                    const double b = with_bias ? bias[size_t(r)] : 0.0;
                    const double bound = double(2 * K + 16) * kU * abs_sum[i] + std::fabs(b) * 4 * kU + 1e-6;
                    ASSERT_NEAR(got[i], want[i] + b, bound) << "token " << t << " output " << r;
                }
        }
}

}  // namespace

// GemvFuse::norm_w on both paths and grids: every weight dtype, natural and interleaved columns,
// x off 16-byte alignment (the scalar path), 1..8 token rows.
TEST(GemvCuda, FusedNormMatchesReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 1100;
    const GemvCase cases[] = {{DType::F32, 33, 192, 0, false},  {DType::F16, 100, 256, 0, false},
                          {DType::F16, 255, 1024, 0, true}, {DType::BF16, 7, 2048, 0, true},
                          {DType::I8, 100, 2048, 128, true}, {DType::I8, 33, 384, 48, false},
                          {DType::F16, 7, 100, 0, false}};
    for (const GemvCase& c : cases)
        for (const GemvGrid grid : {GemvGrid::PerTile, GemvGrid::Persistent}) {
            const HostMat m = make_mat(c.dtype, c.rows, c.cols, c.group, seed++);
            check_fused_norm(m, c.interleave, 0, seed, grid);
            if (HasFatalFailure()) return;
            if (grid == GemvGrid::Persistent) check_fused_norm(m, c.interleave, 1, seed, grid);  // scalar path
            if (HasFatalFailure()) return;
        }
}

// GemvFuse::accumulate adds the product to y in place: bit for bit y0 + what gemv_cuda writes,
// on the vector and the scalar path; and SwiGLU refuses to accumulate.
TEST(GemvCuda, AccumulateAddsToTheOutputBitForBit) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 1200;
    for (const auto& c : {std::tuple<DType, int64_t, int64_t, int64_t>{DType::F16, 255, 1024, 0},
                          {DType::I8, 100, 2048, 128}, {DType::F32, 7, 100, 0}})
        for (size_t x_offset : {size_t(0), size_t(1)}) {
            const HostMat m = make_mat(std::get<0>(c), std::get<1>(c), std::get<2>(c), std::get<3>(c), seed++);
            const int64_t R = m.rows, K = m.cols;
            const std::vector<float> y0 = rand_vec(size_t(kN * R), seed, 3.0f), bias = rand_vec(size_t(R), seed + 1);
            DeviceBuffer<uint8_t> dw(m.bytes);
            DeviceBuffer<float> ds(m.scales), dx(rand_vec(size_t(kN * K) + 8, seed + 2, 2.0f)), db(bias),
                dy(size_t(kN * R)), dacc(y0);
            const DeviceMatrix dm = device_matrix(m, dw.get(), ds.get(), false);
            for (int64_t n = 1; n <= kN; ++n) {
                SCOPED_TRACE(describe(m) + " n=" + std::to_string(n) + " x_offset=" + std::to_string(x_offset));
                CUDA_CHECK(cudaMemcpy(dacc.get(), y0.data(), y0.size() * 4, cudaMemcpyHostToDevice));
                gemv_cuda(dm, dx.get() + x_offset, n, db.get(), dy.get(), nullptr);
                gemv_cuda(dm, dx.get() + x_offset, n, db.get(), dacc.get(), GemvFuse{nullptr, 0.0f, true}, nullptr);
                const std::vector<float> plain = dy.download(), got = dacc.download();
                for (int64_t i = 0; i < kN * R; ++i) {
                    const float want = i < n * R ? y0[size_t(i)] + plain[size_t(i)] : y0[size_t(i)];
                    ASSERT_EQ(std::memcmp(&got[size_t(i)], &want, 4), 0) << "at " << i << ": " << got[size_t(i)]
                                                                          << " vs " << want;
                }
            }
        }
    const HostMat m = make_mat(DType::F16, 64, 256, 0, seed);
    DeviceBuffer<uint8_t> dw(m.bytes);
    DeviceBuffer<float> dx(size_t(256 * kN)), dy(size_t(32 * kN));
    const DeviceMatrix dm = device_matrix(m, dw.get(), nullptr, false);
    EXPECT_THROW(gemv_swiglu_cuda(dm, dx.get(), 1, nullptr, dy.get(), GemvFuse{nullptr, 0.0f, true}, nullptr), Error);
}

// SwiGLU's epilogue with the fused norm: silu(gate) * up of what the normed GEMV writes for the
// stacked matrix (the same sums in the same order), to the epilogue's f32 rounding.
TEST(GemvCuda, FusedNormWithSwiGLU) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 1300;
    for (DType dt : {DType::F16, DType::I8})
        for (const GemvGrid grid : {GemvGrid::PerTile, GemvGrid::Persistent}) {
            const int64_t H = 300, K = 1024;
            const HostMat m = make_mat(dt, 2 * H, K, dt == DType::I8 ? 128 : 0, seed++);
            DeviceBuffer<uint8_t> dw(m.bytes);
            DeviceBuffer<float> ds(m.scales), dx(rand_vec(size_t(kN * K), seed, 2.0f)),
                dg(rand_vec(size_t(K), seed + 1, 1.5f)), db(rand_vec(size_t(2 * H), seed + 2)), dfull(size_t(kN * 2 * H)),
                dy(size_t(kN * H));
            const DeviceMatrix dm = device_matrix(m, dw.get(), ds.get(), true);
            const GemvFuse fuse{dg.get(), 1e-6f, false};
            for (int64_t n = 1; n <= kN; ++n) {
                SCOPED_TRACE(describe(m) + " n=" + std::to_string(n));
                gemv_cuda(dm, dx.get(), n, db.get(), dfull.get(), fuse, nullptr, grid);
                ASSERT_TRUE(gemv_swiglu_cuda(dm, dx.get(), n, db.get(), dy.get(), fuse, nullptr, grid));
                const std::vector<float> full = dfull.download(), got = dy.download();
                for (int64_t t = 0; t < n; ++t)
                    for (int64_t j = 0; j < H; ++j) {
                        const double gt = full[size_t(t * 2 * H + j)], up = full[size_t(t * 2 * H + H + j)];
                        const double want = gt / (1.0 + std::exp(-gt)) * up;
                        ASSERT_NEAR(got[size_t(t * H + j)], want, 1e-5 * std::fabs(want) + 1e-6)
                            << "token " << t << " output " << j;
                    }
            }
        }
}
