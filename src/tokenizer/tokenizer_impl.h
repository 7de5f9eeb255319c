// Tokenizer::Impl: the loaded parts of a tokenizer, shared by tokenizer.cpp and stream_decoder.cpp.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

// Where the sequences go in Impl::pair (ids are >= 0).
constexpr int32_t kPairA = -1, kPairB = -2;

struct Tokenizer::Impl {
    std::string where;  // the tokenizer.json path, for messages
    Normalizer normalizer;
    PreTokenizer pre_tokenizer;
    std::unique_ptr<BpeModel> model;
    std::vector<AddedToken> added;
    AddedTokenMatcher raw_matcher, normalized_matcher;
    Decoder decoder;
    std::vector<std::string> tokens;   // id -> spelling (model vocab and added tokens)
    std::unordered_map<std::string, int32_t> added_ids;
    std::vector<char> special;         // id -> skipped by skip_special_tokens
    std::vector<int32_t> prefix, suffix;  // post-processor, single sequence
    // post-processor, a pair of sequences: ids, kPairA / kPairB where the sequences go (without
    // one, the two sequences one after the other)
    std::vector<int32_t> pair{kPairA, kPairB};
    int32_t bos = -1, eos = -1;
    std::string bos_token;
    bool clean_up = false;
    std::optional<std::string> chat_source;
    std::optional<ChatTemplate> chat;  // recognised at load; an odd template only fails --chat
    std::string chat_error;
    std::string config_where;

    // at_origin: the section starts the text; prefix_space: EncodeOptions::prefix_space.
    void encode_section(std::string_view section, bool at_origin, std::vector<int32_t>& out, BpeModel::Scratch& scratch,
                        bool prefix_space = true) const;
};

}  // namespace shardlm
