#include "cli/responses_api.h"

#include "cli/openai_api.h"
#include "core/error.h"

namespace shardlm {

using json = nlohmann::ordered_json;

namespace {

[[noreturn]] void bad(const std::string& message) { throw ApiError(400, message); }

// A message's or an output's content: a string, or parts of text (input_text, output_text,
// text) as the chat API's text parts.
json content_parts(const json& c, const std::string& where) {
    if (c.is_string()) return c;
    if (!c.is_array()) bad(where + " must be a string or an array of text parts");
    json parts = json::array();
    for (const json& p : c) {
        const std::string type = p.is_object() ? p.value("type", "") : "";
        if ((type != "input_text" && type != "output_text" && type != "text") || !p.contains("text") || !p["text"].is_string())
            bad(where + ": parts of type \"" + type + "\" are not supported (input_text, output_text)");
        parts.push_back({{"type", "text"}, {"text", p["text"]}});
    }
    return parts;
}

json chat_messages(const json& body) {
    json messages = json::array();
    if (body.contains("instructions") && !body["instructions"].is_null()) {
        if (!body["instructions"].is_string()) bad("\"instructions\" must be a string");
        messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
    }
    const json input = responses_input_items(body);
    bool calls_open = false;  // the last message is an assistant turn that function_call items join
    for (size_t i = 0; i < input.size(); ++i) {
        const json& item = input[i];
        const std::string where = "input[" + std::to_string(i) + "]";
        if (!item.is_object()) bad(where + " must be an object");
        const std::string type = item.value("type", "message");
        if (type == "message") {
            if (!item.contains("role") || !item["role"].is_string()) bad(where + ".role must be a string");
            std::string role = item["role"];
            if (role == "developer") role = "system";
            if (role != "system" && role != "user" && role != "assistant")
                bad(where + ".role \"" + role + "\" (user, system, developer, assistant)");
            if (!item.contains("content")) bad(where + ".content is required");
            messages.push_back({{"role", role}, {"content", content_parts(item["content"], where + ".content")}});
            calls_open = role == "assistant";
        } else if (type == "function_call") {
            for (const char* key : {"call_id", "name", "arguments"})
                if (!item.contains(key) || !item[key].is_string()) bad(where + "." + key + " must be a string");
            const json call = {{"id", item["call_id"]}, {"type", "function"},
                               {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
            if (!calls_open) messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array()}});
            json& turn = messages.back();
            if (!turn.contains("tool_calls")) turn["tool_calls"] = json::array();
            turn["tool_calls"].push_back(call);
            calls_open = true;
        } else if (type == "function_call_output") {
            if (!item.contains("call_id") || !item["call_id"].is_string()) bad(where + ".call_id must be a string");
            if (!item.contains("output")) bad(where + ".output is required");
            messages.push_back({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", content_parts(item["output"], where + ".output")}});
            calls_open = false;
        } else if (type == "reasoning") {
            continue;  // earlier reasoning: chat templates leave it out of the prompt
        } else {
            bad(where + ": items of type \"" + type + "\" are not supported (message, function_call, function_call_output, reasoning)");
        }
    }
    return messages;
}

json chat_tools(const json& tools) {
    if (!tools.is_array()) bad("\"tools\" must be an array");
    json out = json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
        const json& t = tools[i];
        const std::string type = t.is_object() ? t.value("type", "") : "";
        if (type != "function")
            bad("\"tools[" + std::to_string(i) + "]\": only function tools are supported, not \"" + type + "\"");
        json f = json::object();
        for (const char* key : {"name", "description", "parameters"})
            if (t.contains(key) && !t[key].is_null()) f[key] = t[key];
        out.push_back({{"type", "function"}, {"function", f}});
    }
    return out;
}

json chat_tool_choice(const json& c) {
    if (c.is_string()) return c;
    if (c.is_object() && c.value("type", "") == "function" && c.contains("name"))
        return {{"type", "function"}, {"function", {{"name", c["name"]}}}};
    bad("\"tool_choice\" must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
}

json response_format(const json& text) {
    if (!text.is_object()) bad("\"text\" must be an object");
    if (!text.contains("format") || text["format"].is_null()) return nullptr;
    const json& f = text["format"];
    const std::string type = f.is_object() ? f.value("type", "") : "";
    if (type == "text") return nullptr;
    if (type == "json_object") return {{"type", "json_object"}};
    if (type == "json_schema") {
        if (!f.contains("schema")) bad("\"text.format\" json_schema needs \"schema\"");
        return {{"type", "json_schema"}, {"json_schema", {{"name", f.value("name", "response")}, {"schema", f["schema"]}}}};
    }
    bad("\"text.format\" type \"" + type + "\" (text, json_object or json_schema)");
}

bool given(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

}  // namespace

json responses_input_items(const json& body) {
    if (!body.is_object() || !given(body, "input")) bad("\"input\" is required");
    const json& input = body["input"];
    if (input.is_string()) return json::array({{{"role", "user"}, {"content", input}}});
    if (!input.is_array()) bad("\"input\" must be a string or an array of items");
    return input;
}

json responses_conversation(json items, const json& response) {
    for (const json& item : response["output"]) {
        const std::string type = item.value("type", "");
        if (type == "message") {
            std::string text;
            for (const json& part : item["content"])
                if (part.value("type", "") == "output_text") text += part["text"].get<std::string>();
            items.push_back({{"role", "assistant"}, {"content", text}});
        } else if (type == "function_call") {
            items.push_back({{"type", "function_call"}, {"call_id", item["call_id"]}, {"name", item["name"]},
                             {"arguments", item["arguments"]}});
        }
    }
    return items;
}

void ResponseStore::put(const std::string& id, Entry e) {
    std::lock_guard<std::mutex> lk(m_);
    const auto it = entries_.find(id);
    if (it != entries_.end()) {
        order_.erase(it->second.second);
        entries_.erase(it);
    }
    order_.push_front(id);
    entries_.emplace(id, std::make_pair(std::move(e), order_.begin()));
    while (entries_.size() > capacity_) {
        entries_.erase(order_.back());
        order_.pop_back();
    }
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) {
    std::lock_guard<std::mutex> lk(m_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return std::nullopt;
    order_.splice(order_.begin(), order_, it->second.second);  // read: the most recent now
    return it->second.first;
}

bool ResponseStore::erase(const std::string& id) {
    std::lock_guard<std::mutex> lk(m_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return false;
    order_.erase(it->second.second);
    entries_.erase(it);
    return true;
}

json responses_continue(const json& body, ResponseStore& store) {
    if (!body.is_object() || !given(body, "previous_response_id")) return body;
    if (!body["previous_response_id"].is_string()) bad("\"previous_response_id\" must be a string");
    const std::string prev = body["previous_response_id"];
    const std::optional<ResponseStore::Entry> e = store.get(prev);
    if (!e) throw ApiError(404, "no stored response \"" + prev + "\" (made without \"store\", dropped, or deleted)");
    if (responses_running(e->object))
        throw ApiError(400, "the response \"" + prev + "\" is still running in the background: wait until GET "
                            "/v1/responses/" + prev + " says it is complete");
    json out = body;
    out.erase("previous_response_id");
    json input = e->conversation;
    for (const json& item : responses_input_items(body)) input.push_back(item);
    out["input"] = input;
    return out;
}

json responses_chat_body(const json& body) {
    if (!body.is_object()) bad("the request body must be a JSON object");
    if (given(body, "previous_response_id")) bad("\"previous_response_id\": no stored response to continue");
    if (given(body, "conversation")) bad("\"conversation\" is not supported (previous_response_id is)");
    if (given(body, "background")) {
        if (!body["background"].is_boolean()) bad("\"background\" must be true or false");
        if (body["background"] == true && given(body, "store") && body["store"] == false)
            bad("\"background\" needs \"store\": true (a background response is read with GET /v1/responses/{id})");
    }
    // include: message.output_text.logprobs only (the chat request's logprobs, top_logprobs N).
    bool logprobs = false;
    if (given(body, "include")) {
        if (!body["include"].is_array()) bad("\"include\" must be an array");
        for (const json& v : body["include"]) {
            if (v != "message.output_text.logprobs")
                bad("\"include\": " + v.dump() + " is not supported (message.output_text.logprobs is)");
            logprobs = true;
        }
    }
    if (given(body, "truncation") && body["truncation"] != "disabled") bad("\"truncation\" \"auto\" is not supported (disabled)");
    if (given(body, "reasoning") && body["reasoning"].is_object() && given(body["reasoning"], "effort"))
        bad("\"reasoning.effort\" is not supported (a template's switch: chat_template_kwargs enable_thinking)");
    if (given(body, "top_logprobs") && body["top_logprobs"] != 0 && !logprobs)
        bad("\"top_logprobs\" needs \"include\": [\"message.output_text.logprobs\"]");
    json chat = json::object();
    if (logprobs) {
        chat["logprobs"] = true;
        if (given(body, "top_logprobs")) chat["top_logprobs"] = body["top_logprobs"];
    }
    chat["messages"] = chat_messages(body);
    // The sampling fields, OpenAI's and vLLM's extras, as they are.
    for (const char* key : {"model", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                            "repetition_penalty", "parallel_tool_calls", "stream", "priority", "chat_template_kwargs",
                            "ignore_eos", "min_tokens", "stop", "stop_token_ids", "logit_bias", "skip_special_tokens",
                            "guided_json", "guided_choice", "guided_regex", "guided_grammar", "structured_outputs", "cache_salt"})
        if (given(body, key)) chat[key] = body[key];
    if (given(body, "max_output_tokens")) chat["max_tokens"] = body["max_output_tokens"];
    if (given(body, "tools")) chat["tools"] = chat_tools(body["tools"]);
    if (given(body, "tool_choice")) chat["tool_choice"] = chat_tool_choice(body["tool_choice"]);
    if (given(body, "text")) {
        const json f = response_format(body["text"]);
        if (!f.is_null()) chat["response_format"] = f;
    }
    return chat;
}

namespace {

json reasoning_item(const std::string& id, const std::string& text) {
    return {{"id", "rs_" + id}, {"type", "reasoning"}, {"summary", json::array()},
            {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

// logprobs: the chat response's logprobs.content entries ({token, logprob, bytes, top_logprobs},
// the Responses API's shape too), every generated token's (vLLM's), or none.
json text_part(const std::string& text, const json& logprobs = json::array()) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", logprobs}};
}

json message_item(const std::string& id, const std::string& text, const std::string& status, const json& logprobs = json::array()) {
    return {{"id", "msg_" + id}, {"type", "message"}, {"status", status}, {"role", "assistant"},
            {"content", status == "in_progress" ? json::array() : json::array({text_part(text, logprobs)})}};
}

json call_item(const std::string& id, size_t k, const std::string& call_id, const std::string& name, const std::string& arguments,
               const std::string& status) {
    return {{"id", "fc_" + id + "_" + std::to_string(k)}, {"type", "function_call"}, {"status", status},
            {"call_id", call_id}, {"name", name}, {"arguments", arguments}};
}

}  // namespace

json responses_object(const json& chat_response, const json& request, const std::string& id, int64_t reasoning_tokens) {
    json output = json::array();
    std::string finish = "stop";
    if (!chat_response["choices"].empty()) {
        const json& choice = chat_response["choices"][0];
        const json& msg = choice["message"];
        if (choice["finish_reason"].is_string()) finish = choice["finish_reason"];
        const std::string status = finish == "length" ? "incomplete" : "completed";
        if (msg.contains("reasoning_content") && msg["reasoning_content"].is_string())
            output.push_back(reasoning_item(id, msg["reasoning_content"]));
        const json lps = choice.contains("logprobs") && choice["logprobs"].is_object() ? choice["logprobs"]["content"] : json::array();
        if (msg["content"].is_string() && !msg["content"].get<std::string>().empty())
            output.push_back(message_item(id, msg["content"], status, lps));
        if (msg.contains("tool_calls"))
            for (size_t k = 0; k < msg["tool_calls"].size(); ++k) {
                const json& c = msg["tool_calls"][k];
                output.push_back(call_item(id, k, c["id"], c["function"]["name"], c["function"]["arguments"], "completed"));
            }
    }
    const bool cut = finish == "length";
    json usage = nullptr;
    if (chat_response.contains("usage") && chat_response["usage"].is_object()) {
        const json& u = chat_response["usage"];
        usage = {{"input_tokens", u["prompt_tokens"]},
                 {"input_tokens_details", {{"cached_tokens", u["prompt_tokens_details"]["cached_tokens"]}}},
                 {"output_tokens", u["completion_tokens"]},
                 {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
                 {"total_tokens", u["total_tokens"]}};
    }
    auto setting = [&](const char* key, const json& def) { return given(request, key) ? request[key] : def; };
    return {{"id", id},
            {"object", "response"},
            {"created_at", chat_response["created"]},
            {"status", cut ? "incomplete" : "completed"},
            {"background", setting("background", false)},
            {"error", nullptr},
            {"incomplete_details", cut ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
            {"instructions", setting("instructions", nullptr)},
            {"max_output_tokens", setting("max_output_tokens", nullptr)},
            {"model", chat_response["model"]},
            {"output", output},
            {"parallel_tool_calls", setting("parallel_tool_calls", true)},
            {"previous_response_id", setting("previous_response_id", nullptr)},
            {"store", setting("store", true)},
            {"temperature", setting("temperature", nullptr)},
            {"text", setting("text", {{"format", {{"type", "text"}}}})},
            {"tool_choice", setting("tool_choice", "auto")},
            {"tools", setting("tools", json::array())},
            {"top_p", setting("top_p", nullptr)},
            {"truncation", "disabled"},
            {"usage", usage},
            {"metadata", setting("metadata", json::object())}};
}

json responses_queued(const json& request, const std::string& id, int64_t created, const std::string& model) {
    json r = responses_object({{"created", created}, {"model", model}, {"choices", json::array()}}, request, id, 0);
    r["status"] = "queued";
    return r;
}

bool responses_running(const json& object) {
    return object.value("status", "") == "queued" || object.value("status", "") == "in_progress";
}

ResponsesStream::ResponsesStream(std::string id, int64_t created, std::string model, json request)
    : id_(std::move(id)), model_(std::move(model)), created_(created), request_(std::move(request)) {}

std::string ResponsesStream::event(const char* type, json data) {
    json e = {{"type", type}, {"sequence_number", seq_++}};
    for (auto& [k, v] : data.items()) e[k] = v;
    return std::string("event: ") + type + "\ndata: " + e.dump() + "\n\n";
}

json ResponsesStream::chat_message() const {
    json msg = {{"role", "assistant"}, {"content", content_.empty() ? json(nullptr) : json(content_)}};
    if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
    if (!calls_.empty()) {
        msg["tool_calls"] = json::array();
        for (const Call& c : calls_)
            msg["tool_calls"].push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    return msg;
}

std::string ResponsesStream::start(bool queued) {
    json r = responses_object({{"created", created_}, {"model", model_}, {"choices", json::array()}}, request_, id_, 0);
    r["status"] = queued ? "queued" : "in_progress";
    std::string out = event("response.created", {{"response", r}});
    r["status"] = "in_progress";
    return out + event("response.in_progress", {{"response", r}});  // (in this order: each takes the next number)
}

json ResponsesStream::item_json(Item kind, size_t call, bool done) const {
    const std::string status = !done ? "in_progress" : finish_ == "length" ? "incomplete" : "completed";
    if (kind == Item::Reasoning) {
        json it = reasoning_item(id_, reasoning_);
        if (!done) it["content"] = json::array();
        return it;
    }
    if (kind == Item::Message) return message_item(id_, content_, status, lps_);
    const Call& c = calls_[call];
    return call_item(id_, call, c.id, c.name, done ? c.arguments : "", done ? "completed" : "in_progress");
}

std::string ResponsesStream::open(Item kind, size_t call) {
    std::string out = close();
    open_ = kind;
    call_ = call;
    ++index_;
    out += event("response.output_item.added", {{"output_index", index_}, {"item", item_json(kind, call, false)}});
    if (kind == Item::Message)
        out += event("response.content_part.added",
                     {{"item_id", "msg_" + id_}, {"output_index", index_}, {"content_index", 0}, {"part", text_part("")}});
    return out;
}

std::string ResponsesStream::close() {
    std::string out;
    const json item = open_ == Item::None ? json(nullptr) : item_json(open_, call_, true);
    if (open_ == Item::Reasoning) {
        out += event("response.reasoning_text.done",
                     {{"item_id", item["id"]}, {"output_index", index_}, {"content_index", 0}, {"text", reasoning_}});
    } else if (open_ == Item::Message) {
        out += event("response.output_text.done", {{"item_id", item["id"]}, {"output_index", index_}, {"content_index", 0},
                                                   {"text", content_}, {"logprobs", lps_}});
        out += event("response.content_part.done",
                     {{"item_id", item["id"]}, {"output_index", index_}, {"content_index", 0}, {"part", text_part(content_, lps_)}});
    } else if (open_ == Item::Call) {
        out += event("response.function_call_arguments.done",
                     {{"item_id", item["id"]}, {"output_index", index_}, {"arguments", calls_[call_].arguments}});
    }
    if (open_ != Item::None) out += event("response.output_item.done", {{"output_index", index_}, {"item", item}});
    open_ = Item::None;
    return out;
}

std::string ResponsesStream::push(const json& chunk) {
    std::string out;
    if (!chunk.contains("choices") || chunk["choices"].empty()) return out;
    const json& choice = chunk["choices"][0];
    const json& delta = choice.contains("delta") ? choice["delta"] : json::object();
    if (choice.contains("logprobs") && choice["logprobs"].is_object())
        for (const json& e : choice["logprobs"]["content"]) {
            lps_.push_back(e);
            lps_pending_.push_back(e);
        }
    if (delta.contains("reasoning_content") && delta["reasoning_content"].is_string() &&
        !delta["reasoning_content"].get<std::string>().empty()) {
        if (open_ != Item::Reasoning) out += open(Item::Reasoning);
        const std::string d = delta["reasoning_content"];
        reasoning_ += d;
        out += event("response.reasoning_text.delta",
                     {{"item_id", "rs_" + id_}, {"output_index", index_}, {"content_index", 0}, {"delta", d}});
    }
    if (delta.contains("content") && delta["content"].is_string() && !delta["content"].get<std::string>().empty()) {
        if (open_ != Item::Message) out += open(Item::Message);
        const std::string d = delta["content"];
        content_ += d;
        out += event("response.output_text.delta", {{"item_id", "msg_" + id_}, {"output_index", index_}, {"content_index", 0},
                                                    {"delta", d}, {"logprobs", lps_pending_}});
        lps_pending_ = json::array();
    }
    if (delta.contains("tool_calls"))
        for (const json& e : delta["tool_calls"]) {
            const size_t k = e["index"];
            const json& f = e.contains("function") ? e["function"] : json::object();
            if (e.contains("id")) {  // a call's first entry: its id and name
                if (k >= calls_.size()) calls_.resize(k + 1);
                calls_[k].id = e["id"];
                calls_[k].name = f.value("name", "");
                out += open(Item::Call, k);
            }
            const std::string args = f.value("arguments", "");
            if (args.empty() || k >= calls_.size()) continue;
            calls_[k].arguments += args;
            if (open_ != Item::Call || call_ != k) continue;  // (calls stream one after another)
            out += event("response.function_call_arguments.delta",
                         {{"item_id", "fc_" + id_ + "_" + std::to_string(k)}, {"output_index", index_}, {"delta", args}});
        }
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
        finish_ = choice["finish_reason"];
        out += close();
    }
    return out;
}

std::string ResponsesStream::end(const json& usage, int64_t reasoning_tokens) {
    if (usage.is_null()) {  // aborted: response.failed, and no object to keep
        json r = responses_object({{"created", created_}, {"model", model_}, {"choices", json::array()}}, request_, id_, 0);
        r["status"] = "failed";
        r["error"] = {{"code", "server_error"}, {"message", "the server is shutting down"}};
        const std::string out = finish(r);
        final_ = nullptr;
        return out;
    }
    const json chat = {{"created", created_},
                       {"model", model_},
                       {"choices", json::array({{{"message", chat_message()}, {"logprobs", {{"content", lps_}}}, {"finish_reason", finish_}}})},
                       {"usage", usage}};
    return finish(responses_object(chat, request_, id_, reasoning_tokens));
}

std::string ResponsesStream::finish(const json& object) {
    std::string out = close();
    final_ = object;
    const std::string status = object.value("status", "");
    if (status == "cancelled") return out;
    return out + event(status == "incomplete" ? "response.incomplete" : status == "failed" ? "response.failed" : "response.completed",
                       {{"response", object}});
}

}  // namespace shardlm
