// Bad input: every failure is a shardlm::Error whose message names the file, type or token.
#include <gtest/gtest.h>

#include "core/error.h"
#include "fixtures.h"
#include "tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"

using namespace shardlm;
using namespace shardlm::test;
using json = nlohmann::json;

namespace {

// Expects `f` to throw shardlm::Error with `needle` in its message.
template <typename F>
void expect_error(F&& f, const std::string& needle) {
    try {
        f();
        ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

Tokenizer make(const json& tok, const json& cfg = json::object()) {
    return Tokenizer::from_json_text(tok.dump(), cfg.dump());
}

}  // namespace

TEST(TokenizerErrors, MissingAndMalformedFiles) {
    expect_error([] { Tokenizer::load("/nonexistent/model"); }, "/nonexistent/model/tokenizer.json");
    TempDir d;
    EXPECT_FALSE(Tokenizer::exists(d.path()));
    const std::string full = tiny_byte_level_tokenizer().dump();
    write_file(d.file("tokenizer.json"), full.substr(0, full.size() / 2));  // truncated
    expect_error([&] { Tokenizer::load(d.path()); }, d.file("tokenizer.json") + ": malformed JSON");
    write_file(d.file("tokenizer.json"), full);
    write_file(d.file("tokenizer_config.json"), "{\"bos_token\": ");
    expect_error([&] { Tokenizer::load(d.path()); }, d.file("tokenizer_config.json") + ": malformed JSON");
    write_file(d.file("tokenizer_config.json"), "{}");
    write_file(d.file("tokenizer.json"), "[1, 2]");
    expect_error([&] { Tokenizer::load(d.path()); }, "not a JSON object");
    write_file(d.file("tokenizer.json"), "{\"version\": \"1.0\"}");
    expect_error([&] { Tokenizer::load(d.path()); }, "no \"model\"");
}

TEST(TokenizerErrors, UnsupportedTypesAreNamed) {
    const auto with = [](const char* key, const json& value) {
        json t = tiny_byte_level_tokenizer();
        t[key] = value;
        return t;
    };
    expect_error([&] { make(with("normalizer", {{"type", "BertNormalizer"}})); }, "unsupported normalizer type \"BertNormalizer\"");
    expect_error([&] { make(with("pre_tokenizer", {{"type", "Whitespace"}})); }, "unsupported pre_tokenizer type \"Whitespace\"");
    expect_error([&] { make(with("decoder", {{"type", "CTC"}})); }, "unsupported decoder type \"CTC\"");
    expect_error([&] { make(with("post_processor", {{"type", "Wordy"}})); }, "unsupported post_processor type \"Wordy\"");
    json m = tiny_byte_level_tokenizer();
    m["model"]["type"] = "Unigram";
    expect_error([&] { make(m); }, "unsupported model type \"Unigram\"");
    m = tiny_byte_level_tokenizer();
    m["model"]["type"] = "WordPiece";
    expect_error([&] { make(m); }, "unsupported model type \"WordPiece\"");
    expect_error([&] { make(with("pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}})); },
                 "cannot compile regex \"(unclosed\"");
    expect_error([&] { make(with("pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}})); },
                 "unknown Split behavior \"Sideways\"");
}

TEST(TokenizerErrors, BrokenVocabularyOrMerges) {
    json t = tiny_byte_level_tokenizer();
    t["model"]["merges"].push_back(json::array({"zz", "q"}));
    expect_error([&] { make(t); }, "(\"zz\", \"q\") uses a token missing from the vocabulary");
    t = tiny_sp_tokenizer();
    t["model"]["merges"].push_back("a b c");
    expect_error([&] { make(t); }, "\"a b c\" is not two tokens");
    t = tiny_sp_tokenizer();
    t["model"]["vocab"]["bad"] = "seven";
    expect_error([&] { make(t); }, "vocab entry \"bad\"");
    t = tiny_sp_tokenizer();
    t["model"]["unk_token"] = "<nope>";
    expect_error([&] { make(t); }, "unk_token \"<nope>\"");
    t = tiny_byte_level_tokenizer();
    t["added_tokens"].push_back({{"id", "x"}, {"content", "<bad>"}});
    expect_error([&] { make(t); }, "added token");
}

TEST(TokenizerErrors, InvalidUtf8AndIdsOutOfRange) {
    const Tokenizer t = make(tiny_byte_level_tokenizer(), tiny_byte_level_config());
    expect_error([&] { t.encode("ok \xC3\x28"); }, "not valid UTF-8 (bad byte 0xc3 at offset 3)");
    expect_error([&] { t.encode(std::string("\xED\xA0\x80")); }, "not valid UTF-8");
    expect_error([&] { t.decode({1, 2, 353}); }, "token id 353 is outside the vocabulary [0, 353)");
    expect_error([&] { t.decode({-1}); }, "token id -1");
    expect_error([&] { t.id_to_token(1000); }, "token id 1000");
    StreamDecoder s(t);
    expect_error([&] { s.push(99999); }, "token id 99999");
}

TEST(TokenizerErrors, ChatWithoutOrWithUnknownTemplate) {
    const Tokenizer none = make(tiny_byte_level_tokenizer());
    EXPECT_FALSE(none.has_chat_template());
    expect_error([&] { none.apply_chat_template(std::nullopt, "hi"); }, "no chat_template");
    json cfg = tiny_byte_level_config();
    cfg["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfor %}";
    const Tokenizer odd = make(tiny_byte_level_tokenizer(), cfg);  // loads: only --chat needs the template
    EXPECT_EQ(odd.encode("hi").size(), 2u);
    expect_error([&] { odd.apply_chat_template(std::nullopt, "hi"); }, "unrecognised chat_template");
}
