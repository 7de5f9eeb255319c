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
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace shardlm {

enum class ChatFamily { ChatML, Llama3, Llama31, Llama2, Mistral };

struct ChatTemplate {
    ChatFamily family = ChatFamily::ChatML;
    std::optional<std::string> default_system;  // ChatML: used when no system message is given
    bool strips_reasoning = false;              // ChatML (Qwen3): earlier replies without <think>...</think>
    std::string date_string;                    // Llama 3.1: "Today Date: ..." (empty: today's date)
};

// Recognises `source`; `where` names the file for the error message.
ChatTemplate recognise_chat_template(const std::string& source, const std::string& where);

// One turn of a conversation: role "user" or "assistant".
struct ChatMessage {
    std::string role;
    std::string content;
};

// The rendered prompt text (to be encoded without adding special tokens) of a conversation that
// alternates user and assistant turns, user first and last, ending with the generation prompt.
// eos_token closes the replies where the family's template spells it (Llama 2, Mistral).
std::string render_conversation(const ChatTemplate& t, const std::optional<std::string>& system,
                                const std::vector<ChatMessage>& messages, const std::string& bos_token,
                                const std::string& eos_token);
// The same for one user message.
std::string render_chat(const ChatTemplate& t, const std::optional<std::string>& system, const std::string& user,
                        const std::string& bos_token);

const char* chat_family_name(ChatFamily f);

// JavaScript/Jinja trim(): white space removed from both ends.
std::string trim_js(const std::string& s);

}  // namespace shardlm
