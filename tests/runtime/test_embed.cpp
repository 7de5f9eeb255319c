// Embeddings (runtime/embed.h): pooling through the engine's slots, chunks and steps gives what one
// input run alone gives; the sentence-transformers files are read or refused by name. (The
// vectors against the NumPy reference of the HF forward pass: tests/cli/test_reference.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "comm/communicator.h"
#include "core/error.h"
#include "fixtures.h"
#include "runtime/embed.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

std::vector<std::vector<float>> run_embed(const std::string& dir, const std::vector<std::vector<int32_t>>& inputs,
                                          int64_t slots, int64_t chunk, const EmbedOptions& eo) {
    SessionOptions so;
    so.model_dir = dir;
    so.max_batch = slots;
    so.ctx = 40;
    so.prefill_chunk = chunk;
    so.max_logit_rows = slots;  // mean pooling's hidden steps hand out a row per token past it
    SingleRank comm;
    auto s = open_session(so, comm);
    return embed(*s->engine, inputs, eo);
}

double norm(const std::vector<float>& v) {
    double sq = 0;
    for (float x : v) sq += double(x) * x;
    return std::sqrt(sq);
}

}  // namespace

// Five inputs of 1 to 37 tokens through 2 slots in chunks of 3 (so inputs wait for a slot, steps
// hold several inputs' chunks, and a last-token row and a mean's rows land mid-step) equal each
// input run alone in one chunk; normalized vectors have norm 1 after the Matryoshka cut.
TEST(Embed, SlotsAndChunksChangeNothing) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 5});
    std::vector<std::vector<int32_t>> inputs;
    for (int64_t n : {7, 1, 37, 3, 12}) inputs.push_back(make_prompt(n, cfg.vocab, uint64_t(n)));
    for (const Pooling p : {Pooling::Last, Pooling::Mean, Pooling::Cls}) {
        EmbedOptions eo;
        eo.pooling = p;
        eo.normalize = false;
        eo.chunk = 3;
        const auto packed = run_embed(d.path(), inputs, 2, 3, eo);
        ASSERT_EQ(packed.size(), inputs.size());
        for (size_t i = 0; i < inputs.size(); ++i) {
            EmbedOptions one = eo;
            one.chunk = 256;
            const auto alone = run_embed(d.path(), {inputs[i]}, 1, 256, one);
            ASSERT_EQ(packed[i].size(), size_t(cfg.hidden));
            EXPECT_LT(max_abs_diff(packed[i], alone[0]), 1e-4) << pooling_name(p) << " input " << i;
        }
        // The pools differ from each other (a mix-up of rows would make two of them agree).
        if (p == Pooling::Mean) {
            EmbedOptions last = eo;
            last.pooling = Pooling::Last;
            EXPECT_GT(max_abs_diff(packed[2], run_embed(d.path(), {inputs[2]}, 1, 256, last)[0]), 1e-2);
        }
        EmbedOptions cut = eo;
        cut.normalize = true;
        cut.dimensions = 10;
        const auto normed = run_embed(d.path(), inputs, 2, 3, cut);
        for (size_t i = 0; i < inputs.size(); ++i) {
            ASSERT_EQ(normed[i].size(), 10u);
            EXPECT_NEAR(norm(normed[i]), 1.0, 1e-5);
            const double n10 = norm(std::vector<float>(packed[i].begin(), packed[i].begin() + 10));
            for (size_t h = 0; h < 10; ++h) EXPECT_NEAR(normed[i][h], packed[i][h] / n10, 1e-4);
        }
    }
}

// An untied checkpoint without lm_head.weight (an embedding model saved from the base class) loads
// for embeddings only: the same vectors as with its head, every logits step refused by name; the
// other commands still refuse the missing tensor, and a tied model is unaffected.
// Requests take the slots in turn: a request added while another's inputs run gets the next free
// slot after one more of the earlier one's (round robin), not after all of them, and each input's
// vector is its own alone.
TEST(Embed, PoolerTakesRequestsInTurn) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 6});
    SessionOptions so;
    so.model_dir = d.path();
    so.max_batch = 1;
    so.ctx = 40;
    so.prefill_chunk = 4;
    SingleRank comm;
    auto s = open_session(so, comm);
    EmbedOptions eo;
    eo.chunk = 4;
    eo.normalize = false;
    std::vector<std::vector<int32_t>> first, second = {make_prompt(5, cfg.vocab, 50)};
    for (int64_t i = 0; i < 5; ++i) first.push_back(make_prompt(6 + i, cfg.vocab, uint64_t(i) + 20));
    Pooler pooler = embed_pooler(*s->engine, eo);
    EXPECT_TRUE(pooler.idle());
    pooler.add(7, first);
    std::vector<std::pair<int64_t, int64_t>> order;
    std::map<std::pair<int64_t, int64_t>, std::vector<float>> got;
    auto run = [&] {
        for (Pooler::Done& x : pooler.step()) {
            order.emplace_back(x.request, x.index);
            got[{x.request, x.index}] = std::move(x.pooled);
        }
    };
    run();  // the first input's first chunk
    EXPECT_EQ(pooler.last_step_tokens(), 4);
    pooler.add(9, second);
    while (!pooler.idle()) run();
    const std::vector<std::pair<int64_t, int64_t>> want = {{7, 0}, {7, 1}, {9, 0}, {7, 2}, {7, 3}, {7, 4}};
    EXPECT_EQ(order, want);
    const auto a = embed(*s->engine, first, eo), b = embed(*s->engine, second, eo);
    for (size_t i = 0; i < first.size(); ++i) EXPECT_LT(max_abs_diff(got[{7, int64_t(i)}], a[i]), 1e-5) << i;
    EXPECT_LT(max_abs_diff(got[{9, 0}], b[0]), 1e-5);
}

TEST(Embed, HeadlessCheckpointsGiveEmbeddingsOnly) {
    TempDir full, bare;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    ASSERT_FALSE(cfg.tie_embeddings);
    write_synthetic_checkpoint(full.path(), cfg, {DType::BF16, 1, 8});
    write_without_model_prefix(full.path(), bare.path());
    SessionOptions so;
    so.max_batch = 2;
    so.ctx = 32;
    so.prefill_chunk = 4;
    SingleRank comm;
    so.model_dir = bare.path();
    EXPECT_NE(thrown_error([&] { open_session(so, comm); }).find("missing tensor lm_head.weight"), std::string::npos);
    so.load.headless_ok = true;
    auto headless = open_session(so, comm);
    EXPECT_TRUE(headless->weights.headless);
    so.model_dir = full.path();
    auto headed = open_session(so, comm);
    EXPECT_FALSE(headed->weights.headless);
    const std::vector<std::vector<int32_t>> inputs = {make_prompt(9, cfg.vocab, 1), make_prompt(3, cfg.vocab, 2)};
    for (const Pooling p : {Pooling::Last, Pooling::Mean}) {
        EmbedOptions eo;
        eo.pooling = p;
        eo.chunk = 4;
        const auto a = embed(*headless->engine, inputs, eo), b = embed(*headed->engine, inputs, eo);
        for (size_t i = 0; i < inputs.size(); ++i) EXPECT_EQ(a[i], b[i]) << pooling_name(p) << " " << i;
    }
    std::vector<float> logits(size_t(cfg.vocab));
    const std::vector<SeqChunk> step = {{0, inputs[0].data(), 2, 0, true}};
    EXPECT_NE(thrown_error([&] { headless->engine->forward(step, logits.data()); }).find("loaded without an lm_head"),
              std::string::npos);
    std::vector<float> vals(4);
    std::vector<int32_t> ids(4);
    EXPECT_NE(thrown_error([&] { headless->engine->forward_top(step, 4, vals.data(), ids.data()); }).find("not logits"),
              std::string::npos);
    // A tied model has its head whatever the option says.
    TempDir tied;
    write_synthetic_checkpoint(tied.path(), tiny_config(Arch::Qwen3), {DType::BF16, 1, 8});
    so.model_dir = tied.path();
    EXPECT_FALSE(open_session(so, comm)->weights.headless);
}

TEST(Embed, RefusesBadInputs) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 5});
    EmbedOptions eo;
    auto err = [&](const std::vector<std::vector<int32_t>>& in, int64_t dims) {
        EmbedOptions o = eo;
        o.dimensions = dims;
        return thrown_error([&] { run_embed(d.path(), in, 2, 8, o); });
    };
    EXPECT_NE(err({{1, 2}, {}}, 0).find("input 1 has no tokens"), std::string::npos);
    EXPECT_NE(err({std::vector<int32_t>(41, 3)}, 0).find("input 0 has 41 tokens, more than the context of 40"),
              std::string::npos);
    EXPECT_NE(err({{1, int32_t(cfg.vocab)}}, 0).find("input 0: token id"), std::string::npos);
    EXPECT_NE(err({{1, 2}}, cfg.hidden + 1).find("dimensions"), std::string::npos);
}

TEST(Embed, ReadsSentenceTransformersFiles) {
    TempDir d;
    // No modules.json: the last token, normalized (what the decoder embedding models do).
    EmbeddingConfig ec = load_embedding_config(d.path());
    EXPECT_EQ(ec.pooling, Pooling::Last);
    EXPECT_TRUE(ec.normalize);
    std::filesystem::create_directories(d.file("1_Pooling"));
    write_file(d.file("modules.json"),
               R"([{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
                   {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
                   {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}])");
    write_file(d.file("1_Pooling/config.json"),
               R"({"word_embedding_dimension":64,"pooling_mode_cls_token":false,"pooling_mode_mean_tokens":true,
                   "pooling_mode_max_tokens":false,"pooling_mode_lasttoken":false,"include_prompt":true})");
    write_file(d.file("config_sentence_transformers.json"),
               R"({"prompts":{"query":"Instruct: find\nQuery:","document":""},"default_prompt_name":null})");
    ec = load_embedding_config(d.path());
    EXPECT_EQ(ec.pooling, Pooling::Mean);
    EXPECT_TRUE(ec.normalize);
    EXPECT_EQ(ec.prompts.at("query"), "Instruct: find\nQuery:");
    EXPECT_EQ(ec.default_prompt, "");
    // Without the Normalize module the vectors stay as pooled.
    write_file(d.file("modules.json"),
               R"([{"type":"sentence_transformers.models.Transformer","path":""},
                   {"type":"sentence_transformers.models.Pooling","path":"1_Pooling"}])");
    EXPECT_FALSE(load_embedding_config(d.path()).normalize);

    auto err = [&](const std::string& modules, const std::string& pooling, const std::string& st) {
        write_file(d.file("modules.json"), modules);
        write_file(d.file("1_Pooling/config.json"), pooling);
        write_file(d.file("config_sentence_transformers.json"), st);
        return thrown_error([&] { load_embedding_config(d.path()); });
    };
    const std::string mods =
        R"([{"type":"sentence_transformers.models.Transformer","path":""},{"type":"sentence_transformers.models.Pooling","path":"1_Pooling"}])";
    const std::string last = R"({"pooling_mode_lasttoken":true})";
    EXPECT_NE(err(mods, R"({"pooling_mode_max_tokens":true})", "{}").find("pooling_mode_max_tokens is not supported"),
              std::string::npos);
    EXPECT_NE(err(mods, R"({"pooling_mode_lasttoken":true,"pooling_mode_mean_tokens":true})", "{}").find("several pooling modes"),
              std::string::npos);
    EXPECT_NE(err(mods, R"({"pooling_mode_mean_tokens":true,"include_prompt":false})", "{}").find("include_prompt false"),
              std::string::npos);
    EXPECT_EQ(err(mods, R"({"pooling_mode_lasttoken":true,"include_prompt":false})", "{}"), "");
    EXPECT_NE(err(R"([{"type":"sentence_transformers.models.Transformer","path":""},{"type":"sentence_transformers.models.Pooling","path":"1_Pooling"},{"type":"sentence_transformers.models.Dense","path":"2_Dense"}])",
                  last, "{}")
                  .find("sentence_transformers.models.Dense\" is not supported"),
              std::string::npos);
    EXPECT_NE(err(R"([{"type":"sentence_transformers.models.Transformer","path":"0_Transformer"},{"type":"sentence_transformers.models.Pooling","path":"1_Pooling"}])",
                  last, "{}")
                  .find("subfolder \"0_Transformer\""),
              std::string::npos);
    EXPECT_NE(err(R"([{"type":"sentence_transformers.models.Transformer","path":""}])", last, "{}").find("no Pooling module"),
              std::string::npos);
    EXPECT_NE(err(mods, last, R"({"prompts":{"query":"q: "},"default_prompt_name":"passage"})").find("default_prompt_name \"passage\""),
              std::string::npos);
    EXPECT_NE(err(mods, "{", "{}").find("1_Pooling/config.json: malformed JSON"), std::string::npos);
    EXPECT_EQ(err(mods, last, R"({"prompts":{"query":"q: "},"default_prompt_name":"query"})"), "");
    EXPECT_EQ(load_embedding_config(d.path()).default_prompt, "q: ");
    EXPECT_NE(thrown_error([] { parse_pooling("max"); }).find("--pooling \"max\""), std::string::npos);
}
