// StreamDecoder: never a partial UTF-8 character, and the chunks add up to decode().
#include <gtest/gtest.h>

#include <random>

#include "tiny_tokenizer.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace shardlm;
using namespace shardlm::test;
using json = nlohmann::json;

namespace {

Tokenizer make(const json& tok, const json& cfg = json::object()) {
    return Tokenizer::from_json_text(tok.dump(), cfg.dump());
}

// Streams `ids` and checks every chunk is whole UTF-8; returns the chunks.
std::vector<std::string> stream(const Tokenizer& t, const std::vector<int32_t>& ids, const DecodeOptions& opt = {}) {
    StreamDecoder s(t, opt);
    std::vector<std::string> chunks;
    for (int32_t id : ids) chunks.push_back(s.push(id));
    chunks.push_back(s.finish());
    for (const auto& c : chunks) EXPECT_EQ(utf8_invalid_offset(c), std::string::npos) << json(ids).dump();
    return chunks;
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += x;
    return s;
}

}  // namespace

TEST(StreamDecoder, ByteLevelEmojiWaitsForTheLastByte) {
    const Tokenizer t = make(tiny_byte_level_tokenizer());
    const auto ids = t.encode("a\xF0\x9F\x98\x80" "b");  // the emoji is four byte tokens
    ASSERT_EQ(ids.size(), 6u);
    const auto chunks = stream(t, ids);
    EXPECT_EQ(chunks, (std::vector<std::string>{"a", "", "", "", "\xF0\x9F\x98\x80", "b", ""}));
}

TEST(StreamDecoder, ByteFallbackPiecesAndLeadingSpace) {
    const Tokenizer t = make(tiny_sp_tokenizer(), tiny_sp_config());
    const auto ids = t.encode("x\xE2\x82\xAC hello \xE6\x97\xA5");
    for (bool skip : {false, true}) {
        const DecodeOptions opt{skip, std::nullopt};
        const auto chunks = stream(t, ids, opt);
        EXPECT_EQ(join(chunks), t.decode(ids, opt));
    }
    EXPECT_EQ(join(stream(t, ids, {true, std::nullopt})), "x\xE2\x82\xAC hello \xE6\x97\xA5");
    // Invalid byte sequences: one U+FFFD per maximal subpart, streamed or not.
    const int32_t e4 = t.token_to_id("<0xE4>"), bd = t.token_to_id("<0xBD>"), a = t.token_to_id("a");
    const std::vector<int32_t> bad{e4, bd, a, e4};
    EXPECT_EQ(t.decode(bad), "\xEF\xBF\xBD" "a\xEF\xBF\xBD");
    EXPECT_EQ(join(stream(t, bad)), t.decode(bad));
}

TEST(StreamDecoder, RandomIdsMatchDecode) {
    for (const bool sp : {false, true}) {
        const Tokenizer t = sp ? make(tiny_sp_tokenizer(), tiny_sp_config()) : make(tiny_byte_level_tokenizer());
        std::mt19937 rng(42);
        for (int trial = 0; trial < 300; ++trial) {
            std::vector<int32_t> ids(size_t(rng() % 24));
            for (auto& id : ids) id = int32_t(rng() % uint32_t(t.vocab_size()));
            for (bool skip : {false, true})
                for (bool continuation : {false, true}) {
                    const DecodeOptions opt{skip, std::nullopt, continuation};
                    ASSERT_EQ(join(stream(t, ids, opt)), t.decode(ids, opt)) << json(ids).dump();
                }
        }
    }
}

TEST(StreamDecoder, CleanUpAcrossChunks) {
    // transformers' clean-up rewrites " ." or " 've" that may straddle tokens: the stream holds
    // such tails back. Random text over the characters the rules involve.
    const Tokenizer t = make(tiny_byte_level_tokenizer());
    const std::string alphabet = " .?!,'nmtvesrx";
    std::mt19937 rng(7);
    for (int trial = 0; trial < 3000; ++trial) {
        std::vector<int32_t> ids(size_t(rng() % 20));
        for (auto& id : ids) id = t.token_to_id(byte_to_unicode(uint8_t(alphabet[rng() % alphabet.size()])));
        const DecodeOptions opt{false, true};
        ASSERT_EQ(join(stream(t, ids, opt)), t.decode(ids, opt)) << json(t.decode(ids)).dump();
    }
    EXPECT_EQ(clean_up_tokenization("Hello , world . I do n't know ' s"), "Hello, world. I don't know's");
}

TEST(StreamDecoder, TrailingStripIsHeldBack) {
    json tok = tiny_sp_tokenizer();
    tok["decoder"]["decoders"][3]["stop"] = 2;  // also strip up to two trailing spaces
    const Tokenizer t = make(tok, tiny_sp_config());
    const std::vector<int32_t> ids = t.encode("hello   ", {false});
    const auto chunks = stream(t, ids);
    EXPECT_EQ(join(chunks), t.decode(ids));
    EXPECT_EQ(t.decode(ids), "hello ");
}

// A completion's text continues its prompt's: SentencePiece's leading space stays (vLLM's
// completions: " Paris" after "The capital of France is"), where a text decoded alone drops it.
TEST(StreamDecoder, ContinuationKeepsTheLeadingSpace) {
    for (const char* pre : {"normalizer", "metaspace"}) {
        json tok = tiny_sp_tokenizer();
        if (std::string(pre) == "metaspace") {  // Mistral's layout: no normalizer, Metaspace "first"
            tok["normalizer"] = nullptr;
            tok["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", false}};
        }
        const Tokenizer t = make(tok, tiny_sp_config());
        const std::vector<int32_t> ids = t.encode("hello world", {false});
        ASSERT_EQ(t.id_to_token(ids[0]), "\xE2\x96\x81hello") << pre;
        DecodeOptions opt;
        EXPECT_EQ(t.decode(ids, opt), "hello world") << pre;
        opt.continuation = true;
        EXPECT_EQ(t.decode(ids, opt), " hello world") << pre;
        EXPECT_EQ(join(stream(t, ids, opt)), " hello world") << pre;
        // Without the prefix space, the text decodes to itself either way.
        EncodeOptions bare;
        bare.add_special_tokens = false;
        bare.prefix_space = false;
        const std::vector<int32_t> cont = t.encode("hello world", bare);
        EXPECT_EQ(t.id_to_token(cont[0]), "h") << pre;
        EXPECT_EQ(t.decode(cont, opt), "hello world") << pre;
    }
}
