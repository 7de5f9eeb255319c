// The OpenAI-compatible request bodies shardlm serve takes (/v1/completions and
// /v1/chat/completions, with vLLM's extra sampling fields) and the response objects it writes.
// Pure functions of JSON, the tokenizer and the server's limits: the HTTP and engine side is
// cmd_serve.cpp's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

// A request the API refuses: the HTTP status and the message of its error object.
struct ApiError : std::runtime_error {
    ApiError(int status, const std::string& message) : std::runtime_error(message), status(status) {}
    int status;
};

struct ApiLimits {
    std::string model;           // the served model's name ("model" must match it when given)
    int64_t ctx = 0;             // positions per sequence: prompt + max_tokens must fit
    int64_t vocab = 0;
    int64_t penalty_last_n = 64; // the server's penalty window
};

struct ApiRequest {
    bool chat = false;
    std::vector<int32_t> prompt;
    int64_t max_tokens = 16;
    SamplerOptions sampler;
    std::vector<std::string> stop;
    bool stream = false;
    // Completions' "logprobs": N, chat's "logprobs": true with "top_logprobs": N (0-20): each
    // generated token's log-probability and the N most probable of its row; -1: none.
    int64_t logprobs = -1;
    // Completions' "echo": the prompt's text leads the text, and with logprobs its tokens lead
    // the list (the first with null logprobs). max_tokens may then be 0 (scoring a text).
    bool echo = false;
    std::string prompt_text;  // echo: the prompt string as sent, or its ids decoded
    // What the engine must score: the prompt tokens' logprobs (BatchRequest::prompt_logprobs).
    int64_t prompt_logprobs() const { return echo && (logprobs >= 0 || max_tokens == 0) ? std::max<int64_t>(logprobs, 0) : -1; }
};

// The most top logprobs a request may ask for (vLLM's default limit).
constexpr int64_t kMaxApiLogprobs = 20;

// Parses and checks a request body (throws ApiError: 400 for a bad field, 404 for another model).
// Completions: "prompt" a string (encoded as `shardlm generate --prompt` encodes it) or an array
// of token ids; "max_tokens" default 16. Chat: "messages" of {role: system|user|assistant,
// content}, rendered with the model's chat template; "max_tokens" (or "max_completion_tokens")
// default: the rest of the context. Both: temperature (default 1), top_p (1), top_k (vLLM; 0 or
// -1: off), min_p, seed, presence_penalty, frequency_penalty, repetition_penalty, stop (a string or
// up to 4), stream, n (1 only), logprobs (completions: 0-20; chat: true, with top_logprobs 0-20),
// echo (completions, not streamed). best_of, logit_bias and tools are refused.
ApiRequest parse_api_request(const nlohmann::json& body, bool chat, const Tokenizer& tok, const ApiLimits& lim);

// "stop" for an end-of-sequence id or a stop string, "length" for max_tokens.
std::string finish_reason(const std::string& stop_reason);

// A choice's "logprobs" object for generated tokens `lps` (null when the request asked for none).
// A token's text is its bytes in the decoded text (Tokenizer::token_bytes; invalid UTF-8, part of
// a character, as U+FFFD; chat adds the raw "bytes"). Completions: tokens, token_logprobs,
// top_logprobs (the N most probable and the sampled token, by text) and text_offset from
// `offset`, the bytes of the tokens before these (streaming). Chat: content[] of token, logprob,
// bytes and top_logprobs[].
// With echo (completions) `prompt`, the prompt tokens' entries after the first
// (BatchRequest::prompt_logprobs), come first.
nlohmann::json api_logprobs(const ApiRequest& r, const Tokenizer& tok, const std::vector<TokenLogprobs>& lps,
                            size_t offset = 0, const std::vector<TokenLogprobs>* prompt = nullptr);
// The bytes the tokens of `lps` take in the completions' text_offset count.
size_t logprobs_text_bytes(const Tokenizer& tok, const std::vector<TokenLogprobs>& lps);

// The whole response of a request that has ended: text_completion or chat.completion; its usage
// names the prompt tokens taken from the prefix cache (prompt_tokens_details.cached_tokens).
nlohmann::json api_response(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const std::string& finish, int64_t completion_tokens,
                            int64_t cached_tokens, const nlohmann::json& logprobs = nullptr);
// One server-sent event's object of a streamed response: a text delta (with the logprobs of the
// tokens generated since the last event), and the finish reason in the last one (empty before).
nlohmann::json api_chunk(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                         const std::string& delta, const std::string& finish, const nlohmann::json& logprobs = nullptr);
// vLLM's /tokenize ("prompt" with "add_special_tokens", default true, or chat "messages"):
// {tokens, count, max_model_len}; /detokenize ("tokens"): {prompt}. Bad fields throw ApiError 400.
nlohmann::json api_tokenize(const nlohmann::json& body, const Tokenizer& tok, const ApiLimits& lim);
nlohmann::json api_detokenize(const nlohmann::json& body, const Tokenizer& tok, const ApiLimits& lim);
// The error object of a refused request.
nlohmann::json api_error(const std::string& message, int status);

}  // namespace shardlm
