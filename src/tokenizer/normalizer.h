// tokenizer.json "normalizer": the steps a text section goes through before pre-tokenization.
// A Sequence is flattened into one list of steps; each step is one case of a switch.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/regex.h"

namespace shardlm {

class Normalizer {
public:
    // Reads the "normalizer" value (null gives the identity); `where` names the file for errors.
    // Unsupported types are an error naming the type.
    static Normalizer from_json(const nlohmann::json& j, const std::string& where);

    // `text` must be valid UTF-8; the result is valid UTF-8. `prepend` false skips the Prepend
    // steps (EncodeOptions::prefix_space at the start of a text).
    std::string normalize(std::string_view text, bool prepend = true) const;
    bool empty() const { return steps_.empty(); }

private:
    enum class Kind { NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Lowercase };
    struct Step {
        Kind kind;
        std::string a, b;              // Prepend: a; Replace: a (literal pattern) -> b
        std::shared_ptr<Regex> regex;  // Replace with a Regex pattern
        bool left = false, right = false;
    };
    void add(const nlohmann::json& j, const std::string& where);
    std::vector<Step> steps_;
};

// Unicode normalisation through ICU; `form` is one of "NFC", "NFD", "NFKC", "NFKD".
std::string unicode_normalize(std::string_view text, const char* form);

// Literal, non-overlapping, left-to-right replacement of every `from` by `to`.
std::string replace_literal(std::string_view text, std::string_view from, std::string_view to);

}  // namespace shardlm
