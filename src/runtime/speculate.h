// Draft tokens for speculative decoding by prompt lookup (vLLM's "ngram" speculator, llama.cpp's
// lookup decoding): no draft model, the sequence's own text is the guess. The tokens that
// followed the latest earlier occurrence of the sequence's last n tokens are proposed, for the
// longest n in [kLookupMinNgram, kLookupMaxNgram] that occurred before. Text that repeats its
// context (code edits, extraction, answers quoting the prompt, loops) is predicted; elsewhere
// nothing is proposed and the step is a plain decode step. Where the match is p tokens back the
// proposal runs on past the end as the text repeating with period p.
#pragma once

#include <cstdint>
#include <vector>

namespace shardlm {

constexpr int64_t kLookupMinNgram = 2, kLookupMaxNgram = 4;

// k tokens proposed to follow seq[0, n) (none when no n-gram of its end occurred before).
std::vector<int32_t> lookup_draft(const int32_t* seq, int64_t n, int64_t k);

}  // namespace shardlm
