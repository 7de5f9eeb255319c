#include "runtime/json_mode.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace shardlm {
namespace {
bool space(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
bool digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool hex(uint8_t b) { return digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }
const char* const kLiterals[] = {"true", "false", "null"};
}  // namespace

bool JsonAcceptor::value_start(uint8_t b) {
    switch (b) {
        case '{': stack_ += '{'; mode_ = Mode::ObjFirst; return true;
        case '[': stack_ += '['; mode_ = Mode::ArrFirst; return true;
        case '"': mode_ = Mode::String; key_ = false; return true;
        case '-': mode_ = Mode::Number; num_ = Minus; return true;
        case 't': case 'f': case 'n':
            mode_ = Mode::Literal;
            lit_ = b == 't' ? 0 : b == 'f' ? 1 : 2;
            count_ = 1;
            return true;
        default:
            if (!digit(b)) return false;
            mode_ = Mode::Number;
            num_ = b == '0' ? Zero : Int;
            return true;
    }
}

void JsonAcceptor::value_end() { mode_ = stack_.empty() ? Mode::Done : Mode::After; }

bool JsonAcceptor::close() {
    stack_.pop_back();
    value_end();
    return true;
}

bool JsonAcceptor::push(uint8_t b) {
    // Between tokens of the structure: whitespace, at most kMaxSpace bytes in a row with one line
    // break among them (room for indentation; a model that only adds spaces or empty lines cannot
    // stall), then the structure's own bytes.
    const bool structural = mode_ == Mode::ObjFirst || mode_ == Mode::ObjKey ||
                            mode_ == Mode::Colon || mode_ == Mode::Value || mode_ == Mode::ArrFirst ||
                            mode_ == Mode::After;
    if (structural) {
        if (space(b)) {
            if (space_ >= kMaxSpace || (b == '\n' && newline_)) return false;
            ++space_;
            newline_ = newline_ || b == '\n';
            return true;
        }
        const uint8_t was = space_;
        const bool had = newline_;
        space_ = 0;
        newline_ = false;
        if (structural_byte(b)) return true;
        space_ = was;
        newline_ = had;
        return false;
    }
    switch (mode_) {
        case Mode::Start: return structural_byte(b);  // the text starts with the object
        case Mode::String:
            if (b == '"') {
                if (key_) mode_ = Mode::Colon;
                else value_end();
                return true;
            }
            if (b == '\\') {
                mode_ = Mode::Escape;
                return true;
            }
            if (b < 0x20) return false;
            if (b < 0x80) return true;
            // A character's lead byte: how many continuation bytes follow (no overlong 2-byte
            // forms, nothing past U+10FFFF).
            if (b >= 0xC2 && b <= 0xDF) count_ = 1;
            else if (b >= 0xE0 && b <= 0xEF) count_ = 2;
            else if (b >= 0xF0 && b <= 0xF4) count_ = 3;
            else return false;
            mode_ = Mode::Utf8;
            return true;
        case Mode::Utf8:
            if ((b & 0xC0) != 0x80) return false;
            if (--count_ == 0) mode_ = Mode::String;
            return true;
        case Mode::Escape:
            if (b == 'u') {
                mode_ = Mode::Hex;
                count_ = 4;
                return true;
            }
            if (b == 0 || !std::strchr("\"\\/bfnrt", b)) return false;
            mode_ = Mode::String;
            return true;
        case Mode::Hex:
            if (!hex(b)) return false;
            if (--count_ == 0) mode_ = Mode::String;
            return true;
        case Mode::Literal:
            if (b != uint8_t(kLiterals[lit_][count_])) return false;
            if (kLiterals[lit_][++count_] == 0) value_end();
            return true;
        case Mode::Number:
            switch (num_) {
                case Minus:
                    if (!digit(b)) return false;
                    num_ = b == '0' ? Zero : Int;
                    return true;
                case Int:
                    if (digit(b)) return true;
                    [[fallthrough]];
                case Zero:
                    if (b == '.') num_ = Dot;
                    else if (b == 'e' || b == 'E') num_ = Exp;
                    else break;
                    return true;
                case Dot:
                    if (!digit(b)) return false;
                    num_ = Frac;
                    return true;
                case Frac:
                    if (digit(b)) return true;
                    if (b != 'e' && b != 'E') break;
                    num_ = Exp;
                    return true;
                case Exp:
                    if (b == '+' || b == '-') {
                        num_ = ExpSign;
                        return true;
                    }
                    [[fallthrough]];
                case ExpSign:
                    if (!digit(b)) return false;
                    num_ = ExpInt;
                    return true;
                case ExpInt:
                    if (digit(b)) return true;
                    break;
            }
            // The number ended where it may (not after '-', '.', 'e' or a sign): this byte
            // follows it as after any value (a number is never at the top).
            mode_ = Mode::After;
            if (push(b)) return true;
            mode_ = Mode::Number;
            return false;
        default: return false;  // Done
    }
}

// A non-space byte where the structure goes on (mode_ structural).
bool JsonAcceptor::structural_byte(uint8_t b) {
    switch (mode_) {
        case Mode::Start:
            if (b != '{') return false;
            stack_ += '{';
            mode_ = Mode::ObjFirst;
            return true;
        case Mode::ObjFirst:
        case Mode::ObjKey:
            if (b == '"') {
                mode_ = Mode::String;
                key_ = true;
                return true;
            }
            if (b != '}' || mode_ == Mode::ObjKey) return false;  // no '}' after a comma
            return close();
        case Mode::Colon:
            if (b != ':') return false;
            mode_ = Mode::Value;
            return true;
        case Mode::Value: return value_start(b);
        case Mode::ArrFirst:
            return b == ']' ? close() : value_start(b);
        default: {  // After
            const char open = stack_.back();
            if (b == ',') {
                mode_ = open == '{' ? Mode::ObjKey : Mode::Value;
                return true;
            }
            return ((b == '}' && open == '{') || (b == ']' && open == '[')) && close();
        }
    }
}

bool JsonAcceptor::push(const std::string& bytes) {
    for (const char c : bytes)
        if (!push(uint8_t(c))) return false;
    return true;
}

std::string JsonAcceptor::key(size_t depth) const {
    std::string k{char(mode_), char(count_), char(lit_), char(num_), char(key_), char(space_), char(newline_)};
    if (stack_.size() <= depth) return k + '|' + stack_;
    return k + '+' + stack_.substr(stack_.size() - depth);
}

JsonVocab::JsonVocab(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
    for (size_t id = 0; id < bytes_.size(); ++id) {
        const std::string& b = bytes_[id];
        if (b.empty()) continue;
        order_.push_back(int32_t(id));
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
}

const std::vector<uint8_t>& JsonVocab::allowed(const JsonAcceptor& s) {
    // A token can look no deeper into the open containers than the brackets it closes.
    const std::string k = s.key(max_close_);
    auto it = masks_.find(k);
    if (it != masks_.end()) return it->second;
    if (masks_.size() >= kMaxMasks) masks_.clear();
    std::vector<uint8_t> mask(bytes_.size(), 0);
    // at[n]: s after the current token's first n bytes; a prefix that failed at byte `dead` fails
    // every token that shares its first dead + 1 bytes (the ones right after it in byte order).
    std::vector<JsonAcceptor> at{s};
    size_t dead = SIZE_MAX;
    for (size_t i = 0; i < order_.size(); ++i) {
        const std::string& b = bytes_[size_t(order_[i])];
        const size_t shared = lcp_[i];
        if (dead != SIZE_MAX && shared > dead) continue;
        dead = SIZE_MAX;
        at.resize(shared + 1);
        for (size_t n = shared; n < b.size(); ++n) {
            JsonAcceptor next = at[n];
            if (!next.push(uint8_t(b[n]))) {
                dead = n;
                break;
            }
            at.push_back(std::move(next));
        }
        if (dead == SIZE_MAX) mask[size_t(order_[i])] = 1;
    }
    return masks_.emplace(k, std::move(mask)).first->second;
}

}  // namespace shardlm
