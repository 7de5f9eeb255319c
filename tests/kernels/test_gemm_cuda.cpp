// CublasGemm against the CPU reference (matmul_ref) on awkward shapes, every weight dtype, token
// counts 1..257, bias on and off, I8 group sizes; one captured in a CUDA graph. Skips where no
// GPU is usable.
//
// Tolerance. matmul_ref sums in double (the exact dot rounded once). Each output gets
//   |got - ref| <= (h * sum_k |x_k w_k|) + 4 (K + 16) u (sum_k |x_k w_k| + |b|) + 1e-5
// with u = 2^-24 and h the relative rounding of the 16-bit copies the product runs on: 0 for F32
// (SGEMM in full FP32, no TF32), 2^-11 for F16 (x rounded to f16), 2^-8 for BF16, 2 * 2^-11 for
// I8 (x and the dequantized weights rounded to f16). The accumulation term allows tensor cores'
// FP32 accumulators twice the rounding of a plain f32 sum. A wrong row, group or transposition
// moves outputs by O(1) against these sums.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/host_matrix.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

constexpr int64_t kMaxT = 257;
constexpr int64_t kMaxCols = 6144;
constexpr int64_t kMaxWeights = 2048 * 6144;

double half_rounding(DType t) {
    switch (t) {
        case DType::F16: return 1.0 / 2048;
        case DType::BF16: return 1.0 / 256;
        case DType::I8: return 2.0 / 2048;
        default: return 0.0;
    }
}

// Inputs, references for T token rows (row t of y depends only on row t of x, so the first rows
// serve every smaller T) and each output's bound without its bias term.
struct Case {
    HostMat m;
    int64_t T = 0;
    std::vector<float> x, bias, y, y_bias;
    std::vector<double> bound;  // [T, rows]
    std::vector<double> bias_bound;  // [rows]
};

Case make_case(HostMat m, int64_t T, uint32_t seed) {
    Case c;
    c.T = T;
    const int64_t R = m.rows, K = m.cols;
    c.x = rand_vec(size_t(T * K), seed, 2.0f);
    c.bias = rand_vec(size_t(R), seed + 1, 0.5f);
    c.y.resize(size_t(T * R));
    c.y_bias.resize(c.y.size());
    c.bound.resize(c.y.size());
    c.bias_bound.resize(size_t(R));
    const WeightView w = m.view();
    matmul_ref(c.x.data(), T, w, nullptr, c.y.data());
    matmul_ref(c.x.data(), T, w, c.bias.data(), c.y_bias.data());
    const double acc = 4.0 * double(K + 16) * kU, h = half_rounding(m.dtype);
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t r = 0; r < R; ++r) {
        weight_row_to_f32(w, r, row.data());
        c.bias_bound[size_t(r)] = acc * std::fabs(c.bias[size_t(r)]);
        for (int64_t t = 0; t < T; ++t) {
            double abs_dot = 0;
            for (int64_t k = 0; k < K; ++k) abs_dot += std::fabs(double(c.x[size_t(t * K + k)]) * row[size_t(k)]);
            c.bound[size_t(t * R + r)] = (h + acc) * abs_dot + 1e-5;
        }
    }
    c.m = std::move(m);
    return c;
}

struct DeviceCase {
    DeviceBuffer<uint8_t> w;
    DeviceBuffer<float> scales, x, bias, y;
    DeviceMatrix dm;
    explicit DeviceCase(const Case& c) : w(c.m.bytes), scales(c.m.scales), x(c.x), bias(c.bias), y(c.y.size()) {
        dm.dtype = c.m.dtype;
        dm.data = w.get();
        dm.rows = c.m.rows;
        dm.cols = c.m.cols;
        if (c.m.dtype == DType::I8) {
            dm.scales = scales.get();
            dm.group_size = c.m.group;
        }
    }
};

std::string describe(const HostMat& m) {
    std::string s = std::string(dtype_name(m.dtype)) + " " + std::to_string(m.rows) + "x" + std::to_string(m.cols);
    if (m.dtype == DType::I8) s += " group " + std::to_string(m.group);
    return s;
}

// got is y as downloaded; its first T token rows are checked (with or without bias).
void expect_close(const Case& c, int64_t T, bool with_bias, const std::vector<float>& got) {
    const int64_t R = c.m.rows;
    const std::vector<float>& want = with_bias ? c.y_bias : c.y;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < R; ++r) {
            const size_t i = size_t(t * R + r);
            const double bound = c.bound[i] + (with_bias ? c.bias_bound[size_t(r)] : 0.0);
            ASSERT_NEAR(got[i], want[i], bound) << "token " << t << " output " << r;
        }
}

void check_gemm(CublasGemm& gemm, const Case& c, bool interleave = false) {
    DeviceCase d(c);
    if (interleave) {
        ASSERT_TRUE(gemv_interleave_cuda(d.dm, nullptr)) << describe(c.m);
    }
    for (int64_t T : {int64_t(1), int64_t(5), int64_t(64), c.T}) {
        if (T > c.T) continue;
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            SCOPED_TRACE(describe(c.m) + (interleave ? " interleaved" : "") + " T=" + std::to_string(T) +
                         (with_bias ? " bias" : ""));
            CUDA_CHECK(cudaMemset(d.y.get(), 0xff, d.y.size() * 4));
            gemm.run(d.dm, d.x.get(), T, with_bias ? d.bias.get() : nullptr, d.y.get());
            CUDA_CHECK(cudaDeviceSynchronize());
            expect_close(c, T, with_bias != 0, d.y.download());
            if (::testing::Test::HasFatalFailure()) return;
        }
    }
}

const std::pair<int64_t, int64_t> kShapes[] = {{1, 1},     {7, 33},   {100, 255}, {255, 100},
                                               {1000, 64}, {33, 1000}, {64, 2048}, {3, 7}};

bool have_gpu() { return cuda_usable_device_count() > 0; }

}  // namespace

TEST(GemmCuda, FloatWeightsMatchReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasGemm gemm(nullptr, kMaxT, kMaxCols, kMaxWeights);
    uint32_t seed = 1;
    for (DType dt : {DType::F32, DType::F16, DType::BF16})
        for (const auto& s : kShapes) {
            check_gemm(gemm, make_case(make_mat(dt, s.first, s.second, 0, seed), kMaxT, seed + 1000));
            ++seed;
            if (HasFatalFailure()) return;
        }
}

TEST(GemmCuda, Int8WeightsMatchReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasGemm gemm(nullptr, kMaxT, kMaxCols, kMaxWeights);
    uint32_t seed = 100;
    for (const auto& s : kShapes)
        for (int64_t group : {int64_t(0), int64_t(32), int64_t(64), int64_t(128), int64_t(11)}) {
            if (group == 0) group = s.second;  // one group per row
            else if (group >= s.second || s.second % group != 0) continue;
            check_gemm(gemm, make_case(make_mat(DType::I8, s.first, s.second, group, seed), kMaxT, seed + 1000));
            ++seed;
            if (HasFatalFailure()) return;
        }
}

TEST(GemmCuda, Int8WeightsDequantizedInRowBlocks) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    // Scratch for three rows of the widest matrix: every shape runs in several blocks, the last
    // one partial.
    CublasGemm gemm(nullptr, kMaxT, kMaxCols, 3 * kMaxCols);
    uint32_t seed = 400;
    for (const auto& s : kShapes) {
        check_gemm(gemm, make_case(make_mat(DType::I8, s.first, s.second, s.second, seed), kMaxT, seed + 1000));
        ++seed;
        if (HasFatalFailure()) return;
    }
}

TEST(GemmCuda, QwenSizedMatrices) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasGemm gemm(nullptr, kMaxT, kMaxCols, kMaxWeights);
    // down_proj of Qwen3-1.7B, a few tokens (the CPU reference is the slow side).
    check_gemm(gemm, make_case(make_mat(DType::F16, 2048, 6144, 0, 11), 16, 21));
    if (HasFatalFailure()) return;
    check_gemm(gemm, make_case(make_mat(DType::I8, 2048, 6144, 128, 12), 16, 22));
    if (HasFatalFailure()) return;
    check_gemm(gemm, make_case(make_mat(DType::F32, 2048, 6144, 0, 13), 16, 23));
}

TEST(GemmCuda, RejectsWhatTheScratchCannotHold) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasGemm gemm(nullptr, 4, 64, 64 * 8);
    EXPECT_GE(gemm.scratch_bytes(), size_t(4 * 64 * 2 + 64 * 8 * 2));
    const Case c = make_case(make_mat(DType::I8, 16, 64, 64, 5), 5, 6);
    DeviceCase d(c);
    EXPECT_THROW(gemm.run(d.dm, d.x.get(), 5, nullptr, d.y.get()), Error);  // T > 4
    check_gemm(gemm, make_case(make_mat(DType::I8, 16, 64, 64, 5), 4, 6));  // 16 x 64 weights: two blocks of 8 rows
    if (HasFatalFailure()) return;
    DeviceMatrix bad = d.dm;
    bad.group_size = 5;
    EXPECT_THROW(gemm.run(bad, d.x.get(), 1, nullptr, d.y.get()), Error);
    bad.dtype = DType::I32;
    EXPECT_THROW(gemm.run(bad, d.x.get(), 1, nullptr, d.y.get()), Error);
}

TEST(GemmCuda, CapturedInAGraph) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    {
        CublasGemm gemm(stream, 64, 2048, 1000 * 2048);
        const Case f16 = make_case(make_mat(DType::F16, 1000, 2048, 0, 40), 64, 41);
        const Case i8 = make_case(make_mat(DType::I8, 1000, 2048, 128, 42), 64, 43);
        DeviceCase a(f16), b(i8);
        // One eager run first, as the engine's first step would be: cuBLAS and lazily loaded
        // kernels initialise outside the capture. Thread-local mode, as frameworks capture cuBLAS.
        gemm.run(a.dm, a.x.get(), 64, a.bias.get(), a.y.get());
        gemm.run(b.dm, b.x.get(), 64, b.bias.get(), b.y.get());
        CUDA_CHECK(cudaStreamSynchronize(stream));
        CUDA_CHECK(cudaMemsetAsync(a.y.get(), 0, a.y.size() * 4, stream));
        CUDA_CHECK(cudaMemsetAsync(b.y.get(), 0, b.y.size() * 4, stream));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        gemm.run(a.dm, a.x.get(), 64, a.bias.get(), a.y.get());
        gemm.run(b.dm, b.x.get(), 64, b.bias.get(), b.y.get());
        CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int i = 0; i < 3; ++i) CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        CUDA_CHECK(cudaGraphExecDestroy(exec));
        CUDA_CHECK(cudaGraphDestroy(graph));
        expect_close(f16, 64, true, a.y.download());
        expect_close(i8, 64, true, b.y.download());
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
}

// Staged INT8 products (CublasGemm::stage: dequantized ahead on a side stream) give the unstaged
// products' bits: matrices staged into both slots and run in order, one too large for the staging
// slot, one staged twice, a staged matrix never run (its slot taken back by an unstaged run),
// other dtypes (not staged), and a graph capture in between (nothing staged while capturing; the
// captured product's slot is staged into afterwards, then the graph replayed again).
TEST(GemmCuda, StagedInt8ProductsEqualUnstaged) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    {
        CublasGemm staged(stream, 64, 2048, 1000 * 2048, 600 * 2048), plain(stream, 64, 2048, 1000 * 2048);
        EXPECT_EQ(staged.scratch_bytes(), plain.scratch_bytes() + size_t(600 * 2048) * 2);
        EXPECT_FALSE(plain.stage(DeviceMatrix{}));
        const Case cases[] = {
            make_case(make_mat(DType::I8, 300, 2048, 128, 50), 64, 51),   // 0: A
            make_case(make_mat(DType::I8, 1000, 2048, 64, 52), 64, 53),   // 1: B, slot 0 only
            make_case(make_mat(DType::I8, 500, 1024, 1024, 54), 64, 55),  // 2: C, per row
            make_case(make_mat(DType::I8, 100, 256, 32, 56), 64, 57),     // 3: D
            make_case(make_mat(DType::F16, 200, 512, 0, 58), 64, 59),     // 4: E
        };
        std::vector<std::unique_ptr<DeviceCase>> d;
        std::vector<std::vector<float>> want;
        for (const Case& c : cases) {
            d.push_back(std::make_unique<DeviceCase>(c));
            plain.run(d.back()->dm, d.back()->x.get(), 64, d.back()->bias.get(), d.back()->y.get());
            CUDA_CHECK(cudaStreamSynchronize(stream));
            want.push_back(d.back()->y.download());
            expect_close(c, 64, true, want.back());
        }
        auto run = [&](int i) {
            CUDA_CHECK(cudaMemsetAsync(d[size_t(i)]->y.get(), 0xff, d[size_t(i)]->y.size() * 4, stream));
            staged.run(d[size_t(i)]->dm, d[size_t(i)]->x.get(), 64, d[size_t(i)]->bias.get(), d[size_t(i)]->y.get());
        };
        auto check = [&](int i, const char* when) {
            CUDA_CHECK(cudaStreamSynchronize(stream));
            const std::vector<float> got = d[size_t(i)]->y.download();
            EXPECT_EQ(std::memcmp(got.data(), want[size_t(i)].data(), got.size() * 4), 0)
                << describe(cases[i].m) << " " << when;
        };
        auto stage = [&](int i) { return staged.stage(d[size_t(i)]->dm); };
        EXPECT_TRUE(stage(0));   // A -> slot 0
        EXPECT_TRUE(stage(0));   // already staged
        EXPECT_FALSE(stage(1));  // B: slot 0 is taken, slot 1 too small
        run(0);
        EXPECT_TRUE(stage(1));   // B -> slot 0, once A's product has read it
        EXPECT_TRUE(stage(2));   // C -> slot 1
        run(1);
        run(2);
        check(0, "staged");
        check(1, "staged in the slot A was read from");
        check(2, "staged in the second slot");
        run(3);  // unstaged
        check(3, "unstaged");
        EXPECT_FALSE(stage(4));  // F16: nothing to dequantize
        run(4);
        check(4, "f16");
        EXPECT_TRUE(stage(0));  // never run: the unstaged D takes its slot back
        EXPECT_TRUE(stage(2));
        run(3);
        run(2);
        run(0);
        check(3, "unstaged over a staged matrix");
        check(2, "staged while another one waited");
        check(0, "dropped, then unstaged");

        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        EXPECT_FALSE(stage(3));
        run(3);
        CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        EXPECT_TRUE(stage(1));  // slot 0, after the replay queued before it
        run(1);
        check(3, "captured");
        check(1, "staged into a slot a graph reads");
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        check(3, "replayed after staging");
        CUDA_CHECK(cudaGraphExecDestroy(exec));
        CUDA_CHECK(cudaGraphDestroy(graph));
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(GemmCuda, InterleavedWeightsMatchReference) {
    // The decode GEMV's column order (interleave.h): the x copy (F16/BF16) or the dequantization
    // (I8) undoes it, so prefill sees the same product.
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasGemm gemm(nullptr, kMaxT, kMaxCols, kMaxWeights);
    uint32_t seed = 500;
    for (DType dt : {DType::F16, DType::BF16, DType::I8})
        for (const auto& s : {std::pair<int64_t, int64_t>{7, 128}, {100, 256}, {64, 2048}}) {
            const int64_t group = dt == DType::I8 ? 128 : 0;
            check_gemm(gemm, make_case(make_mat(dt, s.first, s.second, group, seed), kMaxT, seed + 1000), true);
            ++seed;
            if (HasFatalFailure()) return;
        }
}

// A product whose 16-bit input its producer wrote (input_for, then run with x null) equals the
// product that converts x itself, bit for bit: for F16, BF16 and I8 weights in natural and
// interleaved column order. F32 weights take no 16-bit input.
TEST(GemmCuda, ProducerWrittenInputEqualsConverted) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasGemm gemm(nullptr, kMaxT, kMaxCols, kMaxWeights);
    const int64_t T = 37;
    for (const DType dt : {DType::F16, DType::BF16, DType::I8})
        for (const bool interleave : {false, true}) {
            const Case c = make_case(make_mat(dt, 96, 256, dt == DType::I8 ? 128 : 0, 41), T, 43);
            DeviceCase d(c);
            if (interleave) {
                ASSERT_TRUE(gemv_interleave_cuda(d.dm, nullptr)) << describe(c.m);
            }
            DeviceBuffer<float> y2(d.y.size());
            gemm.run(d.dm, d.x.get(), T, d.bias.get(), d.y.get());
            const HalfInput h = gemm.input_for(d.dm);
            ASSERT_NE(h.data, nullptr);
            EXPECT_EQ(h.type, dt == DType::BF16 ? DType::BF16 : DType::F16);
            EXPECT_EQ(h.interleave_c, interleave ? interleave_chunk_cols(dt) : 0);
            const std::vector<uint16_t> in = half_input_ref(c.x, 256, h.type, h.interleave_c);
            CUDA_CHECK(cudaMemcpy(h.data, in.data(), in.size() * 2, cudaMemcpyHostToDevice));
            gemm.run(d.dm, nullptr, T, d.bias.get(), y2.get());
            EXPECT_EQ(y2.download(), d.y.download()) << describe(c.m) << (interleave ? " interleaved" : "");
        }
    const Case f = make_case(make_mat(DType::F32, 8, 16, 0, 5), 3, 6);
    DeviceCase d(f);
    EXPECT_EQ(gemm.input_for(d.dm).data, nullptr);
    EXPECT_THROW(gemm.run(d.dm, nullptr, 3, nullptr, d.y.get()), Error);
}

