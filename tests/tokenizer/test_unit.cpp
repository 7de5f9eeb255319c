// Tokenizer building blocks on small hand-made tokenizers: merge order, both merge spellings,
// byte fallback, normalizers, pre-tokenizer behaviours, added-token options, UTF-8 helpers.
#include <gtest/gtest.h>

#include "tiny_tokenizer.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace shardlm;
using namespace shardlm::test;
using json = nlohmann::json;

namespace {

std::vector<std::string> spell(const Tokenizer& t, const std::vector<int32_t>& ids) {
    std::vector<std::string> out;
    for (int32_t id : ids) out.push_back(t.id_to_token(id));
    return out;
}

Tokenizer make(const json& tok, const json& cfg = json::object()) {
    return Tokenizer::from_json_text(tok.dump(), cfg.dump());
}

std::vector<std::string> split(const json& pre, const std::string& text) {
    const PreTokenizer p = PreTokenizer::from_json(pre, "test");
    std::vector<std::string> out;
    p.split(text, true, out);
    return out;
}

}  // namespace

TEST(Utf8, ValidationAndLossyDecoding) {
    EXPECT_EQ(utf8_invalid_offset("plain \xC3\xA9 \xF0\x9F\x98\x80"), std::string::npos);
    EXPECT_EQ(utf8_invalid_offset("ab\xC3"), 2u);            // truncated
    EXPECT_EQ(utf8_invalid_offset("a\xED\xA0\x80"), 1u);     // surrogate
    EXPECT_EQ(utf8_invalid_offset("\xC0\xAF"), 0u);          // overlong
    EXPECT_EQ(utf8_invalid_offset("\xF4\x90\x80\x80"), 0u);  // past U+10FFFF
    // One U+FFFD per maximal invalid subpart, as Rust's from_utf8_lossy and TextDecoder do.
    EXPECT_EQ(utf8_lossy("\xE4\xBD" "A"), "\xEF\xBF\xBD" "A");
    EXPECT_EQ(utf8_lossy("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");
    // Fed byte by byte it gives the same text and never a partial character.
    const std::string mixed = "a\xE4\xBD\xA0\xE4\xBD" "b\xF0\x9F\x98\x80\xFF\xC3";
    Utf8Decoder d;
    std::string out;
    for (char c : mixed) {
        std::string piece;
        d.push(std::string(1, c), piece);
        EXPECT_EQ(utf8_invalid_offset(piece), std::string::npos);
        out += piece;
    }
    d.finish(out);
    EXPECT_EQ(out, utf8_lossy(mixed));
}

TEST(Regex, JavaScriptWhiteSpaceAndContractions) {
    const Regex ws("\\s+", "test");
    std::vector<std::pair<size_t, size_t>> m;
    ws.for_each_match("a\xEF\xBB\xBF" "b\xC2\x85" "c", [&](size_t b, size_t e) { m.emplace_back(b, e); });
    ASSERT_EQ(m.size(), 1u);  // U+FEFF is white space for the reference, U+0085 is not
    EXPECT_EQ(m[0], std::make_pair(size_t(1), size_t(4)));
    const Regex c("(?i:'s|'t|'re|'ve|'m|'ll|'d)", "test");
    size_t n = 0;
    c.for_each_match("'S 'Ll '\xC5\xBF", [&](size_t, size_t) { ++n; });  // U+017F is no 's'
    EXPECT_EQ(n, 2u);
}

TEST(ByteLevelBpe, MergesByRankAndRoundTrip) {
    const Tokenizer t = make(tiny_byte_level_tokenizer(), tiny_byte_level_config());
    EXPECT_EQ(spell(t, t.encode("hello world")), (std::vector<std::string>{"he", "ll", "o", "\xC4\xA0world"}));
    // NFC: a decomposed é becomes the precomposed one, whose two bytes merge.
    EXPECT_EQ(t.encode("caf\xC3\xA9"), t.encode("cafe\xCC\x81"));
    EXPECT_EQ(spell(t, t.encode("\xC3\xA9")), (std::vector<std::string>{"\xC3\x83\xC2\xA9"}));
    EXPECT_EQ(t.encode("<|im_start|>hi<|im_end|>").front(), 351);
    EXPECT_EQ(t.encode("<|im_start|>hi<|im_end|>").back(), 352);
    for (const std::string s : {"hello world", "  spaced\t\tout\n\n", "\xF0\x9F\x98\x80 emoji", "<|im_end|> x", ""})
        EXPECT_EQ(t.decode(t.encode(s)), s);
    EXPECT_EQ(t.vocab_size(), 353);
    EXPECT_EQ(t.token_to_id("<|im_end|>"), 352);
    EXPECT_EQ(t.token_to_id("nope"), -1);
    EXPECT_TRUE(t.is_special(350));
    EXPECT_FALSE(t.is_special(5));
}

TEST(ByteLevelBpe, LongWordsAreLinearithmic) {
    const Tokenizer t = make(tiny_byte_level_tokenizer());
    const std::string word(200000, 'l');  // one pre-token: the heap path, with every pair mergeable
    const auto ids = t.encode(word);
    EXPECT_EQ(ids.size(), 100000u);
    EXPECT_EQ(t.decode(ids), word);
}

TEST(SentencePieceBpe, StringMergesByteFallbackAndTemplate) {
    const Tokenizer t = make(tiny_sp_tokenizer(), tiny_sp_config());
    EXPECT_EQ(spell(t, t.encode("hello world")), (std::vector<std::string>{"<s>", "\xE2\x96\x81hello", "\xE2\x96\x81wor", "l", "d"}));
    EXPECT_EQ(spell(t, t.encode("hello world", {false})).size(), 4u);
    // 'x' and the euro sign are not in the vocabulary: their bytes are.
    EXPECT_EQ(spell(t, t.encode("x\xE2\x82\xAC", {false})),
              (std::vector<std::string>{"\xE2\x96\x81", "<0x78>", "<0xE2>", "<0x82>", "<0xAC>"}));
    EXPECT_EQ(t.decode(t.encode("x\xE2\x82\xAC hello")), "<s> x\xE2\x82\xAC hello");
    EXPECT_EQ(t.decode(t.encode("x\xE2\x82\xAC hello"), {true, std::nullopt}), "x\xE2\x82\xAC hello");
    // Special-token strings in the text are matched before the normalizer runs.
    EXPECT_EQ(spell(t, t.encode("a</s>b", {false})), (std::vector<std::string>{"\xE2\x96\x81", "a", "</s>", "\xE2\x96\x81", "b"}));
    EXPECT_EQ(t.bos_id(), 1);
    EXPECT_EQ(t.eos_id(), 2);
}

// EncodeOptions::prefix_space false: the start of the text without SentencePiece's space, from a
// normalizer's Prepend or Metaspace (prepend_scheme first or always); a section after an added
// token keeps what the tokenizer gives it.
TEST(SentencePieceBpe, NoPrefixSpaceAtTheStart) {
    EncodeOptions bare;
    bare.add_special_tokens = false;
    bare.prefix_space = false;
    const std::vector<std::string> start{"h", "el", "lo", "\xE2\x96\x81wor", "l", "d"};
    for (const char* scheme : {"normalizer", "first", "always"}) {
        json tok = tiny_sp_tokenizer();
        if (std::string(scheme) != "normalizer") {
            tok["normalizer"] = nullptr;
            tok["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", scheme}, {"split", false}};
        }
        const Tokenizer t = make(tok, tiny_sp_config());
        EXPECT_EQ(spell(t, t.encode("hello world", bare)), start) << scheme;
        EXPECT_EQ(spell(t, t.encode("hello world", {false})),
                  (std::vector<std::string>{"\xE2\x96\x81hello", "\xE2\x96\x81wor", "l", "d"})) << scheme;
        // After an added token: the normalizer's Prepend and "always" prepend there, "first" not.
        const std::string after = std::string(scheme) == "first" ? "h" : "\xE2\x96\x81h";
        EXPECT_EQ(spell(t, t.encode("ab</s>h", bare)).back(), after) << scheme;
        EXPECT_EQ(spell(t, t.encode("ab</s>h", bare)).front(), "ab") << scheme;
    }
    // A ByteLevel add_prefix_space likewise.
    json bl = tiny_byte_level_tokenizer();
    const Tokenizer plain = make(bl);
    bl["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
    const Tokenizer spaced = make(bl);
    EXPECT_EQ(spaced.encode("ab", {false}), plain.encode(" ab", {false}));
    EXPECT_EQ(spaced.encode("ab", bare), plain.encode("ab", {false}));
}

TEST(SentencePieceBpe, AddBosAndEosFlags) {
    json cfg = tiny_sp_config();
    cfg["add_eos_token"] = true;
    cfg["add_bos_token"] = false;
    const Tokenizer t = make(tiny_sp_tokenizer(), cfg);
    const auto ids = t.encode("abc");
    EXPECT_EQ(spell(t, ids), (std::vector<std::string>{"\xE2\x96\x81", "abc", "</s>"}));
}

// transformers' tokenizer(a, text_pair=b): each text without special tokens, put into the
// post-processor's pair template (what a cross-encoder reranker scores).
TEST(PairEncoding, FollowsThePostProcessorsPairTemplate) {
    const auto cat = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
        a.insert(a.end(), b.begin(), b.end());
        return a;
    };
    const Tokenizer bl = make(tiny_byte_level_tokenizer(), tiny_byte_level_config());  // ByteLevel: no template
    EXPECT_EQ(bl.encode_pair("hello", "world"), cat(bl.encode("hello", {false}), bl.encode("world", {false})));
    json tok = tiny_sp_tokenizer();
    const Tokenizer flags = make(tok, tiny_sp_config());  // add_bos_token rebuilds: <s> A <s> B
    const std::vector<int32_t> a = flags.encode("ab", {false}), b = flags.encode("ba", {false});
    EXPECT_EQ(flags.encode_pair("ab", "ba"), cat(cat({1}, a), cat({1}, b)));
    tok["post_processor"]["pair"] = json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                                 {{"SpecialToken", {{"id", "</s>"}, {"type_id", 1}}}},
                                                 {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}});
    EXPECT_EQ(make(tok).encode_pair("ab", "ba"), cat(cat({1}, a), cat({2}, b)));
    tok["post_processor"]["pair"] = json::array();  // no pair template: the two one after the other
    EXPECT_EQ(make(tok).encode_pair("ab", "ba"), cat(a, b));
    tok["post_processor"] = {{"type", "RobertaProcessing"}, {"cls", {"<s>", 1}}, {"sep", {"</s>", 2}}};
    EXPECT_EQ(make(tok).encode_pair("ab", "ba"), cat(cat({1}, a), cat({2, 2}, cat(b, {2}))));
    tok["post_processor"]["type"] = "BertProcessing";
    EXPECT_EQ(make(tok).encode_pair("ab", "ba"), cat(cat({1}, a), cat({2}, cat(b, {2}))));
    // A limit cuts the second text's end: [CLS] a [SEP] b' [SEP] within it; the first text stays whole.
    const Tokenizer bert = make(tok);
    const std::vector<int32_t> long_b = bert.encode("babababa", {false});
    ASSERT_GT(long_b.size(), 2u);
    const int64_t room = int64_t(a.size()) + 3 + 2;
    EXPECT_EQ(bert.encode_pair("ab", "babababa", room),
              cat(cat({1}, a), cat({2}, cat(std::vector<int32_t>(long_b.begin(), long_b.begin() + 2), {2}))));
    EXPECT_EQ(bert.encode_pair("ab", "babababa", 1000), bert.encode_pair("ab", "babababa"));
    try {
        bert.encode_pair("ab", "ba", int64_t(a.size()) + 3);
        ADD_FAILURE() << "no error";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("leaving the second none of"), std::string::npos) << e.what();
    }
}

TEST(AddedTokens, StripSingleWordAndNormalized) {
    json tok = tiny_byte_level_tokenizer();
    const auto add = [&](int id, const char* content, bool lstrip, bool rstrip, bool single, bool normalized) {
        tok["added_tokens"].push_back({{"id", id}, {"content", content}, {"lstrip", lstrip}, {"rstrip", rstrip},
                                       {"single_word", single}, {"normalized", normalized}, {"special", false}});
    };
    add(353, "<L>", true, false, false, false);
    add(354, "<R>", false, true, false, false);
    add(355, "cat", false, false, true, false);
    add(356, "\xC3\xA9!", false, false, false, true);  // matched after NFC
    const Tokenizer t = make(tok);
    const auto cat = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
        a.insert(a.end(), b.begin(), b.end());
        return a;
    };
    EXPECT_EQ(t.encode("a  <L>b"), cat(cat(t.encode("a"), {353}), t.encode("b")));
    EXPECT_EQ(t.encode("a<R> \t b"), cat(cat(t.encode("a"), {354}), t.encode("b")));
    EXPECT_EQ(t.encode("a cat b"), cat(cat(t.encode("a "), {355}), t.encode(" b")));
    const auto inside = t.encode("concatenate");
    EXPECT_EQ(std::count(inside.begin(), inside.end(), 355), 0);
    const auto norm = t.encode("xe\xCC\x81!");
    EXPECT_EQ(std::count(norm.begin(), norm.end(), 356), 1);
}

TEST(PreTokenizer, SplitBehavioursAsHf) {
    const auto split_with = [](const char* behavior) {
        return split({{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}},
                     "the-final--countdown");
    };
    using V = std::vector<std::string>;
    EXPECT_EQ(split_with("Removed"), (V{"the", "final", "countdown"}));
    EXPECT_EQ(split_with("Isolated"), (V{"the", "-", "final", "-", "-", "countdown"}));
    EXPECT_EQ(split_with("MergedWithPrevious"), (V{"the-", "final-", "-", "countdown"}));
    EXPECT_EQ(split_with("MergedWithNext"), (V{"the", "-final", "-", "-countdown"}));
    EXPECT_EQ(split_with("Contiguous"), (V{"the", "-", "final", "--", "countdown"}));
    EXPECT_EQ(split({{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}, {"split", true}},
                    "Hey friend"),
              (V{"\xE2\x96\x81Hey", "\xE2\x96\x81" "friend"}));
    EXPECT_EQ(split({{"type", "Digits"}, {"individual_digits", true}}, "a12b"), (V{"a", "1", "2", "b"}));
    EXPECT_EQ(split({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}, "Hello world's"),
              (V{" Hello", " world", "'s"}));
}

TEST(Normalizer, UnicodeFormsAndSequence) {
    const Normalizer nfc = Normalizer::from_json({{"type", "NFC"}}, "test");
    EXPECT_EQ(nfc.normalize("e\xCC\x81"), "\xC3\xA9");
    EXPECT_EQ(nfc.normalize("\xE2\x84\xAA"), "K");  // Kelvin sign: a singleton decomposition
    const Normalizer nfkc = Normalizer::from_json({{"type", "NFKC"}}, "test");
    EXPECT_EQ(nfkc.normalize("\xEF\xAC\x81"), "fi");
    const Normalizer seq = Normalizer::from_json(
        {{"type", "Sequence"},
         {"normalizers", json::array({{{"type", "Lowercase"}}, {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                                      {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", "_"}}})}},
        "test");
    EXPECT_EQ(seq.normalize("  Hello   \xC3\x89T\xC3\x89  "), "hello_\xC3\xA9t\xC3\xA9");
}
