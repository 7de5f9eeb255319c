// The shardlm binary end to end: output contracts and one-line errors for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <regex>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/mmap_file.h"
#include "fixtures.h"
#include "model/checkpoint.h"
#include "model/shard.h"
#include "model/synthetic.h"
#include "model/weights.h"
#include "runtime/cpu_engine.h"
#include "runtime/json_mode.h"
#include "runtime/kv_cache.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

// bench --json's output: one object per line.
std::vector<nlohmann::json> json_lines(const std::string& out) {
    std::vector<nlohmann::json> rows;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
    return rows;
}

const std::string kBin = SHARDLM_BIN;

// Runs shardlm with `args`, expects failure with one "shardlm: error:" line containing `needle`.
void expect_error(const std::string& args, const std::string& needle) { expect_cli_error(args, needle); }

// Removes max_position_embeddings from DIR/config.json: nothing then bounds the context but the
// KV cache's size.
void drop_max_position(const TempDir& dir) {
    std::string cfg = read_file(dir.file("config.json"));
    const size_t at = cfg.find("\"max_position_embeddings\"");
    ASSERT_NE(at, std::string::npos);
    cfg.erase(at, cfg.find('\n', at) + 1 - at);
    write_file(dir.file("config.json"), cfg);
}

// Bytes of the KV cache the CLI sizes for model c at ctx positions x batch slots (kv: --kv).
size_t kv_bytes(const ModelConfig& c, int64_t ctx, int64_t batch, DType kv = DType::F32) {
    KVCacheShape ks;
    ks.n_layers = c.n_layers;
    ks.n_slots = batch;
    ks.capacity = ctx;
    ks.n_kv_heads = c.n_kv_heads;
    ks.head_dim = c.head_dim;
    ks.dtype = kv;
    return kv_cache_bytes(ks);
}

class Cli : public ::testing::Test {
protected:
    void SetUp() override { write_synthetic_checkpoint(dir_.path(), tiny_config(Arch::Qwen2), {DType::BF16, 1, 4}); }
    TempDir dir_;
};

}  // namespace

TEST(CliBasics, VersionAndHelp) {
    const CommandResult v = run_command(kBin + " --version");
    EXPECT_EQ(v.exit_code, 0);
    EXPECT_NE(v.out.find("backends: cpu("), std::string::npos) << v.out;
    const CommandResult h = run_command(kBin + " generate --help");
    EXPECT_EQ(h.exit_code, 0);
    EXPECT_NE(h.out.find("--prompt-ids"), std::string::npos);
    expect_error("frobnicate", "unknown subcommand");
}

TEST_F(Cli, GenerateJsonContract) {
    const std::string logits = dir_.file("logits.json");
    const CommandResult r = run_command(kBin + " generate --model " + dir_.path() +
                                        " --prompt-ids '5,6,7;9' --max-new-tokens 4 --temperature 0 --json --dump-logits " + logits);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);  // stdout holds exactly one JSON object
    ASSERT_EQ(j["results"].size(), 2u);
    EXPECT_EQ(j["results"][0]["prompt_tokens"], 3);
    EXPECT_EQ(j["results"][1]["prompt_tokens"], 1);
    for (const auto& res : j["results"]) {
        const size_t n = res["tokens"].size();
        EXPECT_TRUE((res["stop_reason"] == "length" && n == 4) || (res["stop_reason"] == "eos" && n <= 4)) << res.dump();
    }
    for (const char* k : {"load_ms", "prefill_ms", "decode_ms_per_token", "prefill_tokens_per_s", "decode_tokens_per_s"})
        EXPECT_TRUE(j["timings"].contains(k)) << k;
    for (const char* k : {"weights_bytes", "kv_cache_bytes", "workspace_bytes", "peak_bytes"})
        EXPECT_GT(j["memory"][k].get<double>(), 0) << k;
    EXPECT_EQ(j["tp"], 1);
    EXPECT_EQ(j["device"], "cpu");
    const auto lg = nlohmann::json::parse(read_file(logits));
    ASSERT_EQ(lg.size(), 2u);
    EXPECT_EQ(lg[0].size(), 384u);
    // Greedy output repeats exactly.
    const CommandResult again = run_command(kBin + " generate --model " + dir_.path() +
                                            " --prompt-ids '5,6,7;9' --max-new-tokens 4 --temperature 0 --json");
    EXPECT_EQ(nlohmann::json::parse(again.out)["results"], j["results"]);
    // ... and so does it with the weights copied out of the file map.
    const CommandResult copied = run_command(kBin + " generate --model " + dir_.path() +
                                             " --prompt-ids '5,6,7;9' --max-new-tokens 4 --temperature 0 --json --no-mmap");
    ASSERT_EQ(copied.exit_code, 0) << copied.err;
    EXPECT_EQ(nlohmann::json::parse(copied.out)["results"], j["results"]);
    for (const char* k : {"total_ms", "generated_tokens_per_s"}) EXPECT_GT(j["timings"][k].get<double>(), 0) << k;
    EXPECT_EQ(j["batch"], 2);
}

// --batch N: at most N sequences at once, the other prompts waiting for a slot; the tokens are
// those of the whole batch at once (greedy), in the order of the prompts.
TEST_F(Cli, BatchQueuesThePromptsItHasNoSlotFor) {
    const std::string gen = kBin + " generate --model " + dir_.path() +
                            " --prompt-ids '5,6,7;9;1,2,3,4,5,6,7,8,9,10;11,12' --max-new-tokens 5 --temperature 0 "
                            "--prefill-chunk 4 --json";
    const CommandResult all = run_command(gen);
    ASSERT_EQ(all.exit_code, 0) << all.err;
    const auto j = nlohmann::json::parse(all.out);
    EXPECT_EQ(j["batch"], 4);
    for (const char* b : {"1", "2", "3", "9"}) {
        const CommandResult r = run_command(gen + " --batch " + b);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const auto q = nlohmann::json::parse(r.out);
        EXPECT_EQ(q["results"], j["results"]) << "--batch " << b;
        EXPECT_EQ(q["batch"], std::min(std::stoi(b), 4)) << "--batch " << b;
        // The KV cache has a slot per sequence that may run at once.
        EXPECT_EQ(q["memory"]["kv_cache_bytes"].get<int64_t>() * 4,
                  j["memory"]["kv_cache_bytes"].get<int64_t>() * q["batch"].get<int64_t>());
    }
    expect_error("generate --model " + dir_.path() + " --prompt-ids 1,2 --batch -1", "--batch must be >= 0");
}

// --prefix-cache: through one slot, each prompt reuses the start it shares with the sequence
// that ran there before it; the tokens are those without it.
TEST_F(Cli, PrefixCacheReusesTheSharedStart) {
    const std::string gen = kBin + " generate --model " + dir_.path() +
                            " --prompt-ids '1,2,3,4,5,6,7,8;1,2,3,4,5,6,9;1,2,3,4,5,6,7,8,10' --max-new-tokens 4 "
                            "--temperature 0 --prefill-chunk 4 --batch 1 --json";
    const CommandResult plain = run_command(gen), reused = run_command(gen + " --prefix-cache");
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    ASSERT_EQ(reused.exit_code, 0) << reused.err;
    const auto a = nlohmann::json::parse(plain.out)["results"], b = nlohmann::json::parse(reused.out)["results"];
    const int cached[] = {0, 6, 6};
    for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(b[i]["tokens"], a[i]["tokens"]) << "prompt " << i;
        EXPECT_EQ(a[i]["cached_tokens"], 0) << "prompt " << i;
        EXPECT_EQ(b[i]["cached_tokens"], cached[i]) << "prompt " << i;
    }
}

// --prompt-cache: a second run starts with what the first saved. B leaves A after 18 tokens: it
// loads part of A's save, then A loads the rest of its own past what B left in the slot.
TEST_F(Cli, PromptCacheCarriesPrefixesAcrossRuns) {
    std::string a, b;
    for (int i = 1; i <= 20; ++i) a += (i > 1 ? "," : "") + std::to_string(i);
    for (int i = 1; i <= 18; ++i) b += std::to_string(i) + ",";
    b += "99,100";
    const std::string file = dir_.file("prompts.kv");
    const std::string gen = kBin + " generate --model " + dir_.path() + " --max-new-tokens 4 --temperature 0 --batch 1 --json";
    auto run = [&](const std::string& ids, const std::string& more) {
        const CommandResult r = run_command(gen + " --prompt-ids '" + ids + "'" + more);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return r;
    };
    const auto plain = nlohmann::json::parse(run(b + ";" + a, "").out);
    const CommandResult first = run(a, " --prompt-cache " + file);
    EXPECT_NE(first.err.find("--prompt-cache " + file + ": no file yet"), std::string::npos) << first.err;
    EXPECT_NE(first.err.find("1 prefix, 23 positions"), std::string::npos) << first.err;  // A and its tokens but the last
    EXPECT_EQ(nlohmann::json::parse(first.out)["results"][0]["cached_tokens"], 0);
    const CommandResult second = run(b + ";" + a, " --prompt-cache " + file);
    EXPECT_NE(second.err.find(file + ": 1 prefix, 23 positions"), std::string::npos) << second.err;
    EXPECT_NE(second.err.find(") loaded"), std::string::npos) << second.err;
    const auto j = nlohmann::json::parse(second.out);
    for (size_t i = 0; i < 2; ++i) EXPECT_EQ(j["results"][i]["tokens"], plain["results"][i]["tokens"]) << "prompt " << i;
    EXPECT_EQ(j["results"][0]["cached_tokens"], 18);
    EXPECT_EQ(j["results"][1]["cached_tokens"], 19);
    EXPECT_EQ(j["timings"]["host_loads"], 2);
    EXPECT_EQ(j["timings"]["host_tokens"], 18 + 1);
    // Another KV format: not used (named), and replaced by one that the next run of it uses.
    const CommandResult other = run(a, " --prompt-cache " + file + " --kv int8");
    EXPECT_NE(other.err.find("not used: kv is fp32 there, int8 here"), std::string::npos) << other.err;
    EXPECT_EQ(nlohmann::json::parse(other.out)["results"][0]["cached_tokens"], 0);
    // Nothing new to save (A's prompt and tokens were saved already): the file stays as it is.
    const CommandResult again = run(a, " --prompt-cache " + file + " --kv int8");
    EXPECT_EQ(nlohmann::json::parse(again.out)["results"][0]["cached_tokens"], 19);
    EXPECT_NE(again.err.find("--prompt-cache " + file + ": unchanged"), std::string::npos) << again.err;
    // Damage is an error naming the file, before any step; so are the flags that leave no tier.
    {
        std::ofstream f(dir_.file("not.kv"));
        f << "{\"a\": 1}\n";
    }
    const std::string ids = " --prompt-ids '" + a + "'";
    expect_error("generate --model " + dir_.path() + ids + " --prompt-cache " + dir_.file("not.kv"),
                 dir_.file("not.kv") + ": not a shardlm prefix cache");
    const std::string cut = dir_.file("cut.kv");
    std::filesystem::copy_file(file, cut);
    std::filesystem::resize_file(cut, std::filesystem::file_size(file) - 1);
    expect_error("generate --model " + dir_.path() + ids + " --kv int8 --prompt-cache " + cut, cut + ": damaged prefix cache");
    expect_error("generate --model " + dir_.path() + ids + " --cache-ram 8", "--cache-ram is the prefix cache's host tier");
    expect_error("generate --model " + dir_.path() + ids + " --prompt-cache " + file + " --cache-ram 0", "--cache-ram 0 leaves it none");
    expect_error("generate --model " + dir_.path() + ids + " --prompt-cache " + dir_.file("no/such/dir/f.kv"), "--prompt-cache: cannot write");
}

TEST_F(Cli, LogprobsInTheJson) {
    const CommandResult r = run_command(kBin + " generate --model " + dir_.path() +
                                        " --prompt-ids '5,6,7;9' --max-new-tokens 3 --temperature 0 --json --logprobs 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    for (const auto& res : j["results"]) {
        ASSERT_EQ(res["logprobs"].size(), res["tokens"].size()) << res.dump();
        for (size_t t = 0; t < res["tokens"].size(); ++t) {
            const auto& lp = res["logprobs"][t];
            EXPECT_EQ(lp["id"], res["tokens"][t]);
            ASSERT_EQ(lp["top"].size(), 2u);
            EXPECT_EQ(lp["top"][0]["id"], lp["id"]);  // greedy takes the most probable
            EXPECT_EQ(lp["top"][0]["logprob"], lp["logprob"]);
            EXPECT_LE(lp["logprob"].get<double>(), 0.0);
            EXPECT_GE(lp["logprob"].get<double>(), lp["top"][1]["logprob"].get<double>());
        }
    }
    const CommandResult none = run_command(kBin + " generate --model " + dir_.path() +
                                           " --prompt-ids '5,6,7;9' --max-new-tokens 3 --temperature 0 --json");
    EXPECT_FALSE(nlohmann::json::parse(none.out)["results"][0].contains("logprobs"));
    const std::string m = "generate --model " + dir_.path() + " --prompt-ids 1,2 ";
    expect_error(m + "--logprobs 2", "--logprobs needs --json");
    expect_error(m + "--json --logprobs -1", "--logprobs must be >= 0");
    expect_error(m + "--json --logprobs 385", "--logprobs 385 must be in [0, 384] (the vocabulary)");
}

// --prompt-logprobs: a prompt followed by its greedy continuation, scored with --max-new-tokens 0,
// gives those tokens the logprobs generating them gave; the first prompt token gets null.
TEST_F(Cli, PromptLogprobsScoreAText) {
    const CommandResult g = run_command(kBin + " generate --model " + dir_.path() +
                                        " --prompt-ids 5,6,7 --max-new-tokens 4 --temperature 0 --json --logprobs 0");
    ASSERT_EQ(g.exit_code, 0) << g.err;
    const auto gen = nlohmann::json::parse(g.out)["results"][0];
    std::string ids = "5,6,7";
    for (const auto& t : gen["tokens"]) ids += "," + std::to_string(t.get<int>());
    const CommandResult r = run_command(kBin + " generate --model " + dir_.path() + " --prompt-ids '" + ids +
                                        ";9' --max-new-tokens 0 --json --prompt-logprobs 2 --prefill-chunk 3");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto res = nlohmann::json::parse(r.out)["results"];
    const auto& p = res[0]["prompt_logprobs"];
    ASSERT_EQ(p.size(), 7u) << r.out;
    EXPECT_TRUE(p[0].is_null());
    EXPECT_TRUE(res[0]["tokens"].empty());
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(p[3 + i]["id"], gen["tokens"][i]);
        EXPECT_NEAR(p[3 + i]["logprob"].get<double>(), gen["logprobs"][i]["logprob"].get<double>(), 1e-4) << i;
        EXPECT_EQ(p[3 + i]["top"].size(), 2u);
    }
    EXPECT_EQ(res[1]["prompt_logprobs"], nlohmann::json::array({nullptr}));  // one token: nothing to score
    const std::string m = "generate --model " + dir_.path() + " --prompt-ids 1,2 ";
    expect_error(m + "--prompt-logprobs 2", "--prompt-logprobs needs --json");
    expect_error(m + "--json --max-new-tokens 0", "--max-new-tokens must be at least 1 (0 with --prompt-logprobs");
}

// --logit-bias: -100 bans greedy decoding's first choice, +100 forces a token; bad values are
// one-line errors naming the flag.
TEST_F(Cli, LogitBiasBansAndForces) {
    const std::string m = kBin + " generate --model " + dir_.path() + " --prompt-ids 5,6,7 --max-new-tokens 4 --json";
    const CommandResult g = run_command(m + " --temperature 0");
    ASSERT_EQ(g.exit_code, 0) << g.err;
    const int first = nlohmann::json::parse(g.out)["results"][0]["tokens"][0];
    const CommandResult banned = run_command(m + " --temperature 0 --logit-bias " + std::to_string(first) + "=-100");
    ASSERT_EQ(banned.exit_code, 0) << banned.err;
    for (const auto& t : nlohmann::json::parse(banned.out)["results"][0]["tokens"]) EXPECT_NE(t.get<int>(), first);
    const CommandResult forced = run_command(m + " --logit-bias 42=100 --temperature 1.5 --top-k 0");
    ASSERT_EQ(forced.exit_code, 0) << forced.err;
    EXPECT_EQ(nlohmann::json::parse(forced.out)["results"][0]["tokens"], nlohmann::json::array({42, 42, 42, 42}));
    const std::string e = "generate --model " + dir_.path() + " --prompt-ids 1,2 ";
    expect_error(e + "--logit-bias 5", "--logit-bias: expected ID=BIAS (a token id and a number in [-100, 100]), got \"5\"");
    expect_error(e + "--logit-bias 5=x", "--logit-bias: expected ID=BIAS");
    expect_error(e + "--logit-bias -5=1", "--logit-bias: expected ID=BIAS");
    expect_error(e + "--logit-bias 5=200", "--logit-bias: the bias of token 5 must be in [-100, 100]");
    expect_error(e + "--logit-bias 5=1 --logit-bias 5=2", "--logit-bias: token 5 is biased twice");
    expect_error(e + "--logit-bias 99999=1", "--logit-bias: token id 99999 is outside the vocabulary [0, ");
}

// --speculate: the shipped model's greedy texts (a batch of verse openings) are those of plain
// decoding, in fewer steps; the counts are in the JSON timings.
TEST_F(Cli, SpeculationKeepsTheText) {
    const std::string model = SHARDLM_SOURCE_DIR "/launch/models/kjv-small";
    // Greedy, and sampled with a seed (the same draws, one per kept token).
    for (const std::string sampling : {"--temperature 0", "--temperature 0.7 --seed 9"}) {
        const std::string m = kBin + " generate --model " + model + " --json " + sampling +
                              " --max-new-tokens 48 --batch 2 --prompt-ids '5,6,7;40,41,42,43;100,101' --speculate ";
        const CommandResult plain = run_command(m + "0"), spec = run_command(m + "4");
        ASSERT_EQ(plain.exit_code, 0) << plain.err;
        ASSERT_EQ(spec.exit_code, 0) << spec.err;
        const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(spec.out);
        for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a["results"][i]["tokens"], b["results"][i]["tokens"]) << sampling << " " << i;
        EXPECT_EQ(a["timings"]["draft_tokens"], 0);
        EXPECT_GT(b["timings"]["accepted_tokens"].get<int>(), 0) << sampling;
        EXPECT_LT(b["timings"]["decode_steps"].get<int>(), a["timings"]["decode_steps"].get<int>()) << sampling;
    }
    expect_error("generate --model " + dir_.path() + " --prompt-ids 1,2 --speculate 17", "--speculate must be in [0, 16]");
}

// --json-object: each text is the start of one JSON object, a whole one where it ended with
// "stop"; greedy and sampled, speculation keeping the tokens.
TEST_F(Cli, JsonObjectKeepsTheTextOneObject) {
    const std::string m = kBin + " generate --model " SHARDLM_SOURCE_DIR "/launch/models/kjv-small --json --json-object "
                          "--max-new-tokens 40 --prompt-ids '5,6,7;8,9;10' ";
    int closed = 0;
    for (const std::string flags : {"--temperature 0", "--temperature 0.8 --seed 3", "--temperature 1.2 --seed 4 --top-k 0"}) {
        const CommandResult r = run_command(m + flags), spec = run_command(m + flags + " --speculate 3");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        ASSERT_EQ(spec.exit_code, 0) << spec.err;
        const auto j = nlohmann::json::parse(r.out), js = nlohmann::json::parse(spec.out);
        for (size_t i = 0; i < 3; ++i) {
            const std::string text = j["results"][i]["text"];
            EXPECT_EQ(js["results"][i]["tokens"], j["results"][i]["tokens"]) << flags;
            JsonAcceptor a;
            EXPECT_TRUE(a.push(text)) << flags << ": " << text;
            EXPECT_EQ(a.complete(), j["results"][i]["stop_reason"] == "stop") << flags << ": " << text;
            if (a.complete()) {
                EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
                ++closed;
            }
        }
    }
    EXPECT_GT(closed, 0);
}

// --json-schema: each text is the start of one value of the schema, keys in the schema's order;
// greedy and sampled, speculation keeping the tokens; the schema's faults are one-line errors.
TEST_F(Cli, JsonSchemaHoldsTheTextToTheSchema) {
    TempDir t;
    const std::string schema = R"({"type": "object", "properties": {"verse": {"type": "integer"},
        "book": {"enum": ["Genesis", "Exodus"]}, "text": {"type": "string", "maxLength": 20}},
        "required": ["verse", "book", "text"], "additionalProperties": false})";
    write_file(t.file("s.json"), schema);
    const auto compiled = std::make_shared<const JsonSchema>(compile_json_schema(schema, "test"));
    const std::string m = kBin + " generate --model " SHARDLM_SOURCE_DIR "/launch/models/kjv-small --json --json-schema " +
                          t.file("s.json") + " --max-new-tokens 200 --prompt-ids '5,6,7;8,9' ";
    int complete = 0;
    for (const std::string flags : {"--temperature 0", "--temperature 0.8 --seed 3"}) {
        const CommandResult r = run_command(m + flags), spec = run_command(m + flags + " --speculate 3");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        ASSERT_EQ(spec.exit_code, 0) << spec.err;
        const auto j = nlohmann::json::parse(r.out), js = nlohmann::json::parse(spec.out);
        for (size_t i = 0; i < 2; ++i) {
            const std::string text = j["results"][i]["text"];
            EXPECT_EQ(js["results"][i]["tokens"], j["results"][i]["tokens"]) << flags;
            JsonAcceptor a(compiled);
            EXPECT_TRUE(a.push(text)) << flags << ": " << text;
            EXPECT_EQ(a.complete(), j["results"][i]["stop_reason"] == "stop") << flags << ": " << text;
            if (!a.complete()) continue;
            ++complete;
            const nlohmann::ordered_json v = nlohmann::ordered_json::parse(text);
            ASSERT_EQ(v.size(), 3u) << text;
            EXPECT_EQ(v.begin().key(), "verse") << text;
            EXPECT_TRUE(v["verse"].is_number_integer()) << text;
            EXPECT_TRUE(v["book"] == "Genesis" || v["book"] == "Exodus") << text;
            EXPECT_TRUE(v["text"].is_string()) << text;
        }
    }
    EXPECT_GT(complete, 0);
    // --json-whitespace 0: compact JSON (the shipped model otherwise spends 16 bytes per gap).
    const CommandResult compact = run_command(m + "--temperature 0 --json-whitespace 0");
    ASSERT_EQ(compact.exit_code, 0) << compact.err;
    for (const auto& res : nlohmann::json::parse(compact.out)["results"]) {
        const std::string text = res["text"];
        EXPECT_EQ(res["stop_reason"], "stop") << text;
        EXPECT_EQ(text.substr(0, 9), "{\"verse\":") << text;
        EXPECT_EQ(nlohmann::ordered_json::parse(text).dump(), text);  // what dump() writes: no whitespace
    }
    const std::string g = "generate --model " SHARDLM_SOURCE_DIR "/launch/models/kjv-small --prompt-ids 5 ";
    expect_error(g + "--json-object --json-whitespace 65", "--json-whitespace must be in [0, 64]");
    write_file(t.file("bad.json"), R"({"type": "object", "properties": {"a": {"type": "string", "format": "iri"}}})");
    expect_error(g + "--json-schema " + t.file("bad.json"),
                 "--json-schema " + t.file("bad.json") + ": json_schema at #/properties/a/format: format \"iri\" is not supported");
    expect_error(g + "--json-schema " + t.file("none.json"), "--json-schema: " + t.file("none.json"));
    expect_error(g + "--json-schema " + t.file("s.json") + " --json-object", "--json-object and --json-schema exclude each other");
    expect_error("generate --model " + dir_.path() + " --prompt-ids 1 --json-schema " + t.file("s.json"),
                 "--json-schema needs the model's tokenizer: " + dir_.path());
    // --regex (vLLM's guided_regex): raw text matching the pattern whole; ended by the model's end
    // of sequence where the match is complete, or where nothing can follow.
    const CommandResult rx = run_command(kBin + " generate --model " SHARDLM_SOURCE_DIR "/launch/models/kjv-small "
                                         "--prompt 'And God said' --regex '(Genesis|Exodus) [0-9]{1,3}:[0-9]{1,3}' "
                                         "--temperature 1 --seed 3 --batch 4 --max-new-tokens 30 --json");
    ASSERT_EQ(rx.exit_code, 0) << rx.err;
    for (const auto& res : nlohmann::json::parse(rx.out)["results"]) {
        const std::string text = res["text"];
        EXPECT_TRUE(std::regex_match(text, std::regex("(Genesis|Exodus) [0-9]{1,3}:[0-9]{1,3}"))) << text;
        EXPECT_TRUE(res["stop_reason"] == "stop" || res["stop_reason"] == "eos") << text;
    }
    expect_error(g + "--regex 'a(?=b)'", "--regex: lookahead and lookbehind");
    expect_error(g + "--regex a --json-object", "--regex and --json-object exclude each other");
    // --grammar-file (a GBNF grammar, llama.cpp's --grammar-file): the text is root's, whole.
    write_file(t.file("verse.gbnf"), "root ::= book \" \" num \":\" num  # a reference\n"
                                     "book ::= \"Genesis\" | \"Exodus\"\nnum ::= [1-9] [0-9]?\n");
    const CommandResult gr = run_command(kBin + " generate --model " SHARDLM_SOURCE_DIR "/launch/models/kjv-small "
                                         "--prompt 'And God said' --grammar-file " + t.file("verse.gbnf") +
                                         " --temperature 1 --seed 5 --batch 4 --max-new-tokens 30 --json");
    ASSERT_EQ(gr.exit_code, 0) << gr.err;
    for (const auto& res : nlohmann::json::parse(gr.out)["results"]) {
        const std::string text = res["text"];
        EXPECT_TRUE(std::regex_match(text, std::regex("(Genesis|Exodus) [1-9][0-9]?:[1-9][0-9]?"))) << text;
        EXPECT_TRUE(res["stop_reason"] == "stop" || res["stop_reason"] == "eos") << text;
    }
    expect_error(g + "--grammar 'root ::= x'", "--grammar: line 1: rule x is used but not defined");
    expect_error(g + "--grammar-file " + t.file("none.gbnf"), "--grammar-file: " + t.file("none.gbnf"));
    expect_error(g + "--regex a --grammar 'root ::= \"a\"'", "--regex and --grammar exclude each other");
}

// generation_config.json's eos_token_id ends a sequence as config.json's does (instruct
// checkpoints list their turn-end token there).
TEST_F(Cli, GenerationConfigEndOfSequenceIdsStopGeneration) {
    const std::string m = kBin + " generate --model " + dir_.path() + " --prompt-ids 5,6,7 --max-new-tokens 6 --json --temperature 0";
    const CommandResult free_run = run_command(m);
    ASSERT_EQ(free_run.exit_code, 0) << free_run.err;
    const auto tokens = nlohmann::json::parse(free_run.out)["results"][0]["tokens"];
    ASSERT_GT(tokens.size(), 1u);
    write_file(dir_.file("generation_config.json"), "{\"eos_token_id\": [2, " + tokens[0].dump() + "]}");
    const CommandResult stopped = run_command(m);
    ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
    const auto r = nlohmann::json::parse(stopped.out)["results"][0];
    EXPECT_EQ(r["tokens"], nlohmann::json::array({tokens[0]}));
    EXPECT_EQ(r["stop_reason"], "eos");
    write_file(dir_.file("generation_config.json"), "{\"eos_token_id\": 1000000}");
    expect_error("generate --model " + dir_.path() + " --prompt-ids 5", dir_.file("generation_config.json") + ": eos_token_id 1000000");
}

// generation_config.json's sampling defaults (vLLM's --generation-config auto) for the flags not
// given: top_k 1 turns a sampled run greedy, and rank 0 says which it took; flags given keep their
// values; vllm keeps the built-in defaults; a value out of range, or a folder without the file, is
// an error naming it.
TEST_F(Cli, GenerationConfigSetsTheSamplingDefaults) {
    const std::string m = kBin + " generate --model " + dir_.path() + " --prompt-ids 5,6,7 --max-new-tokens 12 --json --seed 3";
    auto tokens = [&](const std::string& flags, std::string* err = nullptr) {
        const CommandResult r = run_command(m + flags);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        if (err) *err = r.err;
        return r.exit_code == 0 ? nlohmann::json::parse(r.out)["results"][0]["tokens"] : nlohmann::json();
    };
    const auto greedy = tokens(" --temperature 0"), sampled = tokens("");
    ASSERT_NE(sampled, greedy) << "seed 3 draws the greedy tokens: another seed is needed";
    write_file(dir_.file("generation_config.json"), R"({"temperature": 0.7, "top_k": 1})");
    std::string err;
    EXPECT_EQ(tokens("", &err), greedy);
    EXPECT_NE(err.find("shardlm generate: sampling defaults from generation_config.json: temperature 0.7, top_k 1"),
              std::string::npos) << err;
    EXPECT_EQ(tokens(" --temperature 0.8 --top-k 40"), sampled);
    EXPECT_EQ(tokens(" --generation-config vllm", &err), sampled);
    EXPECT_EQ(err.find("sampling defaults"), std::string::npos) << err;
    TempDir other;
    write_file(other.file("generation_config.json"), R"({"top_k": -1})");
    EXPECT_NE(tokens(" --generation-config " + other.path() + " --temperature 0.7"), greedy);  // -1: all tokens
    write_file(dir_.file("generation_config.json"), R"({"top_p": 0})");
    expect_error("generate --model " + dir_.path() + " --prompt-ids 5", dir_.file("generation_config.json") + ": top_p 0 is outside (0, 1]");
    TempDir empty;
    expect_error("generate --model " + dir_.path() + " --prompt-ids 5 --generation-config " + empty.path(),
                 "--generation-config " + empty.path() + ": " + empty.path() + "/generation_config.json does not exist");
}

// --ignore-eos and --min-new-tokens on a model pushed to end at once (its end-of-sequence id 2
// biased by +100).
TEST_F(Cli, IgnoreEosAndMinNewTokens) {
    const std::string m = kBin + " generate --model " + dir_.path() + " --prompt-ids 5,6,7 --max-new-tokens 6 --json "
                          "--temperature 0 --logit-bias 2=100";
    auto tokens = [&](const std::string& flags) {
        const CommandResult r = run_command(m + flags);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return nlohmann::json::parse(r.out)["results"][0]["tokens"];
    };
    EXPECT_EQ(tokens(""), nlohmann::json::array({2}));
    EXPECT_EQ(tokens(" --ignore-eos"), nlohmann::json::array({2, 2, 2, 2, 2, 2}));
    const auto t = tokens(" --min-new-tokens 3");
    ASSERT_EQ(t.size(), 4u);
    EXPECT_EQ(t[3], 2);
    EXPECT_NE(t[0], 2);
    expect_error("generate --model " + dir_.path() + " --prompt-ids 1,2 --max-new-tokens 4 --min-new-tokens 5",
                 "--min-new-tokens 5 must be in [0, --max-new-tokens 4]");
}

TEST_F(Cli, InfoDescribesTheModel) {
    const CommandResult r = run_command(kBin + " info --model " + dir_.path());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("Qwen2ForCausalLM"), std::string::npos);
    EXPECT_NE(r.out.find("parameters"), std::string::npos);
    EXPECT_NE(r.out.find("chat template     none (no tokenizer.json)\n"), std::string::npos) << r.out;
}

TEST_F(Cli, InfoPrintsEachRanksMemoryPlan) {
    const CommandResult r = run_command(kBin + " info --model " + dir_.path() + " --tp 2 --batch 64 --ctx 32768 --kv int8");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // Each rank holds one of the two KV heads: its INT8 cache for 64 x 32768 positions.
    const ModelConfig c = tiny_config(Arch::Qwen2);
    KVCacheShape ks;
    ks.n_layers = c.n_layers;
    ks.n_slots = 64;
    ks.capacity = 32768;
    ks.n_kv_heads = plan_shard(c, 1, 2).n_kv_heads;
    ks.head_dim = c.head_dim;
    ks.dtype = DType::I8;
    EXPECT_NE(r.out.find("rank 1  q heads"), std::string::npos) << r.out;
    std::ostringstream kv;
    kv << "KV cache " << std::fixed << std::setprecision(3) << double(kv_cache_bytes(ks)) / (1024.0 * 1024.0 * 1024.0) << " GiB";
    EXPECT_GT(kv_cache_bytes(ks), size_t(1) << 30);  // a figure the plan prints with its digits
    EXPECT_NE(r.out.find(kv.str()), std::string::npos) << r.out;
    // And the CPU engine's step workspace (the engine checks its buffers against the same plan):
    // generate's 256-token step and a logits row per sequence.
    EngineOptions eo;
    eo.max_batch = 64;
    eo.max_step_tokens = 256;
    std::ostringstream ws;
    ws << "workspace " << std::fixed << std::setprecision(1)
       << double(cpu_workspace_bytes(c, plan_shard(c, 1, 2), eo, false)) / (1024.0 * 1024.0) << " MiB cpu";
    EXPECT_NE(r.out.find(ws.str()), std::string::npos) << ws.str() << "\n" << r.out;
    expect_error("info --model " + dir_.path() + " --kv int9", "--kv: unknown format");
}

// info printed its header (architecture, layers, ...) on stdout before the shard planner refused a
// --tp that cannot split the model; the refusal now comes first and alone.
TEST_F(Cli, InfoRefusesABadTpBeforePrintingAnything) {
    for (const std::string tp : {"3", "8", "2000000000"}) {  // the tiny model has 4 heads, 2 KV heads
        const std::string args = "info --model " + dir_.path() + " --tp " + tp;
        expect_error(args, "tensor parallelism " + tp + " does not divide the 4 attention heads");
        const CommandResult r = run_command(kBin + " " + args);
        EXPECT_NE(r.exit_code, 0);
        EXPECT_EQ(r.out, "") << args;
    }
}

// info printed a plan for a --ctx beyond max_position_embeddings and a wrapped KV-cache size for a
// --ctx x --batch past int64; it now checks the context as generate does (check_context). Without
// max_position_embeddings, generate crashed (SIGSEGV) on such a cache.
TEST_F(Cli, InfoChecksTheContextAsGenerateDoes) {
    const std::string m = " --model " + dir_.path();
    expect_error("info" + m + " --ctx 100000", "--ctx 100000 exceeds the model's max_position_embeddings 32768");
    expect_error("info" + m + " --ctx 32768 --batch 9223372036854775807", "the KV cache would need more than 2^63 bytes");
    expect_error("info" + m + " --ctx -1", "--ctx must be >= 0");
    std::string cfg = read_file(dir_.file("config.json"));
    const size_t at = cfg.find("\"max_position_embeddings\"");
    ASSERT_NE(at, std::string::npos);
    cfg.erase(at, cfg.find('\n', at) + 1 - at);
    write_file(dir_.file("config.json"), cfg);
    const std::string big = " --ctx 1152921504606846976";  // 2^60
    expect_error("info" + m + big + " --batch 4", "--ctx 1152921504606846976 x batch 4: the KV cache");
    expect_error("generate" + m + big + " --prompt-ids 1,2", "--ctx 1152921504606846976 x batch 1: the KV cache");
}

// Without --ctx, generate sizes the context as the longest prompt + --max-new-tokens (saturating).
// On a model without max_position_embeddings a huge --max-new-tokens was refused as
// "--ctx 9223372036854775802 x batch 1: ...", a --ctx the user never gave; the error now names the
// flags the context came from and the limit.
TEST_F(Cli, GenerateWithoutCtxBlamesTheFlagsGiven) {
    std::string cfg = read_file(dir_.file("config.json"));
    const size_t at = cfg.find("\"max_position_embeddings\"");
    ASSERT_NE(at, std::string::npos);
    cfg.erase(at, cfg.find('\n', at) + 1 - at);
    write_file(dir_.file("config.json"), cfg);
    const std::string m = "generate --model " + dir_.path();
    for (const std::string max_new : {"9223372036854775797", "9223372036854775807"}) {  // the sum fits / saturates
        const std::string args = m + " --prompt-ids 1,2,3,4,5 --max-new-tokens " + max_new;
        expect_error(args, "the longest prompt (5 tokens) + --max-new-tokens " + max_new +
                               " x batch 1: the KV cache would need more than 2^63 bytes");
        EXPECT_EQ(run_command(kBin + " " + args).err.find("--ctx"), std::string::npos) << args;
    }
    expect_error(m + " --prompt-ids '1,2,3;4' --max-new-tokens 4611686018427387904",
                 "the longest prompt (3 tokens) + --max-new-tokens 4611686018427387904 x batch 2: the KV cache");
    // A --ctx the user gave is still the one named.
    expect_error(m + " --prompt-ids 1,2 --ctx 9223372036854775807", "--ctx 9223372036854775807 x batch 1: the KV cache");
}

// A context within 2^63 bytes of KV cache but beyond any machine (no max_position_embeddings to
// refuse it) ended in a bare "out of memory" naming no flag. The error names the flags behind the
// size and the bytes asked for. Safe and fast: ~2^60 bytes is past x86-64's 47-bit user address
// space, so the allocation is refused at once, before any memory is committed, whatever the
// overcommit policy. (The memory check before the allocation is lifted here so that the allocator
// is the one refusing; KVCacheBeyondWhatTheMachineCanBack tests the check.)
TEST_F(Cli, KVCacheAllocationFailureNamesTheFlags) {
    ScopedEnv unlimited(kHostMemEnv, "18446744073709551615");
    drop_max_position(dir_);
    const ModelConfig c = tiny_config(Arch::Qwen2);
    auto bytes_of = [&](int64_t ctx, int64_t batch, DType kv) { return kv_bytes(c, ctx, batch, kv); };
    auto needs = [&](int64_t ctx, int64_t batch, DType kv) {
        const size_t bytes = bytes_of(ctx, batch, kv);
        std::ostringstream os;
        os << ": the KV cache needs " << std::fixed << std::setprecision(3) << double(bytes) / (1024.0 * 1024.0 * 1024.0)
           << " GiB (" << bytes << " bytes), allocation failed";
        return os.str();
    };
    const int64_t big = 1000000000000000;  // 10^15 positions
    ASSERT_GT(bytes_of(big, 1, DType::F32), size_t(1) << 47);  // the smallest cache asked for below
    const std::string m = " --model " + dir_.path(), b = std::to_string(big);
    expect_error("generate" + m + " --prompt-ids 1,2 --ctx " + b, "--ctx " + b + " x batch 1" + needs(big, 1, DType::F32));
    expect_error("generate" + m + " --prompt-ids '1,2;3' --ctx " + b + " --kv int8",
                 "--ctx " + b + " x batch 2" + needs(big, 2, DType::I8));
    expect_error("generate" + m + " --prompt-ids 1,2,3 --max-new-tokens " + b,
                 "the longest prompt (3 tokens) + --max-new-tokens " + b + " x batch 1" + needs(big + 3, 1, DType::F32));
    expect_error("bench" + m + " --prompt-len 5 --gen " + b + " --batch 1,2",
                 "--prompt-len 5 + --gen " + b + " x batch 2" + needs(big + 5, 2, DType::F32));
}

// A KV cache the allocator grants but the machine cannot back (under overcommit, anything up to
// RAM + swap and more) was zeroed at once and the OOM killer ended shardlm without a message. It
// is now weighed against what the machine can back first (MemAvailable + SwapFree, or
// SHARDLM_HOST_MEM_AVAILABLE as here) and refused in one line naming the flags and both figures.
TEST_F(Cli, KVCacheBeyondWhatTheMachineCanBack) {
    const ModelConfig c = tiny_config(Arch::Qwen2);
    auto bytes_of = [&](int64_t ctx, int64_t batch) { return kv_bytes(c, ctx, batch); };
    const size_t avail = bytes_of(100, 2);  // room for --ctx 100 x batch 2, no more
    ScopedEnv env(kHostMemEnv, std::to_string(avail).c_str());
    auto refused = [&](size_t bytes) {
        return ": the KV cache needs 0.000 GiB (" + std::to_string(bytes) + " bytes) but the machine can back only 0.000 GiB (" +
               std::to_string(avail) + " bytes, SHARDLM_HOST_MEM_AVAILABLE)";
    };
    const std::string m = " --model " + dir_.path();
    expect_error("generate" + m + " --prompt-ids '1,2;3' --ctx 101", "--ctx 101 x batch 2" + refused(bytes_of(101, 2)));
    expect_error("generate" + m + " --prompt-ids '1,2;3' --max-new-tokens 99",
                 "the longest prompt (2 tokens) + --max-new-tokens 99 x batch 2" + refused(bytes_of(101, 2)));
    expect_error("bench" + m + " --prompt-len 5 --gen 96 --batch 1,2 -r 1",
                 "--prompt-len 5 + --gen 96 x batch 2" + refused(bytes_of(101, 2)));
    const CommandResult ok = run_command(kBin + " generate" + m + " --prompt-ids '1,2;3' --ctx 100 --max-new-tokens 2");
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    {
        ScopedEnv bad(kHostMemEnv, "lots");
        expect_error("generate" + m + " --prompt-ids 1,2", "SHARDLM_HOST_MEM_AVAILABLE=\"lots\": expected a byte count");
    }
}

// Weights converted on load (--weights int8 from this bf16 checkpoint) are written into host
// buffers as they are allocated: more than the machine can back met the OOM killer during the
// load. They are weighed first (SHARDLM_HOST_MEM_AVAILABLE standing in for the machine's figure)
// and refused in one line naming the model folder, the flag and the bytes.
TEST_F(Cli, ConvertedWeightsBeyondWhatTheMachineCanBack) {
    const ModelConfig c = load_config(dir_.path());
    const Checkpoint ck(dir_.path());
    const size_t need = converted_weight_bytes(ck, c, LoadOptions{WeightFormat::Int8, 0, ""}, plan_shard(c, 0, 1));
    const std::string gen = "generate --model " + dir_.path() + " --prompt-ids 1,2 --max-new-tokens 2 --ctx 8 --weights int8";
    {
        ScopedEnv env(kHostMemEnv, std::to_string(need - 1).c_str());
        expect_error(gen, "model " + dir_.path() + ": --weights int8 needs 0.000 GiB (" + std::to_string(need) +
                              " bytes) of host memory for the weights converted on load but the machine can back only "
                              "0.000 GiB (" + std::to_string(need - 1) + " bytes, SHARDLM_HOST_MEM_AVAILABLE); use a "
                              "pre-quantized checkpoint (shardlm quantize writes one");
    }
    {
        // --no-mmap weighs the copies of the weights kept as stored, and names itself.
        ScopedEnv env(kHostMemEnv, "1");
        expect_error("generate --model " + dir_.path() + " --prompt-ids 1,2 --max-new-tokens 2 --ctx 8 --no-mmap",
                     "of host memory for the weights copied (--no-mmap) or converted on load but the machine can back "
                     "only 0.000 GiB (1 bytes, SHARDLM_HOST_MEM_AVAILABLE); drop --no-mmap");
    }
    ScopedEnv env(kHostMemEnv, std::to_string(need + kv_bytes(c, 8, 1)).c_str());  // the weights and the KV cache
    const CommandResult ok = run_command(kBin + " " + gen);
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

// --seed -1 was read as 2^64 - 1 without a word (boost's lexical_cast into uint64_t), in every
// command that takes a seed; a seed must be a decimal integer in [0, 2^64 - 1].
TEST_F(Cli, SeedMustBeANonNegative64BitInteger) {
    const std::string gen = "generate --model " + dir_.path() + " --prompt-ids 1,2 --max-new-tokens 2 --seed ";
    const std::string range = "--seed: expected an integer in [0, 18446744073709551615], got ";
    expect_error(gen + "-1", range + "\"-1\"");
    expect_error(gen + "18446744073709551616", range + "\"18446744073709551616\"");
    expect_error(gen + "1e3", range + "\"1e3\"");
    const CommandResult max = run_command(kBin + " " + gen + "18446744073709551615");
    EXPECT_EQ(max.exit_code, 0) << max.err;
    TempDir out;
    expect_error("make-model --preset tiny --out " + out.file("m") + " --seed -1", range + "\"-1\"");
    EXPECT_FALSE(file_exists(out.file("m/config.json")));
}

// --group-size and --keep-fp16 with --weights auto on a float checkpoint did nothing, exit 0 (and
// perplexity dropped them even before the loader saw them); on a pre-quantized checkpoint a
// --keep-fp16 other than the one it was quantized with was ignored the same way.
TEST_F(Cli, QuantizationFlagsNeedQuantizedWeights) {
    const std::string m = " --model " + dir_.path();
    const std::string needs = " needs quantized weights, but " + dir_.path() + " holds float weights";
    expect_error("generate" + m + " --prompt-ids 1,2 --group-size 32", "--group-size" + needs);
    expect_error("generate" + m + " --prompt-ids 1,2 --weights auto --keep-fp16 lm_head", "--keep-fp16" + needs);
    expect_error("bench" + m + " --prompt-len 4 --gen 2 -r 1 --group-size 32", "--group-size" + needs);
    write_file(dir_.file("ids.txt"), "1 2 3 4 5 6");
    expect_error("perplexity" + m + " --ids-file " + dir_.file("ids.txt") + " --group-size 32", "--group-size" + needs);
    // A quantizing --weights takes them, and so does the reference of a comparison run as stored.
    const CommandResult q = run_command(kBin + " perplexity" + m + " --ids-file " + dir_.file("ids.txt") +
                                        " --weights int8 --group-size 32 --compare-weights auto");
    EXPECT_EQ(q.exit_code, 0) << q.err;
    // A pre-quantized checkpoint takes its own --keep-fp16 and refuses another one.
    TempDir pre;
    const std::string out = pre.file("int8");
    const CommandResult w = run_command(kBin + " quantize" + m + " --out " + out + " --weights int8 --keep-fp16 lm_head");
    ASSERT_EQ(w.exit_code, 0) << w.err;
    const std::string gen = "generate --model " + out + " --prompt-ids 1,2 --max-new-tokens 2 --keep-fp16 ";
    const CommandResult same = run_command(kBin + " " + gen + "lm_head");
    EXPECT_EQ(same.exit_code, 0) << same.err;
    expect_error(gen + "mlp", "--keep-fp16 \"mlp\" differs from the pre-quantized checkpoint's \"lm_head\"");
}

TEST_F(Cli, BadInputGivesOneLineErrors) {
    const std::string m = " --model " + dir_.path();
    expect_error("generate --model /nonexistent/dir --prompt-ids 1", "/nonexistent/dir/config.json");
    expect_error("generate" + m + " --prompt-ids '1,2,99999'", "outside the vocabulary");
    expect_error("generate" + m + " --prompt-ids '1,2;;3'", "prompt 1 is empty");
    expect_error("generate" + m + " --prompt-ids ''", "empty");
    expect_error("generate" + m + " --prompt-ids 'a,b'", "--prompt-ids");
    expect_error("generate" + m + " --prompt-ids 1,2,3 --ctx 4 --max-new-tokens 8", "--ctx");
    expect_error("generate" + m + " --prompt hello", "tokenizer");
    expect_error("generate" + m + " --prompt-ids 1 --weights int3", "--weights");
    expect_error("generate" + m + " --prompt-ids 1 --kv int3", "--kv");
    expect_error("generate" + m + " --prompt-ids 1 --bogus-flag", "bogus-flag");
    expect_error("generate" + m + " --prompt-ids 1 --top-p 0", "--top-p");
    expect_error("generate" + m, "--prompt-ids");
    expect_error("generate" + m + " --prompt-ids 1 --max-new-tokens 0", "--max-new-tokens");
    // A stray word (an unquoted prompt's second word) is refused, not dropped.
    expect_error("generate" + m + " --prompt-ids 1 7", "unexpected argument \"7\"");
    expect_error("info" + m + " extra", "unexpected argument \"extra\"");
    // Tens of thousands of OpenMP threads crashed the process (SIGSEGV).
    expect_error("generate" + m + " --prompt-ids 1 --threads 100000", "--threads 100000 must be in [0, 1024]");
}

// Token penalties and min-p from the command line: a presence penalty over the whole context makes
// greedy decoding repeat no token (slide included: a window larger than --ctx is the context), the
// flags' bad values are one-line errors naming them, and under mpirun the tokens are one rank's.
TEST_F(Cli, PenaltyAndMinPFlags) {
    const std::string m = " --model " + dir_.path();
    const std::string gen = kBin + " generate" + m + " --prompt-ids 5,6,7 --max-new-tokens 20 --temperature 0 --json";
    for (const std::string extra : {" --presence-penalty 1000 --penalty-last-n -1",
                                    " --presence-penalty 1000 --penalty-last-n 500 --ctx 12 --context-overflow slide"}) {
        const CommandResult r = run_command(gen + extra);
        ASSERT_EQ(r.exit_code, 0) << extra << ": " << r.err;
        std::vector<int32_t> seen = {5, 6, 7};
        for (int32_t id : nlohmann::json::parse(r.out)["results"][0]["tokens"].get<std::vector<int32_t>>()) {
            EXPECT_EQ(std::find(seen.begin(), seen.end(), id), seen.end()) << extra << ": repeated " << id;
            seen.push_back(id);
        }
    }
    const CommandResult plain = run_command(gen);
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const CommandResult pen = run_command(gen + " --repetition-penalty 1.3 --frequency-penalty 0.5");
    ASSERT_EQ(pen.exit_code, 0) << pen.err;
    EXPECT_NE(nlohmann::json::parse(plain.out)["results"][0]["tokens"], nlohmann::json::parse(pen.out)["results"][0]["tokens"]);
    const std::string sampled = kBin + " generate" + m + " --max-new-tokens 20 --json --temperature 1.2 --top-k 0"
                                " --top-p 0.95 --min-p 0.05 --seed 3 --repetition-penalty 1.3 --frequency-penalty 0.5"
                                " --prompt-ids '5,6,7;9,9'";
    const CommandResult one = run_command(sampled);
    ASSERT_EQ(one.exit_code, 0) << one.err;
#ifdef SHARDLM_MPIEXEC
    const CommandResult two = run_command(std::string(SHARDLM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 " +
                                          sampled + " --threads 1");
    ASSERT_EQ(two.exit_code, 0) << two.err;
    EXPECT_EQ(nlohmann::json::parse(one.out)["results"], nlohmann::json::parse(two.out)["results"]);
#endif
    expect_error("generate" + m + " --prompt-ids 1 --min-p 1.5", "--min-p");
    expect_error("generate" + m + " --prompt-ids 1 --repetition-penalty 0", "--repetition-penalty");
    expect_error("generate" + m + " --prompt-ids 1 --presence-penalty inf", "--presence-penalty");
    expect_error("generate" + m + " --prompt-ids 1 --frequency-penalty nan", "--frequency-penalty");
    expect_error("generate" + m + " --prompt-ids 1 --penalty-last-n -2", "--penalty-last-n");
    expect_error("generate" + m + " --prompt-ids 1 --penalty-last-n x", "--penalty-last-n");
    expect_error("generate" + m + " --prompt-ids 1 --stop x", "--stop needs the model's tokenizer: " + dir_.path());
    expect_error("generate" + m + " --prompt-ids 1 --json-object", "--json-object needs the model's tokenizer: " + dir_.path());
    expect_error("generate" + m + " --prompt-ids 1 --stop ''", "--stop: a stop string must not be empty");
}

// --context-overflow slide: generation longer than --ctx goes on through context shifts (stderr
// counts them); bad values and sinks that leave nothing to slide over are one-line errors.
TEST_F(Cli, ContextOverflowSlides) {
    const std::string m = " --model " + dir_.path();
    const CommandResult r = run_command(kBin + " generate" + m +
                                        " --prompt-ids 5,6,7,8,9 --ctx 12 --max-new-tokens 30 --temperature 0"
                                        " --context-overflow slide --sink-tokens 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("context shifts"), std::string::npos) << r.err;
    EXPECT_NE(r.out.find("(length)"), std::string::npos) << r.out;  // 30 tokens in a context of 12
    expect_error("generate" + m + " --prompt-ids 1,2,3 --ctx 8 --max-new-tokens 9", "--context-overflow slide");
    expect_error("generate" + m + " --prompt-ids 1 --context-overflow wrap", "--context-overflow: unknown value");
    expect_error("generate" + m + " --prompt-ids 1,2 --ctx 8 --context-overflow slide --sink-tokens 7", "--sink-tokens 7");
    expect_error("generate" + m + " --prompt-ids 1,2,3,4,5 --ctx 4 --context-overflow slide", "the prompt must fit");
    // Sums that overflowed int64: a silent context shift without slide (it ran forever), an
    // internal check failure, and an auto-sized --ctx blamed for a --max-new-tokens that does not fit.
    const std::string huge = " 9223372036854775807";
    expect_error("generate" + m + " --prompt-ids 1,2 --ctx 10 --max-new-tokens" + huge, "it needs a context of");
    expect_error("generate" + m + " --prompt-ids 1,2 --ctx 10 --context-overflow slide --sink-tokens" + huge, "--sink-tokens");
    expect_error("generate" + m + " --prompt-ids 1,2 --max-new-tokens" + huge, "--max-new-tokens" + huge + " needs more than");
    expect_error("generate" + m + " --prompt-ids 1,2 --max-new-tokens 99999999", "max_position_embeddings");
}

// Without --ctx the context is the longest prompt + --max-new-tokens; --sink-tokens that left
// nothing of it to slide over was refused as "leave at least 2 of --ctx 5", a --ctx never given.
// The error names the flags the context came from; a --ctx given is still the one named.
TEST_F(Cli, SinkTokensBlameTheFlagsTheContextCameFrom) {
    const std::string m = "generate --model " + dir_.path() + " --prompt-ids 1,2 --context-overflow slide --sink-tokens 100";
    expect_error(m + " --max-new-tokens 3",
                 "--sink-tokens 100 must be >= 0 and leave at least 2 of the context of 5 positions (the longest prompt "
                 "(2 tokens) + --max-new-tokens 3) to slide over");
    EXPECT_EQ(run_command(kBin + " " + m + " --max-new-tokens 3").err.find("--ctx"), std::string::npos);
    expect_error(m + " --ctx 5", "--sink-tokens 100 must be >= 0 and leave at least 2 of --ctx 5 to slide over");
}

// generate checked --sink-tokens, the prompts against --ctx, the prompt ids against the vocabulary
// and --dump-logits only after the weights had loaded (seconds on a real model), or, for
// --dump-logits, after the whole run. They are checked on the flags and config.json alone now:
// with a checkpoint whose weights file is truncated, the flag error comes, not the file's.
TEST_F(Cli, FlagErrorsComeBeforeTheWeightsLoad) {
    const std::string weights = dir_.file("model.safetensors");
    write_file(weights, read_file(weights).substr(0, 64));
    const std::string g = "generate --model " + dir_.path(), m = g + " --prompt-ids 1,2";
    expect_error(m + " --ctx 8 --max-new-tokens 2", weights);  // a request without fault reaches the load, which fails
    expect_error(m + " --ctx 8 --context-overflow slide --sink-tokens 7",
                 "--sink-tokens 7 must be >= 0 and leave at least 2 of --ctx 8 to slide over");
    expect_error(m + " --context-overflow slide --sink-tokens 100 --max-new-tokens 3",
                 "--sink-tokens 100 must be >= 0 and leave at least 2 of the context of 5 positions");
    expect_error(m + " --ctx 8 --max-new-tokens 9", "prompt 0 has 2 tokens; with --max-new-tokens 9 it needs a context of 11");
    expect_error(g + " --prompt-ids '1;2,3,4,5,6,7,8,9,10' --ctx 8 --context-overflow slide",
                 "prompt 1 has 9 tokens but --ctx is 8");
    expect_error(g + " --prompt-ids '1;2,99999'", "--prompt-ids: prompt 1 has token id 99999 outside the vocabulary [0, 384)");
    expect_error(m + " --dump-logits " + dir_.file("no-such-folder/logits.json"), "--dump-logits: cannot write");
    expect_error(m + " --dump-logits " + dir_.path(), "--dump-logits: cannot write");
}

// perplexity checked the token ids against the vocabulary and that there are at least 2 only
// after the weights had loaded (seconds on a real model). They are checked on the tokens and
// config.json alone now: with a truncated weights file, the token file's error comes, not the
// weights file's (with a --compare-weights reference too, and for a --text-file).
TEST_F(Cli, PerplexityTokenErrorsComeBeforeTheWeightsLoad) {
    const std::string weights = dir_.file("model.safetensors");
    write_file(weights, read_file(weights).substr(0, 64));
    write_file(dir_.file("ids.txt"), "5 6 7 8\n");
    write_file(dir_.file("one.txt"), "5\n");
    write_file(dir_.file("big.txt"), "5 6 99999 7\n");
    const std::string p = "perplexity --model " + dir_.path() + " --ctx 8 --ids-file ";
    expect_error(p + dir_.file("ids.txt"), weights);  // tokens without fault reach the load, which fails
    expect_error(p + dir_.file("one.txt"), dir_.file("one.txt") + ": needs at least 2 tokens, got 1");
    expect_error(p + "/dev/null", "/dev/null: needs at least 2 tokens, got 0");
    expect_error(p + dir_.file("big.txt"), dir_.file("big.txt") + ": token id 99999 outside the vocabulary [0, 384)");
    expect_error(p + dir_.file("big.txt") + " --compare-weights fp32", "token id 99999 outside the vocabulary");
    // Text: the shipped model's tokenizer and config, its weights truncated; "a" is one token.
    TempDir kjv;
    for (const std::string f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
        write_file(kjv.file(f), read_file(SHARDLM_SOURCE_DIR "/launch/models/kjv-small/" + f));
    write_file(kjv.file("model.safetensors"), read_file(weights));
    write_file(dir_.file("a.txt"), "a");
    expect_error("perplexity --model " + kjv.path() + " --text-file " + dir_.file("a.txt"),
                 dir_.file("a.txt") + ": needs at least 2 tokens, got 1");
}

// make-model into a folder that holds a checkpoint overwrote it with random weights, exit 0.
TEST_F(Cli, MakeModelRefusesToOverwriteACheckpoint) {
    const std::string cfg = read_file(dir_.file("config.json"));
    expect_error("make-model --preset tiny --out " + dir_.path(), "already holds a checkpoint (config.json)");
    EXPECT_EQ(read_file(dir_.file("config.json")), cfg);
}

// make-model --shards 100000 wrote 100,000 files, nearly all without a tensor, exit 0. A checkpoint
// spreads over at most one file per layer plus one (the tiny preset: 4 layers, 5 files).
TEST(CliBasics, MakeModelShardsAreBoundedByTheLayers) {
    TempDir d;
    expect_error("make-model --preset tiny --out " + d.file("m") + " --shards 100000",
                 "--shards 100000 must be in [1, 5] for --preset tiny");
    expect_error("make-model --preset tiny --out " + d.file("m") + " --shards 6", "--shards 6 must be in [1, 5]");
    EXPECT_FALSE(file_exists(d.file("m/config.json")));
    const CommandResult r = run_command(kBin + " make-model --preset tiny --out " + d.file("m") + " --shards 5");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    Checkpoint ck(d.file("m"));
    EXPECT_EQ(ck.file_count(), 5u);
    for (int i = 1; i <= 5; ++i)  // every file holds at least one tensor
        EXPECT_GT(SafetensorsFile(d.file("m/model-0000" + std::to_string(i) + "-of-00005.safetensors")).tensors().size(), 0u) << i;
}

// make-model --lora-rank writes a random PEFT adapter for a preset's or a checkpoint's shape,
// which --lora merges (changing the model) and bench --adapter runs beside the weights; their
// misuse is refused by name.
TEST_F(Cli, MakeModelWritesRandomAdapters) {
    TempDir d;
    const CommandResult w = run_command(kBin + " make-model --model " + dir_.path() + " --lora-rank 4 --out " + d.file("a"));
    ASSERT_EQ(w.exit_code, 0) << w.err;
    EXPECT_NE(w.err.find("wrote a random rank-4 LoRA adapter"), std::string::npos) << w.err;
    const std::string gen = kBin + " generate --model " + dir_.path() + " --prompt-ids 5,6,7,8 --max-new-tokens 3 --temperature 0 --json --logprobs 0";
    const CommandResult plain = run_command(gen), merged = run_command(gen + " --lora " + d.file("a"));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    ASSERT_EQ(merged.exit_code, 0) << merged.err;
    EXPECT_NE(nlohmann::json::parse(merged.out)["results"][0]["logprobs"], nlohmann::json::parse(plain.out)["results"][0]["logprobs"]);
    const CommandResult b = run_command(kBin + " bench --model " + dir_.path() + " --prompt-len 8 --gen 2 -r 1 --json --adapter " + d.file("a"));
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_NE(b.out.find("\"weights\":\"auto+lora r4\""), std::string::npos) << b.out;
    ASSERT_EQ(run_command(kBin + " make-model --preset tiny --lora-rank 2 --out " + d.file("t")).exit_code, 0);
    EXPECT_EQ(run_command(gen + " --lora " + d.file("t")).exit_code, 1);  // the tiny preset's shape is not this model's
    expect_error("make-model --preset tiny --lora-rank 0 --out " + d.file("x"), "--lora-rank must be in [1, 4096]");
    expect_error("make-model --model " + dir_.path() + " --out " + d.file("x"), "--model names the base of an adapter: it needs --lora-rank");
    expect_error("make-model --model " + dir_.path() + " --preset tiny --lora-rank 2 --out " + d.file("x"), "--model and --preset exclude each other");
    expect_error("make-model --preset tiny --lora-rank 2 --out " + d.file("a"), "already holds an adapter (adapter_config.json)");
    expect_error("make-model --preset tiny --lora-rank 2 --shards 2 --out " + d.file("x"), "--shards applies to checkpoints");
    expect_error("bench --model " + dir_.path() + " --requests 2 --adapter " + d.file("a"), "--adapter times ppL/tgN rows");
}

// quantize --out equal to --model rewrote the source checkpoint in place, exit 0.
// --lora merges a PEFT adapter as the model loads: scale 0 is the base model exactly, scale 1
// changes it, and `quantize --lora` writes what `generate --lora` runs (same tokens and logprobs).
// The flags' misuse is refused by name.
TEST_F(Cli, LoraAdapters) {
    const ModelConfig c = tiny_config(Arch::Qwen2);
    TempDir ad, q;
    write_lora_adapter(ad.path(),
                       R"({"peft_type": "LORA", "r": 2, "lora_alpha": 16, "bias": "none", "target_modules": ["q_proj", "down_proj"]})",
                       {random_lora_module(c, "model.layers.0.self_attn.q_proj", 2, 1),
                        random_lora_module(c, "model.layers.1.mlp.down_proj", 2, 2)});
    const std::string gen = kBin + " generate --model " + dir_.path() +
                            " --prompt-ids 5,6,7,8 --max-new-tokens 6 --temperature 0 --json --logprobs 0";
    auto results = [](const CommandResult& r) {
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return nlohmann::json::parse(r.out)["results"];
    };
    const auto plain = results(run_command(gen)), zero = results(run_command(gen + " --lora " + ad.path() + " --lora-scale 0"));
    const auto one = results(run_command(gen + " --lora " + ad.path()));
    EXPECT_EQ(zero, plain);
    EXPECT_NE(one[0]["logprobs"], plain[0]["logprobs"]);
    const CommandResult w =
        run_command(kBin + " quantize --model " + dir_.path() + " --out " + q.file("m") + " --weights int8 --lora " + ad.path());
    ASSERT_EQ(w.exit_code, 0) << w.err;
    const std::string gq = kBin + " generate --model " + q.file("m") + " --prompt-ids 5,6,7,8 --max-new-tokens 6 --temperature 0 --json --logprobs 0";
    EXPECT_EQ(results(run_command(gq)), results(run_command(gen + " --weights int8 --lora " + ad.path())));
    // --prompt-cache keys the adapter by its contents: after it changes, the file is not used.
    std::string ids;
    for (int i = 1; i <= 20; ++i) ids += (i > 1 ? "," : "") + std::to_string(i);
    const std::string cached = kBin + " generate --model " + dir_.path() + " --prompt-ids " + ids +
                               " --max-new-tokens 4 --temperature 0 --json --lora " + ad.path() + " --prompt-cache " + q.file("p.kv");
    results(run_command(cached));
    EXPECT_EQ(results(run_command(cached))[0]["cached_tokens"], 19);
    write_lora_adapter(ad.path(),
                       R"({"peft_type": "LORA", "r": 2, "lora_alpha": 16, "bias": "none", "target_modules": ["q_proj", "down_proj"]})",
                       {random_lora_module(c, "model.layers.0.self_attn.q_proj", 2, 3),
                        random_lora_module(c, "model.layers.1.mlp.down_proj", 2, 4)});
    const CommandResult changed = run_command(cached);
    EXPECT_NE(changed.err.find("not used: lora is " + ad.path() + " x 1.000000 "), std::string::npos) << changed.err;
    EXPECT_EQ(results(changed)[0]["cached_tokens"], 0);
    const std::string bad = "generate --model " + dir_.path() + " --prompt-ids 5 ";
    expect_error(bad + "--lora " + ad.path() + " --lora-scale 1 --lora-scale 2", "--lora-scale: 2 scales for 1 --lora adapters");
    expect_error(bad + "--lora-scale 0.5", "--lora-scale needs a --lora adapter");
    expect_error(bad + "--lora " + ad.file("missing"), "not a folder");
    expect_error(bad + "--lora " + dir_.path(), "no adapter_config.json");
    expect_error("generate --model " + q.file("m") + " --prompt-ids 5 --lora " + ad.path(), "is pre-quantized (shardlm)");
}

// --draft-model: the tokens of generate without speculation (greedy and seeded), fewer steps
// with the model drafting for itself, the draft's time reported; its misuse refused by name.
TEST_F(Cli, DraftModel) {
    const std::string gen = kBin + " generate --model " + dir_.path() + " --prompt-ids '5,6,7,8;9,10' --max-new-tokens 12 --json";
    for (const std::string sampling : {" --temperature 0", " --temperature 0.8 --seed 9"}) {
        const CommandResult plain = run_command(gen + sampling), spec = run_command(gen + sampling + " --speculate 3 --draft-model " + dir_.path());
        ASSERT_EQ(plain.exit_code, 0) << plain.err;
        ASSERT_EQ(spec.exit_code, 0) << spec.err;
        const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(spec.out);
        for (size_t i = 0; i < 2; ++i) EXPECT_EQ(b["results"][i]["tokens"], a["results"][i]["tokens"]) << sampling << " " << i;
        EXPECT_GT(b["timings"]["draft_tokens"].get<int64_t>(), 0);
        EXPECT_GT(b["timings"]["draft_ms"].get<double>(), 0.0);
        if (sampling == " --temperature 0") {
            EXPECT_LT(b["timings"]["decode_steps"].get<int64_t>(), a["timings"]["decode_steps"].get<int64_t>());
        }
    }
    TempDir other;
    ModelConfig c = tiny_config(Arch::Qwen2);
    c.vocab = 1024;
    write_synthetic_checkpoint(other.path(), c, {DType::BF16, 1, 5});
    const std::string bad = "generate --model " + dir_.path() + " --prompt-ids 5 ";
    expect_error(bad + "--draft-model " + dir_.path(), "--draft-model needs --speculate N");
    expect_error(bad + "--draft-p-min 0.5", "--draft-p-min needs --draft-model");
    expect_error(bad + "--speculate 2 --draft-model " + dir_.path() + " --draft-p-min 1.5", "--draft-p-min must be in [0, 1]");
    expect_error(bad + "--speculate 2 --draft-model " + other.path(), "vocab_size 1024 against the target's 384");
    expect_error(bad + "--speculate 2 --draft-model " + other.file("none"), "config.json");
    expect_error(bad + "--speculate 2 --ctx 100000 --draft-model " + dir_.path(), "max_position_embeddings");
    // Tokenizers that spell an id differently: the shipped model against a copy with one token renamed.
    const std::string kjv = SHARDLM_SOURCE_DIR "/launch/models/kjv-small";
    TempDir renamed;
    for (const char* f : {"config.json", "tokenizer_config.json"}) write_file(renamed.file(f), read_file(kjv + "/" + f));
    ASSERT_EQ(std::system(("ln -s '" + kjv + "/model.safetensors' '" + renamed.file("model.safetensors") + "'").c_str()), 0);
    nlohmann::json tj = nlohmann::json::parse(read_file(kjv + "/tokenizer.json"));
    nlohmann::json& vocab = tj["model"]["vocab"];
    const std::string old_name = vocab.begin().key();
    const int64_t id = vocab.begin().value();
    vocab.erase(vocab.begin());
    vocab["renamed-token"] = id;
    write_file(renamed.file("tokenizer.json"), tj.dump());
    expect_error("generate --model " + kjv + " --prompt-ids 5 --speculate 2 --draft-model " + renamed.path(),
                 "token " + std::to_string(id) + " is \"renamed-token\" there and \"" + old_name + "\" in " + kjv);
    const CommandResult same = run_command(kBin + " generate --model " + kjv + " --prompt-ids 5,6 --max-new-tokens 4 --speculate 2 --draft-model " + kjv);
    EXPECT_EQ(same.exit_code, 0) << same.err;
}

TEST_F(Cli, QuantizeRefusesToOverwriteItsSource) {
    const std::string st = read_file(dir_.file("model.safetensors"));
    expect_error("quantize --model " + dir_.path() + " --out " + dir_.path() + " --weights int8", "already holds a checkpoint");
    expect_error("quantize --model " + dir_.path() + " --out " + dir_.path() + "/. --weights int8", "already holds a checkpoint");
    EXPECT_EQ(read_file(dir_.file("model.safetensors")), st);
}

// quantize loaded (and quantized) the whole model before it refused an --out that holds a
// checkpoint; with --calib it ran the AWQ calibration's load and forward pass (minutes on a real
// model) before that, before checking the calibration ids against the vocabulary, and before
// compiling --keep-fp16 (whose error then did not name the flag). All come before any load now:
// with a truncated weights file, the flag's error comes, not the file's.
TEST_F(Cli, QuantizeFlagErrorsComeBeforeTheWeightsLoad) {
    const std::string kjv = SHARDLM_SOURCE_DIR "/launch/models/kjv-small/";
    TempDir m;  // the shipped model's config and tokenizer (for --calib), its weights truncated
    for (const std::string f : {"config.json", "tokenizer.json", "tokenizer_config.json"}) write_file(m.file(f), read_file(kjv + f));
    const std::string weights = m.file("model.safetensors");
    write_file(weights, read_file(kjv + "model.safetensors").substr(0, 64));
    write_file(dir_.file("calib.txt"), "In the beginning God created the heaven and the earth.\n");
    const std::string q = "quantize --model " + m.path() + " --weights int4 --out ", calib = " --calib " + dir_.file("calib.txt");
    expect_error(q + dir_.file("q") + calib, weights);  // flags without fault reach the load, which fails
    expect_error(q + m.path(), m.path() + ": already holds a checkpoint; choose an empty folder");
    expect_error(q + m.path() + calib, m.path() + ": already holds a checkpoint; choose an empty folder");
    expect_error(q + dir_.file("q") + calib + " --keep-fp16 '('", "--keep-fp16: invalid regex \"(\"");
    auto cfg = nlohmann::json::parse(read_file(m.file("config.json")));
    cfg["vocab_size"] = 64;  // fewer than the tokenizer's ids
    write_file(m.file("config.json"), cfg.dump());
    expect_error(q + dir_.file("q") + calib, "outside the vocabulary [0, 64)");
    EXPECT_FALSE(file_exists(dir_.file("q/config.json")));
}

// quantize --out DIR that cannot be created (its parent missing, or a file) or written into was
// found only by the mkdir after the whole model had loaded and been quantized (minutes on a real
// model), or, for a file, by the first shard's write. It is refused before the load now, with
// nothing created: with a truncated weights file, the --out error comes, not the file's.
TEST_F(Cli, QuantizeOutThatCannotBeWrittenComesBeforeTheWeightsLoad) {
    const std::string weights = dir_.file("model.safetensors");
    write_file(weights, read_file(weights).substr(0, 64));
    TempDir t;
    write_file(t.file("plain"), "not a folder");
    const std::string q = "quantize --model " + dir_.path() + " --weights int8 --out ";
    expect_error(q + t.file("q"), weights);  // an --out that can be made reaches the load, which fails
    expect_error(q + t.file("no-such/q"),
                 "--out " + t.file("no-such/q") + ": cannot create or write this folder: No such file or directory");
    expect_error(q + t.file("plain"), "--out " + t.file("plain") + ": cannot create or write this folder: Not a directory");
    expect_error(q + t.file("plain/q"), "--out " + t.file("plain/q") + ": cannot create or write this folder: Not a directory");
    EXPECT_FALSE(file_exists(t.file("q/config.json")));
    EXPECT_EQ(run_command("test -e " + t.file("q") + " || test -e " + t.file("no-such")).exit_code, 1) << "created";
    EXPECT_EQ(read_file(t.file("plain")), "not a folder");
}

TEST_F(Cli, BrokenCheckpointsAreNamed) {
    const std::string m = " --model " + dir_.path() + " --prompt-ids 1,2";
    const std::string cfg = read_file(dir_.file("config.json"));
    write_file(dir_.file("config.json"), "{\"architectures\": [");
    expect_error("generate" + m, "config.json: malformed JSON");
    write_file(dir_.file("config.json"), "{\"architectures\": [\"BertModel\"]}");
    expect_error("generate" + m, "unknown architecture \"BertModel\"");
    write_file(dir_.file("config.json"), cfg);
    const std::string st = read_file(dir_.file("model.safetensors"));
    write_file(dir_.file("model.safetensors"), st.substr(0, st.size() / 2));
    expect_error("generate" + m, "model.safetensors: tensor");
    write_file(dir_.file("model.safetensors"), st.substr(0, 100));
    expect_error("generate" + m, "larger than the file");
}

// shardlm classify: a classifier checkpoint whose score rows are two tokens' lm_head rows gives
// what --classifier-tokens gives on the causal LM; --query scores the pair (query, text) as the
// tokenizer's pair template joins them; two ranks give one rank's numbers; and the flags' errors.
TEST_F(Cli, Classify) {
    const std::string kjv = SHARDLM_SOURCE_DIR "/launch/models/kjv-small";
    TempDir m, c;
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) write_file(m.file(f), read_file(kjv + "/" + f));
    const CommandResult tk = run_command(kBin + " tokenize --model " + m.path() + " --json --text ' the and'");
    ASSERT_EQ(tk.exit_code, 0) << tk.err;
    const std::vector<int32_t> two = nlohmann::json::parse(tk.out)["ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(two.size(), 2u);  // " the", " and"
    write_classifier(m.path(), c.path(), {"the", "and"}, checkpoint_rows(m.path(), "model.embed_tokens.weight", two));
    auto run = [&](const std::string& cmd) {
        const CommandResult r = run_command(cmd);
        EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
        return nlohmann::json::parse(r.out.empty() ? "{}" : r.out);
    };
    const std::string texts = " --prompt 'In the beginning' --prompt 'And God said, Let there be light' --json";
    const auto by_tokens = run(kBin + " classify --model " + m.path() + " --classifier-tokens 'Ġthe,Ġand'" + texts);
    const auto by_score = run(kBin + " classify --model " + c.path() + texts);
    ASSERT_EQ(by_score["data"].size(), 2u);
    EXPECT_EQ(by_score["labels"], nlohmann::json({"the", "and"}));
    EXPECT_EQ(by_tokens["labels"], nlohmann::json({"Ġthe", "Ġand"}));
    for (size_t i = 0; i < 2; ++i) {
        const auto a = by_tokens["data"][i]["logits"].get<std::vector<float>>(), b = by_score["data"][i]["logits"].get<std::vector<float>>();
        EXPECT_LT(max_abs_diff(a, b), 1e-3) << i;
        const auto p = by_score["data"][i]["probs"].get<std::vector<float>>();
        EXPECT_NEAR(p[0] + p[1], 1.0, 1e-5);
        EXPECT_EQ(by_score["data"][i]["label"], p[0] >= p[1] ? "the" : "and");
    }
    // --query: the pair's ids (ByteLevel: query then text) give the same score.
    const auto pair = run(kBin + " classify --model " + c.path() + " --query 'Who made light?' --prompt 'And God said' --json");
    std::string list;
    for (const char* t : {"Who made light?", "And God said"}) {
        const CommandResult r = run_command(kBin + " tokenize --model " + m.path() + " --json --text '" + t + "'");
        const nlohmann::json j = nlohmann::json::parse(r.out);
        for (const auto& id : j["ids"]) list += (list.empty() ? "" : ",") + std::to_string(id.get<int>());
    }
    const auto by_ids = run(kBin + " classify --model " + c.path() + " --prompt-ids " + list + " --json");
    ASSERT_EQ(pair["data"].size(), 1u);
    EXPECT_EQ(pair["data"][0]["tokens"], by_ids["data"][0]["tokens"]);
    EXPECT_LT(max_abs_diff(pair["data"][0]["logits"].get<std::vector<float>>(), by_ids["data"][0]["logits"].get<std::vector<float>>()), 1e-6);
    const float score = pair["data"][0]["score"];
    EXPECT_NEAR(score, by_ids["data"][0]["probs"][1].get<float>(), 1e-6);
    const CommandResult plain = run_command(kBin + " classify --model " + c.path() + " --query 'Who made light?' --prompt 'And God said'");
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_NEAR(std::stod(plain.out), score, 1e-6) << plain.out;
    // A quantized classifier keeps its head (score.weight stays F32).
    const CommandResult q = run_command(kBin + " quantize --model " + c.path() + " --out " + c.file("q8") + " --weights int8");
    ASSERT_EQ(q.exit_code, 0) << q.err;
    const auto q8 = run(kBin + " classify --model " + c.file("q8") + texts);
    ASSERT_EQ(q8["data"].size(), 2u);
    EXPECT_LT(max_abs_diff(q8["data"][0]["logits"].get<std::vector<float>>(), by_score["data"][0]["logits"].get<std::vector<float>>()), 0.1);
#ifdef SHARDLM_MPIEXEC
    const auto ranks = run(std::string(SHARDLM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 " + kBin +
                           " classify --model " + c.path() + texts + " --tp 2");
    ASSERT_EQ(ranks["data"].size(), 2u);
    for (size_t i = 0; i < 2; ++i)
        EXPECT_LT(max_abs_diff(ranks["data"][i]["logits"].get<std::vector<float>>(), by_score["data"][i]["logits"].get<std::vector<float>>()), 1e-4);
#endif
    // --rerank-template: the pair filled into the text, scored as that text alone.
    const auto templated = run(kBin + " classify --model " + c.path() +
                               " --query 'Who made light?' --prompt 'And God said' --json --rerank-template 'Q: {query} D: {document}'");
    const auto filled = run(kBin + " classify --model " + c.path() + " --prompt 'Q: Who made light? D: And God said' --json");
    ASSERT_EQ(templated["data"].size(), 1u);
    EXPECT_EQ(templated["data"][0]["tokens"], filled["data"][0]["tokens"]);
    EXPECT_NEAR(templated["data"][0]["score"].get<double>(), filled["data"][0]["probs"][1].get<double>(), 1e-6);
    expect_cli_error("classify --model " + c.path() + " --query q --prompt x --rerank-template '{query}'",
                     "--rerank-template: the template must hold {document} once");
    expect_cli_error("classify --model " + c.path() + " --prompt x --rerank-template '{query}{document}'",
                     "--rerank-template applies to --query");
    const CommandResult info = run_command(kBin + " info --model " + c.path());
    ASSERT_EQ(info.exit_code, 0) << info.err;
    EXPECT_NE(info.out.find("architecture      LlamaForSequenceClassification (labels: the, and)"), std::string::npos) << info.out;
    expect_cli_error("classify --model " + m.path() + " --prompt x", "has no classification head");
    expect_cli_error("classify --model " + m.path() + " --prompt x --classifier-tokens 'Ġthe,zzzq'", "--classifier-tokens: \"zzzq\" is not a token");
    expect_cli_error("classify --model " + m.path() + " --prompt x --classifier-tokens and", "name at least two tokens");
    expect_cli_error("classify --model " + c.path() + " --prompt x --classifier-tokens 'Ġthe,Ġand'", "no lm_head to read token logits from");
    expect_cli_error("classify --model " + c.path() + " --prompt-ids 1 --query x", "--query pairs with text inputs");
    expect_cli_error("classify --model " + c.path(), "an input is required");
    expect_cli_error("generate --model " + c.path() + " --prompt x", "LlamaForSequenceClassification is a sequence-classification model");
    TempDir three;
    write_classifier(m.path(), three.path(), {"a", "b", "c"}, checkpoint_rows(m.path(), "model.embed_tokens.weight", {1, 2, 3}));
    expect_cli_error("classify --model " + three.path() + " --query q --prompt x", "has 3 labels: a relevance score needs");
}

// shardlm embed: --prompt-name puts the folder's named prompt before each text (the same vectors as
// the prefixed text's ids), plain output is one vector per line, quantize keeps the pooling
// module, two ranks give one rank's vectors; and the flags' errors.
TEST_F(Cli, Embed) {
    const std::string kjv = SHARDLM_SOURCE_DIR "/launch/models/kjv-small";
    TempDir m;
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
        write_file(m.file(f), read_file(kjv + "/" + f));
    std::filesystem::create_directories(m.file("pool"));
    write_file(m.file("modules.json"), R"([{"type":"sentence_transformers.models.Transformer","path":""},
                                           {"type":"sentence_transformers.models.Pooling","path":"pool"}])");
    write_file(m.file("pool/config.json"), R"({"pooling_mode_cls_token":false,"pooling_mode_mean_tokens":true})");
    write_file(m.file("config_sentence_transformers.json"), R"({"prompts":{"query":"Query: ","passage":""}})");
    auto vectors = [&](const std::string& cmd) {
        const CommandResult r = run_command(cmd);
        EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
        std::vector<std::vector<float>> v;
        const nlohmann::json out = nlohmann::json::parse(r.out.empty() ? "{}" : r.out);
        EXPECT_EQ(out.value("pooling", ""), "mean") << r.out;
        EXPECT_EQ(out.value("normalized", true), false) << r.out;  // no Normalize module
        if (out.contains("data"))
            for (const auto& d : out["data"]) v.push_back(d["embedding"].get<std::vector<float>>());
        return v;
    };
    const std::string e = kBin + " embed --json --model " + m.path();
    const auto named = vectors(e + " --prompt-name query --prompt Behold --prompt 'And God said'");
    const CommandResult ids = run_command(kBin + " tokenize --model " + m.path() + " --json --text 'Query: Behold'");
    ASSERT_EQ(ids.exit_code, 0) << ids.err;
    std::string list;
    const nlohmann::json tokenized = nlohmann::json::parse(ids.out);
    for (const auto& id : tokenized["ids"]) list += (list.empty() ? "" : ",") + std::to_string(id.get<int>());
    const auto by_ids = vectors(e + " --prompt-ids " + list);
    ASSERT_EQ(named.size(), 2u);
    ASSERT_EQ(by_ids.size(), 1u);
    EXPECT_LT(max_abs_diff(named[0], by_ids[0]), 1e-5);
    EXPECT_GT(max_abs_diff(named[0], vectors(e + " --prompt Behold")[0]), 1e-3);  // the prompt mattered

    // Plain output: the vectors, one per line.
    const CommandResult plain = run_command(kBin + " embed --model " + m.path() + " --prompt-ids '5,6;7' --dimensions 3");
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    std::istringstream lines(plain.out);
    std::vector<std::vector<float>> rows;
    for (std::string line; std::getline(lines, line);) {
        std::istringstream in(line);
        rows.emplace_back();
        for (float x; in >> x;) rows.back().push_back(x);
    }
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_LT(max_abs_diff(rows[0], vectors(e + " --prompt-ids 5,6 --dimensions 3")[0]), 1e-6);

    // A quantized copy keeps the folder's pooling (the json checks say mean, not normalized).
    const CommandResult q = run_command(kBin + " quantize --model " + m.path() + " --out " + m.file("q8") + " --weights int8");
    ASSERT_EQ(q.exit_code, 0) << q.err;
    const auto q8 = vectors(kBin + " embed --json --model " + m.file("q8") + " --prompt-ids 5,6");
    ASSERT_EQ(q8.size(), 1u);
    EXPECT_LT(max_abs_diff(q8[0], vectors(e + " --prompt-ids 5,6")[0]), 0.05);
#ifdef SHARDLM_MPIEXEC
    const auto two = vectors(std::string(SHARDLM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 " +
                             kBin + " embed --json --model " + m.path() + " --prompt-name query --prompt Behold --prompt "
                             "'And God said' --tp 2");
    ASSERT_EQ(two.size(), 2u);
    for (size_t i = 0; i < 2; ++i) EXPECT_LT(max_abs_diff(two[i], named[i]), 1e-4) << i;
#endif

    const std::string b = "embed --model " + m.path();
    expect_cli_error(b, "an input is required");
    expect_cli_error(b + " --prompt x --prompt-ids 1", "exclude each other");
    expect_cli_error(b + " --prompt x --prompt-name doc", "--prompt-name \"doc\": " + m.path() +
                                                              "/config_sentence_transformers.json has the prompts passage, query");
    expect_cli_error(b + " --prompt-ids 1 --prompt-name query", "--prompt-name applies to text inputs");
    expect_cli_error(b + " --prompt x --normalize --no-normalize", "--normalize and --no-normalize exclude each other");
    expect_cli_error(b + " --prompt x --pooling max", "--pooling \"max\" is not one of last, mean, cls");
    expect_cli_error(b + " --prompt x --dimensions 9999", "--dimensions 9999 exceeds the model's hidden size");
    expect_cli_error(b + " --prompt-ids '1,2,3;4' --ctx 2", "input 0 has 3 tokens, more than the context of 2");
    expect_cli_error("embed --model " + dir_.path() + " --prompt x", "text inputs need the model's tokenizer");
    write_file(m.file("pool/config.json"), R"({"pooling_mode_max_tokens":true})");
    expect_cli_error(b + " --prompt x", "pool/config.json: pooling_mode_max_tokens is not supported");
    // An untied checkpoint without lm_head.weight: embed runs it, generate refuses the missing tensor.
    TempDir full, bare;
    write_synthetic_checkpoint(full.path(), tiny_config(Arch::Llama), {DType::F32, 1, 9});
    write_without_model_prefix(full.path(), bare.path());
    const CommandResult a = run_command(kBin + " embed --json --model " + full.path() + " --prompt-ids '5,6,7;8'");
    const CommandResult h = run_command(kBin + " embed --json --model " + bare.path() + " --prompt-ids '5,6,7;8'");
    ASSERT_EQ(h.exit_code, 0) << h.err;
    EXPECT_EQ(nlohmann::json::parse(a.out)["data"], nlohmann::json::parse(h.out)["data"]);
    expect_cli_error("generate --model " + bare.path() + " --prompt-ids 5,6", "missing tensor lm_head.weight");
}

#ifdef SHARDLM_MPIEXEC
// The binary under mpirun: same tokens as one rank, and a failing rank ends the whole job fast.
namespace {
std::string mpirun(int np, const std::string& env = "") {
    return std::string(SHARDLM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " + std::to_string(np) +
           " -x OMP_NUM_THREADS=1 " + env + " " + kBin;
}
}  // namespace

TEST_F(Cli, MpirunGivesTheSameTokens) {
    const std::string args = " generate --model " + dir_.path() + " --prompt-ids '5,6,7;9' --max-new-tokens 6 --temperature 0 --json";
    const CommandResult one = run_command(kBin + args);
    const CommandResult two = run_command(mpirun(2) + args + " --tp 2");
    ASSERT_EQ(one.exit_code, 0) << one.err;
    ASSERT_EQ(two.exit_code, 0) << two.err;
    const auto a = nlohmann::json::parse(one.out), b = nlohmann::json::parse(two.out);  // rank 0 alone prints
    EXPECT_EQ(a["results"], b["results"]);
    EXPECT_EQ(b["tp"], 2);
    EXPECT_LT(b["memory"]["weights_bytes"].get<double>(), 0.6 * a["memory"]["weights_bytes"].get<double>());
}

// --prompt-cache under mpirun: each rank keeps its own heads' file, the second run loads what one
// rank would, and a file made by two ranks is not one rank's.
TEST_F(Cli, MpirunPromptCacheKeepsAFilePerRank) {
    std::string a;
    for (int i = 1; i <= 20; ++i) a += (i > 1 ? "," : "") + std::to_string(i);
    const std::string file = dir_.file("tp.kv");
    const std::string args = " generate --model " + dir_.path() + " --prompt-ids '" + a +
                             "' --max-new-tokens 4 --temperature 0 --kv int8 --json --prompt-cache " + file;
    const CommandResult first = run_command(mpirun(2) + args), second = run_command(mpirun(2) + args);
    ASSERT_EQ(first.exit_code, 0) << first.err;
    ASSERT_EQ(second.exit_code, 0) << second.err;
    EXPECT_TRUE(std::filesystem::exists(file + ".rank1"));
    const auto x = nlohmann::json::parse(first.out)["results"][0], y = nlohmann::json::parse(second.out)["results"][0];
    EXPECT_EQ(x["cached_tokens"], 0);
    EXPECT_EQ(y["cached_tokens"], 19);
    EXPECT_EQ(y["tokens"], x["tokens"]);
    // Rank 1's file gone: neither rank uses its file (their choices must agree).
    std::filesystem::remove(file + ".rank1");
    const CommandResult lost = run_command(mpirun(2) + args);
    ASSERT_EQ(lost.exit_code, 0) << lost.err;
    EXPECT_NE(lost.err.find("rank 1's file (" + file + ".rank1) does not hold what rank 0's does"), std::string::npos) << lost.err;
    EXPECT_EQ(nlohmann::json::parse(lost.out)["results"][0]["cached_tokens"], 0);
    const CommandResult one = run_command(kBin + args);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    EXPECT_NE(one.err.find("not used: ranks is 2 there, 1 here"), std::string::npos) << one.err;
    EXPECT_EQ(nlohmann::json::parse(one.out)["results"][0]["tokens"], x["tokens"]);
}

// Without the abort the healthy rank would wait in its next collective for good (the test's CTest
// timeout). The bound is far above a normal end (1-2 s) so that mpirun's start on a loaded 2-core
// CI machine does not trip it: one run of 10 s was seen under a parallel ctest.
TEST_F(Cli, FailingRankEndsTheJob) {
    for (const char* phase : {"load", "forward"}) {
        const auto t0 = std::chrono::steady_clock::now();
        const CommandResult r = run_command(mpirun(2, std::string("-x SHARDLM_FAIL_RANK=1 -x SHARDLM_FAIL_PHASE=") + phase) +
                                            " generate --model " + dir_.path() + " --prompt-ids 1,2,3 --max-new-tokens 4");
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_NE(r.exit_code, 0) << phase;
        EXPECT_LT(s, 45.0) << phase;
        EXPECT_NE(r.err.find("shardlm: error: rank 1: injected failure at phase " + std::string(phase)), std::string::npos)
            << r.err;
    }
}

TEST_F(Cli, MpirunBadTensorParallelSize) {
    const CommandResult r = run_command(mpirun(3) + " generate --model " + dir_.path() + " --prompt-ids 1,2");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("does not divide the 4 attention heads"), std::string::npos) << r.err;
    const CommandResult t = run_command(mpirun(2) + " generate --model " + dir_.path() + " --prompt-ids 1,2 --tp 4");
    EXPECT_NE(t.exit_code, 0);
    EXPECT_NE(t.err.find("--tp 4 differs from the 2 ranks"), std::string::npos) << t.err;
}

// A bad precision flag was found by every rank apart, after the prompts went round: each printed its
// own error and the job was aborted. It is now one error, from rank 0, in every subcommand.
TEST_F(Cli, MpirunBadPrecisionFlagIsOneError) {
    for (const std::string cmd : {" generate --prompt-ids 1,2 --weights int3", " bench --prompt-len 4 --gen 2 --kv int3",
                                  " perplexity --ids-file /dev/null --per-layer --weights int3"}) {
        const CommandResult r = run_command(mpirun(2) + cmd + " --model " + dir_.path());
        EXPECT_NE(r.exit_code, 0) << cmd;
        size_t errors = 0;
        for (size_t at = r.err.find("shardlm: error:"); at != std::string::npos; at = r.err.find("shardlm: error:", at + 1))
            ++errors;
        EXPECT_EQ(errors, 1u) << cmd << "\n" << r.err;
        EXPECT_NE(r.err.find("unknown format \"int3\""), std::string::npos) << cmd << "\n" << r.err;
    }
}
#endif

TEST_F(Cli, PerplexityAndPerLayerSensitivity) {
    std::string ids;
    for (const int32_t id : make_prompt(80, 384, 7)) ids += std::to_string(id) + (ids.size() % 3 ? "," : "\n");
    write_file(dir_.file("ids.txt"), ids);
    const std::string base = kBin + " perplexity --model " + dir_.path() + " --ids-file " + dir_.file("ids.txt") + " --ctx 32";
    const CommandResult p = run_command(base + " --json");
    ASSERT_EQ(p.exit_code, 0) << p.err;
    const auto j = nlohmann::json::parse(p.out);
    EXPECT_EQ(j["scored"], 80 - 3);  // windows of 32, 32, 16: each scores all but its first token
    EXPECT_GT(j["perplexity"].get<double>(), 1.0);
    const CommandResult c = run_command(base + " --weights int8 --kv int8 --compare-weights fp32 --compare-kv fp32 --json");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    const auto k = nlohmann::json::parse(c.out);
    EXPECT_GT(k["mean_kl"].get<double>(), 0.0);
    EXPECT_GT(k["top1_agreement"].get<double>(), 0.9);
    const CommandResult l = run_command(base + " --weights int8 --per-layer --json");
    ASSERT_EQ(l.exit_code, 0) << l.err;
    const auto rows = nlohmann::json::parse(l.out);
    ASSERT_EQ(rows.size(), 3u);  // 2 layers and lm_head
    EXPECT_EQ(rows[2]["quantized"], "lm_head");
    for (const auto& r : rows) EXPECT_GT(r["mean_kl"].get<double>(), 0.0) << r.dump();
    expect_error("perplexity --model " + dir_.path() + " --ids-file " + dir_.file("ids.txt") + " --per-layer", "--per-layer needs");
    write_file(dir_.file("bad.txt"), "1 2 x3");
    expect_error("perplexity --model " + dir_.path() + " --ids-file " + dir_.file("bad.txt"), "is not a token id");
    // The reference precisions are named by their own flags (they said --weights/--kv).
    expect_error("perplexity --model " + dir_.path() + " --ids-file " + dir_.file("ids.txt") + " --compare-weights int3",
                 "--compare-weights: unknown format \"int3\"");
    expect_error("perplexity --model " + dir_.path() + " --ids-file " + dir_.file("ids.txt") + " --compare-kv int3",
                 "--compare-kv: unknown format \"int3\"");
    // Text that does not encode names the --text-file (the shipped model has a tokenizer).
    write_file(dir_.file("latin1.txt"), "caf\xe9\n");
    expect_error("perplexity --model " SHARDLM_SOURCE_DIR "/launch/models/kjv-small --text-file " + dir_.file("latin1.txt"),
                 dir_.file("latin1.txt") + ": text is not valid UTF-8");
}

// --per-layer on a pre-quantized checkpoint failed with the loader's generic "use --weights auto,
// int8 or w8a8" (from its fp32 reference), which --weights int8 already was. It now says why:
// quantizing one layer at a time needs the float checkpoint.
TEST_F(Cli, PerLayerNeedsAFloatCheckpoint) {
    write_file(dir_.file("ids.txt"), "5 6 7 8 9 10 11 12\n");
    for (const std::string fmt : {"int8", "w8a8"}) {
        const std::string q = dir_.file("q-" + fmt);
        const CommandResult r = run_command(kBin + " quantize --model " + dir_.path() + " --out " + q + " --weights " + fmt);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        for (const std::string& w : {fmt, std::string("auto")})
            expect_error("perplexity --model " + q + " --ids-file " + dir_.file("ids.txt") + " --ctx 8 --per-layer --weights " + w,
                         "--per-layer quantizes one layer at a time from float weights and needs a float checkpoint; " + q +
                             " is pre-quantized (" + fmt + ")");
    }
}

// --compare-weights fp32 on a pre-quantized checkpoint failed in the reference's loader with "use
// --weights auto, int8 or w8a8", naming a flag that was fine. The error now names --compare-weights
// and says why: the reference needs float weights and the folder is pre-quantized. A quantized
// reference of the other family names --compare-weights too; one the folder loads as still runs.
TEST_F(Cli, CompareWeightsOnAPreQuantizedCheckpoint) {
    write_file(dir_.file("ids.txt"), "5 6 7 8 9 10 11 12\n");
    const std::string q = dir_.file("q-int8");
    const CommandResult r = run_command(kBin + " quantize --model " + dir_.path() + " --out " + q + " --weights int8");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string ppl = "perplexity --model " + q + " --ids-file " + dir_.file("ids.txt") + " --ctx 8 --compare-weights ";
    for (const std::string w : {"fp32", "bf16"}) {
        expect_error(ppl + w, "--compare-weights " + w + " needs float weights for the reference run; " + q +
                                  " is pre-quantized (int8)");
        EXPECT_EQ(run_command(kBin + " " + ppl + w).err.find("--weights"), std::string::npos) << w;
    }
    expect_error(ppl + "int4", "--compare-weights int4: " + q + " is pre-quantized (int8) and loads only as auto, int8 or w8a8");
    for (const std::string w : {"w8a8", "auto"}) {
        const CommandResult ok = run_command(kBin + " " + ppl + w);
        EXPECT_EQ(ok.exit_code, 0) << w << ": " << ok.err;
    }
}

TEST_F(Cli, BenchJsonRowsCarryEveryField) {
    const std::string cmd = kBin + " bench --model " + dir_.path() + " --batch 2 --prompt-len 16 --gen 4 -r 2 --json";
    const CommandResult a = run_command(cmd), b = run_command(cmd + " --weights int8 --kv int8");
    ASSERT_EQ(a.exit_code, 0) << a.err;
    ASSERT_EQ(b.exit_code, 0) << b.err;
    const std::vector<nlohmann::json> rows = json_lines(a.out);
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0]["test"], "pp16");
    EXPECT_EQ(rows[1]["test"], "tg4");
    for (const auto& r : rows) {
        for (const char* k : {"batch", "tp", "device", "weights", "kv", "avg_ms", "stddev_ms", "tokens_per_s", "gbps",
                              "peak_gbps", "memory", "logits_checksum", "build_commit"})
            EXPECT_TRUE(r.contains(k)) << k;
        EXPECT_GT(r["peak_gbps"].get<double>(), 0.0);
        EXPECT_EQ(r["batch"], 2);
    }
    EXPECT_GT(rows[1]["gbps"].get<double>(), 0.0);
    // Same inputs, same logits: the checksum repeats exactly across runs, and INT8 moves it.
    const CommandResult again = run_command(cmd);
    const auto first = nlohmann::json::parse(a.out.substr(0, a.out.find('\n')));
    const auto second = nlohmann::json::parse(again.out.substr(0, again.out.find('\n')));
    EXPECT_EQ(first["logits_checksum"], second["logits_checksum"]);
    EXPECT_NE(first["logits_checksum"], nlohmann::json::parse(b.out.substr(0, b.out.find('\n')))["logits_checksum"]);
    // Eager decode steps give the graphs' logits (on the CUDA engine; the CPU ignores the flag).
    const CommandResult eager = run_command(cmd + " --no-cuda-graph");
    ASSERT_EQ(eager.exit_code, 0) << eager.err;
    EXPECT_EQ(first["logits_checksum"], nlohmann::json::parse(eager.out.substr(0, eager.out.find('\n')))["logits_checksum"]);
    // A list of batch sizes runs each on the one loaded model, in order.
    const std::string list = kBin + " bench --model " + dir_.path() + " --batch 1,2 --prompt-len 8 --gen 2 -r 1 --json";
    const CommandResult l = run_command(list);
    ASSERT_EQ(l.exit_code, 0) << l.err;
    std::vector<int> batches;
    std::istringstream lin(l.out);
    for (std::string line; std::getline(lin, line);) batches.push_back(nlohmann::json::parse(line)["batch"].get<int>());
    EXPECT_EQ(batches, (std::vector<int>{1, 1, 2, 2}));
    expect_error("bench --model " + dir_.path() + " --batch 1,0", "--batch must be >= 1");
    expect_error("bench --model " + dir_.path() + " --batch 1,x", "--batch: expected sizes");
    // --ablate is a CUDA engine measurement (a CPU-only build, or a CUDA build on the CPU engine).
    expect_error("bench --model " + dir_.path() + " --prompt-len 4 --gen 2 -r 1 --device cpu --ablate attention",
                 "--ablate measures the CUDA engine");
    expect_error("bench --model " + dir_.path() + " --requests 2 --ablate mlp", "--ablate times decode steps");
    // bench has no --ctx: a length beyond the model names the flags that set it (no int64 overflow)
    expect_error("bench --model " + dir_.path() + " --prompt-len 99999999999", "--prompt-len 99999999999 + --gen");
    expect_error("bench --model " + dir_.path() + " --prompt-len 8 --gen 9223372036854775807", "exceed the model's");
}

// bench --requests: per batch size a continuous-batching row and a static-batches row over the
// same requests; both generate the same tokens (greedy), continuous batching in fewer steps, and
// one slot is the same schedule either way.
TEST_F(Cli, BenchServingRows) {
    const CommandResult r = run_command(kBin + " bench --model " + dir_.path() +
                                        " --requests 9 --batch 1,3 --prompt-len 12 --gen 6 -r 1 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<nlohmann::json> rows = json_lines(r.out);
    ASSERT_EQ(rows.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(rows[i]["test"], i % 2 == 0 ? "serve9" : "serve9-static");
        EXPECT_EQ(rows[i]["batch"], i < 2 ? 1 : 3);
        EXPECT_EQ(rows[i]["requests"], 9);
        EXPECT_GT(rows[i]["tokens_per_s"].get<double>(), 0);
        EXPECT_GT(rows[i]["gbps"].get<double>(), 0);
        EXPECT_EQ(rows[i]["prompt_tokens"], rows[0]["prompt_tokens"]);
        EXPECT_EQ(rows[i]["generated_tokens"], rows[0]["generated_tokens"]);
        // Latencies within the run: the first token of every request came, the median first.
        const double p50 = rows[i]["ttft_ms_p50"], p90 = rows[i]["ttft_ms_p90"], tpot = rows[i]["tpot_ms_mean"];
        EXPECT_GT(p50, 0.0);
        EXPECT_LE(p50, p90);
        EXPECT_LE(p90, rows[i]["avg_ms"].get<double>());
        EXPECT_GE(tpot, 0.0);
    }
    const int64_t prompt_tokens = rows[0]["prompt_tokens"], generated = rows[0]["generated_tokens"];
    EXPECT_GE(prompt_tokens, 9);
    EXPECT_LE(prompt_tokens, 9 * 12);
    EXPECT_GE(generated, 9);
    EXPECT_LE(generated, 9 * 6);
    EXPECT_EQ(rows[0]["steps"], rows[1]["steps"]);  // one slot: one sequence after the other both ways
    EXPECT_LT(rows[2]["steps"].get<int64_t>(), rows[3]["steps"].get<int64_t>());
    // The same requests again (a fixed seed).
    const CommandResult again = run_command(kBin + " bench --model " + dir_.path() +
                                            " --requests 9 --batch 3 --prompt-len 12 --gen 6 -r 1 --json");
    ASSERT_EQ(again.exit_code, 0) << again.err;
    const auto a = nlohmann::json::parse(again.out.substr(0, again.out.find('\n')));
    EXPECT_EQ(a["prompt_tokens"], prompt_tokens);
    EXPECT_EQ(a["steps"], rows[2]["steps"]);
    // A shared system prompt: a third row with the prefix cache prefills less for the same tokens.
    const CommandResult shared = run_command(kBin + " bench --model " + dir_.path() +
                                             " --requests 9 --batch 3 --prompt-len 12 --gen 6 --shared-prefix 20 -r 1 --json");
    ASSERT_EQ(shared.exit_code, 0) << shared.err;
    const std::vector<nlohmann::json> srows = json_lines(shared.out);
    ASSERT_EQ(srows.size(), 3u);
    EXPECT_EQ(srows[2]["test"], "serve9-prefix");
    EXPECT_EQ(srows[0]["prompt_tokens"], prompt_tokens + 9 * 20);  // the same requests after the prefix
    EXPECT_EQ(srows[0]["prefilled_tokens"], srows[0]["prompt_tokens"]);
    EXPECT_EQ(srows[2]["generated_tokens"], srows[0]["generated_tokens"]);
    // The first three prefill the prefix (three slots, empty at first); the other six reuse it.
    EXPECT_LE(srows[2]["prefilled_tokens"].get<int64_t>(), srows[0]["prompt_tokens"].get<int64_t>() - 6 * 20);
    expect_error("bench --model " + dir_.path() + " --shared-prefix 4", "--shared-prefix needs --requests");
    expect_error("bench --model " + dir_.path() + " --requests -1", "--requests must be >= 0");
    expect_error("bench --model " + dir_.path() + " --requests 2 --no-kv-cache", "--requests runs generate");
}

// bench --conversations: four two-turn conversations through two slots. Without the prefix cache
// every second turn prefills its whole prompt (its first prompt, its reply, 5 new tokens); the
// slots alone hold other conversations by then (each slot last ran a later one's first turn);
// the host tier saved every first turn as its slot was taken and loads each back (all of it but
// the reply's last token, never run), so only the new tokens and that one run.
TEST_F(Cli, BenchConversationRows) {
    const CommandResult r = run_command(kBin + " bench --model " + dir_.path() +
                                        " --conversations 4 --batch 2 --prompt-len 20 --gen 5 -r 1 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<nlohmann::json> rows = json_lines(r.out);
    ASSERT_EQ(rows.size(), 3u);
    const char* names[] = {"conv4-none", "conv4-slots", "conv4-host"};
    const int64_t prefilled[] = {4 * 30, 4 * 30, 4 * 6}, loads[] = {0, 0, 4};
    for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(rows[i]["test"], names[i]);
        EXPECT_EQ(rows[i]["batch"], 2);
        EXPECT_EQ(rows[i]["generated_tokens"], 4 * 5);
        EXPECT_EQ(rows[i]["prefilled_tokens"], prefilled[i]) << names[i];
        EXPECT_EQ(rows[i]["host_loads"], loads[i]) << names[i];
        EXPECT_GT(rows[i]["ttft_ms_p50"].get<double>(), 0.0);
        EXPECT_EQ(rows[i]["host_cache_bytes"].get<int64_t>() > 0, i == 2);
    }
    expect_error("bench --model " + dir_.path() + " --conversations 2 --requests 2", "--conversations excludes --requests");
    expect_error("bench --model " + dir_.path() + " --conversations -1", "--conversations must be in [0, 2^20]");
}

// On a model without max_position_embeddings bench added --prompt-len and --gen with signed
// overflow (undefined behaviour) and reported "--ctx must be at least 1"; a sum that did not
// overflow was refused as "--ctx N x batch B", a flag bench does not have. The sum saturates and
// the error names --prompt-len and --gen.
TEST_F(Cli, BenchContextNamesPromptLenAndGen) {
    drop_max_position(dir_);
    const std::string m = "bench --model " + dir_.path() + " --prompt-len 5";
    for (const std::string gen : {"9223372036854775807", "9223372036854775000"}) {  // the sum saturates / fits
        for (const std::string batch : {"1", "1,4"}) {
            const std::string args = m + " --gen " + gen + " --batch " + batch;
            expect_error(args, "--prompt-len 5 + --gen " + gen + " x batch " + batch.substr(batch.size() - 1) +
                                   ": the KV cache would need more than 2^63 bytes");
            EXPECT_EQ(run_command(kBin + " " + args).err.find("--ctx"), std::string::npos) << args;
        }
    }
    expect_error(m + " --gen 9223372036854775807 --no-kv-cache --batch 4",
                 "--prompt-len 5 + --gen 9223372036854775807 x batch 4: the KV cache");
}
