// shardlm against an independent NumPy implementation of the Hugging Face forward pass
// (tests/reference/hf_forward.py): same greedy tokens, last-prompt logits within 0.01.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "model/synthetic.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

bool have_numpy() { return run_command("/usr/bin/python3 -c 'import numpy'").exit_code == 0; }

void compare(const ModelConfig& cfg, const SyntheticOptions& so, const std::string& weights,
             const std::string& flags = "") {
    if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 with numpy is needed (apt-get install python3-numpy)";
    TempDir d;
    write_synthetic_checkpoint(d.path(), cfg, so);
    const std::string ids = "5,17,99,3,250,8,42,7,300,11,64,2;9,9,120,33";
    const std::string logits = d.file("logits.json");
    const CommandResult ours = run_command(std::string(SHARDLM_BIN) + " generate --model " + d.path() +
                                           " --prompt-ids '" + ids + "' --max-new-tokens 8 --temperature 0 --kv fp32"
                                           " --weights " + weights + " --json --dump-logits " + logits + flags);
    ASSERT_EQ(ours.exit_code, 0) << ours.err;
    const CommandResult ref = run_command("/usr/bin/python3 " SHARDLM_SOURCE_DIR "/tests/reference/hf_forward.py --model " +
                                          d.path() + " --prompt-ids '" + ids + "' --max-new-tokens 8");
    ASSERT_EQ(ref.exit_code, 0) << ref.err;
    const auto a = nlohmann::json::parse(ours.out), b = nlohmann::json::parse(ref.out);
    const auto la = nlohmann::json::parse(read_file(logits));
    for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(a["results"][i]["tokens"], b["results"][i]["tokens"]) << "prompt " << i;
        const auto x = la[i].get<std::vector<float>>(), y = b["results"][i]["last_logits"].get<std::vector<float>>();
        EXPECT_LT(max_abs_diff(x, y), 0.01) << "prompt " << i;
    }
}

ModelConfig llama3_scaled() {
    ModelConfig c = tiny_config(Arch::Llama);
    c.rope.kind = RopeScaling::Kind::Llama3;
    c.rope.factor = 8;
    c.rope.original_max_position = 64;
    c.rope_theta = 500000;
    return c;
}

// YaRN with theta 1000 over an original context of 1024 positions: the ramp runs from dimension
// 1 to 6 of 8 (head_dim 16) and 3 to 12 of 16 (Qwen3's 32), so a 20-token run turns kept, ramped
// and slowed dimensions alike; with its attention factor (scores times its square).
ModelConfig yarn_scaled(Arch arch) {
    ModelConfig c = tiny_config(arch);
    c.rope_theta = 1000;
    c.rope.kind = RopeScaling::Kind::Yarn;
    c.rope.factor = 4;
    c.rope.original_max_position = 1024;
    c.rope.attention_factor = 1.1386294f;
    return c;
}

}  // namespace

TEST(Reference, YarnAndLinearRope) {
    compare(yarn_scaled(Arch::Qwen3), {DType::F32, 1, 31}, "auto");
    ModelConfig a = yarn_scaled(Arch::Llama);
    a.rope.attention_factor = 1.7f;  // large enough to move the logits well past the tolerance
    compare(a, {DType::BF16, 1, 32}, "auto");
    ModelConfig l = tiny_config(Arch::Llama);
    l.rope.kind = RopeScaling::Kind::Linear;
    l.rope.factor = 2;
    compare(l, {DType::F32, 1, 33}, "auto");
}

TEST(Reference, LlamaF32) { compare(tiny_config(Arch::Llama), {DType::F32, 1, 21}, "auto"); }
TEST(Reference, LlamaScaledRopeBF16Sharded) { compare(llama3_scaled(), {DType::BF16, 2, 22}, "auto"); }
TEST(Reference, MistralF16) { compare(tiny_config(Arch::Mistral), {DType::F16, 1, 23}, "auto"); }
TEST(Reference, Qwen2BF16) { compare(tiny_config(Arch::Qwen2), {DType::BF16, 1, 24}, "auto"); }
TEST(Reference, Qwen3F16Sharded) { compare(tiny_config(Arch::Qwen3), {DType::F16, 3, 25}, "fp32"); }
TEST(Reference, Qwen3Synthetic) { compare(synthetic_config("tiny"), {DType::BF16, 1, 26}, "auto"); }

// Sliding-window attention: the 12-token prompt and the 8 generated tokens reach well past a
// window of 5. Mistral slides on every layer, so its cache is a ring of window + prefill chunk - 1
// positions: with --prefill-chunk 3 it wraps many times (7 rows for 20 positions), in prefill
// chunks and in decode. Qwen2 with use_sliding_window slides from max_window_layers on only
// (layer 1 of 2 here) over a cache of the whole context.
TEST(Reference, MistralSlidingWindowRing) {
    ModelConfig c = tiny_config(Arch::Mistral);
    c.sliding_window = 5;
    compare(c, {DType::F32, 1, 27}, "auto");
    compare(c, {DType::F32, 1, 27}, "auto", " --prefill-chunk 3");
    compare(c, {DType::BF16, 1, 28}, "auto", " --prefill-chunk 3 --attention naive");
}

TEST(Reference, Qwen2SlidingWindowFromALayer) {
    ModelConfig c = tiny_config(Arch::Qwen2);
    c.sliding_window = 4;
    c.window_from_layer = 1;
    compare(c, {DType::F32, 1, 29}, "auto", " --prefill-chunk 5");
}

// shardlm embed's pooled vectors against the reference's final hidden states, pooled alike: three
// inputs (one longer than --prefill-chunk) through two slots, last/mean/cls, not normalized and
// normalized; a Llama with untied embeddings, and a tied Qwen3 saved as the base model class
// (Qwen3-Embedding's layout: no "model." prefix, no lm_head).
// shardlm classify against the reference's ...ForSequenceClassification: the score head on the
// last token's final hidden state, for an untied F32 Llama and a tied BF16 Qwen3 (3 labels each),
// through 2 slots in chunks of 5.
TEST(Reference, ClassifiersScoreTheLastToken) {
    if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 with numpy is needed (apt-get install python3-numpy)";
    const std::string ids = "5,17,99,3,250,8,42,7,300,11,64,2;9;120,33,4";
    for (const auto& [arch, dtype] : {std::pair<Arch, DType>{Arch::Llama, DType::F32}, {Arch::Qwen3, DType::BF16}}) {
        TempDir lm, cls;
        const ModelConfig cfg = tiny_config(arch);
        write_synthetic_checkpoint(lm.path(), cfg, {dtype, 1, 43});
        std::vector<float> score(size_t(3 * cfg.hidden));
        for (size_t i = 0; i < score.size(); ++i) score[i] = float(std::sin(0.37 * double(i))) * 0.2f;
        write_classifier(lm.path(), cls.path(), {"a", "b", "c"}, score);
        // Then with a pad_token_id (2) that some inputs end with, one is all pads: the row is the
        // rightmost other token (the first when there is none).
        for (const std::string& prompts : {ids, ids + ";7,8,2,2;2,2,2;2,5,2"}) {
            if (prompts != ids) {
                nlohmann::json c = nlohmann::json::parse(read_file(cls.file("config.json")));
                c["pad_token_id"] = 2;
                write_file(cls.file("config.json"), c.dump());
            }
            const CommandResult ref = run_command("/usr/bin/python3 " SHARDLM_SOURCE_DIR "/tests/reference/hf_forward.py --model " +
                                                  cls.path() + " --prompt-ids '" + prompts + "' --classify");
            ASSERT_EQ(ref.exit_code, 0) << ref.err;
            const auto want = nlohmann::json::parse(ref.out)["results"];
            const CommandResult ours = run_command(std::string(SHARDLM_BIN) + " classify --model " + cls.path() + " --prompt-ids '" +
                                                   prompts + "' --batch 2 --prefill-chunk 5 --json");
            ASSERT_EQ(ours.exit_code, 0) << ours.err;
            const auto got = nlohmann::json::parse(ours.out);
            EXPECT_EQ(got["labels"], nlohmann::json({"a", "b", "c"}));
            ASSERT_EQ(got["data"].size(), want.size());
            for (size_t i = 0; i < want.size(); ++i)
                EXPECT_LT(max_abs_diff(got["data"][i]["logits"].get<std::vector<float>>(), want[i]["logits"].get<std::vector<float>>()),
                          2e-4)
                    << arch_name(arch) << " input " << i << " of " << prompts;
            if (prompts != ids) {  // "7,8,2,2" reads 8's row: 7,8's logits
                EXPECT_LT(max_abs_diff(got["data"][3]["logits"].get<std::vector<float>>(), want[3]["logits"].get<std::vector<float>>()), 2e-4);
                const CommandResult short_one = run_command(std::string(SHARDLM_BIN) + " classify --model " + cls.path() +
                                                            " --prompt-ids 7,8 --json");
                EXPECT_LT(max_abs_diff(got["data"][3]["logits"].get<std::vector<float>>(),
                                       nlohmann::json::parse(short_one.out)["data"][0]["logits"].get<std::vector<float>>()),
                          1e-5);
            }
        }
    }
}

TEST(Reference, EmbeddingsPoolTheFinalHiddenStates) {
    if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 with numpy is needed (apt-get install python3-numpy)";
    TempDir llama, qwen, bare;
    write_synthetic_checkpoint(llama.path(), tiny_config(Arch::Llama), {DType::F32, 1, 41});
    write_synthetic_checkpoint(qwen.path(), tiny_config(Arch::Qwen3), {DType::BF16, 1, 42});
    write_without_model_prefix(qwen.path(), bare.path());
    const std::string ids = "5,17,99,3,250,8,42,7,300,11,64,2;9;120,33,4";
    for (const std::string& dir : {llama.path(), bare.path()})
        for (const char* pooling : {"last", "mean", "cls"}) {
            const CommandResult ref = run_command("/usr/bin/python3 " SHARDLM_SOURCE_DIR "/tests/reference/hf_forward.py --model " +
                                                  dir + " --prompt-ids '" + ids + "' --embed " + pooling);
            ASSERT_EQ(ref.exit_code, 0) << ref.err;
            const auto want = nlohmann::json::parse(ref.out)["results"];
            for (const bool normalize : {false, true}) {
                const CommandResult ours =
                    run_command(std::string(SHARDLM_BIN) + " embed --model " + dir + " --prompt-ids '" + ids +
                                "' --batch 2 --prefill-chunk 5 --json --pooling " + pooling +
                                (normalize ? " --normalize" : " --no-normalize"));
                ASSERT_EQ(ours.exit_code, 0) << ours.err;
                const auto got = nlohmann::json::parse(ours.out);
                EXPECT_EQ(got["pooling"], pooling);
                ASSERT_EQ(got["data"].size(), 3u);
                for (size_t i = 0; i < 3; ++i) {
                    std::vector<float> w = want[i]["embedding"].get<std::vector<float>>();
                    if (normalize) {
                        double sq = 0;
                        for (float x : w) sq += double(x) * x;
                        for (float& x : w) x = float(x / std::sqrt(sq));
                    }
                    EXPECT_LT(max_abs_diff(got["data"][i]["embedding"].get<std::vector<float>>(), w), 2e-4)
                        << dir << " " << pooling << (normalize ? " normalized" : "") << " input " << i;
                }
            }
        }
}
