// Text prompts as `shardlm generate` takes them: --prompt TEXT or --prompt-file F (one prompt per
// line), optionally wrapped in the model's chat template (--chat, --system). Errors name the flag
// and the line at fault.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace shardlm {

struct TextPrompt {
    std::string text;
    std::string origin;  // "--prompt" or "--prompt-file F line N", for messages
};

// One prompt per line of `path` (a trailing "\r" is dropped, as is the newline ending the file);
// an empty line, an unreadable file or one without prompts is an error.
std::vector<TextPrompt> read_prompt_file(const std::string& path);

struct ChatOptions {
    bool chat = false;                  // apply the chat template (then no BOS/EOS is added on top)
    std::optional<std::string> system;  // the system message, with chat only
    ChatKwargs kwargs;                  // the template's variables (--no-thinking), with chat only
};

// Ids for each prompt: through the chat template when asked, else with the post-processor's BOS/EOS.
std::vector<std::vector<int32_t>> encode_prompts(const Tokenizer& tok, const std::vector<TextPrompt>& prompts,
                                                 const ChatOptions& opt);

// The text of generated tokens: a final EOS (when the sequence stopped on it) is left out; other
// special tokens are kept, as HF's decode does by default; ids past the tokenizer's vocabulary
// (padding rows of the embedding) are skipped. `opt`: e.g. continuation for a completion.
std::string generated_text(const Tokenizer& tok, const std::vector<int32_t>& tokens, bool stopped_on_eos,
                           const DecodeOptions& opt = {});

}  // namespace shardlm
