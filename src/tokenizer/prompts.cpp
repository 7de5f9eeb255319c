#include "tokenizer/prompts.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace shardlm {

std::vector<TextPrompt> read_prompt_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("--prompt-file: cannot read ", path);
    std::ostringstream ss;
    ss << f.rdbuf();
    const std::string all = ss.str();
    std::vector<TextPrompt> out;
    size_t line = 0;
    for (size_t at = 0; at < all.size();) {
        size_t end = all.find('\n', at);
        if (end == std::string::npos) end = all.size();
        std::string text = all.substr(at, end - at);
        ++line;
        if (!text.empty() && text.back() == '\r') text.pop_back();
        const std::string origin = "--prompt-file " + path + " line " + std::to_string(line);
        if (text.empty()) fail(origin, " is empty (one prompt per line; empty lines are not prompts)");
        out.push_back({std::move(text), origin});
        at = end + 1;
    }
    if (out.empty()) fail("--prompt-file ", path, " has no prompts");
    return out;
}

std::vector<std::vector<int32_t>> encode_prompts(const Tokenizer& tok, const std::vector<TextPrompt>& prompts,
                                                 const ChatOptions& opt) {
    std::vector<std::vector<int32_t>> ids;
    for (const TextPrompt& p : prompts) {
        try {
            if (p.text.empty()) fail("the prompt is empty");
            if (opt.chat) {
                // The template spells BOS itself where the model wants one.
                const std::string text = tok.apply_chat_template(opt.system, {ChatMessage{"user", p.text}}, {}, opt.kwargs);
                ids.push_back(tok.encode(text, EncodeOptions{false}));
            } else {
                ids.push_back(tok.encode(p.text));
            }
            if (ids.back().empty()) fail("the prompt encodes to no tokens");
        } catch (const Error& e) {
            fail(p.origin, ": ", e.what());
        }
    }
    return ids;
}

std::string generated_text(const Tokenizer& tok, const std::vector<int32_t>& tokens, bool stopped_on_eos,
                           const DecodeOptions& opt) {
    std::vector<int32_t> ids;
    const size_t n = stopped_on_eos && !tokens.empty() ? tokens.size() - 1 : tokens.size();
    // A model's embedding table is often padded past the tokenizer's vocabulary; like HF, ids
    // without a token decode to nothing rather than failing the whole generation.
    for (size_t i = 0; i < n; ++i)
        if (tokens[i] >= 0 && tokens[i] < tok.vocab_size()) ids.push_back(tokens[i]);
    return tok.decode(ids, opt);
}

}  // namespace shardlm
