#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

using json = nlohmann::json;

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

char32_t single_char(const json& j, const char* key, const std::string& where, const char* type) {
    const std::string s = j.value(key, std::string(" "));
    size_t i = 0;
    if (s.empty() || utf8_invalid_offset(s) != std::string::npos) fail(where, ": ", type, " decoder: bad \"", key, "\"");
    const char32_t c = next_code_point(s, i);
    if (i != s.size()) fail(where, ": ", type, " decoder: \"", key, "\" must be one character");
    return c;
}

}  // namespace

Decoder Decoder::from_json(const json& j, const std::vector<std::string>& tokens, const std::string& where) {
    Decoder d;
    d.tokens_ = tokens;
    bool fused = false;
    if (!j.is_null()) d.add(j, where, fused);
    d.pieces_.reserve(tokens.size());
    for (const auto& t : tokens) d.pieces_.push_back(d.apply(t, false));
    return d;
}

void Decoder::add(const json& j, const std::string& where, bool& fused) {
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) fail(where, ": decoder without a \"type\"");
    const std::string type = j["type"];
    if (type == "Sequence") {
        if (!j.contains("decoders") || !j["decoders"].is_array()) fail(where, ": Sequence decoder needs a \"decoders\" array");
        for (const auto& x : j["decoders"]) add(x, where, fused);
        return;
    }
    if (type == "Fuse") {
        fused = true;
        return;
    }
    if (fused && type != "Strip")
        fail(where, ": decoder \"", type, "\" after Fuse is not supported (only Strip may follow Fuse)");
    Step s{};
    if (type == "ByteLevel") {
        s.kind = Kind::ByteLevel;
    } else if (type == "ByteFallback") {
        s.kind = Kind::ByteFallback;
    } else if (type == "Replace") {
        s.kind = Kind::Replace;
        if (!j.contains("content") || !j["content"].is_string()) fail(where, ": Replace decoder needs a string \"content\"");
        s.to = j["content"];
        const json& p = j.contains("pattern") ? j["pattern"] : json();
        if (p.contains("String") && p["String"].is_string()) s.from = p["String"];
        else if (p.contains("Regex") && p["Regex"].is_string())
            s.regex = std::make_shared<Regex>(p["Regex"].get<std::string>(), where + " Replace decoder");
        else fail(where, ": Replace decoder needs a pattern {\"String\"} or {\"Regex\"}");
    } else if (type == "Metaspace") {
        s.kind = Kind::Metaspace;
        s.from = j.value("replacement", std::string("\xE2\x96\x81"));
        if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) s.prepend = j["prepend_scheme"] != "never";
        else s.prepend = j.value("add_prefix_space", true);
        first_differs_ = first_differs_ || s.prepend;
    } else if (type == "Strip") {
        s.kind = Kind::Strip;
        s.ch = single_char(j, "content", where, "Strip");
        s.start = j.value("start", 0);
        s.stop = j.value("stop", 0);
        if (fused) {
            if (strip_start_ || strip_stop_) fail(where, ": more than one Strip decoder after Fuse is not supported");
            strip_char_ = s.ch;
            strip_start_ = s.start;
            strip_stop_ = s.stop;
            return;
        }
    } else {
        fail(where, ": unsupported decoder type \"", type,
             "\" (supported: Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip)");
    }
    steps_.push_back(std::move(s));
}

std::string Decoder::apply(const std::string& token, bool first) const {
    std::string t = token;
    for (const Step& s : steps_) {
        switch (s.kind) {
            case Kind::ByteLevel: {
                // Characters of the byte alphabet become their bytes; a token with any other
                // character (an added token such as "<|im_start|>" is in the alphabet) stays as is.
                std::string raw;
                bool ok = utf8_invalid_offset(t) == std::string::npos;
                for (size_t i = 0; i < t.size() && ok;) {
                    const int b = byte_from_unicode(next_code_point(t, i));
                    if (b < 0) ok = false;
                    else raw += char(b);
                }
                if (ok) t = std::move(raw);
                break;
            }
            case Kind::ByteFallback:
                if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex_digit(t[3]) >= 0 && hex_digit(t[4]) >= 0)
                    t = std::string(1, char(hex_digit(t[3]) * 16 + hex_digit(t[4])));
                break;
            case Kind::Replace:
                if (utf8_invalid_offset(t) != std::string::npos) break;  // a raw byte from ByteFallback
                t = s.regex ? s.regex->replace_all(t, s.to) : replace_literal(t, s.from, s.to);
                break;
            case Kind::Metaspace:
                // HF: every replacement character becomes a space, except that in the first token
                // (unless prepend_scheme is "never") they are dropped.
                t = replace_literal(t, s.from, first && s.prepend ? "" : " ");
                break;
            case Kind::Strip: {
                if (utf8_invalid_offset(t) != std::string::npos) break;
                std::vector<char32_t> cs;
                for (size_t i = 0; i < t.size();) cs.push_back(next_code_point(t, i));
                size_t b = 0, e = cs.size();
                for (int k = 0; k < s.start && b < e && cs[b] == s.ch; ++k) ++b;
                for (int k = 0; k < s.stop && e > b && cs[e - 1] == s.ch; ++k) --e;
                std::string out;
                for (size_t k = b; k < e; ++k) append_utf8(out, cs[k]);
                t = std::move(out);
                break;
            }
        }
    }
    return t;
}

std::string Decoder::piece(int32_t id, bool first) const {
    if (first && first_differs_) return apply(tokens_[size_t(id)], true);
    return pieces_[size_t(id)];
}

std::string clean_up_tokenization(const std::string& text) {
    // Sequential, as transformers and the JS port do it (each replacement sees the previous result).
    static const char* const kPairs[][2] = {{" .", "."},   {" ?", "?"},     {" !", "!"},     {" ,", ","},
                                            {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},   {" 's", "'s"},
                                            {" 've", "'ve"}, {" 're", "'re"}};
    if (text.find(' ') == std::string::npos) return text;
    std::string s = text;
    for (const auto& p : kPairs) s = replace_literal(s, p[0], p[1]);
    return s;
}

}  // namespace shardlm
