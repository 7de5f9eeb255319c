// Chat templates: family recognition by fingerprint and the rendered text. (The renderings are
// checked against the real Jinja engine in test_reference.cpp.)
#include <gtest/gtest.h>

#include "core/error.h"
#include "fixtures.h"
#include "tiny_tokenizer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/normalizer.h"
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
    ParsedToolCalls p = parse_tool_calls(ChatTools::Qwen3, "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
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
    p = parse_tool_calls(ChatTools::Qwen3, "<tool_call>\n{\"name\": \"now\"}\n");
    ASSERT_TRUE(p.called);
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].arguments, "{}");
    for (const char* plain : {"No tools needed.", "<tool_call>\n{\"name\": \"now\", \"arguments\": {\n</tool_call>",
                              "<tool_call>\n{\"arguments\": {}}\n</tool_call>", "<tool_call>[1]</tool_call>",
                              "<tool_call>{\"name\": \"f\", \"arguments\": \"x\"}</tool_call>"}) {
        p = parse_tool_calls(ChatTools::Qwen3, plain);
        EXPECT_FALSE(p.called) << plain;
        EXPECT_EQ(p.content, plain);
        EXPECT_TRUE(p.calls.empty()) << plain;
    }
}

// Calls read while the reply is written (tool_calls_so_far, for streaming): at every prefix of a
// reply, each call's name is whole and its arguments so far are a prefix of the whole reply's,
// and neither a call nor its arguments shrink as the reply grows; a reply that turns out not to
// be calls is plain from the first character that rules them out, and stays so.
TEST(ChatTools, StreamedCallsGrowIntoTheWholeReply) {
    struct Case {
        ChatTools format;
        std::string reply;
        size_t calls;  // the whole reply's (0: plain)
    };
    const std::vector<Case> cases = {
        {ChatTools::Qwen3,
         "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par\\u00eds\", \"days\": "
         "[1, 2.50]}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"q\": \"</tool_call>\"}, \"name\": \"search\"}\n</tool_call>",
         2},
        {ChatTools::Qwen25, "<tool_call>\n{\"name\": \"now\"}\n", 1},
        {ChatTools::Qwen3, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\nand more", 0},
        {ChatTools::Qwen3, "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}</tool_call>", 0},
        {ChatTools::Llama3Json, "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": [true, null]}}; {\"name\": \"b\", "
                                "\"arguments\": {}}", 2},
        {ChatTools::Llama3Json, " {\"name\": \"a\", \"parameters\": {}} and text", 0},
        {ChatTools::MistralJson, "Sure.[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"k\": \"v\"}, \"id\": \"abcdefghi\"}, "
                                 "{\"name\": \"g\", \"arguments\": {\"n\": -0.5}}]", 2},
        {ChatTools::MistralJson, "[TOOL_CALLS] []", 0},
    };
    for (const Case& c : cases) {
        const ParsedToolCalls whole = parse_tool_calls(c.format, c.reply);
        ASSERT_EQ(whole.called ? whole.calls.size() : 0u, c.calls) << c.reply;
        std::vector<ChatToolCall> last;
        bool was_plain = false;
        for (size_t cut = 0; cut <= c.reply.size(); ++cut) {
            const ToolCallsSoFar p = tool_calls_so_far(c.format, c.reply.substr(0, cut), false);
            ASSERT_TRUE(!was_plain || p.plain) << cut << " of " << c.reply;
            was_plain = p.plain;
            if (whole.called) {
                ASSERT_FALSE(p.plain) << cut << " of " << c.reply;
                ASSERT_LE(p.calls.size(), whole.calls.size());
            }
            if (p.plain) continue;  // the calls sent so far stay as they went out
            ASSERT_GE(p.calls.size(), last.size()) << cut << " of " << c.reply;
            for (size_t k = 0; k < p.calls.size(); ++k) {
                if (k < last.size()) {
                    EXPECT_EQ(p.calls[k].name, last[k].name);
                    ASSERT_EQ(p.calls[k].arguments.compare(0, last[k].arguments.size(), last[k].arguments), 0)
                        << cut << " of " << c.reply << ": " << p.calls[k].arguments;
                }
                if (whole.called) {
                    EXPECT_EQ(p.calls[k].name, whole.calls[k].name);
                    ASSERT_EQ(whole.calls[k].arguments.compare(0, p.calls[k].arguments.size(), p.calls[k].arguments), 0)
                        << cut << " of " << c.reply << ": " << p.calls[k].arguments;
                }
            }
            last = p.calls;
        }
        EXPECT_EQ(was_plain, !whole.called) << c.reply;
    }
    // The arguments come as the model writes them: a string's characters, a number once it ends.
    const std::string r = cases[0].reply;
    ToolCallsSoFar p = tool_calls_so_far(ChatTools::Qwen3, r.substr(0, r.find("\\u00ed")), false);
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Par");
    p = tool_calls_so_far(ChatTools::Qwen3, r.substr(0, r.find("2.50") + 3), false);
    EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"París\", \"days\": [1, ");
    // A "</tool_call>" inside a string does not end the block.
    EXPECT_EQ(parse_tool_calls(ChatTools::Qwen3, r).calls[1].arguments, "{\"q\": \"</tool_call>\"}");
    // The second call's name comes after its arguments: it is sent once the name is whole.
    p = tool_calls_so_far(ChatTools::Qwen3, r.substr(0, r.rfind("\"search")), false);
    EXPECT_EQ(p.calls.size(), 1u);
}

// What a stream may send before it knows whether a call starts: up to a "<tool_call>" or a suffix
// that could still become one.
TEST(ChatTools, ToolCallHold) {
    EXPECT_EQ(tool_call_hold(ChatTools::Qwen3, ""), 0u);
    EXPECT_EQ(tool_call_hold(ChatTools::Qwen3, "Hello"), 5u);
    EXPECT_EQ(tool_call_hold(ChatTools::Qwen3, "Hello <"), 6u);
    EXPECT_EQ(tool_call_hold(ChatTools::Qwen3, "Hello <tool_c"), 6u);
    EXPECT_EQ(tool_call_hold(ChatTools::Qwen3, "a <tool_call>\n{"), 2u);
    EXPECT_EQ(tool_call_hold(ChatTools::Qwen3, "a < b"), 5u);
    EXPECT_EQ(tool_call_hold(ChatTools::Qwen3, "<tool_calx"), 10u);
}

// A reply whose arguments nest past python_json's bound is plain text, not a crash.
TEST(ChatTools, DeepArgumentsAreNoCall) {
    const std::string deep = std::string(5000, '[') + std::string(5000, ']');
    const ParsedToolCalls p = parse_tool_calls(ChatTools::Qwen3, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + deep + "}}</tool_call>");
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
    const std::vector<nlohmann::ordered_json> kTools = {nlohmann::ordered_json::object()};
    const ChatTemplate plain = recognise_chat_template(tiny_byte_level_config()["chat_template"], "test");
    EXPECT_EQ(plain.tools, ChatTools::None);
    const std::vector<ChatMessage> ask = {{"user", "hi"}};
    EXPECT_THROW(render_conversation(plain, std::nullopt, ask, "", "", kTools), Error);
    ChatTemplate q = plain;
    q.tools = ChatTools::Qwen3;
    EXPECT_NO_THROW(render_conversation(q, std::nullopt, ask, "", "", kTools));
    const ChatToolCall now{"now", "{}"};
    const std::vector<std::vector<ChatMessage>> bad = {
        {{"user", "hi"}, {"tool", "12:00"}},                              // a result nobody asked for
        {{"tool", "12:00"}},                                              // first
        {{"user", "hi"}, {"assistant", "", {now}}},                       // ends with the assistant
        {{"user", "hi"}, {"assistant", "", {now}}, {"system", "x"}},      // another role
        {{"user", "hi", {now}}},                                          // a user's call
    };
    for (const auto& m : bad) EXPECT_THROW(render_conversation(q, std::nullopt, m, "", "", kTools), Error) << m.size();
    ChatTemplate llama;
    llama.family = ChatFamily::Llama3;
    EXPECT_THROW(render_conversation(llama, std::nullopt, ask, "", "", kTools), Error);
}

// Llama 3.1/3.2's templates (the fixtures, as Meta ships them) are recognised with their JSON tool
// format; a Llama 3.1 template without the tools parts is not. (Their renderings are checked
// against Jinja in test_reference.cpp.)
TEST(ChatTools, LlamaTemplatesAreRecognised) {
    const std::string dir = std::string(SHARDLM_SOURCE_DIR) + "/tests/tokenizer/templates";
    const ChatTemplate l31 = recognise_chat_template(test::read_file(dir + "/llama31_tools.jinja"), "llama31_tools");
    EXPECT_EQ(l31.family, ChatFamily::Llama31);
    EXPECT_EQ(l31.tools, ChatTools::Llama3Json);
    EXPECT_EQ(l31.date_string, "26 Jul 2024");
    const ChatTemplate l32 = recognise_chat_template(test::read_file(dir + "/llama32.jinja"), "llama32");
    EXPECT_EQ(l32.family, ChatFamily::Llama31);
    EXPECT_EQ(l32.tools, ChatTools::Llama3Json);
    EXPECT_EQ(l32.date_string, "");  // strftime_now: today's
    const ChatTemplate reduced = recognise_chat_template(test::read_file(dir + "/llama31.jinja"), "llama31");
    EXPECT_EQ(reduced.family, ChatFamily::Llama31);
    EXPECT_EQ(reduced.tools, ChatTools::None);
    // A template whose call writes "arguments" instead of "parameters" is not this format.
    std::string other = test::read_file(dir + "/llama32.jinja");
    const size_t at = other.find("'\"parameters\": '");
    ASSERT_NE(at, std::string::npos);
    other.replace(at, 16, "'\"arguments\": '");
    EXPECT_EQ(recognise_chat_template(other, "other").tools, ChatTools::None);

    // Llama takes one call per assistant turn (its template raises on more).
    const ChatToolCall now{"now", "{}"};
    const std::vector<ChatMessage> two = {{"user", "hi"}, {"assistant", "", {now, now}}, {"tool", "1"}, {"tool", "2"}};
    EXPECT_THROW(render_conversation(l32, std::nullopt, two, "", "", {}), Error);
    const std::vector<ChatMessage> one = {{"user", "hi"}, {"assistant", "x", {now}}, {"tool", "1"}};
    EXPECT_NE(render_conversation(l32, std::nullopt, one, "", "", {}).find("{\"name\": \"now\", \"parameters\": {}}"),
              std::string::npos);
}

// vLLM's llama3_json rules: the whole reply is the calls ("parameters" or "arguments"), after an
// optional <|python_tag|>, separated by ';'; else it is plain text.
TEST(ChatTools, ParseLlamaToolCalls) {
    ParsedToolCalls p = parse_tool_calls(ChatTools::Llama3Json, " {\"name\": \"get_weather\", \"parameters\": "
                                                                "{\"city\":\"Paris\",\"days\":[1,2]}}\n");
    ASSERT_TRUE(p.called);
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Paris\", \"days\": [1, 2]}");
    p = parse_tool_calls(ChatTools::Llama3Json,
                         "<|python_tag|>{\"name\": \"a\", \"arguments\": {\"s\": \"}{;\\\"\"}}; {\"name\": \"b\", \"parameters\": {}}");
    ASSERT_TRUE(p.called);
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0].name, "a");
    EXPECT_EQ(p.calls[0].arguments, "{\"s\": \"}{;\\\"\"}");
    EXPECT_EQ(p.calls[1].name, "b");
    EXPECT_EQ(p.calls[1].arguments, "{}");
    for (const char* plain : {"", "  ", "It is sunny.", "Sure: {\"name\": \"a\", \"parameters\": {}}",
                              "{\"name\": \"a\"}", "{\"name\": \"a\", \"parameters\": [1]}", "{\"parameters\": {}}",
                              "{\"name\": \"a\", \"parameters\": {}} and more", "{\"name\": \"a\", \"parameters\": {}",
                              "{\"name\": \"a\", \"parameters\": {}};", "{'name': 'a'}", "<|python_tag|>print(1)"}) {
        p = parse_tool_calls(ChatTools::Llama3Json, plain);
        EXPECT_FALSE(p.called) << plain;
        EXPECT_EQ(p.content, plain);
        EXPECT_TRUE(p.calls.empty()) << plain;
    }
    const std::string deep = std::string(5000, '[') + std::string(5000, ']');
    EXPECT_FALSE(parse_tool_calls(ChatTools::Llama3Json, "{\"name\": \"f\", \"parameters\": {\"a\": " + deep + "}}").called);
    // A template without tools reads no calls.
    EXPECT_FALSE(parse_tool_calls(ChatTools::None, "{\"name\": \"a\", \"parameters\": {}}").called);
}

// A Llama reply is a call or text as a whole: held while it may still open one.
TEST(ChatTools, LlamaToolCallHold) {
    for (const char* held : {"", " \n", "{", "  {\"name\"", "<", "<|py", "<|python_tag|>", "<|python_tag|>{\"na"})
        EXPECT_EQ(tool_call_hold(ChatTools::Llama3Json, held), 0u) << held;
    for (const std::string sent : {"Hi", " It is", "<|im", "[1]"})
        EXPECT_EQ(tool_call_hold(ChatTools::Llama3Json, sent), sent.size()) << sent;
    EXPECT_EQ(tool_call_hold(ChatTools::None, "<tool_c"), 7u);
}

// tojson(indent=4) as Python's json.dumps writes it (Llama's tools list).
TEST(ChatTools, PythonJsonIndented) {
    const auto j = nlohmann::ordered_json::parse(R"({"b": [1, 2.5, "x\n", []], "a": {"é": null, "t": true}, "e": {}})");
    EXPECT_EQ(python_json(j, 4),
              "{\n    \"b\": [\n        1,\n        2.5,\n        \"x\\n\",\n        []\n    ],\n    \"a\": {\n        \"é\": null,\n"
              "        \"t\": true\n    },\n    \"e\": {}\n}");
    EXPECT_EQ(python_json(nlohmann::ordered_json::array({1}), 2), "[\n  1\n]");
    EXPECT_EQ(python_json(nlohmann::ordered_json("s"), 4), "\"s\"");
}

// chat_template_kwargs: Llama's date_string replaces the template's date; enable_thinking false
// changes only a template with Qwen3's switch (Qwen3's own is checked against Jinja in
// test_reference.cpp), as Jinja ignores variables a template does not read.
TEST(ChatTemplate, KwargsWhereTheTemplateReadsThem) {
    const std::string dir = std::string(SHARDLM_SOURCE_DIR) + "/tests/tokenizer/templates";
    const ChatTemplate l31 = recognise_chat_template(test::read_file(dir + "/llama31_tools.jinja"), "llama31_tools");
    const std::vector<ChatMessage> ask = {{"user", "hi"}};
    ChatKwargs dated;
    dated.date_string = "01 Feb 2026";
    const std::string text = render_conversation(l31, std::nullopt, ask, "", "", {}, dated);
    EXPECT_NE(text.find("Today Date: 01 Feb 2026\n"), std::string::npos) << text;
    EXPECT_EQ(text.find("26 Jul 2024"), std::string::npos) << text;
    ChatKwargs off;
    off.enable_thinking = false;
    EXPECT_EQ(render_conversation(l31, std::nullopt, ask, "", "", {}, off), render_conversation(l31, std::nullopt, ask, "", ""));
    const ChatTemplate plain = recognise_chat_template(tiny_byte_level_config()["chat_template"], "test");
    EXPECT_FALSE(plain.thinking_switch);
    EXPECT_EQ(render_conversation(plain, std::nullopt, ask, "", "", {}, off), render_conversation(plain, std::nullopt, ask, "", ""));
    ChatTemplate q3 = plain;
    q3.thinking_switch = true;
    EXPECT_EQ(render_conversation(q3, std::nullopt, ask, "", "", {}, off),
              render_conversation(q3, std::nullopt, ask, "", "") + "<think>\n\n</think>\n\n");
}

// Mistral's templates (the reference suite checks their renderings, and Nemo's own, against
// Jinja): v0.2's takes a system message on the first turn, v0.3's and Nemo's on the last and have
// the [TOOL_CALLS] format; v0.1's (mistral.jinja) has neither.
TEST(ChatTools, MistralTemplatesAreRecognised) {
    const std::string dir = std::string(SHARDLM_SOURCE_DIR) + "/tests/tokenizer/templates";
    const ChatTemplate v1 = recognise_chat_template(test::read_file(dir + "/mistral.jinja"), "mistral");
    const ChatTemplate v2 = recognise_chat_template(test::read_file(dir + "/mistral02.jinja"), "mistral02");
    const ChatTemplate v3 = recognise_chat_template(test::read_file(dir + "/mistral_v3.jinja"), "mistral_v3");
    EXPECT_EQ(v1.family, ChatFamily::Mistral);
    EXPECT_EQ(v2.family, ChatFamily::Mistral2);
    EXPECT_EQ(v3.family, ChatFamily::Mistral3);
    EXPECT_EQ(v1.tools, ChatTools::None);
    EXPECT_EQ(v2.tools, ChatTools::None);
    EXPECT_EQ(v3.tools, ChatTools::MistralJson);
    EXPECT_STREQ(chat_family_name(v3.family), "mistral-v3");
    const std::vector<ChatMessage> ask = {{"user", "a"}, {"assistant", " b "}, {"user", "c"}};
    EXPECT_EQ(render_conversation(v2, std::string("S"), ask, "<s>", "</s>"), "<s> [INST] S\n\na [/INST]  b </s> [INST] c [/INST]");
    EXPECT_EQ(render_conversation(v3, std::string("S"), ask, "<s>", "</s>"), "<s>[INST] a[/INST] b</s>[INST] S\n\nc[/INST]");
    // Nemo's spelling (no space after the control tokens, replies as given) is a different family.
    std::string tekken = test::read_file(dir + "/mistral_v3.jinja");
    for (const std::string tag : {"[INST] ", "[AVAILABLE_TOOLS] ", "[TOOL_CALLS] ", "[TOOL_RESULTS] "})
        tekken = replace_literal(tekken, tag, tag.substr(0, tag.size() - 1));
    tekken = replace_literal(tekken, "\" \" + message[\"content\"]|trim + eos_token", "message[\"content\"] + eos_token");
    const ChatTemplate nemo = recognise_chat_template(tekken, "tekken");
    EXPECT_EQ(nemo.family, ChatFamily::MistralTekken);
    EXPECT_EQ(nemo.tools, ChatTools::MistralJson);
    EXPECT_EQ(render_conversation(nemo, std::string("S"), ask, "<s>", "</s>"), "<s>[INST]a[/INST] b </s>[INST]S\n\nc[/INST]");
    // Without its tools parts a v3 template is not recognised (a guess could render them wrongly).
    std::string partial = test::read_file(dir + "/mistral_v3.jinja");
    partial = replace_literal(partial, "\"call_id\"", "\"id\"");
    EXPECT_THROW(recognise_chat_template(partial, "partial"), Error);

    // Ids: a call's and a tool message's are 9 characters; the other turns alternate, user first.
    const ChatToolCall now{"now", "{}", "abcdefghi"};
    const std::vector<ChatMessage> ok = {{"user", "t?"}, {"assistant", "", {now}}, {"tool", "12:00", {}, "abcdefghi"}};
    EXPECT_EQ(render_conversation(v3, std::string("S"), ok, "<s>", "</s>", {}),
              "<s>[INST] t?[/INST][TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}, \"id\": \"abcdefghi\"}]</s>"
              "[TOOL_RESULTS] {\"content\": 12:00, \"call_id\": \"abcdefghi\"}[/TOOL_RESULTS]");
    const ChatToolCall short_id{"now", "{}", "abc"};
    EXPECT_THROW(render_conversation(v3, std::nullopt, {{"user", "t?"}, {"assistant", "", {short_id}}, {"tool", "1", {}, "abc"}},
                                     "", "", {}),
                 Error);
    EXPECT_THROW(render_conversation(v3, std::nullopt, {{"user", "t?"}, {"assistant", "", {now}}, {"tool", "1"}}, "", "", {}),
                 Error);
    EXPECT_THROW(render_conversation(v3, std::nullopt,
                                     {{"user", "a"}, {"user", "b"}, {"assistant", "", {now}}, {"tool", "1", {}, "abcdefghi"}},
                                     "", "", {}),
                 Error);
}

// vLLM's mistral parser's rules: the content before [TOOL_CALLS], then one JSON array of calls.
TEST(ChatTools, ParseMistralToolCalls) {
    ParsedToolCalls p = parse_tool_calls(ChatTools::MistralJson, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": "
                                                                 "{\"city\":\"Paris\"}}, {\"name\": \"now\", \"arguments\": {}}]");
    ASSERT_TRUE(p.called);
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Paris\"}");
    EXPECT_EQ(p.calls[1].name, "now");
    EXPECT_EQ(p.calls[1].arguments, "{}");
    p = parse_tool_calls(ChatTools::MistralJson, "Let me look. [TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"s\": \"]}[\"}}]\n");
    ASSERT_TRUE(p.called);
    EXPECT_EQ(p.content, "Let me look. ");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].arguments, "{\"s\": \"]}[\"}");
    for (const char* plain : {"", "It is sunny.", "[{\"name\": \"a\", \"arguments\": {}}]", "[TOOL_CALLS]",
                              "[TOOL_CALLS] []", "[TOOL_CALLS] {\"name\": \"a\", \"arguments\": {}}",
                              "[TOOL_CALLS] [{\"name\": \"a\"}]", "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": [1]}]",
                              "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}] and more",
                              "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}", "[TOOL_CALLS] [{'name': 'a'}]"}) {
        p = parse_tool_calls(ChatTools::MistralJson, plain);
        EXPECT_FALSE(p.called) << plain;
        EXPECT_EQ(p.content, plain);
        EXPECT_TRUE(p.calls.empty()) << plain;
    }
    const std::string deep = std::string(5000, '[') + std::string(5000, ']');
    EXPECT_FALSE(parse_tool_calls(ChatTools::MistralJson, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": " + deep + "}}]")
                     .called);
    // A stream holds from the marker, or from a tail that may still become it.
    EXPECT_EQ(tool_call_hold(ChatTools::MistralJson, "Hi [TOOL_CALLS] [{"), 3u);
    EXPECT_EQ(tool_call_hold(ChatTools::MistralJson, "Hi [TOOL_CA"), 3u);
    EXPECT_EQ(tool_call_hold(ChatTools::MistralJson, "Hi [1]"), 6u);
}

// DeepSeek's templates (V3's own and R1's, both checked against Jinja in test_reference.cpp): R1
// drops earlier replies' reasoning and opens a new one in the generation prompt; no tools.
TEST(ChatTemplate, DeepSeekV3AndR1) {
    const std::string dir = std::string(SHARDLM_SOURCE_DIR) + "/tests/tokenizer/templates";
    const ChatTemplate r1 = recognise_chat_template(test::read_file(dir + "/deepseek_r1.jinja"), "deepseek_r1");
    EXPECT_EQ(r1.family, ChatFamily::DeepSeek);
    EXPECT_TRUE(r1.strips_reasoning);
    EXPECT_TRUE(r1.opens_thinking);
    EXPECT_EQ(r1.tools, ChatTools::None);
    const std::vector<ChatMessage> turns = {{"user", "a"}, {"assistant", "x</think>y</think>\nz"}, {"user", "b"}};
    EXPECT_EQ(render_conversation(r1, std::string("S"), turns, "<B>", "<E>"),
              "<B>S<｜User｜>a<｜Assistant｜>\nz<｜end▁of▁sentence｜><｜User｜>b<｜Assistant｜><think>\n");
    // The same template without R1's two changes is V3's.
    std::string v3 = test::read_file(dir + "/deepseek_r1.jinja");
    v3 = replace_literal(v3, "{{'<｜Assistant｜><think>\\n'}}", "{{'<｜Assistant｜>'}}");
    v3 = replace_literal(v3, "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}", "");
    v3 = replace_literal(v3, "'<｜Assistant｜>' + content +", "'<｜Assistant｜>' + message['content'] +");
    const ChatTemplate t3 = recognise_chat_template(v3, "v3");
    EXPECT_EQ(t3.family, ChatFamily::DeepSeek);
    EXPECT_FALSE(t3.strips_reasoning);
    EXPECT_FALSE(t3.opens_thinking);
    EXPECT_EQ(render_conversation(t3, std::nullopt, turns, "<B>", "<E>"),
              "<B><｜User｜>a<｜Assistant｜>x</think>y</think>\nz<｜end▁of▁sentence｜><｜User｜>b<｜Assistant｜>");
    // Half of R1's changes is neither: not recognised rather than guessed.
    std::string half = test::read_file(dir + "/deepseek_r1.jinja");
    half = replace_literal(half, "{{'<｜Assistant｜><think>\\n'}}", "{{'<｜Assistant｜>'}}");
    EXPECT_THROW(recognise_chat_template(half, "half"), Error);
    const ChatToolCall now{"now", "{}"};
    EXPECT_THROW(render_conversation(r1, std::nullopt, {{"user", "t?"}, {"assistant", "", {now}}, {"tool", "1"}}, "", "", {}),
                 Error);
}

// The order of the turns (the renderings themselves are checked against Jinja in
// test_reference.cpp): ChatML takes them in any order but needs a user turn; Llama 2's template
// wants them in turn, user first; continuing the final message needs a non-empty assistant turn
// last, and no tools.
TEST(ChatTemplate, TurnOrderAndContinuingTheFinalMessage) {
    const ChatTemplate chatml = recognise_chat_template(tiny_byte_level_config()["chat_template"], "test");
    auto message = [](auto&& f) {
        try {
            f();
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    const std::vector<ChatMessage> greeting = {{"assistant", "Hello"}, {"user", "hi"}};
    EXPECT_EQ(render_conversation(chatml, std::nullopt, greeting, "", ""),
              "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_NE(message([&] { render_conversation(chatml, std::nullopt, {{"assistant", "Hello"}}, "", ""); })
                  .find("a chat conversation needs a user turn"),
              std::string::npos);
    ChatTemplate llama2;
    llama2.family = ChatFamily::Llama2;
    EXPECT_NE(message([&] { render_conversation(llama2, std::nullopt, greeting, "<s>", "</s>"); })
                  .find("chat turn 0 has role \"assistant\" where \"user\" belongs (this model's chat template (llama2)"),
              std::string::npos);
    ChatKwargs cont;
    cont.continue_final_message = true;
    EXPECT_EQ(render_conversation(chatml, std::nullopt, {{"user", "hi"}, {"assistant", "Sure"}}, "", "", {}, cont),
              "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nSure");
    for (const std::vector<ChatMessage>& m :
         {std::vector<ChatMessage>{{"user", "hi"}}, std::vector<ChatMessage>{{"user", "hi"}, {"assistant", ""}}})
        EXPECT_NE(message([&] { render_conversation(chatml, std::nullopt, m, "", "", {}, cont); })
                      .find("continuing the final message: the conversation ends with the start of the assistant's reply"),
                  std::string::npos);
    ChatTemplate q = chatml;
    q.tools = ChatTools::Qwen3;
    EXPECT_NE(message([&] {
                  render_conversation(q, std::nullopt, {{"user", "hi"}, {"assistant", "Sure"}}, "", "",
                                      {nlohmann::ordered_json::object()}, cont);
              }).find("continuing the final message is not supported with tools"),
              std::string::npos);
}

// transformers (since 4.47) saves the chat template as chat_template.jinja beside the tokenizer
// files, and that file wins over tokenizer_config.json's chat_template: both read so here, and an
// unrecognised template names the file it came from.
TEST(ChatTemplate, TheJinjaFileWinsOverTheConfig) {
    TempDir dir;
    nlohmann::json cfg = tiny_byte_level_config();
    const std::string chatml = cfg["chat_template"];
    cfg["chat_template"] = read_file(SHARDLM_SOURCE_DIR "/tests/tokenizer/templates/llama2.jinja");
    write_tokenizer_files(dir.path(), tiny_byte_level_tokenizer(), cfg);
    EXPECT_EQ(Tokenizer::load(dir.path()).chat_family(), "llama2");
    write_file(dir.file("chat_template.jinja"), chatml);
    const Tokenizer t = Tokenizer::load(dir.path());
    EXPECT_EQ(t.chat_family(), "chatml");
    EXPECT_EQ(t.apply_chat_template(std::nullopt, "hi"), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    // Only the file: the config has none.
    cfg.erase("chat_template");
    write_tokenizer_files(dir.path(), tiny_byte_level_tokenizer(), cfg);
    EXPECT_EQ(Tokenizer::load(dir.path()).chat_family(), "chatml");
    write_file(dir.file("chat_template.jinja"), "{{ messages }}");
    try {
        (void)Tokenizer::load(dir.path()).chat_family();
        ADD_FAILURE() << "an unrecognised template was taken";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(dir.file("chat_template.jinja") + ": unrecognised chat_template"), std::string::npos)
            << e.what();
    }
}
