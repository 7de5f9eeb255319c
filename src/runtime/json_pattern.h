// JSON Schema's "pattern" (an ECMA-262 regular expression, matched anywhere in the string unless
// anchored with ^ and $) and "format" (date, time, date-time, uuid, ipv4, email, hostname, spelled
// as such patterns), compiled into a DFA over code points. The JSON acceptor (runtime/json_mode.h)
// steps it per character of a string's value, so a structured reply's strings match.
//
// The DFA keeps only states from which a match can still be completed ("live"), so a character
// is taken only when the string can still end well.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardlm {

struct PatternDfa {
    struct Edge {
        uint32_t lo = 0, hi = 0;  // code points [lo, hi]
        int32_t to = -1;
    };
    std::vector<std::vector<Edge>> edges;  // per state: sorted, disjoint, each into a live state
    std::vector<uint8_t> accept;           // per state: the string may end here
    int32_t start = 0;
    // The state after code point `cp`, -1 when no match could follow.
    int32_t next(int32_t s, uint32_t cp) const;
    // Whether some code point in [lo, hi] leads on (a UTF-8 lead byte's characters).
    bool any(int32_t s, uint32_t lo, uint32_t hi) const;
};

constexpr size_t kMaxPatternStates = 4096;

// Compiles `pattern`. Syntax: literals and escapes (\t \n \r \f \v \0 \xHH \uHHHH, escaped
// punctuation), ., classes [...] and [^...] with ranges and \d \D \w \W \s \S, groups (...),
// (?:...) and (?<name>...), alternation |, quantifiers * + ? {n} {n,} {n,m} (lazy ones match the
// same strings), ^ at the start and $ at the end. Throws Error naming `where` for anything else
// (lookaround, backreferences, \b word boundaries, anchors elsewhere, \p classes), for a pattern
// no string matches, and for one whose DFA would have more than kMaxPatternStates states.
// whole: the match is the whole string, as if the pattern began with ^ and ended with $.
PatternDfa compile_pattern(const std::string& pattern, const std::string& where, bool whole = false);

// The strings that both a and b match (a DFA of the same kind). Throws Error naming `where` when
// there is none, or when it would have more than kMaxPatternStates states.
PatternDfa intersect(const PatternDfa& a, const PatternDfa& b, const std::string& where);

// The JSON texts without exponent of the multiples of p / 10^q (q <= 9): where `fraction`, with
// up to q fraction digits, else integers only; not "-0" (zero with a minus and a fraction, as
// "-0.0", may be). Throws Error naming `where` for a DFA past
// kMaxPatternStates states (p * (q + 2) + 4 of them).
PatternDfa multiple_of_dfa(uint64_t p, int q, bool fraction, const std::string& where);

// For a string of the pattern under length limits: ends[s * (span + 1) + k] is the fewest
// characters k' >= k after which an accepting state can be reached from state s (exactly k'
// on), span + 1 for none up to span; so "some length in [lo, hi]" is one lookup.
std::vector<int32_t> pattern_ends(const PatternDfa& d, int32_t span);

// The anchored pattern shardlm generates for a "format" (date, time, date-time, duration, uuid,
// Pydantic's uuid1/uuid3/uuid4/uuid5 and ipvanyaddress, ipv4, ipv6, hostname, email, uri; a subset of the format's strings where it is not regular or
// not simple: no leap seconds, email addresses of dot-separated atoms, URIs of the form
// scheme://host[:port]/path?query#fragment, IPv6 without a zone), or "" for a format it does not
// know.
std::string format_pattern(const std::string& format);

// The anchored pattern of the JSON texts of the integers in [lo, hi] (no leading zeros, no "-0"),
// either bound left out; lo <= hi.
std::string integer_range_pattern(std::optional<int64_t> lo, std::optional<int64_t> hi);

// A bound of a number's range: its decimal text ("-12.5", "0.001": an optional '-', digits, an
// optional fraction; no exponent) and whether the bound itself is left out.
struct DecimalBound {
    std::string text;
    bool exclusive = false;
};

// The anchored pattern of the JSON texts without an exponent (-?(0|[1-9]\d*)(\.\d+)?) of the
// numbers in the range, either bound left out (zero only as 0, 0.0, ..., not -0); "" when no
// number lies in it. Throws Error for a
// bound that is no such decimal text or past 10^18 in size.
std::string number_range_pattern(const std::optional<DecimalBound>& lo, const std::optional<DecimalBound>& hi);

}  // namespace shardlm
