// GBNF grammars (llama.cpp's grammar format, which vLLM's guided_grammar also takes): generation
// held to the text of a grammar's `root` rule. A grammar compiles into the nodes that
// runtime/json_mode.h walks byte by byte: each run of terminals (literals, character classes and
// groups or repetitions of them) one DFA (runtime/json_pattern.h), and rule references with the
// groups and repetitions around them sequences and choices (JsonSchema::Kind::Seq, AnyOf).
#pragma once

#include <string>

#include "runtime/json_schema.h"

namespace shardlm {

// Syntax: rules `name ::= alternatives` (names of letters, digits, '-' and '_'; a rule ends at a
// line break outside parentheses, except right after `::=` or `|`), alternatives separated by
// `|`, each a sequence of "literals" (escapes \n \r \t \\ \" \[ \] \- \^ \xHH \uHHHH
// \UHHHHHHHH), classes [a-z0-9_] and [^...], `.` (any character), rule names and groups
// ( ... ), each followed by at most one of * + ? {m} {m,} {m,n} {,n}; comments from # to the
// line's end. The text is generated from `root`: a sequence may end (its end-of-sequence token)
// wherever root is complete, and ends where nothing can follow.
//
// Throws Error naming `what` (and the line where there is one) for a syntax error, a rule used
// but not defined or defined twice, no root, left recursion (a rule that can begin with itself,
// which a byte-by-byte reading would follow for ever), a rule that can never end, a repetition of
// what may be empty around a rule, a root that matches only the empty text, and a grammar past
// kMaxGrammarNodes nodes.
JsonSchema compile_grammar(const std::string& text, const std::string& what);

constexpr size_t kMaxGrammarNodes = 20000;

}  // namespace shardlm
