#include "model/synthetic.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "model/safetensors_writer.h"

namespace shardlm {

namespace {

ModelConfig base(Arch arch, int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t hd,
                 int64_t inter, int64_t vocab, bool tied) {
    ModelConfig c;
    c.arch = arch;
    c.architecture = arch_name(arch);
    c.hidden = hidden;
    c.n_layers = layers;
    c.n_heads = heads;
    c.n_kv_heads = kv;
    c.head_dim = hd;
    c.intermediate = inter;
    c.vocab = vocab;
    c.tie_embeddings = tied;
    c.max_position = 32768;
    c.qkv_bias = arch == Arch::Qwen2;
    c.qk_norm = arch == Arch::Qwen3;
    c.bos_id = 1;
    c.eos_ids = {2};
    c.torch_dtype = DType::BF16;
    return c;
}

// splitmix64 -> uniform in [-1, 1): deterministic everywhere for a given seed.
struct Rng {
    uint64_t s;
    float next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        return float(double(z >> 40) / double(1ull << 23) - 1.0);
    }
};

const char* st_dtype(DType t) {
    switch (t) {
        case DType::F16: return "F16";
        case DType::BF16: return "BF16";
        default: return "F32";
    }
}

// Uniform values with standard deviation `std` around `mean`, stored as `dt`.
TensorToWrite random_tensor(const std::string& name, std::vector<int64_t> shape, DType dt, Rng& rng,
                            float std, float mean = 0.0f) {
    TensorToWrite t{name, st_dtype(dt), shape, {}};
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    t.bytes.resize(size_t(n) * dtype_size(dt));
    const float a = std * std::sqrt(3.0f);
    for (int64_t i = 0; i < n; ++i) {
        const float v = mean + a * rng.next();
        switch (dt) {
            case DType::F16: { uint16_t h = f32_to_f16(v); std::memcpy(&t.bytes[size_t(i) * 2], &h, 2); break; }
            case DType::BF16: { uint16_t h = f32_to_bf16(v); std::memcpy(&t.bytes[size_t(i) * 2], &h, 2); break; }
            default: std::memcpy(&t.bytes[size_t(i) * 4], &v, 4); break;
        }
    }
    return t;
}

}  // namespace

std::vector<std::string> synthetic_names() { return {"tiny", "qwen3-1.7b", "smollm2-1.7b", "llama3.2-1b"}; }

ModelConfig synthetic_config(const std::string& name) {
    if (name == "tiny") {
        ModelConfig c = base(Arch::Qwen3, 128, 4, 4, 2, 32, 256, 512, true);
        c.rope_theta = 10000.0f;
        return c;
    }
    if (name == "qwen3-1.7b") {
        ModelConfig c = base(Arch::Qwen3, 2048, 28, 16, 8, 128, 6144, 151936, true);
        c.rope_theta = 1000000.0f;
        return c;
    }
    if (name == "smollm2-1.7b") {
        ModelConfig c = base(Arch::Llama, 2048, 24, 32, 32, 64, 8192, 49152, true);
        c.rope_theta = 130000.0f;
        c.rms_eps = 1e-5f;
        return c;
    }
    if (name == "llama3.2-1b") {
        ModelConfig c = base(Arch::Llama, 2048, 16, 32, 8, 64, 8192, 128256, true);
        c.rope_theta = 500000.0f;
        c.rms_eps = 1e-5f;
        c.rope.kind = RopeScaling::Kind::Llama3;
        c.rope.factor = 32.0f;
        c.rope.low_freq_factor = 1.0f;
        c.rope.high_freq_factor = 4.0f;
        c.rope.original_max_position = 8192;
        return c;
    }
    std::string names;
    for (const auto& n : synthetic_names()) names += (names.empty() ? "" : ", ") + n;
    fail("unknown synthetic model \"", name, "\" (known: ", names, ")");
}

ModelConfig tiny_config(Arch arch) {
    // GQA everywhere; head_dim != hidden/heads for Qwen3 as in the real 0.6B/1.7B models.
    switch (arch) {
        case Arch::Qwen3: return base(arch, 64, 2, 4, 2, 32, 160, 384, true);
        case Arch::Qwen2: return base(arch, 64, 2, 4, 2, 16, 160, 384, true);
        case Arch::Mistral: return base(arch, 64, 2, 4, 2, 16, 160, 384, false);
        case Arch::Llama: break;
    }
    return base(arch, 64, 2, 4, 2, 16, 160, 384, false);
}

std::string config_json(const ModelConfig& c) {
    nlohmann::ordered_json j;
    j["architectures"] = {arch_name(c.arch)};
    j["model_type"] = c.arch == Arch::Llama ? "llama" : c.arch == Arch::Mistral ? "mistral"
                      : c.arch == Arch::Qwen2 ? "qwen2" : "qwen3";
    j["hidden_size"] = c.hidden;
    j["num_hidden_layers"] = c.n_layers;
    j["num_attention_heads"] = c.n_heads;
    j["num_key_value_heads"] = c.n_kv_heads;
    j["head_dim"] = c.head_dim;
    j["intermediate_size"] = c.intermediate;
    j["vocab_size"] = c.vocab;
    j["max_position_embeddings"] = c.max_position;
    j["rms_norm_eps"] = c.rms_eps;
    j["rope_theta"] = c.rope_theta;
    if (c.rope.kind == RopeScaling::Kind::Llama3) {
        j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", c.rope.factor},
                             {"low_freq_factor", c.rope.low_freq_factor}, {"high_freq_factor", c.rope.high_freq_factor},
                             {"original_max_position_embeddings", c.rope.original_max_position}};
    } else if (c.rope.kind == RopeScaling::Kind::Linear) {
        j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope.factor}};
    } else if (c.rope.kind == RopeScaling::Kind::Yarn) {
        j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", c.rope.factor},
                             {"original_max_position_embeddings", c.rope.original_max_position},
                             {"beta_fast", c.rope.beta_fast}, {"beta_slow", c.rope.beta_slow},
                             {"attention_factor", c.rope.attention_factor}};
    } else {
        j["rope_scaling"] = nullptr;
    }
    j["hidden_act"] = "silu";
    j["tie_word_embeddings"] = c.tie_embeddings;
    if (c.arch != Arch::Qwen2) j["attention_bias"] = c.qkv_bias;  // Qwen2 configs carry no such key
    if (c.arch == Arch::Mistral) {
        j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nlohmann::ordered_json();
    } else if (c.sliding_window > 0) {
        j["use_sliding_window"] = true;
        j["sliding_window"] = c.sliding_window;
        j["max_window_layers"] = c.window_from_layer;
    }
    j["bos_token_id"] = c.bos_id;
    if (c.eos_ids.size() == 1) j["eos_token_id"] = c.eos_ids[0];
    else j["eos_token_id"] = c.eos_ids;
    j["torch_dtype"] = c.torch_dtype == DType::F16 ? "float16" : c.torch_dtype == DType::BF16 ? "bfloat16" : "float32";
    return j.dump(2) + "\n";
}

int max_synthetic_shards(const ModelConfig& cfg) {
    return int(std::min<int64_t>(cfg.n_layers + 1, std::numeric_limits<int>::max()));
}

void write_synthetic_checkpoint(const std::string& dir, const ModelConfig& c0, const SyntheticOptions& opt) {
    SHARDLM_CHECK(opt.shards >= 1 && opt.shards <= max_synthetic_shards(c0), "shards ", opt.shards);
    ModelConfig c = c0;
    c.torch_dtype = opt.dtype;
    ::mkdir(dir.c_str(), 0755);  // an existing folder is fine; a failure shows when writing
    {
        std::ofstream f(dir + "/config.json");
        if (!f) fail(dir, ": cannot write config.json");
        f << config_json(c);
    }
    Rng rng{opt.seed * 0x2545f4914f6cdd1dull + 1};
    const DType dt = opt.dtype;
    const float unit = 1.0f;
    const int64_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
    const float in_h = 1.0f / std::sqrt(float(c.hidden)), in_q = 1.0f / std::sqrt(float(q_dim));
    const float in_i = 1.0f / std::sqrt(float(c.intermediate));
    // Logits should have a standard deviation of a few units whichever matrix produces them.
    const float head_std = 4.0f * in_h;

    // Groups of tensors, one group per file: embeddings, then layers spread over the shards.
    const int shards = opt.shards;
    std::vector<std::vector<std::string>> names(static_cast<size_t>(shards));
    std::map<std::string, std::string> weight_map;
    auto file_of = [&](int s) {
        if (shards == 1) return std::string("model.safetensors");
        char buf[64];
        std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", s + 1, shards);
        return std::string(buf);
    };
    for (int s = 0; s < shards; ++s) {
        std::vector<TensorToWrite> ts;
        if (s == 0) ts.push_back(random_tensor("model.embed_tokens.weight", {c.vocab, c.hidden}, dt, rng,
                                               c.tie_embeddings ? head_std : unit));
        for (int64_t l = 0; l < c.n_layers; ++l) {
            if (l * shards / c.n_layers != s) continue;
            const std::string p = "model.layers." + std::to_string(l);
            ts.push_back(random_tensor(p + ".input_layernorm.weight", {c.hidden}, dt, rng, 0.1f, 1.0f));
            ts.push_back(random_tensor(p + ".self_attn.q_proj.weight", {q_dim, c.hidden}, dt, rng, in_h));
            ts.push_back(random_tensor(p + ".self_attn.k_proj.weight", {kv_dim, c.hidden}, dt, rng, in_h));
            ts.push_back(random_tensor(p + ".self_attn.v_proj.weight", {kv_dim, c.hidden}, dt, rng, in_h));
            if (c.qkv_bias) {
                ts.push_back(random_tensor(p + ".self_attn.q_proj.bias", {q_dim}, dt, rng, 0.1f));
                ts.push_back(random_tensor(p + ".self_attn.k_proj.bias", {kv_dim}, dt, rng, 0.1f));
                ts.push_back(random_tensor(p + ".self_attn.v_proj.bias", {kv_dim}, dt, rng, 0.1f));
            }
            if (c.qk_norm) {
                ts.push_back(random_tensor(p + ".self_attn.q_norm.weight", {c.head_dim}, dt, rng, 0.1f, 1.0f));
                ts.push_back(random_tensor(p + ".self_attn.k_norm.weight", {c.head_dim}, dt, rng, 0.1f, 1.0f));
            }
            ts.push_back(random_tensor(p + ".self_attn.o_proj.weight", {c.hidden, q_dim}, dt, rng, in_q));
            ts.push_back(random_tensor(p + ".post_attention_layernorm.weight", {c.hidden}, dt, rng, 0.1f, 1.0f));
            ts.push_back(random_tensor(p + ".mlp.gate_proj.weight", {c.intermediate, c.hidden}, dt, rng, in_h));
            ts.push_back(random_tensor(p + ".mlp.up_proj.weight", {c.intermediate, c.hidden}, dt, rng, in_h));
            ts.push_back(random_tensor(p + ".mlp.down_proj.weight", {c.hidden, c.intermediate}, dt, rng, in_i));
        }
        if (s == shards - 1) {
            ts.push_back(random_tensor("model.norm.weight", {c.hidden}, dt, rng, 0.1f, 1.0f));
            if (!c.tie_embeddings) ts.push_back(random_tensor("lm_head.weight", {c.vocab, c.hidden}, dt, rng, head_std));
        }
        for (const auto& t : ts) weight_map[t.name] = file_of(s);
        write_safetensors(dir + "/" + file_of(s), ts);
    }
    if (shards > 1) {
        nlohmann::json idx;
        idx["metadata"] = nlohmann::json::object();
        idx["weight_map"] = weight_map;
        std::ofstream f(dir + "/model.safetensors.index.json");
        if (!f) fail(dir, ": cannot write model.safetensors.index.json");
        f << idx.dump(2) << "\n";
    }
}

void write_synthetic_lora(const std::string& dir, const ModelConfig& c, int64_t rank, const SyntheticOptions& opt) {
    SHARDLM_CHECK(rank >= 1, "LoRA rank ", rank);
    ::mkdir(dir.c_str(), 0755);
    {
        std::ofstream f(dir + "/adapter_config.json");
        if (!f) fail(dir, ": cannot write adapter_config.json");
        const nlohmann::json j = {{"peft_type", "LORA"}, {"r", rank}, {"lora_alpha", rank}, {"bias", "none"},
                                  {"task_type", "CAUSAL_LM"},
                                  {"target_modules", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}}};
        f << j.dump(2) << "\n";
    }
    Rng rng{opt.seed * 0x9e3779b97f4a7c15ull + 7};
    const int64_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
    // x A^T has entries of about |x| / sqrt(rank) with A's spread 1 / sqrt(in); B's spread then sets
    // the change, 5% of what the base matrix (spread 1 / sqrt(in)) gives.
    struct Module {
        const char* name;
        int64_t out, in;
    };
    const Module modules[] = {{"self_attn.q_proj", q_dim, c.hidden},         {"self_attn.k_proj", kv_dim, c.hidden},
                              {"self_attn.v_proj", kv_dim, c.hidden},        {"self_attn.o_proj", c.hidden, q_dim},
                              {"mlp.gate_proj", c.intermediate, c.hidden},   {"mlp.up_proj", c.intermediate, c.hidden},
                              {"mlp.down_proj", c.hidden, c.intermediate}};
    std::vector<TensorToWrite> ts;
    for (int64_t l = 0; l < c.n_layers; ++l)
        for (const Module& m : modules) {
            const std::string p = "base_model.model.model.layers." + std::to_string(l) + "." + m.name;
            const float in = 1.0f / std::sqrt(float(m.in));
            ts.push_back(random_tensor(p + ".lora_A.weight", {rank, m.in}, opt.dtype, rng, in));
            ts.push_back(random_tensor(p + ".lora_B.weight", {m.out, rank}, opt.dtype, rng, 0.05f * std::sqrt(float(rank)) * in));
        }
    write_safetensors(dir + "/adapter_model.safetensors", ts);
}

}  // namespace shardlm
