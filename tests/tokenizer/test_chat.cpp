// Chat templates: family recognition by fingerprint and the rendered text. (The renderings are
// checked against the real Jinja engine in test_reference.cpp.)
#include <gtest/gtest.h>

#include "core/error.h"
#include "tiny_tokenizer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace shardlm;
using namespace shardlm::test;

TEST(ChatTemplate, ChatMLWithAndWithoutDefaultSystem) {
    const ChatTemplate plain = recognise_chat_template(tiny_byte_level_config()["chat_template"], "test");
    EXPECT_EQ(plain.family, ChatFamily::ChatML);
    EXPECT_FALSE(plain.default_system);
    EXPECT_EQ(render_chat(plain, std::nullopt, "hi", ""), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(render_chat(plain, std::string("S"), "hi", ""),
              "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    const std::string smol =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
        "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\n' }}{% endif %}";
    const ChatTemplate s = recognise_chat_template(smol, "test");
    ASSERT_TRUE(s.default_system);
    EXPECT_EQ(*s.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

TEST(ChatTemplate, LlamaFamilies) {
    const Tokenizer sp = Tokenizer::from_json_text(tiny_sp_tokenizer().dump(), tiny_sp_config().dump());
    EXPECT_EQ(sp.chat_family(), "llama2");
    EXPECT_EQ(sp.apply_chat_template(std::string(" Sys "), " Hi "), "<s>[INST] <<SYS>>\n Sys \n<</SYS>>\n\n Hi [/INST]");
    EXPECT_EQ(sp.apply_chat_template(std::nullopt, " Hi "), "<s>[INST] Hi [/INST]");
    const std::string llama3 =
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
        "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
        "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant"
        "<|end_header_id|>\n\n' }}";
    const ChatTemplate l3 = recognise_chat_template(llama3, "test");
    EXPECT_EQ(l3.family, ChatFamily::Llama3);
    EXPECT_EQ(render_chat(l3, std::nullopt, " hi\n", "<|begin_of_text|>"),
              "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    const std::string mistral =
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + "
        "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ "
        "raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";
    const ChatTemplate m = recognise_chat_template(mistral, "test");
    EXPECT_EQ(m.family, ChatFamily::Mistral);
    EXPECT_EQ(render_chat(m, std::nullopt, " hi ", "<s>"), "<s>[INST]  hi  [/INST]");
    EXPECT_THROW(render_chat(m, std::string("sys"), "hi", "<s>"), Error);
}

TEST(ChatTemplate, UnknownIsAnError) {
    try {
        recognise_chat_template("{{ messages | tojson }}", "some/tokenizer_config.json");
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("some/tokenizer_config.json: unrecognised chat_template"), std::string::npos);
    }
    EXPECT_EQ(trim_js("\xE3\x80\x80 a b \t\n"), "a b");
}

// Tool calls read back out of a reply (vLLM's hermes parser's rules): the text before the first
// block is the content, each block's JSON a call, arguments re-written in Python's spacing; a
// reply whose block is not such JSON is plain text.
TEST(ChatTools, ParseToolCalls) {
    ParsedToolCalls p = parse_tool_calls("Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                         "{\"city\":\"Paris\",\"days\":[1,2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", "
                                         "\"arguments\": {}}\n</tool_call>");
    ASSERT_TRUE(p.called);
    EXPECT_EQ(p.content, "Let me look.");
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Paris\", \"days\": [1, 2]}");
    EXPECT_EQ(p.calls[1].name, "now");
    EXPECT_EQ(p.calls[1].arguments, "{}");
    // A last block left open (the reply ended at max_tokens or on <|im_end|> without the close).
    p = parse_tool_calls("<tool_call>\n{\"name\": \"now\"}\n");
    ASSERT_TRUE(p.called);
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].arguments, "{}");
    for (const char* plain : {"No tools needed.", "<tool_call>\n{\"name\": \"now\", \"arguments\": {\n</tool_call>",
                              "<tool_call>\n{\"arguments\": {}}\n</tool_call>", "<tool_call>[1]</tool_call>",
                              "<tool_call>{\"name\": \"f\", \"arguments\": \"x\"}</tool_call>"}) {
        p = parse_tool_calls(plain);
        EXPECT_FALSE(p.called) << plain;
        EXPECT_EQ(p.content, plain);
        EXPECT_TRUE(p.calls.empty()) << plain;
    }
}

// What a stream may send before it knows whether a call starts: up to a "<tool_call>" or a suffix
// that could still become one.
TEST(ChatTools, ToolCallHold) {
    EXPECT_EQ(tool_call_hold(""), 0u);
    EXPECT_EQ(tool_call_hold("Hello"), 5u);
    EXPECT_EQ(tool_call_hold("Hello <"), 6u);
    EXPECT_EQ(tool_call_hold("Hello <tool_c"), 6u);
    EXPECT_EQ(tool_call_hold("a <tool_call>\n{"), 2u);
    EXPECT_EQ(tool_call_hold("a < b"), 5u);
    EXPECT_EQ(tool_call_hold("<tool_calx"), 10u);
}

// A reply whose arguments nest past python_json's bound is plain text, not a crash.
TEST(ChatTools, DeepArgumentsAreNoCall) {
    const std::string deep = std::string(5000, '[') + std::string(5000, ']');
    const ParsedToolCalls p = parse_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + deep + "}}</tool_call>");
    EXPECT_FALSE(p.called);
    EXPECT_THROW(python_json(nlohmann::ordered_json::parse(deep)), Error);
}

TEST(ChatTools, PythonJson) {
    const auto j = nlohmann::ordered_json::parse(R"({"b": [1, 2.5, "x\n"], "a": {"é": null, "t": true}, "e": {}})");
    EXPECT_EQ(python_json(j), "{\"b\": [1, 2.5, \"x\\n\"], \"a\": {\"é\": null, \"t\": true}, \"e\": {}}");
}

// Tools need a template with a tools block; tool turns must answer calls; the conversation ends
// with a user or tool turn. (The renderings themselves are checked against Jinja in
// test_reference.cpp.)
TEST(ChatTools, RefusedWhereTheTemplateOrTheTurnsCannotTakeThem) {
    const ChatTemplate plain = recognise_chat_template(tiny_byte_level_config()["chat_template"], "test");
    EXPECT_EQ(plain.tools, ChatTools::None);
    const std::vector<ChatMessage> ask = {{"user", "hi"}};
    EXPECT_THROW(render_conversation(plain, std::nullopt, ask, "", "", {"{}"}), Error);
    ChatTemplate q = plain;
    q.tools = ChatTools::Qwen3;
    EXPECT_NO_THROW(render_conversation(q, std::nullopt, ask, "", "", {"{}"}));
    const ChatToolCall now{"now", "{}"};
    const std::vector<std::vector<ChatMessage>> bad = {
        {{"user", "hi"}, {"tool", "12:00"}},                              // a result nobody asked for
        {{"tool", "12:00"}},                                              // first
        {{"user", "hi"}, {"assistant", "", {now}}},                       // ends with the assistant
        {{"user", "hi"}, {"assistant", "", {now}}, {"system", "x"}},      // another role
        {{"user", "hi", {now}}},                                          // a user's call
    };
    for (const auto& m : bad) EXPECT_THROW(render_conversation(q, std::nullopt, m, "", "", {"{}"}), Error) << m.size();
    ChatTemplate llama;
    llama.family = ChatFamily::Llama3;
    EXPECT_THROW(render_conversation(llama, std::nullopt, ask, "", "", {"{}"}), Error);
}
