#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <unicode/uset.h>
#include <unicode/ustring.h>

#include <cstdio>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

struct MatchData {
    explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {
        if (!md) fail("out of memory creating regex match data");
    }
    ~MatchData() { pcre2_match_data_free(md); }
    MatchData(const MatchData&) = delete;
    MatchData& operator=(const MatchData&) = delete;
    pcre2_match_data* md;
};

// The Python-only inline flag group used by GPT-2, Llama 3 and Qwen2/3. JavaScript rejects it, and
// the reference spells it out this way; PCRE2 would also fold U+017F and U+212A, which the
// reference does not.
const char* kContractionsIn = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
const char* kContractionsOut = "(?:'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))";

// The Unicode version of PCRE2's property tables, e.g. "14.0.0".
std::string pcre2_unicode_version() {
    char buf[32] = {};
    if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, buf) < 0) return "";
    return buf;
}

// Characters with property `prop` (e.g. "L") in ICU's newer Unicode data that PCRE2's older
// tables lack, as a PCRE2 class body; "" when ICU is not newer. The reference tokenizer runs on a
// recent Unicode: this keeps letters and digits of recently encoded scripts letters and digits.
std::string newer_property_ranges(const std::string& prop) {
    std::string ver = pcre2_unicode_version();
    if (ver.empty()) return "";
    if (ver.size() > 2 && ver.compare(ver.size() - 2, 2, ".0") == 0) ver.resize(ver.size() - 2);  // "14.0.0" -> "14.0"
    const std::string pat = "[\\p{" + prop + "}-\\p{Age=" + ver + "}]";
    std::u16string upat(pat.size(), u'\0');
    for (size_t i = 0; i < pat.size(); ++i) upat[i] = char16_t(static_cast<unsigned char>(pat[i]));
    UErrorCode st = U_ZERO_ERROR;
    USet* set = uset_openPattern(reinterpret_cast<const UChar*>(upat.data()), int32_t(upat.size()), &st);
    if (U_FAILURE(st) || !set) return "";
    std::string out;
    char buf[48];
    for (int32_t i = 0; i < uset_getItemCount(set); ++i) {
        UChar32 lo = 0, hi = 0;
        UErrorCode e = U_ZERO_ERROR;
        if (uset_getItem(set, i, &lo, &hi, nullptr, 0, &e) != 0 || U_FAILURE(e)) continue;  // strings: none here
        std::snprintf(buf, sizeof(buf), lo == hi ? "\\x{%X}" : "\\x{%X}-\\x{%X}", unsigned(lo), unsigned(hi));
        out += buf;
    }
    uset_close(set);
    return out;
}

}  // namespace

std::string translate_pattern(const std::string& pattern) {
    std::string p;
    for (size_t pos = 0;;) {
        const size_t at = pattern.find(kContractionsIn, pos);
        p += pattern.substr(pos, at == std::string::npos ? std::string::npos : at - pos);
        if (at == std::string::npos) break;
        p += kContractionsOut;
        pos = at + std::char_traits<char>::length(kContractionsIn);
    }
    std::string out;
    bool in_class = false;
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            const char e = p[i + 1];
            if (e == 's') {
                out += in_class ? std::string(js_space_class_body()) : std::string("[") + js_space_class_body() + "]";
            } else if (e == 'S' && !in_class) {
                out += std::string("[^") + js_space_class_body() + "]";
            } else if (e == 'p' && i + 2 < p.size() && p[i + 2] == '{' && p.find('}', i + 3) != std::string::npos) {
                // \p{X}: PCRE2's class plus what newer Unicode (ICU) adds to it.
                const size_t close = p.find('}', i + 3);
                const std::string prop = p.substr(i + 3, close - i - 3);
                const std::string extra = newer_property_ranges(prop);
                const std::string self = "\\p{" + prop + "}";
                out += extra.empty() ? self : in_class ? self + extra : "[" + self + extra + "]";
                i = close;
                continue;
            } else {
                // \S inside a class keeps PCRE2's meaning (no published tokenizer uses it there).
                out += c;
                out += e;
            }
            ++i;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            out += c;
            // A ']' right after '[' or '[^' is a literal in PCRE2 and Python.
            if (i + 1 < p.size() && p[i + 1] == '^') { out += '^'; ++i; }
            if (i + 1 < p.size() && p[i + 1] == ']') { out += ']'; ++i; }
            continue;
        }
        if (in_class && c == ']') in_class = false;
        out += c;
    }
    return out;
}

struct Regex::Impl {
    pcre2_code* code = nullptr;
    bool jit = false;
    ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, const std::string& what) : source_(pattern), impl_(new Impl) {
    const std::string translated = translate_pattern(pattern);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                PCRE2_UTF, &err, &err_off, nullptr);
    if (!impl_->code) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(err, buf, sizeof(buf));
        fail(what, ": cannot compile regex \"", pattern, "\": ", reinterpret_cast<const char*>(buf),
             " at offset ", err_off);
    }
    impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;

void Regex::for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const {
    MatchData m(impl_->code);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t start = 0;
    while (start <= text.size()) {
        // The caller validated the UTF-8 once, so PCRE2 need not check it again on every call.
        const int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, m.md, nullptr)
                                  : pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, m.md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR buf[256];
            pcre2_get_error_message(rc, buf, sizeof(buf));
            fail("regex \"", source_, "\": matching failed: ", reinterpret_cast<const char*>(buf));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
        const size_t b = ov[0], e = ov[1];
        on_match(b, e);
        if (e > b) {
            start = e;
        } else {
            if (e >= text.size()) break;
            start = e + utf8_seq_len(static_cast<unsigned char>(text[e]));
        }
    }
}

std::string Regex::replace_all(std::string_view text, const std::string& with) const {
    std::string out;
    size_t prev = 0;
    for_each_match(text, [&](size_t b, size_t e) {
        out.append(text.substr(prev, b - prev));
        out += with;
        prev = e;
    });
    out.append(text.substr(prev));
    return out;
}

}  // namespace shardlm
