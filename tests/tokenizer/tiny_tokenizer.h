// Small hand-made tokenizer.json files for unit and CLI tests: a GPT-2-style byte-level BPE and a
// SentencePiece-style BPE with byte fallback, both with ids below 384 (the tiny test models' vocab).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm::test {

// Byte-level: ids 0..255 are the bytes, a few merges above, then <|endoftext|> (350),
// <|im_start|> (351), <|im_end|> (352). Split regex as Qwen2's, ByteLevel decoder.
nlohmann::json tiny_byte_level_tokenizer();
// ChatML template, eos <|im_end|>.
nlohmann::json tiny_byte_level_config();

// SentencePiece-style: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3..258, then characters and merges;
// Prepend/Replace normalizer, byte fallback, Replace/ByteFallback/Fuse/Strip decoder, <s> template.
nlohmann::json tiny_sp_tokenizer();
nlohmann::json tiny_sp_config();  // add_bos_token, Llama 2 chat template

// `tok` with these special tokens added (id, content): e.g. a code model's FIM tokens.
nlohmann::json with_special_tokens(nlohmann::json tok, const std::vector<std::pair<int, std::string>>& added);

// Writes tokenizer.json and tokenizer_config.json into `dir`.
void write_tokenizer_files(const std::string& dir, const nlohmann::json& tok, const nlohmann::json& cfg);

}  // namespace shardlm::test
