// A compiled PCRE2 pattern (UTF mode, JIT when available) for the split and replace patterns of
// tokenizer.json. Patterns are written for the Rust/Python regex dialects; translate_pattern()
// rewrites the few constructs whose meaning differs so matches equal the reference tokenizer's.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace shardlm {

// Rewrites `pattern` for PCRE2: \s and \S become the JavaScript white-space set (PCRE2's own
// differs at U+0085, U+180E and U+FEFF), and the case-insensitive contraction group of the GPT-2
// family is spelled out with ASCII letters only (so that "'ſ" is not a contraction).
std::string translate_pattern(const std::string& pattern);

class Regex {
public:
    // `what` names the pattern's origin for error messages (e.g. "tokenizer.json pre_tokenizer").
    Regex(const std::string& pattern, const std::string& what);
    ~Regex();
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // Calls on_match(begin, end) for every match in `text` (valid UTF-8), left to right; an empty
    // match advances by one character as JavaScript's matchAll does.
    void for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const;

    // Replaces every match with `with` (literally).
    std::string replace_all(std::string_view text, const std::string& with) const;

    const std::string& source() const { return source_; }

private:
    std::string source_;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace shardlm
