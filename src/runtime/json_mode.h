// JSON mode (OpenAI's response_format {"type": "json_object"}): generation constrained to one
// JSON object. A byte-level acceptor follows the text so far; before each choice, the tokens whose
// bytes would leave it no valid continuation get probability 0, and once the object is closed the
// end-of-sequence ids are all that is left (runtime/batcher.h applies it to whole logits rows).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardlm {

// Whether bytes read so far are the start of one JSON object (RFC 8259 with an object at the top:
// strings with escapes and UTF-8 checked by lead and continuation bytes, numbers, literals,
// nesting) and whether it is complete. Whitespace between the structure's parts comes at most 16
// bytes in a row with one line break among them (room for indentation, none for a model to stall
// on), and none before or after the object.
class JsonAcceptor {
public:
    // Takes one byte; false (and no change) when the text would not be a JSON object's start.
    bool push(uint8_t b);
    // Each byte in turn; false, with the bytes before the failing one taken, at the first refused.
    bool push(const std::string& bytes);
    bool complete() const { return mode_ == Mode::Done; }
    // What the masks of JsonVocab depend on when at most `depth` containers can be closed: the
    // mode, its counters, and the innermost `depth` open containers (all, when fewer).
    std::string key(size_t depth) const;

private:
    enum class Mode : uint8_t {
        Start,         // before the object: '{'
        ObjFirst,      // after '{': whitespace, a key or '}'
        ObjKey,        // after ',' in an object: whitespace or a key
        Colon,         // after a key: whitespace or ':'
        Value,         // after ':' or ',' in an array: whitespace or a value
        ArrFirst,      // after '[': whitespace, a value or ']'
        After,         // after a value in a container: whitespace, ',' or the closing bracket
        String,        // in a string (key_ tells a key from a value)
        Escape,        // after '\' in a string
        Hex,           // in \uXXXX: count_ digits to go
        Utf8,          // count_ continuation bytes to go
        Number,        // in a number: num_ says where
        Literal,       // in true, false or null: lit_ which, count_ letters read
        Done,          // the object is closed
    };
    enum Num : uint8_t { Minus, Zero, Int, Dot, Frac, Exp, ExpSign, ExpInt };
    bool value_start(uint8_t b);
    void value_end();  // a value ended: after it in its container, or Done at the top
    bool close();      // the innermost container closes (a value ends); true
    bool structural_byte(uint8_t b);
    static constexpr uint8_t kMaxSpace = 16;
    Mode mode_ = Mode::Start;
    uint8_t count_ = 0, lit_ = 0, space_ = 0;
    Num num_ = Minus;
    bool key_ = false;      // the string is a key
    bool newline_ = false;  // the whitespace since the last structural byte holds a line break
    std::string stack_;  // open containers, '{' or '[', innermost last
};

// A vocabulary's token bytes, and for an acceptor the tokens it takes (token_bytes all accepted,
// in order). Masks are kept by JsonAcceptor::key for the deepest closing any token does, so a
// state met again costs a lookup (up to kMaxMasks states, then they start again); the first
// time, one walk over the tokens in byte order, each prefix they share pushed once.
class JsonVocab {
public:
    // bytes[id]: what token id adds to the text (empty: never taken, as special tokens).
    explicit JsonVocab(std::vector<std::string> bytes);
    int64_t size() const { return int64_t(bytes_.size()); }
    const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
    // allowed[id] != 0: token id keeps `s` a JSON object's start (or completes it).
    const std::vector<uint8_t>& allowed(const JsonAcceptor& s);

private:
    static constexpr size_t kMaxMasks = 256;
    std::vector<std::string> bytes_;
    std::vector<int32_t> order_;  // the ids with bytes, by their bytes
    std::vector<uint32_t> lcp_;   // bytes order_[i] shares with order_[i - 1] at its start
    size_t max_close_ = 0;        // the most closing brackets one token holds
    std::map<std::string, std::vector<uint8_t>> masks_;
};

}  // namespace shardlm
