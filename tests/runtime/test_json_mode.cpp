// JSON mode's acceptor (runtime/json_mode.h) on whole texts and prefixes, and its vocabulary masks
// against a token-by-token check from many states.
#include <gtest/gtest.h>

#include <random>

#include "runtime/json_mode.h"

using namespace shardlm;

namespace {
// How far `text` is taken: its length when all of it.
size_t taken(const std::string& text) {
    JsonAcceptor a;
    for (size_t i = 0; i < text.size(); ++i)
        if (!a.push(uint8_t(text[i]))) return i;
    return text.size();
}
bool complete(const std::string& text) {
    JsonAcceptor a;
    return a.push(text) && a.complete();
}
}  // namespace

TEST(JsonMode, AcceptsObjectsAndTheirPrefixes) {
    const std::string doc =
        "{\"a\": [1, -2.5e+3, 0, 0.25, 1E9, true, false, null, \"x\\u00e9\\n\\\"\"], \"b\": {}, \"c\": [], "
        "\"d\": {\"e\": [[], [{}]]}, \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\": \"\"}";
    EXPECT_TRUE(complete(doc));
    EXPECT_TRUE(complete("{}"));
    EXPECT_TRUE(complete("{\n  \"k\" : 5 }"));
    EXPECT_TRUE(complete("{\n\t\"k\": [\n\t\t1,\n\t\t2\n\t]\n}"));
    for (size_t n = 0; n < doc.size(); ++n) {  // every prefix is taken, none is complete
        JsonAcceptor a;
        EXPECT_TRUE(a.push(doc.substr(0, n))) << n;
        EXPECT_FALSE(a.complete()) << n;
    }
}

TEST(JsonMode, RefusesWhereTheTextStopsBeingJson) {
    EXPECT_EQ(taken("[1]"), 0u);       // an object at the top
    EXPECT_EQ(taken(" {}"), 0u);       // from the first byte
    EXPECT_EQ(taken("\"x\""), 0u);
    EXPECT_EQ(taken("{\"a\" 1}"), 5u);  // no colon
    EXPECT_EQ(taken("{\"a\":01}"), 6u);  // no leading zero
    EXPECT_EQ(taken("{\"a\":-}"), 6u);
    EXPECT_EQ(taken("{\"a\":1.}"), 7u);
    EXPECT_EQ(taken("{\"a\":1e}"), 7u);
    EXPECT_EQ(taken("{\"a\":tru}"), 8u);
    EXPECT_EQ(taken("{\"a\":nul1}"), 8u);
    EXPECT_EQ(taken("{,}"), 1u);
    EXPECT_EQ(taken("{\"a\":1,}"), 7u);  // no trailing comma
    EXPECT_EQ(taken("{\"a\":[1,]}"), 8u);
    EXPECT_EQ(taken("{\"a\":[1}"), 7u);   // brackets must match
    EXPECT_EQ(taken("{1:2}"), 1u);        // keys are strings
    EXPECT_EQ(taken("{\"a\":\"\x01\"}"), 6u);  // control characters are escaped
    EXPECT_EQ(taken("{\"a\":\"\\x\"}"), 7u);
    EXPECT_EQ(taken("{\"a\":\"\\u12g4\"}"), 10u);
    EXPECT_EQ(taken("{\"a\":\"\xc3(\"}"), 7u);  // a lead byte without its continuation
    EXPECT_EQ(taken("{\"a\":\"\xff\"}"), 6u);
    // UTF-8 as RFC 3629 has it: no overlong 3- and 4-byte forms, no surrogates, nothing past U+10FFFF.
    EXPECT_EQ(taken("{\"a\":\"\xe0\x80\x80\"}"), 7u);
    EXPECT_EQ(taken("{\"a\":\"\xed\xa0\x80\"}"), 7u);
    EXPECT_EQ(taken("{\"a\":\"\xf0\x80\x80\x80\"}"), 7u);
    EXPECT_EQ(taken("{\"a\":\"\xf4\x90\x80\x80\"}"), 7u);
    const std::string edges = "{\"a\":\"\xe0\xa0\x80\xed\x9f\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf\"}";  // the first and last allowed
    EXPECT_EQ(taken(edges), edges.size());
    EXPECT_EQ(taken("{} "), 2u);  // nothing after the object
    EXPECT_EQ(taken("{}{}"), 2u);
    const std::string spaces(40, ' ');
    EXPECT_EQ(taken("{" + spaces + "}"), 17u);  // at most 16 spaces in a row
    EXPECT_EQ(taken("{ \n \n}"), 4u);        // with one line break
    EXPECT_EQ(taken("{\"" + spaces + "\":1}"), spaces.size() + 6);  // inside strings, any
}

// The masks equal what pushing each token's bytes says, from the states along random objects,
// deep nesting included, with tokens that close several brackets at once (the cache keys must
// see as deep as those reach), and a state met again served from the cache.
TEST(JsonMode, VocabularyMasksAreEachTokensCheck) {
    std::vector<std::string> vocab = {"", "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "0", "1", "7", "-", ".", "e",
                                      "true", "false", "null", "tr", "ue", "a", "b", "\\", "\\u", "00e9", "\"}", "}]",
                                      "]}}", "}}}}", "]]", "\": ", "\":{\"", ", \"", "1}", "1.5,", "ab\"", "\xc3",
                                      "\xa9", "\xc3\xa9", "{\"", "[[", "x", "  ", "{}"};
    JsonVocab v(vocab);
    std::mt19937 rng(3);
    int64_t checked = 0;
    for (int run = 0; run < 60; ++run) {
        JsonAcceptor s;
        for (int step = 0; step < 80 && !s.complete(); ++step) {
            const std::vector<uint8_t> mask = v.allowed(s);
            std::vector<int32_t> ok;
            for (size_t id = 0; id < vocab.size(); ++id) {
                JsonAcceptor t = s;
                const bool want = !vocab[id].empty() && t.push(vocab[id]);
                ASSERT_EQ(mask[id] != 0, want) << "token " << id << " at run " << run << " step " << step;
                if (want) ok.push_back(int32_t(id));
                ++checked;
            }
            ASSERT_FALSE(ok.empty()) << "run " << run << " step " << step;  // a valid prefix can go on
            // Deep nesting early in the run, closing later.
            const int32_t pick = ok[size_t(rng() % ok.size())];
            ASSERT_TRUE(s.push(vocab[size_t(pick)]));
        }
    }
    EXPECT_GT(checked, 50000);
}
