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
//   Mistral v0.2                   <s> [INST] system\n\nuser [/INST] reply</s> [INST] ... (system on the first turn)
//   Mistral v0.3 (v3), Nemo        <s>[INST] user[/INST] reply</s>[INST] system\n\nuser[/INST] (system on the
//   (v3-tekken)                    last turn; Nemo's spelling has no spaces after the control tokens and
//                                  keeps replies untrimmed)
//   DeepSeek (V3, R1 and its       <｜begin▁of▁sentence｜>system<｜User｜>user<｜Assistant｜>reply<｜end▁of▁sentence｜>
//   Qwen/Llama distillations)      ...<｜User｜>user<｜Assistant｜> (R1: earlier replies keep what follows their
//                                  last </think>, and the generation prompt opens <think>\n)
//
// Tool calling (ChatTemplate::tools): ChatML templates with Qwen's tools block (Qwen2/2.5, Qwen3)
// list the functions' JSON schemas in the system message between <tools></tools>, write a reply's
// calls <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call> and the tools' results as a
// user turn of <tool_response> blocks. Llama 3.1/3.2/3.3's templates put the functions
// (tojson(indent=4)) in the first user message after "Environment: ipython" in the system header,
// write a reply's one call as {"name": ..., "parameters": ...} and a result as an ipython turn.
// Mistral's v3 templates (v0.3, Nemo) list the functions in [AVAILABLE_TOOLS] before the last user
// turn, write a reply's calls as [TOOL_CALLS] [{"name", "arguments", "id"}, ...] and a result as
// [TOOL_RESULTS] {"content": ..., "call_id": ...}[/TOOL_RESULTS]; their call ids are 9 characters.
// parse_tool_calls reads the calls back out of a reply in any of these formats.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm {

enum class ChatFamily { ChatML, Llama3, Llama31, Llama2, Mistral, Mistral2, Mistral3, MistralTekken, DeepSeek };

// Which tools block a ChatML template writes: none, Qwen2/2.5's (a default system message before
// it when none is given; arguments printed as JSON) or Qwen3's (no default system message;
// arguments printed as given; a reply after the last user query keeps its reasoning).
// Llama3Json: Llama 3.1/3.2/3.3's JSON calls (family Llama31), the tools in the first user message.
// MistralJson: Mistral v3's [TOOL_CALLS] (families Mistral3, MistralTekken).
enum class ChatTools { None, Qwen25, Qwen3, Llama3Json, MistralJson };

struct ChatTemplate {
    ChatFamily family = ChatFamily::ChatML;
    ChatTools tools = ChatTools::None;
    std::optional<std::string> default_system;  // ChatML: used when no system message is given
    std::optional<std::string> tools_system;    // Qwen25 tools: the system message before the tools block
    bool strips_reasoning = false;              // ChatML (Qwen3), DeepSeek (R1): earlier replies without <think>...</think>
    std::string date_string;                    // Llama 3.1: "Today Date: ..." (empty: today's date)
    // ChatML (Qwen3): enable_thinking false opens the reply with an empty <think></think> block.
    bool thinking_switch = false;
    // DeepSeek (R1): the generation prompt opens the reasoning ("<think>\n"), so a reply starts in it.
    bool opens_thinking = false;
    // ChatML (Qwen3): a reply after the last user turn that is the last message is written with its
    // think block, an empty one where it has none (what a continued final message starts with).
    bool final_reply_thinks = false;
};

// Template variables a request may set (vLLM's chat_template_kwargs), where the template reads
// them (elsewhere they change nothing, as in Jinja).
struct ChatKwargs {
    bool enable_thinking = true;  // Qwen3: false adds "<think>\n\n</think>\n\n" after the generation prompt
    std::string date_string;      // Llama 3.1/3.2: "Today Date: ..." (empty: the template's own)
    bool tools_in_user_message = true;  // Llama 3.1/3.2: false lists the tools in the system message
    // Not a template variable, but how the conversation is rendered (vLLM's request field, llama.cpp's
    // assistant prefill): the last turn is the start of the assistant's reply, which the model goes on
    // with. Rendered as transformers' apply_chat_template(continue_final_message=True) does: without
    // the generation prompt, and cut after the last occurrence of that turn's content (or of its
    // content trimmed, where the template trims it). Not with tools or tool turns.
    bool continue_final_message = false;
};

// Recognises `source`; `where` names the file for the error message.
ChatTemplate recognise_chat_template(const std::string& source, const std::string& where);

// A function call of an assistant turn: its name and its arguments as the JSON text the template
// prints (Python's json.dumps spacing: ", " and ": ", as transformers' tojson writes them), and
// its id (only Mistral's templates print it).
struct ChatToolCall {
    std::string name;
    std::string arguments;
    std::string id = {};
};

// One turn of a conversation: role "user" or "assistant", or (templates with tools) "tool", the
// result of a call (tool_call_id: the call's id, which Mistral's templates print); an assistant
// turn may carry calls.
struct ChatMessage {
    ChatMessage(std::string r, std::string c, std::vector<ChatToolCall> calls = {}, std::string call_id = {})
        : role(std::move(r)), content(std::move(c)), tool_calls(std::move(calls)), tool_call_id(std::move(call_id)) {}
    std::string role;
    std::string content;
    std::vector<ChatToolCall> tool_calls;
    std::string tool_call_id;
};

// The rendered prompt text (to be encoded without adding special tokens) of a conversation that
// alternates user and assistant turns, user first and last, ending with the generation prompt
// (kwargs.continue_final_message: assistant last, its content non-empty, no generation prompt).
// eos_token closes the replies where the family's template spells it (Llama 2, Mistral).
// With `tools` (each {"type": "function", "function": {...}} as the request gave it, keys in its
// order), or tool turns or calls in the messages, the template must have a tools block (else
// Error): then the conversation starts with a user turn and ends with a user or tool turn, tool
// turns follow an assistant turn with calls or another tool turn, and no two user turns meet
// (Llama3Json: at most one call per assistant turn, as its template raises; MistralJson: every
// call and tool turn has an id of 9 characters, and the turns other than calls and results
// alternate user and assistant, as its template raises).
std::string render_conversation(const ChatTemplate& t, const std::optional<std::string>& system,
                                const std::vector<ChatMessage>& messages, const std::string& bos_token,
                                const std::string& eos_token, const std::vector<nlohmann::ordered_json>& tools = {},
                                const ChatKwargs& kwargs = {});

// A reply's calls in the template's format (vLLM's parsers' rules). Qwen (hermes): the text before
// the first <tool_call> is the content (without trailing white space), each block's JSON
// {"name": ..., "arguments": {...}} a call; a block left open at the end of the text counts when its
// JSON is complete. Llama3Json: the whole reply (after white space and an optional <|python_tag|>)
// is one or more {"name": ..., "parameters": {...}} objects separated by ';' ("arguments" read
// too, the first of the two keys taken), the content empty. MistralJson: the text before the
// first [TOOL_CALLS] is the content, what follows it one JSON array of {"name": ...,
// "arguments": {...}} objects.
// Arguments are re-written as python_json text (json_prefix.h: a repeated key kept). `called` is
// false, and content the whole text, when the reply holds no call or one is not such JSON (the
// reply is then plain text).
struct ParsedToolCalls {
    bool called = false;
    std::string content;
    std::vector<ChatToolCall> calls;
};
ParsedToolCalls parse_tool_calls(ChatTools format, const std::string& text);
// The same read of a reply as far as it goes, for streaming calls as the model writes them
// (done: the reply has ended; parse_tool_calls is this). calls: those whose name is whole, each
// with the part of its arguments' text that the reply so far fixes (json_prefix.h), so that a
// longer reply's calls extend a shorter one's. plain: the text is not calls (streaming: and will
// not become them, whatever follows). content: with calls, the text before them.
struct ToolCallsSoFar {
    bool plain = false;
    std::string content;
    std::vector<ChatToolCall> calls;
};
ToolCallsSoFar tool_calls_so_far(ChatTools format, const std::string& text, bool done);
// A reply that is a JSON array (from text[at], after white space) of {"name": ..., args_key:
// {...}} objects, read so: Mistral's calls after [TOOL_CALLS] ("arguments"), the API's
// tool_choice "required" ("parameters"). An empty array is no calls.
ToolCallsSoFar json_array_calls(const std::string& text, size_t at, const char* args_key, bool done);
// Where text that may become a tool call starts, so a stream sends the text before it. Qwen: the
// first "<tool_call>", else the start of a suffix that could still grow into one, else
// text.size(). Llama3Json: 0 while the reply so far is white space or opens with '{' or
// <|python_tag|> (a call is the whole reply), else text.size(). MistralJson: as Qwen's, with
// "[TOOL_CALLS]".
size_t tool_call_hold(ChatTools format, const std::string& text);

// JSON text as Python's json.dumps(ensure_ascii=False, indent=indent) writes it (transformers'
// tojson): ", " and ": " between items, keys in their order; with indent >= 0 each item on its
// own line, "," ending it, `indent` spaces per level (empty objects and arrays stay {} and []).
// Throws Error past kMaxPythonJsonDepth levels.
std::string python_json(const nlohmann::ordered_json& j, int indent = -1);
constexpr int kMaxPythonJsonDepth = 512;
// The same for one user message.
std::string render_chat(const ChatTemplate& t, const std::optional<std::string>& system, const std::string& user,
                        const std::string& bos_token);

const char* chat_family_name(ChatFamily f);

// JavaScript/Jinja trim(): white space removed from both ends.
std::string trim_js(const std::string& s);

}  // namespace shardlm
