#include "tokenizer/json_prefix.h"

#include <cstdio>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

bool json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool digit(char c) { return c >= '0' && c <= '9'; }

// Appends code point cp as nlohmann's dump writes it in a string (ensure_ascii off): the two
// characters JSON must escape, the short escapes, other control characters as \u00xx.
void put_escaped(std::string& out, char32_t cp) {
    switch (cp) {
        case '"': out += "\\\""; return;
        case '\\': out += "\\\\"; return;
        case '\b': out += "\\b"; return;
        case '\f': out += "\\f"; return;
        case '\n': out += "\\n"; return;
        case '\r': out += "\\r"; return;
        case '\t': out += "\\t"; return;
        default: break;
    }
    if (cp < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(cp));
        out += buf;
        return;
    }
    append_utf8(out, cp);
}

// The four hex digits at t[i], or -1.
int hex4(const std::string& t, size_t i) {
    if (i + 4 > t.size()) return -1;
    int v = 0;
    for (size_t k = i; k < i + 4; ++k) {
        const char c = t[k];
        const int d = digit(c) ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

enum class Scan { Done, More, Bad };

// A string's characters from t[i] (past its opening quote) to its closing quote, each appended to
// out as dump writes it, and decoded to *raw when given. Done: i is past the closing quote.
// More: the text ends first (i at the character it ends in).
Scan scan_string(const std::string& t, size_t& i, std::string& out, std::string* raw) {
    const size_t n = t.size();
    while (i < n) {
        const unsigned char c = static_cast<unsigned char>(t[i]);
        if (c == '"') {
            ++i;
            return Scan::Done;
        }
        if (c < 0x20) return Scan::Bad;  // control characters must be escaped
        if (c >= 0x80) {
            const size_t len = utf8_seq_len(c);
            if (len == 1) return Scan::Bad;
            if (i + len > n) return Scan::More;
            if (utf8_invalid_offset(std::string_view(t).substr(i, len)) != std::string_view::npos) return Scan::Bad;
            out.append(t, i, len);
            if (raw) raw->append(t, i, len);
            i += len;
            continue;
        }
        char32_t cp = c;
        size_t len = 1;
        if (c == '\\') {
            if (i + 1 >= n) return Scan::More;
            len = 2;
            switch (t[i + 1]) {
                case '"': cp = '"'; break;
                case '\\': cp = '\\'; break;
                case '/': cp = '/'; break;
                case 'b': cp = '\b'; break;
                case 'f': cp = '\f'; break;
                case 'n': cp = '\n'; break;
                case 'r': cp = '\r'; break;
                case 't': cp = '\t'; break;
                case 'u': {
                    if (i + 6 > n) return Scan::More;
                    const int u = hex4(t, i + 2);
                    if (u < 0 || (u >= 0xDC00 && u <= 0xDFFF)) return Scan::Bad;
                    cp = char32_t(u);
                    len = 6;
                    if (u >= 0xD800 && u <= 0xDBFF) {  // a high surrogate: its low one must follow
                        if ((i + 6 < n && t[i + 6] != '\\') || (i + 7 < n && t[i + 7] != 'u')) return Scan::Bad;
                        if (i + 12 > n) return Scan::More;
                        const int lo = hex4(t, i + 8);
                        if (lo < 0xDC00 || lo > 0xDFFF) return Scan::Bad;
                        cp = char32_t(0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00));
                        len = 12;
                    }
                    break;
                }
                default: return Scan::Bad;
            }
        }
        put_escaped(out, cp);
        if (raw) append_utf8(*raw, cp);
        i += len;
    }
    return Scan::More;
}

// JSON's number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
bool json_number(std::string_view s) {
    size_t i = 0;
    const size_t n = s.size();
    if (i < n && s[i] == '-') ++i;
    if (i >= n || !digit(s[i])) return false;
    if (s[i++] != '0')
        while (i < n && digit(s[i])) ++i;
    if (i < n && s[i] == '.') {
        const size_t d = ++i;
        while (i < n && digit(s[i])) ++i;
        if (i == d) return false;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        ++i;
        if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
        const size_t d = i;
        while (i < n && digit(s[i])) ++i;
        if (i == d) return false;
    }
    return i == n;
}

}  // namespace

JsonPrefix scan_json_prefix(const std::string& t, size_t at, bool final) {
    JsonPrefix j;
    // An open object or array. state: 0 just opened (a key or '}', a value or ']'), 1 after ','
    // in an object (a key), 2 after a key (':'), 3 a value is due, 4 after a value (',' or the
    // close).
    struct Level {
        char kind;
        int state;
        int item;         // its entry in j.items, -1 past two levels in
        std::string key;  // an object's: the key of the member whose value is due
    };
    std::vector<Level> st;
    const size_t n = t.size();
    size_t i = at;
    auto bad = [&] {
        j.valid = false;
        return false;
    };
    // A value has ended at i.
    auto ended = [&](int item) {
        if (item >= 0) {
            j.items[size_t(item)].end = j.out.size();
            j.items[size_t(item)].complete = true;
        }
        if (st.empty()) {
            j.complete = true;
            j.end = i;
        } else {
            st.back().state = 4;
        }
    };
    // The value that starts at t[i]; false when the scan stops (the text ends or is not JSON).
    auto value = [&]() -> bool {
        // python_json's own bound: a value deeper than kMaxPythonJsonDepth is refused.
        if (st.size() > size_t(kMaxPythonJsonDepth)) return bad();
        const char c = t[i];
        int item = -1;
        if (st.size() == 1 || st.size() == 2) {
            JsonPrefix::Item it;
            it.parent = st.size() == 1 ? -1 : st[1].item;
            if (st.back().kind == '{') it.key = st.back().key;
            it.kind = c;
            it.begin = it.end = j.out.size();
            item = int(j.items.size());
            j.items.push_back(it);
        }
        if (c == '{' || c == '[') {
            j.out += c;
            ++i;
            st.push_back({c, 0, item, {}});
            return true;
        }
        if (c == '"') {
            j.out += '"';
            ++i;
            const Scan s = scan_string(t, i, j.out, nullptr);
            if (s != Scan::Done) return s == Scan::Bad ? bad() : false;
            j.out += '"';
            ended(item);
            return true;
        }
        if (c == '-' || digit(c)) {
            size_t k = i;
            while (k < n && (digit(t[k]) || t[k] == '-' || t[k] == '+' || t[k] == '.' || t[k] == 'e' || t[k] == 'E')) ++k;
            if (k == n && !final) return false;  // it may go on
            const std::string number = t.substr(i, k - i);
            if (!json_number(number)) return bad();
            try {
                j.out += nlohmann::ordered_json::parse(number).dump();
            } catch (const nlohmann::json::exception&) {
                return bad();
            }
            i = k;
            ended(item);
            return true;
        }
        const char* word = c == 't' ? "true" : c == 'f' ? "false" : c == 'n' ? "null" : nullptr;
        if (!word) return bad();
        const std::string_view w(word);
        for (size_t k = 0; k < w.size(); ++k) {
            if (i + k >= n) return false;
            if (t[i + k] != w[k]) return bad();
        }
        j.out += w;
        i += w.size();
        ended(item);
        return true;
    };
    while (!j.complete) {
        while (i < n && json_space(t[i])) ++i;
        if (i >= n) break;
        if (st.empty()) {
            if (!value()) break;
            continue;
        }
        Level& l = st.back();
        const char c = t[i];
        const char close = l.kind == '{' ? '}' : ']';
        if ((l.state == 0 || l.state == 4) && c == close) {
            j.out += c;
            ++i;
            const int item = l.item;
            st.pop_back();
            ended(item);
        } else if (l.state == 4) {
            if (c != ',') {
                bad();
                break;
            }
            j.out += ", ";
            ++i;
            l.state = l.kind == '{' ? 1 : 3;
        } else if (l.kind == '{' && (l.state == 0 || l.state == 1)) {
            if (c != '"') {
                bad();
                break;
            }
            j.out += '"';
            ++i;
            l.key.clear();
            const Scan s = scan_string(t, i, j.out, &l.key);
            if (s != Scan::Done) {
                if (s == Scan::Bad) bad();
                break;
            }
            j.out += '"';
            l.state = 2;
        } else if (l.state == 2) {
            if (c != ':') {
                bad();
                break;
            }
            j.out += ": ";
            ++i;
            l.state = 3;
        } else if (!value()) {  // an array's first value, or a value after ':' or ','
            break;
        }
    }
    for (JsonPrefix::Item& it : j.items)
        if (!it.complete) it.end = j.out.size();
    return j;
}

}  // namespace shardlm
