// Fill-in-the-middle prompts (tokenizer/fim.h): which tokens a tokenizer has, and the ids of a
// prefix, a suffix and the middle token in PSM order.
#include <gtest/gtest.h>

#include "tiny_tokenizer.h"
#include "tokenizer/fim.h"
#include "tokenizer/tokenizer.h"

using namespace shardlm;
using namespace shardlm::test;
using json = nlohmann::json;

namespace {

std::vector<int32_t> joined(std::vector<std::vector<int32_t>> parts) {
    std::vector<int32_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

}  // namespace

TEST(Fim, QwenTokensInPrefixSuffixMiddleOrder) {
    const Tokenizer tok = Tokenizer::from_json_text(
        with_special_tokens(tiny_byte_level_tokenizer(),
                            {{353, "<|fim_prefix|>"}, {354, "<|fim_middle|>"}, {355, "<|fim_suffix|>"}, {356, "<|fim_pad|>"},
                             {357, "<|file_sep|>"}})
            .dump(),
        tiny_byte_level_config().dump());
    const FimTokens f = fim_tokens(tok);
    ASSERT_NE(f.family, nullptr);
    EXPECT_STREQ(f.family, "qwen");
    EXPECT_EQ(f.prefix, 353);
    EXPECT_EQ(f.suffix, 355);
    EXPECT_EQ(f.middle, 354);
    EXPECT_EQ(f.stops, (std::vector<int32_t>{356, 357, 350}));  // fim_pad, file_sep, <|endoftext|>; no repo_name
    const std::string prefix = "def hello(", suffix = ")\n    return world\n";
    const std::vector<int32_t> ids = encode_fim(tok, f, prefix, suffix);
    EXPECT_EQ(ids, joined({{353}, tok.encode(prefix, {false}), {355}, tok.encode(suffix, {false}), {354}}));
    // transformers' tokenizer() of the spelled prompt gives the same ids.
    EXPECT_EQ(ids, tok.encode("<|fim_prefix|>" + prefix + "<|fim_suffix|>" + suffix + "<|fim_middle|>"));
    EXPECT_EQ(encode_fim(tok, f, "", ""), (std::vector<int32_t>{353, 355, 354}));
}

TEST(Fim, StarCoderTokensAndNone) {
    const Tokenizer plain = Tokenizer::from_json_text(tiny_byte_level_tokenizer().dump(), "{}");
    EXPECT_EQ(fim_tokens(plain).family, nullptr);
    // Two of the three are not enough.
    const Tokenizer partial = Tokenizer::from_json_text(
        with_special_tokens(tiny_byte_level_tokenizer(), {{353, "<fim_prefix>"}, {354, "<fim_middle>"}}).dump(), "{}");
    EXPECT_EQ(fim_tokens(partial).family, nullptr);
    const Tokenizer sc = Tokenizer::from_json_text(
        with_special_tokens(tiny_byte_level_tokenizer(),
                            {{353, "<fim_prefix>"}, {354, "<fim_middle>"}, {355, "<fim_suffix>"}, {356, "<fim_pad>"}})
            .dump(),
        "{}");
    const FimTokens f = fim_tokens(sc);
    ASSERT_NE(f.family, nullptr);
    EXPECT_STREQ(f.family, "starcoder");
    EXPECT_EQ(f.stops, (std::vector<int32_t>{356, 350}));
    EXPECT_EQ(encode_fim(sc, f, "a", "b"), joined({{353}, sc.encode("a", {false}), {355}, sc.encode("b", {false}), {354}}));
}

TEST(Fim, DeepSeekTokensAfterTheBos) {
    // A tokenizer whose post-processor adds <s>: the FIM prompt starts with it, as
    // DeepSeek-Coder's does.
    const std::string begin = "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>",
                      hole = "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>",
                      end = "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>";
    const Tokenizer tok = Tokenizer::from_json_text(
        with_special_tokens(tiny_sp_tokenizer(), {{300, begin}, {301, hole}, {302, end}, {303, "<|EOT|>"}}).dump(),
        tiny_sp_config().dump());
    const FimTokens f = fim_tokens(tok);
    ASSERT_NE(f.family, nullptr);
    EXPECT_STREQ(f.family, "deepseek");
    EXPECT_EQ(f.stops, (std::vector<int32_t>{303}));
    EXPECT_EQ(encode_fim(tok, f, "hello", "world"),
              joined({{1, 300}, tok.encode("hello", {false}), {301}, tok.encode("world", {false}), {302}}));
}

// Code Llama: <s>▁<PRE> prefix ▁<SUF>suffix ▁<MID> (transformers' CodeLlamaTokenizer and Meta's
// reference): the prefix with SentencePiece's space, the suffix without it; ▁<EOT> ends the middle.
TEST(Fim, CodeLlamaSuffixWithoutTheLeadingSpace) {
    const std::string pre = "\xE2\x96\x81<PRE>", suf = "\xE2\x96\x81<SUF>", mid = "\xE2\x96\x81<MID>", eot = "\xE2\x96\x81<EOT>";
    const Tokenizer tok = Tokenizer::from_json_text(
        with_special_tokens(tiny_sp_tokenizer(), {{300, pre}, {301, suf}, {302, mid}, {303, eot}}).dump(),
        tiny_sp_config().dump());
    const FimTokens f = fim_tokens(tok);
    ASSERT_NE(f.family, nullptr);
    EXPECT_STREQ(f.family, "codellama");
    EXPECT_EQ(f.stops, (std::vector<int32_t>{303}));
    EXPECT_FALSE(f.suffix_first);
    auto id = [&](const char* t) { return tok.token_to_id(t); };
    // "hello" -> ▁hello; "world" (no space) -> w or l d, where "▁wor" would come with the space.
    const std::vector<int32_t> want{1, 300, id("\xE2\x96\x81hello"), 301, id("w"), id("or"), id("l"), id("d"), 302};
    EXPECT_EQ(encode_fim(tok, f, "hello", "world"), want);
    EXPECT_NE(tok.encode("world", {false})[0], id("w"));
}

// Mistral (Codestral): <s>[SUFFIX]suffix[PREFIX] prefix, no middle token (mistral_common's
// encode_fim); the middle ends at the end-of-sequence token.
TEST(Fim, MistralSuffixFirst) {
    json t = with_special_tokens(tiny_sp_tokenizer(), {{300, "[PREFIX]"}, {301, "[SUFFIX]"}});
    t["normalizer"] = nullptr;  // Mistral's tokenizer.json: Metaspace, prepend_scheme "first"
    t["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", false}};
    const Tokenizer tok = Tokenizer::from_json_text(t.dump(), tiny_sp_config().dump());
    const FimTokens f = fim_tokens(tok);
    ASSERT_NE(f.family, nullptr);
    EXPECT_STREQ(f.family, "mistral");
    EXPECT_TRUE(f.suffix_first);
    EXPECT_EQ(f.middle, -1);
    EXPECT_TRUE(f.stops.empty());
    auto id = [&](const char* s) { return tok.token_to_id(s); };
    const std::vector<int32_t> want{1, 301, id("w"), id("or"), id("l"), id("d"), 300, id("\xE2\x96\x81hello")};
    EXPECT_EQ(encode_fim(tok, f, "hello", "world"), want);
    EXPECT_EQ(encode_fim(tok, f, "", ""), (std::vector<int32_t>{1, 301, 300}));
}
