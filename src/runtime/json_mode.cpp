#include "runtime/json_mode.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>

namespace shardlm {
namespace {
bool space(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
bool digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool hex(uint8_t b) { return digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }
enum NumState : uint8_t { Minus, Zero, Int, Dot, Frac, Exp, ExpSign, ExpInt };  // where a number is (Frame::aux)
const char kShortEscapes[] = "\"\\/bfnrt";  // after a '\\' in a string (and 'u')
// The character a short escape stands for ("\\n": '\n'), 0 for none.
uint32_t unescaped(uint8_t b) {
    switch (b) {
        case '"': case '\\': case '/': return b;
        case 'b': return 8;
        case 'f': return 12;
        case 'n': return 10;
        case 'r': return 13;
        case 't': return 9;
        default: return 0;
    }
}
}  // namespace

bool JsonAcceptor::Frame::operator<(const Frame& o) const {
    return std::tie(node, phase, aux, a, b, c, d) < std::tie(o.node, o.phase, o.aux, o.a, o.b, o.c, o.d);
}
bool JsonAcceptor::Frame::operator==(const Frame& o) const {
    return std::tie(node, phase, aux, a, b, c, d) == std::tie(o.node, o.phase, o.aux, o.a, o.b, o.c, o.d);
}
bool JsonAcceptor::Thread::operator<(const Thread& o) const {
    return std::tie(space, newline, stack) < std::tie(o.space, o.newline, o.stack);
}
bool JsonAcceptor::Thread::operator==(const Thread& o) const {
    return std::tie(space, newline, stack) == std::tie(o.space, o.newline, o.stack);
}

JsonAcceptor::JsonAcceptor() : JsonAcceptor(std::make_shared<const JsonSchema>(json_object_schema())) {}

JsonAcceptor::JsonAcceptor(std::shared_ptr<const JsonSchema> schema) : schema_(std::move(schema)) {
    threads_.push_back(Thread{{Frame{}}});
}

bool JsonAcceptor::complete() const {
    return std::any_of(threads_.begin(), threads_.end(), [](const Thread& t) { return t.stack[0].phase == Done; });
}

bool JsonAcceptor::push(uint8_t b) {
    saved_ = threads_;  // no allocation once its buffers are warm
    if (advance(b)) return true;
    threads_.swap(saved_);
    return false;
}

bool JsonAcceptor::advance(uint8_t b) {
    // The threads step in place; a reading that splits in two adds the others to next_.
    next_.clear();
    size_t live = 0;
    for (size_t i = 0; i < threads_.size(); ++i)
        if (step(threads_[i], b, next_)) std::swap(threads_[live++], threads_[i]);
    threads_.resize(live);
    for (Thread& t : next_) threads_.push_back(std::move(t));
    if (threads_.size() > 1) {
        std::sort(threads_.begin(), threads_.end());
        threads_.erase(std::unique(threads_.begin(), threads_.end()), threads_.end());
    }
    // Each reading costs every later byte (and mask) a step: a text read more ways at once than
    // this is cut here (a schema's nested, overlapping anyOf could double them at each level).
    if (threads_.size() > kMaxReadings) threads_.clear();
    return !threads_.empty();
}

bool JsonAcceptor::push(const std::string& bytes) {
    for (const char c : bytes)
        if (!push(uint8_t(c))) return false;
    return true;
}

void JsonAcceptor::value_end(Thread& t) {
    t.stack.pop_back();
    Frame& p = t.stack.back();
    p.phase = p.phase == Child ? Done : p.phase == KeyChild ? Colon : p.phase == SeqChild ? SeqNext : After;
}

bool JsonAcceptor::step(Thread& t, uint8_t b, std::vector<Thread>& out) const {
    Frame& f = t.stack.back();
    switch (f.phase) {
        case Begin:  // the text starts with the value
            f.phase = Child;
            return start(t, schema_->root, b, out);
        case Done: return false;  // nothing after the value
        case KeyLit: {
            const std::string& k = node(f).keys[size_t(f.b)];
            if (uint8_t(k[size_t(f.c)]) != b) return false;
            if (size_t(++f.c) == k.size()) f.phase = Colon;
            return true;
        }
        case Chars: case Escape: case Hex: case LowSlash: case LowU: case Utf8: return string(t, b, out);
        case Num: return number(t, b, out);
        case Lit: return literal(t, b, out);
        case Raw: return raw(t, b, &out);
        case SeqNext: return seq(t, b, out, true);
        default: break;
    }
    // Between the structure's parts: whitespace, at most max_space bytes in a row with one line
    // break among them (room for indentation; a model that only adds spaces or empty lines cannot
    // stall), then the structure's own bytes.
    if (space(b)) {
        if (t.space >= schema_->max_space || (b == '\n' && t.newline)) return false;
        ++t.space;
        t.newline = t.newline || b == '\n';
        return true;
    }
    t.space = 0;
    t.newline = false;
    return structural(t, b, out);
}

namespace {
bool required_from(const JsonSchema::Node& n, int32_t from) {
    return std::any_of(n.required.begin() + std::min<ptrdiff_t>(from, ptrdiff_t(n.required.size())), n.required.end(),
                       [](uint8_t r) { return r != 0; });
}
}  // namespace

// A non-space byte where the structure goes on: the top frame is an object or array between its parts.
bool JsonAcceptor::structural(Thread& t, uint8_t b, std::vector<Thread>& out) const {
    Frame& f = t.stack.back();
    const JsonSchema::Node& n = node(f);
    const bool free_keys = n.extra >= 0;
    switch (f.phase) {
        case ObjFirst:
        case ObjNext:
            if (b == '"') {
                if (free_keys) {
                    f.phase = KeyChild;
                    Frame k;
                    k.node = schema_->key;
                    k.phase = Chars;
                    t.stack.push_back(k);
                    return true;
                }
                // The keys still allowed, in order, up to the first required one: each a reading
                // (the first in t, the others in out).
                int32_t last = f.a;
                while (last < int32_t(n.keys.size()) && !n.required[size_t(last)]) ++last;
                last = std::min(last, int32_t(n.keys.size()) - 1);
                if (f.a > last) return false;
                for (int32_t j = f.a + 1; j <= last; ++j) {
                    out.push_back(t);
                    Frame& g = out.back().stack.back();
                    g.phase = KeyLit;
                    g.b = j;
                    g.c = 1;  // the opening quote
                }
                f.phase = KeyLit;
                f.b = f.a;
                f.c = 1;
                return true;
            }
            // No '}' after a comma, nor before the required keys.
            if (b != '}' || f.phase != ObjFirst || (!free_keys && required_from(n, f.a))) return false;
            value_end(t);
            return true;
        case Colon:
            if (b != ':') return false;
            f.phase = ObjValue;
            return true;
        case ObjValue: {
            const int32_t v = free_keys ? n.extra : n.values[size_t(f.b)];
            f.phase = ObjChild;
            return start(t, v, b, out);
        }
        case After:
            if (n.kind == JsonSchema::Kind::Object) {
                const int32_t from = free_keys ? 0 : f.b + 1;
                if (b == ',' && (free_keys || from < int32_t(n.keys.size()))) {
                    f.phase = ObjNext;
                    f.a = from;
                    return true;
                }
                if (b != '}' || (!free_keys && required_from(n, from))) return false;
                value_end(t);
                return true;
            }
            if (b == ',' && (n.max_count < 0 || f.a < n.max_count)) {
                f.phase = ArrNext;
                return true;
            }
            if (b != ']' || f.a < n.min_count) return false;
            value_end(t);
            return true;
        case ArrFirst:
            if (b == ']') {
                if (n.min_count > 0) return false;
                value_end(t);
                return true;
            }
            if (n.max_count == 0) return false;
            [[fallthrough]];
        default: {  // ArrNext: an item begins (counted as far as the limits and the tuple's items need)
            const int64_t tuple = int64_t(n.values.size());
            const int32_t item = f.a < tuple ? n.values[size_t(f.a)] : n.items;
            if (f.a < std::max({n.min_count, n.max_count, tuple})) ++f.a;
            f.phase = ArrChild;
            return start(t, item, b, out);
        }
    }
}

bool JsonAcceptor::start(Thread& t, int32_t id, uint8_t b, std::vector<Thread>& out) const {
    const JsonSchema::Node& n = schema_->nodes[size_t(id)];
    Frame f;
    f.node = id;
    switch (n.kind) {
        case JsonSchema::Kind::AnyOf: {
            // One alternative that opens with b goes on in t; several are readings of their own.
            int32_t only = -1, count = 0;
            for (const int32_t alt : n.alts)
                if (opens(alt, b)) {
                    only = alt;
                    ++count;
                }
            if (count == 1) return start(t, only, b, out);
            for (const int32_t alt : n.alts) {
                if (!opens(alt, b)) continue;
                Thread u = t;
                if (start(u, alt, b, out)) out.push_back(std::move(u));
            }
            return false;  // t itself is none of them
        }
        case JsonSchema::Kind::Object:
            if (b != '{') return false;
            f.phase = ObjFirst;
            break;
        case JsonSchema::Kind::Array:
            if (b != '[') return false;
            f.phase = ArrFirst;
            break;
        case JsonSchema::Kind::String:
            if (b != '"') return false;
            f.phase = Chars;
            if (n.pattern >= 0) f.a = schema_->patterns[size_t(n.pattern)].start;
            break;
        case JsonSchema::Kind::Number:
        case JsonSchema::Kind::Integer:
            if (n.pattern >= 0) {  // an integer in bounds: its text follows their DFA, state in f.a
                const PatternDfa& d = schema_->patterns[size_t(n.pattern)];
                f.a = d.next(d.start, b);
                if (f.a < 0) return false;
                f.phase = Num;
                break;
            }
            if (b == '-') f.aux = Minus;
            else if (b == '0') f.aux = Zero;
            else if (digit(b)) f.aux = Int;
            else return false;
            f.phase = Num;
            break;
        case JsonSchema::Kind::Const:
            f.phase = Lit;
            f.b = int32_t(n.texts.size());
            t.stack.push_back(f);
            return literal(t, b, out);
        case JsonSchema::Kind::Text:
            f.phase = Raw;
            f.a = schema_->patterns[size_t(n.pattern)].start;
            t.stack.push_back(f);
            return raw(t, b, nullptr);
        case JsonSchema::Kind::Seq:
            f.phase = SeqNext;
            t.stack.push_back(f);
            return seq(t, b, out, false);
    }
    t.stack.push_back(f);
    return true;
}

bool JsonAcceptor::literal(Thread& t, uint8_t b, std::vector<Thread>& out) const {
    Frame& f = t.stack.back();
    const std::vector<std::string>& texts = node(f).texts;
    const size_t c = size_t(f.c);
    if (texts[size_t(f.a)].size() == c) {  // a text ends here (a number's: what follows tells)
        Thread e = t;
        value_end(e);
        if (step(e, b, out)) out.push_back(std::move(e));
    }
    // The texts [f.a, f.b) share their first c bytes and are sorted: the ones that go on with b
    // are a run among them.
    int32_t i = f.a;
    while (i < f.b && (texts[size_t(i)].size() <= c || uint8_t(texts[size_t(i)][c]) < b)) ++i;
    int32_t j = i;
    while (j < f.b && texts[size_t(j)].size() > c && uint8_t(texts[size_t(j)][c]) == b) ++j;
    if (i == j) return false;
    f.a = i;
    f.b = j;
    f.c = int32_t(c + 1);
    if (j - i == 1 && texts[size_t(i)].size() == c + 1) value_end(t);  // the one text left is whole
    return true;
}

bool JsonAcceptor::number(Thread& t, uint8_t b, std::vector<Thread>& out) const {
    Frame& f = t.stack.back();
    const bool integer = node(f).kind == JsonSchema::Kind::Integer;
    if (node(f).pattern >= 0) {  // an integer in bounds: on along the DFA, or ended where it accepts
        const PatternDfa& d = schema_->patterns[size_t(node(f).pattern)];
        const int32_t s = d.next(f.a, b);
        if (s >= 0) {
            f.a = s;
            return true;
        }
        if (!d.accept[size_t(f.a)]) return false;
        value_end(t);
        return step(t, b, out);
    }
    auto go = [&](uint8_t state) {
        f.aux = state;
        return true;
    };
    switch (f.aux) {
        case Minus: return digit(b) && go(b == '0' ? Zero : Int);
        case Int:
            if (digit(b)) return true;
            [[fallthrough]];
        case Zero:
            if (integer) break;
            if (b == '.') return go(Dot);
            if (b == 'e' || b == 'E') return go(Exp);
            break;
        case Dot: return digit(b) && go(Frac);
        case Frac:
            if (digit(b)) return true;
            if (b == 'e' || b == 'E') return go(Exp);
            break;
        case Exp:
            if (b == '+' || b == '-') return go(ExpSign);
            [[fallthrough]];
        case ExpSign: return digit(b) && go(ExpInt);
        default:  // ExpInt
            if (digit(b)) return true;
            break;
    }
    // The number ended where it may (not after '-', '.', 'e' or a sign): b comes after it.
    value_end(t);
    return step(t, b, out);
}

bool JsonAcceptor::Gate::fits(int32_t to) const {
    if (!limits) return true;
    const JsonSchema::Node& n = *limits;
    const int64_t c = count + 1, span = n.span;
    const int64_t lo = std::max<int64_t>(0, n.min_count - c), hi = std::min(span, n.max_count >= 0 ? n.max_count - c : span);
    return lo <= hi && n.ends[size_t(to) * size_t(span + 1) + size_t(lo)] <= hi;
}

bool JsonAcceptor::Gate::any(int32_t s, uint32_t lo, uint32_t hi) const {
    if (!limits) return dfa->any(s, lo, hi);
    const std::vector<PatternDfa::Edge>& es = dfa->edges[size_t(s)];
    auto it = std::lower_bound(es.begin(), es.end(), lo, [](const PatternDfa::Edge& x, uint32_t c) { return x.hi < c; });
    for (; it != es.end() && it->lo <= hi; ++it)
        if (fits(it->to)) return true;
    return false;
}

int32_t JsonAcceptor::Gate::next(int32_t s, uint32_t cp) const {
    const int32_t t = dfa->next(s, cp);
    return t >= 0 && fits(t) ? t : -1;
}

bool JsonAcceptor::utf8_lead(Frame& f, uint8_t b, const Gate* g) {
    // How many continuation bytes follow (no overlong 2-byte forms, nothing past U+10FFFF).
    if (b >= 0xC2 && b <= 0xDF) f.aux = 1;
    else if (b >= 0xE0 && b <= 0xEF) f.aux = 2;
    else if (b >= 0xF0 && b <= 0xF4) f.aux = 3;
    else return false;
    f.b = f.aux;
    f.c = int32_t(b & (0x3Fu >> f.aux));
    if (!g) return true;
    // The characters of this length it may begin (past the overlong forms' range).
    static const uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
    const uint32_t lo = uint32_t(f.c) << (6 * f.aux);
    return g->any(f.a, std::max(lo, kLeast[f.aux]), lo + (1u << (6 * f.aux)) - 1);
}

bool JsonAcceptor::utf8_next(Frame& f, uint8_t b, const Gate* g) {
    if ((b & 0xC0) != 0x80) return false;
    // The second byte of E0, ED, F0 and F4 is narrower: no overlong 3- and 4-byte forms, no
    // surrogates, nothing past U+10FFFF.
    if (f.aux == f.b && ((f.b == 2 && f.c == 0 && b < 0xA0) || (f.b == 2 && f.c == 0xD && b > 0x9F) ||
                         (f.b == 3 && f.c == 0 && b < 0x90) || (f.b == 3 && f.c == 4 && b > 0x8F)))
        return false;
    const uint32_t bits = (uint32_t(f.c) << 6) | (b & 0x3F);
    const int rest = f.aux - 1;
    if (g && rest > 0) {
        const uint32_t lo = bits << (6 * rest);
        if (!g->any(f.a, lo, lo + (1u << (6 * rest)) - 1)) return false;
    }
    if (g && rest == 0) {
        const int32_t s = g->next(f.a, bits);
        if (s < 0) return false;
        f.a = s;
    }
    f.c = rest > 0 ? int32_t(bits) : 0;
    if (--f.aux == 0) f.b = 0;
    return true;
}

bool JsonAcceptor::seq(Thread& t, uint8_t b, std::vector<Thread>& out, bool begun) const {
    const std::vector<int32_t>& parts = node(t.stack.back()).alts;
    for (int32_t i = t.stack.back().a;; ++i) {
        if (i == int32_t(parts.size())) {  // every part left may be empty: b follows the sequence
            if (!begun) return false;
            value_end(t);
            return step(t, b, out);
        }
        const JsonSchema::Node& p = schema_->nodes[size_t(parts[size_t(i)])];
        if (!p.first[b]) {
            if (!p.nullable) return false;
            continue;
        }
        if (!p.nullable) return part(t, i, b, out);
        // b begins part i, or part i is empty and b begins what follows: two readings.
        Thread u = t;
        if (part(u, i, b, out)) out.push_back(std::move(u));
    }
}

bool JsonAcceptor::part(Thread& t, int32_t i, uint8_t b, std::vector<Thread>& out) const {
    Frame& f = t.stack.back();
    const std::vector<int32_t>& parts = node(f).alts;
    const int32_t id = parts[size_t(i)];
    // The last part takes the sequence's place: a repetition (a rule that ends with itself) then
    // reads any number of items without deepening the stack.
    if (i + 1 == int32_t(parts.size())) {
        t.stack.pop_back();
    } else {
        f.a = i + 1;
        f.phase = SeqChild;
    }
    if (t.stack.size() >= kMaxFrames) return false;
    return start(t, id, b, out);
}

bool JsonAcceptor::raw(Thread& t, uint8_t b, std::vector<Thread>* out) const {
    Frame& f = t.stack.back();
    const PatternDfa& d = schema_->patterns[size_t(node(f).pattern)];
    const Gate g{&d, nullptr, 0};
    // A grammar's text in an accepting state may end here, b following it: a reading of its own.
    // (guided_regex's text is the whole one: nothing follows it.)
    if (out && f.aux == 0 && d.accept[size_t(f.a)] && t.stack.size() > 2) {
        Thread e = t;
        value_end(e);
        if (step(e, b, *out)) out->push_back(std::move(e));
    }
    if (f.aux > 0) {
        if (!utf8_next(f, b, &g)) return false;
    } else if (b >= 0x80) {
        return utf8_lead(f, b, &g);
    } else {
        const int32_t s = d.next(f.a, b);
        if (s < 0) return false;
        f.a = s;
    }
    // Where nothing can follow the text is complete; elsewhere an accepting state may end it.
    if (f.aux == 0 && d.accept[size_t(f.a)] && d.edges[size_t(f.a)].empty()) value_end(t);
    return true;
}

bool JsonAcceptor::may_end() const {
    // A reading may end where each open part may: a text in an accepting state, a sequence whose
    // parts left may all be empty (a JSON value's parts never may).
    auto ends = [&](const Frame& f) {
        const JsonSchema::Node& n = node(f);
        switch (f.phase) {
            case Raw: return f.aux == 0 && schema_->patterns[size_t(n.pattern)].accept[size_t(f.a)] != 0;
            case SeqNext:
            case SeqChild:
                return std::all_of(n.alts.begin() + f.a, n.alts.end(),
                                   [&](int32_t p) { return schema_->nodes[size_t(p)].nullable; });
            default: return false;
        }
    };
    return std::any_of(threads_.begin(), threads_.end(), [&](const Thread& t) {
        const Phase bottom = t.stack[0].phase;
        if (bottom == Done) return true;
        if (bottom == Begin) return schema_->nodes[size_t(schema_->root)].nullable;  // nothing yet: the empty text
        return std::all_of(t.stack.begin() + 1, t.stack.end(), ends);
    });
}

bool JsonAcceptor::string(Thread& t, uint8_t b, std::vector<Thread>&) const {
    Frame& f = t.stack.back();
    const JsonSchema::Node& n = node(f);
    // A pattern's DFA (runtime/json_pattern.h): its state is f.a, the characters f.d (under
    // length limits), a character's UTF-8 bits so far f.c. Each byte is taken only where some
    // character it may begin keeps a match within the limits possible; \u escapes are not taken.
    const PatternDfa* dfa = n.pattern >= 0 ? &schema_->patterns[size_t(n.pattern)] : nullptr;
    const Gate gate{dfa, n.span > 0 ? &n : nullptr, f.d};
    const Gate* g = dfa ? &gate : nullptr;
    auto step_dfa = [&](uint32_t cp) {
        const int32_t s = gate.next(f.a, cp);
        if (s < 0) return false;
        f.a = s;
        return true;
    };
    // Characters are counted only as far as the limits need (none without limits), so a string's
    // states repeat and their masks are found in JsonVocab's cache.
    const int32_t cap = int32_t(std::max(n.min_count, n.max_count));
    int32_t& count = dfa ? f.d : f.a;
    auto counted = [&] {
        if (count < cap) ++count;
        f.c = 0;
        f.phase = Chars;
        return true;
    };
    switch (f.phase) {
        case Chars:
            if (b == '"') {
                if (count < n.min_count || (dfa && !dfa->accept[size_t(f.a)])) return false;
                value_end(t);
                return true;
            }
            if (n.max_count >= 0 && count >= n.max_count) return false;  // no room for another character
            if (b == '\\') {
                if (dfa && !std::any_of(std::begin(kShortEscapes), std::end(kShortEscapes) - 1,
                                        [&](char e) { return gate.next(f.a, unescaped(uint8_t(e))) >= 0; }))
                    return false;
                f.phase = Escape;
                return true;
            }
            if (b < 0x20) return false;  // control characters are escaped
            if (b >= 0x80) {
                if (!utf8_lead(f, b, g)) return false;
                if (!dfa && count < cap) ++count;  // (a patterned string's counts once it is whole)
                f.phase = Utf8;
                return true;
            }
            if (dfa && !step_dfa(b)) return false;
            return counted();
        case Utf8:
            if (!utf8_next(f, b, g)) return false;
            if (f.aux == 0) {
                if (dfa && count < cap) ++count;
                f.phase = Chars;
            }
            return true;
        case Escape:
            if (b == 'u') {
                if (dfa) return false;
                f.phase = Hex;
                f.aux = 4;
                f.c = 0;
                return true;
            }
            if (b == 0 || !std::strchr(kShortEscapes, b)) return false;
            if (dfa && !step_dfa(unescaped(b))) return false;
            return counted();
        case LowSlash:
            if (b != '\\') return false;
            f.phase = LowU;
            return true;
        case LowU:
            if (b != 'u') return false;
            f.phase = Hex;
            f.aux = 4;
            f.c = 0;
            return true;
        default: {  // Hex
            if (!hex(b)) return false;
            f.c = f.c * 16 + (digit(b) ? b - '0' : (b | 0x20) - 'a' + 10);
            if (--f.aux > 0) {
                // The digits so far leave the values [lo, hi]: refused now where every one of
                // them would be (a low half due but out of reach, or a low half alone), so that
                // no text is taken that cannot go on.
                const int32_t lo = f.c << (4 * f.aux), hi = lo + (1 << (4 * f.aux)) - 1;
                if (f.b != 0 ? hi < 0xDC00 || lo > 0xDFFF : lo >= 0xDC00 && hi <= 0xDFFF) return false;
                return true;
            }
            // A character past U+FFFF is escaped as a surrogate pair: high, then low, one
            // character (what minLength and maxLength count); a surrogate alone is refused.
            const bool high = f.c >= 0xD800 && f.c <= 0xDBFF, low = f.c >= 0xDC00 && f.c <= 0xDFFF;
            if (f.b != 0) {  // the low half is due
                if (!low) return false;
                f.b = 0;
            } else if (low) {
                return false;
            } else if (high) {
                f.b = 1;
                f.c = 0;
                f.phase = LowSlash;
                return true;
            }
            return counted();
        }
    }
}

std::string JsonAcceptor::key(size_t depth, size_t reach) const {
    std::string k;
    auto put = [&k](int64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); };
    const int64_t far = int64_t(std::min<size_t>(reach, INT32_MAX)) + 1;
    for (const Thread& t : threads_) {
        const size_t keep = std::min(t.stack.size(), depth + 2);
        k += char(t.space);
        k += char(t.newline);
        k += t.stack.size() > keep ? '+' : '|';
        put(int64_t(keep));
        for (size_t i = t.stack.size() - keep; i < t.stack.size(); ++i) {
            const Frame& f = t.stack[i];
            put(f.node);
            k += char(f.phase);
            k += char(f.aux);
            put(f.b);
            put(f.c);
            const JsonSchema::Kind kind = f.node >= 0 ? node(f).kind : JsonSchema::Kind::AnyOf;
            if (kind != JsonSchema::Kind::String && kind != JsonSchema::Kind::Array) {
                put(f.a);
                continue;
            }
            // A count (characters, items) is seen only through its limits, and `reach` bytes add
            // at most `reach` to it: states whose distances to the limits are alike that far
            // take the same tokens (so a long bounded string does not make a new state per token).
            const JsonSchema::Node& n = node(f);
            if (n.pattern >= 0) {  // a's the DFA's state, d its characters as far as the limits see them
                put(f.a);
                if (n.span > 0) {
                    put(n.max_count < 0 ? -1 : std::min<int64_t>(n.max_count - f.d, n.span + far));
                    put(std::clamp<int64_t>(n.min_count - f.d, 0, n.span + far));
                }
                continue;
            }
            put(n.max_count < 0 ? -1 : std::min(n.max_count - f.a, far));
            put(std::clamp<int64_t>(n.min_count - f.a, 0, far));
            if (!n.values.empty()) put(std::min<int64_t>(f.a, int64_t(n.values.size())));  // a tuple's next item
        }
    }
    return k;
}

JsonVocab::JsonVocab(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
    for (size_t id = 0; id < bytes_.size(); ++id) {
        const std::string& b = bytes_[id];
        if (b.empty()) continue;
        order_.push_back(int32_t(id));
        reach_ = std::max(reach_, b.size());
        max_close_ = std::max(max_close_, size_t(std::count_if(b.begin(), b.end(), [](char c) { return c == '}' || c == ']'; })));
    }
    std::sort(order_.begin(), order_.end(), [&](int32_t x, int32_t y) { return bytes_[size_t(x)] < bytes_[size_t(y)]; });
    lcp_.assign(order_.size(), 0);
    for (size_t i = 1; i < order_.size(); ++i) {
        const std::string &p = bytes_[size_t(order_[i - 1])], &q = bytes_[size_t(order_[i])];
        size_t n = 0;
        while (n < p.size() && n < q.size() && p[n] == q[n]) ++n;
        lcp_[i] = uint32_t(n);
    }
    off_.push_back(0);
    for (const int32_t id : order_) {
        sorted_ += bytes_[size_t(id)];
        off_.push_back(uint32_t(sorted_.size()));
    }
}

const std::vector<uint8_t>& JsonVocab::allowed(const JsonAcceptor& s) {
    // A token can look no deeper into the open containers than the brackets it closes (into a
    // grammar's parts, as deep as they go).
    const size_t depth = s.schema()->grammar ? JsonAcceptor::kMaxFrames : max_close_;
    std::pair<const JsonSchema*, std::string> k{s.schema().get(), s.key(depth, reach_)};
    auto it = masks_.find(k);
    if (it != masks_.end()) return it->second;
    if (masks_.size() >= kMaxMasks) {
        masks_.clear();
        held_.clear();
    }
    if (std::find(held_.begin(), held_.end(), s.schema()) == held_.end()) held_.push_back(s.schema());
    std::vector<uint8_t> mask(bytes_.size(), 0);
    // at[n]: s after the current token's first n bytes (entries past the current token's length
    // are stale, reused for their buffers); a prefix that failed at byte `dead` fails every token
    // that shares its first dead + 1 bytes (the ones right after it in byte order).
    std::vector<JsonAcceptor> at{s};
    size_t dead = SIZE_MAX;
    for (size_t i = 0; i < order_.size(); ++i) {
        const char* b = sorted_.data() + off_[i];
        const size_t len = off_[i + 1] - off_[i];
        const size_t shared = lcp_[i];
        if (dead != SIZE_MAX && shared > dead) continue;
        dead = SIZE_MAX;
        for (size_t n = shared; n < len; ++n) {
            if (at.size() <= n + 1) at.push_back(at[n]);
            else at[n + 1] = at[n];
            if (!at[n + 1].advance(uint8_t(b[n]))) {
                dead = n;
                break;
            }
        }
        if (dead == SIZE_MAX) mask[size_t(order_[i])] = 1;
    }
    return masks_.emplace(std::move(k), std::move(mask)).first->second;
}

}  // namespace shardlm
