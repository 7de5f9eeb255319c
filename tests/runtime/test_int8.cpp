// INT8 weights (W8A16 and W8A8) and the INT8 KV cache on whole models, against FP32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "comm/communicator.h"
#include "core/error.h"
#include "fixtures.h"
#include "model/quantize_checkpoint.h"
#include "model/safetensors_writer.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

struct Logits {
    std::vector<std::vector<float>> rows;  // per prompt, at its last position
    std::vector<std::vector<int32_t>> tokens;
    size_t weight_bytes = 0;
};

Logits run(const std::string& dir, const LoadOptions& lo, KVFormat kv, const std::vector<std::vector<int32_t>>& prompts,
           int64_t max_new = 1) {
    SessionOptions so;
    so.model_dir = dir;
    so.load = lo;
    so.kv = kv;
    so.max_batch = int64_t(prompts.size());
    so.ctx = 96;
    SingleRank comm;
    auto s = open_session(so, comm);
    GenerateOptions go;
    go.max_new_tokens = max_new;
    go.sampler.temperature = 0;
    go.keep_prompt_logits = true;
    const GenerateResult r = generate(*s->engine, prompts, go);
    Logits out;
    for (const auto& q : r.seqs) {
        out.rows.push_back(q.prompt_logits);
        out.tokens.push_back(q.tokens);
    }
    out.weight_bytes = s->weights.bytes;
    return out;
}

LoadOptions fmt(WeightFormat f, int64_t group = 0, const std::string& keep = "") { return {f, group, keep}; }

class Int8Model : public ::testing::TestWithParam<Arch> {
protected:
    void SetUp() override {
        cfg_ = tiny_config(GetParam());
        write_synthetic_checkpoint(dir_.path(), cfg_, {DType::F32, 1, 51});
        for (int i = 0; i < 4; ++i) prompts_.push_back(make_prompt(10 + 7 * i, cfg_.vocab, uint64_t(60 + i)));
    }
    TempDir dir_;
    ModelConfig cfg_;
    std::vector<std::vector<int32_t>> prompts_;
};

}  // namespace

// Bounds: the issue's, for small random models whose logits have a standard deviation of ~6
// (ours: ~4, so these are looser relative to the logit scale than they look). Per-channel INT8
// keeps each weight within scale/2 = max|w|/254 of its value; the measured errors are ~3x below.
TEST_P(Int8Model, LogitsStayCloseToFp32) {
    const Logits ref = run(dir_.path(), fmt(WeightFormat::F32), KVFormat::F32, prompts_);
    struct Variant { const char* name; LoadOptions lo; KVFormat kv; double max_abs, min_cos; };
    const Variant variants[] = {
        {"int8", fmt(WeightFormat::Int8), KVFormat::F32, 0.95, 0.999},
        {"int8+kv8", fmt(WeightFormat::Int8), KVFormat::Int8, 0.95, 0.999},
        {"int8 g32+kv8", fmt(WeightFormat::Int8, 32), KVFormat::Int8, 0.95, 0.999},
        {"kv8", fmt(WeightFormat::F32), KVFormat::Int8, 0.5, 0.9995},
        {"w8a8+kv8", fmt(WeightFormat::W8A8), KVFormat::Int8, 1.25, 0.998},
        {"w8a8 g16", fmt(WeightFormat::W8A8, 16), KVFormat::F32, 1.25, 0.998},
    };
    for (const Variant& v : variants) {
        const Logits got = run(dir_.path(), v.lo, v.kv, prompts_);
        for (size_t i = 0; i < prompts_.size(); ++i) {
            EXPECT_LT(max_abs_diff(got.rows[i], ref.rows[i]), v.max_abs) << v.name << " prompt " << i;
            EXPECT_GT(cosine(got.rows[i], ref.rows[i]), v.min_cos) << v.name << " prompt " << i;
            EXPECT_GT(max_abs_diff(got.rows[i], ref.rows[i]), 0.0) << v.name << ": quantization changed nothing?";
        }
    }
}

TEST_P(Int8Model, GreedyTokensOnlyDifferWhereFp32IsUndecided) {
    const int64_t steps = 12;
    const Logits ref = run(dir_.path(), fmt(WeightFormat::F32), KVFormat::F32, prompts_, steps);
    const Logits q = run(dir_.path(), fmt(WeightFormat::Int8), KVFormat::Int8, prompts_, steps);
    for (size_t i = 0; i < prompts_.size(); ++i) {
        size_t k = 0;
        while (k < ref.tokens[i].size() && k < q.tokens[i].size() && ref.tokens[i][k] == q.tokens[i][k]) ++k;
        if (k == ref.tokens[i].size()) continue;
        // First divergence at step k: FP32's top two at that point must be within the noise.
        std::vector<int32_t> prefix = prompts_[i];
        prefix.insert(prefix.end(), ref.tokens[i].begin(), ref.tokens[i].begin() + long(k));
        const Logits at = run(dir_.path(), fmt(WeightFormat::F32), KVFormat::F32, {prefix});
        std::vector<float> row = at.rows[0];
        std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
        EXPECT_LT(row[0] - row[1], 2 * 0.95) << "prompt " << i << " diverged at step " << k;
    }
}

TEST_P(Int8Model, QuantizeThenLoadEqualsQuantizeOnLoad) {
    for (const LoadOptions& lo : {fmt(WeightFormat::Int8), fmt(WeightFormat::W8A8, 32, "q_proj"), fmt(WeightFormat::Int8, 0, "lm_head")}) {
        TempDir out;
        write_quantized_checkpoint(dir_.path(), out.path() + "/q", lo, /*shard_bytes=*/40000);  // several files
        const Logits a = run(dir_.path(), lo, KVFormat::Int8, prompts_, 4);
        const Logits b = run(out.path() + "/q", fmt(WeightFormat::Auto), KVFormat::Int8, prompts_, 4);
        for (size_t i = 0; i < prompts_.size(); ++i) {
            EXPECT_EQ(a.rows[i], b.rows[i]) << "prompt " << i;  // bit for bit
            EXPECT_EQ(a.tokens[i], b.tokens[i]);
        }
        EXPECT_EQ(a.weight_bytes, b.weight_bytes);
        // Every tensor of the quantized checkpoint starts on a 128-byte boundary.
        Checkpoint ck(out.path() + "/q");
        const TensorInfo& t = ck.get("model.layers.1.mlp.down_proj.weight");
        EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 128, 0u);
    }
}

INSTANTIATE_TEST_SUITE_P(Archs, Int8Model, ::testing::Values(Arch::Llama, Arch::Qwen3),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

TEST(Int8, WeightBytesAtMost55PercentOfFp16) {
    TempDir d;
    write_synthetic_checkpoint(d.path(), synthetic_config("tiny"), {DType::BF16, 1, 52});
    const std::vector<std::vector<int32_t>> p = {{1, 2, 3}};
    const Logits f16 = run(d.path(), fmt(WeightFormat::Auto), KVFormat::F32, p);
    const Logits i8 = run(d.path(), fmt(WeightFormat::Int8), KVFormat::F32, p);
    EXPECT_LE(double(i8.weight_bytes), 0.55 * double(f16.weight_bytes));
}

TEST(Int8, BadInput) {
    TempDir d;
    write_synthetic_checkpoint(d.path(), tiny_config(Arch::Llama), {DType::F32, 1, 53});
    const std::vector<std::vector<int32_t>> p = {{1, 2, 3}};
    auto error_of = [&](const std::string& dir, const LoadOptions& lo) {
        try {
            run(dir, lo, KVFormat::F32, p);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(error_of(d.path(), fmt(WeightFormat::Int8, 0, "q_proj[")).find("--keep-fp16: invalid regex"), std::string::npos);
    EXPECT_NE(error_of(d.path(), fmt(WeightFormat::Int8, 48)).find("--group-size 48 does not divide"), std::string::npos);

    TempDir q;
    write_quantized_checkpoint(d.path(), q.path() + "/m", fmt(WeightFormat::Int8));
    const std::string m = q.path() + "/m";
    EXPECT_NE(error_of(m, fmt(WeightFormat::F32)).find("pre-quantized"), std::string::npos);
    // A scale tensor that goes missing, or has the wrong shape.
    {
        SafetensorsFile f(m + "/model.safetensors");
        std::vector<TensorToWrite> ts;
        for (const auto& kv : f.tensors())
            if (kv.first != "model.layers.0.self_attn.k_proj.weight_scale" && kv.first.rfind("__pad_", 0) != 0)
                ts.push_back({kv.first, kv.second.dtype_str, kv.second.shape,
                              std::vector<uint8_t>(kv.second.data, kv.second.data + kv.second.nbytes)});
        write_safetensors(m + "/model.safetensors", ts, true);
    }
    EXPECT_NE(error_of(m, fmt(WeightFormat::Auto)).find("missing tensor model.layers.0.self_attn.k_proj.weight_scale"),
              std::string::npos);
    // Another tool's quantization config.
    std::string cfg = read_file(m + "/config.json");
    cfg.replace(cfg.find("\"shardlm\""), 9, "\"bitsandbytes\"");
    write_file(m + "/config.json", cfg);
    EXPECT_NE(error_of(m, fmt(WeightFormat::Auto)).find("quant_method \"bitsandbytes\" is not supported"), std::string::npos);
}
