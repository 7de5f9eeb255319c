// UTF-8 helpers for the tokenizer: validation, code-point iteration, and a lossy decoder that can
// be fed byte by byte. Lossy decoding follows the WHATWG/Unicode "maximal subpart" rule (one U+FFFD
// per maximal invalid subsequence), which is what Rust's String::from_utf8_lossy and JavaScript's
// TextDecoder both do, so decoded text matches the Hugging Face references byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace shardlm {

// Offset of the first byte that is not part of valid UTF-8, or npos when `s` is valid.
size_t utf8_invalid_offset(std::string_view s);

// Appends the UTF-8 encoding of `cp` (assumed a valid scalar value).
void append_utf8(std::string& out, char32_t cp);

// Decodes the code point at s[i] and advances i; `s` must be valid UTF-8.
char32_t next_code_point(std::string_view s, size_t& i);

// Length in bytes of the UTF-8 sequence that starts with `lead` (1 for continuation/invalid bytes).
inline size_t utf8_seq_len(unsigned char lead) {
    return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// White space as JavaScript's \s and String.prototype.trim define it (the reference tokenizer's
// regexes and trims use this set; note U+FEFF is in it and U+0085 is not).
bool is_js_space(char32_t cp);

// The same set as a PCRE2 character-class body (without the brackets).
const char* js_space_class_body();

// Lossy UTF-8 decoding that can be fed in pieces: push() appends every character that is complete,
// holding back a sequence that may still be completed by later bytes; finish() flushes it (as one
// U+FFFD when incomplete). Feeding a byte string in any split gives the same text as feeding it whole.
class Utf8Decoder {
public:
    void push(std::string_view bytes, std::string& out);
    void finish(std::string& out);
    bool pending() const { return needed_ != 0; }

private:
    void reset() { cp_ = 0; needed_ = seen_ = 0; lower_ = 0x80; upper_ = 0xBF; }
    char32_t cp_ = 0;
    int needed_ = 0, seen_ = 0;
    unsigned lower_ = 0x80, upper_ = 0xBF;
};

// Whole-string lossy decoding (valid input is returned unchanged).
std::string utf8_lossy(std::string_view bytes);

}  // namespace shardlm
