// The W4A8 CUDA kernels against the CPU truth (matmul_w4a8_ref on the CPU's quantization of the
// same x): gemv_w4a8_cuda (vector and scalar paths, 1..8 token rows) and the prefill path
// (dequantize_acts_half_cuda, then CublasGemm on the I4 matrix: whole and in row blocks of its
// scratch), over equal and mixed group sizes, bias on and off; one graph captures and replays
// quantization, prefill product and GEMV. Skips where no GPU is usable (the argument checks run
// everywhere).
//
// Tolerance. Both sides' integer sums are exact on the GPU (D = sum q * code, S = sum q per dot
// group, or per 32-column piece of one); the reference sums in double over the f32 dequantized
// weights (code * scale + min, one rounding each). The GPU rounds each piece's
// act_scale * fma(w_scale, D, w_min * S) two or three times and sums at most K / 32 + 8 pieces in
// f32, so with A = sum over groups of act_scale * (w_scale * sum |q| code + |w_min| * sum |q|)
//   |got - ref| <= (K / 16 + 16) u (A + |b|) + 1e-6.
// A swapped nibble, a wrong group, scale or min, or a lost S moves an output by a sizeable part of
// A (scales and mins differ from group to group), far outside it. The prefill path rounds both
// factors of every product to f16 and sums on tensor cores:
//   |got - ref| <= (2 * 2^-11 + 4 (K + 16) u) A + (K / 16 + 16) u |b| + 1e-6.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/w4a8.h"
#include "kernels/cuda/w8a8.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/int8_test_util.h"
#ifdef SHARDLM_CUDA_EMU
#include "tests/cuda_emu/emu.h"
#endif

using namespace shardlm;
using namespace shardlm::test;

namespace {

constexpr uint32_t kUntouched = 0xffffffffu;  // a NaN the kernels must never write

bool have_gpu() { return cuda_usable_device_count() > 0; }

// matmul_w4a8_ref without bias, a bias, and each output's bound without its bias term.
struct Expected {
    int64_t k = 0;
    std::vector<float> y, bias;  // y [n, rows]
    std::vector<double> bound;   // [n, rows]
    std::vector<double> abs_sum; // [n, rows]: A above
};

Expected make_expected(const Int4Mat& w, const Acts& a, uint32_t seed) {
    Expected e;
    const int64_t R = w.rows, K = w.cols, ga = a.view.group_size, gw = w.group, n = a.view.n;
    e.k = K;
    e.y.resize(size_t(n * R));
    e.bound.resize(e.y.size());
    e.abs_sum.resize(e.y.size());
    e.bias = rand_vec(size_t(R), seed, 0.5f);
    matmul_w4a8_ref(a.view, w.view(), nullptr, e.y.data());
    for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < R; ++r) {
            double abs_sum = 0;
            for (int64_t k = 0; k < K; ++k) {
                const int code = (w.q[size_t(r * (K / 2) + k / 32 * 16 + k % 16)] >> (k % 32 >= 16 ? 4 : 0)) & 15;
                const size_t wi = size_t(r * (K / gw) + k / gw);
                const double qa = std::abs(int(a.q[size_t(t * K + k)]));
                abs_sum += a.scales[size_t(t * (K / ga) + k / ga)] * qa * (w.scales[wi] * code + std::fabs(w.mins[wi]));
            }
            e.bound[size_t(t * R + r)] = double(K / 16 + 16) * kU * abs_sum + 1e-6;
            e.abs_sum[size_t(t * R + r)] = abs_sum;
        }
    return e;
}

// Device copies; w_offset and q_offset (bytes) move the pointers off 16-byte alignment.
struct DeviceCase {
    DeviceBuffer<uint8_t> w;
    DeviceBuffer<int8_t> q;
    DeviceBuffer<float> wscales, wmins, ascales, bias, y;
    DeviceMatrix dm;
    DeviceActs da;
    DeviceCase(const Int4Mat& hw, const Acts& ha, const Expected& e, size_t w_offset = 0, size_t q_offset = 0)
        : w(hw.q.size() + 64), q(ha.q.size() + 64), wscales(hw.scales), wmins(hw.mins), ascales(ha.scales),
          bias(e.bias), y(e.y.size()) {
        CUDA_CHECK(cudaMemcpy(w.get() + w_offset, hw.q.data(), hw.q.size(), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(q.get() + q_offset, ha.q.data(), ha.q.size(), cudaMemcpyHostToDevice));
        dm.dtype = DType::I4;
        dm.data = w.get() + w_offset;
        dm.scales = wscales.get();
        dm.mins = wmins.get();
        dm.rows = hw.rows;
        dm.cols = hw.cols;
        dm.group_size = hw.group;
        da = DeviceActs{q.get() + q_offset, ascales.get(), ha.view.n, ha.view.cols, ha.view.group_size};
    }
};

std::string describe(const Int4Mat& w, const Acts& a) {
    return std::to_string(w.rows) + "x" + std::to_string(w.cols) + " wgroup " + std::to_string(w.group) +
           " agroup " + std::to_string(a.view.group_size);
}

// got is y [a.n, rows] as downloaded: token rows below n are checked, the others must be untouched.
// prefill: the prefill path's bound.
void expect_close(const Expected& e, int64_t rows, int64_t n, bool with_bias, const std::vector<float>& got,
                  bool prefill = false) {
    for (size_t i = 0; i < got.size(); ++i) {
        const int64_t t = int64_t(i) / rows, r = int64_t(i) % rows;
        if (t >= n) {
            uint32_t bits;
            std::memcpy(&bits, &got[i], 4);
            ASSERT_EQ(bits, kUntouched) << "wrote token row " << t << " >= n at output " << r;
            continue;
        }
        const float b = with_bias ? e.bias[size_t(r)] : 0.0f;
        const double bound =
            (prefill ? (2.0 / 2048 + 4.0 * double(e.k + 16) * kU) * e.abs_sum[i] + 1e-6 : e.bound[i]) +
            double(std::fabs(b)) * double(e.k / 16 + 16) * kU;
        ASSERT_NEAR(got[i], e.y[i] + b, bound) << "token " << t << " output " << r;
    }
}

void check_gemv(int64_t rows, int64_t cols, int64_t wgroup, int64_t agroup, uint32_t seed, size_t w_offset = 0,
                size_t q_offset = 0) {
    const Int4Mat w = test::make_int4(rows, cols, wgroup, seed);
    const Acts a = make_acts(kGemvMaxTokens, cols, agroup, seed + 1);
    const Expected e = make_expected(w, a, seed + 2);
    DeviceCase d(w, a, e, w_offset, q_offset);
    for (int64_t n = 1; n <= kGemvMaxTokens; ++n)
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            SCOPED_TRACE("gemv " + describe(w, a) + " n=" + std::to_string(n) + (with_bias ? " bias" : "") +
                         " w_offset=" + std::to_string(w_offset) + " q_offset=" + std::to_string(q_offset));
            CUDA_CHECK(cudaMemset(d.y.get(), 0xff, d.y.size() * 4));
            DeviceActs da = d.da;
            da.n = n;
            gemv_w4a8_cuda(d.dm, da, with_bias ? d.bias.get() : nullptr, d.y.get(), nullptr);
            expect_close(e, rows, n, with_bias != 0, d.y.download());
            if (::testing::Test::HasFatalFailure()) return;
        }
}

// The prefill path on T = 9, 17 and 256 token rows (those <= max_t), with and without bias.
void check_prefill(CublasGemm& gemm, int64_t rows, int64_t cols, int64_t wgroup, int64_t agroup, int64_t max_t,
                   uint32_t seed, size_t q_offset = 0) {
    const Int4Mat w = test::make_int4(rows, cols, wgroup, seed);
    const Acts a = make_acts(max_t, cols, agroup, seed + 1);
    const Expected e = make_expected(w, a, seed + 2);
    DeviceCase d(w, a, e, 0, q_offset);
    for (int64_t T : {int64_t(9), int64_t(17), int64_t(256)}) {
        if (T > max_t) continue;
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            SCOPED_TRACE("prefill " + describe(w, a) + " T=" + std::to_string(T) + (with_bias ? " bias" : "") +
                         " q_offset=" + std::to_string(q_offset));
            CUDA_CHECK(cudaMemset(d.y.get(), 0xff, d.y.size() * 4));
            DeviceActs da = d.da;
            da.n = T;
            dequantize_acts_half_cuda(da, gemm.input_for(d.dm), nullptr);
            gemm.run(d.dm, nullptr, T, with_bias ? d.bias.get() : nullptr, d.y.get());
            CUDA_CHECK(cudaDeviceSynchronize());
            expect_close(e, rows, T, with_bias != 0, d.y.download(), true);
            if (::testing::Test::HasFatalFailure()) return;
        }
    }
}

}  // namespace

TEST(W4A8Cuda, GemvMatchesReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    struct Case {
        int64_t rows, cols, wgroup, agroup;
    };
    // One block of codes; a partial tile with 3 groups of 32; groups of 96 (a division, not a
    // shift); mixed groups either way; model shapes (q/k/v of 2048 columns, down_proj's 6144).
    const Case cases[] = {{1, 32, 32, 32},    {37, 96, 32, 32},    {20, 192, 96, 96},  {33, 256, 64, 256},
                          {9, 256, 256, 64},  {256, 2048, 128, 128}, {64, 2048, 128, 2048}, {300, 6144, 128, 128}};
    uint32_t seed = 100;
    for (const Case& c : cases) {
        check_gemv(c.rows, c.cols, c.wgroup, c.agroup, seed);
        seed += 3;
        if (HasFatalFailure()) return;
    }
}

TEST(W4A8Cuda, GemvMisalignedPointersTakeTheScalarPath) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    check_gemv(40, 512, 128, 128, 300, 1, 0);  // codes one byte off
    if (HasFatalFailure()) return;
    check_gemv(40, 512, 64, 512, 310, 0, 1);  // activations one byte off
}

TEST(W4A8Cuda, PrefillMatchesReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasGemm gemm(nullptr, 256, 2048, 256 * 2048);
    uint32_t seed = 500;
    check_prefill(gemm, 36, 96, 32, 32, 256, seed);
    if (HasFatalFailure()) return;
    check_prefill(gemm, 37, 96, 32, 32, 256, seed + 3);
    if (HasFatalFailure()) return;
    check_prefill(gemm, 256, 2048, 128, 128, 256, seed + 6);
    if (HasFatalFailure()) return;
    check_prefill(gemm, 128, 1024, 64, 1024, 256, seed + 9);  // per-token activation scales
    if (HasFatalFailure()) return;
    check_prefill(gemm, 64, 512, 128, 512, 17, seed + 12, 3);  // q 3 bytes off
}

// A dequantization scratch for three rows of 2048 columns: the product runs in row blocks.
TEST(W4A8Cuda, PrefillInRowBlocksOfTheScratch) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasGemm gemm(nullptr, 17, 2048, 3 * 2048);
    check_prefill(gemm, 256, 2048, 128, 128, 17, 600);
    if (HasFatalFailure()) return;
    check_prefill(gemm, 10, 2048, 32, 32, 17, 610);
}

TEST(W4A8Cuda, PrefillRejectsWhatItCannotTake) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    const Int4Mat w = test::make_int4(64, 256, 64, 1);
    const Acts a = make_acts(4, 256, 64, 2);
    const Expected e = make_expected(w, a, 3);
    DeviceCase d(w, a, e);
    CublasInt8Gemm int8(nullptr, 4, 64);
    EXPECT_THROW(int8.run(d.dm, d.da, nullptr, d.y.get()), Error);  // INT8 weights only
    EXPECT_THROW(dequantize_acts_half_cuda(d.da, HalfInput{}, nullptr), Error);  // no input buffer
    DeviceActs odd = d.da;
    odd.group_size = 2;
    CublasGemm wide(nullptr, 4, 256, 64 * 256);  // (the 16-bit input's rows are the caller's to size)
    EXPECT_THROW(dequantize_acts_half_cuda(odd, wide.input_for(d.dm), nullptr), Error);
    EXPECT_NO_THROW(dequantize_acts_half_cuda(d.da, wide.input_for(d.dm), nullptr));
    CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(W4A8Cuda, CapturedInAGraph) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    const int64_t T = 64, rows = 256, cols = 2048, group = 128;
    const Int4Mat w = test::make_int4(rows, cols, group, 700);
    const Acts a = make_acts(T, cols, group, 701);
    const Expected e = make_expected(w, a, 702);
    DeviceCase d(w, a, e);
    DeviceBuffer<float> dx(a.f32), ds(a.scales.size()), dy_gemv(size_t(kGemvMaxTokens * rows));
    DeviceBuffer<int8_t> dq(a.q.size());
    DeviceActs acts = d.da;
    acts.q = dq.get();  // written by the graph's quantization
    acts.scales = ds.get();
    DeviceActs decode = acts;
    decode.n = kGemvMaxTokens;

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto gemm = std::make_unique<CublasGemm>(stream, T, cols, rows * cols);  // released before its stream
    const auto step = [&] {
        quantize_acts_cuda(dx.get(), T, cols, group, dq.get(), ds.get(), stream);
        dequantize_acts_half_cuda(acts, gemm->input_for(d.dm), stream);
        gemm->run(d.dm, nullptr, T, d.bias.get(), d.y.get());
        gemv_w4a8_cuda(d.dm, decode, d.bias.get(), dy_gemv.get(), stream);
    };
    // One eager run first (lazily loaded kernels load outside the capture), then the outputs are
    // cleared so that only the graph's work is checked.
    step();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemsetAsync(dq.get(), 0, dq.size(), stream));
    CUDA_CHECK(cudaMemsetAsync(d.y.get(), 0, d.y.size() * 4, stream));
    CUDA_CHECK(cudaMemsetAsync(dy_gemv.get(), 0, dy_gemv.size() * 4, stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    step();
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<float> got_gemm = d.y.download(), got_gemv = dy_gemv.download();
    const std::vector<int8_t> got_q = dq.download();
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    gemm.reset();
    CUDA_CHECK(cudaStreamDestroy(stream));
    ASSERT_EQ(got_q, a.q);
    {
        SCOPED_TRACE("graph prefill");
        expect_close(e, rows, T, true, got_gemm, true);
    }
    if (HasFatalFailure()) return;
    SCOPED_TRACE("graph gemv");
    expect_close(e, rows, kGemvMaxTokens, true, got_gemv);
}

// Argument checks happen before any CUDA call, so they run without a GPU.
TEST(W4A8Cuda, RejectsBadArguments) {
    int8_t* fake_q = reinterpret_cast<int8_t*>(uintptr_t(256));  // never dereferenced: each call throws first
    float* fake = reinterpret_cast<float*>(uintptr_t(256));
    DeviceMatrix w;
    w.dtype = DType::I4;
    w.data = fake_q;
    w.scales = w.mins = fake;
    w.rows = 4;
    w.cols = 128;
    w.group_size = 64;
    const DeviceActs a{fake_q, fake, 1, 128, 64};

    DeviceActs bad = a;
    bad.n = kGemvMaxTokens + 1;
    EXPECT_THROW(gemv_w4a8_cuda(w, bad, nullptr, fake, nullptr), Error);
    bad.n = -1;
    EXPECT_THROW(gemv_w4a8_cuda(w, bad, nullptr, fake, nullptr), Error);
    bad = a;
    bad.cols = 64;
    EXPECT_THROW(gemv_w4a8_cuda(w, bad, nullptr, fake, nullptr), Error);  // cols differ
    bad = a;
    bad.group_size = 16;
    EXPECT_THROW(gemv_w4a8_cuda(w, bad, nullptr, fake, nullptr), Error);  // the smaller group below 32
    bad.group_size = 0;
    EXPECT_THROW(gemv_w4a8_cuda(w, bad, nullptr, fake, nullptr), Error);
    DeviceMatrix bw = w;
    bw.dtype = DType::I8;
    EXPECT_THROW(gemv_w4a8_cuda(bw, a, nullptr, fake, nullptr), Error);
    bw = w;
    bw.group_size = 48;  // not a multiple of 32
    EXPECT_THROW(gemv_w4a8_cuda(bw, a, nullptr, fake, nullptr), Error);
    bw = w;
    bw.mins = nullptr;
    EXPECT_THROW(gemv_w4a8_cuda(bw, a, nullptr, fake, nullptr), Error);
    bad = a;
    bad.n = 0;
    EXPECT_NO_THROW(gemv_w4a8_cuda(w, bad, nullptr, fake, nullptr));  // nothing to do, no launch
}
