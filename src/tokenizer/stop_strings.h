// Stop strings (generate --stop): one generated sequence's text as it forms, and where the first
// stop string appears in it. The text is what decode() gives for the ids pushed (StreamDecoder),
// so a stop string is seen as soon as the decoder has settled the characters that complete it
// (a token that ends in half a UTF-8 character waits for the rest). The text returned ends just
// before the stop string, as in vLLM and the OpenAI API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace shardlm {

class StopMatcher {
public:
    // `stops` may be empty (nothing ever stops: the matcher then only streams the text); none of
    // them may be empty. `opt`: how the ids decode (serve's skip_special_tokens). keep_stop: the
    // text ends after the stop string instead (vLLM's include_stop_str_in_output).
    StopMatcher(const Tokenizer& tok, std::vector<std::string> stops, const DecodeOptions& opt = {},
                bool keep_stop = false);
    // Adds a generated id (ids outside the tokenizer's vocabulary decode to nothing, as in
    // generated_text); true once the text holds a stop string. Nothing changes after that.
    bool push(int32_t id);
    // At the end of the sequence: the decoder's held-back rest joins the text (and may complete a
    // stop string). Returns whether a stop string was found, now or before.
    bool finish();
    bool stopped() const { return stopped_; }
    // The text so far, cut before the first stop string once one is found (after it: keep_stop).
    const std::string& text() const { return text_; }
    // The length of text() that no later id can change: all of it after a stop or finish(), else
    // up to where a proper prefix of some stop string may be starting (streaming prints this much).
    size_t settled() const;

private:
    void append(const std::string& piece);
    const Tokenizer* tok_;
    StreamDecoder dec_;
    std::vector<std::string> stops_;
    std::string text_;
    bool keep_stop_ = false;
    bool stopped_ = false;
    bool finished_ = false;
};

}  // namespace shardlm
