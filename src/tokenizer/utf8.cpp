#include "tokenizer/utf8.h"

namespace shardlm {

size_t utf8_invalid_offset(std::string_view s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        const unsigned c = p[i];
        if (c < 0x80) { ++i; continue; }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return i;
        if (i + len > n) return i;
        if (p[i + 1] < lo || p[i + 1] > hi) return i;
        for (size_t k = 2; k < len; ++k)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
        i += len;
    }
    return std::string_view::npos;
}

void append_utf8(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

char32_t next_code_point(std::string_view s, size_t& i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = utf8_seq_len(c);
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    i += len;
    return cp;
}

bool is_js_space(char32_t c) {
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
    return c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

const char* js_space_class_body() {
    return "\\t\\n\\x0B\\f\\r\\x20\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
           "\\x{3000}\\x{FEFF}";
}

void Utf8Decoder::push(std::string_view bytes, std::string& out) {
    static const char kReplacement[] = "\xEF\xBF\xBD";
    for (size_t i = 0; i < bytes.size();) {
        const unsigned b = static_cast<unsigned char>(bytes[i]);
        if (needed_ == 0) {
            ++i;
            if (b < 0x80) out += char(b);
            else if (b >= 0xC2 && b <= 0xDF) { needed_ = 1; cp_ = b & 0x1F; }
            else if (b >= 0xE0 && b <= 0xEF) {
                if (b == 0xE0) lower_ = 0xA0;
                if (b == 0xED) upper_ = 0x9F;
                needed_ = 2;
                cp_ = b & 0x0F;
            } else if (b >= 0xF0 && b <= 0xF4) {
                if (b == 0xF0) lower_ = 0x90;
                if (b == 0xF4) upper_ = 0x8F;
                needed_ = 3;
                cp_ = b & 0x07;
            } else {
                out += kReplacement;
            }
            continue;
        }
        if (b < lower_ || b > upper_) {
            // The sequence so far is a maximal invalid subpart: one U+FFFD, then look at b afresh.
            reset();
            out += kReplacement;
            continue;
        }
        ++i;
        lower_ = 0x80;
        upper_ = 0xBF;
        cp_ = (cp_ << 6) | (b & 0x3F);
        if (++seen_ == needed_) {
            append_utf8(out, cp_);
            reset();
        }
    }
}

void Utf8Decoder::finish(std::string& out) {
    if (needed_ != 0) out += "\xEF\xBF\xBD";
    reset();
}

std::string utf8_lossy(std::string_view bytes) {
    if (utf8_invalid_offset(bytes) == std::string_view::npos) return std::string(bytes);
    std::string out;
    Utf8Decoder d;
    d.push(bytes, out);
    d.finish(out);
    return out;
}

}  // namespace shardlm
