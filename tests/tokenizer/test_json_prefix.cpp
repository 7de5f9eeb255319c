// scan_json_prefix against nlohmann's parser and python_json: on random JSON written with random
// white space, escapes and number forms, every prefix of the text gives a prefix of the whole
// value's python_json, and the whole text gives all of it (the writer repeats no key); a text with one byte changed is valid
// exactly when the parser takes it.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/json_prefix.h"

using namespace shardlm;
using ojson = nlohmann::ordered_json;

namespace {

struct Writer {
    std::mt19937 rng;
    int pick(int n) { return int(rng() % unsigned(n)); }
    std::string space() {
        static const char* ws[] = {"", "", "", " ", "\n", "\t", " \r\n  "};
        return ws[pick(7)];
    }
    // A string's JSON text, characters escaped in the ways JSON allows.
    std::string str(bool key) {
        static const char* pieces[] = {"a", "Z", "é", "日本", "😀", "\"", "\\", "/", "\n", "\t", "\x01", "\x7f", " ", "0", "\x1f"};
        std::string raw = "\"";
        const int len = pick(key ? 4 : 8);
        for (int k = 0; k < len; ++k) {
            const std::string p = pieces[pick(15)];
            if (p == "\"") raw += "\\\"";
            else if (p == "\\") raw += "\\\\";
            else if (p == "/") raw += pick(2) ? "\\/" : "/";
            else if (p == "\n") raw += pick(2) ? "\\n" : "\\u000A";
            else if (p == "\t") raw += "\\t";
            else if (p == "\x01") raw += "\\u0001";
            else if (p == "\x1f") raw += pick(2) ? "\\u001F" : "\\u001f";
            else if (p == "é") raw += pick(2) ? "é" : "\\u00e9";
            else if (p == "😀") raw += pick(2) ? "😀" : "\\ud83d\\ude00";
            else raw += p;
        }
        return raw + "\"";
    }
    std::string number() {
        static const char* forms[] = {"0", "-0", "7", "-12", "3.25", "1e3", "2.5E-2", "-0.0", "123456789012", "1.0", "4e+1"};
        return forms[pick(11)];
    }
    std::string value(int depth) {
        const int kind = depth > 3 ? 2 + pick(4) : pick(6);
        if (kind == 0 || kind == 1) {
            const bool obj = kind == 0;
            std::string s = obj ? "{" : "[";
            const int items = pick(4);
            std::vector<std::string> keys;  // no key twice (parsing keeps only the last)
            for (int k = 0; k < items; ++k) {
                s += space();
                if (k) s += "," + space();
                if (obj) {
                    std::string key = str(true);
                    while (std::find(keys.begin(), keys.end(), ojson::parse(key).get<std::string>()) != keys.end()) key = str(true);
                    keys.push_back(ojson::parse(key).get<std::string>());
                    s += key + space() + ":" + space();
                }
                s += value(depth + 1);
            }
            return s + space() + (obj ? "}" : "]");
        }
        if (kind == 2) return str(false);
        if (kind == 3) return number();
        static const char* words[] = {"true", "false", "null"};
        return kind == 4 ? words[pick(3)] : number();
    }
};

// Whether nlohmann parses `text` as one value (white space around it allowed).
bool parses(const std::string& text) { return ojson::accept(text); }

// The scan of a whole text as a caller reads one: a complete value with white space only after it.
bool scan_takes(const std::string& text) {
    const JsonPrefix j = scan_json_prefix(text, 0, true);
    return j.valid && j.complete && text.find_first_not_of(" \t\r\n", j.end) == std::string::npos;
}

}  // namespace

TEST(JsonPrefix, EveryPrefixWritesAPrefixOfTheWhole) {
    Writer w{std::mt19937(7)};
    int checked = 0;
    for (int round = 0; round < 400; ++round) {
        const std::string text = w.space() + w.value(0) + w.space();
        ojson parsed;
        ASSERT_NO_THROW(parsed = ojson::parse(text)) << text;
        const std::string want = python_json(parsed);
        const JsonPrefix whole = scan_json_prefix(text, 0, true);
        ASSERT_TRUE(whole.valid && whole.complete) << text;
        EXPECT_EQ(whole.out, want) << text;
        EXPECT_EQ(text.find_first_not_of(" \t\r\n", whole.end), std::string::npos) << text;
        for (size_t cut = 0; cut <= text.size(); ++cut) {
            const JsonPrefix j = scan_json_prefix(text.substr(0, cut), 0, false);
            ASSERT_TRUE(j.valid) << cut << " of " << text;
            ASSERT_EQ(whole.out.compare(0, j.out.size(), j.out), 0) << cut << " of " << text << ": " << j.out;
            for (const JsonPrefix::Item& it : j.items) {  // an item's text so far is a prefix of its whole text
                ASSERT_LE(it.begin, it.end);
                ASSERT_LE(it.end, j.out.size());
            }
        }
        // The items one and two levels in are the whole value's members and theirs.
        if (parsed.is_object() || parsed.is_array()) {
            size_t k = 0;
            for (auto m = parsed.begin(); m != parsed.end(); ++m) {
                while (k < whole.items.size() && whole.items[k].parent != -1) ++k;
                ASSERT_LT(k, whole.items.size()) << text;
                const JsonPrefix::Item& it = whole.items[k++];
                EXPECT_TRUE(it.complete);
                EXPECT_EQ(whole.out.substr(it.begin, it.end - it.begin), python_json(*m)) << text;
                if (parsed.is_object()) {
                    EXPECT_EQ(it.key, m.key()) << text;
                }
            }
        }
        ++checked;
    }
    EXPECT_EQ(checked, 400);
}

TEST(JsonPrefix, ValidExactlyWhenTheParserTakesIt) {
    Writer w{std::mt19937(11)};
    static const char bytes[] = {'{', '}', '[', ']', '"', '\\', ',', ':', 'u', '0', '-', '.', 'e', 'x', ' ', '\x01', '\xc3', '\xff'};
    int refused = 0;
    for (int round = 0; round < 3000; ++round) {
        std::string text = w.value(0);
        const size_t at = size_t(w.pick(int(text.size())));
        const int op = w.pick(3);
        const char b = bytes[w.pick(int(sizeof bytes))];
        if (op == 0) text[at] = b;
        else if (op == 1) text.insert(at, 1, b);
        else text.erase(at, 1);
        const bool want = parses(text);
        EXPECT_EQ(scan_takes(text), want) << text;
        refused += !want;
    }
    EXPECT_GT(refused, 1000);  // the mutations do break most texts
    for (const char* text : {"01", "1.", "-", "+1", ".5", "1e", "tru", "nul", "\"\\x\"", "\"\\ud800\"", "\"\\udc00x\"",
                             "\"a\nb\"", "{\"a\" 1}", "{\"a\":1,}", "[1,]", "[1 2]", "{1:2}", "\"\xc0\xaf\"", "\"\xed\xa0\x80\""})
        EXPECT_FALSE(scan_takes(text)) << text;
    EXPECT_TRUE(scan_takes(" {\"a\": [1, {\"b\": null}], \"c\": \"\\ud83d\\ude00\"} "));
}

TEST(JsonPrefix, WritesWhatTheTextFixes) {
    auto out = [](const std::string& t) { return scan_json_prefix(t, 0, false).out; };
    EXPECT_EQ(out("{\"city\":\"Par"), "{\"city\": \"Par");
    EXPECT_EQ(out("{\"n\": 12"), "{\"n\": ");  // a number may go on
    EXPECT_EQ(out("{\"n\": 12,"), "{\"n\": 12, ");
    EXPECT_EQ(out("[tr"), "[");
    EXPECT_EQ(out("[true"), "[true");
    EXPECT_EQ(out("\"caf\\u00"), "\"caf");  // half an escape
    EXPECT_EQ(out("\"caf\\u00e9"), "\"café");
    EXPECT_EQ(out("\"\\ud83d"), "\"");  // a surrogate waits for its pair
    EXPECT_EQ(out("\"\xe6\x97"), "\"");  // half a character
    EXPECT_EQ(scan_json_prefix("12", 0, true).out, "12");
    EXPECT_EQ(scan_json_prefix("1.50", 0, true).out, "1.5");  // as nlohmann writes the number
    const JsonPrefix j = scan_json_prefix("x = {\"a\": {\"b\": [1, 2]}, \"c\": \"d", 4, false);
    ASSERT_EQ(j.items.size(), 3u);  // a, its member b, c (b's items are three levels in)
    EXPECT_EQ(j.items[0].key, "a");
    EXPECT_EQ(j.items[1].parent, 0);
    EXPECT_EQ(j.items[1].key, "b");
    EXPECT_EQ(j.items[2].key, "c");
    EXPECT_FALSE(j.items[2].complete);
    EXPECT_EQ(j.out.substr(j.items[2].begin, j.items[2].end - j.items[2].begin), "\"d");
    // A repeated key stays, where parsing keeps the last value (at the first one's place).
    EXPECT_EQ(scan_json_prefix("{\"a\": 1, \"a\": 2}", 0, true).out, "{\"a\": 1, \"a\": 2}");
    std::string deep(size_t(kMaxPythonJsonDepth) + 1, '[');
    EXPECT_TRUE(scan_json_prefix(deep, 0, false).valid);
    EXPECT_FALSE(scan_json_prefix(deep + "[", 0, false).valid);  // python_json refuses it too
}
