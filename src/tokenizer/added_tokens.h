// Added tokens (special tokens such as <|im_start|> and any token added after training). They are
// found in the text before the model runs and are never split, following HF tokenizers: the
// leftmost, then longest, occurrence wins; single_word tokens only match as whole words; lstrip and
// rstrip tokens swallow the white space beside them; normalized tokens are matched after the
// normalizer has run, the others on the raw text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm {

struct AddedToken {
    std::string content;
    int32_t id = -1;
    bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

// One piece of a text: either plain text [begin, end) or an added token (index into the list).
struct Segment {
    size_t begin, end;
    int token = -1;  // >= 0: this segment is that added token
};

class AddedTokenMatcher {
public:
    AddedTokenMatcher() = default;
    // Matches the tokens of `all` whose `normalized` flag equals `normalized`.
    AddedTokenMatcher(const std::vector<AddedToken>& all, bool normalized);

    // Cuts `text` into plain and added-token segments (plain segments may be empty after strips
    // and are then dropped).
    std::vector<Segment> split(std::string_view text) const;
    bool empty() const { return nodes_.size() <= 1; }

private:
    struct Node {
        std::vector<std::pair<unsigned char, int>> next;  // sorted by byte
        int token = -1;
    };
    int child(int node, unsigned char c) const;
    const std::vector<AddedToken>* all_ = nullptr;
    std::vector<Node> nodes_;
    bool first_byte_[256] = {};
};

}  // namespace shardlm
