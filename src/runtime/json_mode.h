// JSON mode and structured output (OpenAI's response_format json_object and json_schema):
// generation constrained to one JSON value of a schema (runtime/json_schema.h; JSON mode's is any
// object). A byte-level acceptor follows the text so far; before each choice, the tokens whose
// bytes would leave it no valid continuation get probability 0, and once the value is complete
// the request ends (runtime/batcher.h applies it to whole logits rows).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/json_schema.h"

namespace shardlm {

// Whether bytes read so far are the start of one JSON value of a schema (runtime/json_schema.h;
// RFC 8259: strings with escapes and UTF-8 checked by lead and continuation bytes, numbers,
// literals, nesting) and whether it is complete. Whitespace between the structure's parts comes
// at most JsonSchema::max_space bytes in a row with one line break among them, and none before or
// after the value.
//
// Where the schema leaves several readings open (anyOf, enum values that share a start, optional
// keys), each is a thread of its own stack of frames; a byte keeps the threads that take it. A
// byte that would leave more than kMaxReadings readings at once is refused.
class JsonAcceptor {
public:
    // JSON mode: one object, anything in it.
    JsonAcceptor();
    explicit JsonAcceptor(std::shared_ptr<const JsonSchema> schema);
    // Copies take the state, not the scratch; an assignment reuses the buffers it has (the
    // vocabulary walk of JsonVocab copies a state per byte).
    JsonAcceptor(const JsonAcceptor& o) : schema_(o.schema_), threads_(o.threads_) {}
    JsonAcceptor& operator=(const JsonAcceptor& o) {
        if (schema_ != o.schema_) schema_ = o.schema_;
        threads_ = o.threads_;
        return *this;
    }
    JsonAcceptor(JsonAcceptor&&) = default;
    JsonAcceptor& operator=(JsonAcceptor&&) = default;
    // Takes one byte; false (and no change) when the text would not be a valid value's start.
    bool push(uint8_t b);
    // Each byte in turn; false, with the bytes before the failing one taken, at the first refused.
    bool push(const std::string& bytes);
    bool complete() const;
    // Whether the text may end here (complete, or a guided_regex text in an accepting state that
    // could also go on: the sequence may then draw an end-of-sequence token).
    bool may_end() const;
    const std::shared_ptr<const JsonSchema>& schema() const { return schema_; }
    static constexpr size_t kMaxReadings = 64;
    // What the masks of JsonVocab depend on when a token closes at most `depth` containers and
    // holds at most `reach` bytes: each thread's whitespace and its innermost frames (a leaf,
    // `depth` containers and the one below), their counts as distances to the limits.
    std::string key(size_t depth, size_t reach) const;

private:
    enum Phase : uint8_t {
        Begin, Child, Done,                     // the frame below the top value
        ObjFirst, ObjNext, KeyLit, KeyChild,    // object: after '{', after ',', in a fixed key, in a free key
        Colon, ObjValue, ObjChild, After,       // object (After also array): ':', the value, in it, after it
        ArrFirst, ArrNext, ArrChild,            // array: after '[', after ',', in an item
        Chars, Escape, Hex, LowSlash, LowU, Utf8,  // string (LowSlash/LowU: a low surrogate's "\u" must follow)
        Num,                                    // number or integer: aux says where
        Lit,                                    // enum or const: texts [a, b) share the first c bytes
        Raw,                                    // guided_regex's text, a grammar's terminals: a = its DFA state
        SeqNext, SeqChild,                      // a grammar's sequence: a = its next part; before it, in the one before
    };
    // One open part of the value. Object: a = the first key still allowed, b = the key being read
    // or whose value is; array: a = items begun; string: a = characters (with a pattern: its DFA
    // state), b = 1 while a low surrogate's escape is due or a character's continuation bytes in
    // all while it forms, c = a \u escape's value or that character's bits so far, aux = hex digits
    // or UTF-8 continuation bytes to go (a and items counted only as far as the limits need).
    struct Frame {
        int32_t node = -1;
        Phase phase = Begin;
        uint8_t aux = 0;
        int32_t a = 0, b = 0, c = 0;
        int32_t d = 0;  // a patterned string with length limits: its characters (to the limits)
        bool operator<(const Frame& o) const;
        bool operator==(const Frame& o) const;
    };
    struct Thread {
        std::vector<Frame> stack;
        uint8_t space = 0;     // whitespace bytes since the last structural one
        bool newline = false;  // ... with a line break among them
        bool operator<(const Thread& o) const;
        bool operator==(const Thread& o) const;
    };
    const JsonSchema::Node& node(const Frame& f) const { return schema_->nodes[size_t(f.node)]; }
    // Thread t takes byte b in place: whether t goes on; readings it splits into besides are
    // appended to `out`.
    bool step(Thread& t, uint8_t b, std::vector<Thread>& out) const;
    bool structural(Thread& t, uint8_t b, std::vector<Thread>& out) const;
    bool start(Thread& t, int32_t id, uint8_t b, std::vector<Thread>& out) const;  // a value of node id begins with b
    bool literal(Thread& t, uint8_t b, std::vector<Thread>& out) const;
    bool number(Thread& t, uint8_t b, std::vector<Thread>& out) const;
    bool string(Thread& t, uint8_t b, std::vector<Thread>& out) const;
    // out: where a grammar's text may also end before b (null: it may not, as at its start).
    bool raw(Thread& t, uint8_t b, std::vector<Thread>* out) const;
    // A sequence's parts from f.a on: b begins one (those before it left empty); `begun`: all
    // may be left out, b following the sequence (not where the sequence itself begins with b).
    bool seq(Thread& t, uint8_t b, std::vector<Thread>& out, bool begun) const;
    // Part i of the sequence on top begins with b (the last one takes the sequence's frame).
    bool part(Thread& t, int32_t i, uint8_t b, std::vector<Thread>& out) const;
    // The most frames a reading holds (a grammar's nesting, as deep as the text makes it).
    static constexpr size_t kMaxFrames = 1024;
    // Which characters a patterned text takes next (null: any): those on a DFA edge (state f.a)
    // into a state that, under a string's length limits, can still end within them.
    struct Gate {
        const PatternDfa* dfa = nullptr;
        const JsonSchema::Node* limits = nullptr;  // a string node with span > 0, or null
        int64_t count = 0;                         // characters before the next one
        bool fits(int32_t to) const;
        bool any(int32_t s, uint32_t lo, uint32_t hi) const;  // some character in [lo, hi] goes on
        int32_t next(int32_t s, uint32_t cp) const;            // -1 where it does not
    };
    // A UTF-8 character's lead byte: f.b = its continuation bytes, f.c = its bits so far, f.aux =
    // the continuations to go; false for a byte no character starts with or (with a gate) one that
    // begins no character the gate takes.
    static bool utf8_lead(Frame& f, uint8_t b, const Gate* g);
    // A continuation byte; at the character's last, the DFA steps and f.b, f.c are reset.
    static bool utf8_next(Frame& f, uint8_t b, const Gate* g);
    bool opens(int32_t id, uint8_t b) const { return schema_->nodes[size_t(id)].first[b]; }
    // push() without keeping the state when b is refused (then it is spoilt): JsonVocab's walk,
    // which drops such a state.
    bool advance(uint8_t b);
    friend class JsonVocab;
    static void value_end(Thread& t);  // the top frame's value ended: pop it, its parent goes on
    std::shared_ptr<const JsonSchema> schema_;
    std::vector<Thread> threads_;
    std::vector<Thread> next_, saved_;  // push()'s scratch, not copied with the state
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
    // allowed[id] != 0: token id keeps `s` a valid value's start (or completes it).
    const std::vector<uint8_t>& allowed(const JsonAcceptor& s);

private:
    static constexpr size_t kMaxMasks = 256;
    std::vector<std::string> bytes_;
    std::vector<int32_t> order_;  // the ids with bytes, by their bytes
    std::vector<uint32_t> lcp_;   // bytes order_[i] shares with order_[i - 1] at its start
    std::string sorted_;          // the bytes of order_'s tokens one after another (a walk reads them in turn)
    std::vector<uint32_t> off_;   // order_[i]'s bytes: sorted_[off_[i], off_[i + 1])
    size_t max_close_ = 0;        // the most closing brackets one token holds
    size_t reach_ = 0;            // the most bytes one token holds
    // By schema and JsonAcceptor::key; held_ keeps the schemas alive (their addresses unique)
    // while masks of theirs are kept.
    std::map<std::pair<const JsonSchema*, std::string>, std::vector<uint8_t>> masks_;
    std::vector<std::shared_ptr<const JsonSchema>> held_;
};

}  // namespace shardlm
