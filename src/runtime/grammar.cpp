#include "runtime/grammar.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace shardlm {
namespace {
using Kind = JsonSchema::Kind;
using Node = JsonSchema::Node;

constexpr int kMaxRepeat = 1000;  // {m,n}: the most copies one repetition makes
constexpr int kMaxNest = 128;     // groups inside groups (the parser recurses per level)
constexpr int32_t kMaxLeads = 256;  // rules that begin with rules that begin with ...: the acceptor
                                    // recurses through them at one byte

// The grammar as written: a rule's alternatives, each a sequence of elements.
struct Elem;
using Sequence = std::vector<Elem>;
struct Elem {
    enum Type : uint8_t { Lit, Class, Any, Ref, Group };
    Type type = Lit;
    std::vector<uint32_t> text;                          // Lit: its code points
    std::vector<std::pair<uint32_t, uint32_t>> ranges;   // Class: code point ranges [first, second]
    bool negated = false;                                // Class: [^...]
    std::string name;                                    // Ref: the rule
    std::vector<Sequence> alts;                          // Group: its alternatives
    int min = 1, max = 1;                                // repetition (max -1: unbounded)
};
struct Rule {
    std::string name;
    std::vector<Sequence> alts;
    size_t line = 0;
};

bool word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class Parser {
public:
    Parser(const std::string& s, const std::string& what) : s_(s), what_(what) {}

    std::vector<Rule> rules() {
        std::vector<Rule> out;
        space(true);
        while (more()) {
            Rule r;
            r.line = line_;
            r.name = word();
            if (r.name.empty()) bad(cat("a rule name expected, not ", shown()));
            space(false);
            if (s_.compare(i_, 3, "::=") != 0) bad(cat("'::=' expected after the rule name ", r.name, ", not ", shown()));
            i_ += 3;
            space(true);
            r.alts = alternatives(false);
            if (more() && s_[i_] != '\n') bad(cat("unexpected ", shown(), " in rule ", r.name));
            out.push_back(std::move(r));
            space(true);
        }
        return out;
    }

private:
    const std::string& s_;
    const std::string& what_;
    size_t i_ = 0, line_ = 1;
    int depth_ = 0;

    [[noreturn]] void bad(const std::string& msg) const { fail(what_, ": line ", line_, ": ", msg); }
    bool more() const { return i_ < s_.size(); }
    std::string shown() const {
        if (!more()) return "the end of the grammar";
        if (s_[i_] == '\n') return "the line's end";
        return cat("'", s_.substr(i_, 1), "'");
    }

    // Spaces, tabs and comments; line breaks too where `lines`.
    void space(bool lines) {
        while (more()) {
            const char c = s_[i_];
            if (c == ' ' || c == '\t' || c == '\r') {
                ++i_;
            } else if (c == '#') {
                while (more() && s_[i_] != '\n') ++i_;
            } else if (c == '\n' && lines) {
                ++i_;
                ++line_;
            } else {
                break;
            }
        }
    }

    std::string word() {
        const size_t from = i_;
        while (more() && word_char(s_[i_])) ++i_;
        return s_.substr(from, i_ - from);
    }

    std::vector<Sequence> alternatives(bool nested) {
        if (++depth_ > kMaxNest) bad(cat("groups nested deeper than ", kMaxNest));
        std::vector<Sequence> alts;
        alts.push_back(sequence(nested));
        while (more() && s_[i_] == '|') {
            ++i_;
            space(true);
            alts.push_back(sequence(nested));
        }
        --depth_;
        return alts;
    }

    Sequence sequence(bool nested) {
        Sequence q;
        for (;;) {
            space(nested);
            if (!more() || s_[i_] == '|' || s_[i_] == ')' || s_[i_] == '\n') return q;
            q.push_back(element());
            space(nested);
            repetition(q.back());
        }
    }

    Elem element() {
        Elem e;
        const char c = s_[i_];
        if (c == '"') {
            ++i_;
            e.type = Elem::Lit;
            while (more() && s_[i_] != '"') {
                if (s_[i_] == '\n') bad("a line break in a literal (write \\n)");
                e.text.push_back(character());
            }
            if (!more()) bad("a '\"' without its closing '\"'");
            ++i_;
        } else if (c == '[') {
            ++i_;
            e.type = Elem::Class;
            if (more() && s_[i_] == '^') {
                e.negated = true;
                ++i_;
            }
            while (more() && s_[i_] != ']') {
                if (s_[i_] == '\n') bad("a line break in a character class (write \\n)");
                const uint32_t lo = character();
                uint32_t hi = lo;
                if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
                    ++i_;
                    hi = character();
                    if (hi < lo) bad("a character class range out of order");
                }
                e.ranges.push_back({lo, hi});
            }
            if (!more()) bad("a '[' without its ']'");
            ++i_;
            if (e.ranges.empty()) bad("an empty character class");
        } else if (c == '.') {
            ++i_;
            e.type = Elem::Any;
        } else if (c == '(') {
            ++i_;
            space(true);
            e.type = Elem::Group;
            e.alts = alternatives(true);
            if (!more() || s_[i_] != ')') bad("a '(' without its ')'");
            ++i_;
        } else if (word_char(c)) {
            e.type = Elem::Ref;
            e.name = word();
        } else if (c == '<') {
            bad("token references (<...>) are not supported");
        } else {
            bad(cat("unexpected ", shown()));
        }
        return e;
    }

    // One character of a literal or class: an escape or a UTF-8 character.
    uint32_t character() {
        const uint8_t c = uint8_t(s_[i_++]);
        if (c == '\\') {
            if (!more()) bad("a '\\' at the end of the grammar");
            const char e = s_[i_++];
            switch (e) {
                case 'n': return '\n';
                case 'r': return '\r';
                case 't': return '\t';
                case '\\': case '"': case '[': case ']': case '-': case '^': return uint32_t(uint8_t(e));
                case 'x': return hex(2);
                case 'u': return hex(4);
                case 'U': return hex(8);
                default: bad(cat("the escape \\", std::string(1, e), " is not supported"));
            }
        }
        if (c < 0x80) return c;
        // UTF-8: the lead byte tells how many continuation bytes follow.
        const int more_bytes = c >= 0xF0 && c <= 0xF4 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 && c < 0xE0 ? 1 : -1;
        if (more_bytes < 0 || c > 0xF4) bad("invalid UTF-8");
        uint32_t cp = c & (0x3Fu >> more_bytes);
        for (int k = 0; k < more_bytes; ++k) {
            if (!more() || (uint8_t(s_[i_]) & 0xC0) != 0x80) bad("invalid UTF-8");
            cp = (cp << 6) | (uint8_t(s_[i_++]) & 0x3F);
        }
        static const uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
        if (cp < kLeast[more_bytes] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) bad("invalid UTF-8");
        return cp;
    }

    uint32_t hex(int digits) {
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k) {
            if (!more() || !std::isxdigit(uint8_t(s_[i_]))) bad(cat("an escape needs ", digits, " hex digits"));
            const char h = s_[i_++];
            v = v * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) bad("an escape that is no Unicode character");
        return v;
    }

    // * + ? {m} {m,} {m,n} {,n} after an element.
    void repetition(Elem& e) {
        if (!more()) return;
        const char c = s_[i_];
        if (c == '*' || c == '+' || c == '?') {
            ++i_;
            e.min = c == '+' ? 1 : 0;
            e.max = c == '?' ? 1 : -1;
        } else if (c == '{') {
            ++i_;
            auto number = [&](int& v) {
                space(false);
                const size_t from = i_;
                int64_t x = 0;
                while (more() && s_[i_] >= '0' && s_[i_] <= '9') x = std::min<int64_t>(x * 10 + (s_[i_++] - '0'), 1 << 30);
                v = int(x);
                space(false);
                return i_ > from;
            };
            int lo = 0, hi = 0;
            const bool has_lo = number(lo);
            hi = lo;
            if (more() && s_[i_] == ',') {
                ++i_;
                if (!number(hi)) hi = -1;
            } else if (!has_lo) {
                bad("a repetition {m}, {m,}, {m,n} or {,n} expected");
            }
            if (!more() || s_[i_] != '}') bad("a '{' without its '}'");
            ++i_;
            if (hi >= 0 && hi < lo) bad("a repetition {m,n} with n below m");
            if (lo > kMaxRepeat || hi > kMaxRepeat) bad(cat("a repetition past {", kMaxRepeat, "}"));
            e.min = lo;
            e.max = hi;
        } else {
            return;
        }
        space(false);
        if (more() && (s_[i_] == '*' || s_[i_] == '+' || s_[i_] == '?' || s_[i_] == '{'))
            bad("two repetitions in a row (group the first: (x*)?)");
    }
};

// A code point as runtime/json_pattern.h reads it literally (in a class too): letters and digits
// as they are, other ASCII as \xHH, the rest as its UTF-8.
void regex_char(std::string& out, uint32_t cp) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9')) {
        out += char(cp);
    } else if (cp < 0x80) {
        static const char kHex[] = "0123456789ABCDEF";
        out += "\\x";
        out += kHex[cp >> 4];
        out += kHex[cp & 15];
    } else {
        append_utf8(out, char32_t(cp));
    }
}

class Builder {
public:
    Builder(const std::string& what) : what_(what) {}

    JsonSchema run(const std::vector<Rule>& rules) {
        out_.grammar = true;
        out_.nodes.push_back(Node{});  // out_.key, a String node (no objects here)
        out_.nodes[0].kind = Kind::String;
        // Each rule is known by its node before it is built, so rules can refer to one another.
        for (const Rule& r : rules) {
            if (ids_.count(r.name)) fail(what_, ": line ", r.line, ": rule ", r.name, " is defined twice");
            ids_[r.name] = add(Kind::AnyOf);
            names_[ids_[r.name]] = r.name;
        }
        if (!ids_.count("root")) fail(what_, ": no rule named root (where the text begins)");
        for (const Rule& r : rules) {
            line_ = r.line;
            const int32_t body = alternatives(r.alts);
            out_.nodes[size_t(ids_[r.name])].alts = {body};
        }
        out_.root = ids_["root"];
        settle(out_);
        check_left_recursion();
        check_ends();
        const Node& root = out_.nodes[size_t(out_.root)];
        if (root.first.none()) fail(what_, ": rule root matches only the empty text");
        return std::move(out_);
    }

private:
    const std::string& what_;
    JsonSchema out_;
    std::map<std::string, int32_t> ids_;    // rule name -> its node
    std::map<int32_t, std::string> names_;  // ... and back
    size_t line_ = 0;                       // the rule being built
    int32_t empty_ = -1;                    // the empty sequence, once made

    int32_t add(Kind k, std::vector<int32_t> alts = {}) {
        if (out_.nodes.size() >= kMaxGrammarNodes)
            fail(what_, ": the grammar needs more than ", kMaxGrammarNodes, " nodes (fewer or smaller repetitions)");
        Node n;
        n.kind = k;
        n.alts = std::move(alts);
        out_.nodes.push_back(std::move(n));
        return int32_t(out_.nodes.size() - 1);
    }
    int32_t empty() {
        if (empty_ < 0) empty_ = add(Kind::Seq);
        return empty_;
    }

    // Whether no rule is referred to inside.
    static bool terminal(const Elem& e) { return e.type != Elem::Ref && terminal(e.alts); }
    static bool terminal(const std::vector<Sequence>& alts) {
        for (const Sequence& q : alts)
            for (const Elem& e : q)
                if (!terminal(e)) return false;
        return true;
    }

    // The ECMA-262 pattern of terminal elements.
    static void regex(std::string& out, const Elem& e) {
        out += "(?:";
        switch (e.type) {
            case Elem::Lit:
                for (const uint32_t c : e.text) regex_char(out, c);
                break;
            case Elem::Class:
                out += e.negated ? "[^" : "[";
                for (const auto& r : e.ranges) {
                    regex_char(out, r.first);
                    if (r.second != r.first) {
                        out += '-';
                        regex_char(out, r.second);
                    }
                }
                out += ']';
                break;
            case Elem::Any: out += "[\\s\\S]"; break;
            case Elem::Group: regex(out, e.alts); break;
            case Elem::Ref: break;  // (never: not terminal)
        }
        out += ')';
        if (e.min == 1 && e.max == 1) return;
        out += cat("{", e.min, ",", e.max >= 0 ? std::to_string(e.max) : std::string(), "}");
    }
    static void regex(std::string& out, const std::vector<Sequence>& alts) {
        for (size_t i = 0; i < alts.size(); ++i) {
            if (i > 0) out += '|';
            for (const Elem& e : alts[i]) regex(out, e);
        }
    }

    int32_t text(const std::string& pattern) {
        out_.patterns.push_back(compile_pattern(pattern, cat(what_, ": line ", line_), true));
        const int32_t id = add(Kind::Text);
        out_.nodes[size_t(id)].pattern = int32_t(out_.patterns.size() - 1);
        return id;
    }

    int32_t alternatives(const std::vector<Sequence>& alts) {
        if (terminal(alts)) {
            std::string p;
            regex(p, alts);
            return text(p);
        }
        if (alts.size() == 1) return sequence(alts[0]);
        std::vector<int32_t> ids;
        for (const Sequence& q : alts) ids.push_back(sequence(q));
        return add(Kind::AnyOf, std::move(ids));
    }

    // Runs of terminal elements become one text each; the rest their own nodes.
    int32_t sequence(const Sequence& q) {
        std::vector<int32_t> parts;
        std::string run;
        for (const Elem& e : q) {
            if (terminal(e)) {
                regex(run, e);
                continue;
            }
            if (!run.empty()) parts.push_back(text(run));
            run.clear();
            parts.push_back(element(e));
        }
        if (!run.empty()) parts.push_back(text(run));
        if (parts.size() == 1) return parts[0];
        if (parts.empty()) return empty();
        return add(Kind::Seq, std::move(parts));
    }

    int32_t element(const Elem& e) {
        int32_t base;
        if (e.type == Elem::Ref) {
            const auto it = ids_.find(e.name);
            if (it == ids_.end()) fail(what_, ": line ", line_, ": rule ", e.name, " is used but not defined");
            base = it->second;
        } else {
            base = alternatives(e.alts);
        }
        if (e.min == 1 && e.max == 1) return base;
        // base{m,n}: m copies, then n - m optional ones, each inside the one before
        // (x{1,3} = x (x x?)?); base{m,}: m copies, then any number more.
        std::vector<int32_t> parts(size_t(e.min), base);
        if (e.max < 0) {
            const int32_t star = add(Kind::AnyOf);
            const int32_t again = add(Kind::Seq, {base, star});
            out_.nodes[size_t(star)].alts = {again, empty()};
            parts.push_back(star);
        } else if (e.max > e.min) {
            int32_t opt = add(Kind::AnyOf, {base, empty()});
            for (int k = e.min + 1; k < e.max; ++k) opt = add(Kind::AnyOf, {add(Kind::Seq, {base, opt}), empty()});
            parts.push_back(opt);
        }
        if (parts.size() == 1) return parts[0];
        if (parts.empty()) return empty();
        return add(Kind::Seq, std::move(parts));
    }

    // The nodes a value of node n may begin with before any byte: a choice's alternatives, a
    // sequence's parts up to its first that cannot be empty.
    std::vector<int32_t> leads(int32_t n) const {
        const Node& x = out_.nodes[size_t(n)];
        if (x.kind == Kind::AnyOf) return x.alts;
        std::vector<int32_t> out;
        if (x.kind != Kind::Seq) return out;
        for (const int32_t p : x.alts) {
            out.push_back(p);
            if (!out_.nodes[size_t(p)].nullable) break;
        }
        return out;
    }

    // A cycle of leads() would have the acceptor begin a node inside itself for ever; a long
    // chain of them, recurse as deep at one byte (bounded by kMaxLeads).
    void check_left_recursion() const {
        const size_t n = out_.nodes.size();
        std::vector<uint8_t> mark(n, 0);  // 1: on the path, 2: done
        std::vector<int32_t> height(n, 0);  // the longest chain of leads() below a node
        std::vector<std::pair<int32_t, size_t>> path;
        for (size_t s = 0; s < n; ++s) {
            if (mark[s]) continue;
            path.push_back({int32_t(s), 0});
            mark[s] = 1;
            while (!path.empty()) {
                auto& [id, next] = path.back();
                const std::vector<int32_t> ls = leads(id);
                if (next == ls.size()) {
                    for (const int32_t l : ls) height[size_t(id)] = std::max(height[size_t(id)], height[size_t(l)] + 1);
                    if (height[size_t(id)] > kMaxLeads) {
                        auto named = std::find_if(path.rbegin(), path.rend(), [&](const auto& p) { return names_.count(p.first) > 0; });
                        fail(what_, ": rules begin with rules more than ", kMaxLeads, " deep before a character (from rule ",
                             named != path.rend() ? names_.at(named->first) : std::string("root"), ")");
                    }
                    mark[size_t(id)] = 2;
                    path.pop_back();
                    continue;
                }
                const int32_t to = ls[next++];
                if (mark[size_t(to)] == 2) continue;
                if (mark[size_t(to)] == 1) {
                    // The cycle: `to` and what the path holds after it; a rule on it names it.
                    auto at = std::find_if(path.begin(), path.end(), [&](const auto& p) { return p.first == to; });
                    for (; at != path.end(); ++at)
                        if (names_.count(at->first))
                            fail(what_, ": rule ", names_.at(at->first),
                                 " can begin with itself before any character (left recursion: write it as a repetition)");
                    fail(what_, ": a repetition of something that may be empty (write the group so that it cannot be)");
                }
                mark[size_t(to)] = 1;
                path.push_back({to, 0});
            }
        }
    }

    // Every rule must be able to end: one that cannot (each alternative needs itself again) would
    // let generation begin a text that no length completes.
    void check_ends() const {
        const size_t n = out_.nodes.size();
        std::vector<uint8_t> ends(n, 0);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t i = 0; i < n; ++i) {
                if (ends[i]) continue;
                const Node& x = out_.nodes[i];
                const auto done = [&](int32_t p) { return ends[size_t(p)] != 0; };
                bool e = x.kind == Kind::Text || x.kind == Kind::String;
                if (x.kind == Kind::Seq) e = std::all_of(x.alts.begin(), x.alts.end(), done);
                if (x.kind == Kind::AnyOf) e = std::any_of(x.alts.begin(), x.alts.end(), done);
                if (e) ends[i] = 1;
                changed = changed || e;
            }
        }
        std::string never;
        for (const auto& [id, name] : names_)
            if (!ends[size_t(id)]) never += (never.empty() ? "" : ", ") + name;
        if (!never.empty())
            fail(what_, ": rules that can never end (each alternative needs one of them again): ", never);
    }
};
}  // namespace

JsonSchema compile_grammar(const std::string& text, const std::string& what) {
    const std::vector<Rule> rules = Parser(text, what).rules();
    if (rules.empty()) fail(what, ": the grammar has no rules");
    return Builder(what).run(rules);
}

}  // namespace shardlm
