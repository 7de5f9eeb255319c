// Sequence classification (runtime/classify.h): a checkpoint's score head and a causal LM's token
// logits are two paths to one number (a score head made of lm_head rows must give those tokens'
// logits), the loop through slots and chunks changes nothing, and the probabilities and
// relevance follow transformers' pipeline. (Against the NumPy reference of the HF forward pass:
// tests/cli/test_reference.cpp.)
#include <gtest/gtest.h>

#include <cmath>

#include "comm/communicator.h"
#include "core/error.h"
#include "fixtures.h"
#include "model/config.h"
#include "runtime/classify.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

std::unique_ptr<Session> open_classifier(const std::string& dir, int64_t slots, int64_t chunk, Communicator& comm) {
    SessionOptions so;
    so.model_dir = dir;
    so.max_batch = slots;
    so.ctx = 40;
    so.prefill_chunk = chunk;
    so.load.headless_ok = true;
    return open_session(so, comm);
}

const char* vocab_matrix(const ModelConfig& c) { return c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"; }

}  // namespace

TEST(Classify, ScoreHeadsOfLmHeadRowsGiveThoseTokensLogits) {
    for (const Arch arch : {Arch::Qwen3, Arch::Llama}) {
        TempDir lm, cls;
        const ModelConfig cfg = tiny_config(arch);
        write_synthetic_checkpoint(lm.path(), cfg, {DType::F32, 1, 31});
        const std::vector<int32_t> toks = {7, 42};
        write_classifier(lm.path(), cls.path(), {"no", "yes"}, checkpoint_rows(lm.path(), vocab_matrix(cfg), toks));
        const std::vector<std::vector<int32_t>> inputs = {make_prompt(13, cfg.vocab, 1), make_prompt(1, cfg.vocab, 2),
                                                          make_prompt(29, cfg.vocab, 3), make_prompt(5, cfg.vocab, 4),
                                                          make_prompt(8, cfg.vocab, 5)};
        SingleRank comm;
        auto causal = open_classifier(lm.path(), 2, 3, comm);
        auto seqcls = open_classifier(cls.path(), 2, 3, comm);
        EXPECT_FALSE(causal->weights.headless);
        EXPECT_TRUE(seqcls->weights.headless);
        EXPECT_EQ(seqcls->cfg.head, Head::Classifier);
        // Its parameters: the causal model's, less an untied lm_head, plus the score rows.
        EXPECT_EQ(parameter_count(seqcls->cfg),
                  parameter_count(causal->cfg) - (cfg.tie_embeddings ? 0 : cfg.vocab * cfg.hidden) + 2 * cfg.hidden);
        const Classifier by_tokens = make_classifier(causal->cfg, causal->weights, {{"no", 7}, {"yes", 42}});
        const Classifier by_score = make_classifier(seqcls->cfg, seqcls->weights, {});
        EXPECT_EQ(by_score.labels, (std::vector<std::string>{"no", "yes"}));
        const auto a = classify(*causal->engine, by_tokens, inputs, 3);
        const auto b = classify(*seqcls->engine, by_score, inputs, 3);
        ASSERT_EQ(a.size(), inputs.size());
        for (size_t i = 0; i < inputs.size(); ++i) {
            // Each input alone through one slot in one step: the logits forward() gives.
            auto alone = open_classifier(lm.path(), 1, 40, comm);
            std::vector<float> logits(size_t(cfg.vocab));
            alone->engine->forward({{0, inputs[i].data(), int64_t(inputs[i].size()), 0, true}}, logits.data());
            const std::vector<float> want = {logits[7], logits[42]};
            EXPECT_LT(max_abs_diff(a[i], want), 1e-5) << arch_name(arch) << " input " << i;
            EXPECT_LT(max_abs_diff(b[i], want), 1e-4) << arch_name(arch) << " input " << i;
            EXPECT_NEAR(relevance(by_score, b[i]), 1 / (1 + std::exp(double(want[0]) - want[1])), 1e-5);
        }
        // A one-label head of yes - no (vLLM's Qwen3-Reranker conversion) scores the same.
        TempDir one;
        std::vector<float> diff = checkpoint_rows(lm.path(), vocab_matrix(cfg), {42});
        const std::vector<float> no = checkpoint_rows(lm.path(), vocab_matrix(cfg), {7});
        for (size_t k = 0; k < diff.size(); ++k) diff[k] -= no[k];
        write_classifier(lm.path(), one.path(), {"LABEL_0"}, diff);
        auto single = open_classifier(one.path(), 2, 3, comm);
        const Classifier one_label = make_classifier(single->cfg, single->weights, {});
        const auto c = classify(*single->engine, one_label, inputs, 3);
        for (size_t i = 0; i < inputs.size(); ++i)
            EXPECT_NEAR(relevance(one_label, c[i]), relevance(by_tokens, a[i]), 2e-5) << arch_name(arch) << " input " << i;
    }
}

TEST(Classify, ProbabilitiesAndRelevanceFollowThePipeline) {
    Classifier two;
    two.labels = {"a", "b"};
    const std::vector<float> p = class_probabilities(two, {1.0f, 3.0f});
    EXPECT_NEAR(p[0], 1 / (1 + std::exp(2.0)), 1e-6);
    EXPECT_NEAR(p[1], 1 / (1 + std::exp(-2.0)), 1e-6);
    EXPECT_NEAR(relevance(two, {1.0f, 3.0f}), p[1], 1e-6);
    Classifier one;
    one.labels = {"LABEL_0"};
    EXPECT_NEAR(class_probabilities(one, {0.5f})[0], 1 / (1 + std::exp(-0.5)), 1e-6);
    EXPECT_NEAR(relevance(one, {0.5f}), 1 / (1 + std::exp(-0.5)), 1e-6);
    Classifier multi = two;
    multi.multi_label = true;
    const std::vector<float> m = class_probabilities(multi, {1.0f, 3.0f});
    EXPECT_NEAR(m[0], 1 / (1 + std::exp(-1.0)), 1e-6);
    EXPECT_NEAR(m[1], 1 / (1 + std::exp(-3.0)), 1e-6);
    EXPECT_NE(thrown_error([&] { check_relevance(multi); }).find("2 independent labels"), std::string::npos);
    Classifier three;
    three.labels = {"a", "b", "c"};
    const std::vector<float> q = class_probabilities(three, {1000.0f, 999.0f, -5.0f});  // no overflow
    EXPECT_NEAR(q[0] + q[1] + q[2], 1.0, 1e-6);
    EXPECT_NE(thrown_error([&] { relevance(three, {0, 0, 0}); }).find("3 labels"), std::string::npos);
}

TEST(Classify, RefusesWhatItCannotRun) {
    TempDir lm, cls;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(lm.path(), cfg, {DType::BF16, 1, 3});
    write_classifier(lm.path(), cls.path(), {"x", "y", "z"}, std::vector<float>(size_t(3 * cfg.hidden), 0.1f));
    SingleRank comm;
    // A classifier (no lm_head) loads for classify / embed only.
    SessionOptions so;
    so.model_dir = cls.path();
    so.ctx = 8;
    EXPECT_NE(thrown_error([&] { open_session(so, comm); }).find("Qwen3ForSequenceClassification is a sequence-classification model"),
              std::string::npos);
    auto s = open_classifier(cls.path(), 1, 4, comm);
    std::vector<float> logits(size_t(cfg.vocab));
    const std::vector<int32_t> in = {1, 2, 3};
    EXPECT_NE(thrown_error([&] { s->engine->forward({{0, in.data(), 3, 0, true}}, logits.data()); }).find("not logits"),
              std::string::npos);
    EXPECT_NE(thrown_error([&] { make_classifier(s->cfg, s->weights, {{"a", 1}, {"b", 2}}); }).find("no lm_head"),
              std::string::npos);
    auto causal = open_classifier(lm.path(), 1, 4, comm);
    EXPECT_NE(thrown_error([&] { make_classifier(causal->cfg, causal->weights, {}); }).find("--classifier-tokens"),
              std::string::npos);
    EXPECT_NE(thrown_error([&] { make_classifier(causal->cfg, causal->weights, {{"a", 1}, {"b", 1}}); }).find("listed twice"),
              std::string::npos);
    const Classifier h = make_classifier(s->cfg, s->weights, {});
    EXPECT_NE(thrown_error([&] { classify(*s->engine, h, {{}}, 4); }).find("input 0 has no tokens"), std::string::npos);
    EXPECT_NE(thrown_error([&] { classify(*s->engine, h, {in, std::vector<int32_t>(41, 1)}, 4); }).find("input 1 has 41 tokens"),
              std::string::npos);
    EXPECT_EQ(classify(*s->engine, h, {in}, 4)[0].size(), 3u);
}

TEST(Classify, ConfigLabels) {
    auto cfg_with = [](const std::string& extra) {
        return "{\"architectures\": [\"LlamaForSequenceClassification\"], \"hidden_size\": 64, \"num_hidden_layers\": 1, "
               "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 100" +
               extra + "}";
    };
    ModelConfig c = parse_config(cfg_with(""), "c.json");
    EXPECT_EQ(c.head, Head::Classifier);
    EXPECT_EQ(c.arch, Arch::Llama);
    EXPECT_EQ(c.labels, (std::vector<std::string>{"LABEL_0", "LABEL_1"}));  // transformers' default
    c = parse_config(cfg_with(", \"num_labels\": 1"), "c.json");
    EXPECT_EQ(c.labels, (std::vector<std::string>{"LABEL_0"}));
    c = parse_config(cfg_with(", \"id2label\": {\"1\": \"pos\", \"0\": \"neg\"}, \"problem_type\": \"multi_label_classification\""),
                     "c.json");
    EXPECT_EQ(c.labels, (std::vector<std::string>{"neg", "pos"}));
    EXPECT_TRUE(c.multi_label);
    EXPECT_EQ(parse_config("{\"architectures\": [\"Qwen2Model\"], \"hidden_size\": 64, \"num_hidden_layers\": 1, "
                           "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 100}",
                           "c.json")
                  .head,
              Head::None);
    for (const auto& [extra, needle] :
         std::vector<std::pair<std::string, std::string>>{{", \"id2label\": {\"0\": \"a\", \"2\": \"b\"}", "id2label entry \"2\""},
                                                          {", \"id2label\": {\"0\": \"a\"}, \"num_labels\": 2", "num_labels 2 differs"},
                                                          {", \"id2label\": []", "id2label must be an object"},
                                                          {", \"num_labels\": 0", "num_labels must be positive"},
                                                          {", \"problem_type\": \"ranking\"", "problem_type \"ranking\""}})
        EXPECT_NE(thrown_error([&] { parse_config(cfg_with(extra), "c.json"); }).find("c.json: " + needle), std::string::npos)
            << extra;
    EXPECT_NE(thrown_error([&] {
                  parse_config("{\"architectures\": [\"GemmaForSequenceClassification\"]}", "c.json");
              }).find("unknown architecture \"GemmaForSequenceClassification\""),
              std::string::npos);
}

// A rerank template is filled in and encoded whole; {query} and {document} are taken from the
// template's own positions (in either order, a query that holds "{document}" left as it is); a
// template without both, or truncation with one, is refused. Without a template, the pair template.
TEST(Classify, RerankTemplatesFillThePairIn) {
    const Tokenizer tok = Tokenizer::load(SHARDLM_SOURCE_DIR "/launch/models/kjv-small");
    const std::string t = "<Query>: {query}\n<Document>: {document}\nAnswer:";
    EXPECT_EQ(encode_scored_pair(tok, t, "Who?", "In the beginning"), tok.encode("<Query>: Who?\n<Document>: In the beginning\nAnswer:"));
    EXPECT_EQ(encode_scored_pair(tok, "D {document} Q {query}", "a {document} b", "c"), tok.encode("D c Q a {document} b"));
    EXPECT_EQ(encode_scored_pair(tok, "", "Who?", "In the beginning"), tok.encode_pair("Who?", "In the beginning"));
    EXPECT_NE(thrown_error([&] { encode_scored_pair(tok, t, "a", "b", 10); }).find("truncation does not apply"), std::string::npos);
    EXPECT_NO_THROW(check_rerank_template(t, "--rerank-template"));
    EXPECT_NE(thrown_error([&] { check_rerank_template("{query} only", "--rerank-template"); })
                  .find("--rerank-template: the template must hold {document} once"),
              std::string::npos);
    EXPECT_NE(thrown_error([&] { check_rerank_template("{query} {document} {query}", "--rerank-template"); })
                  .find("must hold {query} once"),
              std::string::npos);
}
