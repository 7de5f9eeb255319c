#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/ustring.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

using json = nlohmann::json;

bool is_ascii(std::string_view s) {
    for (char c : s)
        if (static_cast<unsigned char>(c) >= 0x80) return false;
    return true;
}

std::u16string to_utf16(std::string_view s) {
    std::u16string w(s.size() + 1, u'\0');
    int32_t len = 0;
    UErrorCode st = U_ZERO_ERROR;
    u_strFromUTF8(reinterpret_cast<UChar*>(w.data()), int32_t(w.size()), &len, s.data(), int32_t(s.size()), &st);
    if (U_FAILURE(st)) fail("text is not valid UTF-8 (", u_errorName(st), ")");
    w.resize(size_t(len));
    return w;
}

std::string to_utf8(const std::u16string& w) {
    std::string s(w.size() * 3 + 1, '\0');
    int32_t len = 0;
    UErrorCode st = U_ZERO_ERROR;
    u_strToUTF8(s.data(), int32_t(s.size()), &len, reinterpret_cast<const UChar*>(w.data()), int32_t(w.size()), &st);
    if (U_FAILURE(st)) fail("cannot convert normalized text to UTF-8 (", u_errorName(st), ")");
    s.resize(size_t(len));
    return s;
}

const icu::Normalizer2* icu_normalizer(const char* form) {
    UErrorCode st = U_ZERO_ERROR;
    const std::string f = form;
    const icu::Normalizer2* n = f == "NFC" ? icu::Normalizer2::getNFCInstance(st)
                                : f == "NFD" ? icu::Normalizer2::getNFDInstance(st)
                                : f == "NFKC" ? icu::Normalizer2::getNFKCInstance(st)
                                              : icu::Normalizer2::getNFKDInstance(st);
    if (U_FAILURE(st) || !n) fail("ICU has no ", form, " normalizer (", u_errorName(st), ")");
    return n;
}

std::string lowercase(std::string_view text) {
    if (is_ascii(text)) {
        std::string s(text);
        for (char& c : s)
            if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
        return s;
    }
    const std::u16string w = to_utf16(text);
    std::u16string out(w.size() * 3 + 1, u'\0');
    UErrorCode st = U_ZERO_ERROR;
    const int32_t len = u_strToLower(reinterpret_cast<UChar*>(out.data()), int32_t(out.size()),
                                     reinterpret_cast<const UChar*>(w.data()), int32_t(w.size()), "", &st);
    if (U_FAILURE(st)) fail("lowercasing failed (", u_errorName(st), ")");
    out.resize(size_t(len));
    return to_utf8(out);
}

std::string strip(std::string_view s, bool left, bool right) {
    size_t b = 0, e = s.size();
    if (left) {
        while (b < e) {
            size_t i = b;
            if (!is_js_space(next_code_point(s, i))) break;
            b = i;
        }
    }
    if (right) {
        while (e > b) {
            size_t k = e - 1;
            while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
            size_t i = k;
            if (!is_js_space(next_code_point(s, i))) break;
            e = k;
        }
    }
    return std::string(s.substr(b, e - b));
}

}  // namespace

std::string unicode_normalize(std::string_view text, const char* form) {
    // Pure ASCII is invariant under all four forms; most text takes this path. Otherwise ICU works
    // on the UTF-8 directly, and text that is already normalized is returned as it is.
    if (is_ascii(text)) return std::string(text);
    const icu::Normalizer2* n = icu_normalizer(form);
    const icu::StringPiece sp(text.data(), int32_t(text.size()));
    UErrorCode st = U_ZERO_ERROR;
    if (n->isNormalizedUTF8(sp, st) && U_SUCCESS(st)) return std::string(text);
    st = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, int32_t(text.size()));
    n->normalizeUTF8(0, sp, sink, nullptr, st);
    if (U_FAILURE(st)) fail(form, " normalization failed (", u_errorName(st), ")");
    return out;
}

std::string replace_literal(std::string_view text, std::string_view from, std::string_view to) {
    if (from.empty()) return std::string(text);
    std::string out;
    out.reserve(text.size());
    size_t prev = 0;
    for (size_t at = text.find(from); at != std::string_view::npos; at = text.find(from, prev)) {
        out.append(text.substr(prev, at - prev));
        out.append(to);
        prev = at + from.size();
    }
    out.append(text.substr(prev));
    return out;
}

Normalizer Normalizer::from_json(const json& j, const std::string& where) {
    Normalizer n;
    if (!j.is_null()) n.add(j, where);
    return n;
}

void Normalizer::add(const json& j, const std::string& where) {
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
        fail(where, ": normalizer without a \"type\"");
    const std::string type = j["type"];
    const auto str = [&](const char* key) {
        if (!j.contains(key) || !j[key].is_string()) fail(where, ": ", type, " normalizer needs a string \"", key, "\"");
        return j[key].get<std::string>();
    };
    if (type == "Sequence") {
        if (!j.contains("normalizers") || !j["normalizers"].is_array())
            fail(where, ": Sequence normalizer needs a \"normalizers\" array");
        for (const auto& s : j["normalizers"]) add(s, where);
    } else if (type == "NFC") {
        steps_.push_back({Kind::NFC, {}, {}, nullptr});
    } else if (type == "NFD") {
        steps_.push_back({Kind::NFD, {}, {}, nullptr});
    } else if (type == "NFKC") {
        steps_.push_back({Kind::NFKC, {}, {}, nullptr});
    } else if (type == "NFKD") {
        steps_.push_back({Kind::NFKD, {}, {}, nullptr});
    } else if (type == "Prepend") {
        steps_.push_back({Kind::Prepend, str("prepend"), {}, nullptr});
    } else if (type == "Lowercase") {
        steps_.push_back({Kind::Lowercase, {}, {}, nullptr});
    } else if (type == "Strip") {
        Step s{Kind::Strip, {}, {}, nullptr};
        s.left = j.value("strip_left", true);
        s.right = j.value("strip_right", true);
        steps_.push_back(s);
    } else if (type == "Replace") {
        Step s{Kind::Replace, {}, str("content"), nullptr};
        const json& p = j.contains("pattern") ? j["pattern"] : json();
        if (p.contains("String") && p["String"].is_string()) s.a = p["String"];
        else if (p.contains("Regex") && p["Regex"].is_string())
            s.regex = std::make_shared<Regex>(p["Regex"].get<std::string>(), where + " Replace normalizer");
        else fail(where, ": Replace normalizer needs a pattern {\"String\"} or {\"Regex\"}");
        steps_.push_back(std::move(s));
    } else {
        fail(where, ": unsupported normalizer type \"", type,
             "\" (supported: Sequence, NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Lowercase)");
    }
}

std::string Normalizer::normalize(std::string_view text, bool prepend) const {
    std::string s(text);
    for (const Step& st : steps_) {
        switch (st.kind) {
            case Kind::NFC: s = unicode_normalize(s, "NFC"); break;
            case Kind::NFD: s = unicode_normalize(s, "NFD"); break;
            case Kind::NFKC: s = unicode_normalize(s, "NFKC"); break;
            case Kind::NFKD: s = unicode_normalize(s, "NFKD"); break;
            case Kind::Prepend:
                // HF and the reference leave an empty section empty.
                if (prepend && !s.empty()) s = st.a + s;
                break;
            case Kind::Replace: s = st.regex ? st.regex->replace_all(s, st.b) : replace_literal(s, st.a, st.b); break;
            case Kind::Strip: s = strip(s, st.left, st.right); break;
            case Kind::Lowercase: s = lowercase(s); break;
        }
    }
    return s;
}

}  // namespace shardlm
