#include "tokenizer/stop_strings.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm {

StopMatcher::StopMatcher(const Tokenizer& tok, std::vector<std::string> stops, const DecodeOptions& opt, bool keep_stop)
    : tok_(&tok), dec_(tok, opt), stops_(std::move(stops)), keep_stop_(keep_stop) {
    for (const std::string& s : stops_)
        if (s.empty()) fail("--stop: a stop string must not be empty");
}

void StopMatcher::append(const std::string& piece) {
    if (stopped_ || piece.empty()) return;
    const size_t before = text_.size();
    text_ += piece;
    // Only a match that ends in the new piece is new: start each search where it could begin.
    size_t first = std::string::npos, len = 0;  // the earliest match (the first listed there)
    for (const std::string& s : stops_) {
        const size_t from = before >= s.size() - 1 ? before - (s.size() - 1) : 0;
        const size_t at = text_.find(s, from);
        if (at < first) first = at, len = s.size();
    }
    if (first == std::string::npos) return;
    text_.resize(keep_stop_ ? first + len : first);
    stopped_ = true;
}

bool StopMatcher::push(int32_t id) {
    if (stopped_ || finished_) return stopped_;
    if (id >= 0 && id < tok_->vocab_size()) append(dec_.push(id));
    return stopped_;
}

bool StopMatcher::finish() {
    if (!finished_ && !stopped_) append(dec_.finish());
    finished_ = true;
    return stopped_;
}

size_t StopMatcher::settled() const {
    if (stopped_ || finished_) return text_.size();
    // The longest end of the text that begins some stop string must wait for what follows.
    size_t hold = 0;
    for (const std::string& s : stops_)
        for (size_t n = std::min(s.size() - 1, text_.size()); n > hold; --n)
            if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
                hold = n;
                break;
            }
    return text_.size() - hold;
}

}  // namespace shardlm
