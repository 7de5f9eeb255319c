#include "cli/openai_api.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>

#include "core/error.h"
#include "runtime/classify.h"
#include "runtime/grammar.h"
#include "runtime/json_schema.h"
#include "tokenizer/fim.h"
#include "tokenizer/json_prefix.h"
#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& message) { throw ApiError(400, message); }

// "model", when given, must name the served model, or where `adapters` (the generation routes)
// one of the adapters (serve --lora-modules, or loaded while serving): returns its index, -1 for
// the base model. 404 otherwise, as OpenAI's API answers.
int64_t check_model(const json& body, const ApiLimits& lim, bool adapters = false) {
    if (!body.contains("model") || body["model"].is_null()) return -1;
    if (!body["model"].is_string()) bad("\"model\" must be a string");
    const std::string m = body["model"];
    if (m == lim.model) return -1;
    const auto list = adapter_names(lim);
    for (size_t i = 0; !m.empty() && i < list->size(); ++i)
        if ((*list)[i] == m) {
            if (adapters) return int64_t(i);
            throw ApiError(404, "The model `" + m + "` is a LoRA adapter: adapters serve the completion and chat routes only");
        }
    std::string names = "`" + lim.model + "`";
    for (const std::string& a : *list)
        if (!a.empty()) names += ", `" + a + "`";
    throw ApiError(404, "The model `" + m + "` does not exist (this server runs " + names + ")");
}

// A JSON array of token ids for `field` ("prompt", "input"), each within the vocabulary.
std::vector<int32_t> token_ids(const json& a, const char* field, int64_t vocab) {
    std::vector<int32_t> ids;
    for (const json& id : a) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab)
            bad(cat("\"", field, "\" token ids must be integers in [0, ", vocab, ")"));
        ids.push_back(id.get<int32_t>());
    }
    return ids;
}

// A text input of the embedding routes, after its instruction prefix.
std::vector<int32_t> encode_input(const Tokenizer& tok, const std::string& prefix, const std::string& text) {
    try {
        return tok.encode(prefix + text);
    } catch (const Error& e) {
        bad(e.what());
    }
}

// vLLM's truncate_prompt_tokens: k >= 1 keeps the last k tokens of each input, -1 the server's
// context's worth; absent or null: 0 (none kept out, a longer input is refused).
int64_t truncation(const json& body, const ApiLimits& lim) {
    if (!body.contains("truncate_prompt_tokens") || body["truncate_prompt_tokens"].is_null()) return 0;
    const json& t = body["truncate_prompt_tokens"];
    if (!t.is_number_integer() || t.get<int64_t>() == 0 || t.get<int64_t>() < -1 || t.get<int64_t>() > lim.ctx)
        bad(cat("\"truncate_prompt_tokens\" must be -1 (the server's context) or an integer in [1, ", lim.ctx, "]"));
    return t.get<int64_t>() == -1 ? lim.ctx : t.get<int64_t>();
}

void truncate_inputs(std::vector<std::vector<int32_t>>& inputs, int64_t keep) {
    if (keep <= 0) return;
    for (auto& in : inputs)
        if (int64_t(in.size()) > keep) in.erase(in.begin(), in.end() - keep);
}

// Every input of an embedding route has tokens and fits a slot's context.
void check_inputs_fit(const std::vector<std::vector<int32_t>>& inputs, const ApiLimits& lim) {
    for (size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i].empty()) bad(cat("input ", i, " has no tokens"));
        if (int64_t(inputs[i].size()) > lim.ctx)
            bad(cat("input ", i, " has ", inputs[i].size(), " tokens, more than the server's context of ", lim.ctx,
                    " positions"));
    }
}

// A number field within [lo, hi] (absent or null: `def`).
double number(const json& body, const char* key, double def, double lo, double hi) {
    if (!body.contains(key) || body[key].is_null()) return def;
    const json& v = body[key];
    if (!v.is_number()) bad(std::string("\"") + key + "\" must be a number");
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi)) bad(cat("\"", key, "\" must be in [", lo, ", ", hi, "], not ", v.dump()));
    return x;
}

bool boolean(const json& body, const char* key, bool def) {
    if (!body.contains(key) || body[key].is_null()) return def;
    if (!body[key].is_boolean()) bad(std::string("\"") + key + "\" must be true or false");
    return body[key].get<bool>();
}

int64_t integer(const json& body, const char* key, int64_t def, int64_t lo, int64_t hi) {
    if (!body.contains(key) || body[key].is_null()) return def;
    const json& v = body[key];
    if (!v.is_number_integer()) bad(std::string("\"") + key + "\" must be an integer");
    const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())
                          ? std::numeric_limits<int64_t>::max()
                          : v.get<int64_t>();
    if (x < lo || x > hi) bad(cat("\"", key, "\" must be in [", lo, ", ", hi, "], not ", v.dump()));
    return x;
}

// A message's text: a string, or an array of text parts joined with line breaks (as vLLM joins
// them); null where `null_ok` (an assistant turn with tool calls only).
std::string message_text(const json& c, const std::string& where, bool null_ok) {
    if (c.is_string()) return c;
    if (c.is_null() && null_ok) return "";
    if (!c.is_array()) bad(where + " must be a string or an array of text parts");
    std::string s;
    for (size_t i = 0; i < c.size(); ++i) {
        const json& part = c[i];
        if (!part.is_object() || part.value("type", json("")) != "text" || !part.contains("text") || !part["text"].is_string())
            bad(where + ": only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
        s += (i ? "\n" : "") + part["text"].get<std::string>();
    }
    return s;
}

// An assistant message's tool_calls: each {"id", "type": "function", "function": {"name", "arguments"}},
// the arguments a JSON object or its text, re-written as the template prints them (the id, which
// only Mistral's templates print, may be left out).
std::vector<ChatToolCall> message_calls(const json& calls, const std::string& where) {
    if (!calls.is_array()) bad(where + " must be an array");
    std::vector<ChatToolCall> out;
    for (const json& c : calls) {
        const std::string what = where + " entries must be {\"type\": \"function\", \"function\": {\"name\": ..., "
                                         "\"arguments\": ...}}";
        if (!c.is_object() || c.value("type", json("function")) != "function" || !c.contains("function") ||
            !c["function"].is_object())
            bad(what);
        const json& f = c["function"];
        if (!f.contains("name") || !f["name"].is_string()) bad(what);
        json args = f.value("arguments", json::object());
        if (args.is_string()) {
            if (json_text_depth(args.get<std::string>()) > kMaxJsonDepth)
                bad(where + ": the arguments of \"" + f["name"].get<std::string>() + "\" nest too deeply");
            try {
                args = json::parse(args.get<std::string>());
            } catch (const json::exception&) {
                bad(where + ": the arguments of \"" + f["name"].get<std::string>() + "\" are not JSON");
            }
        }
        if (!args.is_object()) bad(where + ": the arguments of \"" + f["name"].get<std::string>() + "\" must be a JSON object");
        const json id = c.value("id", json(nullptr));
        if (!id.is_null() && !id.is_string()) bad(where + ": a call's \"id\" must be a string");
        out.push_back({f["name"].get<std::string>(), python_json(args), id.is_string() ? id.get<std::string>() : ""});
    }
    return out;
}

// "tools": [{"type": "function", "function": {"name", "description", "parameters"}}], checked
// (the template lists them, keys in the request's order).
std::vector<json> request_tools(const json& body) {
    std::vector<json> out;
    if (!body.contains("tools") || body["tools"].is_null()) return out;
    const json& tools = body["tools"];
    if (!tools.is_array() || tools.size() > 128) bad("\"tools\" must be an array of up to 128 functions");
    for (const json& t : tools) {
        const char* what = "\"tools\" entries must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}";
        if (!t.is_object() || t.value("type", json("")) != "function" || !t.contains("function") || !t["function"].is_object())
            bad(what);
        const json& f = t["function"];
        if (!f.contains("name") || !f["name"].is_string()) bad(what);
        const std::string name = f["name"];
        if (name.empty() || name.size() > 64 ||
            name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos)
            bad("\"tools\": a function name is 1 to 64 letters, digits, '_' or '-', not \"" + name + "\"");
        if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
            bad("\"tools\": the parameters of \"" + name + "\" must be a JSON schema object");
        out.push_back(t);
    }
    return out;
}

// vLLM's chat_template_kwargs: the template variables shardlm's renderings read (others would
// change a Jinja rendering in ways shardlm does not follow: refused by name).
ChatKwargs chat_kwargs(const json& body) {
    ChatKwargs k;
    if (!body.contains("chat_template_kwargs") || body["chat_template_kwargs"].is_null()) return k;
    const json& kw = body["chat_template_kwargs"];
    if (!kw.is_object()) bad("\"chat_template_kwargs\" must be an object");
    for (auto it = kw.begin(); it != kw.end(); ++it) {
        if (it.key() == "enable_thinking") {
            if (!it.value().is_boolean()) bad("\"chat_template_kwargs\": \"enable_thinking\" must be true or false");
            k.enable_thinking = it.value().get<bool>();
        } else if (it.key() == "tools_in_user_message") {
            if (!it.value().is_boolean()) bad("\"chat_template_kwargs\": \"tools_in_user_message\" must be true or false");
            k.tools_in_user_message = it.value().get<bool>();
        } else if (it.key() == "date_string") {
            if (!it.value().is_string() || it.value().get<std::string>().empty() || it.value().get<std::string>().size() > 64)
                bad("\"chat_template_kwargs\": \"date_string\" must be a string of 1 to 64 bytes");
            k.date_string = it.value().get<std::string>();
        } else {
            bad("\"chat_template_kwargs\": \"" + it.key() +
                "\" is not supported (enable_thinking, date_string, tools_in_user_message)");
        }
    }
    return k;
}

// A chat request's prompt: "messages" (and "tools") rendered with the model's chat template.
struct ChatPrompt {
    std::vector<int32_t> ids;
    json functions = json::array();  // the request's tools' "function" objects
    // continue_final_message: the model goes on from the final message, inside its reasoning
    // when that opens a <think> it does not close (ApiRequest::continued).
    ApiRequest::Continued continued = ApiRequest::Continued::No;
    std::string last_assistant;  // the final message's content when it is the assistant's
};

ChatPrompt chat_prompt(const json& body, const Tokenizer& tok) {
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
        bad("\"messages\" must be a non-empty array");
    std::optional<std::string> system;
    std::vector<ChatMessage> messages;
    bool tool_turns = false;
    for (size_t i = 0; i < body["messages"].size(); ++i) {
        const json& m = body["messages"][i];
        const std::string where = cat("\"messages\"[", i, "]");
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
            bad("each message must be an object with a string \"role\" and its \"content\"");
        const std::string role = m["role"];
        const bool calls = role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null() &&
                           !(m["tool_calls"].is_array() && m["tool_calls"].empty());
        if (!m.contains("content") && !calls) bad(where + " has no \"content\"");
        const std::string content = message_text(m.value("content", json(nullptr)), where + ".content", calls);
        if (role == "system") {
            if (system || !messages.empty()) bad("a \"system\" message may only come first");
            system = content;
        } else if (role == "user" || role == "assistant" || role == "tool") {
            const json call_id = m.value("tool_call_id", json(nullptr));
            if (!call_id.is_null() && !call_id.is_string()) bad(where + ".tool_call_id must be a string");
            messages.emplace_back(role, content,
                                  calls ? message_calls(m["tool_calls"], where + ".tool_calls") : std::vector<ChatToolCall>{},
                                  role == "tool" && call_id.is_string() ? call_id.get<std::string>() : "");
            tool_turns = tool_turns || role == "tool" || calls;
        } else {
            bad("unsupported message role \"" + role + "\" (system, user, assistant, tool)");
        }
    }
    ChatPrompt p;
    const std::vector<json> tools = request_tools(body);
    for (size_t i = 0; i < tools.size(); ++i) p.functions.push_back(body["tools"][i]["function"]);
    if (!tok.has_chat_template()) bad("the model has no chat template: use /v1/completions");
    if ((!tools.empty() || tool_turns) && tok.chat_tools() == ChatTools::None)
        bad("this model's chat template has no tools block shardlm renders (Qwen2.5's, Qwen3's, Llama 3.1/3.2's or "
            "Mistral v3's): "
            "no \"tools\", tool calls or tool messages");
    // vLLM's continue_final_message (with add_generation_prompt false): the last message is the
    // start of the assistant's reply, which the model goes on with.
    ChatKwargs kwargs = chat_kwargs(body);
    const json cont = body.value("continue_final_message", json(false)), gen = body.value("add_generation_prompt", json(nullptr));
    if (!cont.is_boolean()) bad("\"continue_final_message\" must be true or false");
    if (!gen.is_null() && !gen.is_boolean()) bad("\"add_generation_prompt\" must be true or false");
    kwargs.continue_final_message = cont.get<bool>();
    if (kwargs.continue_final_message && gen == json(true))
        bad("\"continue_final_message\" and \"add_generation_prompt\" cannot both be true");
    if (!kwargs.continue_final_message && gen == json(false))
        bad("\"add_generation_prompt\": false is supported with \"continue_final_message\": true only");
    // The order of the turns is the template's to check (Llama 2's and Mistral's want them in turn):
    // an assistant turn last gets a new reply after it, or with continue_final_message goes on.
    if (kwargs.continue_final_message && tools.empty() && !tool_turns) {
        if (messages.empty() || messages.back().role != "assistant")
            bad("\"continue_final_message\": the last message must be the assistant's reply so far");
        if (messages.back().content.empty()) bad("\"continue_final_message\": the last message is empty, nothing to go on from");
        const std::string& c = messages.back().content;
        const size_t open = c.rfind("<think>"), close = c.rfind("</think>");
        p.continued = open != std::string::npos && (close == std::string::npos || close < open)
                          ? ApiRequest::Continued::InReasoning
                          : ApiRequest::Continued::InContent;
    }
    if (!messages.empty() && messages.back().role == "assistant") p.last_assistant = messages.back().content;
    try {
        p.ids = tok.encode(tok.apply_chat_template(system, messages, tools, kwargs), EncodeOptions{false});
    } catch (const Error& e) {
        bad(e.what());
    }
    return p;
}

// tool_choice (chat): "auto" (the default with tools), "none", "required", or {"type":
// "function", "function": {"name": ...}} naming one of them.
void tool_choice(const json& body, const json& functions, ApiRequest& r) {
    const json choice = body.value("tool_choice", json(nullptr));
    if (!choice.is_null() && functions.empty() && choice != "none") bad("\"tool_choice\" needs \"tools\"");
    if (choice.is_null() || choice == "auto") {
        r.tools = functions.empty() ? ApiRequest::Tools::None : ApiRequest::Tools::Auto;
    } else if (choice == "none") {
        r.tools = ApiRequest::Tools::None;
    } else if (choice == "required") {
        r.tools = ApiRequest::Tools::Required;
    } else if (choice.is_object() && choice.value("type", json("")) == "function" && choice.contains("function") &&
               choice["function"].is_object() && choice["function"].contains("name") &&
               choice["function"]["name"].is_string()) {
        r.tool_name = choice["function"]["name"];
        bool listed = false;
        for (const json& f : functions) listed = listed || f["name"] == r.tool_name;
        if (!listed) bad("\"tool_choice\" names \"" + r.tool_name + "\", which is not among \"tools\"");
        r.tools = ApiRequest::Tools::Named;
    } else {
        bad("\"tool_choice\" must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
            "{\"name\": ...}}");
    }
    const json parallel = body.value("parallel_tool_calls", json(nullptr));
    if (!parallel.is_null() && !parallel.is_boolean()) bad("\"parallel_tool_calls\" must be true or false");
    r.parallel_tool_calls = !parallel.is_boolean() || parallel.get<bool>();
}

// The JSON schema a Required or Named reply is held to: [{"name": one function, "parameters": its
// arguments}, ...] (one item without parallel_tool_calls), or the named function's arguments.
std::string tool_schema(const json& functions, const ApiRequest& r) {
    auto parameters = [](const json& f) {
        return f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"] : json{{"type", "object"}};
    };
    if (r.tools == ApiRequest::Tools::Named) {
        for (const json& f : functions)
            if (f["name"] == r.tool_name) return parameters(f).dump();
    }
    json calls = json::array();
    for (const json& f : functions)
        calls.push_back({{"type", "object"},
                         {"properties", {{"name", {{"const", f["name"]}}}, {"parameters", parameters(f)}}},
                         {"required", {"name", "parameters"}}});
    json items = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", calls}}}};
    if (!r.parallel_tool_calls) items["maxItems"] = 1;
    return items.dump();
}

// vLLM's structured outputs: guided_json, guided_choice, guided_regex and guided_grammar (its older
// fields; llama.cpp's "grammar" too), or structured_outputs {"json": ...} / {"choice": [...]} /
// {"regex": ...} / {"grammar": ...} (its newer one); one source of constraint per request,
// response_format's included.
void structured_outputs(const json& body, ApiRequest& r) {
    auto given = [&](const json& o, const char* k) { return o.contains(k) && !o[k].is_null(); };
    int sources = (r.json_object || !r.json_schema.empty()) ? 1 : 0;
    // A constraint compiled once here, its fault a 400.
    auto checked = [](const auto& compile) {
        try {
            compile();
        } catch (const Error& e) {
            bad(e.what());
        }
    };
    auto schema = [&](const json& v, const std::string& name) {
        if (!v.is_object() && !v.is_boolean() && !v.is_string()) bad("\"" + name + "\" must be a JSON schema (an object or its text)");
        r.json_schema = v.is_string() ? v.get<std::string>() : v.dump();
        checked([&] { compile_json_schema(r.json_schema, name); });
    };
    auto choice = [&](const json& v, const std::string& name) {
        if (!v.is_array() || v.empty() || v.size() > 1024) bad("\"" + name + "\" must be an array of 1 to 1024 strings");
        for (const json& c : v) {
            if (!c.is_string()) bad("\"" + name + "\" must be an array of 1 to 1024 strings");
            r.guided_choice.push_back(c);
        }
        checked([&] { choice_schema(r.guided_choice, name); });
    };
    auto regex = [&](const json& v, const std::string& name) {
        if (!v.is_string() || v.get<std::string>().empty()) bad("\"" + name + "\" must be a regular expression (a string)");
        r.guided_regex = v;
        checked([&] { regex_schema(r.guided_regex, name); });
    };
    auto grammar = [&](const json& v, const std::string& name) {
        if (!v.is_string() || v.get<std::string>().empty()) bad("\"" + name + "\" must be a GBNF grammar (a string)");
        r.guided_grammar = v;
        checked([&] { compile_grammar(r.guided_grammar, name); });
    };
    for (const char* k : {"guided_grammar", "grammar"})  // (vLLM's name, llama.cpp's)
        if (given(body, k)) {
            ++sources;
            grammar(body[k], k);
        }
    if (given(body, "guided_regex")) {
        ++sources;
        regex(body["guided_regex"], "guided_regex");
    }
    if (given(body, "guided_json")) {
        ++sources;
        schema(body["guided_json"], "guided_json");
    }
    if (given(body, "guided_choice")) {
        ++sources;
        choice(body["guided_choice"], "guided_choice");
    }
    if (given(body, "structured_outputs")) {
        const json& so = body["structured_outputs"];
        if (!so.is_object()) bad("\"structured_outputs\" must be an object");
        for (auto it = so.begin(); it != so.end(); ++it) {
            if (it.value().is_null()) continue;
            const std::string k = it.key();
            ++sources;
            if (k == "json") schema(it.value(), "structured_outputs.json");
            else if (k == "choice") choice(it.value(), "structured_outputs.choice");
            else if (k == "regex") regex(it.value(), "structured_outputs.regex");
            else if (k == "grammar") grammar(it.value(), "structured_outputs.grammar");
            else bad("\"structured_outputs." + k + "\" is not supported by shardlm serve (json, choice, regex and grammar are)");
        }
    }
    if (sources > 1)
        bad("one constraint per request: response_format (json_object, json_schema), guided_json, guided_choice, "
            "guided_regex, guided_grammar (grammar) or structured_outputs");
}
}  // namespace

std::shared_ptr<const std::vector<std::string>> adapter_names(const ApiLimits& lim) {
    auto list = std::atomic_load(&lim.adapters);
    return list ? list : std::make_shared<const std::vector<std::string>>();
}

ApiRequest parse_api_request(const json& body, bool chat, const Tokenizer& tok, const ApiLimits& lim) {
    if (!body.is_object()) bad("the request body must be a JSON object");
    const int64_t adapter = check_model(body, lim, true);
    for (const char* key : {"echo", "best_of", "suffix", "functions", "function_call"}) {
        if (!body.contains(key) || body[key].is_null() || body[key] == false) continue;
        if (std::string(key) == "echo" || (std::string(key) == "suffix" && !chat)) continue;
        bad(std::string("\"") + key + "\" is not supported by shardlm serve" + (chat ? "'s chat API" : ""));
    }
    // vLLM's fields that would change the reply: refused by name rather than ignored, as other
    // unknown fields are.
    for (const char* key : {"logits_processors"}) {
        const json v = body.value(key, json(nullptr));
        if (v.is_null() || v == false || (v.is_array() && v.empty())) continue;
        bad(std::string("\"") + key + "\" (vLLM's) is not supported by shardlm serve");
    }
    ApiRequest r;
    r.chat = chat;
    r.adapter = adapter;
    r.model = adapter >= 0 ? (*adapter_names(lim))[size_t(adapter)] : lim.model;
    r.n = integer(body, "n", 1, 1, kMaxApiN);
    if (chat) {
        const json lp = body.value("logprobs", json(nullptr));
        if (!lp.is_null() && !lp.is_boolean()) bad("\"logprobs\" must be true or false");
        const bool want = lp.is_boolean() && lp.get<bool>();
        const int64_t top = integer(body, "top_logprobs", -1, 0, kMaxApiLogprobs);
        if (top >= 0 && !want) bad("\"top_logprobs\" needs \"logprobs\": true");
        r.logprobs = want ? std::max<int64_t>(top, 0) : -1;
    } else if (!(body.contains("logprobs") && body["logprobs"] == false)) {
        if (body.contains("top_logprobs") && !body["top_logprobs"].is_null())
            bad("\"top_logprobs\" is the chat API's; completions take \"logprobs\": N");
        r.logprobs = integer(body, "logprobs", -1, 0, kMaxApiLogprobs);
    }
    // vLLM's prompt_logprobs: 0-20, not streamed (as vLLM's).
    r.prompt_lps = integer(body, "prompt_logprobs", -1, 0, kMaxApiLogprobs);
    if (r.prompt_lps >= 0 && body.value("stream", false) == true) bad("\"prompt_logprobs\" with \"stream\" is not supported");
    std::vector<std::string> texts;  // completions: the prompts given as text ("" for ids)
    json functions = json::array();  // chat: the tools' functions
    std::string last_assistant;      // chat: the final message's content when it is the assistant's
    if (chat) {
        const ChatPrompt cp = chat_prompt(body, tok);
        r.prompts = {cp.ids};
        functions = cp.functions;
        tool_choice(body, functions, r);
        r.tool_format = tok.chat_tools();
        r.reasoning = lim.reasoning;
        r.continued = cp.continued;
        last_assistant = cp.last_assistant;
        const int32_t open = tok.token_to_id("<think>"), close = tok.token_to_id("</think>");
        if (r.reasoning != ReasoningParser::None && open >= 0 && close >= 0 && open < lim.vocab && close < lim.vocab &&
            open != close) {
            r.think_open = open;
            r.think_close = close;
            r.think_first = r.reasoning == ReasoningParser::DeepSeekR1;
        }
        // A continued reply is already in its content or its reasoning: the reply does not open
        // with <think>, and a JSON constraint holds from the first token or after </think>.
        if (r.continued == ApiRequest::Continued::InContent) r.think_open = r.think_close = -1, r.think_first = false;
        if (r.continued == ApiRequest::Continued::InReasoning && r.think_close >= 0) r.think_first = true;
    } else {
        for (const char* key : {"tools", "tool_choice", "chat_template_kwargs"})
            if (body.contains(key) && !body[key].is_null()) bad(std::string("\"") + key + "\" is the chat API's");
        if (!body.contains("prompt")) bad("\"prompt\" is required");
        const json& p = body["prompt"];
        auto ids_of = [&](const json& a) { return token_ids(a, "prompt", lim.vocab); };
        const char* form = "\"prompt\" must be a string, an array of token ids, or a list of either";
        if (p.is_string()) {
            texts.push_back(p.get<std::string>());
        } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
            texts.emplace_back();
            r.prompts.push_back(ids_of(p));
        } else if (p.is_array() && !p.empty()) {  // a batch: every entry of one kind
            const bool strings = p[0].is_string();
            for (const json& e : p) {
                if (strings ? !e.is_string() : !e.is_array()) bad(form);
                texts.push_back(strings ? e.get<std::string>() : std::string());
                if (!strings) r.prompts.push_back(ids_of(e));
            }
        } else {
            bad(form);
        }
        if (body.contains("suffix") && !body["suffix"].is_null()) {  // fill in the middle
            if (!body["suffix"].is_string()) bad("\"suffix\" must be a string");
            if (!r.prompts.empty()) bad("\"suffix\" needs the prompt as text, not token ids");
            if (body.contains("echo") && body["echo"] == true) bad("\"suffix\" with \"echo\" is not supported");
            const FimTokens f = fim_tokens(tok);
            if (!f.family)
                bad(cat("\"suffix\" (fill in the middle) needs a code model's FIM tokens, and this tokenizer has none (",
                        fim_families_known(), ")"));
            for (const std::string& t : texts) r.prompts.push_back(encode_fim(tok, f, t, body["suffix"].get<std::string>()));
            r.fim_stops = f.stops;
        }
        if (r.prompts.empty())
            for (const std::string& t : texts) r.prompts.push_back(tok.encode(t));
    }
    // vLLM's truncate_prompt_tokens: each prompt's last k tokens (-1: the context's worth; chat's
    // rendered prompt loses its start). Not with suffix, whose prompt begins with FIM markers.
    const int64_t keep = truncation(body, lim);
    if (keep > 0 && body.contains("suffix") && !body["suffix"].is_null())
        bad("\"truncate_prompt_tokens\" with \"suffix\" is not supported");
    std::vector<bool> cut;  // which prompts lost tokens (echo then shows what is left)
    for (const std::vector<int32_t>& p : r.prompts) cut.push_back(keep > 0 && int64_t(p.size()) > keep);
    truncate_inputs(r.prompts, keep);
    if (int64_t(r.prompts.size()) * r.n > kMaxApiChoices)
        bad(cat(r.prompts.size(), " prompts x \"n\" ", r.n, " asks for more than ", kMaxApiChoices, " choices"));
    int64_t longest = 0;
    for (const std::vector<int32_t>& ids : r.prompts) {
        if (ids.empty()) bad("a prompt is empty");
        longest = std::max(longest, int64_t(ids.size()));
    }
    const int64_t n = longest;
    if (body.contains("echo") && !body["echo"].is_null()) {
        if (!body["echo"].is_boolean()) bad("\"echo\" must be true or false");
        r.echo = body["echo"];
        if (chat && r.echo) r.echo_text = last_assistant;
        for (size_t i = 0; r.echo && !chat && i < r.prompts.size(); ++i)
            r.prompt_texts.push_back(texts[i].empty() || cut[i] ? tok.decode(r.prompts[i]) : texts[i]);
    }
    if (n >= lim.ctx)
        bad(cat("This model's maximum context length is ", lim.ctx, " tokens; the prompt has ", n));
    const char* max_key = chat && body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    // 0 only with echo or prompt_logprobs: the prompt is scored, nothing generated.
    r.max_tokens = integer(body, max_key, chat ? lim.ctx - n : 16, (r.echo && !chat) || r.prompt_lps >= 0 ? 0 : 1,
                           std::numeric_limits<int64_t>::max());
    if (r.max_tokens > lim.ctx - n)
        bad(cat("This model's maximum context length is ", lim.ctx, " tokens; the prompt has ", n, " and \"", max_key,
                "\" asks for ", r.max_tokens, " more"));
    if (body.contains("ignore_eos") && !body["ignore_eos"].is_null()) {
        if (!body["ignore_eos"].is_boolean()) bad("\"ignore_eos\" must be true or false");
        r.ignore_eos = body["ignore_eos"];
    }
    r.min_tokens = integer(body, "min_tokens", 0, 0, r.max_tokens);
    r.priority = integer(body, "priority", 0, -(int64_t(1) << 53), int64_t(1) << 53);
    if (body.contains("cache_salt") && !body["cache_salt"].is_null()) {
        if (!body["cache_salt"].is_string() || body["cache_salt"].get<std::string>().empty())
            bad("\"cache_salt\" must be a non-empty string");
        r.cache_salt = body["cache_salt"];
    }
    if (body.contains("stop_token_ids") && !body["stop_token_ids"].is_null()) {
        const json& ids = body["stop_token_ids"];
        const std::string what = cat("\"stop_token_ids\" must be an array of up to ", kMaxApiStopTokenIds, " token ids in [0, ",
                                     tok.vocab_size(), ")");
        if (!ids.is_array() || int64_t(ids.size()) > kMaxApiStopTokenIds) bad(what);
        for (const json& id : ids) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= tok.vocab_size()) bad(what);
            r.stop_token_ids.push_back(id.get<int32_t>());
        }
    }
    for (const int32_t id : r.fim_stops)
        if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), id) == r.stop_token_ids.end()) r.stop_token_ids.push_back(id);
    if (int64_t(r.stop_token_ids.size()) > kMaxApiStopTokenIds)
        bad(cat("\"stop_token_ids\" and the FIM separators of \"suffix\" (", r.fim_stops.size(), ") are more than ",
                kMaxApiStopTokenIds, " token ids"));
    SamplerOptions& so = r.sampler;
    const GenerationDefaults& d = lim.defaults;  // the model's generation_config.json, else the API's
    so.temperature = float(number(body, "temperature", d.temperature.value_or(1.0), 0.0, 100.0));
    so.top_p = float(number(body, "top_p", d.top_p.value_or(1.0), 0.0, 1.0));
    if (so.top_p == 0.0f) bad("\"top_p\" must be in (0, 1]");
    const int64_t top_k = integer(body, "top_k", std::min(d.top_k.value_or(0), lim.vocab), -1, lim.vocab);
    so.top_k = top_k < 0 ? 0 : top_k;
    so.min_p = float(number(body, "min_p", d.min_p.value_or(0.0), 0.0, 1.0));
    const int64_t seed = integer(body, "seed", 0, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    so.seed = uint64_t(seed);
    so.presence_penalty = float(number(body, "presence_penalty", 0.0, -2.0, 2.0));
    so.frequency_penalty = float(number(body, "frequency_penalty", 0.0, -2.0, 2.0));
    so.repetition_penalty = float(number(body, "repetition_penalty", d.repetition_penalty.value_or(1.0), 0.01, 100.0));
    so.penalty_last_n = lim.penalty_last_n;
    if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
        // {"token id": bias}: ids as decimal strings (JSON keys), biases in [-100, 100].
        const json& lb = body["logit_bias"];
        if (!lb.is_object()) bad("\"logit_bias\" must be an object of token ids to numbers");
        if (int64_t(lb.size()) > kMaxApiLogitBias) bad(cat("\"logit_bias\" may bias at most ", kMaxApiLogitBias, " tokens"));
        for (const auto& [key, v] : lb.items()) {
            int64_t id = -1;
            if (!key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos)
                id = std::stoll(key);
            if (id < 0 || id >= lim.vocab)
                bad(cat("\"logit_bias\": \"", key, "\" is not a token id of this model (0 to ", lim.vocab - 1, ")"));
            if (!v.is_number() || !(v.get<double>() >= -100.0 && v.get<double>() <= 100.0))
                bad(cat("\"logit_bias\": the bias of token ", id, " must be a number in [-100, 100]"));
            so.logit_bias.emplace_back(int32_t(id), v.get<float>());
        }
    }
    if (body.contains("allowed_token_ids") && !body["allowed_token_ids"].is_null()) {
        const json& ids = body["allowed_token_ids"];
        if (!ids.is_array() || ids.empty()) bad("\"allowed_token_ids\" must be a non-empty array of token ids");
        r.allowed_ids = token_ids(ids, "allowed_token_ids", lim.vocab);
        std::sort(r.allowed_ids.begin(), r.allowed_ids.end());
        r.allowed_ids.erase(std::unique(r.allowed_ids.begin(), r.allowed_ids.end()), r.allowed_ids.end());
    }
    if (body.contains("bad_words") && !body["bad_words"].is_null()) {
        // As vLLM reads them: each word's tokens at the start of a text and after a space (its
        // leading white space dropped), without special tokens; either sequence is banned.
        const json& words = body["bad_words"];
        const std::string what = cat("\"bad_words\" must be an array of up to ", kMaxApiBadWords, " strings");
        if (!words.is_array() || int64_t(words.size()) > kMaxApiBadWords) bad(what);
        for (const json& w : words) {
            if (!w.is_string()) bad(what);
            const std::string word = w.get<std::string>();
            const size_t from = word.find_first_not_of(" \t\r\n");
            if (from == std::string::npos) bad("a \"bad_words\" entry is empty");
            for (const std::string& form : {word.substr(from), " " + word.substr(from)}) {
                std::vector<int32_t> ids;
                try {
                    ids = tok.encode(form, {false});
                } catch (const Error& e) {
                    bad(cat("\"bad_words\": ", e.what()));
                }
                for (const int32_t id : ids)
                    if (id >= lim.vocab) bad(cat("\"bad_words\": \"", word, "\" has token ", id, ", past the model's vocabulary"));
                if (!ids.empty() && std::find(r.bad_words.begin(), r.bad_words.end(), ids) == r.bad_words.end())
                    r.bad_words.push_back(ids);
            }
        }
    }
    if (body.contains("stop") && !body["stop"].is_null()) {
        const json& s = body["stop"];
        if (s.is_string()) r.stop.push_back(s);
        else if (s.is_array() && s.size() <= 4)
            for (const json& x : s) {
                if (!x.is_string()) bad("\"stop\" must be a string or an array of up to 4 strings");
                r.stop.push_back(x);
            }
        else bad("\"stop\" must be a string or an array of up to 4 strings");
        for (const std::string& x : r.stop)
            if (x.empty()) bad("a \"stop\" string is empty");
    }
    r.include_stop_str = boolean(body, "include_stop_str_in_output", false);
    r.tokens_as_ids = boolean(body, "return_tokens_as_token_ids", false);
    r.return_token_ids = boolean(body, "return_token_ids", false);
    r.skip_special_tokens = boolean(body, "skip_special_tokens", true);
    // Calls in the template's format may be marked by special tokens (Mistral's [TOOL_CALLS],
    // Llama's <|python_tag|>): kept in the text while tools are on, as vLLM's tool parsers do.
    // So are the reasoning parser's tags where they are special tokens: its reader finds them in
    // the text (vLLM's reads the ids).
    if (r.tools == ApiRequest::Tools::Auto) r.skip_special_tokens = false;
    if (r.reasoning != ReasoningParser::None)
        for (const char* tag : {"<think>", "</think>"}) {
            const int32_t id = tok.token_to_id(tag);
            if (id >= 0 && tok.is_special(id)) r.skip_special_tokens = false;
        }
    if (body.contains("stream") && !body["stream"].is_null()) {
        if (!body["stream"].is_boolean()) bad("\"stream\" must be true or false");
        r.stream = body["stream"];
    }
    // response_format: "text" (the default), "json_object" (JSON mode) or "json_schema"
    // (structured output: {"json_schema": {"name": ..., "schema": {...}}}; runtime/json_mode.h).
    if (body.contains("response_format") && !body["response_format"].is_null()) {
        const json& f = body["response_format"];
        if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
            bad("\"response_format\" must be an object with a \"type\"");
        const std::string type = f["type"];
        if (type == "json_object") {
            r.json_object = true;
        } else if (type == "json_schema") {
            if (!f.contains("json_schema") || !f["json_schema"].is_object() || !f["json_schema"].contains("schema"))
                bad("\"response_format\" json_schema needs \"json_schema\": {\"name\": ..., \"schema\": {...}}");
            r.json_schema = f["json_schema"]["schema"].dump();
            try {
                compile_json_schema(r.json_schema, "response_format.json_schema.schema");  // checked here, run on every rank
            } catch (const Error& e) {
                bad(e.what());
            }
        } else if (type != "text") {
            bad("\"response_format\" type \"" + type + "\" (text, json_object or json_schema)");
        }
    }
    structured_outputs(body, r);
    // OpenAI's stream_options: include_usage, and vLLM's continuous_usage_stats (usage in every
    // chunk, with include_usage only, as vLLM's; other keys are ignored, as unknown fields are).
    if (body.contains("stream_options") && !body["stream_options"].is_null()) {
        const json& so_json = body["stream_options"];
        if (!r.stream) bad("\"stream_options\" needs \"stream\": true");
        if (!so_json.is_object()) bad("\"stream_options\" must be an object");
        const json usage = so_json.value("include_usage", json(nullptr));
        if (!usage.is_null() && !usage.is_boolean()) bad("\"stream_options.include_usage\" must be true or false");
        r.include_usage = usage.is_boolean() && usage.get<bool>();
        const json continuous = so_json.value("continuous_usage_stats", json(nullptr));
        if (!continuous.is_null() && !continuous.is_boolean())
            bad("\"stream_options.continuous_usage_stats\" must be true or false");
        r.continuous_usage = r.include_usage && continuous == json(true);
    }
    // (guided_choice may hold a reply to raw text, a tool call included; JSON cannot be one.)
    if (r.tools == ApiRequest::Tools::Auto && (r.json_object || !r.json_schema.empty()))
        bad("\"tools\" with tool_choice \"auto\" and a JSON constraint (response_format, guided_json) do not go "
            "together: a tool call is no JSON value");
    if (r.tools == ApiRequest::Tools::Required || r.tools == ApiRequest::Tools::Named) {
        if (r.json_object || !r.json_schema.empty() || !r.guided_choice.empty() || !r.guided_regex.empty() ||
            !r.guided_grammar.empty())
            bad("tool_choice \"required\" or a named function holds the reply to its calls: no other constraint "
                "(response_format, guided_json, guided_choice, guided_regex, guided_grammar) with it");
        r.json_schema = tool_schema(functions, r);
        try {
            compile_json_schema(r.json_schema, "the parameters of the tools");
        } catch (const Error& e) {
            bad(e.what());
        }
    }
    // use_beam_search: beams scored by their log-probabilities (after penalties and logit_bias;
    // temperature, top_p, top_k and min_p do not apply), ending at an end-of-sequence or stop id.
    r.beam = boolean(body, "use_beam_search", false);
    r.length_penalty = number(body, "length_penalty", 1.0, -10.0, 10.0);
    if (!r.beam && r.length_penalty != 1.0) bad("\"length_penalty\" is beam search's: it needs \"use_beam_search\": true");
    if (r.beam) {
        auto refuse = [](const char* what) { bad(cat("\"use_beam_search\" with ", what, " is not supported")); };
        if (r.stream) refuse("\"stream\"");
        if (r.echo) refuse("\"echo\"");
        if (r.logprobs >= 0) refuse("\"logprobs\"");
        if (r.prompt_lps >= 0) refuse("\"prompt_logprobs\"");
        if (!r.stop.empty()) refuse("\"stop\" strings");
        if (r.min_tokens > 0) refuse("\"min_tokens\"");
        if (!r.allowed_ids.empty() || !r.bad_words.empty()) refuse("\"allowed_token_ids\" or \"bad_words\"");
        if (r.tools != ApiRequest::Tools::None) refuse("\"tools\"");
        if (r.json_object || !r.json_schema.empty() || !r.guided_choice.empty() || !r.guided_regex.empty() ||
            !r.guided_grammar.empty())
            refuse("a constraint (response_format, guided_json, guided_choice, guided_regex, guided_grammar)");
        if (2 * r.n > lim.vocab) bad(cat("\"use_beam_search\": \"n\" ", r.n, " needs twice as many tokens in the vocabulary"));
    }
    try {
        Sampler check(so, 0);  // the sampler's own checks, before any rank runs it
    } catch (const Error& e) {
        bad(e.what());
    }
    return r;
}

std::string finish_reason(const std::string& stop_reason) { return stop_reason == "length" ? "length" : "stop"; }

namespace {
std::string token_text(const Tokenizer& tok, int32_t id) { return utf8_lossy(tok.token_bytes(id)); }
}  // namespace

size_t logprobs_text_bytes(const Tokenizer& tok, const std::vector<TokenLogprobs>& lps) {
    size_t n = 0;
    for (const TokenLogprobs& t : lps) n += token_text(tok, t.token.id).size();
    return n;
}

// A logprob as the API shows it: at least -9999, as vLLM clamps it, so that a constraint's masked
// ids (-inf) are a number, not JSON's null (which nlohmann writes for an infinity).
double api_logprob(float l) { return std::max(double(l), -9999.0); }

size_t tokens_text_bytes(const Tokenizer& tok, const std::vector<int32_t>& ids) {
    size_t n = 0;
    for (const int32_t id : ids) n += token_text(tok, id).size();
    return n;
}

json api_logprobs(const ApiRequest& r, const Tokenizer& tok, const std::vector<TokenLogprobs>& lps, size_t offset,
                  const std::vector<int32_t>* echo_prompt, const std::vector<TokenLogprobs>* prompt_lps) {
    if (r.logprobs < 0) return nullptr;
    // vLLM's return_tokens_as_token_ids: "token_id:N" in place of a token's text (its offsets
    // stay those of the text).
    auto shown = [&](int32_t id) { return r.tokens_as_ids ? "token_id:" + std::to_string(id) : token_text(tok, id); };
    if (r.chat) {
        auto entry = [&](const Logprob& l) {
            const std::string raw = r.tokens_as_ids ? shown(l.id) : tok.token_bytes(l.id);
            json bytes = json::array();
            for (const char c : raw) bytes.push_back(int(static_cast<unsigned char>(c)));
            return json{{"token", utf8_lossy(raw)}, {"logprob", api_logprob(l.logprob)}, {"bytes", bytes}};
        };
        json content = json::array();
        for (const TokenLogprobs& t : lps) {
            json e = entry(t.token);
            e["top_logprobs"] = json::array();
            for (const Logprob& l : t.top) e["top_logprobs"].push_back(entry(l));
            content.push_back(e);
        }
        return {{"content", content}};
    }
    json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
    if (echo_prompt && !echo_prompt->empty()) {  // echo: the first prompt token has nothing before it
        tokens.push_back(shown((*echo_prompt)[0]));
        token_logprobs.push_back(nullptr);
        top.push_back(nullptr);
        offsets.push_back(offset);
        offset += token_text(tok, (*echo_prompt)[0]).size();
    }
    std::vector<TokenLogprobs> all;
    if (prompt_lps) all = *prompt_lps;
    all.insert(all.end(), lps.begin(), lps.end());
    for (const TokenLogprobs& t : all) {
        const std::string s = shown(t.token.id);
        tokens.push_back(s);
        token_logprobs.push_back(api_logprob(t.token.logprob));
        json best = json::object();
        // (The prompt's entries may list more than "logprobs" asks: prompt_logprobs's N.)
        for (size_t i = 0; i < t.top.size() && int64_t(i) < r.logprobs; ++i) {
            const Logprob& l = t.top[i];
            const std::string k = shown(l.id);
            if (!best.contains(k)) best[k] = api_logprob(l.logprob);  // the more probable of two ids with one text
        }
        if (!best.contains(s)) best[s] = api_logprob(t.token.logprob);  // the sampled token is always listed
        top.push_back(best);
        offsets.push_back(offset);
        offset += token_text(tok, t.token.id).size();
    }
    return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

json api_prompt_logprobs(const ApiRequest& r, const Tokenizer& tok, const std::vector<TokenLogprobs>& prompt_lps) {
    json out = json::array({nullptr});
    for (const TokenLogprobs& t : prompt_lps) {
        json e = json::object();
        e[std::to_string(t.token.id)] = {{"logprob", api_logprob(t.token.logprob)}, {"rank", t.rank},
                                         {"decoded_token", token_text(tok, t.token.id)}};
        for (size_t i = 0; i < t.top.size() && int64_t(i) < r.prompt_lps; ++i) {
            const std::string key = std::to_string(t.top[i].id);
            if (!e.contains(key))
                e[key] = {{"logprob", api_logprob(t.top[i].logprob)}, {"rank", i + 1}, {"decoded_token", token_text(tok, t.top[i].id)}};
        }
        out.push_back(e);
    }
    return out;
}

namespace {
// A request's usage: each prompt counted once, with the most of it any of its choices took from
// the cache.
json api_usage(const ApiRequest& r, const std::vector<ApiChoice>& choices) {
    int64_t completion_tokens = 0, cached_tokens = 0, prompt_tokens = 0;
    for (const std::vector<int32_t>& p : r.prompts) prompt_tokens += int64_t(p.size());
    std::vector<int64_t> cached(r.prompts.size(), 0);
    for (size_t c = 0; c < choices.size(); ++c) {
        completion_tokens += choices[c].completion_tokens;
        cached[c / size_t(r.n)] = std::max(cached[c / size_t(r.n)], choices[c].cached_tokens);
    }
    for (const int64_t k : cached) cached_tokens += k;
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

json envelope(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model, json choices,
              bool chunk) {
    return {{"id", id},
            {"object", r.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", std::move(choices)}};
}

// Mistral's templates take 9-character call ids back (vLLM draws them at random): nine base-62
// digits of a hash of the response id, its creation time, the choice and the call, so that they
// differ between calls, responses and server runs.
std::string mistral_call_id(const std::string& id, int64_t created, size_t choice, size_t k) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a, then a 64-bit finaliser to spread it over the digits
    for (const char ch : cat(id, "/", created, "/", choice, "/", k)) h = (h ^ uint8_t(ch)) * 1099511628211ull;
    h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    std::string s(9, '0');
    for (char& ch : s) {
        ch = digits[h % 62];
        h /= 62;
    }
    return s;
}

// A reply's calls as OpenAI's tool_calls entries (ids from the response's and the choice's);
// `with_index` for a stream's delta.
// A call's id: Mistral's templates want 9 characters, others take OpenAI's form.
std::string call_id(const ApiRequest& r, const std::string& id, int64_t created, size_t choice, size_t k) {
    return r.tool_format == ChatTools::MistralJson ? mistral_call_id(id, created, choice, k)
                                                   : cat("call_", id, "_", choice, "_", k);
}

json tool_calls_json(const ApiRequest& r, const std::string& id, int64_t created, size_t choice,
                     const ParsedToolCalls& calls, bool with_index) {
    json out = json::array();
    for (size_t k = 0; k < calls.calls.size() && (r.parallel_tool_calls || k == 0); ++k) {
        json c;
        if (with_index) c["index"] = k;
        c["id"] = call_id(r, id, created, choice, k);
        c["type"] = "function";
        c["function"] = {{"name", calls.calls[k].name}, {"arguments", calls.calls[k].arguments}};
        out.push_back(c);
    }
    return out;
}
}  // namespace

json api_choice_usage(const ApiRequest& r, size_t choice, int64_t completion_tokens) {
    const int64_t prompt_tokens = int64_t(r.prompt_of(choice).size());
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}};
}

json api_response(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                  const std::vector<ApiChoice>& choices, const Tokenizer& tok) {
    json out = json::array();
    for (size_t c = 0; c < choices.size(); ++c) {
        const ApiChoice& ch = choices[c];
        const size_t p = c / size_t(r.n);
        const std::string whole = (r.echo && !r.chat ? r.prompt_texts[p] : std::string()) + ch.text;
        const ReasoningSpan rs = reasoning_span(r, whole, true);
        const std::string text = whole.substr(rs.content);  // the content: past the reasoning
        json choice = {{"index", c}};
        ParsedToolCalls calls = api_tool_calls(r, text);
        calls.content = r.echo_text + calls.content;  // chat echo: the assistant's message so far first
        if (calls.called) {
            choice["message"] = {{"role", "assistant"},
                                 {"content", calls.content.empty() ? json(nullptr) : json(calls.content)},
                                 {"tool_calls", tool_calls_json(r, id, created, c, calls, false)}};
        } else if (r.chat) {
            choice["message"] = {{"role", "assistant"},
                                 {"content", r.reasoning != ReasoningParser::None && calls.content.empty() ? json(nullptr) : json(calls.content)}};
        } else {
            choice["text"] = text;
        }
        if (r.reasoning != ReasoningParser::None)
            choice["message"]["reasoning_content"] =
                rs.end > rs.begin ? json(whole.substr(rs.begin, rs.end - rs.begin)) : json(nullptr);
        choice["logprobs"] = r.echo ? api_logprobs(r, tok, ch.lps, 0, &r.prompts[p], &ch.prompt_lps) : api_logprobs(r, tok, ch.lps);
        choice["finish_reason"] = calls.called ? "tool_calls" : ch.finish;
        if (r.prompt_lps >= 0 && !r.chat) choice["prompt_logprobs"] = api_prompt_logprobs(r, tok, ch.prompt_lps);
        if (r.return_token_ids) {
            if (!r.chat) choice["prompt_token_ids"] = r.prompts[p];
            choice["token_ids"] = ch.token_ids;
        }
        out.push_back(choice);
    }
    json res = envelope(r, id, created, model, std::move(out), false);
    res["usage"] = api_usage(r, choices);
    // Chat: one prompt, its logprobs beside the choices (as vLLM's).
    if (r.prompt_lps >= 0 && r.chat && !choices.empty()) res["prompt_logprobs"] = api_prompt_logprobs(r, tok, choices[0].prompt_lps);
    if (r.return_token_ids && r.chat) res["prompt_token_ids"] = r.prompts[0];
    return res;
}

json api_usage_chunk(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                     const std::vector<ApiChoice>& choices) {
    json res = envelope(r, id, created, model, json::array(), true);
    res["usage"] = api_usage(r, choices);
    return res;
}

json api_chunk(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model, size_t index,
               const std::string& delta, const std::string& finish, const json& logprobs) {
    json choice = {{"index", index}};
    if (r.chat) choice["delta"] = delta.empty() && !finish.empty() ? json::object() : json{{"content", delta}};
    else choice["text"] = delta;
    choice["logprobs"] = logprobs;
    choice["finish_reason"] = finish.empty() ? json(nullptr) : json(finish);
    json res = envelope(r, id, created, model, json::array({choice}), true);
    if (r.include_usage) res["usage"] = nullptr;  // as OpenAI's: null until the last chunk
    return res;
}

json api_role_chunk(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model, size_t index) {
    json choice = {{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
    json res = envelope(r, id, created, model, json::array({choice}), true);
    if (r.include_usage) res["usage"] = nullptr;
    return res;
}

ReasoningSpan reasoning_span(const ApiRequest& r, const std::string& text, bool done) {
    ReasoningSpan s;
    if (r.reasoning == ReasoningParser::None || r.continued == ApiRequest::Continued::InContent) return s;
    static const std::string open = "<think>", close = "</think>";
    const bool first = r.reasoning == ReasoningParser::DeepSeekR1 || r.continued == ApiRequest::Continued::InReasoning;
    const size_t i = std::min(text.size(), text.find_first_not_of(" \t\r\n"));
    const size_t rest = text.size() - i;
    if (rest < open.size() || text.compare(i, open.size(), open) != 0) {
        // Not (yet) opened. Streaming, what there is may still become "<think>": held back.
        if (!done && rest < open.size() && open.compare(0, rest, text, i, rest) == 0) {
            s.content = text.size();
            return s;
        }
        if (!first) return s;  // Qwen3's: all content
    } else {
        s.begin = i + open.size();
    }
    const size_t e = text.find(close, s.begin);
    if (e != std::string::npos) {
        s.end = e;
        s.content = e + close.size();
        return s;
    }
    s.end = s.content = text.size();
    if (!done)  // a suffix that may become "</think>" is held back
        for (size_t k = std::min(text.size() - s.begin, close.size() - 1); k > 0; --k)
            if (text.compare(text.size() - k, k, close, 0, k) == 0) {
                s.end = text.size() - k;
                break;
            }
    return s;
}

json api_reasoning_chunk(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                         size_t index, const std::string& delta) {
    json choice = {{"index", index}, {"delta", {{"reasoning_content", delta}}}, {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
    json res = envelope(r, id, created, model, json::array({choice}), true);
    if (r.include_usage) res["usage"] = nullptr;
    return res;
}

ToolCallsSoFar api_tool_calls_so_far(const ApiRequest& r, const std::string& text, bool done) {
    if (r.tools == ApiRequest::Tools::None) {
        ToolCallsSoFar plain;
        plain.plain = true;
        return plain;
    }
    if (r.tools == ApiRequest::Tools::Auto) return tool_calls_so_far(r.tool_format, text, done);
    if (r.tools == ApiRequest::Tools::Required) return json_array_calls(text, 0, "parameters", done);
    // Named: the reply is the arguments, held by their schema to JSON, unless it was cut short.
    ToolCallsSoFar out;
    const JsonPrefix j = scan_json_prefix(text, 0, done);
    const bool whole = j.complete && text.find_first_not_of(" \t\r\n", j.end) == std::string::npos;
    out.plain = !j.valid || (j.complete && !whole) || (done && !whole);
    if (!out.plain) out.calls.push_back({r.tool_name, j.out});
    return out;
}

ParsedToolCalls api_tool_calls(const ApiRequest& r, const std::string& text) {
    ToolCallsSoFar c = api_tool_calls_so_far(r, text, true);
    if (c.plain) return ParsedToolCalls{false, text, {}};
    return ParsedToolCalls{true, std::move(c.content), std::move(c.calls)};
}

size_t api_sendable(const ApiRequest& r, const ToolCallsSoFar& calls, const std::string& text, bool done, size_t sent) {
    if (r.tools == ApiRequest::Tools::None || calls.plain) return text.size();
    if (!done) {
        if (r.tools != ApiRequest::Tools::Auto) return 0;
        // White space at the end waits for what follows: before a call the whole reply's content
        // leaves it out, so the stream's content adds up to the same text.
        size_t n = tool_call_hold(r.tool_format, text);
        while (n > sent && std::isspace(static_cast<unsigned char>(text[n - 1]))) --n;
        return std::max(n, sent);
    }
    return std::max(sent, calls.content.size());
}

json api_tool_call_deltas(const ApiRequest& r, const std::string& id, int64_t created, size_t choice,
                          const std::vector<ChatToolCall>& calls, std::vector<size_t>& args_sent) {
    json out = json::array();
    for (size_t k = 0; k < calls.size() && (r.parallel_tool_calls || k == 0); ++k) {
        const std::string& args = calls[k].arguments;
        if (k < args_sent.size()) {
            if (args.size() > args_sent[k])
                out.push_back({{"index", k}, {"function", {{"arguments", args.substr(args_sent[k])}}}});
        } else {
            out.push_back({{"index", k}, {"id", call_id(r, id, created, choice, k)}, {"type", "function"},
                           {"function", {{"name", calls[k].name}, {"arguments", args}}}});
            args_sent.push_back(0);
        }
        args_sent[k] = std::max(args_sent[k], args.size());
    }
    return out;
}

json api_tool_calls_chunk(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                          size_t index, const json& deltas) {
    json choice = {{"index", index}, {"delta", {{"tool_calls", deltas}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    json res = envelope(r, id, created, model, json::array({choice}), true);
    if (r.include_usage) res["usage"] = nullptr;
    return res;
}

json api_tokenize(const json& body, const Tokenizer& tok, const ApiLimits& lim) {
    if (!body.is_object()) bad("the request body must be a JSON object");
    std::vector<int32_t> ids;
    if (body.contains("messages")) {
        ids = chat_prompt(body, tok).ids;
    } else {
        if (!body.contains("prompt") || !body["prompt"].is_string()) bad("\"prompt\" (a string) or \"messages\" is required");
        const json add = body.value("add_special_tokens", json(true));
        if (!add.is_boolean()) bad("\"add_special_tokens\" must be true or false");
        try {
            ids = tok.encode(body["prompt"].get<std::string>(), EncodeOptions{add.get<bool>()});
        } catch (const Error& e) {
            bad(e.what());
        }
    }
    json out = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", lim.ctx}};
    if (boolean(body, "return_token_strs", false)) {  // vLLM's: each id's vocabulary string (convert_ids_to_tokens)
        json t = json::array();
        for (const int32_t id : ids) t.push_back(tok.id_to_token(id));
        out["token_strs"] = t;
    }
    return out;
}

json api_detokenize(const json& body, const Tokenizer& tok, const ApiLimits& lim) {
    if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) bad("\"tokens\" (an array of ids) is required");
    std::vector<int32_t> ids;
    for (const json& id : body["tokens"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= lim.vocab)
            bad(cat("\"tokens\" must be integers in [0, ", lim.vocab, ")"));
        ids.push_back(id.get<int32_t>());
    }
    return {{"prompt", tok.decode(ids)}};
}

EmbeddingRequest parse_embedding_request(const json& body, const Tokenizer& tok, const ApiLimits& lim, int64_t hidden,
                                         const std::string& prefix) {
    if (!body.is_object()) bad("the request body must be a JSON object");
    check_model(body, lim);
    EmbeddingRequest r;
    if (!body.contains("input")) bad("\"input\" is required");
    const json& in = body["input"];
    const char* form = "\"input\" must be a string, an array of token ids, or a list of either";
    auto ids_of = [&](const json& a) { return token_ids(a, "input", lim.vocab); };
    auto text = [&](const json& t) { return encode_input(tok, prefix, t.get<std::string>()); };
    if (in.is_string()) {
        r.inputs.push_back(text(in));
    } else if (in.is_array() && !in.empty() && in[0].is_number_integer()) {
        r.inputs.push_back(ids_of(in));
    } else if (in.is_array() && !in.empty()) {
        if (int64_t(in.size()) > kMaxApiEmbeddingInputs)
            bad(cat("\"input\" holds ", in.size(), " inputs, more than ", kMaxApiEmbeddingInputs));
        const bool strings = in[0].is_string();
        for (const json& e : in) {
            if (strings ? !e.is_string() : !e.is_array()) bad(form);
            r.inputs.push_back(strings ? text(e) : ids_of(e));
        }
    } else {
        bad(form);
    }
    truncate_inputs(r.inputs, truncation(body, lim));
    check_inputs_fit(r.inputs, lim);
    const json fmt = body.value("encoding_format", json("float"));
    if (fmt != "float" && fmt != "base64") bad("\"encoding_format\" must be \"float\" or \"base64\"");
    r.base64 = fmt == "base64";
    if (body.contains("dimensions") && !body["dimensions"].is_null()) {
        const json& d = body["dimensions"];
        if (!d.is_number_integer() || d.get<int64_t>() < 1 || d.get<int64_t>() > hidden)
            bad(cat("\"dimensions\" must be an integer in [1, ", hidden, "] (the model's hidden size)"));
        r.dimensions = d.get<int64_t>();
    }
    if (body.contains("normalize") && !body["normalize"].is_null()) {
        if (!body["normalize"].is_boolean()) bad("\"normalize\" must be true or false");
        r.normalize = body["normalize"].get<bool>() ? 1 : 0;
    }
    return r;
}

namespace {
std::string base64_of(const uint8_t* p, size_t n) {
    static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    out.reserve((n + 2) / 3 * 4);
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t v = uint32_t(p[i]) << 16 | (i + 1 < n ? uint32_t(p[i + 1]) << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out += k[v >> 18 & 63];
        out += k[v >> 12 & 63];
        out += i + 1 < n ? k[v >> 6 & 63] : '=';
        out += i + 2 < n ? k[v & 63] : '=';
    }
    return out;
}
}  // namespace

json api_embedding_response(const EmbeddingRequest& r, const std::string& model, const std::vector<std::vector<float>>& vectors) {
    json data = json::array();
    int64_t tokens = 0;
    for (size_t i = 0; i < vectors.size(); ++i) {
        json e = {{"object", "embedding"}, {"index", i}};
        if (r.base64) {
            // The wire format is little-endian float32, which this host's floats are (x86-64, aarch64).
            e["embedding"] = base64_of(reinterpret_cast<const uint8_t*>(vectors[i].data()), vectors[i].size() * sizeof(float));
        } else {
            e["embedding"] = vectors[i];
        }
        data.push_back(std::move(e));
        tokens += int64_t(r.inputs[i].size());
    }
    return {{"object", "list"}, {"data", data}, {"model", model}, {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
}

ScoreRequest parse_score_request(const json& body, bool rerank, const Tokenizer& tok, const ApiLimits& lim,
                                 const std::string& query_prefix, const std::string& document_prefix, bool cross,
                                 const std::string& rerank_template) {
    if (!body.is_object()) bad("the request body must be a JSON object");
    check_model(body, lim);
    ScoreRequest r;
    r.rerank = rerank;
    const char* q = rerank ? "query" : "text_1";
    const char* d = rerank ? "documents" : "text_2";
    auto texts = [&](const char* key, bool list_only) {
        if (!body.contains(key)) bad(cat("\"", key, "\" is required"));
        const json& v = body[key];
        std::vector<std::string> out;
        if (v.is_string() && !list_only) return std::vector<std::string>{v.get<std::string>()};
        if (!v.is_array() || v.empty()) bad(cat("\"", key, "\" must be ", list_only ? "" : "a string or ", "a non-empty list of strings"));
        if (int64_t(v.size()) > kMaxApiEmbeddingInputs) bad(cat("\"", key, "\" holds more than ", kMaxApiEmbeddingInputs, " texts"));
        for (const json& t : v) {
            if (!t.is_string()) bad(cat("\"", key, "\" must be ", list_only ? "" : "a string or ", "a list of strings"));
            out.push_back(t.get<std::string>());
        }
        return out;
    };
    if (rerank && (!body.contains(q) || !body[q].is_string())) bad("\"query\" (a string) is required");
    const std::vector<std::string> first = texts(q, false), second = texts(d, rerank);
    if (first.size() > 1 && first.size() != second.size())
        bad(cat("\"text_1\" and \"text_2\" must be as long as each other (", first.size(), " and ", second.size(),
                ") or \"text_1\" one text"));
    const int64_t keep = truncation(body, lim);
    if (cross) {
        for (size_t i = 0; i < second.size(); ++i) {
            try {
                r.inputs.push_back(encode_scored_pair(tok, rerank_template, first[first.size() == 1 ? 0 : i], second[i], keep));
            } catch (const Error& e) {
                bad(e.what());
            }
        }
    } else {
        for (const std::string& t : first) r.inputs.push_back(encode_input(tok, query_prefix, t));
        for (const std::string& t : second) r.inputs.push_back(encode_input(tok, document_prefix, t));
        for (size_t i = 0; i < second.size(); ++i) r.pairs.emplace_back(first.size() == 1 ? 0 : i, first.size() + i);
        truncate_inputs(r.inputs, keep);
    }
    check_inputs_fit(r.inputs, lim);
    if (rerank) {
        r.documents = second;
        r.top_n = int64_t(second.size());
        if (body.contains("top_n") && !body["top_n"].is_null()) {
            if (!body["top_n"].is_number_integer() || body["top_n"].get<int64_t>() < 1)
                bad("\"top_n\" must be a positive integer");
            r.top_n = std::min(r.top_n, body["top_n"].get<int64_t>());
        }
        const json ret = body.value("return_documents", json(true));
        if (!ret.is_boolean()) bad("\"return_documents\" must be true or false");
        r.return_documents = ret.get<bool>();
    }
    return r;
}

std::vector<double> cosine_scores(const ScoreRequest& r, const std::vector<std::vector<float>>& vectors) {
    std::vector<double> scores;
    for (const auto& [a, b] : r.pairs) {
        double dot = 0;
        for (size_t h = 0; h < vectors[a].size(); ++h) dot += double(vectors[a][h]) * vectors[b][h];
        scores.push_back(dot);
    }
    return scores;
}

json api_score_response(const ScoreRequest& r, const std::string& id, int64_t created, const std::string& model,
                        const std::vector<double>& scores) {
    int64_t tokens = 0;
    for (const auto& in : r.inputs) tokens += int64_t(in.size());
    if (!r.rerank) {
        json data = json::array();
        for (size_t i = 0; i < scores.size(); ++i) data.push_back({{"index", i}, {"object", "score"}, {"score", scores[i]}});
        return {{"id", id}, {"object", "list"}, {"created", created}, {"model", model}, {"data", data},
                {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
    }
    std::vector<size_t> order(scores.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
    json results = json::array();
    for (int64_t k = 0; k < r.top_n; ++k) {
        const size_t i = order[size_t(k)];
        json e = {{"index", i}};
        if (r.return_documents) e["document"] = {{"text", r.documents[i]}};
        e["relevance_score"] = scores[i];
        results.push_back(std::move(e));
    }
    return {{"id", id}, {"model", model}, {"usage", {{"total_tokens", tokens}}}, {"results", results}};
}

json api_classify_response(const EmbeddingRequest& r, const std::string& id, int64_t created, const std::string& model,
                           const std::vector<std::string>& labels, const std::vector<std::vector<float>>& probs) {
    json data = json::array();
    int64_t tokens = 0;
    for (size_t i = 0; i < probs.size(); ++i) {
        const size_t best = size_t(std::max_element(probs[i].begin(), probs[i].end()) - probs[i].begin());
        data.push_back({{"index", i}, {"label", labels[best]}, {"probs", probs[i]}, {"num_classes", labels.size()}});
        tokens += int64_t(r.inputs[i].size());
    }
    return {{"id", id}, {"object", "list"}, {"created", created}, {"model", model}, {"data", data},
            {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
}

std::string api_request_id(const std::string& header, const nlohmann::json& body) {
    auto checked = [](const std::string& id, const char* what) {
        const bool visible = std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 127; });
        if (id.empty() || id.size() > 128 || !visible)
            bad(cat(what, " must be 1 to 128 visible ASCII characters (no spaces)"));
        return id;
    };
    if (!header.empty()) return checked(header, "the X-Request-Id header");
    if (!body.is_object() || !body.contains("request_id") || body["request_id"].is_null()) return "";
    if (!body["request_id"].is_string()) bad("\"request_id\" must be a string");
    return checked(body["request_id"].get<std::string>(), "\"request_id\"");
}

json api_error(const std::string& message, int status) {
    return {{"error",
             {{"message", message},
              {"type", status == 404 ? "NotFoundError" : status == 401 ? "AuthenticationError" : "invalid_request_error"},
              {"code", status}}}};
}

void check_body_depth(const std::string& body) {
    if (json_text_depth(body) > kMaxJsonDepth)
        throw ApiError(400, cat("the request body nests arrays and objects deeper than ", kMaxJsonDepth, " levels"));
}

bool api_key_accepted(const std::string& authorization, const std::string& key) {
    const std::string scheme = "bearer ";
    if (authorization.size() < scheme.size()) return false;
    for (size_t i = 0; i < scheme.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(authorization[i])) != scheme[i]) return false;
    size_t b = scheme.size(), e = authorization.size();
    while (b < e && authorization[b] == ' ') ++b;
    while (e > b && authorization[e - 1] == ' ') --e;
    const size_t n = e - b;
    unsigned diff = n == key.size() ? 0u : 1u;
    // Every byte of the longer of the two is looked at, whatever differs first.
    for (size_t i = 0; i < std::max(n, key.size()); ++i) {
        const unsigned char got = i < n ? static_cast<unsigned char>(authorization[b + i]) : 0;
        const unsigned char want = i < key.size() ? static_cast<unsigned char>(key[i]) : 0;
        diff |= unsigned(got ^ want);
    }
    return diff == 0;
}

}  // namespace shardlm
