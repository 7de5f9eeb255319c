// GBNF grammars: the acceptor against std::regex on regular grammars (every string of a small
// alphabet), against hand-written recognisers on recursive ones, random walks that must always be
// able to finish, token masks, and the refusals.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/grammar.h"
#include "runtime/json_mode.h"

using namespace shardlm;

namespace {

std::shared_ptr<const JsonSchema> grammar(const std::string& text) {
    return std::make_shared<const JsonSchema>(compile_grammar(text, "g"));
}

// Whether the acceptor takes all of `s` (then: whether the text may end there).
bool takes(const std::shared_ptr<const JsonSchema>& g, const std::string& s, bool* may_end = nullptr) {
    JsonAcceptor a(g);
    if (!a.push(s)) return false;
    if (may_end) *may_end = a.may_end();
    return true;
}

std::string error_of(const std::string& text) {
    try {
        compile_grammar(text, "g.gbnf");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Every string over `alphabet` up to `len` characters.
std::vector<std::string> strings(const std::string& alphabet, size_t len) {
    std::vector<std::string> out = {""}, level = {""};
    for (size_t n = 0; n < len; ++n) {
        std::vector<std::string> next;
        for (const std::string& s : level)
            for (const char c : alphabet) next.push_back(s + c);
        out.insert(out.end(), next.begin(), next.end());
        level.swap(next);
    }
    return out;
}

// A random text the acceptor leads to: at each step one of the bytes it takes (or the end where
// it may end, with probability 1/4); fails the test where it takes no byte and may not end
// (a prefix taken that nothing completes), and where it has not ended after 50 x limit bytes
// unless `endless` (then it stops there).
std::string walk(const std::shared_ptr<const JsonSchema>& g, std::mt19937& rng, size_t limit, bool endless = false) {
    JsonAcceptor a(g);
    std::string s;
    for (;;) {
        if (a.complete() || (a.may_end() && (rng() % 4 == 0 || s.size() >= limit))) return s;
        std::vector<uint8_t> next;
        for (int b = 0; b < 256; ++b) {
            JsonAcceptor c = a;
            if (c.push(uint8_t(b))) next.push_back(uint8_t(b));
        }
        if (next.empty()) {
            ADD_FAILURE() << "stuck after \"" << s << "\"";
            return s;
        }
        // Past the limit, bytes that close something are preferred, then any that opens nothing.
        std::vector<uint8_t> pick = next;
        if (s.size() >= limit) {
            auto keep = [&](auto pred) {
                std::vector<uint8_t> k;
                for (const uint8_t x : pick)
                    if (pred(x)) k.push_back(x);
                if (!k.empty()) pick.swap(k);
            };
            keep([](uint8_t x) { return std::strchr("([{", x) == nullptr || x == 0; });
            keep([](uint8_t x) { return x != 0 && std::strchr(")]}\"", x) != nullptr; });
        }
        const uint8_t b = pick[rng() % pick.size()];
        EXPECT_TRUE(a.push(b));
        s += char(b);
        if (s.size() > 50 * limit) {
            if (!endless) ADD_FAILURE() << "no end in sight after \"" << s << "\"";
            return s;
        }
    }
}

}  // namespace

// Grammars of regular languages: the acceptor takes a string and may end there exactly when
// std::regex matches it whole, and takes every prefix of a match.
TEST(Grammar, RegularGrammarsMatchAsTheirRegexDoes) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {R"(root ::= "ab" | "b")", "ab|b"},
        {"root ::= x+ \"b\"\nx ::= \"a\" | \"ba\"", "(a|ba)+b"},
        {"root ::= [a-b]* \"c\"?", "[ab]*c?"},
        {"root ::= (x \" \")* x\nx ::= [ab]{1,2}", "([ab]{1,2} )*[ab]{1,2}"},
        {"root ::= x{2,3}\nx ::= \"a\" y?\ny ::= \"b\"", "(ab?){2,3}"},
        {"root ::= x{0,2} \"c\" x{1,}\nx ::= \"ab\"", "(ab){0,2}c(ab)+"},
        {"# a comment\nroot ::=\n  x | # first\n  \"c\" x\nx ::= [^c ]+", "[^c ]+|c[^c ]+"},
        {"root ::= (\"a\" | x) (\"b\" x)?\nx ::= \"c\"*", "(a|c*)(bc*)?"},
        {"root ::= . y\ny ::= \"\\x61\" | \"\\u0062\"", "[\\s\\S](a|b)"},
        {"root ::= x \" \" x\nx ::= ([a] | [b] [c])", "(a|bc) (a|bc)"},
        {"root ::= w (\" \" w)*\nw ::= [a-c]+", "[a-c]+( [a-c]+)*"},
    };
    const std::vector<std::string> all = strings("abc ", 6);
    for (const auto& [text, pattern] : cases) {
        SCOPED_TRACE(text);
        const auto g = grammar(text);
        const std::regex re(pattern, std::regex::ECMAScript);
        for (const std::string& s : all) {
            bool end = false;
            const bool took = takes(g, s, &end);
            const bool match = std::regex_match(s, re);
            EXPECT_EQ(took && end, match) << "\"" << s << "\"";
            if (!match) continue;
            for (size_t n = 0; n < s.size(); ++n)  // every prefix of a match is taken
                EXPECT_TRUE(takes(g, s.substr(0, n))) << "\"" << s << "\"";
        }
    }
}

// Recursive grammars against recognisers of their own: balanced brackets and arithmetic.
TEST(Grammar, RecursiveGrammarsMatchTheirRecognisers) {
    const auto brackets = grammar("root ::= item+\nitem ::= \"(\" item* \")\" | \"[\" item* \"]\"");
    auto balanced = [](const std::string& s) {
        std::string open;
        for (const char c : s) {
            if (c == '(' || c == '[') {
                open += c;
            } else if (open.empty() || open.back() != (c == ')' ? '(' : '[')) {
                return false;
            } else {
                open.pop_back();
            }
        }
        return !s.empty() && open.empty();
    };
    const auto arith = grammar(
        "root ::= expr\n"
        "expr ::= term ((\"+\" | \"-\") term)*\n"
        "term ::= factor (\"*\" factor)*\n"
        "factor ::= [0-9]+ | \"(\" expr \")\"\n");
    // expr := term (op term)*, term := factor (* factor)*, factor := digits | (expr)
    std::function<bool(const std::string&, size_t&)> expr;
    auto factor = [&](const std::string& s, size_t& i) {
        if (i < s.size() && s[i] == '(') {
            ++i;
            if (!expr(s, i) || i >= s.size() || s[i] != ')') return false;
            ++i;
            return true;
        }
        const size_t from = i;
        while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
        return i > from;
    };
    auto term = [&](const std::string& s, size_t& i) {
        if (!factor(s, i)) return false;
        while (i < s.size() && s[i] == '*') {
            ++i;
            if (!factor(s, i)) return false;
        }
        return true;
    };
    expr = [&](const std::string& s, size_t& i) {
        if (!term(s, i)) return false;
        while (i < s.size() && (s[i] == '+' || s[i] == '-')) {
            ++i;
            if (!term(s, i)) return false;
        }
        return true;
    };
    auto arithmetic = [&](const std::string& s) {
        size_t i = 0;
        return expr(s, i) && i == s.size();
    };
    for (const std::string& s : strings("()[]", 8)) {
        bool end = false;
        EXPECT_EQ(takes(brackets, s, &end) && end, balanced(s)) << s;
    }
    for (const std::string& s : strings("1+*()", 7)) {
        bool end = false;
        EXPECT_EQ(takes(arith, s, &end) && end, arithmetic(s)) << s;
    }
    // Random walks: never stuck, and what they end with is recognised; deep nesting included.
    std::mt19937 rng(7);
    for (int k = 0; k < 200; ++k) {
        const std::string s = walk(brackets, rng, 30);
        EXPECT_TRUE(balanced(s)) << s;
        const std::string e = walk(arith, rng, 30);
        EXPECT_TRUE(arithmetic(e)) << e;
    }
    // Nesting as deep as the acceptor's frames allow (two per level here), and no deeper.
    EXPECT_TRUE(takes(brackets, std::string(400, '(') + std::string(400, ')')));
    EXPECT_FALSE(takes(brackets, std::string(1000, '(')));
}

// A JSON grammar as llama.cpp users write one: every walk is JSON that nlohmann parses.
TEST(Grammar, JsonGrammarWalksAreJson) {
    const auto g = grammar(R"(root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= "-"? ([0-9] | [1-9] [0-9]{0,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)");
    std::mt19937 rng(11);
    size_t longest = 0;
    for (int k = 0; k < 100; ++k) {
        const std::string s = walk(g, rng, 40);
        EXPECT_TRUE(nlohmann::json::accept(s)) << s;
        longest = std::max(longest, s.size());
    }
    EXPECT_GT(longest, 40u);
    bool end = false;
    EXPECT_TRUE(takes(g, "{\"a\": [1, 2.5e3, \"x\\u00e9\", {\"b\": null}], \"c\": true}", &end));
    EXPECT_TRUE(end);
    EXPECT_FALSE(takes(g, "{\"a\" 1"));
    EXPECT_FALSE(takes(g, "[1]"));  // root is an object
}

// Non-ASCII characters in literals, classes and escapes.
TEST(Grammar, UnicodeCharacters) {
    const auto g = grammar("root ::= \"é\" [α-ω]+ \"\\U0001F600\"?");
    bool end = false;
    EXPECT_TRUE(takes(g, "éαβ", &end));
    EXPECT_TRUE(end);
    EXPECT_TRUE(takes(g, "éω\xF0\x9F\x98\x80", &end));
    EXPECT_TRUE(end);
    EXPECT_FALSE(takes(g, "éa"));
    EXPECT_FALSE(takes(g, "e"));
    EXPECT_TRUE(takes(g, "\xC3", &end));  // half of é's bytes
    EXPECT_FALSE(end);
    EXPECT_FALSE(takes(g, "\xC4"));
}

// Token masks over a small vocabulary: a walk that draws only allowed tokens ends recognised.
TEST(Grammar, TokenMasksKeepTheTextInTheLanguage) {
    const auto g = grammar("root ::= item+\nitem ::= \"(\" item* \")\" | \"x\"");
    JsonVocab vocab({"(", ")", "x", "((", "))", "()", "x)", ")(", "(x", "xx)", "", "y"});
    std::mt19937 rng(3);
    for (int k = 0; k < 100; ++k) {
        JsonAcceptor a(g);
        std::string s;
        while (!a.complete() && !(a.may_end() && (rng() % 3 == 0 || s.size() > 40))) {
            const std::vector<uint8_t>& m = vocab.allowed(a);
            std::vector<int32_t> ok;
            for (int32_t id = 0; id < vocab.size(); ++id)
                if (m[size_t(id)]) ok.push_back(id);
            ASSERT_FALSE(ok.empty()) << s;
            EXPECT_FALSE(m[10] || m[11]);
            const int32_t t = ok[rng() % ok.size()];
            ASSERT_TRUE(a.push(vocab.bytes(t))) << s << " + " << vocab.bytes(t);
            s += vocab.bytes(t);
            ASSERT_LT(s.size(), 2000u);
        }
        int depth = 0;
        for (const char c : s) {
            depth += c == '(' ? 1 : c == ')' ? -1 : 0;
            EXPECT_GE(depth, 0) << s;
        }
        EXPECT_EQ(depth, 0) << s;
    }
}

// Mutated grammars: each compiles or is refused with an Error (never a crash or a hang), and
// the ones that compile lead random walks that can always go on or end.
TEST(Grammar, MutatedGrammarsCompileOrAreRefused) {
    const std::vector<std::string> seeds = {
        "root ::= item+\nitem ::= \"(\" item* \")\" | [a-c]",
        "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" expr \")\"",
        "root ::= w (\" \" w){0,3} \".\"?\nw ::= [a-z]{1,4} | \"'\" w \"'\"",
        "root ::= (x | y)* \"!\"\nx ::= \"ab\" y?\ny ::= [^a-y\\n]",
    };
    const std::string alphabet = "()[]|*+?{},-\"\\ \nabxy:=^.#0123";
    std::mt19937 rng(5);
    int compiled = 0;
    for (int k = 0; k < 1500; ++k) {
        std::string g = seeds[rng() % seeds.size()];
        for (int m = 0, edits = 1 + int(rng() % 3); m < edits; ++m) {
            const size_t at = rng() % (g.size() + 1);
            const char c = alphabet[rng() % alphabet.size()];
            switch (rng() % 3) {
                case 0: g.insert(at, 1, c); break;
                case 1: if (at < g.size()) g.erase(at, 1); break;
                default: if (at < g.size()) g[at] = c; break;
            }
        }
        std::shared_ptr<const JsonSchema> sc;
        try {
            sc = std::make_shared<const JsonSchema>(compile_grammar(g, "g"));
        } catch (const Error&) {
            continue;
        }
        ++compiled;
        for (int w = 0; w < 3; ++w) {
            SCOPED_TRACE(g);
            walk(sc, rng, 12, true);  // (the walk's way out, closing brackets, need not end these)
        }
    }
    EXPECT_GT(compiled, 150);
}

TEST(Grammar, BadGrammarsAreRefusedByName) {
    auto has = [](const std::string& text, const std::string& part) {
        const std::string e = error_of(text);
        EXPECT_NE(e.find(part), std::string::npos) << text << " -> " << e;
    };
    has("", "no rules");
    has("x ::= \"a\"", "no rule named root");
    has("root ::= x", "rule x is used but not defined");
    has("root ::= \"a\"\nroot ::= \"b\"", "line 2: rule root is defined twice");
    has("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"", "rule expr can begin with itself");
    has("root ::= x? root \"a\" | \"b\"\nx ::= \"c\"", "rule root can begin with itself");
    has("root ::= (x?)*\nx ::= \"a\"", "a repetition of something that may be empty");
    has("root ::= \"a\" x | \"c\"\nx ::= \"b\" x", "can never end (each alternative needs one of them again): x");
    has("root ::= \"\"", "matches only the empty text");
    has("root ::= x?\nx ::= \"\"", "matches only the empty text");
    has("root ::= \"a", "without its closing");
    has("root ::= [a-", "without its ']'");
    has("root ::= []", "an empty character class");
    has("root ::= [z-a]", "out of order");
    has("root ::= (\"a\"", "without its ')'");
    has("root ::= \"a\")", "unexpected ')'");
    has("root ::= \"a\"\n\n  \"b\"", "line 3: a rule name expected");
    has("root = \"a\"", "'::=' expected");
    has("root ::= \"\\q\"", "the escape \\q is not supported");
    has("root ::= \"\\uD800\"", "no Unicode character");
    has("root ::= \"a\"{3,2}", "n below m");
    has("root ::= \"a\"{2000}", "past {1000}");
    has("root ::= \"a\"*?", "two repetitions in a row");
    has("root ::= <think>", "token references");
    has("root ::= \"\xC3\"", "invalid UTF-8");
    std::string big = "root ::=";
    for (int k = 0; k < 11; ++k) big += " x{0,1000}";
    has(big + " \"b\"\nx ::= \"a\"", "more than 20000 nodes");
    std::string chain = "root ::= r0\n";  // each rule begins with the next: the acceptor would recurse through all
    for (int k = 0; k < 300; ++k) chain += cat("r", k, " ::= r", k + 1, " \"a\"\n");
    has(chain + "r300 ::= \"b\"", "rules begin with rules more than 256 deep before a character (from rule r");
    EXPECT_EQ(error_of("root ::= \"a\"   # fine\n"), "");
}
