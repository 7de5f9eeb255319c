// Chat templates without a Jinja engine: the `chat_template` of tokenizer_config.json is
// recognised as one of the families below by fingerprints of its source, and the text it renders
// for [optional system message, user, assistant, ..., user] with add_generation_prompt=true is
// produced directly. A template that matches no family is an error rather than a guess.
//
//   ChatML (Qwen2/2.5/3, SmolLM2)  <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n
//                                  (with the template's default system message when it has one)
//   Llama 3                        <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\n
//                                  trim(content)<|eot_id|> ... (3.1/3.2: dated system header)
//                                  Qwen3: earlier replies lose their <think>...</think> part
//   Llama 2                        <s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] (stripped),
//                                  each reply " reply </s>" (stripped), the next user turn <s>[INST] ...
//   Mistral v0.1                   <s>[INST] user [/INST]reply</s> [INST] ... (no system message)
//
// Tool calling (ChatML templates with Qwen's tools block, Qwen2/2.5 and Qwen3; ChatTemplate::tools):
// the functions' JSON schemas listed in the system message between <tools></tools>, a reply's
// calls written <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>, the tools' results
// as a user turn of <tool_response> blocks; parse_tool_calls reads the calls back out of a reply.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm {

enum class ChatFamily { ChatML, Llama3, Llama31, Llama2, Mistral };

// Which tools block a ChatML template writes: none, Qwen2/2.5's (a default system message before
// it when none is given; arguments printed as JSON) or Qwen3's (no default system message;
// arguments printed as given; a reply after the last user query keeps its reasoning).
enum class ChatTools { None, Qwen25, Qwen3 };

struct ChatTemplate {
    ChatFamily family = ChatFamily::ChatML;
    ChatTools tools = ChatTools::None;
    std::optional<std::string> default_system;  // ChatML: used when no system message is given
    std::optional<std::string> tools_system;    // Qwen25 tools: the system message before the tools block
    bool strips_reasoning = false;              // ChatML (Qwen3): earlier replies without <think>...</think>
    std::string date_string;                    // Llama 3.1: "Today Date: ..." (empty: today's date)
};

// Recognises `source`; `where` names the file for the error message.
ChatTemplate recognise_chat_template(const std::string& source, const std::string& where);

// A function call of an assistant turn: its name and its arguments as the JSON text the template
// prints (Python's json.dumps spacing: ", " and ": ", as transformers' tojson writes them).
struct ChatToolCall {
    std::string name;
    std::string arguments;
};

// One turn of a conversation: role "user" or "assistant", or (templates with tools) "tool", the
// result of a call; an assistant turn may carry calls.
struct ChatMessage {
    ChatMessage(std::string r, std::string c, std::vector<ChatToolCall> calls = {})
        : role(std::move(r)), content(std::move(c)), tool_calls(std::move(calls)) {}
    std::string role;
    std::string content;
    std::vector<ChatToolCall> tool_calls;
};

// The rendered prompt text (to be encoded without adding special tokens) of a conversation that
// alternates user and assistant turns, user first and last, ending with the generation prompt.
// eos_token closes the replies where the family's template spells it (Llama 2, Mistral).
// With `tools` (each function's JSON text as tojson prints it), or tool turns or calls in the
// messages, the template must have a tools block (else Error): then the conversation starts with a
// user turn and ends with a user or tool turn, tool turns follow an assistant turn with calls or
// another tool turn, and no two user turns meet.
std::string render_conversation(const ChatTemplate& t, const std::optional<std::string>& system,
                                const std::vector<ChatMessage>& messages, const std::string& bos_token,
                                const std::string& eos_token, const std::vector<std::string>& tools = {});

// A reply's calls in the tools block's format: the text before the first <tool_call> (content,
// without trailing white space), and each <tool_call> block's {"name": ..., "arguments": {...}}
// (arguments re-written as python_json text, as vLLM's hermes parser writes them). `called` is false, and content the whole text, when
// there is no block or one is not such JSON (the reply is then plain text, as vLLM's hermes parser
// treats it). A block left open at the end of the text counts when its JSON is complete.
struct ParsedToolCalls {
    bool called = false;
    std::string content;
    std::vector<ChatToolCall> calls;
};
ParsedToolCalls parse_tool_calls(const std::string& text);
// Where text that may become a tool call starts: the first "<tool_call>", else the start of a
// suffix that could still grow into one, else text.size(). A stream sends the text up to there.
size_t tool_call_hold(const std::string& text);

// JSON text as Python's json.dumps(ensure_ascii=False) writes it (transformers' tojson): ", " and
// ": " between items, keys in their order. Throws Error past kMaxPythonJsonDepth levels.
std::string python_json(const nlohmann::ordered_json& j);
constexpr int kMaxPythonJsonDepth = 512;
// The same for one user message.
std::string render_chat(const ChatTemplate& t, const std::optional<std::string>& system, const std::string& user,
                        const std::string& bos_token);

const char* chat_family_name(ChatFamily f);

// JavaScript/Jinja trim(): white space removed from both ends.
std::string trim_js(const std::string& s);

}  // namespace shardlm
