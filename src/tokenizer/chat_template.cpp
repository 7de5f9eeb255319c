#include "tokenizer/chat_template.h"

#include <algorithm>
#include <ctime>

#include "core/error.h"
#include "tokenizer/json_prefix.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

// A canonical spelling of a template for fingerprinting: white space outside string literals in
// {{ }} / {% %} tags is dropped, double quotes become single, newlines (literal or the escape
// \n) become '~', and message['x'] becomes message.x. Text inside literals keeps its spaces,
// which matter to the rendering.
std::string canonical(const std::string& src) {
    std::string out;
    bool in_tag = false;
    char quote = 0;
    for (size_t i = 0; i < src.size(); ++i) {
        const char c = src[i];
        if (!in_tag) {
            if (c == '{' && i + 1 < src.size() && src[i + 1] == '#') {
                // A comment renders nothing, and its prose may hold a lone quote: skip it whole.
                const size_t end = src.find("#}", i + 2);
                if (end == std::string::npos) break;
                i = end + 1;
                continue;
            }
            if (c == '{' && i + 1 < src.size() && (src[i + 1] == '{' || src[i + 1] == '%')) {
                in_tag = true;
                out += c;
                out += src[++i];
                if (i + 1 < src.size() && src[i + 1] == '-') ++i;  // whitespace control
                continue;
            }
            out += c == '\n' ? '~' : c;
            continue;
        }
        if (quote) {
            if (c == '\\' && i + 1 < src.size()) {
                const char e = src[++i];
                if (e == 'n') out += '~';
                else out += e;
                continue;
            }
            if (c == quote) { out += '\''; quote = 0; continue; }
            out += c == '\n' ? '~' : c;
            continue;
        }
        if (c == '\'' || c == '"') { quote = c; out += '\''; continue; }
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
        // "-}}" / "-%}": whitespace control, not part of the expression.
        if (c == '-' && i + 2 < src.size() && src[i + 2] == '}' && (src[i + 1] == '}' || src[i + 1] == '%')) continue;
        if ((c == '}' || c == '%') && i + 1 < src.size() && src[i + 1] == '}') {
            in_tag = false;
            out += c;
            out += src[++i];
            continue;
        }
        out += c;
    }
    for (const char* key : {"role", "content"}) {
        out = replace_literal(out, std::string("message['") + key + "']", std::string("message.") + key);
        out = replace_literal(out, std::string("messages[0]['") + key + "']", std::string("messages[0].") + key);
    }
    return out;
}

bool has(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

// A default system message spelled as a literal after "<|im_start|>system\n" (Qwen2/2.5, SmolLM2).
std::optional<std::string> chatml_default_system(const std::string& canon) {
    const std::string open = "<|im_start|>system~", close = "<|im_end|>";
    for (size_t at = canon.find(open); at != std::string::npos; at = canon.find(open, at + 1)) {
        const size_t b = at + open.size();
        const size_t e = canon.find(close, b);
        if (e == std::string::npos) break;
        const std::string body = canon.substr(b, e - b);
        if (body.find_first_of("'{}+") != std::string::npos) continue;  // not a plain literal
        std::string text = body;
        for (char& ch : text)
            if (ch == '~') ch = '\n';
        return text;
    }
    return std::nullopt;
}

// The tools block of Qwen's ChatML templates (ChatTools), in canonical() spelling and as rendered.
const char kToolsHeadCanon[] =
    "# Tools~~You may call one or more functions to assist with the user query.~~You are provided with function "
    "signatures within <tools></tools> XML tags:~<tools>'}}{%fortoolintools%}{{'~'}}{{tool|tojson}}{%endfor%}{{'~</tools>~~"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML "
    "tags:~<tool_call>~{\"name\": <function-name>, \"arguments\": <args-json-object>}~</tool_call><|im_end|>~'}}";
const char kToolsHead[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    "signatures within <tools></tools> XML tags:\n<tools>";
const char kToolsTail[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

// canonical() without the white space between two tags (a template that strips it with "{%-" /
// "{{-" renders none), so that fingerprints may span tags.
std::string tight(const std::string& c) {
    std::string out;
    for (size_t i = 0; i < c.size(); ++i) {
        out += c[i];
        if (i + 1 < c.size() && (c[i] == '}' || c[i] == '%') && c[i + 1] == '}') {
            out += c[++i];
            size_t j = i + 1;
            while (j < c.size() && (c[j] == '~' || c[j] == ' ' || c[j] == '\t' || c[j] == '\r')) ++j;
            if (j + 1 < c.size() && c[j] == '{' && (c[j + 1] == '{' || c[j + 1] == '%')) i = j - 1;
        }
    }
    return out;
}

// Which tools block a ChatML template has (and Qwen2/2.5's system message before it).
void recognise_tools(const std::string& canon, ChatTemplate& t) {
    const std::string c = tight(canon);
    const bool responses = has(c, "{{'<|im_start|>user'}}") && has(c, "{{'~<tool_response>~'}}") &&
                           has(c, "{{'~</tool_response>'}}");
    if (!has(c, "{%iftools%}{{'<|im_start|>system~'}}") || !has(c, kToolsHeadCanon) || !responses) return;
    const std::string q3_system = "{%ifmessages[0].role=='system'%}{{messages[0].content+'~~'}}{%endif%}{{'# Tools~~";
    if (has(c, q3_system.c_str()) && has(c, "{%ifloop.index0>ns.last_query_index%}") &&
        has(c, "{%if(loop.firstandcontent)or(notloop.first)%}{{'~'}}{%endif%}") &&
        has(c, "{{'<tool_call>~{\"name\": \"'}}{{tool_call.name}}{{'\", \"arguments\": '}}") &&
        has(c, "{%iftool_call.argumentsisstring%}{{tool_call.arguments}}{%else%}{{tool_call.arguments|tojson}}{%endif%}")) {
        t.tools = ChatTools::Qwen3;
        return;
    }
    const std::string head = "{%ifmessages[0].role=='system'%}{{messages[0].content}}{%else%}{{'";
    const size_t at = c.find(head);
    const size_t end = at == std::string::npos ? at : c.find("'}}{%endif%}{{'~~# Tools~~", at);
    if (end != std::string::npos &&
        has(c, "{{'~<tool_call>~{\"name\": \"'}}{{tool_call.name}}{{'\", \"arguments\": '}}{{tool_call.arguments|tojson}}"
               "{{'}~</tool_call>'}}") &&
        has(c, "(message.role=='assistant'andnotmessage.tool_calls)")) {
        std::string sys = c.substr(at + head.size(), end - at - head.size());
        if (sys.find_first_of("'{}~") != std::string::npos) return;  // not a plain one-line literal
        t.tools = ChatTools::Qwen25;
        t.tools_system = sys;
    }
}

// Llama 3.1/3.2/3.3's JSON tool calls (ChatTools::Llama3Json): the templates' parts that render
// the tools in the first user message (their default, tools_in_user_message true), a reply's call
// and a tool's result; builtin_tools (Llama 3.1's ipython calls) are never defined here.
const char kLlamaToolsPrompt[] =
    "Given the following functions, please respond with a JSON for a function call with its proper arguments that "
    "best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of "
    "argument name and its value}.Do not use variables.\n\n";
// The same in the system message (tools_in_user_message false).
const char kLlamaSystemToolsPrompt[] =
    "You have access to the following functions. To call a function, please respond with JSON for a function call."
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}."
    "Do not use variables.\n\n";

void recognise_llama_tools(const std::string& canon, ChatTemplate& t) {
    const std::string c = tight(canon);
    const bool environment =
        has(c, "{%ifbuiltin_toolsisdefinedortoolsisnotnone%}{{'Environment: ipython~'}}{%endif%}") ||  // 3.1, 3.3
        has(c, "{%iftoolsisnotnone%}{{'Environment: ipython~'}}{%endif%}");                             // 3.2
    const std::string call = "{{'<|start_header_id|>assistant<|end_header_id|>~~'}}{{'{\"name\": \"'+tool_call.name+'\", '}}"
                             "{{'\"parameters\": '}}{{tool_call.arguments|tojson}}{{'}'}}";
    const bool call_ends = has(c, (call + "{%endif%}{%ifbuiltin_toolsisdefined%}{{'<|eom_id|>'}}{%else%}{{'<|eot_id|>'}}"
                                          "{%endif%}").c_str()) ||
                           has(c, (call + "{{'<|eot_id|>'}}").c_str());
    if (environment && call_ends &&
        has(c, "{%ifnottools_in_user_messageisdefined%}{%settools_in_user_message=true%}{%endif%}") &&
        has(c, "{%iftools_in_user_messageandnottoolsisnone%}") &&
        has(c, "{%iftoolsisnotnoneandnottools_in_user_message%}{{'You have access to the following functions. To call a "
               "function, please respond with JSON for a function call.'}}{{'Respond in the format {\"name\": function name, "
               "\"parameters\": dictionary of argument name and its value}.'}}{{'Do not use variables.~~'}}"
               "{%fortintools%}{{t|tojson(indent=4)}}{{'~~'}}{%endfor%}{%endif%}{{system_message}}{{'<|eot_id|>'}}") &&
        has(c, "{%setfirst_user_message=messages[0].content|trim%}{%setmessages=messages[1:]%}") &&
        has(c, "{{'<|start_header_id|>user<|end_header_id|>~~'}}{{'Given the following functions, please respond with a "
               "JSON for a function call '}}{{'with its proper arguments that best answers the given prompt.~~'}}{{'Respond "
               "in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.'}}{{'Do "
               "not use variables.~~'}}{%fortintools%}{{t|tojson(indent=4)}}{{'~~'}}{%endfor%}"
               "{{first_user_message+'<|eot_id|>'}}{%endif%}") &&
        has(c, "{%ifnot(message.role=='ipython'ormessage.role=='tool'or'tool_calls'inmessage)%}") &&
        has(c, "{%ifnotmessage.tool_calls|length==1%}") && has(c, "{%settool_call=message.tool_calls[0].function%}") &&
        has(c, "{{'<|start_header_id|>ipython<|end_header_id|>~~'}}{%ifmessage.contentismappingormessage.contentisiterable%}"
               "{{message.content|tojson}}{%else%}{{message.content}}{%endif%}{{'<|eot_id|>'}}"))
        t.tools = ChatTools::Llama3Json;
}

std::string strip_newlines(std::string s, bool left, bool right) {
    if (left) s.erase(0, std::min(s.size(), s.find_first_not_of('\n')));
    if (right) s.erase(s.find_last_not_of('\n') + 1);
    return s;
}

bool tool_turns(const std::vector<ChatMessage>& messages) {
    for (const ChatMessage& m : messages)
        if (m.role == "tool" || !m.tool_calls.empty()) return true;
    return false;
}

// The turns of a conversation with tools or tool turns, as both tool formats take them.
// reply_last: the last turn is the start of the assistant's reply (continue_final_message).
void check_tool_turns(const std::vector<ChatMessage>& messages, bool reply_last = false) {
    if (messages.empty()) fail("a chat conversation needs at least one message");
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role != "user" && m.role != "assistant" && m.role != "tool")
            fail("chat turn ", i, " has role \"", m.role, "\" (user, assistant or tool)");
        if (m.role == "tool" && (i == 0 || (messages[i - 1].role != "tool" && messages[i - 1].tool_calls.empty())))
            fail("chat turn ", i, ": a tool message answers an assistant turn's tool calls (it follows one, or another "
                 "tool message)");
        if (!m.tool_calls.empty() && m.role != "assistant") fail("chat turn ", i, ": only assistant turns make tool calls");
    }
    if (messages.back().role == "assistant" && !reply_last) fail("a chat conversation ends with a user or tool message");
}

// Qwen3's index of the last user query: the last user turn that is not a wrapped tool response
// (the last turn if there is none). Replies after it keep their reasoning.
size_t last_query_index(const std::vector<ChatMessage>& messages) {
    for (size_t i = messages.size(); i-- > 0;) {
        const std::string& c = messages[i].content;
        const bool wrapped = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 &&
                             c.compare(c.size() - 16, 16, "</tool_response>") == 0;
        if (messages[i].role == "user" && !wrapped) return i;
    }
    return messages.size() - 1;
}

// A reply split as Qwen3's template splits it: the content after the last </think> (leading
// newlines dropped) and the reasoning between the last <think> before the first </think> and it
// (newlines at both ends dropped); no </think>: all content.
struct SplitReply {
    std::string content, reasoning;
};
SplitReply split_reasoning(const std::string& text) {
    const size_t first = text.find("</think>");
    if (first == std::string::npos) return {text, ""};
    const std::string before = text.substr(0, first);
    const size_t open = before.rfind("<think>");
    return {strip_newlines(text.substr(text.rfind("</think>") + 8), true, false),
            strip_newlines(open == std::string::npos ? before : before.substr(open + 7), true, true)};
}

// Qwen3's opening of a reply and its text: with its think block (an empty one where it has no
// reasoning, the content's leading newlines dropped) when it comes after the last query and is the
// last turn or has reasoning.
std::string qwen3_reply(const SplitReply& r, bool after_query, bool last) {
    if (after_query && (last || !r.reasoning.empty()))
        return "<|im_start|>assistant\n<think>\n" + r.reasoning + "\n</think>\n\n" + strip_newlines(r.content, true, false);
    return "<|im_start|>assistant\n" + r.content;
}

// A conversation with tools in Qwen's ChatML format (the templates recognise_tools accepts).
std::string render_chatml_tools(const ChatTemplate& t, const std::optional<std::string>& system,
                                const std::vector<ChatMessage>& messages, const std::vector<nlohmann::ordered_json>& tools) {
    check_tool_turns(messages);
    std::string out;
    if (!tools.empty()) {
        out += "<|im_start|>system\n";
        if (t.tools == ChatTools::Qwen25) out += (system ? *system : *t.tools_system) + "\n\n";
        else if (system) out += *system + "\n\n";
        out += kToolsHead;
        for (const nlohmann::ordered_json& tool : tools) out += "\n" + python_json(tool);
        out += kToolsTail;
    } else {
        const std::optional<std::string> sys = system ? system : t.default_system;
        if (sys) out += "<|im_start|>system\n" + *sys + "<|im_end|>\n";
    }
    const size_t last_query = last_query_index(messages);
    auto calls = [&](const ChatMessage& m, bool newline_first) {
        std::string s;
        for (size_t j = 0; j < m.tool_calls.size(); ++j) {
            if (j > 0 || newline_first) s += "\n";
            s += "<tool_call>\n{\"name\": \"" + m.tool_calls[j].name + "\", \"arguments\": " + m.tool_calls[j].arguments +
                 "}\n</tool_call>";
        }
        return s;
    };
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "user") {
            out += "<|im_start|>user\n" + m.content + "<|im_end|>\n";
        } else if (m.role == "tool") {
            if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
            out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
            if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
        } else if (t.tools == ChatTools::Qwen25) {
            if (m.tool_calls.empty()) out += "<|im_start|>assistant\n" + m.content + "<|im_end|>\n";
            else out += "<|im_start|>assistant" + (m.content.empty() ? "" : "\n" + m.content) + calls(m, true) + "<|im_end|>\n";
        } else {
            const SplitReply r = split_reasoning(m.content);
            out += qwen3_reply(r, i > last_query, i + 1 == messages.size()) + calls(m, !r.content.empty()) + "<|im_end|>\n";
        }
    }
    return out + "<|im_start|>assistant\n";
}

// Mistral's v3 templates (v0.3 and Nemo's v3-tekken): the parts that render the turns, the tools
// list, a reply's calls and a tool's result; `sp` is the space v0.3 writes after each opening
// control token (Nemo writes none). Revisions differ only in how they check the roles' order.
bool mistral_v3_template(const std::string& canon, const std::string& sp, bool trims_replies) {
    const std::string c = tight(canon);
    const std::string inst = "{%ifloop.lastandsystem_messageisdefined%}{{'[INST]" + sp +
                             "'+system_message+'~~'+message.content+'[/INST]'}}{%else%}{{'[INST]" + sp +
                             "'+message.content+'[/INST]'}}{%endif%}";
    const std::string reply = trims_replies ? "{{' '+message.content|trim+eos_token}}" : "{{message.content+eos_token}}";
    const std::string tools =
        "{%iftoolsisnotnoneand(message==user_messages[-1])%}{{'[AVAILABLE_TOOLS]" + sp +
        "['}}{%fortoolintools%}{%settool=tool.function%}{{'{\"type\": \"function\", \"function\": {'}}"
        "{%forkey,valintool.items()ifkey!='return'%}{%ifvalisstring%}{{'\"'+key+'\": \"'+val+'\"'}}{%else%}"
        "{{'\"'+key+'\": '+val|tojson}}{%endif%}{%ifnotloop.last%}{{', '}}{%endif%}{%endfor%}{{'}}'}}"
        "{%ifnotloop.last%}{{', '}}{%else%}{{']'}}{%endif%}{%endfor%}{{'[/AVAILABLE_TOOLS]'}}{%endif%}";
    return has(c, "{%setsystem_message=messages[0].content%}{%setloop_messages=messages[1:]%}") &&
           has(c, "{%settools=none%}") &&
           has(c, "{%setuser_messages=loop_messages|selectattr('role','equalto','user')|list%}") &&
           has(c, "{{bos_token}}") && has(c, (tools + inst).c_str()) && has(c, reply.c_str()) &&
           has(c, ("{{'[TOOL_CALLS]" + sp + "['}}").c_str()) &&
           has(c, "{%setout=tool_call.function|tojson%}{{out[:-1]}}{%ifnottool_call.idisdefinedortool_call.id|length!=9%}"
                  "{{raise_exception('Tool call IDs should be alphanumeric strings with length 9!')}}{%endif%}"
                  "{{', \"id\": \"'+tool_call.id+'\"}'}}{%ifnotloop.last%}{{', '}}{%else%}{{']'+eos_token}}{%endif%}"
                  "{%endfor%}") &&
           has(c, "{%ifmessage.contentisdefinedandmessage.content.contentisdefined%}{%setcontent=message.content.content%}"
                  "{%else%}{%setcontent=message.content%}{%endif%}") &&
           has(c, ("{{'[TOOL_RESULTS]" + sp + "{\"content\": '+content|string+', '}}").c_str()) &&
           has(c, "{{'\"call_id\": \"'+message.tool_call_id+'\"}[/TOOL_RESULTS]'}}");
}

// Characters (code points) in UTF-8 text, as Jinja's length counts them.
size_t code_points(const std::string& s) {
    size_t n = 0;
    for (const char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
    return n;
}

// A conversation in Mistral's v3 format (mistral_v3_template): the functions' list before the last
// user turn, the system message on the last turn when it is the user's (the template drops it
// when a tool result is last), replies with calls as [TOOL_CALLS] and their ids.
std::string render_mistral_v3(const ChatTemplate& t, const std::optional<std::string>& system,
                              const std::vector<ChatMessage>& messages, const std::string& bos_token,
                              const std::string& eos_token, const std::vector<nlohmann::ordered_json>& tools,
                              bool reply_last = false) {
    check_tool_turns(messages, reply_last);
    const std::string sp = t.family == ChatFamily::MistralTekken ? "" : " ";
    // The template's own check: the turns other than calls and results alternate, user first.
    size_t turn = 0, last_user = 0;
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "user") last_user = i;
        if (m.role == "tool" || !m.tool_calls.empty()) continue;
        if ((m.role == "user") != (turn++ % 2 == 0))
            fail("chat turn ", i, " has role \"", m.role, "\": apart from tool calls and results, this model's chat "
                 "template (Mistral) takes user and assistant turns in turn, user first");
    }
    auto check_id = [](const std::string& id, size_t i) {
        if (code_points(id) != 9)
            fail("chat turn ", i, ": tool call id \"", id, "\" is not 9 characters long, as this model's chat template "
                 "(Mistral) requires (a call's \"id\", a tool message's \"tool_call_id\")");
    };
    std::string out = bos_token;
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "user") {
            // Python's Jinja compares the messages by value: a user turn equal to the last gets the list too.
            if (!tools.empty() && m.content == messages[last_user].content) {
                out += "[AVAILABLE_TOOLS]" + sp + "[";
                for (size_t k = 0; k < tools.size(); ++k) {
                    out += "{\"type\": \"function\", \"function\": {";
                    bool first = true;
                    for (auto it = tools[k]["function"].begin(); it != tools[k]["function"].end(); ++it) {
                        if (it.key() == "return") continue;
                        out += first ? "\"" : ", \"";
                        first = false;
                        // A string is printed as it is, unquoted inside the quotes (the template's way).
                        out += it.key() + "\": " +
                               (it.value().is_string() ? "\"" + it.value().get<std::string>() + "\"" : python_json(it.value()));
                    }
                    out += k + 1 < tools.size() ? "}}, " : "}}]";
                }
                out += "[/AVAILABLE_TOOLS]";
            }
            out += "[INST]" + sp + (i + 1 == messages.size() && system ? *system + "\n\n" : "") + m.content + "[/INST]";
        } else if (!m.tool_calls.empty()) {
            out += "[TOOL_CALLS]" + sp + "[";
            for (size_t k = 0; k < m.tool_calls.size(); ++k) {
                const ChatToolCall& call = m.tool_calls[k];
                check_id(call.id, i);
                out += "{\"name\": " + python_json(call.name) + ", \"arguments\": " + call.arguments + ", \"id\": \"" +
                       call.id + "\"}" + (k + 1 < m.tool_calls.size() ? ", " : "]" + eos_token);
            }
        } else if (m.role == "assistant") {
            out += t.family == ChatFamily::MistralTekken ? m.content + eos_token : " " + trim_js(m.content) + eos_token;
        } else {
            check_id(m.tool_call_id, i);
            out += "[TOOL_RESULTS]" + sp + "{\"content\": " + m.content + ", \"call_id\": \"" + m.tool_call_id +
                   "\"}[/TOOL_RESULTS]";
        }
    }
    return out;
}

std::string today_llama_date();

// A conversation with tools in Llama 3.1/3.2's JSON format (recognise_llama_tools): the tools,
// tojson(indent=4), lead the first user message (or, tools_in_user_message false, the system
// message's text); a reply's call is its JSON with "parameters";
// a tool's result comes as an ipython turn, its text through tojson (Jinja's strings are iterable,
// so the template quotes them).
std::string render_llama_tools(const ChatTemplate& t, const std::optional<std::string>& system,
                               const std::vector<ChatMessage>& messages, const std::string& bos_token,
                               const std::vector<nlohmann::ordered_json>& tools, bool tools_in_user_message) {
    check_tool_turns(messages);
    auto header = [](const std::string& role) { return "<|start_header_id|>" + role + "<|end_header_id|>\n\n"; };
    std::string out = bos_token + header("system");
    if (!tools.empty()) out += "Environment: ipython\n";
    out += "Cutting Knowledge Date: December 2023\nToday Date: " +
           (t.date_string.empty() ? today_llama_date() : t.date_string) + "\n\n";
    if (!tools.empty() && !tools_in_user_message) {
        out += kLlamaSystemToolsPrompt;
        for (const nlohmann::ordered_json& tool : tools) out += python_json(tool, 4) + "\n\n";
    }
    out += (system ? trim_js(*system) : std::string()) + "<|eot_id|>";
    size_t i = 0;
    if (!tools.empty() && tools_in_user_message) {
        out += header("user") + kLlamaToolsPrompt;
        for (const nlohmann::ordered_json& tool : tools) out += python_json(tool, 4) + "\n\n";
        out += trim_js(messages[0].content) + "<|eot_id|>";
        i = 1;
    }
    for (; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (!m.tool_calls.empty()) {
            if (m.tool_calls.size() != 1)
                fail("chat turn ", i, " makes ", m.tool_calls.size(), " tool calls: this model's chat template (Llama "
                     "3.1/3.2) takes one call per assistant turn");
            out += header("assistant") + "{\"name\": \"" + m.tool_calls[0].name + "\", \"parameters\": " +
                   m.tool_calls[0].arguments + "}<|eot_id|>";
        } else if (m.role == "tool") {
            out += header("ipython") + python_json(m.content) + "<|eot_id|>";
        } else {
            out += header(m.role) + trim_js(m.content) + "<|eot_id|>";
        }
    }
    return out + header("assistant");
}

std::string today_llama_date() {
    // strftime("%d %b %Y") as transformers' strftime_now() gives it to Llama 3.2's template.
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%d %b %Y", &tm);
    return buf;
}

}  // namespace

const char* chat_family_name(ChatFamily f) {
    switch (f) {
        case ChatFamily::ChatML: return "chatml";
        case ChatFamily::Llama3: return "llama3";
        case ChatFamily::Llama31: return "llama3.1";
        case ChatFamily::Llama2: return "llama2";
        case ChatFamily::Mistral: return "mistral";
        case ChatFamily::Mistral2: return "mistral-v0.2";
        case ChatFamily::Mistral3: return "mistral-v3";
        case ChatFamily::MistralTekken: return "mistral-v3-tekken";
        case ChatFamily::DeepSeek: return "deepseek";
    }
    return "?";
}

std::string trim_js(const std::string& s) {
    size_t b = 0, e = s.size();
    while (b < e) {
        size_t i = b;
        if (!is_js_space(next_code_point(s, i))) break;
        b = i;
    }
    while (e > b) {
        size_t k = e - 1;
        while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t i = k;
        if (!is_js_space(next_code_point(s, i))) break;
        e = k;
    }
    return s.substr(b, e - b);
}

ChatTemplate recognise_chat_template(const std::string& source, const std::string& where) {
    const std::string c = canonical(source);
    ChatTemplate t;
    if (has(c, "'<|im_start|>'+message.role+'~'+message.content+'<|im_end|>'") && has(c, "'<|im_start|>assistant~'")) {
        t.family = ChatFamily::ChatML;
        t.default_system = chatml_default_system(c);
        // Qwen3 keeps only what follows </think> of a reply before the last user turn.
        t.strips_reasoning = has(c, "message.content.split('</think>')[-1].lstrip('~')");
        t.thinking_switch = has(tight(c), "{{'<|im_start|>assistant~'}}{%ifenable_thinkingisdefinedandenable_thinkingisfalse%}"
                                          "{{'<think>~~</think>~~'}}{%endif%}");
        t.final_reply_thinks = has(tight(c), "ifloop.lastor(notloop.lastandreasoning_content)");
        recognise_tools(c, t);
        return t;
    }
    if (has(c, "'<|start_header_id|>'+message.role+'<|end_header_id|>~~'+message.content|trim+'<|eot_id|>'") &&
        has(c, "'<|start_header_id|>assistant<|end_header_id|>~~'") && has(c, "bos_token")) {
        if (!has(c, "Cutting Knowledge Date")) {
            t.family = ChatFamily::Llama3;
            return t;
        }
        if (has(c, "'Cutting Knowledge Date: December 2023~'") && has(c, "'Today Date: '+date_string+'~~'") &&
            has(c, "system_message=messages[0].content|trim")) {
            t.family = ChatFamily::Llama31;
            recognise_llama_tools(c, t);
            if (!has(c, "strftime_now")) {
                const std::string key = "setdate_string='";
                const size_t at = c.find(key);
                const size_t end = at == std::string::npos ? at : c.find('\'', at + key.size());
                if (end == std::string::npos) fail(where, ": Llama 3.1-style chat_template without a default date_string");
                t.date_string = c.substr(at + key.size(), end - at - key.size());
            }
            return t;
        }
    }
    if (has(c, "'<<SYS>>~'+system_message+'~<</SYS>>~~'+message.content") &&
        has(c, "bos_token+'[INST] '+content.strip()+' [/INST]'")) {
        t.family = ChatFamily::Llama2;
        return t;
    }
    const std::string tc = tight(c);
    // DeepSeek V3's and R1's (the distilled Qwen and Llama models' too): the system message leads,
    // each turn follows its tag; R1 drops earlier replies' reasoning and opens a new one. (Their
    // tools blocks are not rendered: no tools.)
    const std::string user = "{{'<｜User｜>'+message.content}}";
    const std::string v3_reply = "{{'<｜Assistant｜>'+message.content+'<｜end▁of▁sentence｜>'}}";
    const std::string r1_reply = "{%setcontent=message.content%}{%if'</think>'incontent%}{%setcontent=content.split('</think>')"
                                 "[-1]%}{%endif%}{{'<｜Assistant｜>'+content+'<｜end▁of▁sentence｜>'}}";
    const std::string prompt = "{%ifadd_generation_promptandnotns.is_tool%}{{'<｜Assistant｜>";
    if (has(tc, "{{bos_token}}{{ns.system_prompt}}") && has(tc, user.c_str()) &&
        (has(tc, "{%ifmessage.role=='system'%}{%setns.system_prompt=message.content%}{%endif%}") ||
         has(tc, "{%ifmessage.role=='system'%}{%ifns.is_first_sp%}{%setns.system_prompt=ns.system_prompt+message.content%}"))) {
        const bool v3 = has(tc, v3_reply.c_str()) && has(tc, (prompt + "'}}{%endif%}").c_str());
        const bool r1 = has(tc, r1_reply.c_str()) && has(tc, (prompt + "<think>~'}}{%endif%}").c_str());
        if (v3 != r1) {
            t.family = ChatFamily::DeepSeek;
            t.strips_reasoning = t.opens_thinking = r1;
            return t;
        }
    }
    if (mistral_v3_template(c, " ", true) || mistral_v3_template(c, "", false)) {
        t.family = mistral_v3_template(c, " ", true) ? ChatFamily::Mistral3 : ChatFamily::MistralTekken;
        t.tools = ChatTools::MistralJson;
        return t;
    }
    if (has(tc, "{{bos_token}}") && has(tc, "{%setsystem_message=messages[0].content%}{%setloop_messages=messages[1:]%}") &&
        has(tc, "{%ifloop.firstandsystem_messageisdefined%}{{' [INST] '+system_message+'~~'+message.content+' [/INST]'}}"
                "{%else%}{{' [INST] '+message.content+' [/INST]'}}{%endif%}") &&
        has(tc, "{{' '+message.content+eos_token}}")) {
        t.family = ChatFamily::Mistral2;
        return t;
    }
    if (has(c, "{{bos_token}}") && has(c, "'[INST] '+message.content+' [/INST]'") && !has(c, "system")) {
        t.family = ChatFamily::Mistral;
        return t;
    }
    fail(where, ": unrecognised chat_template (supported families: ChatML/Qwen, Llama 3, Llama 2, Mistral v0.1-v0.3 and "
                "Nemo [INST], DeepSeek V3/R1); "
                "render the prompt yourself and pass it with --prompt");
}

namespace {

// render_conversation's turns, up to the generation prompt (the template's date already chosen).
std::string render_turns(const ChatTemplate& t, const std::optional<std::string>& system,
                         const std::vector<ChatMessage>& messages, const std::string& bos_token,
                         const std::string& eos_token, const std::vector<nlohmann::ordered_json>& tools,
                         bool tools_in_user_message, bool continue_final) {
    if (continue_final && (!tools.empty() || tool_turns(messages)))
        fail("continuing the final message is not supported with tools, tool calls or tool messages");
    if (!tools.empty() || tool_turns(messages)) {
        if (t.tools == ChatTools::None)
            fail("this model's chat template (", chat_family_name(t.family), ") has no tools block shardlm renders: "
                 "tools, tool calls and tool messages need Qwen2.5's, Qwen3's, Llama 3.1/3.2's or Mistral v3's");
        if (t.tools == ChatTools::MistralJson) return render_mistral_v3(t, system, messages, bos_token, eos_token, tools);
        if (t.tools == ChatTools::Llama3Json)
            return render_llama_tools(t, system, messages, bos_token, tools, tools_in_user_message);
        return render_chatml_tools(t, system, messages, tools);
    }
    // Llama 2's and Mistral's templates raise unless the turns alternate, user first; the others
    // (ChatML, Llama 3, DeepSeek) write user and assistant turns in any order, as OpenAI's API
    // allows: an assistant greeting first, two user turns in a row, an assistant turn last (a new
    // reply follows it; with continue_final, the model goes on with it).
    const bool alternate = t.family == ChatFamily::Llama2 || t.family == ChatFamily::Mistral ||
                           t.family == ChatFamily::Mistral2 || t.family == ChatFamily::Mistral3 ||
                           t.family == ChatFamily::MistralTekken;
    if (std::none_of(messages.begin(), messages.end(), [](const ChatMessage& m) { return m.role == "user"; }))
        fail("a chat conversation needs a user turn (", messages.size(), " turns given)");
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string& role = messages[i].role;
        if (role != "user" && role != "assistant") fail("chat turn ", i, " has role \"", role, "\" (user or assistant)");
        if (alternate && (role == "user") != (i % 2 == 0))
            fail("chat turn ", i, " has role \"", role, "\" where \"", i % 2 == 0 ? "user" : "assistant",
                 "\" belongs (this model's chat template (", chat_family_name(t.family),
                 ") takes user and assistant turns in turn, user first)");
    }
    if (continue_final && (messages.back().role != "assistant" || messages.back().content.empty()))
        fail("continuing the final message: the conversation ends with the start of the assistant's reply, not empty");
    std::string out;
    switch (t.family) {
        case ChatFamily::ChatML: {
            const std::optional<std::string> sys = system ? system : t.default_system;
            if (sys) out += "<|im_start|>system\n" + *sys + "<|im_end|>\n";
            // Qwen3 (final_reply_thinks) writes replies after the last query as its tools block does;
            // Qwen3 and QwQ (strips_reasoning) keep only the content of the others.
            const size_t last_query = last_query_index(messages);
            for (size_t i = 0; i < messages.size(); ++i) {
                const ChatMessage& m = messages[i];
                if (m.role == "user" || !t.strips_reasoning) {
                    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
                    continue;
                }
                const SplitReply r = split_reasoning(m.content);
                out += qwen3_reply(r, t.final_reply_thinks && i > last_query, i + 1 == messages.size()) + "<|im_end|>\n";
            }
            if (!continue_final) out += "<|im_start|>assistant\n";
            return out;
        }
        case ChatFamily::Llama3:
        case ChatFamily::Llama31:
            out += bos_token;
            if (t.family == ChatFamily::Llama31) {
                out += "<|start_header_id|>system<|end_header_id|>\n\n";
                out += "Cutting Knowledge Date: December 2023\nToday Date: " +
                       (t.date_string.empty() ? today_llama_date() : t.date_string) + "\n\n";
                out += (system ? trim_js(*system) : std::string()) + "<|eot_id|>";
            } else if (system) {
                out += "<|start_header_id|>system<|end_header_id|>\n\n" + trim_js(*system) + "<|eot_id|>";
            }
            for (const ChatMessage& m : messages)
                out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim_js(m.content) + "<|eot_id|>";
            if (!continue_final) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
            return out;
        case ChatFamily::Llama2:
            for (size_t i = 0; i < messages.size(); ++i) {
                const ChatMessage& m = messages[i];
                const std::string content =
                    i == 0 && system ? "<<SYS>>\n" + *system + "\n<</SYS>>\n\n" + m.content : m.content;
                if (m.role == "user") out += bos_token + "[INST] " + trim_js(content) + " [/INST]";
                else out += " " + trim_js(content) + " " + eos_token;
            }
            return out;
        case ChatFamily::Mistral:
            if (system) fail("this model's chat template (Mistral [INST]) does not accept a system message; drop --system");
            out += bos_token;
            for (const ChatMessage& m : messages) {
                if (m.role == "user") out += "[INST] " + m.content + " [/INST]";
                else out += m.content + eos_token + " ";
            }
            return out;
        case ChatFamily::Mistral2:
            out += bos_token;
            for (size_t i = 0; i < messages.size(); ++i) {
                const ChatMessage& m = messages[i];
                if (m.role == "user") out += " [INST] " + (i == 0 && system ? *system + "\n\n" : "") + m.content + " [/INST]";
                else out += " " + m.content + eos_token;
            }
            return out;
        case ChatFamily::Mistral3:
        case ChatFamily::MistralTekken:
            return render_mistral_v3(t, system, messages, bos_token, eos_token, {}, true);
        case ChatFamily::DeepSeek:
            out += bos_token + (system ? *system : std::string());
            for (const ChatMessage& m : messages) {
                if (m.role == "user") {
                    out += "<｜User｜>" + m.content;
                    continue;
                }
                // R1: content.split('</think>')[-1], what follows the last </think>.
                const size_t think = t.strips_reasoning ? m.content.rfind("</think>") : std::string::npos;
                out += "<｜Assistant｜>" + (think == std::string::npos ? m.content : m.content.substr(think + 8)) +
                       "<｜end▁of▁sentence｜>";
            }
            if (continue_final) return out;
            return out + "<｜Assistant｜>" + (t.opens_thinking ? "<think>\n" : "");
    }
    return out;
}

}  // namespace

std::string render_conversation(const ChatTemplate& t, const std::optional<std::string>& system,
                                const std::vector<ChatMessage>& messages, const std::string& bos_token,
                                const std::string& eos_token, const std::vector<nlohmann::ordered_json>& tools,
                                const ChatKwargs& kwargs) {
    ChatTemplate dated = t;
    if (!kwargs.date_string.empty() && t.family == ChatFamily::Llama31) dated.date_string = kwargs.date_string;
    const std::string text = render_turns(dated, system, messages, bos_token, eos_token, tools,
                                          kwargs.tools_in_user_message, kwargs.continue_final_message);
    if (kwargs.continue_final_message) {
        // transformers: rendered[: rendered.rindex(final) + len(final)], final stripped if not found.
        std::string last = messages.back().content;
        size_t at = text.rfind(last);
        if (at == std::string::npos) {
            last = trim_js(last);
            at = last.empty() ? std::string::npos : text.rfind(last);
        }
        if (at == std::string::npos)
            fail("continuing the final message: this model's chat template (", chat_family_name(t.family),
                 ") does not write the final message's content as it is given, so the reply cannot go on from it");
        return text.substr(0, at + last.size());
    }
    // Qwen3's enable_thinking false: an empty think block after the generation prompt.
    const char* after = !kwargs.enable_thinking && t.thinking_switch ? "<think>\n\n</think>\n\n" : "";
    return text + after;
}

namespace {
std::string python_json_at(const nlohmann::ordered_json& j, int indent, int depth) {
    // A recursion per level: a bound keeps JSON from outside (a model's reply) off the stack's end.
    if (depth > kMaxPythonJsonDepth) fail("JSON nested deeper than ", kMaxPythonJsonDepth, " levels");
    if (!j.is_object() && !j.is_array()) return j.dump();
    if (j.empty()) return j.is_object() ? "{}" : "[]";
    // Python: ", " between items on one line; with an indent, "," and a new line at the depth.
    const std::string sep = indent < 0 ? ", " : ",\n" + std::string(size_t(indent) * size_t(depth + 1), ' ');
    const std::string open = indent < 0 ? "" : "\n" + std::string(size_t(indent) * size_t(depth + 1), ' ');
    const std::string close = indent < 0 ? "" : "\n" + std::string(size_t(indent) * size_t(depth), ' ');
    std::string s = j.is_object() ? "{" : "[";
    s += open;
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) s += sep;
        first = false;
        if (j.is_object()) s += nlohmann::ordered_json(it.key()).dump() + ": ";
        s += python_json_at(it.value(), indent, depth + 1);
    }
    return s + close + (j.is_object() ? "}" : "]");
}
}  // namespace

std::string python_json(const nlohmann::ordered_json& j, int indent) { return python_json_at(j, indent, 0); }

namespace {

const char kWhiteSpace[] = " \t\r\n";
const std::string kPythonTag = "<|python_tag|>";
const std::string kMistralCalls = "[TOOL_CALLS]";

ToolCallsSoFar no_calls() {
    ToolCallsSoFar r;
    r.plain = true;
    return r;
}

// The call a scanned object holds: the root (self -1) or the item `self` of a root array. Its
// arguments are the first member named in `keys`; without one the call has none (`needed`) or
// {}. Appends it to `calls` once its name is whole. Bad: it is not, and cannot become, a call.
enum class CallRead { Bad, Partial, Whole };
CallRead read_call(const JsonPrefix& j, int self, std::initializer_list<const char*> keys, bool needed,
                   std::vector<ChatToolCall>& calls) {
    const char kind = self < 0 ? (j.out.empty() ? '{' : j.out[0]) : j.items[size_t(self)].kind;
    if (kind != '{') return CallRead::Bad;
    const bool closed = self < 0 ? j.complete : j.items[size_t(self)].complete;
    const JsonPrefix::Item *name = nullptr, *args = nullptr;
    for (const JsonPrefix::Item& it : j.items) {
        if (it.parent != self) continue;
        if (!name && it.key == "name") name = &it;
        for (const char* k : keys)
            if (!args && it.key == k) args = &it;
    }
    if ((name && name->kind != '"') || (args && args->kind != '{')) return CallRead::Bad;
    if (closed && (!name || (needed && !args))) return CallRead::Bad;
    if (!name || !name->complete) return CallRead::Partial;
    const std::string n = nlohmann::ordered_json::parse(j.out.substr(name->begin, name->end - name->begin)).get<std::string>();
    if (n.empty()) return CallRead::Bad;
    calls.push_back({n, args ? j.out.substr(args->begin, args->end - args->begin) : closed ? "{}" : ""});
    return closed ? CallRead::Whole : CallRead::Partial;
}

// Qwen's <tool_call> blocks (vLLM's hermes parser's rules; a "</tool_call>" inside a string of
// the JSON does not end the block here, where vLLM's regular expression cuts it there).
ToolCallsSoFar hermes_calls(const std::string& text, bool done) {
    static const std::string open = "<tool_call>", close = "</tool_call>";
    ToolCallsSoFar r;
    size_t at = text.find(open);
    if (at == std::string::npos) return done ? no_calls() : r;
    r.content = text.substr(0, at);
    r.content.erase(r.content.find_last_not_of(kWhiteSpace) + 1);
    while (at != std::string::npos) {
        const JsonPrefix j = scan_json_prefix(text, at + open.size(), done);
        if (!j.valid || read_call(j, -1, {"arguments"}, false, r.calls) == CallRead::Bad) return no_calls();
        if (!j.complete) return done ? no_calls() : r;
        // After the JSON: white space, then </tool_call> (or the reply's end: an open block counts).
        const size_t e = text.find_first_not_of(kWhiteSpace, j.end);
        if (e == std::string::npos) return r;
        const size_t n = std::min(close.size(), text.size() - e);
        if (text.compare(e, n, close, 0, n) != 0 || (done && n < close.size())) return no_calls();
        if (n < close.size()) return r;  // "</tool_call>" may be forming
        at = text.find(open, e + close.size());
    }
    return r;
}

// Llama 3.1/3.2's JSON calls (vLLM's llama3_json parser's rules): the whole reply, after white
// space and an optional <|python_tag|>, is one or more {"name": ..., "parameters": {...}} objects
// ("arguments" also read, the first of the two taken) separated by ';'. Anything else is plain.
ToolCallsSoFar llama_calls(const std::string& text, bool done) {
    ToolCallsSoFar r;
    size_t at = text.find_first_not_of(kWhiteSpace);
    if (at == std::string::npos) return done ? no_calls() : r;
    const size_t tag = std::min(kPythonTag.size(), text.size() - at);
    if (text.compare(at, tag, kPythonTag, 0, tag) == 0) {
        if (tag < kPythonTag.size()) return done ? no_calls() : r;
        at += tag;
    }
    for (;;) {
        at = text.find_first_not_of(kWhiteSpace, at);
        if (at == std::string::npos) return done ? no_calls() : r;
        if (text[at] != '{') return no_calls();
        const JsonPrefix j = scan_json_prefix(text, at, done);
        if (!j.valid || read_call(j, -1, {"parameters", "arguments"}, true, r.calls) == CallRead::Bad) return no_calls();
        if (!j.complete) return done ? no_calls() : r;
        at = text.find_first_not_of(kWhiteSpace, j.end);
        if (at == std::string::npos) return r;
        if (text[at] != ';') return no_calls();
        ++at;
    }
}

// Mistral's [TOOL_CALLS] (vLLM's mistral parser's rules): the text before the first one is the
// content; the rest, without the markers, one JSON array of {"name": ..., "arguments": {...}}.
ToolCallsSoFar mistral_calls(const std::string& text, bool done) {
    const size_t bot = text.find(kMistralCalls);
    if (bot == std::string::npos) return done ? no_calls() : ToolCallsSoFar{};
    std::string rest = replace_literal(text.substr(bot + kMistralCalls.size()), kMistralCalls, "");
    if (!done)  // a marker that is forming is not JSON
        for (size_t k = std::min(rest.size(), kMistralCalls.size() - 1); k > 0; --k)
            if (rest.compare(rest.size() - k, k, kMistralCalls, 0, k) == 0) {
                rest.resize(rest.size() - k);
                break;
            }
    ToolCallsSoFar r = json_array_calls(rest, 0, "arguments", done);
    r.content = text.substr(0, bot);
    return r;
}

// Where a stream holds text that may open a call marked by `open`: at the marker, else at a suffix
// that could still grow into it, else nowhere (text.size()).
size_t hold_at_marker(const std::string& text, const std::string& open) {
    const size_t at = text.find(open);
    if (at != std::string::npos) return at;
    for (size_t k = std::min(text.size(), open.size() - 1); k > 0; --k)
        if (text.compare(text.size() - k, k, open, 0, k) == 0) return text.size() - k;
    return text.size();
}

}  // namespace

ToolCallsSoFar json_array_calls(const std::string& text, size_t at, const char* args_key, bool done) {
    ToolCallsSoFar r;
    at = text.find_first_not_of(kWhiteSpace, at);
    if (at == std::string::npos) return done ? no_calls() : r;
    if (text[at] != '[') return no_calls();
    const JsonPrefix j = scan_json_prefix(text, at, done);
    if (!j.valid) return no_calls();
    for (size_t k = 0; k < j.items.size(); ++k) {
        if (j.items[k].parent != -1) continue;
        const CallRead c = read_call(j, int(k), {args_key}, true, r.calls);
        if (c == CallRead::Bad) return no_calls();
        if (c == CallRead::Partial) break;
    }
    if (!j.complete) return done ? no_calls() : r;
    if (text.find_first_not_of(kWhiteSpace, j.end) != std::string::npos || r.calls.empty()) return no_calls();
    return r;
}

ToolCallsSoFar tool_calls_so_far(ChatTools format, const std::string& text, bool done) {
    if (format == ChatTools::Llama3Json) return llama_calls(text, done);
    if (format == ChatTools::MistralJson) return mistral_calls(text, done);
    if (format == ChatTools::None) return no_calls();
    return hermes_calls(text, done);
}

ParsedToolCalls parse_tool_calls(ChatTools format, const std::string& text) {
    ToolCallsSoFar r = tool_calls_so_far(format, text, true);
    if (r.plain) return ParsedToolCalls{false, text, {}};
    return ParsedToolCalls{true, std::move(r.content), std::move(r.calls)};
}

size_t tool_call_hold(ChatTools format, const std::string& text) {
    if (format == ChatTools::None) return text.size();
    if (format == ChatTools::Llama3Json) {
        // The reply is a call or plain text as a whole: held while it may still be one.
        const size_t at = text.find_first_not_of(kWhiteSpace);
        if (at == std::string::npos || text[at] == '{') return 0;
        const size_t n = std::min(text.size() - at, kPythonTag.size());
        return text.compare(at, n, kPythonTag, 0, n) == 0 ? 0 : text.size();
    }
    return hold_at_marker(text, format == ChatTools::MistralJson ? kMistralCalls : "<tool_call>");
}

std::string render_chat(const ChatTemplate& t, const std::optional<std::string>& system, const std::string& user,
                        const std::string& bos_token) {
    return render_conversation(t, system, {ChatMessage{"user", user}}, bos_token, "");
}

}  // namespace shardlm
