// The decode and prefill matrix products on the shapes of Qwen3-1.7B.
//
//   gemv_bench_cuda [reps]      (default 20)
//
// gemv_cuda: n = 1, 4, 8 token rows, f16, i8 (per channel and groups of 128) and i4 (groups of
// 128) weights, in the natural and the interleaved column order (kernels/cuda/interleave.h; the timing does not depend
// on the values, so the flag is set on constant data), and gemv_w8a8_cuda (int8 activations). Each
// call reads a different copy of the matrix, cycling through at least 512 MB, so the weights come
// from HBM, not from the L2 (50-60 MB). Time per call is the median over `reps` replays of a CUDA
// graph of back-to-back calls (as decode runs); GB/s counts weights + scales + x + y once.
// It is compared with a measured device-to-device cudaMemcpy (read + write counted) and with the
// device's theoretical peak (2 transfers per memory clock times the bus width).
//
// gate/up + SwiGLU: the two-kernel decode MLP half against gemv_swiglu_cuda's fused epilogue.
//
// Grids: gemv_cuda with a block per row tile against its persistent grid, both in one run.
//
// Act-order: what gathering a projection's input into its columns' order (kernels/cuda/gather.h)
// adds to the GEMV after it, and so to a decode step.
//
// A decode step's matrices (f16, batch 1) as the engine's GEMVs, as stream_read_cuda kernels that
// only load, and as one stream_read_cuda over all of them: what the kernel boundaries cost.
//
// CublasGemm: T = 512 and 2048 tokens, f16 and i8 weights (i8 includes its dequantization pass),
// TFLOP/s = 2 * T * rows * cols / time.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/stream_read.h"
#include "kernels/cuda/w8a8.h"

using namespace shardlm;

namespace {

struct Shape {
    const char* name;
    int64_t rows, cols;
};

const Shape kShapes[] = {{"q_proj/o_proj", 2048, 2048},
                         {"k_proj/v_proj", 1024, 2048},
                         {"gate/up_proj", 6144, 2048},
                         {"down_proj", 2048, 6144},
                         {"lm_head", 151936, 2048}};

struct Weights {
    DType dtype;
    int64_t group;  // I8: 0 = one scale per row
    const char* name;
    bool interleaved = false;
    bool w8a8 = false;  // gemv_w8a8_cuda: int8 activations, one scale per token
};

const Weights kWeights[] = {{DType::F16, 0, "f16"},
                            {DType::F16, 0, "f16-interleaved", true},
                            {DType::I8, 0, "i8"},
                            {DType::I8, 0, "i8-interleaved", true},
                            {DType::I8, 128, "i8-g128"},
                            {DType::I8, 128, "i8-g128-interleaved", true},
                            {DType::I8, 0, "w8a8", false, true},
                            {DType::I4, 128, "i4-g128"},
                            {DType::I4, 128, "i4-g128-interleaved", true}};

// Bytes of the weights themselves, and of their I8 scales (I4: scales and mins).
size_t weight_bytes(const Weights& wt, int64_t rows, int64_t cols) {
    return wt.dtype == DType::I4 ? size_t(rows * cols / 2) : size_t(rows * cols) * dtype_size(wt.dtype);
}
size_t scale_bytes(const Weights& wt, int64_t rows, int64_t cols, int64_t group) {
    const size_t per = size_t(rows * (cols / group)) * 4;
    return wt.dtype == DType::I8 ? per : wt.dtype == DType::I4 ? 2 * per : 0;
}

constexpr size_t kColdBytes = size_t(512) << 20;  // weights cycled per measurement, ~8x the L2

struct DevBuf {
    void* p = nullptr;
    explicit DevBuf(size_t bytes) {
        CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
        CUDA_CHECK(cudaMemset(p, 0x3c, bytes));  // f16 ~1.06, i8 60, f32 ~0.0115: finite, not zero
    }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Milliseconds per call of launch(i), i = 0, 1, ...: median over `batches` batches of
// `per_batch` back-to-back calls, after one batch of warm-up.
template <typename Launch>
double time_ms(Launch&& launch, int per_batch, int batches, cudaStream_t stream) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < per_batch; ++i) launch(i);
    std::vector<double> ms;
    for (int b = 0; b < batches; ++b) {
        CUDA_CHECK(cudaEventRecord(start, stream));
        for (int i = 0; i < per_batch; ++i) launch(i);
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        ms.push_back(double(t) / per_batch);
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return median(ms);
}

// The same for a batch replayed as one CUDA graph, as decode runs it: back-to-back launches from
// the host would time the launch overhead (~2-3 us) instead of a ~1-us kernel.
template <typename Launch>
double time_graph_ms(Launch&& launch, int per_batch, int batches, cudaStream_t stream) {
    launch(0);  // eager first: lazily loaded kernels load outside the capture
    CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < per_batch; ++i) launch(i);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const double ms =
        time_ms([&](int) { CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, 1, batches, stream) / per_batch;
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return ms;
}

// Device-to-device copy of 1 GiB, read + write counted, in GB/s.
double copy_gbps(cudaStream_t stream, int reps) {
    const size_t bytes = size_t(1) << 30;
    DevBuf a(bytes), b(bytes);
    const double ms = time_ms(
        [&](int) { CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, stream)); }, 4, reps, stream);
    return 2.0 * double(bytes) / (ms * 1e6);
}

double peak_gbps(int dev) {
    int clock_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0.0;
    }
    return 2.0 * double(clock_khz) * 1e3 * (bus_bits / 8.0) / 1e9;
}

// The DeviceMatrix of weights (rows x cols of wt.dtype) at m.p, I8/I4 scales (one per `group`
// columns) right after them, then I4 mins.
DeviceMatrix matrix_at(const DevBuf& m, const Weights& wt, int64_t rows, int64_t cols, int64_t group) {
    DeviceMatrix w;
    w.dtype = wt.dtype;
    w.data = m.p;
    w.rows = rows;
    w.cols = cols;
    if (wt.dtype == DType::I8 || wt.dtype == DType::I4) {
        const char* s = static_cast<const char*>(m.p) + weight_bytes(wt, rows, cols);
        w.scales = reinterpret_cast<const float*>(s);
        if (wt.dtype == DType::I4) w.mins = w.scales + rows * (cols / group);
        w.group_size = group;
    }
    w.interleaved = wt.interleaved;
    return w;
}

void bench_gemv(cudaStream_t stream, int reps, double copy, double peak) {
    std::printf("\n## gemv_cuda (decode), weights cycled through >= %zu MB\n\n", kColdBytes >> 20);
    std::printf("| shape | rows x cols | weights | n | us | GB/s | %% of copy | %% of peak |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    for (const Shape& s : kShapes)
        for (const Weights& wt : kWeights) {
            const int64_t group = wt.group ? wt.group : s.cols;
            const size_t w_bytes = weight_bytes(wt, s.rows, s.cols);
            const size_t s_bytes = scale_bytes(wt, s.rows, s.cols, group);
            const int copies = int(std::max<size_t>(2, (kColdBytes + w_bytes - 1) / w_bytes));
            std::vector<std::unique_ptr<DevBuf>> mats;
            for (int i = 0; i < copies; ++i) mats.push_back(std::make_unique<DevBuf>(w_bytes + s_bytes));
            DevBuf x(size_t(kGemvMaxTokens * s.cols) * 4), y(size_t(kGemvMaxTokens * s.rows) * 4);
            DevBuf xq(size_t(kGemvMaxTokens * s.cols)), xs(size_t(kGemvMaxTokens) * 4);  // w8a8's int8 x
            for (int64_t n : {int64_t(1), int64_t(4), int64_t(8)}) {
                const double ms = time_graph_ms(
                    [&](int i) {
                        const DeviceMatrix w = matrix_at(*mats[size_t(i % copies)], wt, s.rows, s.cols, group);
                        if (wt.w8a8) {
                            const DeviceActs a{static_cast<const int8_t*>(xq.p), static_cast<const float*>(xs.p), n,
                                               s.cols, s.cols};
                            gemv_w8a8_cuda(w, a, nullptr, static_cast<float*>(y.p), stream);
                            return;
                        }
                        gemv_cuda(w, static_cast<const float*>(x.p), n, nullptr, static_cast<float*>(y.p), stream);
                    },
                    std::max(copies, 32), reps, stream);
                const double x_bytes = wt.w8a8 ? double(n) * double(s.cols + 4) : 4.0 * double(n) * double(s.cols);
                const double bytes = double(w_bytes + s_bytes) + x_bytes + 4.0 * double(n) * double(s.rows);
                const double gbps = bytes / (ms * 1e6);
                std::printf("| %s | %lldx%lld | %s | %lld | %.1f | %.0f | %.1f | %.1f |\n", s.name, (long long)s.rows,
                            (long long)s.cols, wt.name, (long long)n, ms * 1e3, gbps, 100.0 * gbps / copy,
                            peak > 0 ? 100.0 * gbps / peak : 0.0);
                std::fflush(stdout);
            }
        }
}

// The decode MLP's first half of Qwen3-1.7B ([gate; up] = 12288 x 2048): the GEMV into [n, 12288]
// followed by silu_mul_rows_cuda, against gemv_swiglu_cuda (SwiGLU in the GEMV's epilogue).
void bench_swiglu(cudaStream_t stream, int reps) {
    const int64_t inter = 6144, cols = 2048;
    std::printf("\n## gate/up + SwiGLU (decode): two kernels vs the fused epilogue\n\n");
    std::printf("| weights | n | gemv + silu_mul_rows us | gemv_swiglu us |\n|---|---|---|---|\n");
    for (const Weights& wt : {kWeights[1], kWeights[3]}) {  // the interleaved f16 and i8 the engine runs
        const size_t w_bytes = size_t(2 * inter * cols) * dtype_size(wt.dtype);
        const size_t s_bytes = wt.dtype == DType::I8 ? size_t(2 * inter) * 4 : 0;
        const int copies = int(std::max<size_t>(2, (kColdBytes + w_bytes - 1) / w_bytes));
        std::vector<std::unique_ptr<DevBuf>> mats;
        for (int i = 0; i < copies; ++i) mats.push_back(std::make_unique<DevBuf>(w_bytes + s_bytes));
        DevBuf x(size_t(kGemvMaxTokens * cols) * 4), gu(size_t(kGemvMaxTokens * 2 * inter) * 4),
            y(size_t(kGemvMaxTokens * inter) * 4);
        auto matrix = [&](int i) { return matrix_at(*mats[size_t(i % copies)], wt, 2 * inter, cols, cols); };
        for (int64_t n : {int64_t(1), int64_t(4), int64_t(8)}) {
            const float* xp = static_cast<const float*>(x.p);
            const double two = time_graph_ms(
                [&](int i) {
                    gemv_cuda(matrix(i), xp, n, nullptr, static_cast<float*>(gu.p), stream);
                    silu_mul_rows_cuda(static_cast<const float*>(gu.p), n, inter, static_cast<float*>(y.p), stream);
                },
                std::max(copies, 32), reps, stream);
            const double fused = time_graph_ms(
                [&](int i) {
                    if (!gemv_swiglu_cuda(matrix(i), xp, n, nullptr, static_cast<float*>(y.p), stream))
                        throw std::runtime_error("gemv_swiglu_cuda declined the Qwen3 shape");
                },
                std::max(copies, 32), reps, stream);
            std::printf("| %s | %lld | %.1f | %.1f |\n", wt.name, (long long)n, two * 1e3, fused * 1e3);
            std::fflush(stdout);
        }
    }
}

// Act-order checkpoints (GPTQ desc_act): the engine gathers each projection's input into its
// columns' order before the GEMV. The GEMV alone against gather + GEMV in one replayed graph (the
// gather's launch and its dependency included, as decode runs them), on the interleaved INT4
// groups of 128 that GPTQ's 4 bits load as. A Qwen3-1.7B step gathers o_proj's input (2048
// columns) in each layer, and q/k/v's and gate/up's too where they are not stacked (orders that
// differ; stacked, the norm writes their input in order); down_proj's input is made in its order
// (LayerWeights::inter_rows).
void bench_gather(cudaStream_t stream, int reps) {
    std::printf("\n## act-order input gather (decode, i4-g128-interleaved): gemv vs gather + gemv\n\n");
    std::printf("| shape | n | gemv us | gather + gemv us | the gather adds us |\n|---|---|---|---|---|\n");
    const Weights& wt = kWeights[8];
    const int64_t ns[] = {1, 4, 8};
    double added[3] = {};  // [n]
    const Shape& s = kShapes[0];
    const size_t w_bytes = weight_bytes(wt, s.rows, s.cols), s_bytes = scale_bytes(wt, s.rows, s.cols, wt.group);
    const int copies = int(std::max<size_t>(2, (kColdBytes + w_bytes - 1) / w_bytes));
    std::vector<std::unique_ptr<DevBuf>> mats;
    for (int i = 0; i < copies; ++i) mats.push_back(std::make_unique<DevBuf>(w_bytes + s_bytes));
    DevBuf x(size_t(kGemvMaxTokens * s.cols) * 4), xo(size_t(kGemvMaxTokens * s.cols) * 4),
        y(size_t(kGemvMaxTokens * s.rows) * 4), order(size_t(s.cols) * 4);
    std::vector<int32_t> perm(static_cast<size_t>(s.cols));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
    CUDA_CHECK(cudaMemcpy(order.p, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
    for (int k = 0; k < 3; ++k) {
        const int64_t n = ns[k];
        auto run = [&](bool gather) {
            return time_graph_ms(
                [&](int i) {
                    const float* in = static_cast<const float*>(x.p);
                    if (gather) {
                        gather_columns_cuda(in, n, s.cols, 1, static_cast<const int32_t*>(order.p), s.cols,
                                            static_cast<float*>(xo.p), stream);
                        in = static_cast<const float*>(xo.p);
                    }
                    const DeviceMatrix w = matrix_at(*mats[size_t(i % copies)], wt, s.rows, s.cols, wt.group);
                    gemv_cuda(w, in, n, nullptr, static_cast<float*>(y.p), stream);
                },
                std::max(copies, 32), reps, stream);
        };
        const double plain = run(false), gathered = run(true);
        added[k] = (gathered - plain) * 1e3;
        std::printf("| %s | %lld | %.1f | %.1f | %.1f |\n", s.name, (long long)n, plain * 1e3, gathered * 1e3, added[k]);
        std::fflush(stdout);
    }
    std::printf("\nper Qwen3-1.7B decode step, 28 layers x 1 gather of 2048 columns (3 where q/k/v and gate/up are "
                "not stacked):");
    for (int k = 0; k < 3; ++k)
        std::printf(" n=%lld %.1f us (%.1f);", (long long)ns[k], 28.0 * added[k], 28.0 * 3.0 * added[k]);
    std::printf("\n");
}

// The two grids of gemv_cuda's vector path (gemv.h GemvGrid) in one run, on the interleaved f16
// and i8 weights the engine decodes with: a block per row tile, or the persistent grid of
// resident blocks looping over tiles. gate/up + SwiGLU is the fused epilogue's [gate; up] matrix.
void bench_grid(cudaStream_t stream, int reps, double copy) {
    std::printf("\n## gemv_cuda grids: a block per tile vs persistent (weights cycled, graph replay)\n\n");
    std::printf("| shape | rows x cols | weights | n | tiles us | persistent us | persistent %% of copy | "
                "tiles / persistent |\n|---|---|---|---|---|---|---|---|\n");
    struct GridShape {
        Shape shape;
        bool swiglu;
    };
    const GridShape shapes[] = {{kShapes[0], false}, {kShapes[1], false}, {{"gate/up + SwiGLU", 12288, 2048}, true},
                                {kShapes[3], false}, {kShapes[4], false}};
    for (const GridShape& gs : shapes)
        for (const Weights& wt : {kWeights[1], kWeights[3]}) {
            const Shape& s = gs.shape;
            const size_t w_bytes = size_t(s.rows * s.cols) * dtype_size(wt.dtype);
            const size_t s_bytes = wt.dtype == DType::I8 ? size_t(s.rows) * 4 : 0;
            const int copies = int(std::max<size_t>(2, (kColdBytes + w_bytes - 1) / w_bytes));
            std::vector<std::unique_ptr<DevBuf>> mats;
            for (int i = 0; i < copies; ++i) mats.push_back(std::make_unique<DevBuf>(w_bytes + s_bytes));
            DevBuf x(size_t(kGemvMaxTokens * s.cols) * 4), y(size_t(kGemvMaxTokens * s.rows) * 4);
            for (int64_t n : {int64_t(1), int64_t(2), int64_t(4)}) {
                double ms[2];
                for (GemvGrid grid : {GemvGrid::PerTile, GemvGrid::Persistent})
                    ms[grid == GemvGrid::Persistent] = time_graph_ms(
                        [&](int i) {
                            const DeviceMatrix w = matrix_at(*mats[size_t(i % copies)], wt, s.rows, s.cols, s.cols);
                            const float* xp = static_cast<const float*>(x.p);
                            float* yp = static_cast<float*>(y.p);
                            if (!gs.swiglu) gemv_cuda(w, xp, n, nullptr, yp, stream, grid);
                            else if (!gemv_swiglu_cuda(w, xp, n, nullptr, yp, stream, grid))
                                throw std::runtime_error("gemv_swiglu_cuda declined the Qwen3 shape");
                        },
                        std::max(copies, 32), reps, stream);
                const double bytes = double(w_bytes + s_bytes) + 4.0 * double(n) * double(s.cols + s.rows);
                std::printf("| %s | %lldx%lld | %s | %lld | %.1f | %.1f | %.1f | %.2f |\n", s.name, (long long)s.rows,
                            (long long)s.cols, wt.name, (long long)n, ms[0] * 1e3, ms[1] * 1e3,
                            100.0 * bytes / (ms[1] * 1e6) / copy, ms[0] / ms[1]);
                std::fflush(stdout);
            }
        }
}

// The matrices a batch-1 FP16 decode step of Qwen3-1.7B reads, in its order: per layer [q; k; v]
// (4096 x 2048, the input norm folded in), o_proj (2048 x 2048, added into the residual stream),
// [gate; up] (12288 x 2048, the post-attention norm folded in, SwiGLU in the epilogue) and down_proj
// (2048 x 6144, added), 28 layers, then lm_head (151936 x 2048): 3.44 GB, carved from one
// allocation so that the last row can read it all in one kernel. Each variant is one graph
// replayed as decode replays its step (PDL as in the engine; nothing else runs between the
// matrices: no attention, no embedding, no sampling):
//   gemv: the engine's GEMVs (GemvFuse as the engine fuses at batch 1), interleaved f16;
//   stream per matrix: stream_read_cuda over each matrix instead, a kernel that only loads;
//   stream, one kernel: stream_read_cuda over the whole step's bytes.
// The gap between the first two is the GEMVs' own cost (reduction, x, epilogue); between the last
// two, what a kernel boundary per matrix costs even a kernel that does nothing but load.
void bench_step_floor(cudaStream_t stream, int reps, double copy, double peak) {
    const int64_t layers = 28, hidden = 2048, inter = 6144, vocab = 151936;
    struct Mat {
        int64_t rows, cols;
        int kind;  // 0 qkv (normed), 1 o (accumulate), 2 gate/up (normed, SwiGLU), 3 down (accumulate), 4 lm_head
        size_t offset;
    };
    std::vector<Mat> mats;
    size_t total = 0;
    auto add = [&](int64_t rows, int64_t cols, int kind) {
        mats.push_back({rows, cols, kind, total});
        total += (size_t(rows * cols) * 2 + 255) / 256 * 256;
    };
    for (int64_t l = 0; l < layers; ++l) {
        add(4096, hidden, 0);
        add(hidden, hidden, 1);
        add(2 * inter, hidden, 2);
        add(hidden, inter, 3);
    }
    add(vocab, hidden, 4);
    DevBuf w(total), x(size_t(hidden) * 4), norm(size_t(hidden) * 4), qkv(4096 * 4), attn(size_t(hidden) * 4),
        gate(size_t(inter) * 4), logits(size_t(vocab) * 4), sum(4);
    auto matrix = [&](const Mat& m) {
        DeviceMatrix d;
        d.dtype = DType::F16;
        d.data = static_cast<const char*>(w.p) + m.offset;
        d.rows = m.rows;
        d.cols = m.cols;
        d.interleaved = true;  // constant data: the layout changes nothing but the access order
        return d;
    };
    float* xp = static_cast<float*>(x.p);
    const float* nw = static_cast<const float*>(norm.p);
    const GemvFuse normed{nw, 1e-6f, false}, add_into{nullptr, 0.0f, true};
    auto gemvs = [&](int) {
        for (const Mat& m : mats) {
            const DeviceMatrix d = matrix(m);
            if (m.kind == 0) gemv_cuda(d, xp, 1, nullptr, static_cast<float*>(qkv.p), normed, stream);
            else if (m.kind == 1) gemv_cuda(d, static_cast<const float*>(attn.p), 1, nullptr, xp, add_into, stream);
            else if (m.kind == 2 && !gemv_swiglu_cuda(d, xp, 1, nullptr, static_cast<float*>(gate.p), normed, stream))
                throw std::runtime_error("gemv_swiglu_cuda declined the Qwen3 shape");
            else if (m.kind == 3) gemv_cuda(d, static_cast<const float*>(gate.p), 1, nullptr, xp, add_into, stream);
            else if (m.kind == 4) gemv_cuda(d, xp, 1, nullptr, static_cast<float*>(logits.p), stream);
        }
    };
    auto streams = [&](int) {
        for (const Mat& m : mats)
            stream_read_cuda(static_cast<const char*>(w.p) + m.offset, size_t(m.rows * m.cols) * 2,
                             static_cast<uint32_t*>(sum.p), stream);
    };
    auto one = [&](int) { stream_read_cuda(w.p, total, static_cast<uint32_t*>(sum.p), stream); };
    size_t bytes = 0;
    for (const Mat& m : mats) bytes += size_t(m.rows * m.cols) * 2;
    std::printf("\n## A decode step's matrices (Qwen3-1.7B f16, batch 1: %zu matrices, %.2f GB), one graph each\n\n",
                mats.size(), double(bytes) / 1e9);
    std::printf("| variant | kernels | ms | GB/s | %% of copy | %% of peak |\n|---|---|---|---|---|---|\n");
    const struct {
        const char* name;
        size_t kernels;
        std::function<void(int)> run;
    } variants[] = {{"gemv (as the engine at batch 1)", mats.size(), gemvs},
                    {"stream_read per matrix", mats.size(), streams},
                    {"stream_read, one kernel", 1, one}};
    for (const auto& v : variants) {
        const double ms = time_graph_ms(v.run, 1, reps, stream);
        const double gbps = double(bytes) / (ms * 1e6);
        std::printf("| %s | %zu | %.3f | %.0f | %.1f | %.1f |\n", v.name, v.kernels, ms, gbps, 100.0 * gbps / copy,
                    peak > 0 ? 100.0 * gbps / peak : 0.0);
        std::fflush(stdout);
    }
}

void bench_gemm(cudaStream_t stream, int reps) {
    const int64_t max_t = 2048, max_cols = 6144, max_w = 151936 * 2048;
    CublasGemm gemm(stream, max_t, max_cols, max_w);
    std::printf("\n## CublasGemm (prefill), scratch %.0f MB\n\n", double(gemm.scratch_bytes()) / (1 << 20));
    std::printf("| shape | rows x cols | weights | T | ms | TFLOP/s |\n|---|---|---|---|---|---|\n");
    DevBuf x(size_t(max_t * max_cols) * 4), y(size_t(max_t * 151936) * 4);
    for (const Shape& s : kShapes)
        for (const Weights& wt : {kWeights[0], kWeights[2]}) {
            const size_t w_bytes = size_t(s.rows * s.cols) * dtype_size(wt.dtype);
            DevBuf m(w_bytes + (wt.dtype == DType::I8 ? size_t(s.rows) * 4 : 0));
            DeviceMatrix w;
            w.dtype = wt.dtype;
            w.data = m.p;
            w.rows = s.rows;
            w.cols = s.cols;
            if (wt.dtype == DType::I8) {
                w.scales = reinterpret_cast<const float*>(static_cast<const char*>(m.p) + w_bytes);
                w.group_size = s.cols;
            }
            for (int64_t T : {int64_t(512), int64_t(2048)}) {
                const double ms = time_ms(
                    [&](int) { gemm.run(w, static_cast<const float*>(x.p), T, nullptr, static_cast<float*>(y.p)); }, 2,
                    std::max(3, reps / 4), stream);
                const double tflops = 2.0 * double(T) * double(s.rows) * double(s.cols) / (ms * 1e9);
                std::printf("| %s | %lldx%lld | %s | %lld | %.3f | %.1f |\n", s.name, (long long)s.rows,
                            (long long)s.cols, wt.name, (long long)T, ms, tflops);
                std::fflush(stdout);
            }
        }
}

}  // namespace

int main(int argc, char** argv) {
    if (cuda_usable_device_count() == 0) {
        std::fprintf(stderr, "gemv_bench_cuda: no usable CUDA device; nothing to measure\n");
        return 1;
    }
    const int reps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 20;
    try {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        cudaStream_t stream;
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        const double copy = copy_gbps(stream, reps), peak = peak_gbps(dev);
        std::printf("# %s\n\ndevice-to-device copy: %.0f GB/s (read + write); theoretical peak: %.0f GB/s\n",
                    cuda_device_description(dev).c_str(), copy, peak);
        bench_gemv(stream, reps, copy, peak);
        bench_swiglu(stream, reps);
        bench_grid(stream, reps, copy);
        bench_gather(stream, reps);
        bench_step_floor(stream, reps, copy, peak);
        bench_gemm(stream, reps);
        CUDA_CHECK(cudaStreamDestroy(stream));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gemv_bench_cuda: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
