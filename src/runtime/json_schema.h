// JSON Schema for structured output (OpenAI's response_format json_schema): a schema compiled
// into a small graph of nodes that JsonAcceptor (runtime/json_mode.h) walks byte by byte.
//
// Generation is held to a subset of what a schema allows, so that every finished text is valid
// against the schema:
// - an array's items follow prefixItems (a tuple's), then items;
// - an object with `properties` gets its keys in the schema's order, each optional one skippable
//   and each required one present; no other keys (additionalProperties is honoured only for an
//   object without properties, whose keys are then free strings);
// - numbers and integers are JSON's own (an integer has no fraction and no exponent);
// - enum and const values are written as their compact JSON texts;
// - a string's pattern, its format, or both (runtime/json_pattern.h), are matched by its characters,
//   which are then written as they are (no \u escapes), within minLength/maxLength if given;
// - a number's or an integer's minimum, maximum and multipleOf hold its text (no exponent) to a
//   DFA of the values allowed.
// Keywords that constrain values beyond this (uniqueItems, not, ...) are refused
// with an error naming the keyword and where it is, never ignored.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/json_pattern.h"

namespace shardlm {

struct JsonSchema {
    // Text: not JSON but raw text matching a pattern whole (vLLM's guided_regex, or a grammar's
    // terminals); Seq: a grammar's parts one after another (runtime/grammar.h).
    enum class Kind : uint8_t { Object, Array, String, Number, Integer, Const, AnyOf, Text, Seq };
    struct Node {
        Kind kind = Kind::AnyOf;
        // Object: the property names as JSON strings (quotes and escapes included) in the schema's
        // order, each one's value node and whether it is required; or, without properties, the
        // node of any key's value (extra; -1: no keys at all).
        // Array: `values` are the first items' nodes (prefixItems, a tuple), `items` the rest's.
        std::vector<std::string> keys;
        std::vector<int32_t> values;
        std::vector<uint8_t> required;
        int32_t extra = -1;
        int32_t items = -1;                     // Array: every item's node
        int64_t min_count = 0, max_count = -1;  // Array: items; String: characters (-1: no limit)
        std::vector<std::string> texts;         // Const: the JSON texts allowed, sorted, distinct
        std::vector<int32_t> alts;              // AnyOf: the alternatives; Seq: the parts in order
        int32_t pattern = -1;                   // String, Integer, Text: its DFA in `patterns` (-1: none)
        // The bytes a value of the node may begin with, and whether it may be empty (a grammar's
        // parts; a JSON value never is): filled by settle().
        std::bitset<256> first;
        bool nullable = false;
        // String with a pattern and length limits: pattern_ends() of its DFA up to `span`
        // characters, which decides whether a state can still end within the limits (span 0:
        // no limits). Lengths past span add nothing: min_count + the DFA's states reach them all.
        std::vector<int32_t> ends;
        int32_t span = 0;
    };
    std::vector<Node> nodes;
    std::vector<PatternDfa> patterns;
    int32_t root = 0;
    int32_t key = 0;  // a String node without limits: the free keys of objects
    // Whitespace between the value's parts: at most this many bytes in a row, one line break
    // among them (room for indentation, none for a model to stall on); 0: compact JSON.
    int max_space = kDefaultSpace;
    static constexpr int kDefaultSpace = 16, kMaxSpace = 64;
    // A grammar's: its parts nest without bound and a token may end any number of them, so the
    // masks of runtime/json_mode.h are kept by the whole state (a JSON value's by its innermost
    // containers).
    bool grammar = false;
};

// Fills every node's `first` and `nullable` (to a fixed point: a grammar's rules and a schema's
// $refs refer back to one another). Every compiler below calls it before it returns.
void settle(JsonSchema& s);

// How deeply JSON text nests arrays and objects (brackets inside strings not counted; the text
// need not be valid). Checked before parsing text from outside: nlohmann's dump() and the schema
// compiler recurse per level, and thousands of levels would overflow the stack.
int64_t json_text_depth(const std::string& text);
// The deepest nesting a request body or a schema text may have: past the schema compiler's own
// limit of 128 schema objects inside one another (each 1-3 levels of text), far short of what
// would exhaust a stack.
constexpr int64_t kMaxJsonDepth = 512;

// JSON mode (response_format json_object): one object, anything in it.
JsonSchema json_object_schema();
// vLLM's guided_choice: the text is exactly one of `choices` (raw text, not JSON). Throws Error
// naming `what` for no choices, an empty one, or one that begins another (where the shorter one
// ends could not be told).
JsonSchema choice_schema(std::vector<std::string> choices, const std::string& what);
// vLLM's guided_regex: the whole text (raw, not JSON) matches `pattern` (runtime/json_pattern.h);
// it may end in any accepting state and must where nothing can follow. Throws Error naming
// `what` for a pattern compile_pattern refuses or one that matches only the empty text.
JsonSchema regex_schema(const std::string& pattern, const std::string& what);
// Compiles a schema given as JSON text (Draft 2020-12 keywords; $ref to "#" and within the
// document, e.g. "#/$defs/Name"). Throws Error naming `what` (e.g. "--json-schema FILE"), the
// keyword and its place in the schema, for what it cannot hold generation to.
JsonSchema compile_json_schema(const std::string& text, const std::string& what);

}  // namespace shardlm
