// The OpenAI-compatible request bodies shardlm serve takes (/v1/completions and
// /v1/chat/completions, with vLLM's extra sampling fields) and the response objects it writes.
// Pure functions of JSON, the tokenizer and the server's limits: the HTTP and engine side is
// cmd_serve.cpp's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "runtime/sampler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

// A request the API refuses: the HTTP status and the message of its error object.
struct ApiError : std::runtime_error {
    ApiError(int status, const std::string& message) : std::runtime_error(message), status(status) {}
    int status;
};

// serve --reasoning-parser (vLLM's): how a chat reply's reasoning is found. Qwen3: a reply that
// opens with <think> reasons until </think>. DeepSeekR1: the prompt opened the reasoning (R1's
// template ends with "<think>\n"), so the reply reasons from its start (after a <think> of its own,
// if it writes one) until </think>, all of it when there is none.
enum class ReasoningParser : uint8_t { None, Qwen3, DeepSeekR1 };

struct ApiLimits {
    std::string model;           // the served model's name ("model" must match it when given)
    // serve --lora-modules and adapters loaded while serving: the adapters' names by their index
    // (ApiRequest::adapter), which "model" may give instead (generation routes only); "" where
    // one was unloaded (an index is never reused). Replaced whole, never changed in place: read it
    // with adapter_names (the engine loop stores a new list while handlers read).
    std::shared_ptr<const std::vector<std::string>> adapters;
    int64_t ctx = 0;             // positions per sequence: prompt + max_tokens must fit
    int64_t vocab = 0;
    int64_t penalty_last_n = 64; // the server's penalty window
    ReasoningParser reasoning = ReasoningParser::None;  // serve --reasoning-parser: chat replies' reasoning apart
    GenerationDefaults defaults;  // serve --generation-config: sampling defaults (else the API's)
};

// lim.adapters as it is now (an empty list when there are none).
std::shared_ptr<const std::vector<std::string>> adapter_names(const ApiLimits& lim);

struct ApiRequest {
    bool chat = false;
    // The LoRA adapter "model" named (ApiLimits::adapters; BatchRequest::adapter), -1: the base
    // model; `model` is the name responses give (the adapter's, or the served model's).
    int64_t adapter = -1;
    std::string model;
    // Chat: one prompt. Completions: "prompt" a string or ids, or a list of either (a batch).
    std::vector<std::vector<int32_t>> prompts;
    int64_t n = 1;  // choices per prompt: choice c is prompt c / n's (c % n)-th sample
    int64_t max_tokens = 16;
    SamplerOptions sampler;
    std::vector<std::string> stop;
    bool include_stop_str = false;     // vLLM's include_stop_str_in_output: the text ends after the stop string
    bool tokens_as_ids = false;        // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N" (api_logprobs)
    // vLLM's return_token_ids: the prompt's ids (completions: each choice's prompt_token_ids;
    // chat: the response's) and each choice's generated ids (token_ids, the end-of-sequence or
    // stop id included); streamed, the prompt's with a choice's first event (chat: the stream's)
    // and the ids since the last event with each event.
    bool return_token_ids = false;
    // vLLM's: special tokens left out of the text (default on, as vLLM's), but kept with tools
    // on (tool-call markers) or under a reasoning parser whose tags are special tokens.
    bool skip_special_tokens = true;
    bool stream = false;
    // stream_options.include_usage: a last event before [DONE] with no choices and the usage,
    // and "usage": null in the others. With vLLM's continuous_usage_stats as well, the others
    // carry their choice's usage so far instead (api_choice_usage).
    bool include_usage = false, continuous_usage = false;
    bool json_object = false;  // response_format {"type": "json_object"}: JSON mode (BatchRequest::json)
    // response_format json_schema, or vLLM's guided_json / structured_outputs.json: the schema's
    // JSON text (checked), or empty.
    std::string json_schema;
    std::vector<std::string> guided_choice;  // vLLM's guided_choice / structured_outputs.choice (checked)
    std::string guided_regex;                // vLLM's guided_regex / structured_outputs.regex (checked), or empty
    std::string guided_grammar;  // vLLM's guided_grammar / structured_outputs.grammar, llama.cpp's grammar (GBNF, checked)
    // Completions' "logprobs": N, chat's "logprobs": true with "top_logprobs": N (0-20): each
    // generated token's log-probability and the N most probable of its row; -1: none.
    int64_t logprobs = -1;
    // Completions' "echo": the prompt's text leads the text, and with logprobs its tokens lead
    // the list (the first with null logprobs). max_tokens may then be 0 (scoring a text). Chat's:
    // echo_text leads the content.
    bool echo = false;
    std::vector<std::string> prompt_texts;  // echo: each prompt as sent, or its ids decoded
    // Chat with echo (vLLM's): the final message's content when it is the assistant's, which
    // the reply's content then starts with ("" otherwise).
    std::string echo_text;
    // vLLM's prompt_logprobs (not streamed): each prompt token's logprob, rank and text, with the
    // N most probable of its row (api_prompt_logprobs); -1: none. max_tokens may then be 0.
    int64_t prompt_lps = -1;
    std::vector<int32_t> allowed_ids;              // vLLM's allowed_token_ids (BatchRequest::allowed_ids), sorted
    std::vector<std::vector<int32_t>> bad_words;   // vLLM's bad_words, as token sequences (BatchRequest::bad_words)
    // vLLM's use_beam_search (runtime/beam_search.h; not streamed): "n" beams per prompt, the
    // choices best first, scored with length_penalty (vLLM's, default 1).
    bool beam = false;
    double length_penalty = 1.0;
    // A beam search's scoring step (set by serve, never parsed): the logprobs of the token drawn
    // are kept even when it is an end-of-sequence or FIM stop token, which has no text.
    bool beam_step = false;
    bool ignore_eos = false;  // vLLM's: an end-of-sequence token does not end a choice
    int64_t min_tokens = 0;   // vLLM's: no end-of-sequence token before this many (<= max_tokens)
    int64_t priority = 0;     // vLLM's: waiting requests run lowest first (BatchRequest::priority)
    std::string cache_salt;   // vLLM's: prefixes shared with requests of the same salt only (BatchRequest::cache_salt)
    std::vector<int32_t> stop_token_ids;  // vLLM's: BatchRequest::stop_ids
    // Completions' "suffix" (fill in the middle, tokenizer/fim.h): each text prompt became the
    // FIM prompt of it and the suffix, and these separators (among stop_token_ids) end a middle
    // without being part of its text, as an end-of-sequence token.
    std::vector<int32_t> fim_stops;
    // Chat with "tools": how replies become tool calls (message.tool_calls, finish_reason
    // "tool_calls"). Auto (tool_choice "auto", the default with tools): the calls in the
    // template's format (Qwen's <tool_call> blocks, Llama's JSON), read out of the reply
    // (parse_tool_calls, chat_template.h); streamed, text that may start a call is held back
    // until the reply ends. Required and Named (as
    // vLLM's): the reply is held to JSON (json_schema): an array of {"name", "parameters"}
    // objects, or the named function's arguments; streamed, it comes as calls at the end.
    enum class Tools : uint8_t { None, Auto, Required, Named };
    Tools tools = Tools::None;
    std::string tool_name;            // Named: the function
    bool parallel_tool_calls = true;  // false: a reply's first call only
    ChatTools tool_format = ChatTools::None;  // the chat template's (Tokenizer::chat_tools)
    // Chat under serve --reasoning-parser (ApiLimits::reasoning): a reply's reasoning comes as
    // message.reasoning_content (streamed: delta.reasoning_content), the rest as the content,
    // where tool calls are read.
    ReasoningParser reasoning = ReasoningParser::None;
    // continue_final_message: the reply goes on in the final message's content (its reasoning
    // is not read, whatever the parser), or inside the <think> block that message left open
    // (reasoning up to </think>, as DeepSeekR1's parser reads a fresh reply).
    enum class Continued : uint8_t { No, InContent, InReasoning };
    Continued continued = Continued::No;
    // With reasoning and a JSON constraint (response_format, guided fields, tool_choice required
    // or named): the ids of single-token <think> and </think> (-1: none), so that the constraint
    // holds only after the reasoning (BatchRequest::think_open), as vLLM's does; think_first:
    // the reply starts inside the reasoning (DeepSeekR1, or a reply continued inside it; a reply
    // continued in its content has no tags: the constraint holds from its first token).
    int32_t think_open = -1, think_close = -1;
    bool think_first = false;
    size_t choices() const { return prompts.size() * size_t(n); }
    const std::vector<int32_t>& prompt_of(size_t choice) const { return prompts[choice / size_t(n)]; }
    // What the engine must score: the prompt tokens' logprobs (BatchRequest::prompt_logprobs), for
    // echo and for prompt_logprobs.
    int64_t prompt_logprobs() const {
        return std::max(echo && !chat && (logprobs >= 0 || max_tokens == 0) ? std::max<int64_t>(logprobs, 0) : -1, prompt_lps);
    }
};

// The most top logprobs a request may ask for (vLLM's default limit).
constexpr int64_t kMaxApiLogprobs = 20;
// The most tokens one request's logit_bias may bias (OpenAI's limit; the engine's penalty rows
// are sized for the server's penalty window plus these).
constexpr int64_t kMaxApiLogitBias = 300;
// The most stop_token_ids one request may give (each one a row of the engine's penalty room, for
// min_tokens).
constexpr int64_t kMaxApiStopTokenIds = 16;
// The most bad_words one request may give (each one or two token sequences the sampler checks
// every step).
constexpr int64_t kMaxApiBadWords = 128;
// The most choices (prompts x n) one request may ask for, and the most n.
constexpr int64_t kMaxApiChoices = 128, kMaxApiN = 16;

// What one choice of a request came to, for its response.
struct ApiChoice {
    std::string text;    // generated (echo adds the prompt's text in the response)
    std::string finish;  // "stop" or "length"
    int64_t completion_tokens = 0, cached_tokens = 0;
    std::vector<TokenLogprobs> lps, prompt_lps;  // when asked ("logprobs"; with echo the prompt's)
    std::vector<int32_t> token_ids;  // the generated ids (return_token_ids)
};

// Throws ApiError 400 for a body that nests deeper than kMaxJsonDepth (runtime/json_schema.h):
// before parsing, since serialising such JSON would overflow the stack.
void check_body_depth(const std::string& body);

// Parses and checks a request body (throws ApiError: 400 for a bad field, 404 for another model).
// Completions: "prompt" a string (encoded as `shardlm generate --prompt` encodes it), an array
// of token ids, or a list of either; "max_tokens" default 16. Chat: "messages" of {role: system|user|assistant,
// content}, rendered with the model's chat template; "max_tokens" (or "max_completion_tokens")
// default: the rest of the context. Both: temperature (default 1), top_p (1), top_k (vLLM; 0 or
// -1: off), min_p, seed, presence_penalty, frequency_penalty, repetition_penalty, stop (a string or
// up to 4), stream (with stream_options.include_usage), n (up to 16 choices per prompt, 128 in all), logprobs (completions: 0-20; chat: true, with top_logprobs 0-20),
// echo (completions, not streamed), logit_bias (up to 300 token ids, as strings, to biases in
// [-100, 100]), response_format (text, json_object or json_schema), and vLLM's ignore_eos,
// min_tokens, stop_token_ids, allowed_token_ids, bad_words, prompt_logprobs, skip_special_tokens,
// include_stop_str_in_output, priority, guided_json, guided_choice, guided_regex and
// guided_grammar (or structured_outputs with json, choice, regex or grammar; llama.cpp's grammar). Chat: "tools" (functions), "tool_choice" ("auto" or "none"), "parallel_tool_calls",
// messages of role "tool" and assistant messages with "tool_calls", content as a string or an
// array of text parts, for a template with a tools block (Qwen2.5's, Qwen3's, Llama 3.1/3.2's, Mistral v3's); tool_choice
// "required" or {"type": "function", "function": {"name": ...}} hold the reply to JSON calls
// (as vLLM does; no other constraint with them); chat_template_kwargs with enable_thinking and
// date_string (others refused). best_of and functions are refused.
ApiRequest parse_api_request(const nlohmann::ordered_json& body, bool chat, const Tokenizer& tok, const ApiLimits& lim);

// "stop" for an end-of-sequence id or a stop string, "length" for max_tokens.
std::string finish_reason(const std::string& stop_reason);

// vLLM's prompt_logprobs of one prompt (`prompt_lps`: the entries of its tokens after the
// first): null for the first token, then per token an object of token ids (as strings) to
// {logprob, rank, decoded_token}: the prompt token's first, then the r.prompt_lps most probable
// (ranks 1 to N) that are not it.
nlohmann::ordered_json api_prompt_logprobs(const ApiRequest& r, const Tokenizer& tok,
                                           const std::vector<TokenLogprobs>& prompt_lps);
// A choice's "logprobs" object for generated tokens `lps` (null when the request asked for none).
// A token's text is its bytes in the decoded text (Tokenizer::token_bytes; invalid UTF-8, part of
// a character, as U+FFFD; chat adds the raw "bytes"). Completions: tokens, token_logprobs,
// top_logprobs (the N most probable and the sampled token, by text) and text_offset from
// `offset`, the bytes of the tokens before these (streaming). Chat: content[] of token, logprob,
// bytes and top_logprobs[].
// With echo (completions) the prompt's tokens come first: `echo_prompt`, its ids, and
// `prompt_lps`, the entries of those after the first (BatchRequest::prompt_logprobs).
nlohmann::ordered_json api_logprobs(const ApiRequest& r, const Tokenizer& tok, const std::vector<TokenLogprobs>& lps,
                            size_t offset = 0, const std::vector<int32_t>* echo_prompt = nullptr,
                            const std::vector<TokenLogprobs>* prompt_lps = nullptr);
// The bytes the tokens of `lps` take in the completions' text_offset count.
size_t logprobs_text_bytes(const Tokenizer& tok, const std::vector<TokenLogprobs>& lps);
// The same for token ids (an echoed prompt's).
size_t tokens_text_bytes(const Tokenizer& tok, const std::vector<int32_t>& ids);

// The whole response of a request that has ended: text_completion or chat.completion, a choice
// per entry of `choices` (r.choices() of them); its usage counts each prompt once and names the
// prompt tokens taken from the prefix cache (prompt_tokens_details.cached_tokens).
nlohmann::ordered_json api_response(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                            const std::vector<ApiChoice>& choices, const Tokenizer& tok);
// The last event of a streamed response with stream_options.include_usage: no choices, the
// usage api_response() would give.
nlohmann::ordered_json api_usage_chunk(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                               const std::vector<ApiChoice>& choices);
// A streamed event's usage under continuous_usage_stats (vLLM's): the choice's prompt and the
// tokens it has generated so far (`completion_tokens`).
nlohmann::ordered_json api_choice_usage(const ApiRequest& r, size_t choice, int64_t completion_tokens);
// One server-sent event's object of a streamed response: choice `index`'s text delta (with the
// logprobs of the tokens generated since its last event), and the finish reason in its last one
// (empty before).
nlohmann::ordered_json api_chunk(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                         size_t index, const std::string& delta, const std::string& finish,
                         const nlohmann::ordered_json& logprobs = nullptr);
// A streamed chat response's first event for choice `index`: the assistant's role with empty
// content (OpenAI's and vLLM's first delta, where clients read the role).
nlohmann::ordered_json api_role_chunk(const ApiRequest& r, const std::string& id, int64_t created,
                                      const std::string& model, size_t index);
// Where a reply's reasoning is (ApiRequest::reasoning; vLLM's qwen3 and deepseek_r1 reasoning
// parsers): offsets into the text. Qwen3: the reasoning [begin, end) follows a <think> that opens
// the reply (after white space) and ends at </think>, or at the end of a reply cut short (vLLM
// would then give it all as content; here a stream and a whole response agree). DeepSeekR1: it
// starts at the reply's start, or after a <think> that opens it, and ends at the first </think>
// or the reply's end. The content starts after </think>. A continued reply (ApiRequest::continued)
// in content has no reasoning; one inside the reasoning is read as DeepSeekR1 reads a fresh reply,
// whatever the parser. Without reasoning, content is 0 and
// begin == end. Streaming (!done): while the reply may still open with <think>, or may be closing
// it, that text is held back (content past the text, end before it).
struct ReasoningSpan {
    size_t begin = 0, end = 0, content = 0;
};
ReasoningSpan reasoning_span(const ApiRequest& r, const std::string& text, bool done);
// A streamed chat response's event with choice `index`'s reasoning delta.
nlohmann::ordered_json api_reasoning_chunk(const ApiRequest& r, const std::string& id, int64_t created,
                                           const std::string& model, size_t index, const std::string& delta);
// A reply's tool calls as the request's tool mode reads them (called false: plain text).
ParsedToolCalls api_tool_calls(const ApiRequest& r, const std::string& text);
// The same as far as a streamed reply goes (tool_calls_so_far): Auto in the template's format,
// Required an array of {"name", "parameters"}, Named the arguments themselves (the call begun
// with the first token).
ToolCallsSoFar api_tool_calls_so_far(const ApiRequest& r, const std::string& text, bool done);
// How much of a streamed reply may go out as content, given its calls so far: all of it without
// tools, or once it cannot be calls; else the text before what may start a call (Auto) or nothing
// (Required, Named) until it ends, then the content before the calls (at least `sent`: nothing
// is taken back). White space at the end of what may go waits for the text after it (the
// content before a call leaves it out). A reply whose calls went out in part and then turned out not to be calls sends
// its text as content too, so nothing of it is lost.
size_t api_sendable(const ApiRequest& r, const ToolCallsSoFar& calls, const std::string& text, bool done, size_t sent);
// The tool_calls delta entries that bring a stream's calls from what went out to `calls` (vLLM's
// and OpenAI's streaming form): a call's first entry has its index, id, type and name with the
// arguments so far, later ones the arguments' new text. args_sent: the bytes of each begun call's
// arguments sent, updated. Empty: nothing new. Without parallel_tool_calls, the first call only.
nlohmann::ordered_json api_tool_call_deltas(const ApiRequest& r, const std::string& id, int64_t created, size_t choice,
                                            const std::vector<ChatToolCall>& calls, std::vector<size_t>& args_sent);
// The event of choice `index` with those entries; the stream's last event then says "tool_calls".
nlohmann::ordered_json api_tool_calls_chunk(const ApiRequest& r, const std::string& id, int64_t created,
                                            const std::string& model, size_t index, const nlohmann::ordered_json& deltas);
// vLLM's /tokenize ("prompt" with "add_special_tokens", default true, or chat "messages"):
// {tokens, count, max_model_len}; /detokenize ("tokens"): {prompt}. Bad fields throw ApiError 400.
nlohmann::ordered_json api_tokenize(const nlohmann::ordered_json& body, const Tokenizer& tok, const ApiLimits& lim);
nlohmann::ordered_json api_detokenize(const nlohmann::ordered_json& body, const Tokenizer& tok, const ApiLimits& lim);
// OpenAI's /v1/embeddings request: "input" a string, an array of token ids, or a list of either
// (at most kMaxApiEmbeddingInputs), each within the context and not empty; "model" as for the
// other routes; "encoding_format" float (default) or base64 (each vector's little-endian float32
// bytes); "dimensions" (Matryoshka: the first N, then normalized if the server normalizes);
// vLLM's "normalize" (true/false: the server's pooling setting otherwise) and
// "truncate_prompt_tokens" (k: each input's last k tokens; -1: the context's worth); "user"
// ignored. Text inputs are encoded after `prefix` (config_sentence_transformers.json's default prompt).
// Throws ApiError 400 for a bad field, 404 for another model.
constexpr int64_t kMaxApiEmbeddingInputs = 2048;
struct EmbeddingRequest {
    std::vector<std::vector<int32_t>> inputs;
    bool base64 = false;
    int64_t dimensions = 0;  // 0: all
    int normalize = -1;      // -1: the server's setting, else 0/1
};
EmbeddingRequest parse_embedding_request(const nlohmann::ordered_json& body, const Tokenizer& tok, const ApiLimits& lim,
                                         int64_t hidden, const std::string& prefix);
// The response: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
// "usage": {"prompt_tokens", "total_tokens"}}, a vector per input in order.
nlohmann::ordered_json api_embedding_response(const EmbeddingRequest& r, const std::string& model,
                                              const std::vector<std::vector<float>>& vectors);
// vLLM's /score (text_1: a string or a list; text_2: a string or a list, as long as text_1's list)
// and the Jina/Cohere /rerank (query, documents, top_n, return_documents). On an embedding model
// (bi-encoder) each pair's score is the cosine of the two texts' normalized embeddings: the query
// side (text_1, query) is encoded after `query_prefix`, the other after `document_prefix`
// (sentence-transformers' encode_query / encode_document prompts). With `cross` (a cross-encoder:
// serve --rerank) each pair is one input, the two texts through the tokenizer's pair template or
// `rerank_template` (runtime/classify.h: encode_scored_pair), scored by the classifier; the
// prefixes do not apply. vLLM's
// truncate_prompt_tokens (k, or -1: the context) keeps each text's last k tokens, and of a
// cross-encoder's pair the query whole and the document's first tokens that fit k. Throws ApiError
// as parse_embedding_request.
struct ScoreRequest {
    bool rerank = false;
    std::vector<std::vector<int32_t>> inputs;      // bi-encoder: the first side's texts, then the second's;
                                                   // cross: one per pair
    std::vector<std::pair<size_t, size_t>> pairs;  // bi-encoder: the inputs of each scored pair
    std::vector<std::string> documents;            // rerank: the documents' texts
    int64_t top_n = 0;                             // rerank: results kept, the best first
    bool return_documents = true;
};
ScoreRequest parse_score_request(const nlohmann::ordered_json& body, bool rerank, const Tokenizer& tok,
                                 const ApiLimits& lim, const std::string& query_prefix,
                                 const std::string& document_prefix, bool cross = false,
                                 const std::string& rerank_template = "");
// A bi-encoder request's pair scores: the cosines of `vectors` (the inputs' normalized embeddings).
std::vector<double> cosine_scores(const ScoreRequest& r, const std::vector<std::vector<float>>& vectors);
// /score: {"id", "object": "list", "created", "model", "data": [{"index", "object": "score", "score"}],
// "usage"}; /rerank: {"id", "model", "usage": {"total_tokens"}, "results": [{"index", "document":
// {"text"}, "relevance_score"}]}, the most relevant first. `scores`: one per pair.
nlohmann::ordered_json api_score_response(const ScoreRequest& r, const std::string& id, int64_t created,
                                          const std::string& model, const std::vector<double>& scores);
// vLLM's /classify response: {"id", "object": "list", "created", "model", "data": [{"index",
// "label", "probs", "num_classes"}], "usage"}, per input its probabilities over `labels` (the
// classifier's, from class_probabilities) and the most probable label.
nlohmann::ordered_json api_classify_response(const EmbeddingRequest& r, const std::string& id, int64_t created,
                                             const std::string& model, const std::vector<std::string>& labels,
                                             const std::vector<std::vector<float>>& probs);
// The error object of a refused request.
nlohmann::ordered_json api_error(const std::string& message, int status);
// A request's own id (vLLM's): the X-Request-Id header's value, else the body's "request_id", else
// "" (the server numbers it). 1-128 visible ASCII characters; otherwise ApiError 400 naming the
// header or field. The response's id is it after the route's prefix ("chatcmpl-", "cmpl-", "resp_").
std::string api_request_id(const std::string& header, const nlohmann::json& body);
// Whether an HTTP Authorization header value carries `key` as its bearer token ("Bearer KEY", the
// scheme in any case, as OpenAI's clients send it). The token is compared in time independent of
// where it differs, so that response times do not give the key away byte by byte.
bool api_key_accepted(const std::string& authorization, const std::string& key);

}  // namespace shardlm
