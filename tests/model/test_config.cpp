#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "fixtures.h"
#include "model/config.h"
#include "model/synthetic.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {
std::string with(const std::string& extra) {
    return R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100)" + extra + "}";
}
void expect_error(const std::string& json, const std::string& needle) {
    try {
        parse_config(json, "cfg/config.json");
        FAIL() << "expected an error containing " << needle;
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("cfg/config.json"), std::string::npos) << e.what();
    }
}
}  // namespace

TEST(Config, LlamaDefaults) {
    const ModelConfig c = parse_config(with(""), "x");
    EXPECT_EQ(c.arch, Arch::Llama);
    EXPECT_EQ(c.n_kv_heads, 4);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
    EXPECT_FALSE(c.tie_embeddings);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_EQ(c.rope.kind, RopeScaling::Kind::None);
}

TEST(Config, Qwen2HasBiasWithoutKey) {
    std::string j = with(R"(, "num_key_value_heads": 2, "eos_token_id": [7, 8], "tie_word_embeddings": true)");
    j.replace(j.find("LlamaForCausalLM"), 16, "Qwen2ForCausalLM");
    const ModelConfig c = parse_config(j, "x");
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_TRUE(c.tie_embeddings);
    EXPECT_EQ(c.eos_ids, (std::vector<int64_t>{7, 8}));
    EXPECT_EQ(c.n_kv_heads, 2);
}

TEST(Config, Qwen3HeadDimAndQkNorm) {
    std::string j = with(R"(, "head_dim": 32, "attention_bias": false, "head_dim_unused": null)");
    j.replace(j.find("LlamaForCausalLM"), 16, "Qwen3ForCausalLM");
    const ModelConfig c = parse_config(j, "x");
    EXPECT_EQ(c.head_dim, 32);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_FALSE(c.qkv_bias);
}

TEST(Config, RopeScalingLlama3AndRopeParameters) {
    const ModelConfig a = parse_config(with(R"(, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3",
        "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"), "x");
    EXPECT_EQ(a.rope.kind, RopeScaling::Kind::Llama3);
    EXPECT_FLOAT_EQ(a.rope.factor, 32.0f);
    EXPECT_FLOAT_EQ(a.rope_theta, 500000.0f);
    const ModelConfig b = parse_config(with(R"(, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"), "x");
    EXPECT_EQ(b.rope.kind, RopeScaling::Kind::Llama3);
    EXPECT_FLOAT_EQ(b.rope.factor, 8.0f);
    EXPECT_FLOAT_EQ(b.rope_theta, 500000.0f);
    const ModelConfig d = parse_config(with(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0})"), "x");
    EXPECT_EQ(d.rope.kind, RopeScaling::Kind::None);
    EXPECT_FLOAT_EQ(d.rope_theta, 1000000.0f);
}

// YaRN as Qwen's model cards add it, and as HF reads its options: the original context from
// rope_scaling (else max_position_embeddings), beta 32/1, attention factor 0.1 ln(factor) + 1
// unless given (or DeepSeek's mscale ratio); linear takes the factor alone; dynamic NTK is refused.
TEST(Config, RopeScalingYarnAndLinear) {
    const ModelConfig a = parse_config(with(R"(, "max_position_embeddings": 40960, "rope_scaling": {"rope_type": "yarn",
        "factor": 4.0, "original_max_position_embeddings": 32768})"), "x");
    EXPECT_EQ(a.rope.kind, RopeScaling::Kind::Yarn);
    EXPECT_FLOAT_EQ(a.rope.factor, 4.0f);
    EXPECT_EQ(a.rope.original_max_position, 32768);
    EXPECT_FLOAT_EQ(a.rope.beta_fast, 32.0f);
    EXPECT_FLOAT_EQ(a.rope.beta_slow, 1.0f);
    EXPECT_TRUE(a.rope.truncate);
    EXPECT_NEAR(a.rope.attention_factor, 1.1386294f, 1e-6);
    EXPECT_STREQ(rope_kind_name(a.rope.kind), "yarn");
    const ModelConfig b = parse_config(with(R"(, "max_position_embeddings": 8192, "rope_scaling": {"type": "yarn",
        "factor": 2.0, "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.5, "truncate": false})"), "x");
    EXPECT_EQ(b.rope.original_max_position, 8192);
    EXPECT_FLOAT_EQ(b.rope.beta_fast, 16.0f);
    EXPECT_FLOAT_EQ(b.rope.attention_factor, 1.5f);
    EXPECT_FALSE(b.rope.truncate);
    const ModelConfig m = parse_config(with(R"(, "max_position_embeddings": 8192, "rope_scaling": {"type": "yarn",
        "factor": 40, "mscale": 1.0, "mscale_all_dim": 0.5})"), "x");
    EXPECT_NEAR(m.rope.attention_factor, (0.1 * std::log(40.0) + 1) / (0.05 * std::log(40.0) + 1), 1e-6);
    const ModelConfig l = parse_config(with(R"(, "rope_scaling": {"rope_type": "linear", "factor": 2.0})"), "x");
    EXPECT_EQ(l.rope.kind, RopeScaling::Kind::Linear);
    EXPECT_FLOAT_EQ(l.rope.factor, 2.0f);
}

// Sliding windows as Hugging Face reads them: Mistral on every layer (null: none); Qwen2 only with
// use_sliding_window, from max_window_layers on (none when that is the layer count); an explicit
// layer_types list of full layers then sliding ones; other patterns refused.
TEST(Config, SlidingWindows) {
    auto arch = [](std::string j, const char* a) {
        j.replace(j.find("LlamaForCausalLM"), 16, a);
        return j;
    };
    const ModelConfig m = parse_config(arch(with(R"(, "sliding_window": 4096)"), "MistralForCausalLM"), "x");
    EXPECT_EQ(m.sliding_window, 4096);
    EXPECT_EQ(m.window_from_layer, 0);
    EXPECT_EQ(layer_window(m, 0), 4096);
    EXPECT_EQ(parse_config(arch(with(R"(, "sliding_window": null)"), "MistralForCausalLM"), "x").sliding_window, 0);
    EXPECT_EQ(parse_config(arch(with(R"(, "sliding_window": 4096)"), "Qwen2ForCausalLM"), "x").sliding_window, 0);
    const ModelConfig q = parse_config(arch(with(R"(, "use_sliding_window": true, "sliding_window": 512,
        "max_window_layers": 1)"), "Qwen2ForCausalLM"), "x");
    EXPECT_EQ(layer_window(q, 0), 0);
    EXPECT_EQ(layer_window(q, 1), 512);
    EXPECT_EQ(parse_config(arch(with(R"(, "use_sliding_window": true, "sliding_window": 512,
        "max_window_layers": 2)"), "Qwen2ForCausalLM"), "x").sliding_window, 0);  // no layer slides
    const ModelConfig t = parse_config(arch(with(R"(, "sliding_window": 64,
        "layer_types": ["sliding_attention", "sliding_attention"])"), "MistralForCausalLM"), "x");
    EXPECT_EQ(t.window_from_layer, 0);
    expect_error(arch(with(R"(, "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"])"),
                      "MistralForCausalLM"), "layer_types");
    expect_error(arch(with(R"(, "sliding_window": 64, "layer_types": ["sliding_attention"])"), "MistralForCausalLM"),
                 "layer_types");
    // The synthetic writer round-trips both forms.
    for (const Arch a : {Arch::Mistral, Arch::Qwen2}) {
        ModelConfig c = tiny_config(a);
        c.sliding_window = 8;
        c.window_from_layer = a == Arch::Qwen2 ? 1 : 0;
        const ModelConfig r = parse_config(config_json(c), "x");
        EXPECT_EQ(r.sliding_window, 8);
        EXPECT_EQ(r.window_from_layer, c.window_from_layer);
    }
}

TEST(Config, Errors) {
    expect_error("{", "malformed JSON");
    expect_error("[]", "JSON object");
    expect_error(R"({"hidden_size": 1})", "architectures");
    std::string j = with("");
    j.replace(j.find("LlamaForCausalLM"), 16, "GPT2LMHeadModel_");
    expect_error(j, "unknown architecture");
    expect_error(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})", "num_hidden_layers");
    expect_error(with(R"(, "num_key_value_heads": 3)"), "num_key_value_heads");
    expect_error(with(R"(, "rope_scaling": {"type": "dynamic", "factor": 4.0})"), "\"dynamic\" is not supported");
    expect_error(with(R"(, "rope_scaling": {"type": "yarn"})"), "needs a finite \"factor\" >= 1");
    expect_error(with(R"(, "rope_scaling": {"type": "linear", "factor": 0.5})"), "needs a finite \"factor\" >= 1");
    expect_error(with(R"(, "rope_scaling": {"type": "yarn", "factor": 4, "beta_fast": 1, "beta_slow": 2})"),
                 "invalid yarn parameters");
    expect_error(with(R"(, "rope_scaling": {"type": "yarn", "factor": 4, "truncate": 1})"), "\"truncate\" must be");
    expect_error(with(R"(, "hidden_act": "gelu")"), "hidden_act");
    expect_error(with(R"(, "torch_dtype": "int4")"), "torch_dtype");
    expect_error(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": "64"})", "hidden_size");
    expect_error(with(R"(, "rms_norm_eps": -1)"), "rms_norm_eps");
    // Values that do not fit a float became inf and silently ruined every activation.
    expect_error(with(R"(, "rms_norm_eps": 1e300)"), "rms_norm_eps must be positive and finite");
    expect_error(with(R"(, "rope_theta": 1e300)"), "rope_theta must be positive and finite");
    expect_error(with(R"(, "rope_theta": -5)"), "rope_theta");
    expect_error(with(R"(, "max_position_embeddings": -1)"), "max_position_embeddings must be >= 0");
}

TEST(Config, SyntheticConfigRoundTrips) {
    for (Arch a : {Arch::Llama, Arch::Mistral, Arch::Qwen2, Arch::Qwen3}) {
        const ModelConfig c = tiny_config(a);
        const ModelConfig r = parse_config(config_json(c), "x");
        EXPECT_EQ(r.arch, c.arch);
        EXPECT_EQ(r.hidden, c.hidden);
        EXPECT_EQ(r.head_dim, c.head_dim);
        EXPECT_EQ(r.qkv_bias, c.qkv_bias);
        EXPECT_EQ(r.tie_embeddings, c.tie_embeddings);
        EXPECT_EQ(parameter_count(r), parameter_count(c));
    }
    const ModelConfig l = parse_config(config_json(synthetic_config("llama3.2-1b")), "x");
    EXPECT_EQ(l.rope.kind, RopeScaling::Kind::Llama3);
    // Qwen3-1.7B by hand: 28 layers of (q 2048x2048, k/v 1024x2048, o 2048x2048, 3 MLP 6144x2048,
    // 2 norms of 2048, q/k norms of 128) + tied 151936x2048 embedding + final norm.
    const int64_t layer = 2048LL * 2048 * 2 + 1024LL * 2048 * 2 + 3LL * 6144 * 2048 + 2 * 2048 + 2 * 128;
    EXPECT_EQ(parameter_count(synthetic_config("qwen3-1.7b")), 28 * layer + 151936LL * 2048 + 2048);
}

// shardlm quantize records the --keep-fp16 regex it ran with: the loader holds a float tensor of a
// pre-quantized checkpoint to it, and refuses a different --keep-fp16.
TEST(Config, QuantizationConfigKeepsItsKeepFp16) {
    const std::string q = R"(, "quantization_config": {"quant_method": "shardlm", "format": "int8", "group_size": 0)";
    EXPECT_EQ(parse_config(with(q + R"(, "keep_fp16": "lm_head"})"), "x").quant.keep_fp16, "lm_head");
    EXPECT_EQ(parse_config(with(q + "}"), "x").quant.keep_fp16, "");
    expect_error(with(q + R"(, "keep_fp16": 3})"), "quantization_config keep_fp16 must be a string");
}

// generation_config.json's end-of-sequence ids join config.json's; its faults name it.
TEST(Config, GenerationConfigAddsEndOfSequenceIds) {
    TempDir d;
    write_file(d.file("config.json"), with(R"(, "eos_token_id": 7)"));
    EXPECT_EQ(load_config(d.path()).eos_ids, (std::vector<int64_t>{7}));  // none there: config.json's
    write_file(d.file("generation_config.json"), R"({"eos_token_id": [7, 9], "temperature": 0.6})");
    EXPECT_EQ(load_config(d.path()).eos_ids, (std::vector<int64_t>{7, 9}));
    write_file(d.file("generation_config.json"), R"({"eos_token_id": 11})");
    EXPECT_EQ(load_config(d.path()).eos_ids, (std::vector<int64_t>{7, 11}));
    write_file(d.file("generation_config.json"), R"({"do_sample": true})");
    EXPECT_EQ(load_config(d.path()).eos_ids, (std::vector<int64_t>{7}));
    auto error = [&](const std::string& text) {
        write_file(d.file("generation_config.json"), text);
        try {
            load_config(d.path());
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    const std::string where = d.file("generation_config.json") + ": ";
    EXPECT_EQ(error(R"({"eos_token_id": [7, 100]})"), where + "eos_token_id 100 is not a token id below vocab_size 100");
    EXPECT_EQ(error(R"({"eos_token_id": "x"})"), where + "eos_token_id \"x\" is not a token id below vocab_size 100");
    EXPECT_EQ(error("[1]"), where + "must be a JSON object");
    EXPECT_NE(error("{").find(where + "not valid JSON"), std::string::npos);
}

// generation_config.json's sampling defaults (serve --generation-config): the fields present, in
// the ranges a request may give; a bad one names the file and the key.
TEST(Config, GenerationDefaults) {
    const GenerationDefaults q = parse_generation_defaults(
        R"({"bos_token_id": 1, "do_sample": true, "eos_token_id": [2, 3], "temperature": 0.6, "top_k": 20, "top_p": 0.95})",
        "gen.json");
    EXPECT_TRUE(q.any());
    EXPECT_DOUBLE_EQ(*q.temperature, 0.6);
    EXPECT_DOUBLE_EQ(*q.top_p, 0.95);
    EXPECT_EQ(*q.top_k, 20);
    EXPECT_FALSE(q.min_p || q.repetition_penalty);
    EXPECT_FALSE(parse_generation_defaults(R"({"eos_token_id": 2, "top_p": null})", "gen.json").any());
    const std::pair<const char*, const char*> bad[] = {
        {R"({"temperature": "hot"})", "gen.json: temperature must be a number, not \"hot\""},
        {R"({"temperature": -1})", "gen.json: temperature -1 is outside [0, 100]"},
        {R"({"top_p": 0})", "gen.json: top_p 0 is outside (0, 1]"},
        {R"({"repetition_penalty": 0})", "gen.json: repetition_penalty 0 is outside [0.01, 100]"},
        {R"({"top_k": 1.5})", "gen.json: top_k must be an integer of -1 or more, not 1.5"},
        {R"([1])", "gen.json: must be a JSON object"},
    };
    for (const auto& [text, message] : bad) {
        try {
            (void)parse_generation_defaults(text, "gen.json");
            ADD_FAILURE() << text;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
        }
    }
}
