// Model invariants on tiny random checkpoints of every architecture.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "fixtures.h"
#include "recording_engine.h"
#include "kernels/cpu/topk.h"
#include "runtime/cpu_engine.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

struct Case {
    const char* name;
    Arch arch;
    DType dtype;
    int shards;
    bool llama3;
};

const Case kCases[] = {
    {"llama_f32", Arch::Llama, DType::F32, 1, false},
    {"llama3_scaled_bf16_sharded", Arch::Llama, DType::BF16, 2, true},
    {"mistral_f16", Arch::Mistral, DType::F16, 1, false},
    {"qwen2_bf16", Arch::Qwen2, DType::BF16, 1, false},
    {"qwen3_f16_sharded", Arch::Qwen3, DType::F16, 3, false},
};
// gtest prints a parameter without one as its bytes, a pointer among them (CTest's listing).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class EngineInvariants : public ::testing::TestWithParam<Case> {
protected:
    void SetUp() override {
        const Case& c = GetParam();
        cfg_ = tiny_config(c.arch);
        if (c.llama3) {
            cfg_.rope.kind = RopeScaling::Kind::Llama3;
            cfg_.rope.factor = 8;
            cfg_.rope.original_max_position = 64;  // short, so all three bands appear at head_dim 16
            cfg_.rope_theta = 500000;
        }
        write_synthetic_checkpoint(dir_.path(), cfg_, {c.dtype, c.shards, 11});
    }
    TempDir dir_;
    ModelConfig cfg_;
};

// Greedy generate() of `prompts` through `slots` KV-cache slots, prompt i stopped (StopCheck)
// after its stop_after[i]-th token, so that sequences end at different steps and hand their slots
// on while the others run.
GenerateResult run_queued(const std::string& dir, const std::vector<std::vector<int32_t>>& prompts, int64_t slots,
                          int64_t chunk, const std::vector<size_t>& stop_after, bool keep_logits,
                          std::vector<std::vector<RecordingEngine::Chunk>>* steps = nullptr) {
    SessionOptions so;
    so.model_dir = dir;
    so.max_batch = slots;
    so.ctx = 48;
    so.prefill_chunk = chunk;
    SingleRank comm;
    auto s = open_session(so, comm);
    GenerateOptions go;
    go.max_new_tokens = 9;
    go.prefill_chunk = chunk;
    go.sampler.temperature = 0.0f;
    go.keep_prompt_logits = keep_logits;
    std::vector<size_t> seen(prompts.size(), 0);
    auto stop = [&](size_t i, int32_t) { return ++seen[i] == stop_after[i]; };
    RecordingEngine recorder(*s->engine);
    GenerateResult r = generate(recorder, prompts, go, nullptr, stop);
    if (steps) *steps = recorder.steps;
    return r;
}
}  // namespace

TEST_P(EngineInvariants, CachedDecodeEqualsFullRecompute) {
    const auto prompt = make_prompt(9, cfg_.vocab, 1);
    const int64_t steps = 6, V = cfg_.vocab;
    SessionOptions so;
    so.model_dir = dir_.path();
    so.ctx = 32;
    SingleRank comm;
    auto s = open_session(so, comm);
    // Cached: prefill, then one token per step.
    std::vector<float> lg(static_cast<size_t>(V));
    s->engine->forward({{0, prompt.data(), int64_t(prompt.size()), 0, true}}, lg.data());
    std::vector<int32_t> seq = prompt;
    std::vector<std::vector<float>> cached;
    for (int64_t i = 0; i < steps; ++i) {
        seq.push_back(argmax(lg.data(), V));
        s->engine->forward({{0, &seq.back(), 1, int64_t(seq.size()) - 1, true}}, lg.data());
        cached.push_back(lg);
    }
    // Recompute: the whole sequence from scratch in one step each time (the prefill GEMMs, where the
    // cached steps ran the GEMVs: 1.06e-4 apart on qwen2_bf16 under AMX's rounding).
    const double tol = cpu_prefill_rounds() ? 5e-4 : 1e-4;
    for (int64_t i = 0; i < steps; ++i) {
        const int64_t n = int64_t(prompt.size()) + i + 1;
        s->engine->forward({{0, seq.data(), n, 0, true}}, lg.data());
        EXPECT_LT(max_abs_diff(lg, cached[size_t(i)]), tol) << "step " << i;
        EXPECT_EQ(argmax(lg.data(), V), argmax(cached[size_t(i)].data(), V));
    }
}

TEST_P(EngineInvariants, BatchEqualsEachAlone) {
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(5, cfg_.vocab, 2), make_prompt(13, cfg_.vocab, 3),
                                                       make_prompt(1, cfg_.vocab, 4)};
    const GenerateResult batch = run_greedy(dir_.path(), prompts, 7);
    for (size_t i = 0; i < prompts.size(); ++i) {
        const GenerateResult alone = run_greedy(dir_.path(), {prompts[i]}, 7);
        EXPECT_EQ(batch.seqs[i].tokens, alone.seqs[0].tokens) << "prompt " << i;
        EXPECT_LT(max_abs_diff(batch.seqs[i].prompt_logits, alone.seqs[0].prompt_logits), 1e-4);
    }
}

// Continuous batching: more prompts than slots, sequences ending at different steps, prompt chunks
// riding in the steps of the others' decode tokens. Each sequence's tokens and prompt logits
// are still those it gets alone.
TEST_P(EngineInvariants, QueuedPromptsEqualEachAlone) {
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(5, cfg_.vocab, 2), make_prompt(13, cfg_.vocab, 3),
                                                       make_prompt(1, cfg_.vocab, 4), make_prompt(21, cfg_.vocab, 5),
                                                       make_prompt(2, cfg_.vocab, 6)};
    const std::vector<size_t> stop_after = {3, 9, 1, 5, 2};
    const GenerateResult queued = run_queued(dir_.path(), prompts, 2, 8, stop_after, true);
    for (size_t i = 0; i < prompts.size(); ++i) {
        const GenerateResult alone = run_queued(dir_.path(), {prompts[i]}, 1, 8, {stop_after[i]}, true);
        EXPECT_EQ(queued.seqs[i].tokens, alone.seqs[0].tokens) << "prompt " << i;
        EXPECT_EQ(queued.seqs[i].tokens.size(), stop_after[i]) << "prompt " << i;
        EXPECT_EQ(queued.seqs[i].stop_reason, alone.seqs[0].stop_reason) << "prompt " << i;
        EXPECT_LT(max_abs_diff(queued.seqs[i].prompt_logits, alone.seqs[0].prompt_logits), 1e-4) << "prompt " << i;
    }
}

TEST_P(EngineInvariants, ChunkedPrefillEqualsOneShot) {
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(40, cfg_.vocab, 5), make_prompt(17, cfg_.vocab, 6)};
    const GenerateResult one = run_greedy(dir_.path(), prompts, 5, 256);
    for (int64_t chunk : {1, 7, 256}) {
        const GenerateResult ch = run_greedy(dir_.path(), prompts, 5, chunk);
        for (size_t i = 0; i < prompts.size(); ++i) {
            EXPECT_EQ(ch.seqs[i].tokens, one.seqs[i].tokens) << "chunk " << chunk;
            EXPECT_LT(max_abs_diff(ch.seqs[i].prompt_logits, one.seqs[i].prompt_logits), 1e-4) << "chunk " << chunk;
        }
    }
}

// --batch-invariant: a sequence's logits are the same bits alone, one chunk at a time, and in
// steps shared with other sequences, its prompt cut into other chunks and its decode tokens
// beside others', for every weight format (each takes its own kernels).
TEST_P(EngineInvariants, BatchInvariantLogitsAreTheSameBits) {
    for (const LoadOptions& lo : {LoadOptions(), LoadOptions(WeightFormat::Int8), LoadOptions(WeightFormat::W8A8),
                                  LoadOptions(WeightFormat::Int4, 32), LoadOptions(WeightFormat::W4A8, 32)}) {
        SingleRank comm;  // (the sessions keep a reference to it)
        const std::string mismatch = batch_invariance_mismatch(
            [&] {
                SessionOptions so;
                so.model_dir = dir_.path();
                so.load = lo;
                so.kv = KVFormat::Int8;
                so.max_batch = 3;
                so.ctx = 160;
                so.batch_invariant = true;
                return open_session(so, comm);
            },
            cfg_.vocab);
        EXPECT_EQ(mismatch, "") << weight_format_name(lo.format);
    }
}

TEST_P(EngineInvariants, FlashAndNaiveAttentionAgree) {
    // A prompt longer than one flash tile of keys, prefilled in chunks that attend to a cached
    // prefix, then decode steps: the two CPU attention paths on the same cache.
    const auto prompt = make_prompt(150, cfg_.vocab, 8);
    const int64_t V = cfg_.vocab;
    std::vector<std::vector<float>> out[2];
    for (int k = 0; k < 2; ++k) {
        SessionOptions so;
        so.model_dir = dir_.path();
        so.ctx = 160;
        so.prefill_chunk = 70;
        so.attention = k == 0 ? AttentionImpl::Flash : AttentionImpl::Naive;
        SingleRank comm;
        auto s = open_session(so, comm);
        std::vector<float> lg(static_cast<size_t>(V));
        for (int64_t at = 0; at < 150; at += 70) {
            const int64_t n = std::min<int64_t>(70, 150 - at);
            s->engine->forward({{0, prompt.data() + at, n, at, true}}, lg.data());
            out[k].push_back(lg);
        }
        for (int64_t i = 0; i < 5; ++i) {
            const int32_t t = prompt[size_t(i)];
            s->engine->forward({{0, &t, 1, 150 + i, true}}, lg.data());
            out[k].push_back(lg);
        }
    }
    ASSERT_EQ(out[0].size(), out[1].size());
    for (size_t i = 0; i < out[0].size(); ++i) EXPECT_LT(max_abs_diff(out[0][i], out[1][i]), 1e-4) << "step " << i;
}

TEST_P(EngineInvariants, ReducedPrecisionStaysClose) {
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(12, cfg_.vocab, 7)};
    const GenerateResult ref = run_greedy(dir_.path(), prompts, 1, 256, WeightFormat::F32, KVFormat::F32);
    const GenerateResult kv16 = run_greedy(dir_.path(), prompts, 1, 256, WeightFormat::F32, KVFormat::F16);
    const GenerateResult w16 = run_greedy(dir_.path(), prompts, 1, 256, WeightFormat::F16, KVFormat::BF16);
    // Logits here have a standard deviation of a few units.
    EXPECT_LT(max_abs_diff(ref.seqs[0].prompt_logits, kv16.seqs[0].prompt_logits), 0.02);
    EXPECT_LT(max_abs_diff(ref.seqs[0].prompt_logits, w16.seqs[0].prompt_logits), 0.3);
}

// A context shift (Engine::shift_kv) on a one-layer model, whose keys and values depend only on
// each token and its position: the next step's logits are those of a fresh prefill of the kept
// tokens (the sinks, then the tokens after the discarded ones) at their new positions, with and
// without sinks and on an INT8 cache (requantized keys: one more rounding, here up to 0.1 against
// logits spread over several units; a wrong turn moves them by 0.5-3). (Deeper layers' keys
// also carry what the discarded tokens contributed, so there the kernel tests' closed form and the
// CUDA engine's agreement with this one are the checks.)
TEST_P(EngineInvariants, ContextShiftEqualsPrefillOfTheKeptTokens) {
    TempDir one;
    ModelConfig c1 = cfg_;
    c1.n_layers = 1;
    write_synthetic_checkpoint(one.path(), c1, {GetParam().dtype, 1, 13});
    const int64_t ctx = 24, V = c1.vocab;
    const auto seq = make_prompt(ctx + 1, V, 12);  // ctx tokens cached, then one more
    struct Shift { int64_t keep, discard; };
    for (const KVFormat kv : {KVFormat::F32, KVFormat::Int8})
        for (const Shift sh : {Shift{4, 9}, Shift{0, 12}, Shift{1, 1}}) {
            SessionOptions so;
            so.model_dir = one.path();
            so.ctx = ctx;
            so.kv = kv;
            SingleRank comm;
            auto a = open_session(so, comm), b = open_session(so, comm);
            std::vector<float> la(static_cast<size_t>(V)), lb(la.size());
            a->engine->forward({{0, seq.data(), ctx, 0, false}}, la.data());
            a->engine->shift_kv(0, sh.keep, sh.discard, ctx);
            a->engine->forward({{0, &seq[size_t(ctx)], 1, ctx - sh.discard, true}}, la.data());
            std::vector<int32_t> kept(seq.begin(), seq.begin() + sh.keep);
            kept.insert(kept.end(), seq.begin() + sh.keep + sh.discard, seq.end());
            b->engine->forward({{0, kept.data(), int64_t(kept.size()), 0, true}}, lb.data());
            EXPECT_LT(max_abs_diff(la, lb), kv == KVFormat::F32 ? 1e-4 : 0.15)
                << "kv " << (kv == KVFormat::F32 ? "fp32" : "int8") << " keep " << sh.keep << " discard " << sh.discard;
            EXPECT_THROW(a->engine->shift_kv(0, 4, 0, ctx), Error);      // nothing discarded
            EXPECT_THROW(a->engine->shift_kv(0, 4, 4, ctx + 1), Error);  // past the cache
            EXPECT_THROW(a->engine->shift_kv(1, 4, 4, ctx), Error);      // no such slot
        }
}

// Engine::save_kv / load_kv (the prefix cache's host tier): a copy of 13 positions of slot 0,
// loaded whole into slot 1 and saved again, is the bytes it was; its first 9 loaded into slot 1
// are the bytes a copy of slot 0's first 9 holds (each head's rows sit 13 apart in the longer
// copy), and the two sequences go on from there bit for bit alike (a prompt chunk, then decode
// steps). A copy takes kv_position_bytes per position, the cache's bytes per slot and position.
TEST_P(EngineInvariants, HostCopyOfAPrefixContinuesItsSequence) {
    const int64_t V = cfg_.vocab, ctx = 32, n = 13, m = 9;
    const auto prompt = make_prompt(20, V, 51), tail = make_prompt(8, V, 52);
    for (const KVFormat kv : {KVFormat::F32, KVFormat::Int8}) {
        SessionOptions so;
        so.model_dir = dir_.path();
        so.ctx = ctx;
        so.max_batch = 2;
        so.kv = kv;
        SingleRank comm;
        auto s = open_session(so, comm);
        Engine& e = *s->engine;
        const int64_t cap = kv_capacity(s->cfg, e.options());
        const size_t per = e.kv_position_bytes();
        EXPECT_EQ(per * size_t(2 * cap), e.kv_bytes());
        std::vector<float> lg(static_cast<size_t>(V));
        e.forward({{0, prompt.data(), int64_t(prompt.size()), 0, false}}, lg.data());
        std::vector<uint8_t> saved(size_t(n) * per), again(saved.size()), first(size_t(m) * per), again_first(first.size());
        e.save_kv(0, n, saved.data());
        e.save_kv(0, m, first.data());
        e.load_kv(1, n, saved.data(), n);
        e.save_kv(1, n, again.data());
        EXPECT_TRUE(again == saved);
        e.load_kv(1, m, saved.data(), n);
        e.save_kv(1, m, again_first.data());
        EXPECT_TRUE(again_first == first);
        std::vector<float> out[2];
        for (int64_t slot = 0; slot < 2; ++slot) {
            e.forward({{slot, tail.data(), 5, m, true}}, lg.data());
            out[slot] = lg;
            for (int64_t i = 5; i < 8; ++i) {
                e.forward({{slot, &tail[size_t(i)], 1, m + i, true}}, lg.data());
                out[slot].insert(out[slot].end(), lg.begin(), lg.end());
            }
        }
        EXPECT_EQ(out[0], out[1]) << "kv " << kv_name(kv_dtype(kv));
        EXPECT_THROW(e.save_kv(2, n, again.data()), Error);       // no such slot
        EXPECT_THROW(e.load_kv(1, 0, saved.data(), n), Error);    // nothing
        EXPECT_THROW(e.load_kv(1, m + 1, first.data(), m), Error);  // more than the copy holds
        EXPECT_THROW(e.save_kv(0, cap + 1, nullptr), Error);     // past the cache
    }
}

INSTANTIATE_TEST_SUITE_P(Archs, EngineInvariants, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Engine, LogitsAreNotDegenerate) {
    TempDir d;
    write_synthetic_checkpoint(d.path(), tiny_config(Arch::Qwen3), {DType::F32, 1, 2});
    const GenerateResult r = run_greedy(d.path(), {make_prompt(6, 384, 9)}, 1);
    double mean = 0, var = 0;
    const auto& lg = r.seqs[0].prompt_logits;
    for (float v : lg) mean += v;
    mean /= double(lg.size());
    for (float v : lg) var += (v - mean) * (v - mean);
    EXPECT_GT(std::sqrt(var / double(lg.size())), 1.0);  // greedy is well conditioned
}

TEST(Engine, ContextAndIdErrors) {
    TempDir d;
    write_synthetic_checkpoint(d.path(), tiny_config(Arch::Llama), {DType::F32, 1, 2});
    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 8;
    SingleRank comm;
    auto s = open_session(so, comm);
    GenerateOptions go;
    go.max_new_tokens = 4;
    EXPECT_THROW(generate(*s->engine, {make_prompt(5, 384, 1)}, go), Error);  // 5 + 4 > 8
    EXPECT_THROW(generate(*s->engine, {{}}, go), Error);                       // empty prompt
    EXPECT_THROW(generate(*s->engine, {{1, 2, 400}}, go), Error);              // id >= vocab
    EXPECT_NO_THROW(generate(*s->engine, {make_prompt(4, 384, 1)}, go));
    so.ctx = 1 << 20;
    EXPECT_THROW(open_session(so, comm), Error);  // beyond max_position_embeddings
}

// A prompt id outside the vocabulary was refused by the CLI alone: check_generate() (which
// generate() runs first) passed it, so a library call met it only in the engine's step that
// embedded it, after the prompts before it had been prefilled, in an error naming no prompt.
// check_generate holds the check now, the one the CLI runs before the load.
TEST(Engine, GenerateChecksPromptIdsBeforeAnyStep) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 2});
    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 16;
    so.max_batch = 2;
    SingleRank comm;
    auto s = open_session(so, comm);
    GenerateOptions go;
    go.max_new_tokens = 2;
    const int32_t vocab = int32_t(cfg.vocab);
    auto error_of = [](const std::function<void()>& call) {
        try {
            call();
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    for (int32_t bad : {vocab, -1}) {
        const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {4, bad, 5}};
        const std::string want =
            "prompt 1 has token id " + std::to_string(bad) + " outside the vocabulary [0, " + std::to_string(vocab) + ")";
        EXPECT_EQ(error_of([&] { check_generate(cfg, engine_options(so), prompts, go); }), want);
        EXPECT_EQ(error_of([&] { check_generate(cfg, engine_options(so), prompts, go, "--prompt-ids"); }),
                  "--prompt-ids: " + want);
        EXPECT_EQ(error_of([&] { generate(*s->engine, prompts, go); }), want);
    }
    EXPECT_NO_THROW(check_generate(cfg, engine_options(so), {{1, 2, 3}, {4, vocab - 1, 0}}, go));
    EXPECT_NO_THROW(generate(*s->engine, {{1, 2, 3}, {4, vocab - 1, 0}}, go));
}

// A model whose logits are all NaN (its final norm's weights NaN here) stops generation with the
// reason, under greedy, top-k and nucleus sampling alike, instead of emitting token 0 for ever.
TEST(Engine, AllNaNLogitsStopGeneration) {
    TempDir d;
    write_synthetic_checkpoint(d.path(), tiny_config(Arch::Llama), {DType::F32, 1, 2});
    const std::string file = d.path() + "/model.safetensors";
    std::string bytes = read_file(file);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    const auto header = nlohmann::json::parse(bytes.substr(8, size_t(n)));
    const auto& t = header.at("model.norm.weight");
    const size_t begin = t.at("data_offsets")[0].get<size_t>(), end = t.at("data_offsets")[1].get<size_t>();
    const float nan = std::nanf("");
    for (size_t off = begin; off < end; off += 4) std::memcpy(&bytes[8 + size_t(n) + off], &nan, 4);
    write_file(file, bytes);

    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 16;
    SingleRank comm;
    auto s = open_session(so, comm);
    for (int mode = 0; mode < 3; ++mode) {
        GenerateOptions go;
        go.max_new_tokens = 3;
        if (mode > 0) go.sampler.temperature = 0.8f;
        if (mode == 1) go.sampler.top_k = 20;
        if (mode == 2) go.sampler.top_p = 0.9f;
        try {
            generate(*s->engine, {make_prompt(4, 384, 1)}, go);
            ADD_FAILURE() << "no error, mode " << mode;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("are all NaN at generated token 0"), std::string::npos) << e.what();
        }
    }
}

// Every engine checks a step's penalties before it runs (check_step): ids in the vocabulary and
// distinct, finite values, within EngineOptions::max_penalties, on a want_logits chunk only.
TEST(Engine, RefusesBadPenalties) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 5});
    SingleRank comm;
    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 16;
    so.max_penalties = 3;
    auto s = open_session(so, comm);
    const std::vector<int32_t> p = {1, 2, 3};
    std::vector<float> logits(size_t(3 * cfg.vocab));
    auto run = [&](std::vector<PenaltyEntry> e, bool all_logits = false) {
        SeqChunk ch{0, p.data(), 3, 0, true, all_logits};
        ch.penalties = e.data();
        ch.n_penalties = int64_t(e.size());
        s->engine->forward({ch}, logits.data());
    };
    EXPECT_NO_THROW(run({{0, 5, 1.5f, 0.5f}, {0, 7, 1.5f, 0.0f}}));
    EXPECT_THROW(run({{0, 5, 1.5f, 0.5f}, {0, 5, 1.5f, 0.0f}}), Error);             // twice
    EXPECT_THROW(run({{0, int32_t(cfg.vocab), 1.5f, 0.5f}}), Error);                // outside
    EXPECT_THROW(run({{0, -1, 1.5f, 0.5f}}), Error);
    EXPECT_THROW(run({{0, 5, 0.0f, 0.5f}}), Error);                                 // repetition 0
    EXPECT_THROW(run({{0, 5, 1.5f, std::nanf("")}}), Error);
    EXPECT_THROW(run({{0, 1, 1, 0}, {0, 2, 1, 0}, {0, 3, 1, 0}, {0, 4, 1, 0}}), Error);  // beyond the room
    EXPECT_THROW(run({{0, 5, 1.5f, 0.5f}}, true), Error);                           // perplexity rows
}

// generate()'s StopCheck ends the sequence it answers true for, at that token, stop_reason
// "stop"; the others go on as without it, and it is asked once per token that is not an EOS.
TEST(Engine, StopCheckEndsASequence) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 5});
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(5, cfg.vocab, 1), make_prompt(3, cfg.vocab, 2)};
    SingleRank comm;
    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 32;
    so.max_batch = 2;
    auto s = open_session(so, comm);
    GenerateOptions go;
    go.max_new_tokens = 10;
    go.sampler.temperature = 0;
    const GenerateResult free = generate(*s->engine, prompts, go);
    std::vector<std::vector<int32_t>> asked(2);
    const GenerateResult cut = generate(*s->engine, prompts, go, nullptr, [&](size_t i, int32_t id) {
        asked[i].push_back(id);
        return i == 1 && asked[i].size() == 3;
    });
    ASSERT_EQ(cut.seqs[1].tokens.size(), 3u);
    EXPECT_EQ(cut.seqs[1].stop_reason, "stop");
    EXPECT_EQ(cut.seqs[1].tokens, std::vector<int32_t>(free.seqs[1].tokens.begin(), free.seqs[1].tokens.begin() + 3));
    EXPECT_EQ(asked[1], cut.seqs[1].tokens);
    EXPECT_EQ(cut.seqs[0].tokens, free.seqs[0].tokens);
    EXPECT_EQ(cut.seqs[0].stop_reason, free.seqs[0].stop_reason);
    std::vector<int32_t> not_eos = free.seqs[0].tokens;
    if (free.seqs[0].stop_reason == "eos") not_eos.pop_back();
    EXPECT_EQ(asked[0], not_eos);
}

// The schedule of continuous batching, as the engine sees it: never more chunks than slots, one
// sequence per slot at a time (each slot's positions run on from where they stopped, or start a
// new prompt at 0), prompts started in order, decode tokens before prompt chunks, a step within
// --prefill-chunk tokens (or the decode tokens and one prompt token), prompt chunks riding along
// with decode tokens, and every prompt prefilled exactly once. On a model sliding over a window
// shorter than the prompts, so that slots reused by a new sequence hold a wrapped ring.
TEST(Engine, ContinuousBatchingSchedule) {
    TempDir d;
    ModelConfig cfg = tiny_config(Arch::Mistral);
    cfg.sliding_window = 6;
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 9});
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(30, cfg.vocab, 1), make_prompt(3, cfg.vocab, 2),
                                                       make_prompt(12, cfg.vocab, 3), make_prompt(1, cfg.vocab, 4),
                                                       make_prompt(20, cfg.vocab, 5), make_prompt(7, cfg.vocab, 6)};
    const std::vector<size_t> stop_after = {4, 2, 9, 3, 5, 1};
    const int64_t slots = 3, chunk = 8;
    std::vector<std::vector<RecordingEngine::Chunk>> steps;
    const GenerateResult r = run_queued(d.path(), prompts, slots, chunk, stop_after, false, &steps);
    std::map<int64_t, int64_t> next_pos;  // per slot
    std::map<int64_t, int64_t> occupant;    // per slot: the prompt it holds
    std::vector<int64_t> prefilled(prompts.size(), 0), decoded(prompts.size(), 0);
    int64_t started = 0, mixed = 0;
    for (size_t t = 0; t < steps.size(); ++t) {
        const auto& step = steps[t];
        ASSERT_LE(int64_t(step.size()), slots) << "step " << t;
        std::set<int64_t> used;
        int64_t tokens = 0, decode = 0;
        bool prompt_seen = false;
        for (const auto& c : step) {
            EXPECT_TRUE(used.insert(c.slot).second) << "step " << t << " slot " << c.slot;
            // Position 0 starts the next prompt in the slot; below its occupant's prompt length a
            // chunk is a prompt chunk, beyond it a decode token.
            if (c.pos == 0) {
                ASSERT_LT(started, int64_t(prompts.size())) << "step " << t;
                // The slot's previous sequence has run all its decode steps: it has ended.
                if (occupant.count(c.slot)) {
                    const size_t q = size_t(occupant[c.slot]);
                    EXPECT_EQ(decoded[q], int64_t(stop_after[q]) - 1) << "step " << t << ": prompt " << started
                                                                      << " took the slot of running prompt " << q;
                }
                occupant[c.slot] = started++;  // prompts start in order (their tokens are checked below)
            }
            ASSERT_TRUE(occupant.count(c.slot)) << "step " << t;
            const int64_t p = c.pos < int64_t(prompts[size_t(occupant[c.slot])].size()) ? occupant[c.slot] : -1;
            if (p < 0) {
                EXPECT_FALSE(prompt_seen) << "step " << t << ": a decode token after a prompt chunk";
                EXPECT_EQ(c.n, 1);
                ++decode;
                ++decoded[size_t(occupant[c.slot])];
            } else {
                prompt_seen = true;
                const auto& want = prompts[size_t(p)];
                ASSERT_LE(c.pos + c.n, int64_t(want.size())) << "step " << t;
                EXPECT_EQ(c.tokens, std::vector<int32_t>(want.begin() + c.pos, want.begin() + c.pos + c.n)) << "step " << t;
                prefilled[size_t(p)] += c.n;
            }
            if (c.pos != 0) {
                EXPECT_EQ(c.pos, next_pos[c.slot]) << "step " << t << " slot " << c.slot;
            }
            next_pos[c.slot] = c.pos + c.n;
            tokens += c.n;
        }
        EXPECT_LE(tokens, std::max(chunk, decode + 1)) << "step " << t;
        mixed += decode > 0 && prompt_seen;
    }
    EXPECT_EQ(started, int64_t(prompts.size()));
    EXPECT_GT(mixed, 0) << "no prompt chunk rode along with decode tokens";
    for (size_t s = 0; s < prompts.size(); ++s) {
        EXPECT_EQ(prefilled[s], int64_t(prompts[s].size())) << "prompt " << s;
        EXPECT_EQ(r.seqs[s].tokens.size(), stop_after[s]) << "prompt " << s;
        EXPECT_EQ(r.seqs[s].stop_reason, "stop") << "prompt " << s;
        const GenerateResult alone = run_queued(d.path(), {prompts[s]}, 1, chunk, {stop_after[s]}, false);
        EXPECT_EQ(r.seqs[s].tokens, alone.seqs[0].tokens) << "prompt " << s;
    }
    // Fewer steps than the prompts in groups of three, each prefilled and then decoded to its
    // longest (ceil(45 / 8) + 8 and ceil(28 / 8) + 4 = 22 steps); this schedule takes 15.
    EXPECT_LT(int64_t(steps.size()), 22) << steps.size();
    for (size_t s = 0; s < prompts.size(); ++s) EXPECT_EQ(decoded[s], int64_t(stop_after[s]) - 1) << "prompt " << s;
}

// GenerateOptions::max_new_each gives each prompt its own limit and max_running caps the
// sequences at once below the engine's slots (bench --requests): a cap of one runs the prompts
// one after the other, in their own slot 0, with the tokens each gets alone.
TEST(Engine, PerPromptLimitsAndARunningCap) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 17});
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(4, cfg.vocab, 1), make_prompt(7, cfg.vocab, 2),
                                                       make_prompt(2, cfg.vocab, 3)};
    SingleRank comm;
    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 16;
    so.max_batch = 3;
    auto s = open_session(so, comm);
    RecordingEngine rec(*s->engine);
    GenerateOptions go;
    go.sampler.temperature = 0;
    go.max_new_tokens = 9;
    go.max_new_each = {2, 5, 1};
    go.max_running = 1;
    const GenerateResult r = generate(rec, prompts, go);
    for (const auto& step : rec.steps) {
        ASSERT_EQ(step.size(), 1u);
        EXPECT_EQ(step[0].slot, 0);
    }
    EXPECT_EQ(rec.steps.size(), 3u + 1 + 4 + 0);  // a prefill step each, then 1, 4 and 0 decode steps
    go.max_running = 0;
    const GenerateResult all = generate(*s->engine, prompts, go);
    for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(r.seqs[i].tokens.size(), size_t(go.max_new_each[i])) << "prompt " << i;
        EXPECT_EQ(r.seqs[i].stop_reason, "length");
        EXPECT_EQ(r.seqs[i].tokens, all.seqs[i].tokens) << "prompt " << i;
    }
    go.max_running = 4;  // more than the slots
    EXPECT_THROW(generate(*s->engine, prompts, go), Error);
    go.max_running = 0;
    go.max_new_each = {2, 5};  // not one per prompt
    EXPECT_THROW(generate(*s->engine, prompts, go), Error);
    go.max_new_each = {2, 0, 1};
    EXPECT_THROW(generate(*s->engine, prompts, go), Error);
    go.max_new_each = {2, 10, 1};  // 7 + 10 > --ctx 16
    EXPECT_THROW(generate(*s->engine, prompts, go), Error);
}

// --logprobs: each generated token's entry is the log-softmax of the row it was drawn from: the
// first token's of the prompt's last logits, the others' of a full recompute of the sequence so
// far; queued through one slot, the same entries (within the batch tolerance).
TEST(Engine, LogprobsAreTheLogSoftmaxOfTheRows) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 13});
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(6, cfg.vocab, 1), make_prompt(2, cfg.vocab, 2)};
    SingleRank comm;
    auto open = [&](int64_t slots) {
        SessionOptions so;
        so.model_dir = d.path();
        so.ctx = 32;
        so.max_batch = slots;
        return open_session(so, comm);
    };
    GenerateOptions go;
    go.max_new_tokens = 6;
    go.sampler.temperature = 1.0f;
    go.sampler.top_k = 0;
    go.sampler.top_p = 1.0f;
    go.sampler.seed = 3;
    go.logprobs = 4;
    go.keep_prompt_logits = true;
    auto s = open(2);
    const GenerateResult r = generate(*s->engine, prompts, go);
    const int64_t V = cfg.vocab;
    auto log_softmax = [&](const std::vector<float>& row) {
        double mx = -INFINITY, sum = 0;
        for (float v : row) mx = std::max(mx, double(v));
        for (float v : row) sum += std::exp(double(v) - mx);
        std::vector<double> out;
        for (float v : row) out.push_back(double(v) - mx - std::log(sum));
        return out;
    };
    std::vector<float> row(static_cast<size_t>(V));
    for (size_t i = 0; i < prompts.size(); ++i) {
        const SequenceResult& q = r.seqs[i];
        ASSERT_EQ(q.logprobs.size(), q.tokens.size());
        for (size_t t = 0; t < q.tokens.size(); ++t) {
            std::vector<int32_t> seq = prompts[i];
            seq.insert(seq.end(), q.tokens.begin(), q.tokens.begin() + ptrdiff_t(t));
            if (t == 0) row = q.prompt_logits;
            else s->engine->forward({{0, seq.data(), int64_t(seq.size()), 0, true}}, row.data());
            const std::vector<double> want = log_softmax(row);
            const TokenLogprobs& got = q.logprobs[t];
            EXPECT_EQ(got.token.id, q.tokens[t]);
            EXPECT_NEAR(got.token.logprob, want[size_t(q.tokens[t])], 1e-4) << "prompt " << i << " token " << t;
            ASSERT_EQ(got.top.size(), 4u);
            std::vector<float> vals(4);
            std::vector<int32_t> ids(4);
            topk_ref(row.data(), V, 4, vals.data(), ids.data());
            for (size_t j = 0; j < 4; ++j) {
                EXPECT_EQ(got.top[j].id, ids[j]) << "prompt " << i << " token " << t;
                EXPECT_NEAR(got.top[j].logprob, want[size_t(ids[j])], 1e-4);
            }
        }
    }
    auto one = open(1);
    const GenerateResult queued = generate(*one->engine, prompts, go);
    for (size_t i = 0; i < prompts.size(); ++i) {
        ASSERT_EQ(queued.seqs[i].tokens, r.seqs[i].tokens) << "prompt " << i;
        for (size_t t = 0; t < r.seqs[i].tokens.size(); ++t)
            EXPECT_NEAR(queued.seqs[i].logprobs[t].token.logprob, r.seqs[i].logprobs[t].token.logprob, 1e-4);
    }
    go.logprobs = V + 1;
    EXPECT_THROW(generate(*s->engine, prompts, go), Error);
}

// token_penalties (runtime/generate.h): one entry per distinct id of the last `window` tokens,
// ascending, offset = frequency * count + presence; nothing when the options penalise nothing.
TEST(Engine, TokenPenaltiesCountTheWindow) {
    SamplerOptions o;
    o.repetition_penalty = 1.5f;
    o.frequency_penalty = 0.25f;
    o.presence_penalty = 0.5f;
    const std::vector<int32_t> seq = {9, 5, 3, 5, 9, 5, 3};
    const std::vector<PenaltyEntry> e = token_penalties(o, 4, seq.data(), int64_t(seq.size()));  // 5 9 5 3
    ASSERT_EQ(e.size(), 3u);
    EXPECT_EQ(e[0].id, 3);
    EXPECT_EQ(e[0].offset, 0.75f);
    EXPECT_EQ(e[1].id, 5);
    EXPECT_EQ(e[1].offset, 1.0f);
    EXPECT_EQ(e[2].id, 9);
    EXPECT_EQ(e[2].offset, 0.75f);
    for (const auto& x : e) EXPECT_EQ(x.repetition, 1.5f);
    EXPECT_EQ(token_penalties(o, 100, seq.data(), int64_t(seq.size())).size(), 3u);
    EXPECT_TRUE(token_penalties(o, 0, seq.data(), int64_t(seq.size())).empty());
    SamplerOptions off;
    EXPECT_FALSE(penalties_enabled(off));
    EXPECT_TRUE(token_penalties(off, 4, seq.data(), int64_t(seq.size())).empty());
    off.repetition_penalty = 1.2f;
    off.penalty_last_n = 0;
    EXPECT_FALSE(penalties_enabled(off));
    // A logit bias lowers a penalised id's offset by its bias and adds entries of its own.
    o.logit_bias = {{9, 2.0f}, {4, -1.5f}};
    const std::vector<PenaltyEntry> b = token_penalties(o, 4, seq.data(), int64_t(seq.size()));
    ASSERT_EQ(b.size(), 4u);
    EXPECT_EQ(b[0].id, 3);
    EXPECT_EQ(b[0].offset, 0.75f);
    EXPECT_EQ(b[1].id, 4);
    EXPECT_EQ(b[1].offset, 1.5f);
    EXPECT_EQ(b[1].repetition, 1.0f);
    EXPECT_EQ(b[3].id, 9);
    EXPECT_EQ(b[3].offset, 0.75f - 2.0f);
    EXPECT_EQ(b[3].repetition, 1.5f);
    EXPECT_TRUE(adjusts_logits(o));
    SamplerOptions bias_only;
    bias_only.logit_bias = {{7, 100.0f}};
    EXPECT_TRUE(adjusts_logits(bias_only));
    EXPECT_EQ(penalty_window(bias_only, 100), 0);  // a bias alone looks back over no tokens
    const std::vector<PenaltyEntry> bo = token_penalties(bias_only, 0, seq.data(), int64_t(seq.size()));
    ASSERT_EQ(bo.size(), 1u);
    EXPECT_EQ(bo[0].offset, -100.0f);
    RecentTokens none(0, 40);  // a bias alone: no window
    none.push(3);
    std::vector<PenaltyEntry> got_none;
    none.entries(bias_only, got_none);
    ASSERT_EQ(got_none.size(), 1u);
    EXPECT_EQ(got_none[0].id, 7);
    EXPECT_EQ(got_none[0].offset, -100.0f);
    // RecentTokens, one token at a time, gives token_penalties' entries for every prefix (sorted
    // by id to compare), windows shorter and longer than the sequence, ids that enter, leave and
    // come back, biased ids among them.
    std::mt19937 rng(5);
    o.penalty_last_n = 64;
    o.logit_bias = {{2, 3.0f}, {39, -4.0f}, {5, 0.5f}};
    for (const int64_t window : {1, 2, 7, 50, 1000}) {
        RecentTokens recent(window, 40);
        std::vector<int32_t> seq;
        std::vector<PenaltyEntry> got;
        for (int i = 0; i < 300; ++i) {
            seq.push_back(int32_t(rng() % (i % 50 < 25 ? 6 : 40)));  // stretches of few ids
            recent.push(seq.back());
            recent.entries(o, got);
            std::sort(got.begin(), got.end(), [](const PenaltyEntry& a, const PenaltyEntry& b) { return a.id < b.id; });
            const std::vector<PenaltyEntry> want = token_penalties(o, window, seq.data(), int64_t(seq.size()));
            ASSERT_EQ(got.size(), want.size()) << "window " << window << " token " << i;
            for (size_t j = 0; j < want.size(); ++j) {
                ASSERT_EQ(got[j].id, want[j].id) << "window " << window << " token " << i;
                ASSERT_EQ(got[j].offset, want[j].offset) << "window " << window << " token " << i;
                ASSERT_EQ(got[j].repetition, want[j].repetition);
            }
        }
    }
    // Room per row: the window, the vocabulary, and without slide the context; the biased ids.
    o.logit_bias.clear();
    EXPECT_EQ(max_penalties(o, 1000, 50000, false), 64);
    o.logit_bias = {{2, 3.0f}, {39, -4.0f}};
    EXPECT_EQ(max_penalties(o, 1000, 50000, false), 66);
    EXPECT_EQ(max_penalties(o, 1000, 65, false), 65);
    o.logit_bias.clear();
    o.penalty_last_n = -1;
    EXPECT_EQ(max_penalties(o, 1000, 50000, false), 1000);
    EXPECT_EQ(max_penalties(o, 1000, 300, true), 300);
    o.penalty_last_n = 5000;
    EXPECT_EQ(max_penalties(o, 1000, 50000, false), 1000);
    EXPECT_EQ(max_penalties(o, 1000, 50000, true), 5000);
}

// generate() with token penalties and min-p draws what a plain loop draws from the unpenalised
// rows penalised by hand (counts over the last 6 tokens of prompt and output): greedy through
// forward_top's one candidate, top-k sampling, top-p without top-k (the whole row). A huge
// presence penalty over the whole context makes greedy decoding never repeat a token, the
// prompt's included; an engine opened without room for the penalties is refused up front.
TEST(Engine, TokenPenaltiesSteerGeneration) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 5});
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(7, cfg.vocab, 3), make_prompt(4, cfg.vocab, 4)};
    const int64_t V = cfg.vocab, max_new = 12, ctx = 24;
    SingleRank comm;  // outlives the sessions, which hold it
    auto open = [&](int64_t room) {
        SessionOptions so;
        so.model_dir = d.path();
        so.ctx = ctx;
        so.max_batch = 2;
        so.max_penalties = room;
        return open_session(so, comm);
    };
    struct Opt { float t; int64_t k; float p; float min_p; };
    for (const Opt o : {Opt{0, 40, 1, 0}, Opt{1.5f, 20, 1, 0.05f}, Opt{1.2f, 0, 0.9f, 0.02f}}) {
        GenerateOptions go;
        go.max_new_tokens = max_new;
        go.sampler.temperature = o.t;
        go.sampler.top_k = o.k;
        go.sampler.top_p = o.p;
        go.sampler.min_p = o.min_p;
        go.sampler.seed = 3;
        go.sampler.repetition_penalty = 1.75f;
        go.sampler.frequency_penalty = 0.25f;
        go.sampler.presence_penalty = 0.5f;
        go.sampler.penalty_last_n = 6;
        go.sampler.logit_bias = {{int32_t(V - 3), 2.5f}, {3, -1.25f}, {int32_t(V / 2), 0.75f}};
        auto s = open(max_penalties(go.sampler, ctx, V, false));
        const GenerateResult got = generate(*s->engine, prompts, go);

        // The plain loop: one sequence at a time, whole prompts, every row sampled from the host.
        auto ref = open(0);
        for (size_t b = 0; b < prompts.size(); ++b) {
            Sampler sampler(go.sampler, b);
            std::vector<int32_t> seq = prompts[b];
            std::vector<int32_t> out;
            std::vector<float> row(static_cast<size_t>(V));
            SeqChunk ch{int64_t(b), seq.data(), int64_t(seq.size()), 0, true};
            for (int64_t i = 0; i < max_new; ++i) {
                ref->engine->forward({ch}, row.data());
                std::map<int32_t, int> count;
                for (size_t j = seq.size() > 6 ? seq.size() - 6 : 0; j < seq.size(); ++j) count[seq[j]]++;
                std::map<int32_t, float> bias(go.sampler.logit_bias.begin(), go.sampler.logit_bias.end());
                for (const auto& [id, n] : count)
                    row[size_t(id)] = penalize(row[size_t(id)], 1.75f, 0.25f * float(n) + 0.5f - bias[id]);
                for (const auto& [id, v] : bias)
                    if (!count.count(id)) row[size_t(id)] = penalize(row[size_t(id)], 1.0f, -v);
                const int32_t id = sampler.sample(row.data(), V);
                out.push_back(id);
                if (std::find(cfg.eos_ids.begin(), cfg.eos_ids.end(), id) != cfg.eos_ids.end()) break;
                seq.push_back(id);
                ch = SeqChunk{int64_t(b), &seq.back(), 1, int64_t(seq.size()) - 1, true};
            }
            EXPECT_EQ(got.seqs[b].tokens, out) << "t " << o.t << " k " << o.k << " p " << o.p << " prompt " << b;
        }
        // Without them the same options generate something else.
        GenerateOptions plain = go;
        plain.sampler.repetition_penalty = 1;
        plain.sampler.frequency_penalty = plain.sampler.presence_penalty = 0;
        plain.sampler.logit_bias.clear();
        EXPECT_NE(generate(*open(0)->engine, prompts, plain).seqs[0].tokens, got.seqs[0].tokens) << "t " << o.t;
    }
    GenerateOptions go;
    go.max_new_tokens = max_new;
    go.sampler.temperature = 0;
    go.sampler.presence_penalty = 1e4f;
    go.sampler.penalty_last_n = -1;
    auto s = open(max_penalties(go.sampler, ctx, V, false));
    const GenerateResult r = generate(*s->engine, prompts, go);
    for (size_t b = 0; b < prompts.size(); ++b) {
        std::vector<int32_t> seen = prompts[b];
        for (int32_t id : r.seqs[b].tokens) {
            EXPECT_EQ(std::find(seen.begin(), seen.end(), id), seen.end()) << "prompt " << b << " repeats " << id;
            seen.push_back(id);
        }
    }
    EXPECT_THROW(generate(*open(0)->engine, prompts, go), Error);
}

// Logit bias: +100 on a token makes greedy decoding (forward_top's one candidate) and top-k
// sampling pick it every time, -100 on greedy's own choices makes it pick others; a bias with no
// penalties still reaches the engine's rows (a window of 0). An id outside the vocabulary is
// refused up front.
TEST(Engine, LogitBiasForcesAndBans) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 7});
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(5, cfg.vocab, 13), make_prompt(9, cfg.vocab, 14)};
    const int64_t V = cfg.vocab, ctx = 32;
    int32_t forced = 17;
    while (std::find(cfg.eos_ids.begin(), cfg.eos_ids.end(), forced) != cfg.eos_ids.end()) ++forced;
    SingleRank comm;
    auto run = [&](const SamplerOptions& so) {
        SessionOptions o;
        o.model_dir = d.path();
        o.ctx = ctx;
        o.max_batch = 2;
        o.max_penalties = max_penalties(so, ctx, V, false);
        auto s = open_session(o, comm);
        GenerateOptions go;
        go.max_new_tokens = 6;
        go.sampler = so;
        check_generate(s->cfg, s->engine->options(), prompts, go);
        return generate(*s->engine, prompts, go);
    };
    for (const int64_t k : {int64_t(40), int64_t(0)}) {  // candidates, whole rows
        SamplerOptions so;
        so.temperature = k == 0 ? 0.0f : 1.3f;
        so.top_k = k;
        so.top_p = 1;
        so.seed = 4;
        so.logit_bias = {{forced, 100.0f}};
        const GenerateResult r = run(so);
        for (const SequenceResult& q : r.seqs)
            for (const int32_t id : q.tokens) EXPECT_EQ(id, forced) << "top_k " << k;
    }
    SamplerOptions greedy;
    greedy.temperature = 0;
    const GenerateResult plain = run(greedy);
    SamplerOptions ban = greedy;
    std::vector<int32_t> chosen;
    for (const SequenceResult& q : plain.seqs)
        for (const int32_t id : q.tokens)
            if (std::find(chosen.begin(), chosen.end(), id) == chosen.end()) chosen.push_back(id);
    for (const int32_t id : chosen) ban.logit_bias.emplace_back(id, -100.0f);
    const GenerateResult banned = run(ban);
    for (const SequenceResult& q : banned.seqs)
        for (const int32_t id : q.tokens)
            EXPECT_EQ(std::find(chosen.begin(), chosen.end(), id), chosen.end()) << "banned token " << id;
    SamplerOptions bad = greedy;
    bad.logit_bias = {{int32_t(V), 1.0f}};
    EXPECT_THROW(run(bad), Error);
    bad.logit_bias = {{3, 1.0f}, {3, 2.0f}};
    EXPECT_THROW(run(bad), Error);
    bad.logit_bias = {{3, 101.0f}};
    EXPECT_THROW(run(bad), Error);
}

// --context-overflow slide: generation goes on past the context, shifting the cache each time a
// sequence fills it (sinks kept, the older half of the rest dropped); until the first shift it
// generates what a context large enough generates. Without slide, or with a prompt that does not
// fit, or sinks that leave nothing to slide over, it refuses up front.
TEST(Engine, ContextOverflowSlides) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 5});
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(6, cfg.vocab, 8), make_prompt(11, cfg.vocab, 9)};
    const int64_t ctx = 16, max_new = 50;
    auto gen = [&](int64_t c, bool slide, int64_t sinks) {
        SessionOptions so;
        so.model_dir = d.path();
        so.ctx = c;
        so.max_batch = 2;
        SingleRank comm;
        auto s = open_session(so, comm);
        GenerateOptions go;
        go.max_new_tokens = max_new;
        go.sampler.temperature = 0;
        go.slide = slide;
        go.sink_tokens = sinks;
        return generate(*s->engine, prompts, go);
    };
    const GenerateResult wide = gen(128, false, 4);
    const GenerateResult slid = gen(ctx, true, 4);
    EXPECT_GE(slid.timings.context_shifts, 4);
    for (size_t i = 0; i < prompts.size(); ++i) {
        const auto& a = slid.seqs[i].tokens;
        const auto& b = wide.seqs[i].tokens;
        // The prefill's token and one per decode step until the position reaches ctx.
        const size_t before_shift = size_t(ctx - int64_t(prompts[i].size()) + 1);
        ASSERT_GE(b.size(), before_shift);
        ASSERT_GE(a.size(), before_shift);
        EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + long(before_shift)),
                  std::vector<int32_t>(b.begin(), b.begin() + long(before_shift))) << "prompt " << i;
        if (slid.seqs[i].stop_reason == "length") {
            EXPECT_EQ(int64_t(a.size()), max_new);
        }
    }
    EXPECT_THROW(gen(ctx, false, 4), Error);   // 11 + 50 > 16 without slide
    EXPECT_THROW(gen(10, true, 4), Error);     // the prompt of 11 does not fit
    EXPECT_THROW(gen(ctx, true, 15), Error);   // nothing left to slide over
    EXPECT_THROW(gen(ctx, true, -1), Error);
    EXPECT_NO_THROW(gen(ctx, true, 14));       // two positions to slide over: one dropped per shift
}

// A model that slides on every layer keeps a ring of window + chunk - 1 positions (kv_capacity):
// generation runs to --ctx with it, a context shift (which needs the whole context cached) is
// refused up front, and a cache that holds the whole context still shifts.
TEST(Engine, SlidingWindowRingRunsToTheContextAndRefusesShifts) {
    TempDir d;
    ModelConfig cfg = tiny_config(Arch::Mistral);
    cfg.sliding_window = 4;
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 8});
    auto gen = [&](int64_t chunk, bool slide, int64_t max_new) {
        SessionOptions so;
        so.model_dir = d.path();
        so.ctx = 40;
        so.prefill_chunk = chunk;
        SingleRank comm;
        auto s = open_session(so, comm);
        EngineOptions eo = s->engine->options();
        EXPECT_EQ(kv_capacity(s->cfg, eo), chunk == 4 ? 7 : 40);
        GenerateOptions go;
        go.max_new_tokens = max_new;
        go.prefill_chunk = chunk;
        go.sampler.temperature = 0;
        go.slide = slide;
        return generate(*s->engine, {make_prompt(9, cfg.vocab, 3)}, go);
    };
    const GenerateResult ring = gen(4, false, 31), whole = gen(256, false, 31);
    EXPECT_EQ(ring.seqs[0].tokens, whole.seqs[0].tokens);  // the ring attends to what the full cache does
    EXPECT_THROW(gen(4, true, 60), Error);
    EXPECT_NO_THROW(gen(256, true, 60));
}

// A --prefill-chunk beyond what the cache slots can take (ctx x batch) sizes the workspace for the
// tokens that can come, not for the flag: 99999999999 used to end in "out of memory".
// A step workspace the allocator refuses (a --prefill-chunk x batch too large for the machine while
// the KV cache fits) is WorkspaceAllocError with the step and the buffer's bytes, which open_session
// turns into a line naming the flags; a size past 2^64 bytes is reported, not wrapped.
TEST(Engine, RefusedWorkspaceIsReported) {
#if defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "ASan aborts on a 2^58-byte request instead of returning null";
#endif
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 2});
    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 8;
    SingleRank comm;
    auto s = open_session(so, comm);
    EngineOptions eo = engine_options(so);
    eo.max_step_tokens = int64_t(1) << 50;  // x_ alone: 2^50 x hidden floats, past any address space
    try {
        CpuEngine e(s->cfg, s->weights, comm, eo);
        FAIL() << "a 2^50-token workspace was allocated";
    } catch (const WorkspaceAllocError& e) {
        EXPECT_EQ(e.step_tokens, eo.max_step_tokens);
        EXPECT_EQ(e.bytes, (size_t(1) << 50) * size_t(cfg.hidden) * sizeof(float));
    }
    eo.max_step_tokens = int64_t(1) << 62;  // x 64 floats x 4 bytes: the product wraps size_t
    try {
        CpuEngine e(s->cfg, s->weights, comm, eo);
        FAIL() << "a 2^62-token workspace was allocated";
    } catch (const WorkspaceAllocError& e) {
        EXPECT_EQ(e.bytes, SIZE_MAX);
    }
}

// A KV cache the allocator grants but the machine cannot back met the OOM killer: under
// overcommit the allocation succeeded and zeroing it killed the process. The cache is now weighed
// against the memory the machine can back first (core/host_memory.h; SHARDLM_HOST_MEM_AVAILABLE
// stands in for it here) and refused with a line naming the flags, the bytes and that figure.
TEST(Engine, KVCacheBeyondWhatTheMachineCanBackIsRefused) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 2});
    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 8;
    so.max_batch = 2;
    const KVCacheShape ks = kv_cache_shape(cfg, cfg.n_kv_heads, engine_options(so));
    const size_t bytes = kv_cache_bytes(ks);
    SingleRank comm;
    {
        const std::string less = std::to_string(bytes - 1);
        ScopedEnv env(kHostMemEnv, less.c_str());
        try {
            KVCache kv(ks);
            ADD_FAILURE() << "a KV cache of " << bytes << " bytes was allocated with " << less << " available";
        } catch (const KVCacheAllocError& e) {
            EXPECT_EQ(e.bytes, bytes);
            EXPECT_EQ(e.available, bytes - 1);
        }
        try {
            open_session(so, comm);
            ADD_FAILURE() << "the session opened";
        } catch (const Error& e) {
            EXPECT_EQ(std::string(e.what()), "--ctx 8 x batch 2: the KV cache needs 0.000 GiB (" + std::to_string(bytes) +
                                                 " bytes) but the machine can back only 0.000 GiB (" + less +
                                                 " bytes, SHARDLM_HOST_MEM_AVAILABLE)");
        }
    }
    {
        const std::string exact = std::to_string(bytes);
        ScopedEnv env(kHostMemEnv, exact.c_str());
        EXPECT_EQ(open_session(so, comm)->engine->kv_bytes(), bytes);
    }
    // The machine's own figure never refuses the test suite's small models.
    ScopedEnv env(kHostMemEnv, nullptr);
    EXPECT_EQ(open_session(so, comm)->engine->kv_bytes(), bytes);
}

TEST(Engine, PrefillChunkIsCappedByTheCache) {
    SessionOptions so;
    so.ctx = 64;
    so.max_batch = 3;
    so.prefill_chunk = 99999999999;
    EXPECT_EQ(engine_options(so).max_step_tokens, 64 * 3);
    so.prefill_chunk = 100;
    EXPECT_EQ(engine_options(so).max_step_tokens, 100);
    so.prefill_chunk = 1;
    EXPECT_EQ(engine_options(so).max_step_tokens, 3);  // at least one token per sequence
    so.ctx = std::numeric_limits<int64_t>::max();
    so.prefill_chunk = 99999999999;
    EXPECT_EQ(engine_options(so).max_step_tokens, 99999999999);  // no overflow in ctx x batch
}
