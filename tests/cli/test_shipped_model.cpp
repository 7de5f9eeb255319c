// Accuracy on real weights: the shipped KJV model (launch/models/kjv-small) on its held-out text,
// FP32 against BF16, INT8 weights, W8A8, INT4 (and AWQ), W4A8, the INT8 KV cache and tensor parallelism.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fixtures.h"

using namespace shardlm::test;

namespace {

const std::string kModel = SHARDLM_SOURCE_DIR "/launch/models/kjv-small";

class ShippedModel : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        // A third of the held-out text (~12k tokens) keeps the suite quick and the estimate stable.
        dir_ = new TempDir();
        const std::string text = read_file(kModel + "/heldout.txt");
        write_file(dir_->file("heldout.txt"), text.substr(0, text.size() / 3));
    }
    static void TearDownTestSuite() { delete dir_; }

    static double ppl(const std::string& flags, const std::string& launcher = "") {
        const CommandResult r = run_command(launcher + SHARDLM_BIN " perplexity --model " + kModel + " --text-file " +
                                            dir_->file("heldout.txt") + " --ctx 256 --prefill-chunk 256 --json " + flags);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        if (r.exit_code != 0) return NAN;
        return nlohmann::json::parse(r.out)["perplexity"].get<double>();
    }
    static TempDir* dir_;
};
TempDir* ShippedModel::dir_ = nullptr;

}  // namespace

TEST_F(ShippedModel, QuantizationCostsLittlePerplexity) {
    const double fp32 = ppl("--weights fp32 --kv fp32");
    EXPECT_GT(fp32, 20.0);  // a trained model, not noise (held-out perplexity ~60 at 3M parameters)
    EXPECT_LT(fp32, 100.0);
    auto rel = [&](double p) { return (p - fp32) / fp32; };
    EXPECT_LE(std::fabs(rel(ppl("--weights bf16 --kv fp32"))), 0.01);
    EXPECT_LE(rel(ppl("--weights int8 --kv fp32")), 0.01);
    EXPECT_LE(rel(ppl("--weights w8a8 --kv fp32")), 0.03);
    EXPECT_LE(rel(ppl("--weights fp32 --kv int8")), 0.01);
    EXPECT_LE(rel(ppl("--weights int8 --kv int8")), 0.02);
}

// INT4 on the real weights: quantized on load (round to nearest), and written by
// `shardlm quantize --calib` with AWQ scales calibrated on the last third of the held-out text
// (disjoint from the third measured here), which must not do worse than rounding.
TEST_F(ShippedModel, Int4AndAwq) {
    const double fp32 = ppl("--weights fp32 --kv fp32");
    const double rtn = ppl("--weights int4 --kv fp32");
    EXPECT_LE((rtn - fp32) / fp32, 0.01);
    EXPECT_GT(rtn, fp32);  // 4 bits do cost something
    // W4A8: the same weights with INT8 activations per group of 128 adds little on top (measured
    // +0.01% on the whole text).
    EXPECT_LE((ppl("--weights w4a8 --kv int8") - rtn) / rtn, 0.01);
    const std::string text = read_file(kModel + "/heldout.txt");
    write_file(dir_->file("calib.txt"), text.substr(2 * text.size() / 3));
    const std::string out = dir_->file("awq");
    const CommandResult q = run_command(SHARDLM_BIN " quantize --model " + kModel + " --out " + out +
                                        " --weights int4 --calib " + dir_->file("calib.txt"));
    ASSERT_EQ(q.exit_code, 0) << q.err;
    EXPECT_NE(q.err.find("awq: 8192 calibration tokens; "), std::string::npos) << q.err;
    const CommandResult r = run_command(SHARDLM_BIN " perplexity --model " + out + " --text-file " + dir_->file("heldout.txt") +
                                        " --ctx 256 --prefill-chunk 256 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const double awq = nlohmann::json::parse(r.out)["perplexity"].get<double>();
    EXPECT_LT(awq, rtn) << "fp32 " << fp32 << ", int4 round-to-nearest " << rtn;
    // --calib is for int4 only.
    const CommandResult bad = run_command(SHARDLM_BIN " quantize --model " + kModel + " --out " + dir_->file("x") +
                                          " --weights int8 --calib " + dir_->file("calib.txt"));
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.err.find("--calib: AWQ channel scales are searched for --weights int4 or w4a8"), std::string::npos) << bad.err;
}

#ifdef SHARDLM_MPIEXEC
TEST_F(ShippedModel, TensorParallelEqualsOneRank) {
    const std::string mpirun = std::string(SHARDLM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 ";
    for (const char* flags : {"--weights fp32 --kv fp32", "--weights int8 --kv int8", "--weights int4 --kv int8"}) {
        const double one = ppl(flags), two = ppl(flags, mpirun);
        EXPECT_NEAR(two, one, 1e-4 * one) << flags;
    }
}
#endif

namespace {
nlohmann::json generate_json(const std::string& flags, const std::string& launcher = "", size_t max_new = 40) {
    const CommandResult r = run_command(launcher + SHARDLM_BIN " generate --model " + kModel +
                                        " --prompt 'In the beginning' --temperature 0 --json --max-new-tokens " +
                                        std::to_string(max_new) + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out)["results"][0] : nlohmann::json();
}
}  // namespace

// --batch-invariant on the real model: a prompt's tokens and log-probabilities, bit for bit in
// their JSON text, alone and as the last of four prompts run together, with its prefill cut into
// chunks of 3 and with 2 slots, for INT8 weights and cache (whose ordinary kernels change with the
// step's size) and BF16 weights.
TEST_F(ShippedModel, BatchInvariantGenerate) {
    const std::string prompts = dir_->file("four.txt");
    write_file(prompts, "Blessed are the\nAnd the LORD spake unto Moses, saying\nAnd God said\nIn the beginning\n");
    for (const char* weights : {"--weights int8 --kv int8", "--weights bf16 --kv fp32"}) {
        const std::string flags = std::string(weights) + " --batch-invariant --logprobs 2";
        const nlohmann::json alone = generate_json(flags);
        for (const char* how : {"", " --prefill-chunk 3", " --batch 2"}) {
            const CommandResult r = run_command(SHARDLM_BIN " generate --model " + kModel + " --prompt-file " + prompts +
                                                " --temperature 0 --json --max-new-tokens 40 " + flags + how);
            ASSERT_EQ(r.exit_code, 0) << r.err;
            const nlohmann::json last = nlohmann::json::parse(r.out)["results"][3];
            EXPECT_EQ(last["logprobs"].dump(), alone["logprobs"].dump()) << weights << how;
            EXPECT_EQ(last["text"], alone["text"]) << weights << how;
        }
    }
}

// --stop on the real model's greedy text: the sequence ends at the token that completes the stop
// string (its tokens a prefix of the unstopped run's, one more than needed to reach the string's
// start), the text ends before it, stop_reason "stop"; the earliest of two stops wins; a string
// that never appears changes nothing; the streamed text on a terminal (`script` provides one) is
// the same; two ranks stop where one does.
TEST_F(ShippedModel, StopStrings) {
    const nlohmann::json free = generate_json("");
    const std::string text = free["text"];
    const std::vector<int32_t> tokens = free["tokens"];
    ASSERT_EQ(free["stop_reason"], "length");
    const std::string stop = "LORD, and";  // the model's favourite phrase
    const size_t at = text.find(stop);
    ASSERT_NE(at, std::string::npos) << text;
    const nlohmann::json cut = generate_json("--stop '" + stop + "'");
    EXPECT_EQ(cut["text"], text.substr(0, at));
    EXPECT_EQ(cut["stop_reason"], "stop");
    const std::vector<int32_t> cut_tokens = cut["tokens"];
    ASSERT_LT(cut_tokens.size(), tokens.size());
    EXPECT_EQ(cut_tokens, std::vector<int32_t>(tokens.begin(), tokens.begin() + long(cut_tokens.size())));
    // One token fewer would not have completed the string: its text ends before the stop ends.
    const nlohmann::json shorter = generate_json("--stop zzz", "", cut_tokens.size() - 1);
    EXPECT_EQ(shorter["text"].get<std::string>().find(stop), std::string::npos);
    const nlohmann::json two = generate_json("--stop zzz --stop 'and the' --stop '" + stop + "'");
    EXPECT_EQ(two["text"], text.substr(0, std::min(at, text.find("and the"))));
    const nlohmann::json none = generate_json("--stop zzz");
    EXPECT_EQ(none["text"], text);
    EXPECT_EQ(none["tokens"], free["tokens"]);
    EXPECT_EQ(none["stop_reason"], "length");
    const CommandResult tty = run_command("script -qec \"" SHARDLM_BIN " generate --model " + kModel +
                                          " --prompt 'In the beginning' --temperature 0 --max-new-tokens 40 --stop '" +
                                          stop + "' 2>/dev/null\" /dev/null");
    ASSERT_EQ(tty.exit_code, 0) << tty.err;
    EXPECT_EQ(tty.out, text.substr(0, at) + "\r\n");  // the terminal's line discipline adds the \r
#ifdef SHARDLM_MPIEXEC
    const std::string mpirun = std::string(SHARDLM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 ";
    EXPECT_EQ(generate_json("--stop '" + stop + "'", mpirun), cut);
#endif
}

// shardlm chat on the real model (given a ChatML template): its replies are real text, so the
// second turn's rendered conversation re-encodes the first reply to the same tokens and reuses
// every cached position (prompt 1 and reply 1 but its last token, which never ran); its reply is
// generate's for the whole conversation from an empty cache; sampled turns repeat with the seed;
// two ranks give one rank's turns.
TEST_F(ShippedModel, ChatReusesTheCachedConversation) {
    TempDir m;
    for (const std::string f : {"config.json", "model.safetensors", "tokenizer.json"})
        write_file(m.file(f), read_file(kModel + "/" + f));
    nlohmann::json cfg = nlohmann::json::parse(read_file(kModel + "/tokenizer_config.json"));
    cfg["chat_template"] =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
        "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    write_file(m.file("tokenizer_config.json"), cfg.dump());
    write_file(dir_->file("turns.txt"), "In the beginning\nAnd God said\n");
    const std::string chat = "<" + dir_->file("turns.txt") + " " SHARDLM_BIN " chat --model " + m.path() +
                             " --max-new-tokens 12 --json ";
    auto turns_of = [&](const std::string& flags, const std::string& launcher = "") {
        const CommandResult r = run_command(launcher.empty() ? chat + flags
                                                             : "<" + dir_->file("turns.txt") + " " + launcher +
                                                                   SHARDLM_BIN " chat --model " + m.path() +
                                                                   " --max-new-tokens 12 --json " + flags);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        std::vector<nlohmann::json> t;
        std::istringstream lines(r.out);
        for (std::string l; std::getline(lines, l);) {
            nlohmann::json j = nlohmann::json::parse(l);
            j.erase("prefill_ms");
            j.erase("decode_ms_per_token");
            t.push_back(j);
        }
        return t;
    };
    const std::vector<nlohmann::json> turns = turns_of("--temperature 0");
    ASSERT_EQ(turns.size(), 2u);
    const size_t p1 = turns[0]["prompt_tokens"], r1 = turns[0]["tokens"].size();
    EXPECT_EQ(turns[1]["reused_tokens"], p1 + r1 - 1);
    // The whole second prompt, rendered by hand and encoded by shardlm tokenize.
    const std::string text = "<|im_start|>user\nIn the beginning<|im_end|>\n<|im_start|>assistant\n" +
                             turns[0]["text"].get<std::string>() +
                             "<|im_end|>\n<|im_start|>user\nAnd God said<|im_end|>\n<|im_start|>assistant\n";
    write_file(dir_->file("conv.txt"), text);
    // (The x keeps the command substitution from eating the text's final newline.)
    const CommandResult ids = run_command("t=$(cat " + dir_->file("conv.txt") + "; printf x); " SHARDLM_BIN
                                          " tokenize --model " + m.path() + " --no-special --text \"${t%x}\"");
    ASSERT_EQ(ids.exit_code, 0) << ids.err;
    const std::vector<int32_t> ids2 = nlohmann::json::parse(ids.out);
    ASSERT_EQ(turns[1]["prompt_tokens"], ids2.size());
    std::string arg;
    for (int32_t id : ids2) arg += (arg.empty() ? "" : ",") + std::to_string(id);
    const CommandResult g = run_command(SHARDLM_BIN " generate --model " + m.path() +
                                        " --max-new-tokens 12 --temperature 0 --json --prompt-ids " + arg);
    ASSERT_EQ(g.exit_code, 0) << g.err;
    EXPECT_EQ(nlohmann::json::parse(g.out)["results"][0]["tokens"], turns[1]["tokens"]);
    const std::vector<nlohmann::json> sampled = turns_of("--temperature 1 --seed 9");
    EXPECT_EQ(turns_of("--temperature 1 --seed 9"), sampled);
    EXPECT_NE(sampled[0]["tokens"], turns[0]["tokens"]);
    // With the model drafting for itself (--draft-model): the same turns, greedy and sampled; the
    // draft's cache follows the conversation as the target's does.
    const std::string draft = " --speculate 3 --draft-model " + m.path() + " --draft-p-min 0";
    EXPECT_EQ(turns_of("--temperature 0" + draft), turns);
    EXPECT_EQ(turns_of("--temperature 1 --seed 9" + draft), sampled);
#ifdef SHARDLM_MPIEXEC
    EXPECT_EQ(turns_of("--temperature 1 --seed 9 --threads 1",
                       std::string(SHARDLM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 "),
              sampled);
#endif
}
