#include "tokenizer/chat_template.h"

#include <ctime>

#include "core/error.h"
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
    if (has(c, "{{bos_token}}") && has(c, "'[INST] '+message.content+' [/INST]'") && !has(c, "system")) {
        t.family = ChatFamily::Mistral;
        return t;
    }
    fail(where, ": unrecognised chat_template (supported families: ChatML/Qwen, Llama 3, Llama 2, Mistral [INST]); "
                "render the prompt yourself and pass it with --prompt");
}

std::string render_conversation(const ChatTemplate& t, const std::optional<std::string>& system,
                                const std::vector<ChatMessage>& messages, const std::string& bos_token,
                                const std::string& eos_token) {
    if (messages.empty() || messages.size() % 2 == 0)
        fail("a chat conversation alternates user and assistant turns and ends with a user turn (", messages.size(),
             " turns given)");
    for (size_t i = 0; i < messages.size(); ++i)
        if (messages[i].role != (i % 2 == 0 ? "user" : "assistant"))
            fail("chat turn ", i, " has role \"", messages[i].role, "\" where \"", i % 2 == 0 ? "user" : "assistant",
                 "\" belongs (the roles alternate, user first)");
    std::string out;
    switch (t.family) {
        case ChatFamily::ChatML: {
            const std::optional<std::string> sys = system ? system : t.default_system;
            if (sys) out += "<|im_start|>system\n" + *sys + "<|im_end|>\n";
            for (const ChatMessage& m : messages) {
                std::string content = m.content;
                const size_t think = content.rfind("</think>");
                if (m.role == "assistant" && t.strips_reasoning && think != std::string::npos) {
                    content = content.substr(think + 8);
                    content.erase(0, content.find_first_not_of('\n') == std::string::npos ? content.size()
                                                                                          : content.find_first_not_of('\n'));
                }
                out += "<|im_start|>" + m.role + "\n" + content + "<|im_end|>\n";
            }
            out += "<|im_start|>assistant\n";
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
            out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
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
    }
    return out;
}

std::string render_chat(const ChatTemplate& t, const std::optional<std::string>& system, const std::string& user,
                        const std::string& bos_token) {
    return render_conversation(t, system, {ChatMessage{"user", user}}, bos_token, "");
}

}  // namespace shardlm
