#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"
#include "model/shard.h"

namespace shardlm {

using nlohmann::json;

const char* arch_name(Arch a) {
    switch (a) {
        case Arch::Llama: return "LlamaForCausalLM";
        case Arch::Mistral: return "MistralForCausalLM";
        case Arch::Qwen2: return "Qwen2ForCausalLM";
        case Arch::Qwen3: return "Qwen3ForCausalLM";
    }
    return "?";
}

const char* rope_kind_name(RopeScaling::Kind k) {
    switch (k) {
        case RopeScaling::Kind::None: return "default";
        case RopeScaling::Kind::Llama3: return "llama3";
        case RopeScaling::Kind::Linear: return "linear";
        case RopeScaling::Kind::Yarn: return "yarn";
    }
    return "?";
}

const char* quant_method_name(QuantMethod m) {
    switch (m) {
        case QuantMethod::Shardlm: return "shardlm";
        case QuantMethod::Awq: return "awq";
        case QuantMethod::Gptq: return "gptq";
        case QuantMethod::CompressedTensors: return "compressed-tensors";
    }
    return "?";
}

namespace {

struct Reader {
    const json& j;
    const std::string& origin;

    bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

    int64_t integer(const char* key) const {
        if (!has(key)) fail(origin, ": missing key \"", key, "\"");
        return integer_of(j[key], key);
    }
    int64_t integer_or(const char* key, int64_t dflt) const {
        return has(key) ? integer_of(j[key], key) : dflt;
    }
    int64_t integer_of(const json& v, const char* key) const {
        if (!v.is_number_integer()) fail(origin, ": key \"", key, "\" must be an integer, got ", v.dump());
        return v.get<int64_t>();
    }
    double number_or(const json& obj, const char* key, double dflt) const {
        if (!obj.contains(key) || obj[key].is_null()) return dflt;
        if (!obj[key].is_number()) fail(origin, ": key \"", key, "\" must be a number, got ", obj[key].dump());
        return obj[key].get<double>();
    }
    bool boolean_or(const char* key, bool dflt) const {
        if (!has(key)) return dflt;
        if (!j[key].is_boolean()) fail(origin, ": key \"", key, "\" must be true or false");
        return j[key].get<bool>();
    }
    int64_t positive(const char* key) const {
        const int64_t v = integer(key);
        if (v <= 0) fail(origin, ": key \"", key, "\" must be positive, got ", v);
        return v;
    }
};

// A sequence-classification head's labels, as transformers' PretrainedConfig reads them: id2label
// ({"0": "irrelevant", "1": "relevant"}, every id from 0 up), else num_labels of "LABEL_<i>", else
// its default of two. problem_type multi_label_classification scores each label on its own.
void parse_labels(const json& j, const Reader& r, ModelConfig& c) {
    const int64_t n = r.integer_or("num_labels", -1);
    if (r.has("id2label")) {
        const json& m = j["id2label"];
        if (!m.is_object() || m.empty()) fail(r.origin, ": id2label must be an object of id -> label name");
        c.labels.assign(m.size(), std::string());
        std::vector<bool> seen(m.size(), false);
        for (const auto& [key, name] : m.items()) {
            size_t used = 0;
            long long id = -1;
            try {
                id = std::stoll(key, &used);
            } catch (const std::exception&) {
            }
            if (used != key.size() || id < 0 || id >= (long long)m.size() || seen[size_t(id)] || !name.is_string())
                fail(r.origin, ": id2label entry \"", key, "\": ", name.dump(), " is not a label name for an id in [0, ", m.size(), ")");
            seen[size_t(id)] = true;
            c.labels[size_t(id)] = name.get<std::string>();
        }
        if (n >= 0 && n != int64_t(m.size()))
            fail(r.origin, ": num_labels ", n, " differs from the ", m.size(), " labels of id2label");
    } else {
        if (n == 0 || n < -1) fail(r.origin, ": num_labels must be positive, got ", n);
        for (int64_t i = 0; i < (n > 0 ? n : 2); ++i) c.labels.push_back("LABEL_" + std::to_string(i));
    }
    if (r.has("problem_type")) {
        const json& p = j["problem_type"];
        if (p == "multi_label_classification") c.multi_label = true;
        else if (p != "single_label_classification" && p != "regression")
            fail(r.origin, ": problem_type ", p.dump(), " is not one of single_label_classification, multi_label_classification, regression");
    }
}

// rope_scaling (older transformers) or rope_parameters (newer: also carries rope_theta).
void parse_rope(const json& j, const Reader& r, ModelConfig& c) {
    c.rope_theta = float(r.number_or(j, "rope_theta", 10000.0));
    const char* key = nullptr;
    if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) key = "rope_parameters";
    else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) key = "rope_scaling";
    if (!key) return;
    const json& rs = j[key];
    if (!rs.is_object()) fail(r.origin, ": \"", key, "\" must be an object");
    c.rope_theta = float(r.number_or(rs, "rope_theta", c.rope_theta));
    std::string type = "default";
    if (rs.contains("rope_type") && rs["rope_type"].is_string()) type = rs["rope_type"].get<std::string>();
    else if (rs.contains("type") && rs["type"].is_string()) type = rs["type"].get<std::string>();
    if (type == "default") return;
    if (type == "linear" || type == "yarn") {
        if (!rs.contains("factor") || !rs["factor"].is_number() || !(rs["factor"].get<double>() >= 1.0) ||
            !std::isfinite(rs["factor"].get<double>()))
            fail(r.origin, ": ", key, " type \"", type, "\" needs a finite \"factor\" >= 1");
        c.rope.factor = float(rs["factor"].get<double>());
    }
    if (type == "linear") {
        c.rope.kind = RopeScaling::Kind::Linear;
        return;
    }
    if (type == "yarn") {
        // vLLM's YaRN: factor as given, the ramp over the original context (rope_scaling's
        // original_max_position_embeddings, else max_position_embeddings).
        c.rope.kind = RopeScaling::Kind::Yarn;
        const double max_pos = r.number_or(j, "max_position_embeddings", 0.0);
        c.rope.original_max_position = int64_t(r.number_or(rs, "original_max_position_embeddings", max_pos));
        c.rope.beta_fast = float(r.number_or(rs, "beta_fast", 32.0));
        c.rope.beta_slow = float(r.number_or(rs, "beta_slow", 1.0));
        if (rs.contains("truncate")) {
            if (!rs["truncate"].is_boolean()) fail(r.origin, ": ", key, " \"truncate\" must be true or false");
            c.rope.truncate = rs["truncate"].get<bool>();
        }
        const auto mscale = [&](double m) { return c.rope.factor <= 1.0f ? 1.0 : 0.1 * m * std::log(double(c.rope.factor)) + 1.0; };
        // HF's default attention factor: 0.1 ln(factor) + 1, or DeepSeek's ratio of two such.
        const double ms = r.number_or(rs, "mscale", 0.0), ms_all = r.number_or(rs, "mscale_all_dim", 0.0);
        const double af = r.number_or(rs, "attention_factor", ms != 0.0 && ms_all != 0.0 ? mscale(ms) / mscale(ms_all) : mscale(1.0));
        c.rope.attention_factor = float(af);
        if (c.rope.original_max_position <= 0 || !(c.rope.beta_fast > c.rope.beta_slow) || !(c.rope.beta_slow > 0) ||
            !(af > 0) || !std::isfinite(af))
            fail(r.origin, ": ", key, " has invalid yarn parameters (original_max_position_embeddings > 0, beta_fast > "
                 "beta_slow > 0, attention_factor > 0)");
        return;
    }
    if (type != "llama3")
        fail(r.origin, ": ", key, " type \"", type, "\" is not supported (supported: default, llama3, linear, yarn)");
    c.rope.kind = RopeScaling::Kind::Llama3;
    c.rope.factor = float(r.number_or(rs, "factor", 8.0));
    c.rope.low_freq_factor = float(r.number_or(rs, "low_freq_factor", 1.0));
    c.rope.high_freq_factor = float(r.number_or(rs, "high_freq_factor", 4.0));
    c.rope.original_max_position = int64_t(r.number_or(rs, "original_max_position_embeddings", 8192));
    if (c.rope.factor <= 0 || c.rope.high_freq_factor <= c.rope.low_freq_factor || c.rope.original_max_position <= 0)
        fail(r.origin, ": ", key, " has invalid llama3 parameters");
}

DType parse_torch_dtype(const json& j, const std::string& origin) {
    const char* key = j.contains("torch_dtype") ? "torch_dtype" : "dtype";
    if (!j.contains(key) || !j[key].is_string()) return DType::F32;
    const std::string s = j[key].get<std::string>();
    if (s == "float32") return DType::F32;
    if (s == "float16") return DType::F16;
    if (s == "bfloat16") return DType::BF16;
    fail(origin, ": torch_dtype \"", s, "\" is not supported (float32, float16, bfloat16)");
}

// An integer field of quantization_config (dflt when absent or null).
int64_t quant_integer(const json& q, const char* key, int64_t dflt, const std::string& origin) {
    if (!q.contains(key) || q[key].is_null()) return dflt;
    if (!q[key].is_number_integer()) fail(origin, ": quantization_config ", key, " must be an integer, got ", q[key].dump());
    return q[key].get<int64_t>();
}

std::string quant_string(const json& q, const char* key, const std::string& dflt, const std::string& origin) {
    if (!q.contains(key) || q[key].is_null()) return dflt;
    if (!q[key].is_string()) fail(origin, ": quantization_config ", key, " must be a string, got ", q[key].dump());
    return q[key].get<std::string>();
}

// The group the INT4 layout repeats a per-channel 4-bit checkpoint's scales over: the largest of
// 128, 64, 32 that divides every Linear layer's input width (0 when none does).
int64_t repeat_group(const ModelConfig& c) {
    for (int64_t g : {128, 64, 32})
        if (c.hidden % g == 0 && c.intermediate % g == 0 && (c.n_heads * c.head_dim) % g == 0) return g;
    return 0;
}

// The engine's groups for a Hugging Face checkpoint's bits and group (0: one per output channel),
// into out.format and out.group_size; `acts`: the layers' inputs are INT8 per token too.
void set_hf_layout(QuantConfig& out, const ModelConfig& c, bool acts, const std::string& where) {
    const int64_t dims[] = {c.hidden, c.intermediate, c.n_heads * c.head_dim};
    for (int64_t d : dims)
        if (out.packed_group > 0 && d % out.packed_group != 0)
            fail(where, " group_size ", out.packed_group, " does not divide a layer's input width (hidden_size ", c.hidden,
                 ", intermediate_size ", c.intermediate, ", heads x head_dim ", c.n_heads * c.head_dim, ")");
    if (out.bits == 8) {
        out.format = acts ? "w8a8" : "int8";
        out.group_size = out.packed_group;
        return;
    }
    out.format = "int4";
    out.group_size = out.packed_group > 0 ? out.packed_group : repeat_group(c);
    if (out.group_size % 32 != 0 || out.group_size == 0)
        fail(where, " group_size ", out.packed_group > 0 ? out.packed_group : -1, ": the INT4 layout takes groups of a multiple of 32 columns",
             out.packed_group > 0 ? "" : " dividing every layer's input width");
}

// AutoAWQ's and AutoGPTQ/GPTQModel's quantization_config (the keys as Hugging Face writes them);
// what the loader cannot read exactly is refused here, naming the key.
QuantConfig parse_hf_quantization(const json& q, const ModelConfig& c, const std::string& origin, const std::string& method) {
    QuantConfig out;
    out.present = true;
    out.method = method == "awq" ? QuantMethod::Awq : QuantMethod::Gptq;
    const std::string where = origin + ": quantization_config";
    out.bits = int(quant_integer(q, "bits", 0, origin));
    const int64_t group = quant_integer(q, "group_size", -1, origin);
    if (out.method == QuantMethod::Awq) {
        const std::string version = quant_string(q, "version", "gemm", origin);
        std::string lower = version;
        for (char& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
        if (lower != "gemm")
            fail(where, " version \"", version, "\" is not supported (AWQ checkpoints load in AutoAWQ's \"gemm\" packing)");
        if (out.bits != 4) fail(where, " bits ", out.bits, " is not supported (AWQ checkpoints load with bits 4)");
        if (q.contains("zero_point") && !q["zero_point"].is_null() && q["zero_point"] != json(true))
            fail(where, " zero_point ", q["zero_point"].dump(), " is not supported (AWQ checkpoints load with zero points)");
    } else {
        if (out.bits != 4 && out.bits != 8)
            fail(where, " bits ", out.bits, " is not supported (GPTQ checkpoints load with bits 4 or 8)");
        const std::string format = quant_string(q, "checkpoint_format", "gptq", origin);
        if (format != "gptq" && format != "gptq_v2")
            fail(where, " checkpoint_format \"", format, "\" is not supported (gptq or gptq_v2)");
        out.zero_offset = format == "gptq" ? 1 : 0;
        if (q.value("is_marlin_format", false) == true)
            fail(where, " is_marlin_format: Marlin-packed GPTQ checkpoints are not supported");
        if (q.contains("dynamic") && !q["dynamic"].is_null() && !q["dynamic"].empty())
            fail(where, " dynamic: per-module GPTQ overrides are not supported");
        // desc_act (act-order): each layer's g_idx is read as it loads (static_groups leaves the
        // groups in column order).
        out.act_order = q.contains("desc_act") && q["desc_act"] == json(true) &&
                        !(q.contains("static_groups") && q["static_groups"] == json(true));
    }
    if (group != -1 && group <= 0) fail(where, " group_size ", group, " must be positive or -1 (one group per output channel)");
    out.packed_group = group == -1 ? 0 : group;
    set_hf_layout(out, c, false, where);
    return out;
}

// llm-compressor's compressed-tensors config: every config group must ask for the same scheme,
// symmetric integer weights (8 bits "int-quantized", 4 bits "pack-quantized") per channel, group
// or tensor, and inputs either left float or INT8 per token, dynamic (W8A8: what --weights w8a8
// computes).
QuantConfig parse_compressed_tensors(const json& q, const ModelConfig& c, const std::string& origin) {
    const std::string where = origin + ": quantization_config";
    QuantConfig out;
    out.present = true;
    out.method = QuantMethod::CompressedTensors;
    const std::string format = quant_string(q, "format", "", origin);
    if (format != "int-quantized" && format != "pack-quantized")
        fail(where, " format \"", format, "\" is not supported (compressed-tensors checkpoints load as int-quantized, "
             "pack-quantized or float-quantized)");
    auto set_but_not = [&](const json& o, const char* key, const char* what) {
        if (o.contains(key) && !o[key].is_null() && !(o[key].is_object() && o[key].empty()) && o[key] != json(false))
            fail(where, " ", key, ": ", what, " is not supported");
    };
    set_but_not(q, "kv_cache_scheme", "a quantized KV cache scheme (use --kv int8)");
    set_but_not(q, "transform_config", "a rotation transform");
    if (q.contains("sparsity_config") && q["sparsity_config"].is_object() && q["sparsity_config"].contains("format") &&
        q["sparsity_config"]["format"] != json("dense"))
        fail(where, " sparsity_config: sparse checkpoints are not supported");
    if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].empty())
        fail(where, " config_groups: missing or empty");
    bool first = true, acts = false;
    for (const auto& [name, g] : q["config_groups"].items()) {
        const std::string at = where + " config_groups." + name;
        if (!g.is_object() || !g.contains("weights") || !g["weights"].is_object()) fail(at, ".weights: missing");
        const json& w = g["weights"];
        const std::string type = w.value("type", std::string("int"));
        const int64_t bits = quant_integer(w, "num_bits", 0, origin);
        const std::string strategy = quant_string(w, "strategy", "", origin);
        if (type != "int") fail(at, ".weights type \"", type, "\" is not supported (int)");
        if (w.value("symmetric", true) != true) fail(at, ".weights symmetric false: asymmetric weights are not supported");
        if (w.value("dynamic", false) != false) fail(at, ".weights dynamic: not supported");
        // actorder: "group" writes each column's group in weight_g_idx, in an order of its own
        // (the loader sorts them); "static" and "weight" keep the groups in column order.
        if (w.contains("actorder") && w["actorder"] == json("group")) out.act_order = true;
        if (bits != (format == "pack-quantized" ? 4 : 8))
            fail(at, ".weights num_bits ", bits, " is not supported with format ", format,
                 " (int-quantized: 8, pack-quantized: 4)");
        int64_t group = 0;
        if (strategy == "group") {
            group = quant_integer(w, "group_size", 0, origin);
            if (group <= 0) fail(at, ".weights group_size must be a positive integer with strategy group");
        } else if (strategy != "channel" && strategy != "tensor") {
            fail(at, ".weights strategy \"", strategy, "\" is not supported (channel, group or tensor)");
        }
        bool a = false;
        if (g.contains("input_activations") && !g["input_activations"].is_null()) {
            const json& in = g["input_activations"];
            if (!in.is_object() || in.value("type", std::string("int")) != "int" || quant_integer(in, "num_bits", 0, origin) != 8 ||
                in.value("symmetric", true) != true || in.value("dynamic", false) != true ||
                quant_string(in, "strategy", "token", origin) != "token")
                fail(at, ".input_activations: only dynamic symmetric INT8 per token is supported (static or float "
                     "activation scales are not)");
            if (bits == 4) fail(at, ".input_activations: 4-bit weights with INT8 inputs are not supported (load W4A16 and add "
                                "--weights w4a8)");
            a = true;
        }
        set_but_not(g, "output_activations", "output activation quantization");
        if (first) {
            out.bits = int(bits);
            out.packed_group = group;
            out.per_tensor = strategy == "tensor";
            acts = a;
            first = false;
        } else if (out.bits != bits || out.packed_group != group || out.per_tensor != (strategy == "tensor") || acts != a) {
            fail(at, ": config groups with different schemes are not supported");
        }
    }
    out.zero_offset = out.bits == 4 ? 8 : 0;
    set_hf_layout(out, c, acts, where);
    return out;
}

// A [rows, cols] block size of two positive integers.
std::pair<int64_t, int64_t> block_of(const json& v, const std::string& what) {
    if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer() ||
        v[0].get<int64_t>() <= 0 || v[1].get<int64_t>() <= 0)
        fail(what, " must be two positive integers, got ", v.dump());
    return {v[0].get<int64_t>(), v[1].get<int64_t>()};
}

// Hugging Face's "quant_method": "fp8" (FineGrainedFP8: E4M3 weights, a weight_scale_inv per
// block, activations quantized dynamically, which the engine leaves float).
Fp8Weights parse_fp8(const json& q, const std::string& origin) {
    const std::string where = origin + ": quantization_config";
    const std::string fmt = quant_string(q, "fmt", "e4m3", origin);
    if (fmt != "e4m3") fail(where, " fmt \"", fmt, "\" is not supported (e4m3)");
    const std::string acts = quant_string(q, "activation_scheme", "dynamic", origin);
    if (acts != "dynamic") fail(where, " activation_scheme \"", acts, "\" is not supported (dynamic)");
    if (!q.contains("weight_block_size") || q["weight_block_size"].is_null())
        fail(where, ": FP8 without weight_block_size (one scale per tensor) is not supported");
    Fp8Weights f;
    f.present = true;
    f.scale_suffix = "_scale_inv";
    std::tie(f.block_rows, f.block_cols) = block_of(q["weight_block_size"], where + " weight_block_size");
    return f;
}

// compressed-tensors' "float-quantized": E4M3 weights with a weight_scale per channel, block or
// tensor; inputs dynamic (left float here) or none.
Fp8Weights parse_ct_fp8(const json& q, const std::string& where, const std::string& origin) {
    Fp8Weights f;
    f.present = true;
    f.scale_suffix = "_scale";
    bool first = true;
    for (const auto& [name, g] : q["config_groups"].items()) {
        const std::string at = where + " config_groups." + name;
        if (!g.is_object() || !g.contains("weights") || !g["weights"].is_object()) fail(at, ".weights: missing");
        const json& w = g["weights"];
        if (w.value("type", std::string()) != "float" || quant_integer(w, "num_bits", 0, origin) != 8)
            fail(at, ".weights: float-quantized loads 8-bit float weights (type float, num_bits 8)");
        const std::string strategy = quant_string(w, "strategy", "", origin);
        Fp8Weights g8 = f;
        if (strategy == "channel") {
            g8.block_rows = 1, g8.block_cols = 0;
        } else if (strategy == "tensor") {
            g8.block_rows = 0, g8.block_cols = 0;
        } else if (strategy == "block") {
            std::tie(g8.block_rows, g8.block_cols) = block_of(w.value("block_structure", json()), at + ".weights block_structure");
        } else {
            fail(at, ".weights strategy \"", strategy, "\" is not supported (channel, block or tensor)");
        }
        if (g.contains("input_activations") && !g["input_activations"].is_null() &&
            g["input_activations"].value("dynamic", false) != true)
            fail(at, ".input_activations: static activation scales are not supported");
        if (first) f = g8;
        else if (g8.block_rows != f.block_rows || g8.block_cols != f.block_cols)
            fail(at, ": config groups with different schemes are not supported");
        first = false;
    }
    return f;
}

QuantConfig parse_quantization_ints(const json& q, const ModelConfig& c, const std::string& origin, const std::string& method);

// Reads quantization_config into c.quant (integer formats) or c.fp8 (FP8 weights).
void parse_quantization(const json& q, ModelConfig& c, const std::string& origin) {
    if (!q.is_object()) fail(origin, ": quantization_config must be an object");
    const std::string method = quant_string(q, "quant_method", "?", origin);
    if (method == "fp8") {
        c.fp8 = parse_fp8(q, origin);
        return;
    }
    if (method == "compressed-tensors" && quant_string(q, "format", "", origin) == "float-quantized") {
        c.fp8 = parse_ct_fp8(q, origin + ": quantization_config", origin);
        return;
    }
    c.quant = parse_quantization_ints(q, c, origin, method);
}

QuantConfig parse_quantization_ints(const json& q, const ModelConfig& c, const std::string& origin, const std::string& method) {
    if (method == "awq" || method == "gptq") return parse_hf_quantization(q, c, origin, method);
    if (method == "compressed-tensors") return parse_compressed_tensors(q, c, origin);
    if (method != "shardlm")
        fail(origin, ": quantization_config quant_method \"", method,
             "\" is not supported (checkpoints quantized by shardlm quantize, AutoAWQ (awq), AutoGPTQ/GPTQModel (gptq), "
             "llm-compressor (compressed-tensors) or in FP8 (fp8) load)");
    QuantConfig out;
    out.present = true;
    out.format = quant_string(q, "format", "", origin);
    if (out.format != "int8" && out.format != "w8a8" && out.format != "int4" && out.format != "w4a8")
        fail(origin, ": quantization_config format \"", out.format, "\" is not int8, w8a8, int4 or w4a8");
    if (q.contains("group_size") && !q["group_size"].is_null() && !q["group_size"].is_number())
        fail(origin, ": key \"group_size\" must be a number, got ", q["group_size"].dump());
    out.group_size = int64_t(q.value("group_size", 0.0));
    if (q.contains("keep_fp16") && !q["keep_fp16"].is_null()) {
        if (!q["keep_fp16"].is_string()) fail(origin, ": quantization_config keep_fp16 must be a string (a regex)");
        out.keep_fp16 = q["keep_fp16"].get<std::string>();
    }
    if (out.group_size < 0 || (out.group_size > 0 && c.hidden % out.group_size != 0))
        fail(origin, ": quantization_config group_size ", out.group_size, " does not divide hidden_size");
    if ((out.format == "int4" || out.format == "w4a8") && (out.group_size <= 0 || out.group_size % 32 != 0))
        fail(origin, ": quantization_config group_size ", out.group_size, " of an ", out.format,
             " checkpoint is not a multiple of 32");
    return out;
}

}  // namespace

ModelConfig parse_config(const std::string& text, const std::string& origin) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        fail(origin, ": malformed JSON: ", e.what());
    }
    if (!j.is_object()) fail(origin, ": expected a JSON object");
    const Reader r{j, origin};
    ModelConfig c;

    if (!j.contains("architectures") || !j["architectures"].is_array() || j["architectures"].empty() ||
        !j["architectures"][0].is_string())
        fail(origin, ": missing \"architectures\" list");
    const std::string arch = j["architectures"][0].get<std::string>();
    c.architecture = arch;
    const std::pair<const char*, Arch> families[] = {
        {"Llama", Arch::Llama}, {"Mistral", Arch::Mistral}, {"Qwen2", Arch::Qwen2}, {"Qwen3", Arch::Qwen3}};
    const std::pair<const char*, Head> heads[] = {
        {"ForCausalLM", Head::CausalLM}, {"Model", Head::None}, {"ForSequenceClassification", Head::Classifier}};
    bool known = false;
    for (const auto& [family, a] : families)
        for (const auto& [suffix, h] : heads)
            if (arch == std::string(family) + suffix) c.arch = a, c.head = h, known = true;
    if (!known)
        fail(origin, ": unknown architecture \"", arch,
             "\" (supported: Llama, Mistral, Qwen2 and Qwen3 as ...ForCausalLM, ...Model or ...ForSequenceClassification)");
    if (c.head == Head::Classifier) parse_labels(j, r, c);

    c.hidden = r.positive("hidden_size");
    c.n_layers = r.positive("num_hidden_layers");
    c.n_heads = r.positive("num_attention_heads");
    c.n_kv_heads = r.has("num_key_value_heads") ? r.positive("num_key_value_heads") : c.n_heads;
    c.head_dim = r.has("head_dim") ? r.positive("head_dim") : c.hidden / c.n_heads;
    c.intermediate = r.positive("intermediate_size");
    c.vocab = r.positive("vocab_size");
    c.max_position = r.integer_or("max_position_embeddings", 0);
    if (c.max_position < 0) fail(origin, ": max_position_embeddings must be >= 0, got ", c.max_position);
    if (!r.has("head_dim") && c.hidden % c.n_heads != 0)
        fail(origin, ": hidden_size ", c.hidden, " is not a multiple of num_attention_heads ", c.n_heads);
    if (c.n_heads % c.n_kv_heads != 0)
        fail(origin, ": num_attention_heads ", c.n_heads, " is not a multiple of num_key_value_heads ", c.n_kv_heads);
    if (c.head_dim % 2 != 0) fail(origin, ": head_dim ", c.head_dim, " must be even for RoPE");

    c.rms_eps = float(r.number_or(j, "rms_norm_eps", 1e-6));
    // As floats: 1e300 is inf, which would silently zero every normalized activation.
    if (!(c.rms_eps > 0) || !std::isfinite(c.rms_eps)) fail(origin, ": rms_norm_eps must be positive and finite in float32");
    parse_rope(j, r, c);
    if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) fail(origin, ": rope_theta must be positive and finite in float32");

    if (j.contains("hidden_act") && j["hidden_act"] != "silu")
        fail(origin, ": hidden_act ", j["hidden_act"].dump(), " is not supported (silu)");
    if (j.contains("partial_rotary_factor") && r.number_or(j, "partial_rotary_factor", 1.0) != 1.0)
        fail(origin, ": partial_rotary_factor other than 1 is not supported");

    c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
    // Qwen2 configs carry no attention_bias key: its q/k/v biases come with the architecture.
    c.qkv_bias = c.arch == Arch::Qwen2 ? true : r.boolean_or("attention_bias", false);
    c.qk_norm = c.arch == Arch::Qwen3;

    // Sliding-window attention, as Hugging Face reads it: Mistral on every layer; Qwen2/Qwen3 with
    // use_sliding_window on the layers from max_window_layers on; or an explicit layer_types list,
    // which must then be full layers followed by sliding ones (the only pattern of these families).
    const bool use_sw = c.arch == Arch::Mistral || r.boolean_or("use_sliding_window", false);
    if (use_sw && r.has("sliding_window") && r.integer("sliding_window") > 0) {
        c.sliding_window = r.integer("sliding_window");
        if (c.arch != Arch::Mistral) c.window_from_layer = r.integer_or("max_window_layers", c.n_layers);
        if (c.window_from_layer < 0) fail(origin, ": max_window_layers must be >= 0");
    }
    if (c.sliding_window > 0 && r.has("layer_types")) {
        const json& t = j["layer_types"];
        if (!t.is_array() || int64_t(t.size()) != c.n_layers)
            fail(origin, ": layer_types must list the ", c.n_layers, " layers");
        int64_t first = c.n_layers;
        for (int64_t l = 0; l < c.n_layers; ++l) {
            const json& e = t[size_t(l)];
            if (!e.is_string() || (e != "sliding_attention" && e != "full_attention"))
                fail(origin, ": layer_types[", l, "] must be \"sliding_attention\" or \"full_attention\"");
            const bool sliding = e == "sliding_attention";
            if (sliding && first == c.n_layers) first = l;
            if (!sliding && first < l)
                fail(origin, ": layer_types puts a full-attention layer (", l, ") after sliding ones; not supported");
        }
        c.window_from_layer = first;
    }
    if (c.window_from_layer >= c.n_layers) c.sliding_window = c.window_from_layer = 0;  // no layer slides

    c.bos_id = r.integer_or("bos_token_id", -1);
    c.pad_id = r.integer_or("pad_token_id", -1);
    if (r.has("eos_token_id")) {
        const json& e = j["eos_token_id"];
        if (e.is_array()) {
            for (const auto& v : e) c.eos_ids.push_back(r.integer_of(v, "eos_token_id"));
        } else {
            c.eos_ids.push_back(r.integer_of(e, "eos_token_id"));
        }
    }
    c.torch_dtype = parse_torch_dtype(j, origin);
    if (j.contains("quantization_config") && !j["quantization_config"].is_null())
        parse_quantization(j["quantization_config"], c, origin);
    return c;
}

namespace {
json parse_generation_config(const std::string& text, const std::string& origin) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        fail(origin, ": not valid JSON (", e.what(), ")");
    }
    if (!j.is_object()) fail(origin, ": must be a JSON object");
    return j;
}
}  // namespace

GenerationDefaults parse_generation_defaults(const std::string& text, const std::string& origin) {
    const json j = parse_generation_config(text, origin);
    GenerationDefaults d;
    auto number = [&](const char* key, double lo, double hi, bool open_lo) -> std::optional<double> {
        if (!j.contains(key) || j[key].is_null()) return std::nullopt;
        const json& v = j[key];
        if (!v.is_number()) fail(origin, ": ", key, " must be a number, not ", v.dump());
        const double x = v.get<double>();
        if (!(open_lo ? x > lo : x >= lo) || !(x <= hi))
            fail(origin, ": ", key, " ", v.dump(), " is outside ", open_lo ? "(" : "[", lo, ", ", hi, "]");
        return x;
    };
    d.temperature = number("temperature", 0.0, 100.0, false);
    d.top_p = number("top_p", 0.0, 1.0, true);
    d.min_p = number("min_p", 0.0, 1.0, false);
    d.repetition_penalty = number("repetition_penalty", 0.01, 100.0, false);
    if (j.contains("top_k") && !j["top_k"].is_null()) {
        if (!j["top_k"].is_number_integer() || j["top_k"].get<int64_t>() < -1)
            fail(origin, ": top_k must be an integer of -1 or more, not ", j["top_k"].dump());
        d.top_k = j["top_k"].get<int64_t>();
    }
    return d;
}

void add_generation_eos(ModelConfig& c, const std::string& text, const std::string& origin) {
    const json j = parse_generation_config(text, origin);
    if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return;
    const json& e = j["eos_token_id"];
    for (const json& v : e.is_array() ? e : json::array({e})) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.vocab)
            fail(origin, ": eos_token_id ", v.dump(), " is not a token id below vocab_size ", c.vocab);
        if (!is_eos_id(c, v.get<int64_t>())) c.eos_ids.push_back(v.get<int64_t>());
    }
}

ModelConfig load_config(const std::string& model_dir) {
    const std::string path = model_dir + "/config.json";
    if (!file_exists(path)) fail(path, ": not found (is --model a Hugging Face checkpoint folder?)");
    ModelConfig c = parse_config(read_text_file(path), path);
    const std::string gen = model_dir + "/generation_config.json";
    if (file_exists(gen)) add_generation_eos(c, read_text_file(gen), gen);
    return c;
}

bool is_eos_id(const ModelConfig& c, int64_t id) {
    return std::find(c.eos_ids.begin(), c.eos_ids.end(), id) != c.eos_ids.end();
}

int64_t parameter_count(const ModelConfig& c) { return shard_parameter_count(c, plan_shard(c, 0, 1)); }

}  // namespace shardlm
