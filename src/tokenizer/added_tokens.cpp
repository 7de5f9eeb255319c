#include "tokenizer/added_tokens.h"

#include <algorithm>

#include <unicode/uchar.h>

#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

// HF's word character for single_word: Rust's char::is_alphanumeric (Alphabetic or a Number
// category) or '_', with ICU's property data.
bool is_word_char(char32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const auto type = u_charType(UChar32(c));
    return u_hasBinaryProperty(UChar32(c), UCHAR_ALPHABETIC) || type == U_DECIMAL_DIGIT_NUMBER ||
           type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

char32_t last_char(std::string_view s) {
    size_t k = s.size() - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    return next_code_point(s, k);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& all, bool normalized) : all_(&all) {
    nodes_.emplace_back();
    for (size_t t = 0; t < all.size(); ++t) {
        const AddedToken& tok = all[t];
        if (tok.normalized != normalized || tok.content.empty()) continue;
        int node = 0;
        for (unsigned char c : tok.content) {
            int nx = child(node, c);
            if (nx < 0) {
                nx = int(nodes_.size());
                nodes_.emplace_back();
                auto& v = nodes_[size_t(node)].next;
                v.insert(std::upper_bound(v.begin(), v.end(), std::make_pair(c, -1)), {c, nx});
            }
            node = nx;
        }
        // The same content twice: the later entry wins, as in HF's added vocabulary.
        nodes_[size_t(node)].token = int(t);
        first_byte_[static_cast<unsigned char>(tok.content[0])] = true;
    }
}

int AddedTokenMatcher::child(int node, unsigned char c) const {
    const auto& v = nodes_[size_t(node)].next;
    const auto it = std::lower_bound(v.begin(), v.end(), std::make_pair(c, -1));
    return it != v.end() && it->first == c ? it->second : -1;
}

std::vector<Segment> AddedTokenMatcher::split(std::string_view text) const {
    std::vector<Segment> out;
    if (empty()) {
        if (!text.empty()) out.push_back({0, text.size(), -1});
        return out;
    }
    size_t plain = 0;  // start of the pending plain text
    size_t i = 0;
    while (i < text.size()) {
        if (!first_byte_[static_cast<unsigned char>(text[i])]) { ++i; continue; }
        int node = 0, tok = -1;
        size_t end = i;
        for (size_t j = i; j < text.size(); ++j) {
            node = child(node, static_cast<unsigned char>(text[j]));
            if (node < 0) break;
            if (nodes_[size_t(node)].token >= 0) { tok = nodes_[size_t(node)].token; end = j + 1; }
        }
        if (tok < 0) { ++i; continue; }
        const AddedToken& t = (*all_)[size_t(tok)];
        if (t.single_word) {
            const bool left_ok = i == 0 || !is_word_char(last_char(text.substr(0, i)));
            size_t k = end;
            const bool right_ok = end == text.size() || !is_word_char(next_code_point(text, k));
            if (!left_ok || !right_ok) { i = end; continue; }  // skipped, search resumes after it
        }
        size_t b = i, e = end;
        if (t.lstrip) {
            while (b > plain) {
                size_t k = b - 1;
                while (k > plain && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
                size_t kk = k;
                if (!is_js_space(next_code_point(text, kk))) break;
                b = k;
            }
        }
        if (t.rstrip) {
            while (e < text.size()) {
                size_t k = e;
                if (!is_js_space(next_code_point(text, k))) break;
                e = k;
            }
        }
        if (b > plain) out.push_back({plain, b, -1});
        out.push_back({b, e, tok});
        plain = i = e;
    }
    if (plain < text.size()) out.push_back({plain, text.size(), -1});
    return out;
}

}  // namespace shardlm
