// shardlm tokenize and generate with text prompts, end to end on a tiny model and tokenizer.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "model/synthetic.h"
#include "runtime/json_mode.h"
#include "tiny_tokenizer.h"
#include "tokenizer/fim.h"
#include "tokenizer/tokenizer.h"

using namespace shardlm;
using namespace shardlm::test;
using json = nlohmann::json;

namespace {

const std::string kBin = SHARDLM_BIN;

void expect_error(const std::string& args, const std::string& needle) { expect_cli_error(args, needle); }

class TokenizerCli : public ::testing::Test {
protected:
    void SetUp() override {
        write_synthetic_checkpoint(dir_.path(), tiny_config(Arch::Qwen2), {DType::F32, 1, 7});
        write_tokenizer_files(dir_.path(), tiny_byte_level_tokenizer(), tiny_byte_level_config());
        tok_ = std::make_unique<Tokenizer>(Tokenizer::load(dir_.path()));
        m_ = " --model " + dir_.path();
    }
    TempDir dir_;
    std::unique_ptr<Tokenizer> tok_;
    std::string m_;
};

TEST_F(TokenizerCli, TokenizeText) {
    const CommandResult r = run_command(kBin + " tokenize" + m_ + " --text 'hello world <|im_end|>'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out).get<std::vector<int32_t>>(), tok_->encode("hello world <|im_end|>"));
}

TEST_F(TokenizerCli, TokenizeStdinLinesAndJson) {
    write_file(dir_.file("in.txt"), "hello\n\ncaf\xC3\xA9 world\n");
    const CommandResult r = run_command(kBin + " tokenize" + m_ + " --no-special < " + dir_.file("in.txt"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::istringstream lines(r.out);
    std::string l1, l2, l3, l4;
    std::getline(lines, l1);
    std::getline(lines, l2);
    std::getline(lines, l3);
    EXPECT_FALSE(std::getline(lines, l4));
    EXPECT_EQ(json::parse(l1).get<std::vector<int32_t>>(), tok_->encode("hello", {false}));
    EXPECT_EQ(json::parse(l2), json::array());
    EXPECT_EQ(json::parse(l3).get<std::vector<int32_t>>(), tok_->encode("caf\xC3\xA9 world", {false}));

    const CommandResult j = run_command(kBin + " tokenize" + m_ + " --json --text 'hello world'");
    ASSERT_EQ(j.exit_code, 0) << j.err;
    const json o = json::parse(j.out);
    EXPECT_EQ(o["tokens"], json({"he", "ll", "o", "\xC4\xA0world"}));
}

TEST_F(TokenizerCli, TokenizeErrors) {
    TempDir empty;
    expect_error("tokenize --model " + empty.path() + " --text hi", "tokenizer.json");
    write_file(dir_.file("bad.txt"), "fine\nbad \xFF byte\n");
    expect_error("tokenize" + m_ + " < " + dir_.file("bad.txt"), "stdin line 2");
    expect_error("tokenize" + m_ + " --text \"$(printf '\\303')\"", "--text: text is not valid UTF-8");
    write_file(empty.file("tokenizer.json"), "{\"model\": ");
    expect_error("tokenize --model " + empty.path() + " --text hi", "malformed JSON");
}

TEST_F(TokenizerCli, GenerateTextPromptEqualsIds) {
    const auto ids = tok_->encode("hello world");
    std::string ids_arg;
    for (int32_t id : ids) ids_arg += (ids_arg.empty() ? "" : ",") + std::to_string(id);
    const std::string common = m_ + " --max-new-tokens 6 --temperature 0 --json";
    const CommandResult a = run_command(kBin + " generate" + common + " --prompt 'hello world'");
    const CommandResult b = run_command(kBin + " generate" + common + " --prompt-ids " + ids_arg);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    ASSERT_EQ(b.exit_code, 0) << b.err;
    const json ja = json::parse(a.out), jb = json::parse(b.out);
    EXPECT_EQ(ja["results"][0]["prompt_tokens"], ids.size());
    EXPECT_EQ(ja["results"][0]["tokens"], jb["results"][0]["tokens"]);
    auto gen = ja["results"][0]["tokens"].get<std::vector<int32_t>>();
    if (ja["results"][0]["stop_reason"] == "eos") gen.pop_back();
    EXPECT_EQ(ja["results"][0]["text"], tok_->decode(gen));
    EXPECT_EQ(jb["results"][0]["text"], ja["results"][0]["text"]);  // --prompt-ids decodes too when it can
}

TEST_F(TokenizerCli, GenerateChatAndPromptFile) {
    const std::string common = m_ + " --max-new-tokens 3 --temperature 0 --json";
    const CommandResult c = run_command(kBin + " generate" + common + " --chat --system 'Be brief.' --prompt 'hi'");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    const auto chat_ids = tok_->encode(tok_->apply_chat_template(std::string("Be brief."), "hi"), {false});
    EXPECT_EQ(json::parse(c.out)["results"][0]["prompt_tokens"], chat_ids.size());

    write_file(dir_.file("prompts.txt"), "hello\r\nworld of text\n");
    const CommandResult f = run_command(kBin + " generate" + common + " --prompt-file " + dir_.file("prompts.txt"));
    ASSERT_EQ(f.exit_code, 0) << f.err;
    const json jf = json::parse(f.out);
    ASSERT_EQ(jf["results"].size(), 2u);
    EXPECT_EQ(jf["results"][0]["prompt_tokens"], tok_->encode("hello").size());
    EXPECT_EQ(jf["results"][1]["prompt_tokens"], tok_->encode("world of text").size());

    // Without --json: one line of text per prompt, "[i] " before each in a batch.
    const CommandResult p = run_command(kBin + " generate" + m_ + " --max-new-tokens 3 --temperature 0 --prompt-file " +
                                        dir_.file("prompts.txt"));
    ASSERT_EQ(p.exit_code, 0) << p.err;
    EXPECT_EQ(p.out.rfind("[0] ", 0), 0u) << p.out;
    EXPECT_NE(p.out.find("\n[1] "), std::string::npos) << p.out;
}

// --no-thinking (generate --chat, chat): Qwen3's enable_thinking false in the prompt's rendering
// (an empty think block after the generation prompt); a template without the switch refuses it.
TEST_F(TokenizerCli, NoThinking) {
    expect_error("generate" + m_ + " --chat --no-thinking --prompt hi", "no enable_thinking switch");
    expect_error("generate" + m_ + " --no-thinking --prompt hi", "--no-thinking needs --chat");
    expect_error("chat" + m_ + " --no-thinking", "no enable_thinking switch");
    json cfg = tiny_byte_level_config();
    std::string t = cfg["chat_template"];
    const std::string gen = "{{ '<|im_start|>assistant\\n' }}";
    ASSERT_NE(t.find(gen), std::string::npos) << t;
    t.replace(t.find(gen), gen.size(),
              gen + "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
                    "{% endif %}");
    cfg["chat_template"] = t;
    write_file(dir_.file("tokenizer_config.json"), cfg.dump());
    const Tokenizer q3 = Tokenizer::load(dir_.path());
    ASSERT_TRUE(q3.chat_thinking_switch());
    const CommandResult info = run_command(kBin + " info" + m_);
    ASSERT_EQ(info.exit_code, 0) << info.err;
    EXPECT_NE(info.out.find("chat template     chatml, no tools, enable_thinking switch\n"), std::string::npos) << info.out;
    ChatKwargs off;
    off.enable_thinking = false;
    const std::vector<ChatMessage> hi = {{"user", "hi"}};
    const std::string with = q3.apply_chat_template(std::nullopt, hi, {}, off), without = q3.apply_chat_template(std::nullopt, hi);
    EXPECT_EQ(with, without + "<think>\n\n</think>\n\n");
    const CommandResult g = run_command(kBin + " generate" + m_ + " --max-new-tokens 2 --temperature 0 --json --chat "
                                        "--no-thinking --prompt hi");
    ASSERT_EQ(g.exit_code, 0) << g.err;
    EXPECT_EQ(json::parse(g.out)["results"][0]["prompt_tokens"], q3.encode(with, {false}).size());
    write_file(dir_.file("turn.txt"), "hi\n");
    const CommandResult c = run_command("<" + dir_.file("turn.txt") + " " + kBin + " chat" + m_ +
                                        " --max-new-tokens 2 --temperature 0 --json --no-thinking");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    EXPECT_EQ(json::parse(c.out.substr(0, c.out.find('\n')))["prompt_tokens"], q3.encode(with, {false}).size());
}

TEST_F(TokenizerCli, GenerateErrors) {
    write_file(dir_.file("gap.txt"), "one\n\nthree\n");
    expect_error("generate" + m_ + " --prompt-file " + dir_.file("gap.txt"), "line 2 is empty");
    expect_error("generate" + m_ + " --prompt-file " + dir_.file("missing.txt"), "missing.txt");
    write_file(dir_.file("badutf.txt"), "ok\n\xC3\x28\n");
    expect_error("generate" + m_ + " --prompt-file " + dir_.file("badutf.txt"), "line 2: text is not valid UTF-8");
    expect_error("generate" + m_ + " --prompt hi --prompt-ids 1", "exclude each other");
    expect_error("generate" + m_ + " --prompt-ids 1 --chat", "--chat");
    expect_error("generate" + m_ + " --prompt hi --system x", "--system needs --chat");
    expect_error("generate" + m_ + " --prompt ''", "empty");
    // A folder without tokenizer.json: text prompts fail clearly, --prompt-ids still works.
    TempDir bare;
    write_synthetic_checkpoint(bare.path(), tiny_config(Arch::Qwen2), {DType::F32, 1, 7});
    expect_error("generate --model " + bare.path() + " --prompt hi", "tokenizer.json");
    const CommandResult ok = run_command(kBin + " generate --model " + bare.path() + " --prompt-ids 5,6 --max-new-tokens 2 --json");
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    EXPECT_TRUE(json::parse(ok.out)["results"][0]["text"].is_null());
    // A template that is no known family is an error, not a guess.
    json cfg = tiny_byte_level_config();
    cfg["chat_template"] = "{{ messages[0]['content'] }}";
    write_file(dir_.file("tokenizer_config.json"), cfg.dump());
    expect_error("generate" + m_ + " --chat --prompt hi", "unrecognised chat_template");
}

}  // namespace

// chat --json-object / --json-schema: every reply is the start of one value of the schema (a
// whole one where it ended with "stop"), on every turn; under mpirun the replies are one rank's.
TEST_F(TokenizerCli, ChatRepliesHeldToAJsonSchema) {
    write_file(dir_.file("turns.txt"), "hi\nmore\nagain\n");
    write_file(dir_.file("s.json"), R"({"type": "object", "properties": {"n": {"type": "integer"},
        "w": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}, "required": ["n"]})");
    for (const std::string& flag : std::vector<std::string>{" --json-object", " --json-schema " + dir_.file("s.json")}) {
        const std::string chat = "<" + dir_.file("turns.txt") + " " + kBin + " chat" + m_ + flag +
                                 " --max-new-tokens 40 --temperature 0.9 --seed 5 --json";
        const CommandResult c = run_command(chat);
        ASSERT_EQ(c.exit_code, 0) << c.err;
        const auto schema = flag == " --json-object" ? std::make_shared<const JsonSchema>(json_object_schema())
                                                     : std::make_shared<const JsonSchema>(compile_json_schema(
                                                           read_file(dir_.file("s.json")), "test"));
        std::istringstream lines(c.out);
        std::vector<std::string> replies;
        for (std::string l; std::getline(lines, l);) {
            const json t = json::parse(l);
            const std::string text = t["text"];
            JsonAcceptor a(schema);
            EXPECT_TRUE(a.push(text)) << flag << ": " << text;
            EXPECT_EQ(a.complete(), t["stop_reason"] == "stop") << flag << ": " << text;
            EXPECT_EQ(text.substr(0, 1), "{") << flag << ": " << text;
            replies.push_back(text);
        }
        EXPECT_EQ(replies.size(), 3u) << c.out;
#ifdef SHARDLM_MPIEXEC
        const CommandResult two = run_command("<" + dir_.file("turns.txt") + " " + SHARDLM_MPIEXEC +
                                              " --allow-run-as-root --oversubscribe -np 2 " + kBin + " chat" + m_ + flag +
                                              " --max-new-tokens 40 --temperature 0.9 --seed 5 --json --threads 1");
        ASSERT_EQ(two.exit_code, 0) << two.err;
        std::istringstream two_lines(two.out);
        for (const std::string& want : replies) {
            std::string l;
            ASSERT_TRUE(std::getline(two_lines, l)) << two.out;
            EXPECT_EQ(json::parse(l)["text"], want) << flag;
        }
#endif
    }
    expect_error("chat" + m_ + " --json-object --json-schema " + dir_.file("s.json"), "--json-object and --json-schema exclude each other");
}

// shardlm chat: one user turn per stdin line, one JSON object per turn. The second turn reuses
// the cache positions its rendered conversation shares with the first turn's prompt and reply,
// and its reply is what generate gives for the whole conversation from an empty cache; the oldest
// exchange is dropped when the next turn would not fit --ctx; under mpirun the turns are one rank's.
TEST_F(TokenizerCli, ChatKeepsTheConversationInTheCache) {
    write_file(dir_.file("turns.txt"), "hi\n\nmore text please\r\n");
    const std::string chat = "<" + dir_.file("turns.txt") + " " + kBin + " chat" + m_ +
                             " --max-new-tokens 6 --temperature 0 --system 'Be brief.' --json";
    const CommandResult c = run_command(chat);
    ASSERT_EQ(c.exit_code, 0) << c.err;
    std::vector<json> turns;
    std::istringstream lines(c.out);
    for (std::string l; std::getline(lines, l);) turns.push_back(json::parse(l));
    ASSERT_EQ(turns.size(), 2u) << c.out;  // the empty line is skipped
    const std::optional<std::string> sys = std::string("Be brief.");
    std::vector<ChatMessage> msgs = {{"user", "hi"}};
    const std::vector<int32_t> ids1 = tok_->encode(tok_->apply_chat_template(sys, msgs), {false});
    EXPECT_EQ(turns[0]["prompt_tokens"], ids1.size());
    EXPECT_EQ(turns[0]["reused_tokens"], 0);
    const std::vector<int32_t> reply1 = turns[0]["tokens"];
    msgs.push_back({"assistant", turns[0]["text"]});
    msgs.push_back({"user", "more text please"});
    const std::vector<int32_t> ids2 = tok_->encode(tok_->apply_chat_template(sys, msgs), {false});
    EXPECT_EQ(turns[1]["prompt_tokens"], ids2.size());
    // The cache held turn 1's prompt and all of its reply but the last token.
    std::vector<int32_t> held = ids1;
    held.insert(held.end(), reply1.begin(), reply1.end() - 1);
    size_t shared = 0;
    while (shared < held.size() && shared < ids2.size() && held[shared] == ids2[shared]) ++shared;
    EXPECT_GE(shared, ids1.size());  // (the random model's reply may not re-encode to its tokens)
    EXPECT_EQ(turns[1]["reused_tokens"], std::min(shared, ids2.size() - 1));
    std::string ids_arg;
    for (int32_t id : ids2) ids_arg += (ids_arg.empty() ? "" : ",") + std::to_string(id);
    const CommandResult g = run_command(kBin + " generate" + m_ + " --max-new-tokens 6 --temperature 0 --json --prompt-ids " + ids_arg);
    ASSERT_EQ(g.exit_code, 0) << g.err;
    EXPECT_EQ(json::parse(g.out)["results"][0]["tokens"], turns[1]["tokens"]);
    EXPECT_EQ(json::parse(g.out)["results"][0]["text"], turns[1]["text"]);
#ifdef SHARDLM_MPIEXEC
    const CommandResult two = run_command("<" + dir_.file("turns.txt") + " " + SHARDLM_MPIEXEC +
                                          " --allow-run-as-root --oversubscribe -np 2 " + kBin + " chat" + m_ +
                                          " --max-new-tokens 6 --temperature 0 --system 'Be brief.' --json --threads 1");
    ASSERT_EQ(two.exit_code, 0) << two.err;
    std::istringstream two_lines(two.out);
    for (const json& t : turns) {
        std::string l;
        ASSERT_TRUE(std::getline(two_lines, l)) << two.out;
        const json j = json::parse(l);
        for (const char* key : {"prompt_tokens", "reused_tokens", "tokens", "text", "stop_reason"})
            EXPECT_EQ(j[key], t[key]) << key << " of turn " << t["turn"];
    }
#endif
    // A context that holds one exchange but not two: turn 2 drops turn 1 and starts over.
    const int64_t fit = int64_t(ids1.size()) + 6 + 2;
    const CommandResult small = run_command("<" + dir_.file("turns.txt") + " " + kBin + " chat" + m_ +
                                            " --max-new-tokens 6 --temperature 0 --json --ctx " + std::to_string(fit));
    ASSERT_EQ(small.exit_code, 0) << small.err;
    std::istringstream small_lines(small.out);
    std::string l1, l2;
    std::getline(small_lines, l1);
    std::getline(small_lines, l2);
    EXPECT_EQ(json::parse(l2)["dropped_turns"], 1) << small.out;
    // Plain output: the reply text, one line per turn.
    const CommandResult plain = run_command("<" + dir_.file("turns.txt") + " " + kBin + " chat" + m_ +
                                            " --max-new-tokens 6 --temperature 0 --system 'Be brief.'");
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_EQ(plain.out, turns[0]["text"].get<std::string>() + "\n" + turns[1]["text"].get<std::string>() + "\n");
}

// chat --prompt-cache: a later chat starting with the same system prompt loads it from the file,
// the same first turn loads all of it but its last token, and the replies are those without it.
TEST_F(TokenizerCli, ChatPromptCacheCarriesTheConversation) {
    const std::string file = dir_.file("chat.kv");
    auto chat = [&](const std::string& turn, bool cached) {
        write_file(dir_.file("turn.txt"), turn + "\n");
        const CommandResult c = run_command("<" + dir_.file("turn.txt") + " " + kBin + " chat" + m_ +
                                            " --max-new-tokens 6 --temperature 0 --json --system 'Be brief. Answer in one "
                                            "line, and stay on the topic.'" + (cached ? " --prompt-cache " + file : ""));
        EXPECT_EQ(c.exit_code, 0) << c.err;
        std::istringstream lines(c.out);
        std::string l;
        std::getline(lines, l);
        return std::make_pair(json::parse(l), c.err);
    };
    const auto [a, a_err] = chat("hi", true);
    EXPECT_EQ(a["loaded_tokens"], 0);
    EXPECT_NE(a_err.find("--prompt-cache " + file + ": no file yet"), std::string::npos) << a_err;
    EXPECT_NE(a_err.find(" saved"), std::string::npos) << a_err;
    // Another first turn: the system prompt and the template's start come from the file.
    const auto [b, b_err] = chat("hello there", true);
    const auto [b_plain, b_plain_err] = chat("hello there", false);
    EXPECT_GE(b["loaded_tokens"].get<int>(), 16) << b_err;
    EXPECT_EQ(b["reused_tokens"], b["loaded_tokens"]);
    EXPECT_EQ(b["tokens"], b_plain["tokens"]);
    EXPECT_NE(b_err.find(": 1 prefix, "), std::string::npos) << b_err;  // loaded
    EXPECT_NE(b_err.find(": 2 prefixes, "), std::string::npos) << b_err;  // saved, with a's
    // The same first turn again: all of it but its last token, the same reply; nothing new saved.
    const auto [c, c_err] = chat("hi", true);
    EXPECT_EQ(c["loaded_tokens"].get<int>(), a["prompt_tokens"].get<int>() - 1);
    EXPECT_EQ(c["tokens"], a["tokens"]);
    EXPECT_NE(c_err.find(": unchanged"), std::string::npos) << c_err;
    expect_error("chat" + m_ + " --prompt-cache " + dir_.file("no/such/dir/x.kv"), "--prompt-cache: cannot write");
    expect_error("chat" + m_ + " --cache-ram 64", "--cache-ram sizes the conversations kept in --prompt-cache: it needs --prompt-cache");
    expect_error("chat" + m_ + " --prompt-cache " + file + " --cache-ram 0", "--cache-ram must be in [1, 2^40] MiB");
}

TEST_F(TokenizerCli, ChatErrors) {
    TempDir bare;  // a checkpoint without tokenizer files
    write_synthetic_checkpoint(bare.path(), tiny_config(Arch::Qwen2), {DType::F32, 1, 7});
    expect_error("chat --model " + bare.path(), "shardlm chat needs the model's tokenizer");
    json cfg = tiny_byte_level_config();
    cfg.erase("chat_template");
    write_tokenizer_files(bare.path(), tiny_byte_level_tokenizer(), cfg);
    expect_error("chat --model " + bare.path(), "has no chat_template");
    expect_error("chat" + m_ + " --max-new-tokens 100 --ctx 50", "--max-new-tokens 100 leaves no room");
    expect_error("chat" + m_ + " --top-p 0", "--top-p");
    // A template that takes no system message refuses --system before the weights load (the
    // truncated weights below would fail the load).
    TempDir mistral;
    write_synthetic_checkpoint(mistral.path(), tiny_config(Arch::Mistral), {DType::F32, 1, 7});
    json mcfg = tiny_byte_level_config();
    mcfg["chat_template"] =
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + "
        "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ "
        "raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";
    write_tokenizer_files(mistral.path(), tiny_byte_level_tokenizer(), mcfg);
    write_file(mistral.file("model.safetensors"), "truncated");
    expect_error("chat --model " + mistral.path() + " --system hi </dev/null", "does not accept a system message");
    // A turn longer than the whole context is refused, naming the turn.
    write_file(dir_.file("long.txt"), std::string(400, 'x') + "\n");
    expect_error("chat" + m_ + " --ctx 64 --max-new-tokens 8 <" + dir_.file("long.txt"), "turn 1 alone takes");
    // Typed at a terminal (script(1) gives the chat one) it is reported, and the conversation goes
    // on with the next line as turn 1.
    write_file(dir_.file("long_then_short.txt"), std::string(400, 'x') + "\nhi\n");
    const CommandResult tty = run_command("timeout 120 script -qec \"" + kBin + " chat" + m_ +
                                          " --ctx 64 --max-new-tokens 8 --temperature 0 --json\" /dev/null <" +
                                          dir_.file("long_then_short.txt"));
    EXPECT_EQ(tty.exit_code, 0) << tty.out << tty.err;
    EXPECT_NE(tty.out.find("turn 1 alone takes"), std::string::npos) << tty.out;
    EXPECT_NE(tty.out.find("not sent, the conversation is unchanged"), std::string::npos) << tty.out;
    EXPECT_NE(tty.out.find("{\"turn\":1,"), std::string::npos) << tty.out;
}

// generate --suffix: the prompt is the FIM prompt of --prompt and the suffix, the tokens are those
// of its ids given as ids up to a FIM separator, and a separator ends the middle without being text.
TEST_F(TokenizerCli, SuffixFillsInTheMiddle) {
    const std::string gen = kBin + " generate" + m_ + " --temperature 0 --max-new-tokens 6 --json";
    const std::string fill = " --prompt 'def hello(' --suffix ') world'";
    expect_error("generate" + m_ + fill, "--suffix (fill in the middle): " + dir_.path() + "/tokenizer.json has no FIM tokens");
    write_tokenizer_files(dir_.path(),
                          with_special_tokens(tiny_byte_level_tokenizer(), {{353, "<|fim_prefix|>"}, {354, "<|fim_middle|>"},
                                                                            {355, "<|fim_suffix|>"}, {356, "<|fim_pad|>"}}),
                          tiny_byte_level_config());
    const Tokenizer tok = Tokenizer::load(dir_.path());
    const FimTokens f = fim_tokens(tok);
    const std::vector<int32_t> want = encode_fim(tok, f, "def hello(", ") world");
    const CommandResult fim = run_command(gen + fill);
    ASSERT_EQ(fim.exit_code, 0) << fim.err;
    const json a = json::parse(fim.out)["results"][0];
    EXPECT_EQ(a["prompt_tokens"], want.size());
    std::string ids;
    for (const int32_t id : want) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    const CommandResult plain = run_command(gen + " --prompt-ids " + ids);
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    std::vector<int32_t> upto = json::parse(plain.out)["results"][0]["tokens"];
    for (size_t i = 0; i < upto.size(); ++i)
        if (std::find(f.stops.begin(), f.stops.end(), upto[i]) != f.stops.end()) {
            upto.resize(i + 1);
            break;
        }
    EXPECT_EQ(a["tokens"].get<std::vector<int32_t>>(), upto);
    // <|fim_pad|> forced first: the middle ends there, empty.
    const CommandResult pad = run_command(gen + fill + " --logit-bias 356=100");
    ASSERT_EQ(pad.exit_code, 0) << pad.err;
    const json c = json::parse(pad.out)["results"][0];
    EXPECT_EQ(c["tokens"], json({356}));
    EXPECT_EQ(c["stop_reason"], "stop");
    EXPECT_EQ(c["text"], "");
    const CommandResult text = run_command(kBin + " generate" + m_ + " --temperature 0 --max-new-tokens 6" + fill + " --logit-bias 356=100");
    ASSERT_EQ(text.exit_code, 0) << text.err;
    EXPECT_EQ(text.out, "\n");
    expect_error("generate" + m_ + " --prompt-ids 5,6 --suffix x", "--suffix fills in the middle after --prompt TEXT");
    expect_error("generate" + m_ + " --chat" + fill, "--suffix and --chat exclude each other");
}

// Code Llama's FIM (a SentencePiece tokenizer): the suffix without its leading space, ▁<EOT> ends
// the middle, and the middle's text keeps a leading space (a completion continues its prompt's
// text, as vLLM's completions give it).
TEST_F(TokenizerCli, CodeLlamaFillKeepsTheMiddlesLeadingSpace) {
    const std::string eot = "\xE2\x96\x81<EOT>";
    write_tokenizer_files(dir_.path(),
                          with_special_tokens(tiny_sp_tokenizer(), {{300, "\xE2\x96\x81<PRE>"}, {301, "\xE2\x96\x81<SUF>"},
                                                                    {302, "\xE2\x96\x81<MID>"}, {303, eot}}),
                          tiny_sp_config());
    const Tokenizer tok = Tokenizer::load(dir_.path());
    const int32_t hello = tok.token_to_id("\xE2\x96\x81hello");
    const std::string gen = kBin + " generate" + m_ + " --temperature 0 --json --prompt 'x =' --suffix 'world'";
    const CommandResult r = run_command(gen + " --max-new-tokens 1 --logit-bias " + std::to_string(hello) + "=100");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json a = json::parse(r.out)["results"][0];
    EXPECT_EQ(a["prompt_tokens"], encode_fim(tok, fim_tokens(tok), "x =", "world").size());
    EXPECT_EQ(a["tokens"], json({hello}));
    EXPECT_EQ(a["text"], " hello");
    const CommandResult end = run_command(gen + " --max-new-tokens 4 --logit-bias 303=100");
    ASSERT_EQ(end.exit_code, 0) << end.err;
    const json b = json::parse(end.out)["results"][0];
    EXPECT_EQ(b["tokens"], json({303}));
    EXPECT_EQ(b["stop_reason"], "stop");
    EXPECT_EQ(b["text"], "");
}
