// The tokenizer of a Hugging Face model folder: tokenizer.json (+ tokenizer_config.json) ->
// text <-> ids, with the model's special tokens and chat template.
//
//   Tokenizer tok = Tokenizer::load(dir);
//   std::vector<int32_t> ids = tok.encode("Hello");             // BOS/EOS as the files say
//   std::string text = tok.decode(ids);                         // exact inverse for valid text
//   std::string prompt = tok.apply_chat_template(system, user); // then encode(prompt, {false})
//   StreamDecoder s(tok); for (id : generated) std::cout << s.push(id); std::cout << s.finish();
//
// Encoding follows HF tokenizers: added tokens are cut out first, each remaining section is
// normalized, pre-tokenized into words and encoded word by word by the BPE model (cached), then the
// post-processor adds BOS/EOS. Supported: BPE models (byte-level as in GPT-2/Llama 3/Qwen, and
// SentencePiece-style with byte fallback as in Llama 2/Mistral); anything else is a clear error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/utf8.h"

namespace shardlm {

struct EncodeOptions {
    bool add_special_tokens = true;  // the post-processor's BOS/EOS (not special tokens in the text)
    // The space a SentencePiece-style tokenizer puts before the text (a normalizer's Prepend,
    // Metaspace's prepend_scheme, ByteLevel's add_prefix_space). false: the text is encoded as the
    // continuation of a line, without it (mistral_common's _encode_infilling and Code Llama's
    // infilling suffix); only the start of the text is concerned.
    bool prefix_space = true;
};

struct DecodeOptions {
    // Drop special tokens (added tokens marked special, and additional_special_tokens). The HF
    // default, and ours, is to keep them.
    bool skip_special_tokens = false;
    // transformers' clean_up_tokenization; unset: as tokenizer_config.json says (absent: off).
    std::optional<bool> clean_up_spaces;
    // The ids continue a text (a completion after its prompt, a fill-in-the-middle's middle): the
    // first token is decoded as any later one, and SentencePiece's leading space stays, as vLLM's
    // incremental detokenizer gives it after the prompt's tokens (" Paris" after "... is").
    bool continuation = false;
};

class Tokenizer {
public:
    // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json and
    // DIR/chat_template.jinja (where transformers since 4.47 saves the chat template; it wins over
    // tokenizer_config.json's, as there). Errors name the file.
    // A chat template from a file of its own: its text and its name (for messages).
    struct ChatTemplateFile {
        std::string text, where;
    };
    // `chat_template`: one given outside the folder (vLLM's serve --chat-template), winning over
    // both of the folder's.
    static Tokenizer load(const std::string& dir, const std::optional<ChatTemplateFile>& chat_template = std::nullopt);
    // The same from the files' contents (`config_json` may be empty); the names are for messages.
    static Tokenizer from_json_text(const std::string& tokenizer_json, const std::string& config_json,
                                    const std::string& where = "tokenizer.json",
                                    const std::string& config_where = "tokenizer_config.json",
                                    const std::optional<ChatTemplateFile>& chat_file = std::nullopt);
    static bool exists(const std::string& dir);  // DIR/tokenizer.json is there

    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    ~Tokenizer();

    // `text` must be valid UTF-8 (an error names the offending byte offset).
    std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opt = {}) const;
    // A pair of texts as transformers' tokenizer(a, text_pair=b) encodes it: each without special
    // tokens, joined by the post-processor's pair template (Llama 3: BOS a BOS b; Qwen: a b). What a
    // cross-encoder (runtime/classify.h) scores.
    // With max_tokens > 0, b loses tokens from its end until the pair fits them (a reranker keeps
    // its query whole and cuts the document); Error when a alone does not leave b a token.
    std::vector<int32_t> encode_pair(std::string_view a, std::string_view b, int64_t max_tokens = 0) const;
    // Ids outside [0, vocab_size()) are an error.
    std::string decode(const std::vector<int32_t>& ids, const DecodeOptions& opt = {}) const;

    int32_t vocab_size() const;                          // 1 + the largest id, added tokens included
    int32_t token_to_id(std::string_view token) const;   // -1 when there is no such token
    std::string id_to_token(int32_t id) const;           // as spelled in tokenizer.json
    // The bytes token `id` adds inside a decoded text (the decoder's per-token rewrite, before
    // UTF-8 decoding, the whole-text strip and clean-up; special tokens as spelled): one token's
    // share of decode()'s text, which for a token holding part of a character is not UTF-8.
    std::string token_bytes(int32_t id) const;
    bool is_special(int32_t id) const;
    int32_t bos_id() const;  // -1 when the model has none
    int32_t eos_id() const;

    // Chat: the tokenizer_config.json template rendered for [system], user with the assistant
    // prompt opened. Errors when there is no template or it is not a recognised family.
    bool has_chat_template() const;
    std::string apply_chat_template(const std::optional<std::string>& system, const std::string& user) const;
    // A whole conversation (chat_template.h: render_conversation), for multi-turn chat.
    // With `tools` (the request's function entries), the template's tools block (chat_template.h).
    std::string apply_chat_template(const std::optional<std::string>& system, const std::vector<ChatMessage>& messages,
                                    const std::vector<nlohmann::ordered_json>& tools = {},
                                    const ChatKwargs& kwargs = {}) const;
    // The chat template's tool format (None: it renders no tools; a tools block shardlm knows:
    // Qwen2.5's, Qwen3's, Llama 3.1/3.2's).
    ChatTools chat_tools() const;
    // Whether the chat template reads enable_thinking (Qwen3's switch; ChatKwargs).
    bool chat_thinking_switch() const;
    std::string chat_family() const;  // e.g. "chatml"

private:
    Tokenizer();
    struct Impl;
    std::unique_ptr<Impl> impl_;
    friend class StreamDecoder;
};

// Incremental decoding of generated ids: push() returns the text that became final with this id
// (possibly empty), never a partial UTF-8 character; finish() returns the rest. The concatenation
// of everything returned equals decode() of all the ids with the same options.
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tok, const DecodeOptions& opt = {});
    std::string push(int32_t id);
    std::string finish();

private:
    std::string strip_stage(std::string text, bool last);
    std::string clean_stage(std::string text, bool last);
    const Tokenizer* tok_;
    DecodeOptions opt_;
    bool clean_ = false;
    bool first_ = true;
    Utf8Decoder utf8_;         // holds an incomplete character back
    int strip_left_ = 0;       // leading strip characters still to drop
    std::string held_strip_;   // a trailing run of strip characters (may be dropped at the end)
    std::string held_clean_;   // text the clean-up may still change
};

}  // namespace shardlm
