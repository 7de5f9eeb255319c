// OpenAI's Responses API (POST /v1/responses) on top of the chat path: a request body becomes a
// chat completions body (responses_chat_body), which parse_api_request checks and serve runs as
// any chat request; the chat response becomes a response object (responses_object), and a chat
// stream's events become the Responses stream's (ResponsesStream). Responses made with "store"
// (the default) are kept in memory (ResponseStore), the latest kMaxStoredResponses of them
// (serve --max-stored-responses): a
// request with previous_response_id continues that conversation, and GET and DELETE
// /v1/responses/{id} read and drop one. A request with "background" is answered at once with
// the response queued (or, with "stream", its events as they come); it is stored when it ends,
// GET reads its status meanwhile (or, with ?stream=true&starting_after=N, its events after N),
// and POST /v1/responses/{id}/cancel ends it.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm {

// The chat completions body of a Responses request (throws ApiError 400 for what it cannot say):
// "instructions" a first system message; "input" a string (one user message) or a list of
// messages ({role: user|system|developer|assistant, content: a string or input_text/output_text
// parts}), function_call items (an assistant turn's tool_calls, consecutive ones merged into one
// turn) and function_call_output items (tool messages); reasoning items are dropped (chat
// templates drop earlier reasoning). "tools" (type function: name, description, parameters) and
// "tool_choice" (auto, none, required, or {"type": "function", "name"}); "max_output_tokens";
// "text.format" (text, json_object, json_schema with name and schema) as response_format;
// temperature, top_p, parallel_tool_calls, stream and vLLM's extra sampling and structured
// output fields as they are.
// "background" true (with store) is checked here and run by serve.
// Refused: previous_response_id (responses_continue resolves it first), include, truncation
// "auto", reasoning.effort, tools of other types, items of other types.
nlohmann::ordered_json responses_chat_body(const nlohmann::ordered_json& body);

// "input" as a list of items (a string is one user message); throws ApiError 400 for another form.
nlohmann::ordered_json responses_input_items(const nlohmann::ordered_json& body);
// The conversation a response leaves, as input items for the next request: its request's
// (`items`: the earlier conversation and its own input) and then its output's, a message's
// output_text as an assistant message and function calls as they are (reasoning items left out,
// as chat templates leave earlier reasoning out).
nlohmann::ordered_json responses_conversation(nlohmann::ordered_json items, const nlohmann::ordered_json& response);

// The responses kept in memory, the least recently made or read dropped first; safe from any
// thread. Each: the object (GET /v1/responses/{id}) and the conversation it leaves.
constexpr size_t kMaxStoredResponses = 1000;
class ResponseStore {
public:
    struct Entry {
        nlohmann::ordered_json object, conversation;
        // A background response made with "stream": its events, entry k the one of sequence_number
        // k (GET /v1/responses/{id}?stream=true&starting_after=N gives those after N again).
        std::shared_ptr<const std::vector<std::string>> events;
    };
    explicit ResponseStore(size_t capacity = kMaxStoredResponses) : capacity_(capacity) {}
    void put(const std::string& id, Entry e);
    std::optional<Entry> get(const std::string& id);
    bool erase(const std::string& id);

private:
    std::mutex m_;
    size_t capacity_;
    std::list<std::string> order_;  // most recent first
    std::map<std::string, std::pair<Entry, std::list<std::string>::iterator>> entries_;
};
// The request body that continues a stored response: "input" becomes its conversation followed by
// this request's input items, and previous_response_id goes. Throws ApiError 404 when the store
// holds no such response (never made with "store", dropped, or deleted).
nlohmann::ordered_json responses_continue(const nlohmann::ordered_json& body, ResponseStore& store);

// A background response before it completes (status "queued"; serve's GET says "in_progress"
// from its first token): no output, no usage, the request's settings.
nlohmann::ordered_json responses_queued(const nlohmann::ordered_json& request, const std::string& id, int64_t created,
                                        const std::string& model);
// Whether a stored response object is a background one still queued or in progress.
bool responses_running(const nlohmann::ordered_json& object);

// The response object of a finished request from its chat.completion response (one choice):
// output items reasoning (reasoning_text), message (output_text) and function_call each, status
// "completed", or "incomplete" with incomplete_details.reason "max_output_tokens" when it was cut
// by the limit; usage as input/output tokens (output_tokens_details.reasoning_tokens: the
// reasoning text's tokens re-encoded, `reasoning_tokens`). `request`: the Responses body, whose
// settings the object repeats.
nlohmann::ordered_json responses_object(const nlohmann::ordered_json& chat_response, const nlohmann::ordered_json& request,
                                        const std::string& id, int64_t reasoning_tokens);

// A Responses stream made from the chat stream's events of one choice: response.created and
// response.in_progress first, then per output item output_item.added, its deltas
// (reasoning_text.delta, content_part.added and output_text.delta, function_call_arguments.delta)
// and its done events as the next item begins or the reply ends, and last response.completed
// (or response.incomplete) with the whole object, or response.failed when the request was
// aborted. Each event is "event: TYPE\ndata: JSON\n\n" with a sequence_number.
class ResponsesStream {
public:
    ResponsesStream(std::string id, int64_t created, std::string model, nlohmann::ordered_json request);
    // The first events (response.created, response.in_progress); `queued`: a background
    // response's, whose created event says "queued".
    std::string start(bool queued = false);
    // The events of one chat.completion.chunk (deltas of reasoning_content, content and
    // tool_calls, and the finish reason).
    std::string push(const nlohmann::ordered_json& chat_chunk);
    // The last event: `usage` the chat usage object, or null when the request was aborted.
    std::string end(const nlohmann::ordered_json& usage, int64_t reasoning_tokens);
    // The last events when the whole object is made elsewhere (a background response's, which
    // the store keeps): the open item closed, then response.completed, response.incomplete or
    // response.failed with `object`, by its status; a cancelled one's stream ends with its last
    // item (the API has no event for a cancel).
    std::string finish(const nlohmann::ordered_json& object);
    const std::string& reasoning() const { return reasoning_; }
    // After end(): the whole response object (null if it failed).
    const nlohmann::ordered_json& final_object() const { return final_; }

private:
    enum class Item : uint8_t { None, Reasoning, Message, Call };
    std::string event(const char* type, nlohmann::ordered_json data);
    std::string open(Item kind, size_t call = 0);
    std::string close();
    nlohmann::ordered_json item_json(Item kind, size_t call, bool done) const;
    nlohmann::ordered_json chat_message() const;  // what went out, as a chat response's message

    std::string id_, model_;
    int64_t created_;
    nlohmann::ordered_json request_;
    int64_t seq_ = 0;
    int64_t index_ = -1;  // the open item's output_index
    Item open_ = Item::None;
    size_t call_ = 0;  // the open call
    std::string reasoning_, content_, finish_;
    // include message.output_text.logprobs: the chat stream's entries, all of them (lps_), and
    // those not yet sent with a text delta (lps_pending_: a chunk may bring them without text).
    nlohmann::ordered_json lps_ = nlohmann::ordered_json::array(), lps_pending_ = nlohmann::ordered_json::array();
    struct Call {
        std::string id, name, arguments;
    };
    std::vector<Call> calls_;
    nlohmann::ordered_json final_;
};

}  // namespace shardlm
