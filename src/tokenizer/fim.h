// Fill-in-the-middle prompts (completions' "suffix", generate --suffix): code models trained to
// write what goes between a prefix and a suffix read them in the order prefix, suffix, middle
// (PSM), each behind its special token: <|fim_prefix|>P<|fim_suffix|>S<|fim_middle|> for
// Qwen2.5-Coder, <fim_prefix>P<fim_suffix>S<fim_middle> for StarCoder and SmolLM,
// <｜fim▁begin｜>P<｜fim▁hole｜>S<｜fim▁end｜> for DeepSeek-Coder, <s>▁<PRE>P▁<SUF>S▁<MID> for Code
// Llama (its reference and transformers' CodeLlamaTokenizer). Mistral's (Codestral) puts the
// suffix first, <s>[SUFFIX]S[PREFIX]P, and has no middle token (mistral_common's encode_fim). In
// both of these the suffix is encoded without SentencePiece's leading space (it continues a line).
// The model then writes the middle and ends it with an end-of-sequence token or one of the
// family's separators (Qwen's <|fim_pad|>, <|file_sep|>, <|repo_name|>; Code Llama's ▁<EOT>), as
// llama.cpp's infill stops.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace shardlm {

struct FimTokens {
    const char* family = nullptr;  // "qwen", "starcoder", "deepseek", "codellama", "mistral"; null: none
    int32_t prefix = -1, suffix = -1, middle = -1;  // middle -1: the family has none (mistral)
    bool suffix_first = false;   // SPM: suffix, then prefix (mistral)
    bool suffix_space = true;    // the suffix's ids with SentencePiece's leading space (EncodeOptions)
    std::vector<int32_t> stops;  // the separators that end a middle besides the model's end-of-sequence ids
};

// The tokenizer's FIM tokens: the first family whose three tokens it has (family null: none).
FimTokens fim_tokens(const Tokenizer& tok);

// The prompt ids: the post-processor's BOS where it adds one (DeepSeek-Coder, Code Llama,
// Mistral), then in PSM order the prefix token, the prefix's ids, the suffix token, the suffix's
// ids, the middle token: what transformers' tokenizer() gives for the three tokens spelled around
// the texts (so a special token spelled inside the code counts as that token there too); in SPM
// order (suffix_first) the suffix token, the suffix's ids, the prefix token, the prefix's ids.
// f.family must be set.
std::vector<int32_t> encode_fim(const Tokenizer& tok, const FimTokens& f, const std::string& prefix,
                                const std::string& suffix);

// For messages: the spellings fim_tokens() looks for.
const char* fim_families_known();

}  // namespace shardlm
