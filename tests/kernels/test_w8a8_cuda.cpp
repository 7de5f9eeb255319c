// The W8A8 CUDA kernels against the CPU truth: quantize_acts_cuda bit for bit against
// quantize_acts_int8_ref, gemv_w8a8_cuda and CublasInt8Gemm against matmul_w8a8_ref on the CPU's
// quantization of the same x, over per-channel, grouped and mixed group sizes, bias on and off,
// shapes and pointers that force the plain kernels; one graph captures and replays all three.
// Skips where no GPU is usable (the argument checks run everywhere).
//
// Tolerance. Both sides compute every INT32 dot exactly (|q|, |w| <= 127; the GPU may split a
// group's dot into pieces, each exact). What differs: the reference scales each group's dot in
// double and rounds the sum once; the GPU rounds act_scale * w_scale and each piece's product (or
// fuses it), and sums at most K pieces in f32 in its own order. With u = 2^-24 and
// A = sum_k |q[t, k] w[r, k]| * act_scale * w_scale (the absolute sum of the scaled terms), that
// is within (K + 3) u A, and adding the bias rounds once on each side, so each output gets
//   |got - ref| <= (K + 8) u (A + |b|) + 1e-6.
// The test data make the scales differ from group to group (x and W grow along the row), so a
// wrong group, chunk, row or token moves an output by a sizeable part of A, far outside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/w8a8.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

constexpr uint32_t kUntouched = 0xffffffffu;  // a NaN the kernels must never write

bool have_gpu() { return cuda_usable_device_count() > 0; }

// Random values whose magnitude grows along the row (1x to 5x) and with `scale_row`, so every
// group has its own scale.
std::vector<float> ramped(int64_t rows, int64_t cols, uint32_t seed, bool by_row) {
    std::vector<float> v = rand_vec(size_t(rows * cols), seed, 1.0f);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
            v[size_t(r * cols + c)] *= (1.0f + 4.0f * float(c) / float(cols)) * (by_row ? float(1 + r % 3) : 1.0f);
    return v;
}

struct Weights {
    int64_t rows = 0, cols = 0, group = 0;
    std::vector<int8_t> q;
    std::vector<float> scales;
    WeightView view() const { return int8_weight_view(q.data(), scales.data(), rows, cols, group); }
};

Weights make_weights(int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
    Weights w;
    w.rows = rows;
    w.cols = cols;
    w.group = group;
    const std::vector<float> f = ramped(rows, cols, seed, true);
    WeightView src;
    src.dtype = DType::F32;
    src.data = f.data();
    src.rows = rows;
    src.cols = cols;
    w.q.resize(f.size());
    w.scales.resize(size_t(rows * (cols / group)));
    quantize_weights_int8_ref(src, group, w.q.data(), w.scales.data());
    return w;
}

// x [n, cols] and the CPU's quantization of it.
struct RampActs {
    int64_t n = 0, cols = 0, group = 0;
    std::vector<float> x;
    std::vector<int8_t> q;
    std::vector<float> scales;
    QuantizedActs view() const { return QuantizedActs{q.data(), scales.data(), n, cols, group}; }
};

RampActs make_ramp_acts(int64_t n, int64_t cols, int64_t group, uint32_t seed) {
    RampActs a;
    a.n = n;
    a.cols = cols;
    a.group = group;
    a.x = ramped(n, cols, seed, true);
    a.q.resize(a.x.size());
    a.scales.resize(size_t(n * (cols / group)));
    quantize_acts_int8_ref(a.x.data(), n, cols, group, a.q.data(), a.scales.data());
    return a;
}

// matmul_w8a8_ref without bias, a bias, and each output's bound without its bias term.
struct Expected {
    int64_t k = 0;               // columns
    std::vector<float> y, bias;  // y [n, rows]
    std::vector<double> bound;   // [n, rows]
};

Expected make_expected(const Weights& w, const RampActs& a, uint32_t seed) {
    Expected e;
    e.k = w.cols;
    const int64_t R = w.rows, K = w.cols, ga = a.group, gw = w.group, g = std::min(ga, gw);
    e.y.resize(size_t(a.n * R));
    e.bound.resize(e.y.size());
    e.bias = rand_vec(size_t(R), seed, 0.5f);
    matmul_w8a8_ref(a.view(), w.view(), nullptr, e.y.data());
    std::vector<int16_t> aq(a.q.begin(), a.q.end()), wq(w.q.begin(), w.q.end());
    for (auto& v : aq) v = int16_t(std::abs(v));
    for (auto& v : wq) v = int16_t(std::abs(v));
    for (int64_t t = 0; t < a.n; ++t)
        for (int64_t r = 0; r < R; ++r) {
            double abs_sum = 0;
            for (int64_t k0 = 0; k0 < K; k0 += g) {
                int32_t d = 0;  // |q| |w| <= 16129, g <= 20k: no overflow
                for (int64_t k = k0; k < k0 + g; ++k) d += int32_t(aq[size_t(t * K + k)]) * wq[size_t(r * K + k)];
                abs_sum += double(d) * a.scales[size_t(t * (K / ga) + k0 / ga)] * w.scales[size_t(r * (K / gw) + k0 / gw)];
            }
            e.bound[size_t(t * R + r)] = double(K + 8) * kU * abs_sum + 1e-6;
        }
    return e;
}

// Device copies; w_offset and q_offset (bytes) move the INT8 pointers off 16-byte alignment.
struct DeviceCase {
    DeviceBuffer<int8_t> w, q;
    DeviceBuffer<float> wscales, ascales, bias, y;
    DeviceMatrix dm;
    DeviceActs da;
    DeviceCase(const Weights& hw, const RampActs& ha, const Expected& e, size_t w_offset = 0, size_t q_offset = 0)
        : w(hw.q.size() + 64), q(ha.q.size() + 64), wscales(hw.scales), ascales(ha.scales), bias(e.bias),
          y(e.y.size()) {
        CUDA_CHECK(cudaMemcpy(w.get() + w_offset, hw.q.data(), hw.q.size(), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(q.get() + q_offset, ha.q.data(), ha.q.size(), cudaMemcpyHostToDevice));
        dm.dtype = DType::I8;
        dm.data = w.get() + w_offset;
        dm.scales = wscales.get();
        dm.rows = hw.rows;
        dm.cols = hw.cols;
        dm.group_size = hw.group;
        da.q = q.get() + q_offset;
        da.scales = ascales.get();
        da.n = ha.n;
        da.cols = ha.cols;
        da.group_size = ha.group;
    }
};

std::string describe(const Weights& w, const RampActs& a) {
    return std::to_string(w.rows) + "x" + std::to_string(w.cols) + " wgroup " + std::to_string(w.group) +
           " agroup " + std::to_string(a.group);
}

// got is y [a.n, rows] as downloaded: rows below n are checked, the others must be untouched.
void expect_close(const Expected& e, int64_t rows, int64_t n, bool with_bias, const std::vector<float>& got) {
    for (size_t i = 0; i < got.size(); ++i) {
        const int64_t t = int64_t(i) / rows, r = int64_t(i) % rows;
        if (t >= n) {
            uint32_t bits;
            std::memcpy(&bits, &got[i], 4);
            ASSERT_EQ(bits, kUntouched) << "wrote token row " << t << " >= n at output " << r;
            continue;
        }
        const float b = with_bias ? e.bias[size_t(r)] : 0.0f;
        const float want = e.y[i] + b;  // what matmul_w8a8_ref gives with the bias: float(acc) + b
        const double bound = e.bound[i] + double(std::fabs(b)) * double(e.k + 8) * kU;
        ASSERT_NEAR(got[i], want, bound) << "token " << t << " output " << r;
    }
}

// gemv_w8a8_cuda for n = 1..8, without and with bias.
void check_gemv(int64_t rows, int64_t cols, int64_t wgroup, int64_t agroup, uint32_t seed, size_t w_offset = 0,
                size_t q_offset = 0) {
    const Weights w = make_weights(rows, cols, wgroup, seed);
    const RampActs a = make_ramp_acts(kGemvMaxTokens, cols, agroup, seed + 1);
    const Expected e = make_expected(w, a, seed + 2);
    DeviceCase d(w, a, e, w_offset, q_offset);
    for (int64_t n = 1; n <= kGemvMaxTokens; ++n)
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            SCOPED_TRACE("gemv " + describe(w, a) + " n=" + std::to_string(n) + (with_bias ? " bias" : "") +
                         " w_offset=" + std::to_string(w_offset) + " q_offset=" + std::to_string(q_offset));
            CUDA_CHECK(cudaMemset(d.y.get(), 0xff, d.y.size() * 4));
            DeviceActs da = d.da;
            da.n = n;
            gemv_w8a8_cuda(d.dm, da, with_bias ? d.bias.get() : nullptr, d.y.get(), nullptr);
            expect_close(e, rows, n, with_bias != 0, d.y.download());
            if (::testing::Test::HasFatalFailure()) return;
        }
}

// CublasInt8Gemm for T in {1, 9, 17, 256} up to max_t, without and with bias.
void check_gemm(CublasInt8Gemm& gemm, int64_t rows, int64_t cols, int64_t wgroup, int64_t agroup, int64_t max_t,
                uint32_t seed, size_t w_offset = 0, size_t q_offset = 0) {
    const Weights w = make_weights(rows, cols, wgroup, seed);
    const RampActs a = make_ramp_acts(max_t, cols, agroup, seed + 1);
    const Expected e = make_expected(w, a, seed + 2);
    DeviceCase d(w, a, e, w_offset, q_offset);
    for (int64_t T : {int64_t(1), int64_t(9), int64_t(17), int64_t(256)}) {
        if (T > max_t) continue;
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            SCOPED_TRACE("gemm " + describe(w, a) + " T=" + std::to_string(T) + (with_bias ? " bias" : "") +
                         " w_offset=" + std::to_string(w_offset) + " q_offset=" + std::to_string(q_offset));
            CUDA_CHECK(cudaMemset(d.y.get(), 0xff, d.y.size() * 4));
            DeviceActs da = d.da;
            da.n = T;
            gemm.run(d.dm, da, with_bias ? d.bias.get() : nullptr, d.y.get());
            CUDA_CHECK(cudaDeviceSynchronize());
            expect_close(e, rows, T, with_bias != 0, d.y.download());
            if (::testing::Test::HasFatalFailure()) return;
        }
    }
}

// (activation group, weight group) pairs for rows of `cols`: per channel, equal groups of 32, 48,
// 64 and 128 where they divide, and the two mixed cases.
std::vector<std::pair<int64_t, int64_t>> group_pairs(int64_t cols) {
    std::vector<std::pair<int64_t, int64_t>> p = {{cols, cols}};
    for (int64_t g : {int64_t(32), int64_t(48), int64_t(64), int64_t(128)})
        if (g < cols && cols % g == 0) p.push_back({g, g});
    if (cols % 64 == 0 && cols > 64) p.push_back({cols, 64});
    if (cols % 32 == 0 && cols > 32) p.push_back({32, cols});
    return p;
}

// The CPU quantization of x, bit for bit, for x uploaded `x_offset` floats and q `q_offset`
// bytes past an aligned address.
void check_quantize(const std::vector<float>& x, int64_t n, int64_t cols, int64_t group, size_t x_offset = 0,
                    size_t q_offset = 0) {
    SCOPED_TRACE("quantize n=" + std::to_string(n) + " cols=" + std::to_string(cols) + " group=" +
                 std::to_string(group) + " x_offset=" + std::to_string(x_offset) + " q_offset=" +
                 std::to_string(q_offset));
    const size_t count = size_t(n * cols), groups = size_t(n * (cols / group));
    std::vector<int8_t> want_q(count);
    std::vector<float> want_s(groups);
    quantize_acts_int8_ref(x.data(), n, cols, group, want_q.data(), want_s.data());
    DeviceBuffer<float> dx(count + 8), ds(groups);
    DeviceBuffer<int8_t> dq(count + 64);
    CUDA_CHECK(cudaMemcpy(dx.get() + x_offset, x.data(), count * 4, cudaMemcpyHostToDevice));
    quantize_acts_cuda(dx.get() + x_offset, n, cols, group, dq.get() + q_offset, ds.get(), nullptr);
    const std::vector<int8_t> got_q_all = dq.download();
    const std::vector<float> got_s = ds.download();
    for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(int(got_q_all[q_offset + i]), int(want_q[i])) << "q at " << i << " (x " << x[i] << ")";
    for (size_t i = 0; i < groups; ++i) {
        uint32_t a, b;
        std::memcpy(&a, &got_s[i], 4);
        std::memcpy(&b, &want_s[i], 4);
        ASSERT_EQ(a, b) << "scale " << i << ": " << got_s[i] << " vs " << want_s[i];
    }
}

}  // namespace

TEST(W8A8Cuda, QuantizeMatchesReferenceBitForBit) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 1;
    for (int64_t cols : {int64_t(1), int64_t(7), int64_t(32), int64_t(96), int64_t(100), int64_t(255), int64_t(256),
                         int64_t(1000), int64_t(1025), int64_t(2048), int64_t(6144)})
        for (int64_t n = 1; n <= 9; ++n) {
            if (cols >= 1000 && n != 1 && n != 4 && n != 9) continue;
            std::vector<float> x = rand_vec(size_t(n * cols), seed++, 3.0f);
            // Special rows: all zeros, huge values, tiny values, subnormal values (127 / max|x|
            // overflows to infinity: q is +-127, and 127 for zeros (0 * inf is NaN), on both sides).
            if (n >= 2) std::fill(x.begin() + cols, x.begin() + 2 * cols, 0.0f);
            const float row_scale[] = {1e38f, 1e-30f, 1e-39f};
            for (int64_t t = 2; t < std::min<int64_t>(n, 5); ++t)
                for (int64_t c = 0; c < cols; ++c) x[size_t(t * cols + c)] *= row_scale[t - 2];
            std::vector<int64_t> groups = {cols};  // one scale per token, then groups that divide cols
            for (int64_t g : {int64_t(32), int64_t(64), int64_t(128)})
                if (g < cols && cols % g == 0) groups.push_back(g);
            for (int64_t group : groups) {
                check_quantize(x, n, cols, group);
                if (HasFatalFailure()) return;
            }
        }
}

TEST(W8A8Cuda, QuantizeOddValuesAndPointers) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    const int64_t n = 3, cols = 256;
    std::vector<float> x = rand_vec(size_t(n * cols), 77, 2.0f);
    // Infinities, a NaN, exact halves (ties of the rounding) and a lone subnormal maximum.
    x[5] = INFINITY;
    x[40] = -INFINITY;
    x[70] = NAN;
    for (int64_t c = 128; c < 192; ++c) x[size_t(c)] = 0.5f * float(c - 160);  // max 15.5 -> steps of 127/15.5
    x[size_t(cols + 3)] = 127.0f;
    for (int64_t c = 4; c < 64; ++c) x[size_t(cols + c)] = float(c) - 0.5f;  // ties after * 127 / 127
    for (int64_t c = 0; c < cols; ++c) x[size_t(2 * cols + c)] = c % 5 == 0 ? 1e-45f : 0.0f;
    for (int64_t group : {cols, int64_t(32), int64_t(64)}) {
        check_quantize(x, n, cols, group);
        if (HasFatalFailure()) return;
        check_quantize(x, n, cols, group, 1, 0);  // x off 16-byte alignment: the scalar loads
        if (HasFatalFailure()) return;
        check_quantize(x, n, cols, group, 0, 1);  // q off 4-byte alignment: the scalar stores
        if (HasFatalFailure()) return;
    }
}

TEST(W8A8Cuda, GemvMatchesReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    uint32_t seed = 100;
    // 1x16: one chunk; 37x96: a partial tile, 48-column groups (a division, not a shift); 33x100
    // and 5x40: rows no multiple of 16 bytes (the scalar path); 256x2048 and 2048x6144: model shapes.
    const std::pair<int64_t, int64_t> shapes[] = {{1, 16}, {37, 96}, {33, 100}, {5, 40}, {256, 2048}, {2048, 6144}};
    for (const auto& s : shapes)
        for (const auto& g : group_pairs(s.second)) {
            if (s.first == 2048 && g.first == g.second && g.first < 128) continue;  // enough of the big shape
            check_gemv(s.first, s.second, g.second, g.first, seed);
            seed += 3;
            if (HasFatalFailure()) return;
        }
    check_gemv(9, 40, 20, 20, seed);  // groups of 20: the scalar path's partial warps
}

TEST(W8A8Cuda, GemvMisalignedPointersTakeTheScalarPath) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    for (const auto& g : {std::pair<int64_t, int64_t>{2048, 2048}, {128, 128}, {2048, 64}}) {
        check_gemv(100, 2048, g.second, g.first, 300, 1, 0);  // weights one byte off
        if (HasFatalFailure()) return;
        check_gemv(100, 2048, g.second, g.first, 310, 0, 1);  // activations one byte off
        if (HasFatalFailure()) return;
    }
}

TEST(W8A8Cuda, GemmMatchesReference) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasInt8Gemm gemm(nullptr, 256, 2048);
    EXPECT_GE(gemm.scratch_bytes(), size_t(256 * 2048 * 4));
    uint32_t seed = 500;
    // 1x16 and 37x96: rows no multiple of 4 (the plain kernel); 36x96 and 256x2048: cuBLAS, one
    // product per dot group.
    const std::pair<int64_t, int64_t> shapes[] = {{1, 16}, {37, 96}, {36, 96}, {256, 2048}};
    for (const auto& s : shapes)
        for (const auto& g : group_pairs(s.second)) {
            check_gemm(gemm, s.first, s.second, g.second, g.first, 256, seed);
            seed += 3;
            if (HasFatalFailure()) return;
        }
    // down_proj of Qwen3-1.7B, a few tokens (the CPU reference is the slow side).
    CublasInt8Gemm big(nullptr, 17, 2048);
    check_gemm(big, 2048, 6144, 6144, 6144, 17, seed);
    if (HasFatalFailure()) return;
    check_gemm(big, 2048, 6144, 128, 128, 17, seed + 3);
}

TEST(W8A8Cuda, GemmMisalignedPointersTakeThePlainKernel) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasInt8Gemm gemm(nullptr, 17, 256);
    check_gemm(gemm, 256, 1024, 1024, 1024, 17, 600, 1, 0);
    if (HasFatalFailure()) return;
    check_gemm(gemm, 256, 1024, 128, 128, 17, 610, 0, 4);  // 4-byte aligned, not 16
}

TEST(W8A8Cuda, GemmRejectsWhatTheScratchCannotHold) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    CublasInt8Gemm gemm(nullptr, 4, 64);
    const Weights w = make_weights(64, 128, 128, 1);
    const RampActs a = make_ramp_acts(5, 128, 128, 2);
    const Expected e = make_expected(w, a, 3);
    DeviceCase d(w, a, e);
    EXPECT_THROW(gemm.run(d.dm, d.da, nullptr, d.y.get()), Error);  // 5 tokens > 4
    DeviceActs four = d.da;
    four.n = 4;
    DeviceMatrix tall = d.dm;
    tall.rows = 65;
    EXPECT_THROW(gemm.run(tall, four, nullptr, d.y.get()), Error);  // 65 rows > 64
    DeviceActs odd = four;
    odd.group_size = 96;  // does not divide 128
    EXPECT_THROW(gemm.run(d.dm, odd, nullptr, d.y.get()), Error);
    EXPECT_NO_THROW(gemm.run(d.dm, four, nullptr, d.y.get()));
    CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(W8A8Cuda, CapturedInAGraph) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    const int64_t T = 64, rows = 256, cols = 2048, group = 128;
    const Weights w = make_weights(rows, cols, group, 700);
    const RampActs a = make_ramp_acts(T, cols, group, 701);
    const Expected e = make_expected(w, a, 702);
    DeviceCase d(w, a, e);
    DeviceBuffer<float> dx(a.x), ds(a.scales.size()), dy_gemv(size_t(kGemvMaxTokens * rows));
    DeviceBuffer<int8_t> dq(a.q.size());
    DeviceActs acts = d.da;
    acts.q = dq.get();  // written by the graph's quantization
    acts.scales = ds.get();
    DeviceActs decode = acts;
    decode.n = kGemvMaxTokens;

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto gemm = std::make_unique<CublasInt8Gemm>(stream, T, rows);  // released before its stream
    const auto step = [&] {
        quantize_acts_cuda(dx.get(), T, cols, group, dq.get(), ds.get(), stream);
        gemm->run(d.dm, acts, d.bias.get(), d.y.get());
        gemv_w8a8_cuda(d.dm, decode, d.bias.get(), dy_gemv.get(), stream);
    };
    // One eager run first (lazily loaded kernels load outside the capture), then the outputs are
    // cleared so only the graph's work is checked.
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
        SCOPED_TRACE("graph gemm");
        expect_close(e, rows, T, true, got_gemm);
    }
    if (HasFatalFailure()) return;
    SCOPED_TRACE("graph gemv");
    expect_close(e, rows, kGemvMaxTokens, true, got_gemv);
}

// Argument checks happen before any CUDA call, so they run without a GPU.
TEST(W8A8Cuda, RejectsBadArguments) {
    int8_t* fake_q = reinterpret_cast<int8_t*>(uintptr_t(256));  // never dereferenced: each call throws first
    float* fake = reinterpret_cast<float*>(uintptr_t(256));
    DeviceMatrix w;
    w.dtype = DType::I8;
    w.data = fake_q;
    w.scales = fake;
    w.rows = 4;
    w.cols = 96;
    w.group_size = 96;
    DeviceActs a;
    a.q = fake_q;
    a.scales = fake;
    a.n = 1;
    a.cols = 96;
    a.group_size = 96;

    DeviceActs bad = a;
    bad.n = kGemvMaxTokens + 1;
    EXPECT_THROW(gemv_w8a8_cuda(w, bad, nullptr, fake, nullptr), Error);
    bad.n = -1;
    EXPECT_THROW(gemv_w8a8_cuda(w, bad, nullptr, fake, nullptr), Error);
    bad = a;
    bad.cols = 64;
    EXPECT_THROW(gemv_w8a8_cuda(w, bad, nullptr, fake, nullptr), Error);  // cols differ
    bad = a;
    bad.group_size = 0;
    EXPECT_THROW(gemv_w8a8_cuda(w, bad, nullptr, fake, nullptr), Error);
    bad.group_size = 36;
    EXPECT_THROW(gemv_w8a8_cuda(w, bad, nullptr, fake, nullptr), Error);  // does not divide 96
    DeviceMatrix bw = w;
    bw.dtype = DType::F16;
    EXPECT_THROW(gemv_w8a8_cuda(bw, a, nullptr, fake, nullptr), Error);
    bw = w;
    bw.group_size = 48;
    bad = a;
    bad.group_size = 32;
    EXPECT_THROW(gemv_w8a8_cuda(bw, bad, nullptr, fake, nullptr), Error);  // 32 and 48 do not divide one another
    bw.group_size = 0;
    EXPECT_THROW(gemv_w8a8_cuda(bw, a, nullptr, fake, nullptr), Error);
    bad = a;
    bad.n = 0;
    EXPECT_NO_THROW(gemv_w8a8_cuda(w, bad, nullptr, fake, nullptr));  // nothing to do, no launch

    EXPECT_THROW(quantize_acts_cuda(fake, 1, 96, 0, fake_q, fake, nullptr), Error);
    EXPECT_THROW(quantize_acts_cuda(fake, 1, 96, 36, fake_q, fake, nullptr), Error);
    EXPECT_THROW(quantize_acts_cuda(fake, -1, 96, 96, fake_q, fake, nullptr), Error);
    EXPECT_NO_THROW(quantize_acts_cuda(fake, 0, 96, 96, fake_q, fake, nullptr));
}
