// tokenizer.json "pre_tokenizer": cuts a normalized section into the words the model encodes one by
// one (and caches). A Sequence is flattened; each step maps the current list of pieces to a new one.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/regex.h"

namespace shardlm {

// How a Split step keeps the delimiters (the pattern matches) it finds, as in HF tokenizers.
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
public:
    // Reads the "pre_tokenizer" value (null: the whole section is one word). Unsupported types are
    // an error naming the type.
    static PreTokenizer from_json(const nlohmann::json& j, const std::string& where);

    // Calls on_word for each word of `section`, in order (the view lives until the call returns).
    // `at_origin`: the section starts at the first byte of the input (Metaspace's prepend_scheme
    // "first" only prepends there). `prefix_space` false: the word at the origin gets no prefix
    // space from Metaspace or ByteLevel (EncodeOptions::prefix_space).
    void split(std::string_view section, bool at_origin, const std::function<void(std::string_view)>& on_word,
               bool prefix_space = true) const;
    // The same, appending the words to `out`.
    void split(std::string_view section, bool at_origin, std::vector<std::string>& out) const;

    // True when a ByteLevel step maps the words to the GPT-2 byte alphabet: the model then works
    // on raw bytes (the mapping is folded into its vocabulary).
    bool byte_level() const { return byte_level_; }

private:
    enum class Kind { Split, ByteLevel, Metaspace, Digits };
    struct Step {
        Kind kind;
        std::shared_ptr<Regex> regex;  // Split, ByteLevel with use_regex
        std::string literal;           // Split on a String pattern
        SplitBehavior behavior = SplitBehavior::Isolated;
        bool invert = false;
        bool add_prefix_space = false;    // ByteLevel
        std::string replacement;          // Metaspace: the replacement character as UTF-8
        enum class Prepend { Always, First, Never } prepend = Prepend::Always;
        bool metaspace_split = true;
        bool individual_digits = false;   // Digits
    };
    void add(const nlohmann::json& j, const std::string& where);
    // origin[k]: kNotOrigin, kOrigin, or kOriginNoSpace (the text's first word, without prefix space).
    static constexpr char kNotOrigin = 0, kOrigin = 1, kOriginNoSpace = 2;
    void apply(const Step& s, std::vector<std::string>& pieces, std::vector<char>& origin) const;
    std::vector<Step> steps_;
    bool byte_level_ = false;
};

}  // namespace shardlm
