// shardlm tokenize and generate with text prompts, end to end on a tiny model and tokenizer.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "model/synthetic.h"
#include "tiny_tokenizer.h"
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
