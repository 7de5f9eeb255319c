// JSON Schema pattern and format: the DFA against std::regex (ECMAScript, the dialect JSON Schema
// names) on ASCII strings, the formats on hand-picked strings, the refusals, and the acceptor
// holding a structured reply's strings to them.
#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "core/error.h"
#include "runtime/json_mode.h"
#include "runtime/json_pattern.h"
#include "runtime/json_schema.h"

using namespace shardlm;

namespace {

// Whether the DFA matches the whole of `s` (UTF-8).
bool matches(const PatternDfa& d, const std::string& s) {
    int32_t st = d.start;
    for (size_t i = 0; i < s.size();) {
        const uint8_t b = uint8_t(s[i]);
        const int n = b < 0x80 ? 0 : b < 0xE0 ? 1 : b < 0xF0 ? 2 : 3;
        uint32_t cp = n == 0 ? b : b & (0x3Fu >> n);
        for (int k = 1; k <= n; ++k) cp = (cp << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
        i += size_t(n) + 1;
        st = d.next(st, cp);
        if (st < 0) return false;
    }
    return d.accept[size_t(st)] != 0;
}

// How far the acceptor of schema `sc` takes `text`: its length when all of it.
size_t bytes_taken(const std::shared_ptr<const JsonSchema>& sc, const std::string& text) {
    JsonAcceptor a(sc);
    for (size_t i = 0; i < text.size(); ++i)
        if (!a.push(uint8_t(text[i]))) return i;
    return text.size();
}

std::string error_of(const std::string& pattern) {
    try {
        compile_pattern(pattern, "p");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

// Every string of the alphabet up to length 5, and random longer ones, match under the DFA as
// under std::regex_search (unanchored unless ^ and $ say otherwise).
TEST(JsonPattern, MatchesAsEcmaScriptRegexDoes) {
    const std::vector<std::string> patterns = {
        "a",         "^a",        "a$",          "^a$",          "^ab*c?$",      "^(ab|ba)+$",   "^[a-c]{2,3}$",
        "^a{2}b{1,}$", "^(?:a|b)*a(?:a|b)$", "^[^ab]*$", "\\d",     "^\\w+\\s\\W?$", "^.{0,3}$",     "^x?$",
        "^(a|)b$",   "b(?:a)",    "^[\\-.]+$",   "^a\\.b$",      "^[a\\]]+$",    "^\\x61\\u0062$", "^(a*)*b$",
        "^[^\\d\\s]+$", "^a{0}b$",  "a|b|x",       "^[.-a]$",      "^a+?b??$",     "^\\D\\S$",    "ab{2,}?"};
    const std::string alphabet = "ab1 .-x]";
    std::vector<std::string> strings = {""};
    for (size_t len = 1, from = 0; len <= 5; ++len) {
        const size_t to = strings.size();
        for (size_t k = from; k < to; ++k)
            for (const char c : alphabet) strings.push_back(strings[k] + c);
        from = to;
    }
    std::mt19937 rng(5);
    for (int k = 0; k < 2000; ++k) {
        std::string s(size_t(rng() % 14), ' ');
        for (char& c : s) c = alphabet[rng() % alphabet.size()];
        strings.push_back(s);
    }
    for (const std::string& p : patterns) {
        const PatternDfa d = compile_pattern(p, "p");
        const std::regex re(p, std::regex::ECMAScript);
        size_t hits = 0;
        for (const std::string& s : strings) {
            const bool want = std::regex_search(s, re);
            ASSERT_EQ(matches(d, s), want) << "pattern " << p << " on \"" << s << "\"";
            hits += want;
        }
        EXPECT_GT(hits, 0u) << p;
    }
}

// Characters past ASCII are code points; classes and '.' take them whole.
TEST(JsonPattern, CodePoints) {
    const PatternDfa d = compile_pattern("^[é-ë]+.東$", "p");
    EXPECT_TRUE(matches(d, "éêë😀東"));
    EXPECT_FALSE(matches(d, "eé東"));
    EXPECT_FALSE(matches(d, "é東"));
    EXPECT_TRUE(d.any(d.start, 0xE8, 0xEB));
    EXPECT_FALSE(d.any(d.start, 0x100, 0x1FF));
    EXPECT_FALSE(matches(compile_pattern("^.$", "p"), "\n"));
}

TEST(JsonPattern, Formats) {
    auto ok = [](const char* format, const std::string& s) {
        return matches(compile_pattern(format_pattern(format), format), s);
    };
    EXPECT_TRUE(ok("date", "2024-02-28"));
    EXPECT_TRUE(ok("date", "1999-12-31"));
    EXPECT_FALSE(ok("date", "2024-02-30"));
    EXPECT_FALSE(ok("date", "2024-04-31"));
    EXPECT_FALSE(ok("date", "2024-13-01"));
    EXPECT_FALSE(ok("date", "24-01-01"));
    EXPECT_TRUE(ok("time", "23:59:59Z"));
    EXPECT_TRUE(ok("time", "08:00:00.125+02:00"));
    EXPECT_FALSE(ok("time", "24:00:00Z"));
    EXPECT_FALSE(ok("time", "08:00:00"));  // RFC 3339's full-time has its offset
    EXPECT_TRUE(ok("date-time", "2026-12-05T01:30:00Z"));
    EXPECT_FALSE(ok("date-time", "2026-12-05 01:30:00Z"));
    EXPECT_TRUE(ok("uuid", "123e4567-e89b-12d3-a456-426614174000"));
    EXPECT_FALSE(ok("uuid", "123e4567e89b12d3a456426614174000"));
    EXPECT_TRUE(ok("ipv4", "192.168.0.255"));
    EXPECT_FALSE(ok("ipv4", "192.168.0.256"));
    EXPECT_FALSE(ok("ipv4", "01.2.3.4"));
    EXPECT_TRUE(ok("email", "first.last+tag@mail.example.org"));
    EXPECT_FALSE(ok("email", "a..b@example.org"));
    EXPECT_FALSE(ok("email", "a@localhost"));
    EXPECT_TRUE(ok("hostname", "a-b.example"));
    EXPECT_FALSE(ok("hostname", "-a.example"));
    EXPECT_FALSE(ok("hostname", std::string(64, 'a')));
    EXPECT_TRUE(ok("uri", "https://example.org:8080/a/b%20c?q=1&r=/x#top"));
    EXPECT_TRUE(ok("uri", "urn.x://h"));
    EXPECT_FALSE(ok("uri", "https://exa mple.org"));
    EXPECT_FALSE(ok("uri", "https://example.org/%zz"));
    EXPECT_FALSE(ok("uri", "/relative/path"));
    EXPECT_TRUE(ok("date", "2024-02-29"));
    EXPECT_TRUE(ok("date", "2000-02-29"));
    EXPECT_TRUE(ok("date", "1996-02-29"));
    EXPECT_FALSE(ok("date", "2023-02-29"));
    EXPECT_FALSE(ok("date", "1900-02-29"));
    EXPECT_FALSE(ok("date", "2100-02-29"));
    // Every 29 February of years 0000-2999 as the leap rule says.
    for (int y = 0; y < 3000; ++y) {
        char d[16];
        std::snprintf(d, sizeof d, "%04d-02-29", y);
        ASSERT_EQ(ok("date", d), (y % 4 == 0 && y % 100 != 0) || y % 400 == 0) << d;
    }
    for (const char* a : {"::", "::1", "1::", "2001:db8::8a2e:370:7334", "2001:0db8:0000:0000:0000:ff00:0042:8329",
                          "::ffff:192.0.2.128", "fe80::1:2:3:4:5:6", "1:2:3:4:5:6:7::", "1:2:3:4:5:6::8", "a::b:c:1.2.3.4"})
        EXPECT_TRUE(ok("ipv6", a)) << a;
    for (const char* a : {":", ":::", "1:2:3:4:5:6:7", "1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", "g::", "::1.2.3",
                          "1:2:3:4:5:6:7:1.2.3.4", "fe80::1%eth0"})
        EXPECT_FALSE(ok("ipv6", a)) << a;
    for (const char* d : {"P1Y", "P1Y2M3D", "P2M", "P3D", "PT4H", "PT4H5M6S", "PT0.5S", "P1DT2H3M4.25S", "P2W", "PT5M"})
        EXPECT_TRUE(ok("duration", d)) << d;
    for (const char* d : {"P", "PT", "P1H", "PT1D", "P1W2D", "P1DT", "1D", "P1.5D", "PT1S2M", "P1D2M"})
        EXPECT_FALSE(ok("duration", d)) << d;
    EXPECT_TRUE(ok("uuid4", "123e4567-e89b-42d3-a456-426614174000"));
    EXPECT_FALSE(ok("uuid4", "123e4567-e89b-12d3-a456-426614174000"));  // version 1
    EXPECT_FALSE(ok("uuid4", "123e4567-e89b-42d3-c456-426614174000"));  // variant c
    EXPECT_TRUE(ok("uuid1", "123e4567-e89b-12d3-b456-426614174000"));
    EXPECT_TRUE(ok("ipvanyaddress", "10.0.0.1"));
    EXPECT_TRUE(ok("ipvanyaddress", "fe80::1"));
    EXPECT_FALSE(ok("ipvanyaddress", "10.0.0"));
    EXPECT_EQ(format_pattern("uuid2"), "");
    EXPECT_EQ(format_pattern("uri-reference"), "");
}

TEST(JsonPattern, RefusesWhatItDoesNotTake) {
    EXPECT_NE(error_of("a(?=b)").find("p: lookahead and lookbehind"), std::string::npos);
    EXPECT_NE(error_of("(?<!a)b").find("lookahead and lookbehind"), std::string::npos);
    EXPECT_NE(error_of("(a)\\1").find("backreferences"), std::string::npos);
    EXPECT_NE(error_of("\\bword").find("word boundaries"), std::string::npos);
    EXPECT_NE(error_of("a^b").find("anchors"), std::string::npos);
    EXPECT_NE(error_of("^a$|^b$").find("anchors"), std::string::npos);
    EXPECT_NE(error_of("a{3,2}").find("m below n"), std::string::npos);
    EXPECT_NE(error_of("a{1001}").find("past {1000}"), std::string::npos);
    EXPECT_NE(error_of("(ab").find("without its ')'"), std::string::npos);
    EXPECT_NE(error_of("ab)").find("without its '('"), std::string::npos);
    EXPECT_NE(error_of("[ab").find("without its ']'"), std::string::npos);
    EXPECT_NE(error_of("*a").find("nothing to repeat"), std::string::npos);
    EXPECT_NE(error_of("a**").find("a quantifier after a quantifier"), std::string::npos);
    EXPECT_NE(error_of("[z-a]").find("out of order"), std::string::npos);
    EXPECT_NE(error_of("\\p{L}").find("\\p{...}"), std::string::npos);
    EXPECT_NE(error_of("\\q").find("the escape \\q"), std::string::npos);
    EXPECT_NE(error_of("^[]$").find("no string matches"), std::string::npos);
    EXPECT_NE(error_of("^(?:a|b)*a(?:a|b){14}$").find("more than 4096 automaton states"), std::string::npos);
    EXPECT_NE(error_of(std::string("\xff")).find("not UTF-8"), std::string::npos);
    // Bounds on the work a request's pattern may cause (each refused in well under a second).
    EXPECT_NE(error_of(std::string(300, '(') + "a" + std::string(300, ')')).find("groups nested deeper than 128"),
              std::string::npos);
    EXPECT_NE(error_of("^(?:a{1000}){50}$").find("too large"), std::string::npos);
    EXPECT_NE(error_of("^(?:\\w+\\s?){1,100}$").find("too complex to compile"), std::string::npos);
    EXPECT_EQ(error_of("{a}"), "");  // a brace that starts no quantifier is a literal
    EXPECT_TRUE(matches(compile_pattern("^(?<year>\\d{4})$", "p"), "2026"));  // a named group is a group
}

// In a structured reply the string's characters follow the DFA byte by byte: a UTF-8 lead byte
// is taken only when a character it begins can follow, an escape only when its character can,
// \u escapes never, the closing quote only where the pattern may end.
TEST(JsonPattern, AcceptorHoldsStringsToIt) {
    const auto sc = std::make_shared<const JsonSchema>(compile_json_schema(
        R"({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-c]{2}\\d$"},
            "when": {"format": "date"}, "t": {"type": "string", "pattern": "é\\n"}, "pw": {"type": "string", "format": "password"},
            "ip": {"type": "string", "format": "ipv6"}}, "required": ["id"]})",
        "test"));
    auto taken = [&](const std::string& text) { return bytes_taken(sc, text); };
    auto complete = [&](const std::string& text) {
        JsonAcceptor a(sc);
        return a.push(text) && a.complete();
    };
    EXPECT_TRUE(complete(R"({"id": "ab1"})"));
    EXPECT_TRUE(complete(R"({"id": "cc0", "when": "2026-12-05"})"));
    EXPECT_TRUE(complete(R"({"id": "cc0", "pw": "any \" text", "ip": "::1"})"));  // password: a plain string
    EXPECT_EQ(taken(R"({"id": "cc0", "ip": "::1:"})"), 25u);  // "::1:" goes on (::1:2), no quote after it
    EXPECT_EQ(taken(R"({"id": "ab"})"), 10u);        // the quote comes too early
    EXPECT_EQ(taken(R"({"id": "abc"})"), 10u);       // c is not a digit
    EXPECT_EQ(taken(R"({"id": "\u0061b1"})"), 8u);  // \u escapes are not taken
    EXPECT_EQ(taken(R"({"id": "\n"})"), 8u);        // the pattern takes no newline
    EXPECT_EQ(taken(R"({"id": "ab1", "when": "2026-02-30"})"), 31u);
    EXPECT_TRUE(complete("{\"id\": \"ab1\", \"t\": \"x\xc3\xa9\\ny\"}"));
    EXPECT_EQ(taken("{\"id\": \"ab1\", \"t\": \"\xc3\xa9\\t\"}"), 24u);  // it ends before holding é and a newline
    EXPECT_EQ(taken("{\"id\": \"ab1\", \"t\": \"\\u00e9"), 21u);          // any character may come, but not by \u
    EXPECT_EQ(taken("{\"id\": \"\xc3\xa9"), 8u);  // no character from U+00C0 on is in [a-c]
    // The DFA's state is in the mask key: two strings at different places of it take different tokens.
    JsonAcceptor one(sc), two(sc);
    ASSERT_TRUE(one.push(std::string(R"({"id": "a)")));
    ASSERT_TRUE(two.push(std::string(R"({"id": "ab)")));
    EXPECT_NE(one.key(4, 6), two.key(4, 6));
    JsonVocab v({"1", "b", "\""});
    EXPECT_EQ(v.allowed(one), (std::vector<uint8_t>{0, 1, 0}));
    EXPECT_EQ(v.allowed(two), (std::vector<uint8_t>{1, 0, 0}));
}

// An integer's bounds as a pattern: every integer from -1500 to 1500 (and the ends of int64)
// matches exactly when it lies in the range; leading zeros and "-0" never do.
TEST(JsonPattern, IntegerRanges) {
    using B = std::optional<int64_t>;
    const std::vector<std::pair<B, B>> ranges = {
        {0, std::nullopt}, {1, std::nullopt}, {std::nullopt, -1}, {std::nullopt, 0}, {-5, 5}, {-1000, -10}, {7, 7},
        {0, 9}, {10, 99}, {1, 100}, {13, 1234}, {-1234, 987}, {std::nullopt, std::nullopt}, {100, std::nullopt},
        {-99, std::nullopt}, {std::nullopt, 250}, {199, 1001}, {INT64_MIN, INT64_MAX}, {INT64_MAX - 5, std::nullopt}};
    for (const auto& [lo, hi] : ranges) {
        const std::string p = integer_range_pattern(lo, hi);
        const PatternDfa d = compile_pattern(p, "range");
        for (int64_t v = -1500; v <= 1500; ++v)
            ASSERT_EQ(matches(d, std::to_string(v)), (!lo || v >= *lo) && (!hi || v <= *hi)) << p << " on " << v;
        for (const int64_t v : {INT64_MIN, INT64_MIN + 1, INT64_MAX - 6, INT64_MAX - 5, INT64_MAX})
            EXPECT_EQ(matches(d, std::to_string(v)), (!lo || v >= *lo) && (!hi || v <= *hi)) << p << " on " << v;
        for (const char* odd : {"-0", "01", "007", "-01", "", "-", "1e3", "1.0"}) EXPECT_FALSE(matches(d, odd)) << p << " on " << odd;
    }
}

// A number's range: every text of up to 5 characters of "-0123.5" (and longer ones at the
// bounds) is matched exactly when it is a JSON number without exponent within the bounds (zero
// written with a minus sign left out).
TEST(JsonPattern, NumberRanges) {
    using B = std::optional<DecimalBound>;
    auto in = [](const char* t) { return B(DecimalBound{t, false}); };
    auto ex = [](const char* t) { return B(DecimalBound{t, true}); };
    const std::vector<std::pair<B, B>> ranges = {
        {in("0"), in("1")},      {ex("0"), ex("1")},      {in("0"), std::nullopt}, {ex("0"), std::nullopt},
        {std::nullopt, in("0")}, {std::nullopt, ex("0")}, {in("-2.5"), in("3.25")}, {ex("-2.5"), ex("3.25")},
        {in("0.05"), in("0.5")}, {ex("0.05"), in("0.3")}, {in("-1"), ex("-0.25")}, {in("1.5"), in("1.5")},
        {in("12"), in("320.5")}, {std::nullopt, in("-1.05")}, {in("-0"), ex("0.005")}, {in("0.25"), in("0.3")},
        {ex("-0.5"), std::nullopt}, {std::nullopt, std::nullopt}};
    const std::regex json_number("-?(0|[1-9][0-9]*)(\\.[0-9]+)?");
    std::vector<std::string> texts = {"", "0.0000", "0.0500", "0.04999", "0.05001", "3.2500", "3.2501", "-2.5000",
                                      "-2.4999", "320.50", "320.51", "0.00499", "0.00500", "-0.0000", "1.50000"};
    std::vector<std::string> level = {""};
    for (int n = 0; n < 5; ++n) {
        std::vector<std::string> next;
        for (const std::string& t : level)
            for (const char c : std::string("-0123.5")) next.push_back(t + c);
        texts.insert(texts.end(), next.begin(), next.end());
        level.swap(next);
    }
    for (const auto& [lo, hi] : ranges) {
        const std::string p = number_range_pattern(lo, hi);
        ASSERT_FALSE(p.empty());
        const PatternDfa d = compile_pattern(p, "range");
        for (const std::string& t : texts) {
            bool want = std::regex_match(t, json_number);
            if (want) {  // (-0, -0.0, ... are 0 written otherwise: not generated)
                const double v = std::strtod(t.c_str(), nullptr);
                want = !(v == 0 && t[0] == '-');
                if (lo) want = want && (lo->exclusive ? v > std::strtod(lo->text.c_str(), nullptr) : v >= std::strtod(lo->text.c_str(), nullptr));
                if (hi) want = want && (hi->exclusive ? v < std::strtod(hi->text.c_str(), nullptr) : v <= std::strtod(hi->text.c_str(), nullptr));
            }
            ASSERT_EQ(matches(d, t), want) << p << " on \"" << t << "\"";
        }
    }
    EXPECT_EQ(number_range_pattern(in("1"), ex("1")), "");
    EXPECT_EQ(number_range_pattern(in("2"), in("1.5")), "");
    EXPECT_EQ(number_range_pattern(ex("0"), in("-0")), "");
}

// multipleOf's DFA: every text of up to 6 characters of "-01235." is matched exactly when it is
// a JSON number without exponent, with at most q fraction digits (none for integers), not "-0",
// and its value times 10^q a multiple of p.
TEST(JsonPattern, Multiples) {
    struct Case {
        uint64_t p;
        int q;
        bool fraction;
    };
    const std::vector<Case> cases = {{5, 0, false}, {3, 0, true}, {5, 1, true}, {1, 2, true}, {25, 2, true},
                                     {7, 0, false}, {15, 1, true}, {1, 0, false}, {4, 1, false}};
    const std::regex json_number("-?(0|[1-9][0-9]*)(\\.[0-9]+)?");
    std::vector<std::string> texts = {""}, level = {""};
    for (int n = 0; n < 6; ++n) {
        std::vector<std::string> next;
        for (const std::string& t : level)
            for (const char c : std::string("-01235.")) next.push_back(t + c);
        texts.insert(texts.end(), next.begin(), next.end());
        level.swap(next);
    }
    for (const Case& c : cases) {
        const PatternDfa d = multiple_of_dfa(c.p, c.q, c.fraction, "m");
        for (const std::string& t : texts) {
            bool want = std::regex_match(t, json_number) && t != "-0";
            const size_t dot = t.find('.');
            const size_t fd = dot == std::string::npos ? 0 : t.size() - dot - 1;
            if (want && (c.fraction ? fd > size_t(c.q) : fd > 0)) want = false;
            if (want) {  // the digits as one integer, scaled to q fraction digits
                std::string digits;
                for (const char x : t)
                    if (x >= '0' && x <= '9') digits += x;
                digits += std::string(size_t(c.q) - fd, '0');
                want = std::stoull(digits) % c.p == 0;
            }
            ASSERT_EQ(matches(d, t), want) << c.p << "/10^" << c.q << " on \"" << t << "\"";
        }
    }
    EXPECT_THROW(multiple_of_dfa(5000, 0, false, "m"), Error);
}

// intersect(): the strings both DFAs match.
TEST(JsonPattern, Intersection) {
    const PatternDfa d = intersect(compile_pattern("^a+$", "x"), compile_pattern("^[ab]{2,3}$", "y"), "both");
    for (const char* s : {"a", "aa", "aaa", "aaaa", "ab", "ba", ""})
        EXPECT_EQ(matches(d, s), std::string(s) == "aa" || std::string(s) == "aaa") << s;
    try {
        intersect(compile_pattern("^a+$", "x"), compile_pattern("^b+$", "y"), "both");
        ADD_FAILURE() << "no throw";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("both: no string matches both"), std::string::npos) << e.what();
    }
}

// In a schema: minimum, maximum and the exclusive forms (fractions round inwards) hold an
// integer's digits, and a number's (without exponent); bounds with nothing between them are refused.
TEST(JsonPattern, IntegerBoundsInASchema) {
    const auto sc = std::make_shared<const JsonSchema>(compile_json_schema(
        R"({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 150},
            "k": {"type": "integer", "minimum": -2.5, "maximum": 3.5}, "free": {"maximum": -7}}})",
        "test"));
    auto taken = [&](const std::string& text) { return bytes_taken(sc, text); };
    const std::string ok = R"({"age": 149, "k": -2, "free": -7})";
    EXPECT_EQ(taken(ok), ok.size());
    EXPECT_EQ(taken(R"({"age": -1})"), 8u);
    EXPECT_EQ(taken(R"({"age": 150})"), 10u);  // the 0 that would make 150
    EXPECT_EQ(taken(R"({"age": 1500})"), 10u);
    EXPECT_EQ(taken(R"({"age": 07})"), 9u);
    EXPECT_EQ(taken(R"({"age": 1.5})"), 9u);
    EXPECT_EQ(taken(R"({"k": -3})"), 7u);
    EXPECT_EQ(taken(R"({"k": 4})"), 6u);
    EXPECT_EQ(taken(R"({"free": -6})"), 11u);  // -6 may still become -60: the end is refused
    // A number's bounds as Pydantic writes them (Field(ge=0, le=1), confloat(gt=0)).
    const auto num = std::make_shared<const JsonSchema>(compile_json_schema(
        R"({"type": "object", "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1},
            "t": {"type": "number", "exclusiveMinimum": 0.5, "minimum": 0.25}}})",
        "test"));
    auto took = [&](const std::string& text) { return bytes_taken(num, text); };
    const std::string fine = R"({"p": 0.75, "t": 0.5001})";
    EXPECT_EQ(took(fine), fine.size());
    EXPECT_EQ(took(R"({"p": 1.0, "t": 7})"), std::string(R"({"p": 1.0, "t": 7})").size());
    EXPECT_EQ(took(R"({"p": 1.5})"), 8u);   // 1. then only zeros
    EXPECT_EQ(took(R"({"p": 2})"), 6u);
    EXPECT_EQ(took(R"({"p": -0.1})"), 6u);
    EXPECT_EQ(took(R"({"p": 1e-3})"), 7u);  // no exponents
    EXPECT_EQ(took(R"({"t": 0.5})"), 9u);   // 0.5 may still become 0.51: the end is refused
    EXPECT_EQ(took(R"({"t": 0.4})"), 8u);
    // multipleOf, with bounds or alone; pattern and format together.
    const auto mult = std::make_shared<const JsonSchema>(compile_json_schema(
        R"({"type": "object", "properties": {"five": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 20},
            "quarter": {"type": "number", "multipleOf": 0.25, "maximum": 1}, "any": {"multipleOf": 3},
            "mail": {"type": "string", "format": "email", "pattern": "@example\\.org$"}}})",
        "test"));
    auto m = [&](const std::string& text) { return bytes_taken(mult, text); };
    for (const char* ok : {R"({"five": 15})", R"({"five": 0})", R"({"quarter": -2.75})", R"({"quarter": 0.5})", R"({"any": -21})",
                           R"({"mail": "a.b@example.org"})"})
        EXPECT_EQ(m(ok), std::string(ok).size()) << ok;
    EXPECT_EQ(m(R"({"five": 25})"), 10u);   // past the maximum
    EXPECT_EQ(m(R"({"five": 7})"), 9u);     // 7 begins no multiple of 5 up to 20
    EXPECT_EQ(m(R"({"quarter": 0.3})"), 14u);
    EXPECT_EQ(m(R"({"quarter": 1.25})"), 14u);
    EXPECT_EQ(m(R"({"any": 2.0})"), 9u);    // an integer: no fraction
    EXPECT_EQ(m(R"({"mail": "a@b.com"})"), 12u);  // after '@' only example.org
    auto error_of = [](const std::string& text) {
        try {
            compile_json_schema(text, "s");
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"x": {"type": "number", "minimum": 1, "exclusiveMaximum": 1}}})")
                  .find("#/properties/x: no number lies between the bounds 1 and 1"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0}}})")
                  .find("#/properties/x/multipleOf: must be a number above 0"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"x": {"type": "number", "multipleOf": 1e-12}}})")
                  .find("more than 9 fraction digits"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"x": {"type": "integer", "multipleOf": 12345}}})")
                  .find("multipleOf 12345 needs more than 4096 automaton states"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"x": {"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6}}})")
                  .find("no string matches both"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"x": {"type": "string", "format": "uuid", "pattern": "^z"}}})")
                  .find("#/properties/x: pattern and format: no string matches both"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"x": {"type": "number", "minimum": 1e-30}}})")
                  .find("#/properties/x/minimum: bounds with more than 20 fraction digits"),
              std::string::npos);
    EXPECT_EQ(error_of(R"({"type": "object", "properties": {"x": {"type": "integer", "minimum": 3, "exclusiveMaximum": 4}}})"),
              "");  // [3, 3]
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"x": {"type": "integer", "exclusiveMinimum": 3, "maximum": 3.5}}})")
                  .find("no integer lies in [4, 3]"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"x": {"type": "integer", "minimum": 1e30}}})").find("beyond 10^18"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"x": {"type": "integer", "minimum": "0"}}})").find("must be a number"),
              std::string::npos);
}

// guided_regex: raw text matching the pattern whole; it may end in an accepting state and is
// complete where nothing can follow.
TEST(JsonPattern, GuidedRegexText) {
    const auto sc = std::make_shared<const JsonSchema>(regex_schema("(yes|no)|[0-9]{2,3}|é+", "r"));
    JsonAcceptor a(sc);
    EXPECT_FALSE(a.may_end());
    EXPECT_FALSE(JsonAcceptor(a).push(std::string("x")));
    ASSERT_TRUE(a.push(std::string("12")));
    EXPECT_TRUE(a.may_end());
    EXPECT_FALSE(a.complete());
    ASSERT_TRUE(a.push(std::string("3")));
    EXPECT_TRUE(a.complete());
    EXPECT_FALSE(a.push(std::string("4")));
    JsonAcceptor y(sc);
    ASSERT_TRUE(y.push(std::string("ye")));
    EXPECT_FALSE(y.may_end());
    ASSERT_TRUE(y.push(std::string("s")));
    EXPECT_TRUE(y.complete());
    JsonAcceptor e(sc);
    ASSERT_TRUE(e.push(std::string("\xc3")));
    EXPECT_FALSE(e.may_end());  // inside a character
    ASSERT_TRUE(e.push(std::string("\xa9\xc3\xa9")));
    EXPECT_TRUE(e.may_end());
    EXPECT_FALSE(JsonAcceptor(e).push(std::string("\xc3\xa8")));  // è: the lead byte is taken, è is not
    JsonAcceptor opt(std::make_shared<const JsonSchema>(regex_schema("a*", "r")));
    EXPECT_TRUE(opt.may_end());  // the empty text matches
    EXPECT_THROW(regex_schema("", "r"), Error);
    EXPECT_THROW(regex_schema("(a)\\1", "r"), Error);
    EXPECT_TRUE(matches(compile_pattern("ab", "p", true), "ab"));
    EXPECT_FALSE(matches(compile_pattern("ab", "p", true), "xab"));
}

// A pattern under minLength/maxLength: each character is taken only where the match can still be
// completed within the limits (a UTF-8 lead byte too), the quote only within them.
TEST(JsonPattern, PatternWithinLengthLimits) {
    const auto sc = std::make_shared<const JsonSchema>(compile_json_schema(
        R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "^[a-z]+\\d*$", "minLength": 3,
            "maxLength": 5}, "t": {"type": "string", "pattern": "é", "maxLength": 2}}})",
        "test"));
    auto taken = [&](const std::string& text) { return bytes_taken(sc, text); };
    const std::string ok = R"({"s": "ab12", "t": "é"})";
    EXPECT_EQ(taken(ok), ok.size());
    EXPECT_EQ(taken(R"({"s": "ab"})"), 9u);      // too short to close
    EXPECT_EQ(taken(R"({"s": "abcdef"})"), 12u);  // a sixth character
    EXPECT_EQ(taken(R"({"s": "1"})"), 7u);        // the pattern's letter first
    EXPECT_EQ(taken("{\"t\": \"a\xc3\xa9\"}"), 12u);
    EXPECT_EQ(taken("{\"t\": \"ab"), 8u);           // then only é fits in two characters
    EXPECT_EQ(taken("{\"t\": \"a\xc3\xa8"), 9u);    // è: its lead byte is é's, the second byte is not
    // The count is in the mask key where the limits can see it.
    JsonAcceptor one(sc), two(sc);
    ASSERT_TRUE(one.push(std::string(R"({"s": "ab)")));
    ASSERT_TRUE(two.push(std::string(R"({"s": "abc)")));
    EXPECT_NE(one.key(4, 6), two.key(4, 6));
}
