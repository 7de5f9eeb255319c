// tokenizer.json "decoder": ids -> text. Every supported decoder chain reduces to
//   1. a per-token rewrite to bytes (ByteLevel's byte alphabet, Metaspace/Replace of U+2581 by a
//      space, ByteFallback's <0xNN> tokens, per-token Strip),
//   2. lossy UTF-8 decoding of the concatenated bytes, and
//   3. at most one Strip of the whole text after a Fuse (SentencePiece's leading space),
// plus Metaspace's rule for the first token. That form makes exact streaming possible.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/regex.h"

namespace shardlm {

class Decoder {
public:
    // Reads the "decoder" value (null: tokens are joined as they are spelled). `tokens` is the
    // spelling of every id (empty for ids without a token). Unsupported types are an error.
    static Decoder from_json(const nlohmann::json& j, const std::vector<std::string>& tokens, const std::string& where);

    // Bytes of token `id` at position `first` (true for the first token of the decoded sequence).
    std::string piece(int32_t id, bool first) const;

    // Whole-text Strip after Fuse: up to strip_start() copies of strip_char() are removed from the
    // start of the text and up to strip_stop() from its end.
    char32_t strip_char() const { return strip_char_; }
    int strip_start() const { return strip_start_; }
    int strip_stop() const { return strip_stop_; }

private:
    enum class Kind { ByteLevel, Replace, ByteFallback, Metaspace, Strip };
    struct Step {
        Kind kind;
        std::string from, to;          // Replace (literal), Metaspace (from = replacement)
        std::shared_ptr<Regex> regex;  // Replace with a Regex pattern
        char32_t ch = ' ';             // Strip
        int start = 0, stop = 0;       // Strip
        bool prepend = true;           // Metaspace: prepend_scheme != never
    };
    void add(const nlohmann::json& j, const std::string& where, bool& fused);
    std::string apply(const std::string& token, bool first) const;

    std::vector<Step> steps_;
    std::vector<std::string> pieces_;  // apply(token, false) for every id
    std::vector<std::string> tokens_;
    bool first_differs_ = false;       // a Metaspace step treats the first token specially
    char32_t strip_char_ = ' ';
    int strip_start_ = 0, strip_stop_ = 0;
};

// transformers' clean_up_tokenization: drops the space before . ? ! , and English contractions.
std::string clean_up_tokenization(const std::string& text);

}  // namespace shardlm
