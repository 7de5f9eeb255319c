// StreamDecoder: the decode() pipeline run incrementally. Each stage holds back only what a later
// token could still change: an incomplete UTF-8 character, a trailing run of strip characters,
// and the tail that clean-up could still rewrite.
#include "core/error.h"
#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace shardlm {

namespace {

// The last position where the clean-up text may be cut so that clean(a + b) == clean(a) +
// clean(b): a space, after a character that is neither a space nor a quote, before one that no
// clean-up pattern continues with. Every pattern starts with a space, and the only one with an
// inner space (" ' ") needs a quote before it, so no match can straddle such a cut in any pass.
size_t clean_cut(const std::string& s) {
    for (size_t p = s.size() >= 2 ? s.size() - 2 : 0; p >= 1; --p) {
        if (s[p] != ' ') continue;
        const char before = s[p - 1], after = s[p + 1];
        if (before == ' ' || before == '\'') continue;
        if (after == '.' || after == '?' || after == '!' || after == ',' || after == '\'' || after == 'n' || after == ' ')
            continue;
        return p;
    }
    return 0;
}

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tok, const DecodeOptions& opt) : tok_(&tok), opt_(opt) {
    clean_ = opt.clean_up_spaces.value_or(tok.impl_->clean_up);
    strip_left_ = opt.continuation ? 0 : tok.impl_->decoder.strip_start();
}

std::string StreamDecoder::push(int32_t id) {
    const auto& m = *tok_->impl_;
    if (id < 0 || id >= tok_->vocab_size())
        fail("token id ", id, " is outside the vocabulary [0, ", tok_->vocab_size(), ")");
    if (opt_.skip_special_tokens && m.special[size_t(id)]) return {};
    std::string text;
    utf8_.push(m.decoder.piece(id, first_ && !opt_.continuation), text);
    first_ = false;
    return clean_stage(strip_stage(std::move(text), false), false);
}

std::string StreamDecoder::finish() {
    std::string text;
    utf8_.finish(text);
    std::string out = clean_stage(strip_stage(std::move(text), true), true);
    first_ = true;
    strip_left_ = opt_.continuation ? 0 : tok_->impl_->decoder.strip_start();
    return out;
}

std::string StreamDecoder::strip_stage(std::string text, bool last) {
    const Decoder& d = tok_->impl_->decoder;
    std::string sc;
    append_utf8(sc, d.strip_char());
    size_t b = 0;
    while (strip_left_ > 0 && text.compare(b, sc.size(), sc) == 0 && b < text.size()) {
        b += sc.size();
        --strip_left_;
    }
    if (b < text.size()) strip_left_ = 0;  // the text has started: no more leading strips
    text.erase(0, b);
    if (d.strip_stop() == 0) return text;
    // Hold back the trailing run of strip characters: only the end of the text may lose them.
    std::string all = held_strip_ + text;
    size_t e = all.size();
    while (e >= sc.size() && all.compare(e - sc.size(), sc.size(), sc) == 0) e -= sc.size();
    held_strip_ = all.substr(e);
    all.resize(e);
    if (last) {
        for (int k = 0; k < d.strip_stop() && !held_strip_.empty(); ++k) held_strip_.resize(held_strip_.size() - sc.size());
        all += held_strip_;
        held_strip_.clear();
    }
    return all;
}

std::string StreamDecoder::clean_stage(std::string text, bool last) {
    if (!clean_) return text;
    held_clean_ += text;
    if (last) {
        std::string out = clean_up_tokenization(held_clean_);
        held_clean_.clear();
        return out;
    }
    const size_t cut = clean_cut(held_clean_);
    if (cut == 0) return {};
    std::string out = clean_up_tokenization(held_clean_.substr(0, cut));
    held_clean_.erase(0, cut);
    return out;
}

}  // namespace shardlm
