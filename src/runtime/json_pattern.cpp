#include "runtime/json_pattern.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace shardlm {
namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr int kMaxRepeat = 1000;           // {n,m}: the most copies one quantifier makes
constexpr size_t kMaxNfaStates = 50000;    // past this a pattern is refused as too large
constexpr int kMaxGroupDepth = 128;        // groups inside groups (the parser recurses per level)
constexpr size_t kMaxSubsetWork = 4 << 20; // NFA states visited building the DFA: a request's pattern
                                           // compiles in milliseconds or is refused

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code point ranges [first, second]

// Sorted, disjoint, adjacent ranges merged.
Ranges normalise(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    for (const auto& x : r) {
        if (!out.empty() && x.first <= out.back().second + 1) out.back().second = std::max(out.back().second, x.second);
        else out.push_back(x);
    }
    return out;
}

Ranges complement(const Ranges& r) {
    Ranges out;
    uint32_t from = 0;
    for (const auto& x : normalise(r)) {
        if (x.first > from) out.push_back({from, x.first - 1});
        from = x.second + 1;
    }
    if (from <= kMaxCp) out.push_back({from, kMaxCp});
    return out;
}

// ECMA-262's classes.
const Ranges kDigits = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{9, 13},         {' ', ' '},         {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};

// The expression's tree: a set of characters, a sequence (empty: the empty string), a choice,
// or a repetition of its one kid (max -1: unbounded).
struct Re {
    enum Kind : uint8_t { Set, Cat, Alt, Repeat };
    Kind kind = Cat;
    Ranges set;
    std::vector<Re> kids;
    int min = 0, max = -1;
};

Re set_of(Ranges r) {
    Re s;
    s.kind = Re::Set;
    s.set = normalise(std::move(r));
    return s;
}

class Parser {
public:
    Parser(const std::vector<uint32_t>& p, const std::string& where) : p_(p), where_(where) {}
    Re parse() {
        Re r = alt();
        if (more()) bad("a ')' without its '('");
        return r;
    }

private:
    const std::vector<uint32_t>& p_;
    const std::string& where_;
    size_t i_ = 0;

    [[noreturn]] void bad(const std::string& msg) const { fail(where_, ": ", msg); }
    bool more() const { return i_ < p_.size(); }
    uint32_t peek() const { return p_[i_]; }

    int depth_ = 0;

    Re alt() {
        if (++depth_ > kMaxGroupDepth) bad(cat("groups nested deeper than ", kMaxGroupDepth));
        Re first = sequence();
        if (!more() || peek() != '|') {
            --depth_;
            return first;
        }
        Re a;
        a.kind = Re::Alt;
        a.kids.push_back(std::move(first));
        while (more() && peek() == '|') {
            ++i_;
            a.kids.push_back(sequence());
        }
        --depth_;
        return a;
    }

    Re sequence() {
        Re c;
        while (more() && peek() != '|' && peek() != ')') {
            Re a = atom();
            quantify(a);
            c.kids.push_back(std::move(a));
        }
        return c;
    }

    // {n}, {n,} or {n,m} at i_ (a '{'): read, true; false (i_ unchanged) for a '{' that starts
    // no quantifier, which ECMA-262 reads as a literal.
    bool braces(int& lo, int& hi) {
        size_t j = i_ + 1;
        auto number = [&](int& v) {
            const size_t from = j;
            int64_t x = 0;
            while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') x = std::min<int64_t>(x * 10 + (p_[j++] - '0'), 1 << 30);
            v = int(x);
            return j > from;
        };
        if (!number(lo)) return false;
        hi = lo;
        if (j < p_.size() && p_[j] == ',') {
            ++j;
            if (!number(hi)) hi = -1;
        }
        if (j >= p_.size() || p_[j] != '}') return false;
        if (hi >= 0 && hi < lo) bad("a quantifier {n,m} with m below n");
        if (lo > kMaxRepeat || hi > kMaxRepeat) bad(cat("a quantifier past {", kMaxRepeat, "}"));
        i_ = j + 1;
        return true;
    }

    bool quantifier_next() {
        int lo = 0, hi = 0;
        const size_t at = i_;
        const bool q = more() && (peek() == '*' || peek() == '+' || peek() == '?' || (peek() == '{' && braces(lo, hi)));
        i_ = at;
        return q;
    }

    void quantify(Re& a) {
        int lo = 0, hi = -1;
        if (!more()) return;
        if (peek() == '*') ++i_;
        else if (peek() == '+') lo = 1, ++i_;
        else if (peek() == '?') hi = 1, ++i_;
        else if (peek() != '{' || !braces(lo, hi)) return;
        if (more() && peek() == '?') ++i_;  // lazy: the same strings match
        if (quantifier_next()) bad("a quantifier after a quantifier");
        Re r;
        r.kind = Re::Repeat;
        r.min = lo;
        r.max = hi;
        r.kids.push_back(std::move(a));
        a = std::move(r);
    }

    uint32_t hex(int digits) {
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k) {
            if (!more()) bad("a \\x or \\u escape without its hex digits");
            const uint32_t c = p_[i_++];
            const int d = c >= '0' && c <= '9' ? int(c - '0') : c >= 'a' && c <= 'f' ? int(c - 'a' + 10)
                          : c >= 'A' && c <= 'F' ? int(c - 'A' + 10) : -1;
            if (d < 0) bad("a \\x or \\u escape without its hex digits");
            v = v * 16 + uint32_t(d);
        }
        return v;
    }

    // After a '\': the characters the escape stands for; *single: it is one character (it may
    // bound a range in a class).
    Ranges escape(bool in_class, bool* single = nullptr) {
        if (!more()) bad("a '\\' at the pattern's end");
        const uint32_t c = p_[i_++];
        if (single) *single = true;
        auto cls = [&](const Ranges& r) {
            if (single) *single = false;
            return r;
        };
        switch (c) {
            case 'd': return cls(kDigits);
            case 'D': return cls(complement(kDigits));
            case 'w': return cls(kWord);
            case 'W': return cls(complement(kWord));
            case 's': return cls(kSpace);
            case 'S': return cls(complement(kSpace));
            case 't': return {{9, 9}};
            case 'n': return {{10, 10}};
            case 'v': return {{11, 11}};
            case 'f': return {{12, 12}};
            case 'r': return {{13, 13}};
            case '0':
                if (more() && peek() >= '0' && peek() <= '9') bad("octal escapes are not supported");
                return {{0, 0}};
            case 'x': {
                const uint32_t v = hex(2);
                return {{v, v}};
            }
            case 'u': {
                const uint32_t v = hex(4);
                if (v >= 0xD800 && v <= 0xDFFF) bad("surrogate escapes (\\uD800-\\uDFFF) are not supported");
                return {{v, v}};
            }
            case 'b':
                if (in_class) return {{8, 8}};
                bad("\\b word boundaries are not supported");
            case 'B': bad("\\B is not supported");
            case 'c': bad("\\c control escapes are not supported");
            case 'p':
            case 'P': bad("\\p{...} Unicode property classes are not supported");
            case 'k': bad("backreferences are not supported");
            default:
                if (c >= '1' && c <= '9') bad("backreferences are not supported");
                if (c < 0x80 && ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'))
                    bad(cat("the escape \\", char(c), " is not supported"));
                return {{c, c}};  // an escaped punctuation character stands for itself
        }
    }

    // After '[': the class up to its ']'.
    Ranges klass() {
        bool negate = false;
        if (more() && peek() == '^') {
            negate = true;
            ++i_;
        }
        Ranges r;
        auto item = [&](bool& single) -> Ranges {
            const uint32_t c = p_[i_++];
            single = true;
            return c == '\\' ? escape(true, &single) : Ranges{{c, c}};
        };
        for (;;) {
            if (!more()) bad("a '[' without its ']'");
            if (peek() == ']') {
                ++i_;
                break;
            }
            bool single = false;
            const Ranges first = item(single);
            if (single && i_ + 1 < p_.size() && peek() == '-' && p_[i_ + 1] != ']') {
                ++i_;
                bool single_hi = false;
                const Ranges last = item(single_hi);
                if (!single_hi) bad("a class range that ends in a class escape");
                if (last[0].first < first[0].first) bad("a class range out of order");
                r.push_back({first[0].first, last[0].first});
            } else {
                r.insert(r.end(), first.begin(), first.end());
            }
        }
        return negate ? complement(r) : normalise(r);
    }

    Re atom() {
        const uint32_t c = p_[i_++];
        switch (c) {
            case '(': {
                if (more() && peek() == '?') {
                    if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
                        i_ += 2;
                    } else if (i_ + 2 < p_.size() && p_[i_ + 1] == '<' && p_[i_ + 2] != '=' && p_[i_ + 2] != '!') {
                        i_ += 2;  // a named group: the name, then the group
                        while (more() && peek() != '>') ++i_;
                        if (!more()) bad("a group name without its '>'");
                        ++i_;
                    } else {
                        bad("lookahead and lookbehind ((?=, (?!, (?<=, (?<!) are not supported");
                    }
                }
                Re inner = alt();
                if (!more() || peek() != ')') bad("a '(' without its ')'");
                ++i_;
                return inner;
            }
            case '[': return set_of(klass());
            case '.': return set_of(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
            case '^':
            case '$': bad("the anchors ^ and $ are supported only at the pattern's start and end");
            case '*':
            case '+':
            case '?': bad("a quantifier with nothing to repeat");
            case '{': {
                --i_;
                int lo = 0, hi = 0;
                if (braces(lo, hi)) bad("a quantifier with nothing to repeat");
                ++i_;
                return set_of({{c, c}});
            }
            case '\\': return set_of(escape(false));
            default: return set_of({{c, c}});
        }
    }
};

// Thompson's construction: a state has either one character edge (on -> to) or epsilon edges.
struct Nfa {
    struct State {
        Ranges on;
        int32_t to = -1;
        std::vector<int32_t> eps;
    };
    explicit Nfa(const std::string& w) : where(w) {}
    std::vector<State> s;
    const std::string& where;
    std::vector<uint32_t> mark;  // closure(): visited when equal to stamp
    uint32_t stamp = 0;
    size_t work = 0;             // states visited by closure() so far
    int32_t add() {
        if (s.size() >= kMaxNfaStates) fail(where, ": the pattern is too large (its repetitions make more than ",
                                             kMaxNfaStates, " states)");
        s.emplace_back();
        return int32_t(s.size() - 1);
    }
    // `re` between states from and to.
    void build(const Re& re, int32_t from, int32_t to) {
        switch (re.kind) {
            case Re::Set: {
                const int32_t x = add();
                s[size_t(from)].eps.push_back(x);
                s[size_t(x)].on = re.set;
                s[size_t(x)].to = to;
                return;
            }
            case Re::Cat: {
                int32_t cur = from;
                for (size_t k = 0; k + 1 < re.kids.size(); ++k) {
                    const int32_t mid = add();
                    build(re.kids[k], cur, mid);
                    cur = mid;
                }
                if (re.kids.empty()) s[size_t(from)].eps.push_back(to);
                else build(re.kids.back(), cur, to);
                return;
            }
            case Re::Alt:
                for (const Re& k : re.kids) build(k, from, to);
                return;
            case Re::Repeat: {
                int32_t cur = from;
                for (int k = 0; k < re.min; ++k) {
                    const int32_t mid = add();
                    build(re.kids[0], cur, mid);
                    cur = mid;
                }
                if (re.max < 0) {
                    const int32_t loop = add();
                    s[size_t(cur)].eps.push_back(loop);
                    build(re.kids[0], loop, loop);
                    s[size_t(loop)].eps.push_back(to);
                    return;
                }
                for (int k = re.min; k < re.max; ++k) {
                    s[size_t(cur)].eps.push_back(to);
                    const int32_t mid = add();
                    build(re.kids[0], cur, mid);
                    cur = mid;
                }
                s[size_t(cur)].eps.push_back(to);
                return;
            }
        }
    }
    // The states reachable from `set` by epsilon edges, sorted. Costs what it visits.
    std::vector<int32_t> closure(std::vector<int32_t> set) {
        if (mark.size() != s.size()) mark.assign(s.size(), 0);
        ++stamp;
        std::vector<int32_t> todo = set;
        for (const int32_t x : set) mark[size_t(x)] = stamp;
        while (!todo.empty()) {
            const int32_t x = todo.back();
            todo.pop_back();
            for (const int32_t y : s[size_t(x)].eps)
                if (mark[size_t(y)] != stamp) {
                    mark[size_t(y)] = stamp;
                    set.push_back(y);
                    todo.push_back(y);
                }
        }
        work += set.size();
        if (work > kMaxSubsetWork) fail(where, ": the pattern is too complex to compile (simplify it)");
        std::sort(set.begin(), set.end());
        return set;
    }
};

std::vector<uint32_t> code_points(const std::string& s, const std::string& where) {
    std::vector<uint32_t> out;
    for (size_t i = 0; i < s.size();) {
        const uint8_t b = uint8_t(s[i]);
        const int n = b < 0x80 ? 0 : b >= 0xC2 && b <= 0xDF ? 1 : b >= 0xE0 && b <= 0xEF ? 2 : b >= 0xF0 && b <= 0xF4 ? 3 : -1;
        if (n < 0) fail(where, ": the pattern is not UTF-8");
        uint32_t cp = n == 0 ? b : b & (0x3F >> n);
        for (int k = 1; k <= n; ++k) {
            if (i + size_t(k) >= s.size() || (uint8_t(s[i + size_t(k)]) & 0xC0) != 0x80) fail(where, ": the pattern is not UTF-8");
            cp = (cp << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
        }
        out.push_back(cp);
        i += size_t(n) + 1;
    }
    return out;
}

// The states of d reachable from its start from which an accepting one is reachable, renumbered
// in the order they are found (the start first), with edges only into them and adjacent ranges
// into one state merged. Throws Error naming `where` and saying `none` when the start is not one.
PatternDfa trimmed(const PatternDfa& d, const std::string& where, const char* none) {
    const size_t n = d.edges.size();
    std::vector<std::vector<int32_t>> back(n);
    for (size_t k = 0; k < n; ++k)
        for (const PatternDfa::Edge& e : d.edges[k]) back[size_t(e.to)].push_back(int32_t(k));
    std::vector<uint8_t> live(n, 0);
    std::vector<int32_t> todo;
    for (size_t k = 0; k < n; ++k)
        if (d.accept[k]) {
            live[k] = 1;
            todo.push_back(int32_t(k));
        }
    while (!todo.empty()) {
        const int32_t x = todo.back();
        todo.pop_back();
        for (const int32_t y : back[size_t(x)])
            if (!live[size_t(y)]) {
                live[size_t(y)] = 1;
                todo.push_back(y);
            }
    }
    if (!live[size_t(d.start)]) fail(where, ": ", none);
    std::vector<int32_t> id(n, -1);
    std::vector<int32_t> order = {d.start};
    id[size_t(d.start)] = 0;
    for (size_t k = 0; k < order.size(); ++k)
        for (const PatternDfa::Edge& e : d.edges[size_t(order[k])])
            if (live[size_t(e.to)] && id[size_t(e.to)] < 0) {
                id[size_t(e.to)] = int32_t(order.size());
                order.push_back(e.to);
            }
    PatternDfa out;
    out.start = 0;
    for (const int32_t old : order) {
        out.accept.push_back(d.accept[size_t(old)]);
        std::vector<PatternDfa::Edge> kept;
        for (const PatternDfa::Edge& e : d.edges[size_t(old)]) {
            if (!live[size_t(e.to)]) continue;
            const int32_t to = id[size_t(e.to)];
            if (!kept.empty() && kept.back().to == to && kept.back().hi + 1 == e.lo) kept.back().hi = e.hi;
            else kept.push_back({e.lo, e.hi, to});
        }
        out.edges.push_back(std::move(kept));
    }
    return out;
}

}  // namespace

PatternDfa intersect(const PatternDfa& a, const PatternDfa& b, const std::string& where) {
    // The product of the two: a state per pair of states met, an edge per overlap of two ranges.
    PatternDfa d;
    std::map<std::pair<int32_t, int32_t>, int32_t> ids;
    std::vector<std::pair<int32_t, int32_t>> pairs;
    auto id_of = [&](int32_t x, int32_t y) {
        const auto it = ids.find({x, y});
        if (it != ids.end()) return it->second;
        if (pairs.size() >= kMaxPatternStates)
            fail(where, ": the strings of both need more than ", kMaxPatternStates, " automaton states");
        const int32_t id = int32_t(pairs.size());
        ids.emplace(std::make_pair(x, y), id);
        pairs.push_back({x, y});
        d.accept.push_back(a.accept[size_t(x)] && b.accept[size_t(y)]);
        d.edges.emplace_back();
        return id;
    };
    d.start = id_of(a.start, b.start);
    for (size_t k = 0; k < pairs.size(); ++k) {
        const std::vector<PatternDfa::Edge>&ea = a.edges[size_t(pairs[k].first)], &eb = b.edges[size_t(pairs[k].second)];
        for (size_t i = 0, j = 0; i < ea.size() && j < eb.size();) {
            const uint32_t lo = std::max(ea[i].lo, eb[j].lo), hi = std::min(ea[i].hi, eb[j].hi);
            if (lo <= hi) {
                const int32_t to = id_of(ea[i].to, eb[j].to);
                d.edges[k].push_back({lo, hi, to});
            }
            if (ea[i].hi < eb[j].hi) ++i;
            else ++j;
        }
    }
    return trimmed(d, where, "no string matches both");
}

PatternDfa multiple_of_dfa(uint64_t p, int q, bool fraction, const std::string& where) {
    if (p == 0 || q < 0 || q > 9 || p * uint64_t(q + 2) + 4 > kMaxPatternStates)
        fail(where, ": multipleOf needs more than ", kMaxPatternStates, " automaton states");
    // Digits read so far, as one decimal number, modulo p: the integer part's states [0, p), then
    // per fraction digit f in [1, q] another p (after the point, before a digit: the last p).
    const int32_t P = int32_t(p);
    auto frac = [&](int32_t r, int f) { return P * (f + 1) + r; };  // f in [0, q]
    const int32_t start = P * (q + 2), minus = start + 1, zero = start + 2, neg_zero = start + 3;
    PatternDfa d;
    d.edges.resize(size_t(neg_zero) + 1);
    d.accept.assign(d.edges.size(), 0);
    d.start = start;
    uint64_t scale = 1;  // 10^q mod p, then 10^(q - f) for the states after f fraction digits
    for (int k = 0; k < q; ++k) scale = scale * 10 % p;
    auto digits = [&](int32_t from, int32_t r, auto to) {  // edges on '0'..'9' from r to to((10r + d) mod p)
        for (uint32_t dgt = 0; dgt <= 9; ++dgt) d.edges[size_t(from)].push_back({'0' + dgt, '0' + dgt, to(int32_t((uint64_t(r) * 10 + dgt) % p))});
    };
    for (int32_t r = 0; r < P; ++r) {
        // The integer part (x * 10^q must be a multiple of p), then '.' (f = 0) where fractions are.
        d.accept[size_t(r)] = uint64_t(r) * scale % p == 0;
        digits(r, r, [](int32_t t) { return t; });
        if (fraction && q > 0) d.edges[size_t(r)].push_back({'.', '.', frac(r, 0)});
        if (!fraction || q == 0) continue;
        uint64_t left = scale;  // 10^(q - f)
        for (int f = 0; f <= q; ++f) {
            if (f > 0) d.accept[size_t(frac(r, f))] = uint64_t(r) * left % p == 0;
            if (f < q) digits(frac(r, f), r, [&](int32_t t) { return frac(t, f + 1); });
            // (10^(q - f - 1) mod p, for the next f)
            uint64_t next = 1;
            for (int k = 0; k < q - f - 1; ++k) next = next * 10 % p;
            left = next;
        }
    }
    // The start: '-', '0' (whole, or before a fraction) or a first digit 1-9; '-' then the same
    // but for "-0" alone.
    d.edges[size_t(start)].push_back({'-', '-', minus});
    d.edges[size_t(start)].push_back({'0', '0', zero});
    d.edges[size_t(minus)].push_back({'0', '0', neg_zero});
    for (uint32_t dgt = 1; dgt <= 9; ++dgt) {
        d.edges[size_t(start)].push_back({'0' + dgt, '0' + dgt, int32_t(dgt % p)});
        d.edges[size_t(minus)].push_back({'0' + dgt, '0' + dgt, int32_t(dgt % p)});
    }
    d.accept[size_t(zero)] = 1;
    if (fraction && q > 0) {
        d.edges[size_t(zero)].push_back({'.', '.', frac(0, 0)});
        d.edges[size_t(neg_zero)].push_back({'.', '.', frac(0, 0)});
    }
    for (std::vector<PatternDfa::Edge>& es : d.edges)  // ('.' before the digits)
        std::sort(es.begin(), es.end(), [](const PatternDfa::Edge& x, const PatternDfa::Edge& y) { return x.lo < y.lo; });
    return trimmed(d, where, "no number is such a multiple");
}

int32_t PatternDfa::next(int32_t s, uint32_t cp) const {
    const std::vector<Edge>& e = edges[size_t(s)];
    auto it = std::upper_bound(e.begin(), e.end(), cp, [](uint32_t c, const Edge& x) { return c < x.lo; });
    if (it == e.begin()) return -1;
    --it;
    return cp <= it->hi ? it->to : -1;
}

bool PatternDfa::any(int32_t s, uint32_t lo, uint32_t hi) const {
    const std::vector<Edge>& e = edges[size_t(s)];
    auto it = std::lower_bound(e.begin(), e.end(), lo, [](const Edge& x, uint32_t c) { return x.hi < c; });
    return it != e.end() && it->lo <= hi;
}

PatternDfa compile_pattern(const std::string& pattern, const std::string& where, bool whole) {
    std::vector<uint32_t> p = code_points(pattern, where);
    // ^ and $ anchor the match at the string's ends; without them it may start and end anywhere.
    bool head = !p.empty() && p.front() == '^';
    if (head) p.erase(p.begin());
    size_t slashes = 0;
    while (p.size() >= 2 + slashes && p[p.size() - 2 - slashes] == '\\') ++slashes;
    bool tail = !p.empty() && p.back() == '$' && slashes % 2 == 0;
    if (tail) p.pop_back();
    head = head || whole;
    tail = tail || whole;
    Re all;
    Re any;
    any.kind = Re::Repeat;
    any.kids.push_back(set_of({{0, kMaxCp}}));
    if (!head) all.kids.push_back(any);
    all.kids.push_back(Parser(p, where).parse());
    if (!tail) all.kids.push_back(any);

    Nfa nfa(where);
    const int32_t first = nfa.add(), final = nfa.add();
    nfa.build(all, first, final);
    // The alphabet's pieces: code point intervals no range of the NFA splits.
    std::vector<uint32_t> cuts = {0, kMaxCp + 1};
    for (const Nfa::State& st : nfa.s)
        for (const auto& r : st.on) {
            cuts.push_back(r.first);
            cuts.push_back(r.second + 1);
        }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());

    // Subset construction.
    PatternDfa d;
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<std::vector<int32_t>> sets;
    auto id_of = [&](std::vector<int32_t> set) {
        auto it = ids.find(set);
        if (it != ids.end()) return it->second;
        if (sets.size() >= kMaxPatternStates)
            fail(where, ": the pattern needs more than ", kMaxPatternStates, " automaton states (simplify it)");
        const int32_t id = int32_t(sets.size());
        ids.emplace(set, id);
        d.accept.push_back(std::binary_search(set.begin(), set.end(), final));
        sets.push_back(std::move(set));
        d.edges.emplace_back();
        return id;
    };
    d.start = id_of(nfa.closure({first}));
    for (size_t k = 0; k < sets.size(); ++k) {
        std::map<size_t, std::vector<int32_t>> moves;  // piece -> NFA states it leads to
        for (const int32_t x : sets[k]) {
            const Nfa::State& st = nfa.s[size_t(x)];
            for (const auto& r : st.on) {
                const size_t a = size_t(std::lower_bound(cuts.begin(), cuts.end(), r.first) - cuts.begin());
                const size_t b = size_t(std::lower_bound(cuts.begin(), cuts.end(), r.second + 1) - cuts.begin());
                for (size_t piece = a; piece < b; ++piece) moves[piece].push_back(st.to);
            }
        }
        for (auto& [piece, to] : moves) {
            std::sort(to.begin(), to.end());
            to.erase(std::unique(to.begin(), to.end()), to.end());
            const int32_t target = id_of(nfa.closure(to));
            d.edges[k].push_back({cuts[piece], cuts[piece + 1] - 1, target});
        }
    }
    return trimmed(d, where, "no string matches the pattern");
}

std::vector<int32_t> pattern_ends(const PatternDfa& d, int32_t span) {
    const size_t n = d.edges.size(), w = size_t(span) + 1;
    // exact[s * w + k]: an accepting state lies exactly k characters on from s.
    std::vector<uint8_t> exact(n * w, 0);
    for (size_t s = 0; s < n; ++s) exact[s * w] = d.accept[s];
    for (size_t k = 1; k < w; ++k)
        for (size_t s = 0; s < n; ++s)
            for (const PatternDfa::Edge& e : d.edges[s])
                if (exact[size_t(e.to) * w + k - 1]) {
                    exact[s * w + k] = 1;
                    break;
                }
    std::vector<int32_t> ends(n * w);
    for (size_t s = 0; s < n; ++s) {
        int32_t soonest = span + 1;
        for (size_t k = w; k-- > 0;) {
            if (exact[s * w + k]) soonest = int32_t(k);
            ends[s * w + k] = soonest;
        }
    }
    return ends;
}

namespace {

// The parts as alternatives of one pattern: "a|b|c".
std::string either(const std::vector<std::string>& parts) {
    std::string out;
    for (const std::string& p : parts) out += (out.empty() ? "" : "|") + p;
    return out;
}

// The decimal texts of [lo, hi], both of n digits (leading zeros allowed), lo <= hi.
std::string digit_range(const std::string& lo, const std::string& hi) {
    if (lo.empty()) return "";
    if (lo[0] == hi[0]) return std::string(1, lo[0]) + digit_range(lo.substr(1), hi.substr(1));
    const size_t rest = lo.size() - 1;
    if (lo.substr(1) == std::string(rest, '0') && hi.substr(1) == std::string(rest, '9'))
        return cat("[", lo[0], "-", hi[0], "]", rest ? cat("\\d{", rest, "}") : "");
    std::string out = "(?:" + std::string(1, lo[0]) + digit_range(lo.substr(1), std::string(rest, '9'));
    if (hi[0] - lo[0] > 1) out += cat("|[", char(lo[0] + 1), "-", char(hi[0] - 1), "]", rest ? cat("\\d{", rest, "}") : "");
    return out + "|" + std::string(1, hi[0]) + digit_range(std::string(rest, '0'), hi.substr(1)) + ")";
}

// The texts of the non-negative integers in [lo, hi] (hi empty: no bound), without leading zeros.
std::string natural_range(uint64_t lo, std::optional<uint64_t> hi) {
    const std::string a = std::to_string(lo);
    const size_t top = hi ? std::to_string(*hi).size() : a.size();
    std::vector<std::string> parts;
    for (size_t n = a.size(); n <= top; ++n) {
        const std::string from = n == a.size() ? a : "1" + std::string(n - 1, '0');
        const std::string to = hi && n == top ? std::to_string(*hi) : std::string(n, '9');
        parts.push_back(digit_range(from, to));
    }
    if (!hi) parts.push_back(cat("[1-9]\\d{", top, ",}"));  // every longer one
    return "(?:" + either(parts) + ")";
}

}  // namespace

std::string integer_range_pattern(std::optional<int64_t> lo, std::optional<int64_t> hi) {
    // |v| of a negative v as unsigned (INT64_MIN included).
    auto magnitude = [](int64_t v) { return uint64_t(-(v + 1)) + 1; };
    std::vector<std::string> parts;
    if (!lo || *lo < 0) {  // the negatives: "-" and their magnitudes, from |min(hi, -1)| up to |lo|
        const uint64_t small = hi && *hi < 0 ? magnitude(*hi) : 1;
        parts.push_back("-" + natural_range(small, lo ? std::optional<uint64_t>(magnitude(*lo)) : std::nullopt));
    }
    if (!hi || *hi >= 0)
        parts.push_back(natural_range(lo && *lo > 0 ? uint64_t(*lo) : 0, hi ? std::optional<uint64_t>(uint64_t(*hi)) : std::nullopt));
    return "^(?:" + either(parts) + ")$";
}

namespace {

// A non-negative decimal: integer part, fraction digits without trailing zeros, and whether it is
// an exclusive bound.
struct Magnitude {
    uint64_t whole = 0;
    std::string frac;
    bool exclusive = false;
};

// Digit strings D, read as the fraction 0.D (the empty one as 0), within [l, h] (exclusive ends
// where lx, hx), l and h without trailing zeros; h_any: no upper end below 1. `digits`: the
// pattern of the non-empty ones (none: nullopt), `empty`: whether the empty one is in.
struct Fraction {
    std::optional<std::string> digits;
    bool empty = false;
};
Fraction fraction_range(const std::string& l, bool lx, const std::string& h, bool hx, bool h_any) {
    // The ends that take no more digits: above 0 with no upper end, or at most 0.
    if (h_any && l.empty()) return lx ? Fraction{"0*[1-9]\\d*", false} : Fraction{"\\d+", true};
    if (!h_any && h.empty()) return l.empty() && !lx && !hx ? Fraction{"0+", true} : Fraction{};
    // Here l or h has a digit to read: the first digit d splits the strings.
    const bool empty = l.empty() && !lx;  // (h is above 0 here)
    const char l1 = l.empty() ? '0' : l[0], h1 = h_any ? '9' : h[0];
    const std::string lrest = l.empty() ? "" : l.substr(1), hrest = h_any ? "" : h.substr(1);
    if (l1 > h1) return {std::nullopt, empty};
    std::vector<std::string> parts;
    auto led = [&](char d, const Fraction& tail) {  // d, then the rest's digits
        std::string p = std::string(1, d);
        if (tail.digits && tail.empty) p += "(?:" + *tail.digits + ")?";
        else if (tail.digits) p += "(?:" + *tail.digits + ")";
        else if (!tail.empty) return;
        parts.push_back(p);
    };
    if (l1 == h1 && !h_any) {
        led(l1, fraction_range(lrest, lx, hrest, hx, false));
    } else {
        led(l1, fraction_range(lrest, lx, "", false, true));
        const char from = char(l1 + 1), to = h_any ? '9' : char(h1 - 1);
        if (from <= to) parts.push_back(cat("[", from, "-", to, "]\\d*"));
        if (!h_any) led(h1, fraction_range("", false, hrest, hx, false));
    }
    if (parts.empty()) return {std::nullopt, empty};
    return {"(?:" + either(parts) + ")", empty};
}

// The texts (no sign) of the non-negative decimals in [a, b] (b absent: no upper end), "" for none.
std::string magnitude_range(const Magnitude& a, const std::optional<Magnitude>& b) {
    std::vector<std::string> parts;
    auto with = [&](uint64_t whole, const Fraction& f) {
        if (!f.digits && !f.empty) return;
        std::string p = std::to_string(whole);
        if (f.digits) p += cat(f.empty ? "(?:\\." : "\\.", "(?:", *f.digits, ")", f.empty ? ")?" : "");
        parts.push_back(p);
    };
    if (b && b->whole < a.whole) return "";
    if (b && a.whole == b->whole) {
        with(a.whole, fraction_range(a.frac, a.exclusive, b->frac, b->exclusive, false));
    } else {
        with(a.whole, fraction_range(a.frac, a.exclusive, "", false, true));
        if (!b || b->whole - a.whole >= 2)
            parts.push_back(natural_range(a.whole + 1, b ? std::optional<uint64_t>(b->whole - 1) : std::nullopt) + "(?:\\.\\d+)?");
        if (b) with(b->whole, fraction_range("", false, b->frac, b->exclusive, false));
    }
    return either(parts);
}

// "-12.50" -> negative, {12, "5"}; throws for other texts.
std::pair<bool, Magnitude> decimal(const DecimalBound& d) {
    const std::string& t = d.text;
    size_t i = t.size() > 0 && t[0] == '-' ? 1 : 0;
    const size_t dot = t.find('.');
    const std::string whole = t.substr(i, (dot == std::string::npos ? t.size() : dot) - i);
    std::string frac = dot == std::string::npos ? "" : t.substr(dot + 1);
    auto digits = [](const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; };
    if (!digits(whole) || (dot != std::string::npos && !digits(frac))) fail("the bound ", t, " is not a decimal number");
    if (whole.size() > 19 || std::stoull(whole) > 1000000000000000000ull) fail("the bound ", t, " is beyond 10^18 in size");
    while (!frac.empty() && frac.back() == '0') frac.pop_back();
    return {i == 1, Magnitude{std::stoull(whole), frac, d.exclusive}};
}

}  // namespace

std::string number_range_pattern(const std::optional<DecimalBound>& lo, const std::optional<DecimalBound>& hi) {
    std::optional<std::pair<bool, Magnitude>> l, h;
    if (lo) l = decimal(*lo);
    if (hi) h = decimal(*hi);
    auto zero = [](const std::pair<bool, Magnitude>& m) { return m.second.whole == 0 && m.second.frac.empty(); };
    // -0 is 0: a bound of 0 is non-negative.
    const bool l_neg = l && l->first && !zero(*l), h_neg = h && h->first && !zero(*h);
    std::vector<std::string> parts;
    if (!l || l_neg) {  // the negatives, as "-" and their magnitudes: above |h| (or 0), up to |l|
        const Magnitude from = h_neg ? h->second : Magnitude{0, "", true};
        const std::optional<Magnitude> to = l ? std::optional<Magnitude>(l->second) : std::nullopt;
        const std::string m = magnitude_range(from, to);
        if (!m.empty()) parts.push_back("-(?:" + m + ")");
    }
    if (!h || !h_neg) {  // the non-negatives: from l (or 0) up to h
        const Magnitude from = l && !l_neg ? l->second : Magnitude{};
        const std::optional<Magnitude> to = h ? std::optional<Magnitude>(h->second) : std::nullopt;
        const std::string m = magnitude_range(from, to);
        if (!m.empty()) parts.push_back(m);
    }
    if (parts.empty()) return "";
    return "^(?:" + either(parts) + ")$";
}

std::string format_pattern(const std::string& format) {
    // RFC 3339's full-date (29 February in leap years: divisible by 4, centuries by 400), and its
    // full-time without leap seconds.
    const std::string date = "(?:\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|"
                             "02-(?:0[1-9]|1\\d|2[0-8]))|(?:\\d\\d(?:0[48]|[2468][048]|[13579][26])|"
                             "(?:[02468][048]|[13579][26])00)-02-29)";
    const std::string time = "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d+)?(?:[Zz]|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)";
    const std::string label = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    const std::string octet = "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
    if (format == "date") return "^" + date + "$";
    if (format == "time") return "^" + time + "$";
    if (format == "date-time") return "^" + date + "[Tt]" + time + "$";
    const std::string hex = "[0-9a-fA-F]";
    if (format == "uuid") return "^" + hex + "{8}-" + hex + "{4}-" + hex + "{4}-" + hex + "{4}-" + hex + "{12}$";
    // Pydantic's UUID1/3/4/5: the version digit, and RFC 4122's variant (8, 9, a or b).
    if (format.size() == 5 && format.compare(0, 4, "uuid") == 0 && std::string("1345").find(format[4]) != std::string::npos)
        return "^" + hex + "{8}-" + hex + "{4}-" + format[4] + hex + "{3}-[89abAB]" + hex + "{3}-" + hex + "{12}$";
    const std::string ipv4 = "(?:" + octet + "\\.){3}" + octet;
    if (format == "ipv4") return "^" + ipv4 + "$";
    if (format == "hostname") return "^" + label + "(?:\\." + label + ")*$";
    // RFC 4291's text forms as RFC 3986 spells them (no zone): eight groups of 1-4 hex digits,
    // a run of them written "::", the last two as an IPv4 address; Pydantic's IPvAnyAddress is
    // either kind.
    if (format == "ipv6" || format == "ipvanyaddress") {
        const std::string h = hex + "{1,4}", ls32 = "(?:" + h + ":" + h + "|" + ipv4 + ")";
        auto before = [&](int n) { return "(?:(?:" + h + ":){0," + std::to_string(n) + "}" + h + ")?::"; };
        const std::string v6 = "(?:(?:" + h + ":){6}" + ls32 + "|::(?:" + h + ":){5}" + ls32 + "|(?:" + h + ")?::(?:" + h +
                               ":){4}" + ls32 + "|" + before(1) + "(?:" + h + ":){3}" + ls32 + "|" + before(2) + "(?:" + h +
                               ":){2}" + ls32 + "|" + before(3) + h + ":" + ls32 + "|" + before(4) + ls32 + "|" + before(5) + h +
                               "|" + before(6) + ")";
        return format == "ipv6" ? "^" + v6 + "$" : "^(?:" + ipv4 + "|" + v6 + ")$";
    }
    // RFC 3339's duration (ISO 8601: P1Y2M3D, PT4H5M6S, P2W), seconds with a fraction as
    // Pydantic writes a timedelta.
    if (format == "duration") {
        const std::string sec = "\\d+(?:\\.\\d+)?S", min = "\\d+M(?:" + sec + ")?", hour = "\\d+H(?:" + min + ")?";
        const std::string time = "T(?:" + hour + "|" + min + "|" + sec + ")";
        const std::string day = "\\d+D", month = "\\d+M(?:" + day + ")?", year = "\\d+Y(?:" + month + ")?";
        return "^P(?:(?:" + day + "|" + month + "|" + year + ")(?:" + time + ")?|" + time + "|\\d+W)$";
    }
    // RFC 3986's absolute URI with an authority: scheme://host[:port], then a path, query and
    // fragment of their unreserved, sub-delims, ':' '@' and percent-encoded characters.
    if (format == "uri") {
        const std::string pchar = "(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})";
        const std::string qchar = "(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})";
        return "^[A-Za-z][A-Za-z0-9+.-]*://" + label + "(?:\\." + label + ")*(?::\\d{1,5})?(?:/" + pchar + "*)*(?:\\?" +
               qchar + "*)?(?:#" + qchar + "*)?$";
    }
    // RFC 5321's dot-string local part (atoms of letters, digits and !#$%&'*+/=?^_`{|}~-) at a
    // domain of two or more labels.
    if (format == "email")
        return "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@" + label + "(?:\\." + label + ")+$";
    return "";
}

}  // namespace shardlm
