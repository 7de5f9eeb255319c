// The CUDA engine against the CPU engine on tiny random checkpoints of every architecture
// (ggml's test-backend-ops idea on whole models): same prompts, same weights, logits compared
// step by step and greedy tokens required equal. Skips where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "comm/communicator.h"
#include "core/error.h"
#include "fixtures.h"
#include "hf_quant_writer.h"
#include "kernels/cpu/nucleus.h"
#include "kernels/cpu/topk.h"
#include "kernels/cuda/device.h"
#include "model/lora_weights.h"
#include "runtime/cuda_engine.h"
#include "runtime/embed.h"
#include "runtime/sampler.h"
#ifdef SHARDLM_CUDA_EMU
#include "tests/cuda_emu/emu.h"
#endif

using namespace shardlm;
using namespace shardlm::test;

namespace {

#define SKIP_WITHOUT_GPU() \
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device"

struct Trace {
    std::vector<std::vector<float>> logits;  // one [B, vocab] block per step
    std::vector<std::vector<int32_t>> tokens;  // greedy tokens per sequence
};

struct RunOptions {
    Device device = Device::Cpu;
    WeightFormat weights = WeightFormat::Auto;
    int64_t group = 0;      // LoadOptions::group_size
    std::string keep_fp16;  // LoadOptions::keep_fp16
    KVFormat kv = KVFormat::F32;
    int64_t prefill_chunk = 256;
    AttentionImpl attention = AttentionImpl::Flash;
    bool graphs = true;
    int64_t steps = 6;
};

// Prefill every prompt (in chunks), then `steps` greedy decode steps for the whole batch.
Trace trace(const std::string& dir, const std::vector<std::vector<int32_t>>& prompts, const RunOptions& o) {
    SessionOptions so;
    so.model_dir = dir;
    so.device = o.device;
    so.load.format = o.weights;
    so.load.group_size = o.group;
    so.load.keep_fp16 = o.keep_fp16;
    so.kv = o.kv;
    so.max_batch = int64_t(prompts.size());
    so.ctx = 96;
    so.prefill_chunk = o.prefill_chunk;
    so.attention = o.attention;
    so.cuda_graphs = o.graphs;
    SingleRank comm;
    auto s = open_session(so, comm);
    Engine& e = *s->engine;
    const int64_t V = e.config().vocab, B = int64_t(prompts.size());
    Trace r;
    r.tokens.resize(prompts.size());
    std::vector<float> row(static_cast<size_t>(V));
    // Prefill, one sequence at a time in chunks, keeping the logits of its last position.
    std::vector<float> first(static_cast<size_t>(B * V));
    for (int64_t b = 0; b < B; ++b) {
        const auto& p = prompts[size_t(b)];
        for (int64_t at = 0; at < int64_t(p.size()); at += o.prefill_chunk) {
            const int64_t n = std::min<int64_t>(o.prefill_chunk, int64_t(p.size()) - at);
            const bool last = at + n == int64_t(p.size());
            e.forward({{b, p.data() + at, n, at, last}}, row.data());
            if (last) std::copy(row.begin(), row.end(), first.begin() + b * V);
        }
    }
    r.logits.push_back(first);
    auto argmax = [&](const float* x) { return int32_t(std::max_element(x, x + V) - x); };
    // Decode inputs are fixed (teacher forcing), not each engine's own picks: one near-tie picked
    // differently would otherwise send the two runs down different sequences.
    std::vector<std::vector<int32_t>> forced;
    for (int64_t b = 0; b < B; ++b) forced.push_back(make_prompt(o.steps, V, 100 + uint64_t(b)));
    for (int64_t b = 0; b < B; ++b) r.tokens[size_t(b)].push_back(argmax(first.data() + b * V));
    std::vector<float> step(static_cast<size_t>(B * V));
    for (int64_t t = 0; t < o.steps; ++t) {
        std::vector<SeqChunk> ch;
        for (int64_t b = 0; b < B; ++b)
            ch.push_back({b, &forced[size_t(b)][size_t(t)], 1, int64_t(prompts[size_t(b)].size()) + t, true});
        e.forward(ch, step.data());
        r.logits.push_back(step);
        for (int64_t b = 0; b < B; ++b) r.tokens[size_t(b)].push_back(argmax(step.data() + b * V));
    }
    return r;
}

float max_diff(const Trace& a, const Trace& b) {
    float m = 0;
    for (size_t i = 0; i < a.logits.size() && i < b.logits.size(); ++i) m = std::max(m, max_abs_diff(a.logits[i], b.logits[i]));
    return a.logits.size() == b.logits.size() ? m : INFINITY;
}

// max_diff passes over NaN: the quantized paths check this too.
bool all_finite(const Trace& t) {
    for (const auto& l : t.logits)
        for (float v : l)
            if (!std::isfinite(v)) return false;
    return true;
}

float max_abs(const Trace& a) {
    float m = 0;
    for (const auto& l : a.logits)
        for (float v : l) m = std::max(m, std::fabs(v));
    return m;
}

struct Case {
    const char* name;
    Arch arch;
    DType dtype;
    bool yarn = false;  // YaRN rope scaling: its frequencies and attention factor on both engines
};

const Case kCases[] = {
    {"llama_f32", Arch::Llama, DType::F32},
    {"mistral_f16", Arch::Mistral, DType::F16},
    {"qwen2_f32", Arch::Qwen2, DType::F32},
    {"qwen3_f32", Arch::Qwen3, DType::F32},
    {"qwen3_bf16", Arch::Qwen3, DType::BF16},
    {"qwen3_yarn_f32", Arch::Qwen3, DType::F32, true},
};

// gtest prints a parameter in test listings, and CTest's names keep it: the name, not the
// struct's bytes (a pointer among them changed from build to build).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class CudaVsCpu : public ::testing::TestWithParam<Case> {
protected:
    void SetUp() override {
        cfg_ = tiny_config(GetParam().arch);
        if (GetParam().yarn) {
            cfg_.rope_theta = 1000;
            cfg_.rope.kind = RopeScaling::Kind::Yarn;
            cfg_.rope.factor = 4;
            cfg_.rope.original_max_position = 1024;
            cfg_.rope.attention_factor = 1.5f;
        }
        write_synthetic_checkpoint(dir_.path(), cfg_, {GetParam().dtype, 1, 23});
        // Three sequences of different lengths: variable lengths in one decode batch.
        prompts_ = {make_prompt(11, cfg_.vocab, 1), make_prompt(3, cfg_.vocab, 2), make_prompt(29, cfg_.vocab, 3)};
    }
    float tolerance() const { return GetParam().dtype == DType::BF16 ? 1e-2f : 2e-3f; }
    // The GPU's logits of each step within the tolerance (INT8 KV: 2%) of the CPU's largest logit.
    void expect_steps_close(const std::vector<std::vector<float>>& cpu, const std::vector<std::vector<float>>& gpu,
                            KVFormat kv) const {
        float scale = 1.0f;
        for (const auto& l : cpu)
            for (float v : l) scale = std::max(scale, std::fabs(v));
        const float tol = (kv == KVFormat::Int8 ? 2e-2f : tolerance()) * scale;
        ASSERT_EQ(cpu.size(), gpu.size());
        for (size_t i = 0; i < cpu.size(); ++i)
            EXPECT_LT(max_abs_diff(cpu[i], gpu[i]), tol) << "kv " << int(kv) << " step " << i;
    }
    TempDir dir_;
    ModelConfig cfg_;
    std::vector<std::vector<int32_t>> prompts_;
};

}  // namespace

TEST_P(CudaVsCpu, SameLogitsAndGreedyTokens) {
    SKIP_WITHOUT_GPU();
    RunOptions cpu, gpu;
    gpu.device = Device::Cuda;
    const Trace a = trace(dir_.path(), prompts_, cpu), b = trace(dir_.path(), prompts_, gpu);
    // Same weights and FP32 activations on both: only summation order differs, except that the
    // cuBLAS prefill of 16-bit weights rounds its inputs to the weights' type (bf16: 8 bits).
    EXPECT_LT(max_diff(a, b), tolerance() * std::max(1.0f, max_abs(a)));
    EXPECT_EQ(a.tokens, b.tokens);
}

TEST_P(CudaVsCpu, ChunkedPrefillAndNaiveAttentionAgree) {
    SKIP_WITHOUT_GPU();
    RunOptions one, chunked, naive;
    one.device = chunked.device = naive.device = Device::Cuda;
    chunked.prefill_chunk = 4;  // chunks that attend to a cached prefix, and some n <= 8 (GEMV path)
    naive.attention = AttentionImpl::Naive;
    const Trace a = trace(dir_.path(), prompts_, one), b = trace(dir_.path(), prompts_, chunked),
              c = trace(dir_.path(), prompts_, naive);
    EXPECT_LT(max_diff(a, b), tolerance() * std::max(1.0f, max_abs(a)));
    EXPECT_LT(max_diff(a, c), tolerance() * std::max(1.0f, max_abs(a)));
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.tokens, c.tokens);
}

TEST_P(CudaVsCpu, GraphsReplayExactlyWhatEagerRuns) {
    SKIP_WITHOUT_GPU();
    RunOptions graphs, eager;
    graphs.device = eager.device = Device::Cuda;
    eager.graphs = false;
    const Trace a = trace(dir_.path(), prompts_, graphs), b = trace(dir_.path(), prompts_, eager);
    // The same kernels with the same launch shapes: bit for bit.
    EXPECT_EQ(max_diff(a, b), 0.0f);
    EXPECT_EQ(a.tokens, b.tokens);
}

TEST_P(CudaVsCpu, Int8WeightsAndCacheMatchTheCpuInt8) {
    SKIP_WITHOUT_GPU();
    for (KVFormat kv : {KVFormat::F16, KVFormat::Int8}) {
        RunOptions cpu, gpu;
        cpu.weights = gpu.weights = WeightFormat::Int8;
        cpu.kv = gpu.kv = kv;
        gpu.device = Device::Cuda;
        const Trace a = trace(dir_.path(), prompts_, cpu), b = trace(dir_.path(), prompts_, gpu);
        // The same INT8 weights and cache format on both sides; an INT8 cache row may round a tie
        // the other way, so the bound is looser than for float caches.
        EXPECT_LT(max_diff(a, b), (kv == KVFormat::Int8 ? 2e-2f : 2e-3f) * std::max(1.0f, max_abs(a)))
            << "kv " << int(kv);
    }
}

TEST_P(CudaVsCpu, W8A8MatchesTheCpuW8A8) {
    SKIP_WITHOUT_GPU();
    RunOptions cpu, gpu, chunked;
    cpu.weights = gpu.weights = chunked.weights = WeightFormat::W8A8;
    gpu.device = chunked.device = Device::Cuda;
    chunked.prefill_chunk = 4;  // prefill chunks through the W8A8 GEMV as well as the INT8 GEMM
    const Trace a = trace(dir_.path(), prompts_, cpu), b = trace(dir_.path(), prompts_, gpu),
                c = trace(dir_.path(), prompts_, chunked);
    // The same quantized activations and INT32 dot products on both sides; only the f32 scaling
    // and summation order differ, but a quantization step of a later layer's input may round the
    // other way, hence the INT8 bound.
    EXPECT_LT(max_diff(a, b), 2e-2f * std::max(1.0f, max_abs(a)));
    EXPECT_LT(max_diff(a, c), 2e-2f * std::max(1.0f, max_abs(a)));
}

namespace {

// The CUDA engine's INT4 (W4A16) logits against the CPU's on the same quantized weights (groups of
// `group`, `keep` kept 16-bit): prefill through cuBLAS, and in chunks of 4 through the INT4 GEMV.
// Bounds: the cuBLAS prefill rounds x and the dequantized weights to f16 (2e-3 of the largest
// logit; 1e-2 with a kept BF16 down_proj, whose input rounds to bf16); the CPU's INT4 products of
// 3-16 tokens may round activations to int16 (cpu_quantized_weights_round: 1.0e-4 to 1.6e-4 of
// the largest logit on the emulator, EPYC), else only the f32 summation order differs.
void expect_int4_matches_cpu(const std::string& dir, const std::vector<std::vector<int32_t>>& prompts, int64_t group,
                             const std::string& keep) {
    RunOptions cpu, gpu, chunked;
    cpu.weights = gpu.weights = chunked.weights = WeightFormat::Int4;
    cpu.group = gpu.group = chunked.group = group;
    cpu.keep_fp16 = gpu.keep_fp16 = chunked.keep_fp16 = keep;
    gpu.device = chunked.device = Device::Cuda;
    chunked.prefill_chunk = 4;  // every prefill chunk through the INT4 GEMV
    const Trace a = trace(dir, prompts, cpu), b = trace(dir, prompts, gpu), c = trace(dir, prompts, chunked);
    ASSERT_TRUE(all_finite(b) && all_finite(c));
    const float scale = std::max(1.0f, max_abs(a));
    EXPECT_LT(max_diff(a, b), (keep.empty() ? 2e-3f : 1e-2f) * scale);
    EXPECT_LT(max_diff(a, c), (cpu_quantized_weights_round() ? 5e-4f : 1e-4f) * scale);
    EXPECT_EQ(a.tokens, c.tokens);
}

}  // namespace

// INT4 layers (W4A16) and the INT8 lm_head against the CPU's int4 engine, on the same quantized
// weights: groups of 32 (the tiny models' 160 intermediate columns allow no larger), the stacked
// q/k/v and gate/up matrices (the SwiGLU GEMV epilogue in decode), prefill through the f16
// dequantization and cuBLAS or (chunks of 4) the GEMV, and with down_proj kept 16-bit beside INT4
// neighbours. The cuBLAS prefill rounds x and the dequantized weights to f16 (and down's input to
// bf16 when down is kept: BF16 from an FP32 checkpoint), hence the 16-bit bounds; with the GEMV
// alone only the f32 summation order differs (measured 1.2e-5 of logits up to 20). Every logit
// must be finite: max_diff passes over NaN.
TEST_P(CudaVsCpu, Int4WeightsMatchTheCpuInt4) {
    SKIP_WITHOUT_GPU();
    for (const std::string keep : {"", "down_proj"}) {
        SCOPED_TRACE("int4 group 32, keep '" + keep + "'");
        expect_int4_matches_cpu(dir_.path(), prompts_, 32, keep);
        if (HasFatalFailure()) return;
    }
}

// W4A8 against the CPU's W4A8 on the same quantized weights and activations: groups of 32 (the
// tiny models allow no larger), decode through gemv_w4a8_cuda, prefill through the FP16 product
// of the dequantized activations and codes (w4a8.h) or (chunks of 4) the GEMV, and with down_proj
// kept 16-bit beside INT4 neighbours. The GEMV's integer sums are exact, the prefill's products
// are rounded to f16 factors; the f32 scaling and summation orders differ, and a later layer's
// quantization step may round the other way: the INT8 bound.
TEST_P(CudaVsCpu, W4A8MatchesTheCpuW4A8) {
    SKIP_WITHOUT_GPU();
    for (const std::string keep : {"", "down_proj"}) {
        SCOPED_TRACE("w4a8 group 32, keep '" + keep + "'");
        RunOptions cpu, gpu, chunked;
        cpu.weights = gpu.weights = chunked.weights = WeightFormat::W4A8;
        cpu.group = gpu.group = chunked.group = 32;
        cpu.keep_fp16 = gpu.keep_fp16 = chunked.keep_fp16 = keep;
        gpu.device = chunked.device = Device::Cuda;
        chunked.prefill_chunk = 4;
        const Trace a = trace(dir_.path(), prompts_, cpu), b = trace(dir_.path(), prompts_, gpu),
                    c = trace(dir_.path(), prompts_, chunked);
        ASSERT_TRUE(all_finite(b) && all_finite(c));
        const float scale = std::max(1.0f, max_abs(a));
        EXPECT_LT(max_diff(a, b), 2e-2f * scale);
        EXPECT_LT(max_diff(a, c), 2e-2f * scale);
    }
}

// A context shift (Engine::shift_kv, kernels/cuda/kv_shift.cu) on every layer of the GPU cache
// against the CPU engine's: the decode steps after it give the CPU's logits (keys turned back,
// values moved, in each layer; the CPU's own shift is checked in closed form by KVShift.* and by
// EngineInvariants.ContextShiftEqualsPrefillOfTheKeptTokens).
TEST_P(CudaVsCpu, ContextShiftMatchesTheCpuShift) {
    SKIP_WITHOUT_GPU();
    const int64_t ctx = 24, V = cfg_.vocab, keep = 4, discard = 9;
    const auto seq = make_prompt(ctx + 3, V, 21);
    for (const KVFormat kv : {KVFormat::F32, KVFormat::Int8}) {
        std::vector<std::vector<float>> out[2];
        for (int gpu = 0; gpu < 2; ++gpu) {
            SessionOptions so;
            so.model_dir = dir_.path();
            so.ctx = ctx;
            so.kv = kv;
            so.device = gpu ? Device::Cuda : Device::Cpu;
            SingleRank comm;
            auto s = open_session(so, comm);
            std::vector<float> lg(static_cast<size_t>(V));
            s->engine->forward({{0, seq.data(), ctx, 0, false}}, lg.data());
            s->engine->shift_kv(0, keep, discard, ctx);
            for (int64_t i = 0; i < 3; ++i) {  // decode steps (graphs on the GPU) after the shift
                s->engine->forward({{0, &seq[size_t(ctx + i)], 1, ctx - discard + i, true}}, lg.data());
                out[gpu].push_back(lg);
            }
        }
        expect_steps_close(out[0], out[1], kv);
    }
}

// Engine::copy_kv (prefix sharing): a prefix prefilled in slot 0 is copied into slot 1, whose
// sequence goes on from it (a prompt chunk, then decode steps, graphs on the GPU). The logits are
// the CPU engine's, so the device copy moved the rows (and INT8 scales) the CPU copy moved.
TEST_P(CudaVsCpu, CopiedPrefixMatchesTheCpuCopy) {
    SKIP_WITHOUT_GPU();
    const int64_t V = cfg_.vocab, shared = 17;
    const auto first = make_prompt(23, V, 31), tail = make_prompt(8, V, 32);
    for (const KVFormat kv : {KVFormat::F32, KVFormat::Int8}) {
        std::vector<std::vector<float>> out[2];
        for (int gpu = 0; gpu < 2; ++gpu) {
            SessionOptions so;
            so.model_dir = dir_.path();
            so.ctx = 48;
            so.max_batch = 2;
            so.kv = kv;
            so.device = gpu ? Device::Cuda : Device::Cpu;
            SingleRank comm;
            auto s = open_session(so, comm);
            std::vector<float> lg(static_cast<size_t>(V));
            s->engine->forward({{0, first.data(), int64_t(first.size()), 0, false}}, lg.data());
            s->engine->copy_kv(0, 1, shared);
            s->engine->forward({{1, tail.data(), 5, shared, true}}, lg.data());
            out[gpu].push_back(lg);
            for (int64_t i = 5; i < 8; ++i) {
                s->engine->forward({{1, &tail[size_t(i)], 1, shared + i, true}}, lg.data());
                out[gpu].push_back(lg);
            }
            EXPECT_THROW(s->engine->copy_kv(1, 1, 4), Error);
            EXPECT_THROW(s->engine->copy_kv(0, 1, 49), Error);
        }
        expect_steps_close(out[0], out[1], kv);
    }
}

// Engine::save_kv / load_kv (the prefix cache's host tier) on the GPU: the first 17 positions of a
// 23-position copy of slot 0, loaded into slot 1, whose sequence goes on from them, give the CPU
// engine's logits for the same, so the 2D copies moved each head's rows (and INT8 scales) both
// ways at the copy's pitch. The copy takes the CPU's bytes per position, and slot 1 saved again
// is the bytes of a 17-position copy of slot 0.
TEST_P(CudaVsCpu, HostCopyOfAPrefixMatchesTheCpu) {
    SKIP_WITHOUT_GPU();
    const int64_t V = cfg_.vocab, shared = 17;
    const auto first = make_prompt(23, V, 33), tail = make_prompt(8, V, 34);
    for (const KVFormat kv : {KVFormat::F32, KVFormat::Int8}) {
        std::vector<std::vector<float>> out[2];
        size_t per[2] = {0, 0};
        for (int gpu = 0; gpu < 2; ++gpu) {
            SessionOptions so;
            so.model_dir = dir_.path();
            so.ctx = 48;
            so.max_batch = 2;
            so.kv = kv;
            so.device = gpu ? Device::Cuda : Device::Cpu;
            SingleRank comm;
            auto s = open_session(so, comm);
            Engine& e = *s->engine;
            per[gpu] = e.kv_position_bytes();
            std::vector<float> lg(static_cast<size_t>(V));
            e.forward({{0, first.data(), int64_t(first.size()), 0, false}}, lg.data());
            // A longer copy, of which the load takes the first `shared` positions (each head's rows
            // 23 apart on the host).
            std::vector<uint8_t> longer(first.size() * per[gpu]), saved(size_t(shared) * per[gpu]), again(saved.size());
            e.save_kv(0, int64_t(first.size()), longer.data());
            e.save_kv(0, shared, saved.data());
            e.load_kv(1, shared, longer.data(), int64_t(first.size()));
            e.forward({{1, tail.data(), 5, shared, true}}, lg.data());
            out[gpu].push_back(lg);
            for (int64_t i = 5; i < 8; ++i) {
                e.forward({{1, &tail[size_t(i)], 1, shared + i, true}}, lg.data());
                out[gpu].push_back(lg);
            }
            e.save_kv(1, shared, again.data());
            EXPECT_TRUE(again == saved) << (gpu ? "gpu" : "cpu");
            EXPECT_THROW(e.save_kv(2, 4, again.data()), Error);
            EXPECT_THROW(e.load_kv(1, 49, saved.data(), 49), Error);
            EXPECT_THROW(e.load_kv(1, shared + 1, saved.data(), shared), Error);
        }
        EXPECT_EQ(per[0], per[1]);
        expect_steps_close(out[0], out[1], kv);
    }
}

// Speculative verify steps (a few tokens per sequence, a logits row for each) are replayed from
// graphs keyed by the step's shape: a shape seen again replays whatever its tokens, positions and
// chunk lengths, bit for bit what eager runs give, and within the tolerance of the CPU's.
TEST_P(CudaVsCpu, VerifyStepsReplayExactlyWhatEagerRuns) {
    SKIP_WITHOUT_GPU();
    const int64_t V = cfg_.vocab, max_rows = 18;
    const auto text = make_prompt(64, V, 41);
    // Per step, each sequence's chunk length (0: not in the step); the all_logits chunks are the
    // verify rows. Steps 0-3 share one shape (7 tokens, 3 chunks, longest 3, 7 rows; step 2 with
    // other chunk lengths), as do steps 4, 5, 6 and 8 (18 tokens, 2 chunks, longest 16). Step 7
    // differs from those in its longest chunk alone, which changes the prefill attention's grid
    // (17 tokens of 2 query heads each: two 32-row tiles); it runs once, eagerly.
    const std::vector<std::vector<int64_t>> steps = {{3, 1, 3},  {3, 1, 3},  {1, 3, 3},  {3, 1, 3}, {16, 2, 0},
                                                     {16, 2, 0}, {2, 16, 0}, {17, 1, 0}, {16, 2, 0}};
    for (const KVFormat kv : {KVFormat::F32, KVFormat::Int8}) {
        std::vector<std::vector<float>> out[3];  // CPU, CUDA with graphs, CUDA eager
        for (int run = 0; run < 3; ++run) {
            SessionOptions so;
            so.model_dir = dir_.path();
            so.ctx = 96;
            so.max_batch = 3;
            so.max_logit_rows = max_rows;
            so.kv = kv;
            so.device = run ? Device::Cuda : Device::Cpu;
            so.cuda_graphs = run == 1;
            SingleRank comm;
            auto s = open_session(so, comm);
            Engine& e = *s->engine;
            std::vector<int64_t> len(prompts_.size());
            std::vector<float> lg(static_cast<size_t>(max_rows * V));
            for (size_t b = 0; b < prompts_.size(); ++b) {
                e.forward({{int64_t(b), prompts_[b].data(), int64_t(prompts_[b].size()), 0, false}}, lg.data());
                len[b] = int64_t(prompts_[b].size());
            }
            for (const auto& step : steps) {
                std::vector<SeqChunk> ch;
                int64_t rows = 0;
                for (size_t b = 0; b < step.size(); ++b) {
                    if (step[b] == 0) continue;
                    SeqChunk c{int64_t(b), &text[size_t(len[b] % 32)], step[b], len[b], true};
                    c.all_logits = step[b] > 1;
                    rows += c.all_logits ? step[b] : 1;
                    ch.push_back(c);
                    len[b] += step[b];
                }
                e.forward(ch, lg.data());
                out[run].emplace_back(lg.begin(), lg.begin() + rows * V);
            }
            if (run == 1) {
                const auto* cuda = dynamic_cast<const CudaEngine*>(&e);
                ASSERT_NE(cuda, nullptr);
                EXPECT_EQ(cuda->graphs_captured(), 2u);  // the shapes of steps 0 and 4, from their second steps on
            }
        }
        expect_steps_close(out[0], out[1], kv);
        ASSERT_EQ(out[1].size(), out[2].size());
        for (size_t i = 0; i < out[1].size(); ++i)
            EXPECT_EQ(max_abs_diff(out[1][i], out[2][i]), 0.0f) << "kv " << int(kv) << " step " << i;
    }
}

INSTANTIATE_TEST_SUITE_P(Archs, CudaVsCpu, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// INT4 with AWQ's 128-column groups on a Qwen3 whose every matrix has a multiple of 128 columns
// (hidden 128, intermediate 256): the CUDA engine stores them in the GEMV's interleaved order
// (interleave.h, 128-column blocks), decode reads it and the cuBLAS prefill dequantizes it with x
// converted into it. The tiny models' 160 intermediate columns keep the natural order (above).
TEST(CudaEngine, InterleavedInt4MatchesTheCpuInt4) {
    SKIP_WITHOUT_GPU();
    ModelConfig cfg = tiny_config(Arch::Qwen3);
    cfg.hidden = 128;
    cfg.intermediate = 256;
    TempDir dir;
    write_synthetic_checkpoint(dir.path(), cfg, {DType::F32, 1, 29});
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(11, cfg.vocab, 1), make_prompt(3, cfg.vocab, 2),
                                                       make_prompt(29, cfg.vocab, 3)};
    expect_int4_matches_cpu(dir.path(), prompts, 128, "");
}

namespace {
// A tiny FP32 Llama written into `dir`, and CUDA session options for it.
SessionOptions tiny_cuda_model(const TempDir& dir, const ModelConfig& cfg) {
    write_synthetic_checkpoint(dir.path(), cfg, {DType::F32, 1, 5});
    SessionOptions so;
    so.model_dir = dir.path();
    so.device = Device::Cuda;
    return so;
}
}  // namespace

// Act-order checkpoints (GPTQ 4 and 8 bits, compressed-tensors W8A8; tests/hf_quant_writer.h):
// each layer's input gathered into its columns' order (kernels/cuda/gather.h), as the CPU engine
// does. q/k/v and gate/up share one order as GPTQ writes them (stacked matrices, one gather), or
// each has its own (orders_apart: the projections run apart, each gathering). Prefill through
// cuBLAS and (chunks of 4) through the GEMVs; graphs replay what eager steps run.
TEST(CudaEngine, ActOrderCheckpointsMatchTheCpu) {
    SKIP_WITHOUT_GPU();
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(11, cfg.vocab, 1), make_prompt(3, cfg.vocab, 2),
                                                       make_prompt(29, cfg.vocab, 3)};
    for (const HfQuantCase& cs : {HfQuantCase{"gptq", 4, 32, "gptq", false, true},
                                  HfQuantCase{"gptq", 4, 32, "gptq", false, true, true},
                                  HfQuantCase{"gptq", 8, 32, "gptq", false, true}, HfQuantCase{"ct", 8, 32, "", true, true}}) {
        SCOPED_TRACE(cs.name());
        TempDir hf, ref;
        write_pair(cfg, cs, hf.path(), ref.path(), 61);
        RunOptions cpu, gpu, chunked, eager;
        gpu.device = chunked.device = eager.device = Device::Cuda;
        chunked.prefill_chunk = 4;
        eager.graphs = false;
        const Trace a = trace(hf.path(), prompts, cpu), b = trace(hf.path(), prompts, gpu),
                    c = trace(hf.path(), prompts, chunked), d = trace(hf.path(), prompts, eager);
        ASSERT_TRUE(all_finite(b) && all_finite(c));
        const float scale = std::max(1.0f, max_abs(a));
        // The bounds of the formats' own tests: cuBLAS prefill rounds to f16 (Int4WeightsMatchTheCpuInt4),
        // INT8 activations may round a step the other way (W8A8MatchesTheCpuW8A8).
        EXPECT_LT(max_diff(a, b), (cs.acts ? 2e-2f : 2e-3f) * scale);
        EXPECT_LT(max_diff(a, c), (cs.acts ? 2e-2f : cpu_quantized_weights_round() ? 5e-4f : 1e-4f) * scale);
        if (!cs.acts) {
            EXPECT_EQ(a.tokens, c.tokens);
        }
        EXPECT_EQ(max_diff(b, d), 0.0f);  // the same kernels with the same launch shapes
    }
}

TEST(CudaEngine, RefusesWhatItCannotRun) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    SessionOptions so = tiny_cuda_model(dir, cfg);
    so.ctx = 16;
    so.max_batch = 2;
    SingleRank comm;
    auto s = open_session(so, comm);
    std::vector<float> lg(static_cast<size_t>(3 * cfg.vocab));
    const int32_t t[3] = {3, 4, 5};
    // Three sequences on two slots, and positions past the cache.
    EXPECT_THROW(s->engine->forward({{0, t, 1, 0, true}, {1, t + 1, 1, 0, true}, {1, t + 2, 1, 1, true}}, lg.data()),
                 Error);
    EXPECT_THROW(s->engine->forward({{0, t, 3, 15, true}}, lg.data()), Error);
}

TEST(CudaEngine, TooLargeForTheDeviceSaysHowMuch) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    SessionOptions so = tiny_cuda_model(dir, cfg);
    so.ctx = cfg.max_position;
    so.max_batch = 100000;  // a KV cache of terabytes
    SingleRank comm;
    try {
        open_session(so, comm);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("GiB are free"), std::string::npos) << e.what();
        // The flags behind the KV cache and the step size, by name.
        EXPECT_NE(std::string(e.what()).find("for --ctx " + std::to_string(cfg.max_position) + " x batch 100000"),
                  std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("tokens from --prefill-chunk 256)"), std::string::npos) << e.what();
    }
    // A derived context is named by the flags it came from.
    so.ctx_origin = "--prompt-len 100 + --gen 28";  // (the same ctx as above: the origin is only named)
    try {
        open_session(so, comm);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("for --prompt-len 100 + --gen 28 x batch 100000"), std::string::npos)
            << e.what();
    }
}

TEST(CudaEngine, BatchesAboveTheGemvBucketsRunCublasInsideTheGraph) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(dir.path(), cfg, {DType::F32, 1, 9});
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 11; ++i) prompts.push_back(make_prompt(2 + i, cfg.vocab, 40 + uint64_t(i)));
    RunOptions cpu, gpu;
    gpu.device = Device::Cuda;
    const Trace a = trace(dir.path(), prompts, cpu), b = trace(dir.path(), prompts, gpu);
    EXPECT_LT(max_diff(a, b), 2e-3f * std::max(1.0f, max_abs(a)));
    EXPECT_EQ(a.tokens, b.tokens);
}

namespace {

// Every logit of a prefill of two prompts (5 and 3 tokens unless told), four decode steps of both (eager,
// captured, replayed, replayed), then four of the first alone (one-token steps, likewise), through a
// fresh session of `so`.
std::vector<float> two_sequence_logits(const SessionOptions& so, int64_t V, int64_t len0 = 5, int64_t len1 = 3) {
    const std::vector<int32_t> p0 = make_prompt(len0, V, 81), p1 = make_prompt(len1, V, 82);
    SingleRank comm;
    auto s = open_session(so, comm);
    Engine& e = *s->engine;
    std::vector<float> all, step(size_t(2 * V));
    e.forward({{0, p0.data(), int64_t(p0.size()), 0, true}, {1, p1.data(), int64_t(p1.size()), 0, true}},
              step.data());
    all.insert(all.end(), step.begin(), step.end());
    for (int64_t t = 0; t < 4; ++t) {
        const int32_t a = int32_t((7 * t + 1) % V), b = int32_t((5 * t + 2) % V);
        e.forward({{0, &a, 1, int64_t(p0.size()) + t, true}, {1, &b, 1, int64_t(p1.size()) + t, true}}, step.data());
        all.insert(all.end(), step.begin(), step.end());
    }
    for (int64_t t = 4; t < 8; ++t) {
        const int32_t a = int32_t((3 * t + 5) % V);
        e.forward({{0, &a, 1, int64_t(p0.size()) + t, true}}, step.data());
        all.insert(all.end(), step.begin(), step.begin() + V);
    }
    return all;
}

}  // namespace

namespace {

// A tuning switch of SessionOptions (0: off, 1: on) that must change no result: the logits of
// two_sequence_logits with it off and on, bit for bit; and a value out of range refused.
void expect_switch_changes_no_logits(SessionOptions so, int SessionOptions::*sw, int64_t V, const std::string& what,
                                     int64_t len0 = 5, int64_t len1 = 3) {
    so.*sw = 0;
    const std::vector<float> off = two_sequence_logits(so, V, len0, len1);
    so.*sw = 1;
    const std::vector<float> on = two_sequence_logits(so, V, len0, len1);
    EXPECT_EQ(std::memcmp(off.data(), on.data(), off.size() * 4), 0) << what;
    so.*sw = 2;
    SingleRank comm;
    EXPECT_THROW(open_session(so, comm), Error) << what;
}

}  // namespace

// The RoPE prologue inside the decode attention kernel (EngineOptions::fused_rope) computes what
// rope_kv_cuda does: the same logits bit for bit, for Qwen3 (q/k norm) and Llama (plain RoPE),
// with a float and an INT8 cache, eager and replayed from graphs.
TEST(CudaEngine, FusedRopeChangesNoLogits) {
    SKIP_WITHOUT_GPU();
    for (const Arch arch : {Arch::Qwen3, Arch::Llama})
        for (const KVFormat kv : {KVFormat::F32, KVFormat::Int8}) {
            TempDir dir;
            const ModelConfig cfg = tiny_config(arch);
            SessionOptions so = tiny_cuda_model(dir, cfg);
            so.ctx = 32;
            so.max_batch = 2;
            so.kv = kv;
            expect_switch_changes_no_logits(so, &SessionOptions::fused_rope, cfg.vocab,
                                            std::string(arch_name(arch)) + (kv == KVFormat::Int8 ? " int8" : " f32"));
        }
}

// The norms and residual adds folded into the decode GEMVs (EngineOptions::fused_norm: TP=1,
// one-token steps) change the logits by f32 rounding only: 1 / rms scales each product's sums
// instead of its inputs. Llama (separate gate/up and q/k/v products) and Qwen3 (fused), float and
// INT8 weights; two_sequence_logits ends with four one-sequence steps, eager and from graphs.
TEST(CudaEngine, FusedNormMatchesSeparateNormKernels) {
    SKIP_WITHOUT_GPU();
    for (const Arch arch : {Arch::Qwen3, Arch::Llama})
        for (const WeightFormat wf : {WeightFormat::Auto, WeightFormat::Int8}) {
            TempDir dir;
            const ModelConfig cfg = tiny_config(arch);
            SessionOptions so = tiny_cuda_model(dir, cfg);
            so.ctx = 32;
            so.max_batch = 2;
            so.load.format = wf;
            const std::string what = std::string(arch_name(arch)) + (wf == WeightFormat::Int8 ? " int8" : " f32");
            so.fused_norm = 0;
            const std::vector<float> off = two_sequence_logits(so, cfg.vocab);
            so.fused_norm = 1;
            const std::vector<float> on = two_sequence_logits(so, cfg.vocab);
            ASSERT_EQ(off.size(), on.size());
            float scale = 1.0f, diff = 0.0f;
            for (size_t i = 0; i < on.size(); ++i) {
                scale = std::max(scale, std::fabs(off[i]));
                diff = std::max(diff, std::fabs(on[i] - off[i]));
            }
            EXPECT_LT(diff, 1e-4f * scale) << what;
            EXPECT_GT(diff, 0.0f) << what << ": the switch changed nothing (is the fused path taken?)";
            // Bench rows name the GEMVs from the engine's own rule (Engine::gemv_kernels): "+norm"
            // in one-token steps only, and never with the switch off.
            SingleRank comm;
            for (const int fused : {0, 1}) {
                so.fused_norm = fused;
                const std::unique_ptr<Session> s = open_session(so, comm);
                EXPECT_EQ(s->engine->gemv_kernels(1).find("+norm") != std::string::npos, fused == 1) << what;
                EXPECT_EQ(s->engine->gemv_kernels(2).find("+norm"), std::string::npos) << what;
            }
            so.fused_norm = 2;
            EXPECT_THROW(open_session(so, comm), Error) << what;
        }
}

// INT8 prefill products with each matrix dequantized ahead on a side stream
// (EngineOptions::gemm_staging) give the same logits bit for bit as dequantizing each just before
// its product: a 22-token prefill (cuBLAS) of Llama (separate gate/up) and Qwen3, then decode.
TEST(CudaEngine, Int8GemmStagingChangesNoLogits) {
    SKIP_WITHOUT_GPU();
    for (const Arch arch : {Arch::Qwen3, Arch::Llama}) {
        TempDir dir;
        const ModelConfig cfg = tiny_config(arch);
        SessionOptions so = tiny_cuda_model(dir, cfg);
        so.ctx = 48;
        so.max_batch = 2;
        so.load.format = WeightFormat::Int8;
        expect_switch_changes_no_logits(so, &SessionOptions::gemm_staging, cfg.vocab, arch_name(arch), 13, 9);
    }
}

namespace {

// Step t of a batch: the whole prompts at t = 0, then one token per sequence (tok[b]) at the
// position after the last.
std::vector<SeqChunk> step_chunks(const std::vector<std::vector<int32_t>>& prompts, const std::vector<int32_t>& tok,
                                  int64_t t) {
    std::vector<SeqChunk> ch;
    for (size_t b = 0; b < prompts.size(); ++b) {
        const auto& p = prompts[b];
        if (t == 0) ch.push_back({int64_t(b), p.data(), int64_t(p.size()), 0, true});
        else ch.push_back({int64_t(b), &tok[b], 1, int64_t(p.size()) + t - 1, true});
    }
    return ch;
}

// A tiny Qwen3 on the GPU with three slots of 32 positions.
struct ThreeSlots {
    TempDir dir;
    ModelConfig cfg = tiny_config(Arch::Qwen3);
    SingleRank comm;
    std::unique_ptr<Session> s;
    explicit ThreeSlots(int64_t max_penalties = 0) {
        SessionOptions so = tiny_cuda_model(dir, cfg);
        so.ctx = 32;
        so.max_batch = 3;
        so.max_penalties = max_penalties;
        s = open_session(so, comm);
    }
    std::vector<std::vector<int32_t>> prompts(int64_t len0, int64_t step, uint64_t seed) const {
        std::vector<std::vector<int32_t>> p;
        for (int64_t b = 0; b < 3; ++b) p.push_back(make_prompt(len0 + step * b, cfg.vocab, seed + uint64_t(b)));
        return p;
    }
};

}  // namespace

TEST(CudaEngine, TopCandidatesAreTheRankedLogits) {
    SKIP_WITHOUT_GPU();
    ThreeSlots m;
    Engine& e = *m.s->engine;
    const int64_t V = m.cfg.vocab, B = 3;
    const std::vector<std::vector<int32_t>> prompts = m.prompts(5, 3, 70);
    std::vector<float> logits(size_t(B * V)), vals(size_t(B * V));
    std::vector<int32_t> ids(size_t(B * V));
    // Each step runs twice on the same positions (the cache rows are rewritten with the same
    // values): once for the full logits, once for the candidates, prefill and decode (eager,
    // captured and replayed graphs), k from greedy to the whole vocabulary.
    const int64_t ks[] = {1, 2, 40, std::min<int64_t>(V, kMaxTopCandidates)};
    for (int64_t t = 0; t < 5; ++t) {
        std::vector<int32_t> tok(static_cast<size_t>(B));
        for (int64_t b = 0; b < B; ++b) tok[size_t(b)] = int32_t((t * 13 + b) % V);
        const std::vector<SeqChunk> ch = step_chunks(prompts, tok, t);
        const int64_t k = ks[size_t(t) % 4];
        e.forward(ch, logits.data());
        e.forward_top(ch, k, vals.data(), ids.data());
        for (int64_t b = 0; b < B; ++b) {
            std::vector<float> want_v(static_cast<size_t>(k));
            std::vector<int32_t> want_i(static_cast<size_t>(k));
            topk_ref(logits.data() + b * V, V, k, want_v.data(), want_i.data());
            for (int64_t j = 0; j < k; ++j) {
                ASSERT_EQ(ids[size_t(b * k + j)], want_i[size_t(j)]) << "step " << t << " row " << b << " k " << k << " #" << j;
                ASSERT_EQ(vals[size_t(b * k + j)], want_v[size_t(j)]) << "step " << t << " row " << b << " #" << j;
            }
        }
    }
    EXPECT_THROW(e.forward_top({{0, prompts[0].data(), 1, 0, true}}, 0, vals.data(), ids.data()), Error);
}

// Top-p without a top-k limit from the GPU's candidates and row mass (forward_nucleus): the same
// tokens as sampling the whole rows (forward + Sampler::sample), prefill and decode (eager,
// captured, replayed), with all candidates and with only two (the nucleus then reaches past them
// and nucleus_row hands over the row); each step runs twice on the same positions, as above.
TEST(CudaEngine, NucleusFromGpuCandidatesDrawsWhatTheRowsDraw) {
    SKIP_WITHOUT_GPU();
    ThreeSlots m;
    Engine& e = *m.s->engine;
    const int64_t V = m.cfg.vocab, B = 3;
    const std::vector<std::vector<int32_t>> prompts = m.prompts(4, 2, 90);
    SamplerOptions sp;
    sp.temperature = 8.0f;  // the tiny model's rows are peaked: flatten them into wide nuclei
    sp.top_k = 0;
    sp.top_p = 0.9f;
    sp.seed = 11;
    std::vector<Sampler> rows, cands;
    for (int64_t b = 0; b < B; ++b) {
        rows.emplace_back(sp, uint64_t(b));
        cands.emplace_back(sp, uint64_t(b));
    }
    const size_t rows_v = size_t(B * V), n_v = size_t(V), n_b = size_t(B);
    std::vector<float> logits(rows_v), vals(rows_v), row(n_v);
    std::vector<int32_t> ids(rows_v), tok(n_b);
    std::vector<uint64_t> mass(n_b);
    int fell_back = 0, decided = 0;
    for (int64_t t = 0; t < 6; ++t) {
        const std::vector<SeqChunk> ch = step_chunks(prompts, tok, t);
        const int64_t k = t % 2 ? 2 : std::min<int64_t>(V, kMaxTopCandidates);
        e.forward(ch, logits.data());
        ASSERT_TRUE(e.forward_nucleus(ch, k, sp.temperature, vals.data(), ids.data(), mass.data()));
        for (int64_t b = 0; b < B; ++b) {
            const int32_t want = rows[size_t(b)].sample(logits.data() + b * V, V);
            int32_t got = cands[size_t(b)].sample_nucleus(vals.data() + b * k, ids.data() + b * k, k, mass[size_t(b)]);
            // With every token a candidate the nucleus is among them, if the mass is the row's.
            if (k == V) {
                ASSERT_GE(got, 0) << "step " << t << " row " << b << ": mass " << mass[size_t(b)];
            }
            if (got < 0) {
                ++fell_back;
                e.nucleus_row(b, row.data());
                ASSERT_EQ(0, std::memcmp(row.data(), logits.data() + b * V, size_t(V) * sizeof(float)));
                got = cands[size_t(b)].sample(row.data(), V);
            } else {
                ++decided;
            }
            ASSERT_EQ(got, want) << "step " << t << " row " << b << " k " << k;
            tok[size_t(b)] = got;
        }
    }
    EXPECT_GT(decided, 0);
    EXPECT_GT(fell_back, 0);
}

// Token penalties (SeqChunk::penalties) reach every way a step hands back its logits: forward()'s
// rows, forward_top()'s candidates and forward_nucleus()'s masses are those of the step's
// unpenalised rows penalised on the host by apply_penalties_ref, bit for bit, in prefill and in
// decode (eager, captured, replayed); a row without penalties is left as it was.
TEST(CudaEngine, PenaltiesReachEveryPath) {
    SKIP_WITHOUT_GPU();
    ThreeSlots m(12);
    Engine& e = *m.s->engine;
    const int64_t V = m.cfg.vocab, B = 3;
    const std::vector<std::vector<int32_t>> prompts = m.prompts(5, 2, 31);
    const size_t n_rows = size_t(B * V);
    std::vector<float> raw(n_rows), got(n_rows), vals(n_rows);
    std::vector<int32_t> ids(n_rows), tok(static_cast<size_t>(B));
    std::vector<uint64_t> mass(static_cast<size_t>(B));
    const float temperature = 4.0f;
    for (int64_t t = 0; t < 5; ++t) {
        for (int64_t b = 0; b < B; ++b) tok[size_t(b)] = int32_t((t * 17 + b * 5) % V);
        std::vector<SeqChunk> ch = step_chunks(prompts, tok, t);
        e.forward(ch, raw.data());
        // Penalise each row's three best tokens and a few others, both ways (repetition above
        // and below 1, offsets of both signs); row 1 goes without on odd steps.
        std::vector<std::vector<PenaltyEntry>> pen(static_cast<size_t>(B));
        std::vector<float> want = raw;
        for (int64_t b = 0; b < B; ++b) {
            if (b == 1 && t % 2) continue;
            std::vector<float> best(3);
            std::vector<int32_t> best_ids(3);
            topk_ref(raw.data() + b * V, V, 3, best.data(), best_ids.data());
            std::vector<int32_t> pick = best_ids;
            for (int32_t j = 0; int64_t(pick.size()) < 12; ++j) {
                const int32_t id = int32_t((t * 31 + b * 7 + j * 13) % V);
                if (std::find(pick.begin(), pick.end(), id) == pick.end()) pick.push_back(id);
            }
            for (size_t j = 0; j < pick.size(); ++j)
                pen[size_t(b)].push_back({0, pick[j], j % 2 ? 1.25f : 0.8f, 0.375f * float(j) - 1.0f});
            ch[size_t(b)].penalties = pen[size_t(b)].data();
            ch[size_t(b)].n_penalties = int64_t(pen[size_t(b)].size());
            apply_penalties_ref(want.data() + b * V, V, 0, pen[size_t(b)].data(), int64_t(pen[size_t(b)].size()));
        }
        ASSERT_NE(0, std::memcmp(raw.data(), want.data(), n_rows * sizeof(float)));
        e.forward(ch, got.data());
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), n_rows * sizeof(float))) << "forward, step " << t;
        const int64_t k = std::min<int64_t>(V, 40);
        e.forward_top(ch, k, vals.data(), ids.data());
        for (int64_t b = 0; b < B; ++b) {
            std::vector<float> want_v(static_cast<size_t>(k));
            std::vector<int32_t> want_i(static_cast<size_t>(k));
            topk_ref(want.data() + b * V, V, k, want_v.data(), want_i.data());
            for (int64_t j = 0; j < k; ++j) {
                ASSERT_EQ(ids[size_t(b * k + j)], want_i[size_t(j)]) << "forward_top, step " << t << " row " << b;
                ASSERT_EQ(vals[size_t(b * k + j)], want_v[size_t(j)]) << "forward_top, step " << t << " row " << b;
            }
        }
        ASSERT_TRUE(e.forward_nucleus(ch, k, temperature, vals.data(), ids.data(), mass.data()));
        for (int64_t b = 0; b < B; ++b) {
            const float* row = want.data() + b * V;
            const float mx = row[argmax(row, V)];
            uint64_t total = 0;
            for (int64_t j = 0; j < V; ++j) total += nucleus_weight(row[j], mx, temperature);
            ASSERT_EQ(mass[size_t(b)], total) << "forward_nucleus, step " << t << " row " << b;
        }
    }
}

// Sliding-window attention on the GPU against the CPU engine: Mistral slides on every layer (its
// cache a ring of window + chunk - 1 rows, which wraps with 4-token prefill chunks and in decode),
// Qwen2 from its second layer on (a cache of the whole context); FP32 caches (the FP32-pipe
// prefill), FP16 and INT8 (tensor-core prefill), the naive kernel, graphs on and off.
TEST(CudaEngine, SlidingWindowMatchesTheCpu) {
    SKIP_WITHOUT_GPU();
    struct Model { Arch arch; int64_t window, from; };
    for (const Model md : {Model{Arch::Mistral, 7, 0}, Model{Arch::Qwen2, 6, 1}}) {
        TempDir d;
        ModelConfig cfg = tiny_config(md.arch);
        cfg.sliding_window = md.window;
        cfg.window_from_layer = md.from;
        write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 31});
        const std::vector<std::vector<int32_t>> prompts = {make_prompt(11, cfg.vocab, 1), make_prompt(3, cfg.vocab, 2),
                                                           make_prompt(29, cfg.vocab, 3)};
        for (const KVFormat kv : {KVFormat::F32, KVFormat::F16, KVFormat::Int8})
            for (const int64_t chunk : {int64_t(256), int64_t(4)}) {
                RunOptions cpu, gpu, naive, eager;
                cpu.kv = gpu.kv = naive.kv = eager.kv = kv;
                cpu.prefill_chunk = gpu.prefill_chunk = naive.prefill_chunk = eager.prefill_chunk = chunk;
                gpu.device = naive.device = eager.device = Device::Cuda;
                naive.attention = AttentionImpl::Naive;
                eager.graphs = false;
                const Trace a = trace(d.path(), prompts, cpu), b = trace(d.path(), prompts, gpu),
                            c = trace(d.path(), prompts, naive), e = trace(d.path(), prompts, eager);
                const float tol = (kv == KVFormat::Int8 ? 2e-2f : 2e-3f) * std::max(1.0f, max_abs(a));
                const std::string what = std::string(arch_name(md.arch)) + " kv " + std::to_string(int(kv)) +
                                         " chunk " + std::to_string(chunk);
                EXPECT_LT(max_diff(a, b), tol) << what;
                EXPECT_LT(max_diff(a, c), tol) << what << " naive";
                EXPECT_EQ(max_diff(b, e), 0.0f) << what << " graphs off";
            }
    }
}

// bench --ablate's switch (CudaEngine::set_ablation): each kernel class left out changes the
// decode logits (so its kernels are the ones skipped), and with the mask cleared the same steps
// give the logits of an engine never ablated, bit for bit (the graphs of the mask are dropped;
// the cache rows the ablated steps wrote are written again before they are read). Batch 1 (the
// norms inside the GEMVs) and 2 (the norm kernels).
TEST(CudaEngine, AblationLeavesKernelClassesOutAndComesBack) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    SessionOptions so = tiny_cuda_model(dir, cfg);
    so.ctx = 32;
    so.max_batch = 2;
    const int64_t V = cfg.vocab;
    const std::vector<int32_t> p0 = make_prompt(5, V, 81), p1 = make_prompt(4, V, 82);
    SingleRank comm;
    auto s = open_session(so, comm);
    auto* e = dynamic_cast<CudaEngine*>(s->engine.get());
    ASSERT_NE(e, nullptr);
    std::vector<float> step(size_t(2 * V));
    e->forward({{0, p0.data(), 5, 0, true}, {1, p1.data(), 4, 0, true}}, step.data());
    // Four decode steps from the prompts' ends (eager, captured, replayed), batch 1 or 2.
    auto decode = [&](int64_t batch) {
        std::vector<float> all;
        for (int64_t t = 0; t < 4; ++t) {
            const int32_t a = int32_t((7 * t + 1) % V), b = int32_t((5 * t + 2) % V);
            std::vector<SeqChunk> ch = {{0, &a, 1, 5 + t, true}};
            if (batch == 2) ch.push_back({1, &b, 1, 4 + t, true});
            e->forward(ch, step.data());
            all.insert(all.end(), step.begin(), step.begin() + batch * V);
        }
        return all;
    };
    for (const int64_t batch : {1, 2}) {
        const std::vector<float> ref = decode(batch);
        for (const char* classes : {"qkv", "attention", "o", "mlp", "lm_head"}) {
            e->set_ablation(parse_ablation(classes, "test"));
            const std::vector<float> without = decode(batch);
            EXPECT_NE(std::memcmp(without.data(), ref.data(), ref.size() * 4), 0) << classes << " batch " << batch;
            e->set_ablation(0);
            const std::vector<float> back = decode(batch);
            EXPECT_EQ(std::memcmp(back.data(), ref.data(), ref.size() * 4), 0) << classes << " batch " << batch;
        }
    }
    EXPECT_THROW(parse_ablation("attention+norms", "--ablate"), Error);
    EXPECT_THROW(parse_ablation("", "--ablate"), Error);
    EXPECT_EQ(parse_ablation("o+mlp", "--ablate"), kAblateO | kAblateMlp);
}

// A draft model on the GPU: a second CUDA engine in the process proposes, the first verifies
// (graphs captured by both), and the tokens are those the CUDA engine makes alone, greedy and
// seeded; the target drafting for itself needs fewer steps.
TEST(CudaEngine, DraftModelKeepsTheTokens) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    SessionOptions so = tiny_cuda_model(dir, cfg);
    so.ctx = 64;
    so.max_batch = 2;
    so.prefill_chunk = 16;
    so.max_logit_rows = 10;
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(9, cfg.vocab, 3), make_prompt(6, cfg.vocab, 4),
                                                       make_prompt(4, cfg.vocab, 5)};
    SamplerOptions greedy, sampled;
    greedy.temperature = 0;
    sampled.temperature = 0.8f;
    sampled.seed = 6;
    for (const SamplerOptions& sampler : {greedy, sampled}) {
        SingleRank comm;
        auto s = open_session(so, comm);
        SessionOptions dso = so;
        dso.max_logit_rows = 0;
        auto ds = open_session(dso, comm);
        GenerateOptions go;
        go.max_new_tokens = 16;
        go.prefill_chunk = 16;
        go.max_running = 2;  // three prompts through two slots
        go.sampler = sampler;
        const GenerateResult plain = generate(*s->engine, prompts, go);
        go.speculate = 4;
        go.draft = ds->engine.get();
        // p_min > 0: the draft's probabilities from the device's nucleus mass (forward_nucleus).
        for (const float p_min : {0.0f, 0.5f}) {
            go.draft_p_min = p_min;
            const GenerateResult spec = generate(*s->engine, prompts, go);
            for (size_t i = 0; i < prompts.size(); ++i)
                EXPECT_EQ(spec.seqs[i].tokens, plain.seqs[i].tokens)
                    << "prompt " << i << ", temperature " << sampler.temperature << ", p_min " << p_min;
            EXPECT_GT(spec.timings.accepted_tokens, 0) << p_min;
            if (sampler.temperature == 0) {
                EXPECT_LT(spec.timings.decode_steps, plain.timings.decode_steps) << p_min;
            }
        }
    }
}

namespace {
// The embedding tests' sessions: `so` (2 slots of 32 positions) on the GPU, and the same on the CPU.
std::pair<std::unique_ptr<Session>, std::unique_ptr<Session>> gpu_and_cpu_sessions(SessionOptions so, Communicator& comm) {
    so.max_batch = 2;
    so.ctx = 32;
    so.device = Device::Cuda;
    SessionOptions cpu = so;
    cpu.device = Device::Cpu;
    return {open_session(so, comm), open_session(cpu, comm)};
}
}  // namespace

// Embeddings on the GPU (forward_hidden: the step stops at the final norm) equal the CPU's, every
// pooling, through two slots in chunks of 3 (graph-captured steps among them); and a graph
// captured without lm_head is never replayed for a step that wants logits (nor the reverse).
TEST(CudaEngine, EmbeddingsMatchTheCpu) {
    SKIP_WITHOUT_GPU();
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    TempDir dir;
    SessionOptions so = tiny_cuda_model(dir, cfg);
    std::vector<std::vector<int32_t>> inputs;
    for (int64_t n : {7, 1, 19, 3}) inputs.push_back(make_prompt(n, cfg.vocab, uint64_t(n) + 40));
    so.prefill_chunk = 3;
    so.max_logit_rows = 1;  // mean pooling's hidden steps want up to a row per token past it
    SingleRank comm;
    auto [g, c] = gpu_and_cpu_sessions(so, comm);
    for (const Pooling p : {Pooling::Last, Pooling::Mean, Pooling::Cls}) {
        EmbedOptions eo;
        eo.pooling = p;
        eo.normalize = false;
        eo.chunk = 3;
        const auto got = embed(*g->engine, inputs, eo), want = embed(*c->engine, inputs, eo);
        for (size_t i = 0; i < inputs.size(); ++i)
            EXPECT_LT(max_abs_diff(got[i], want[i]), 1e-4) << pooling_name(p) << " input " << i;
    }
    // A logits step stays within max_logit_rows.
    std::vector<float> rows(size_t(2 * cfg.vocab));
    const std::vector<int32_t> two = make_prompt(2, cfg.vocab, 8);
    SeqChunk all{0, two.data(), 2, 0};
    all.all_logits = true;
    EXPECT_NE(thrown_error([&] { g->engine->forward({all}, rows.data()); }).find("logit rows 2 exceed"), std::string::npos);
    // The same step shape as logits and as hidden states, each replayed from its own graph.
    const std::vector<int32_t> t = make_prompt(2, cfg.vocab, 9);
    const std::vector<SeqChunk> step = {{0, t.data(), 2, 0, true}};
    std::vector<float> hidden(size_t(cfg.hidden)), logits(size_t(cfg.vocab)), want(size_t(cfg.vocab));
    c->engine->forward(step, want.data());
    for (int i = 0; i < 3; ++i) g->engine->forward_hidden(step, hidden.data());
    for (int i = 0; i < 3; ++i) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        g->engine->forward(step, logits.data());
        EXPECT_LT(max_abs_diff(logits, want), 1e-3) << "replay " << i;
    }
    for (int i = 0; i < 2; ++i) {
        std::vector<float> h(size_t(cfg.hidden), 0.0f), hc(size_t(cfg.hidden));
        g->engine->forward_hidden(step, h.data());
        c->engine->forward_hidden(step, hc.data());
        EXPECT_LT(max_abs_diff(h, hc), 1e-4) << "replay " << i;
    }
}

// A checkpoint without its lm_head loaded for embeddings: the GPU gives the CPU's vectors and
// refuses logits steps, eager or from a graph's shape.
TEST(CudaEngine, HeadlessModelsGiveEmbeddingsOnly) {
    SKIP_WITHOUT_GPU();
    const ModelConfig cfg = tiny_config(Arch::Llama);
    TempDir full, bare;
    write_synthetic_checkpoint(full.path(), cfg, {DType::F32, 1, 6});
    write_without_model_prefix(full.path(), bare.path());
    SessionOptions so;
    so.model_dir = bare.path();
    so.load.headless_ok = true;
    so.prefill_chunk = 4;
    SingleRank comm;
    auto [g, c] = gpu_and_cpu_sessions(so, comm);
    const std::vector<std::vector<int32_t>> inputs = {make_prompt(9, cfg.vocab, 3), make_prompt(2, cfg.vocab, 4)};
    EmbedOptions eo;
    eo.chunk = 4;
    const auto got = embed(*g->engine, inputs, eo), want = embed(*c->engine, inputs, eo);
    for (size_t i = 0; i < inputs.size(); ++i) EXPECT_LT(max_abs_diff(got[i], want[i]), 1e-4) << i;
    std::vector<float> logits(size_t(cfg.vocab));
    const std::vector<SeqChunk> step = {{0, inputs[1].data(), 1, 0, true}};
    for (int i = 0; i < 3; ++i)
        EXPECT_NE(thrown_error([&] { g->engine->forward(step, logits.data()); }).find("loaded without an lm_head"),
                  std::string::npos);
}

namespace {

// Three PEFT adapters for c in `root`: "a" of rank 4 on every layer matrix, "b" of rank 2 on layer
// 0's q, v, o, up and down only (so the step's other matrices run no update kernels, and a
// slot of "a" beside one of rank 0 in "b"), "c" of rank 3 on every layer matrix.
std::vector<std::pair<std::string, LoraAdapter>> gpu_test_adapters(const ModelConfig& c, const TempDir& root) {
    std::vector<LoraModule> a, b, cc;
    uint64_t seed = 900;
    for (int64_t l = 0; l < c.n_layers; ++l)
        for (const char* lin : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
            const std::string m = "model.layers." + std::to_string(l) + "." + lin;
            a.push_back(random_lora_module(c, m, 4, seed++));
            cc.push_back(random_lora_module(c, m, 3, seed++));
            const std::string s = lin;
            if (l == 0 && s != "self_attn.k_proj" && s != "mlp.gate_proj") b.push_back(random_lora_module(c, m, 2, seed++));
        }
    for (const char* n : {"a", "b", "c"}) std::filesystem::create_directories(root.path() + "/" + n);
    write_lora_adapter(root.path() + "/a", R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "bias": "none"})", a);
    write_lora_adapter(root.path() + "/b", R"({"peft_type": "LORA", "r": 2, "lora_alpha": 2, "bias": "none"})", b);
    write_lora_adapter(root.path() + "/c", R"({"peft_type": "LORA", "r": 3, "lora_alpha": 6, "bias": "none"})", cc);
    return {{"a", {root.path() + "/a", 1.0f}}, {"b", {root.path() + "/b", 1.0f}}, {"c", {root.path() + "/c", 1.0f}}};
}

}  // namespace

// LoRA adapters chosen per sequence on the GPU (kernels/cuda/lora.h) against the CPU engine's: a
// batch of sequences under "a", none and "b" in chunks of 16 beside decode tokens (decode steps
// replayed from graphs captured with the adapters' kernels), prompt logits within the engines'
// bounds and the same greedy tokens; the graphs replay what eager steps run, bit for bit. Llama
// FP32 (fused q/k/v and gate/up), Qwen3 BF16 (BF16 factors on both engines), W8A8 with q_proj
// and gate_proj kept 16-bit (the separate projections, the norm and SwiGLU that quantize), and an
// act-order GPTQ base (the products read their input gathered, the adapters it as it is).
TEST(CudaEngine, LoraAdaptersPerSequenceMatchTheCpu) {
    SKIP_WITHOUT_GPU();
    struct LoraCase {
        Arch arch;
        DType dtype;
        WeightFormat weights;
        const char* keep;
        float tol;  // of the largest prompt logit
        bool act_order = false;  // the base: a GPTQ 4-bit act-order checkpoint (hf_quant_writer.h)
    };
    for (const LoraCase& k : {LoraCase{Arch::Llama, DType::F32, WeightFormat::Auto, "", 2e-3f},
                              LoraCase{Arch::Qwen3, DType::BF16, WeightFormat::Auto, "", 1e-2f},
                              LoraCase{Arch::Llama, DType::F32, WeightFormat::W8A8, "q_proj|gate_proj", 2e-2f},
                              LoraCase{Arch::Llama, DType::F32, WeightFormat::Auto, "", 5e-3f, true}}) {
        SCOPED_TRACE(std::string(arch_name(k.arch)) + " " + dtype_name(k.dtype) + (k.keep[0] ? " w8a8" : "") +
                     (k.act_order ? " gptq act-order" : ""));
        const ModelConfig c = tiny_config(k.arch);
        TempDir base, root, unused;
        if (k.act_order) write_pair(c, HfQuantCase{"gptq", 4, 32, "gptq", false, true}, base.path(), unused.path(), 31);
        else write_synthetic_checkpoint(base.path(), c, {k.dtype, 1, 31});
        const std::vector<std::vector<int32_t>> prompts = {make_prompt(21, c.vocab, 1), make_prompt(7, c.vocab, 2),
                                                           make_prompt(21, c.vocab, 1), make_prompt(12, c.vocab, 3)};
        const std::vector<int64_t> which = {0, -1, 1, 0};
        const auto adapters = gpu_test_adapters(c, root);
        auto run = [&](Device d, bool graphs) {
            SessionOptions so;
            so.model_dir = base.path();
            so.device = d;
            so.load.format = k.weights;
            so.load.keep_fp16 = k.keep;
            so.adapters = adapters;
            so.kv = KVFormat::F32;
            so.ctx = 64;
            so.max_batch = int64_t(prompts.size());
            so.prefill_chunk = 16;
            so.cuda_graphs = graphs;
            SingleRank comm;
            auto s = open_session(so, comm);
            return batch_greedy(*s->engine, prompts, which, 6, 16);
        };
        const std::vector<SequenceResult> cpu = run(Device::Cpu, true), gpu = run(Device::Cuda, true),
                                          eager = run(Device::Cuda, false);
        for (size_t i = 0; i < prompts.size(); ++i) {
            float scale = 1.0f;
            for (float v : cpu[i].prompt_logits) scale = std::max(scale, std::fabs(v));
            EXPECT_LT(max_abs_diff(gpu[i].prompt_logits, cpu[i].prompt_logits), k.tol * scale) << "prompt " << i;
            // (W8A8's greedy runs may part at a near-tie, as without adapters: a quantization step
            // of some layer's input rounding the other way; so may INT4's, whose cuBLAS prefill
            // rounds to f16. Their logits are held to the bound.)
            if (k.weights != WeightFormat::W8A8 && !k.act_order) {
                EXPECT_EQ(gpu[i].tokens, cpu[i].tokens) << "prompt " << i;
            }
            EXPECT_EQ(eager[i].tokens, gpu[i].tokens) << "prompt " << i;
            EXPECT_EQ(eager[i].prompt_logits, gpu[i].prompt_logits) << "prompt " << i;
        }
        // The first and third prompts are one prompt under two adapters: the adapters run.
        EXPECT_GT(max_abs_diff(gpu[0].prompt_logits, gpu[2].prompt_logits), 0.05f);
    }
}

// Adapters on the GPU come and go between steps (serve's runtime loads): a chunk under an unloaded
// adapter or one past the list is refused by name, and after set_adapters drops them all a step
// of the base model runs (its graphs re-captured) and gives what a session without adapters gives.
TEST(CudaEngine, LoraAdaptersComeAndGo) {
    SKIP_WITHOUT_GPU();
    const ModelConfig c = tiny_config(Arch::Qwen2);
    TempDir base, root;
    SessionOptions so = tiny_cuda_model(base, c);
    so.adapters = gpu_test_adapters(c, root);
    so.ctx = 32;
    so.max_batch = 1;
    SingleRank comm;
    auto s = open_session(so, comm);
    std::vector<float> lg(size_t(c.vocab)), plain(size_t(c.vocab));
    const std::vector<int32_t> p = make_prompt(5, c.vocab, 7);
    SeqChunk ch{0, p.data(), 5, 0, true};
    ch.adapter = 3;
    EXPECT_NE(thrown_error([&] { s->engine->forward({ch}, lg.data()); }).find("LoRA adapter 3 of 3"), std::string::npos);
    s->adapters[1] = LoraWeights{};
    s->engine->set_adapters(&s->adapters);
    ch.adapter = 1;
    EXPECT_NE(thrown_error([&] { s->engine->forward({ch}, lg.data()); }).find("(unloaded)"), std::string::npos);
    ch.adapter = 0;
    s->engine->forward({ch}, lg.data());
    const size_t with_a = s->engine->weight_bytes();
    s->adapters.clear();
    s->engine->set_adapters(&s->adapters);
    EXPECT_LT(s->engine->weight_bytes(), with_a);
    ch.adapter = -1;
    s->engine->forward({ch}, lg.data());
    SessionOptions none = so;
    none.adapters.clear();
    auto s2 = open_session(none, comm);
    s2->engine->forward({{0, p.data(), 5, 0, true}}, plain.data());
    EXPECT_EQ(lg, plain);
}

// serve --max-loras N on the GPU (EngineOptions::max_adapters): N device slots for three adapters,
// the others copied in from host memory as the batcher's turns need them (the least recently used
// slot replaced). Every sequence computes what it computes with every adapter resident, bit for
// bit, through prefill and graph-replayed decode; and a step under more adapters than slots is
// refused by name.
TEST(CudaEngine, LoraSlotsCopyAdaptersInAsStepsNeedThem) {
    SKIP_WITHOUT_GPU();
    const ModelConfig c = tiny_config(Arch::Llama);
    TempDir base, root;
    write_synthetic_checkpoint(base.path(), c, {DType::F32, 1, 41});
    const auto adapters = gpu_test_adapters(c, root);
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(21, c.vocab, 1), make_prompt(7, c.vocab, 2),
                                                       make_prompt(12, c.vocab, 3), make_prompt(9, c.vocab, 4),
                                                       make_prompt(21, c.vocab, 1), make_prompt(15, c.vocab, 5)};
    const std::vector<int64_t> which = {0, 1, 2, -1, 2, 0};
    SingleRank comm;
    auto open = [&](int64_t slots) {
        SessionOptions so;
        so.model_dir = base.path();
        so.device = Device::Cuda;
        so.adapters = adapters;
        so.max_loras = slots;
        so.kv = KVFormat::F32;
        so.ctx = 64;
        so.max_batch = 3;
        so.prefill_chunk = 16;
        return open_session(so, comm);
    };
    for (const int64_t n : {int64_t(1), int64_t(2)}) {
        SCOPED_TRACE(std::to_string(n) + " slots");
        auto all = open(0), few = open(n);
        const std::vector<SequenceResult> want = batch_greedy(*all->engine, prompts, which, 6, 16, n),
                                          got = batch_greedy(*few->engine, prompts, which, 6, 16, n);
        for (size_t i = 0; i < prompts.size(); ++i) {
            EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i;
            EXPECT_EQ(got[i].prompt_logits, want[i].prompt_logits) << "prompt " << i;
        }
        auto* engine = dynamic_cast<CudaEngine*>(few->engine.get());
        ASSERT_NE(engine, nullptr);
        EXPECT_EQ(dynamic_cast<CudaEngine*>(all->engine.get())->adapter_copies(), 0);
        // Each of the three adapters came in at least once, and with one slot one came back.
        EXPECT_GE(engine->adapter_copies(), n == 1 ? 4 : 3);
        EXPECT_LT(engine->weight_bytes(), all->engine->weight_bytes());
        // Two adapters in one step on one slot: refused, naming the limit.
        if (n == 1) {
            std::vector<float> lg(size_t(2 * c.vocab));
            SeqChunk x{0, prompts[0].data(), 3, 0, true}, y{1, prompts[1].data(), 3, 0, true};
            x.adapter = 0;
            y.adapter = 1;
            EXPECT_NE(thrown_error([&] { few->engine->forward({x, y}, lg.data()); }).find("holds 1 at once (--max-loras"),
                      std::string::npos);
        }
    }
}
