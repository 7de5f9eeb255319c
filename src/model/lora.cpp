#include "model/lora.h"

#include <sys/stat.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "core/mmap_file.h"
#include "kernels/cpu/weights_view.h"

namespace shardlm {

namespace {

using json = nlohmann::json;

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What adapter_config.json says about one adapter.
struct AdapterConfig {
    int64_t r = 0;
    double alpha = 8;  // PEFT's default lora_alpha
    bool rslora = false;
    // rank_pattern / alpha_pattern: PEFT's get_pattern_key, the first key p (in the file's order)
    // for which the module name matches (.*\.)?(p)$ from its start.
    std::vector<std::pair<std::regex, int64_t>> rank_pattern;
    std::vector<std::pair<std::regex, double>> alpha_pattern;
    std::string origin;  // ".../adapter_config.json"

    int64_t rank_of(const std::string& module) const {
        for (const auto& [re, v] : rank_pattern)
            if (std::regex_match(module, re)) return v;
        return r;
    }
    double alpha_of(const std::string& module) const {
        for (const auto& [re, v] : alpha_pattern)
            if (std::regex_match(module, re)) return v;
        return alpha;
    }
};

std::regex pattern_regex(const std::string& key, const std::string& origin, const char* what) {
    try {
        return std::regex("(.*\\.)?(" + key + ")", std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
        fail(origin, ": ", what, " key \"", key, "\" is not a valid regex: ", e.what());
    }
}

AdapterConfig read_adapter_config(const std::string& dir) {
    AdapterConfig a;
    a.origin = dir + "/adapter_config.json";
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        fail("LoRA adapter ", dir, ": not a folder (expected the folder PEFT's save_pretrained writes)");
    if (!file_exists(a.origin))
        fail("LoRA adapter ", dir, ": no adapter_config.json (expected the folder PEFT's save_pretrained writes)");
    json j;
    try {
        j = json::parse(read_text_file(a.origin));
    } catch (const json::exception& e) {
        fail(a.origin, ": malformed JSON: ", e.what());
    }
    if (!j.is_object()) fail(a.origin, ": expected a JSON object");
    auto has = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
    auto boolean = [&](const char* k) {
        if (!has(k)) return false;
        if (!j[k].is_boolean()) fail(a.origin, ": \"", k, "\" must be true or false");
        return j[k].get<bool>();
    };
    if (!has("peft_type") || !j["peft_type"].is_string()) fail(a.origin, ": no \"peft_type\" (not a PEFT adapter config)");
    const std::string type = j["peft_type"].get<std::string>();
    if (type != "LORA") fail(a.origin, ": peft_type \"", type, "\" is not supported (only LORA adapters merge)");
    if (!has("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() < 1)
        fail(a.origin, ": \"r\" must be a positive integer");
    a.r = j["r"].get<int64_t>();
    if (has("lora_alpha")) {
        if (!j["lora_alpha"].is_number()) fail(a.origin, ": \"lora_alpha\" must be a number");
        a.alpha = j["lora_alpha"].get<double>();
    }
    a.rslora = boolean("use_rslora");
    // What a merge into the base weights cannot express.
    if (boolean("use_dora")) fail(a.origin, ": DoRA adapters (use_dora) are not supported");
    if (boolean("fan_in_fan_out")) fail(a.origin, ": fan_in_fan_out adapters (GPT-2's Conv1D layout) are not supported");
    if (boolean("lora_bias")) fail(a.origin, ": adapters with a trained lora_B bias (lora_bias) are not supported");
    if (has("bias") && j["bias"] != "none")
        fail(a.origin, ": bias ", j["bias"].dump(), ": adapters that train the base model's biases are not supported (only \"none\")");
    auto refuse_nonempty = [&](const char* k, const char* why) {
        if (has(k) && !(j[k].is_array() && j[k].empty()) && !(j[k].is_object() && j[k].empty()))
            fail(a.origin, ": \"", k, "\" ", j[k].dump(), ": ", why);
    };
    refuse_nonempty("modules_to_save", "whole modules saved with the adapter are not supported");
    refuse_nonempty("layer_replication", "layer replication is not supported");
    refuse_nonempty("trainable_token_indices", "trainable tokens are not supported");
    refuse_nonempty("target_parameters", "adapters on parameters (not modules) are not supported");
    refuse_nonempty("alora_invocation_tokens", "activated LoRA applies after its invocation tokens only; it cannot be merged");
    for (const char* k : {"rank_pattern", "alpha_pattern"}) {
        if (!has(k)) continue;
        if (!j[k].is_object()) fail(a.origin, ": \"", k, "\" must be an object");
        for (const auto& [key, v] : j[k].items()) {
            if (k[0] == 'r') {
                if (!v.is_number_integer() || v.get<int64_t>() < 1)
                    fail(a.origin, ": rank_pattern \"", key, "\" must be a positive integer");
                a.rank_pattern.emplace_back(pattern_regex(key, a.origin, k), v.get<int64_t>());
            } else {
                if (!v.is_number()) fail(a.origin, ": alpha_pattern \"", key, "\" must be a number");
                a.alpha_pattern.emplace_back(pattern_regex(key, a.origin, k), v.get<double>());
            }
        }
    }
    return a;
}

// Whether `module` (a base tensor's name without ".weight") is one a LoRA can target here, and
// whether it is the embedding.
bool linear_module(const std::string& module) {
    static const std::regex re(
        "model\\.layers\\.[0-9]+\\.(self_attn\\.(q|k|v|o)_proj|mlp\\.(gate|up|down)_proj)|lm_head");
    return std::regex_match(module, re);
}

// The [rows, cols] of a target matrix as the config shapes it (whatever the checkpoint stores:
// packed INT4 or a Hub format's qweight), or {-1, -1} for a layer the model does not have.
std::pair<int64_t, int64_t> module_shape(const ModelConfig& c, const std::string& module) {
    if (module == "lm_head" || module == "model.embed_tokens") return {c.vocab, c.hidden};
    static const std::regex re("model\\.layers\\.([0-9]+)\\.(self_attn|mlp)\\.([a-z]+)_proj");
    std::smatch m;
    if (!std::regex_match(module, m, re) || m[1].length() > 9 || std::stoll(m[1]) >= c.n_layers) return {-1, -1};
    const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
    const std::string p = m[3];
    if (p == "q") return {q, c.hidden};
    if (p == "k" || p == "v") return {kv, c.hidden};
    if (p == "o") return {c.hidden, q};
    if (p == "down") return {c.hidden, c.intermediate};
    return {c.intermediate, c.hidden};  // gate, up
}

std::vector<float> to_f32(const TensorInfo& t) {
    std::vector<float> v(size_t(t.numel()));
    values_to_f32(t.dtype, t.data, t.numel(), v.data());
    return v;
}

}  // namespace

void LoraDelta::add_row(int64_t r, int64_t c0, int64_t c1, float* out) const {
    const float* l = left.data() + r * rank;
    for (int64_t k = 0; k < rank; ++k) {
        const float a = l[k];
        const float* x = right.data() + k * cols + c0;
        for (int64_t i = 0; i < c1 - c0; ++i) out[i] += a * x[i];
    }
}

LoraSet::LoraSet(const std::vector<LoraAdapter>& adapters, const Checkpoint& base, const ModelConfig& cfg) {
    static const std::string kPrefix = "base_model.model.";
    struct Suffix {
        const char* text;
        bool embedding, is_a;
    };
    static const Suffix kSuffixes[] = {{".lora_A.weight", false, true},
                                       {".lora_B.weight", false, false},
                                       {".lora_embedding_A", true, true},
                                       {".lora_embedding_B", true, false}};
    for (const LoraAdapter& ad : adapters) {
        if (!std::isfinite(ad.scale)) fail("--lora-scale of ", ad.dir, " is not a finite number");
        const AdapterConfig ac = read_adapter_config(ad.dir);
        const std::string path = ad.dir + "/adapter_model.safetensors";
        if (!file_exists(path)) {
            if (file_exists(ad.dir + "/adapter_model.bin"))
                fail(ad.dir, ": adapter_model.bin (a PyTorch pickle) is not read; save the adapter as safetensors "
                     "(PEFT's save_pretrained does by default)");
            fail(ad.dir, ": no adapter_model.safetensors");
        }
        files_.push_back(std::make_unique<SafetensorsFile>(path));
        const SafetensorsFile& f = *files_.back();
        // Each module's A and B, found by name.
        std::map<std::string, LoraFactors> found;
        for (const auto& [name, t] : f.tensors()) {
            if (name.rfind("__pad_", 0) == 0) continue;
            const Suffix* sx = nullptr;
            for (const Suffix& s : kSuffixes)
                if (ends_with(name, s.text)) sx = &s;
            if (name.rfind(kPrefix, 0) != 0 || !sx) {
                const bool dora = name.find("lora_magnitude_vector") != std::string::npos;
                fail(path, ": tensor ", name, " is not a LoRA factor this loader merges",
                     dora ? " (a DoRA magnitude)" : "", " (expected base_model.model.<module>.lora_A.weight / lora_B.weight)");
            }
            const std::string module = name.substr(kPrefix.size(), name.size() - kPrefix.size() - std::string(sx->text).size());
            const bool is_embed = module == "model.embed_tokens";
            if (sx->embedding != is_embed || !(is_embed || linear_module(module)))
                fail(path, ": tensor ", name, ": ", module,
                     " is not a module this loader merges into (the layers' q/k/v/o and gate/up/down projections, "
                     "lm_head, and the embedding's lora_embedding_A/B)");
            if ((is_embed || module == "lm_head") && cfg.tie_embeddings)
                fail(path, ": tensor ", name, ": the base model ties its embedding and lm_head, and merging an adapter of one "
                     "into the shared matrix would change both; not supported");
            const std::string target = module + ".weight";
            if (module_shape(cfg, module).first < 0)
                fail(path, ": tensor ", name, ": the base model ", base.dir(), " has no ", target,
                     " (an adapter for another model?)");
            if (!t.dtype_known || (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16))
                fail(path, ": tensor ", name, " has dtype ", t.dtype_str, " (expected F32, F16 or BF16)");
            LoraFactors& fac = found[target];
            fac.adapter = ad.dir;
            fac.embedding = is_embed;
            (sx->is_a ? fac.a : fac.b) = &t;
        }
        if (found.empty()) fail(path, ": no LoRA factors (lora_A / lora_B tensors)");
        for (auto& [target, fac] : found) {
            const std::string module = target.substr(0, target.size() - 7);
            const char* a_name = fac.embedding ? "lora_embedding_A" : "lora_A";
            const char* b_name = fac.embedding ? "lora_embedding_B" : "lora_B";
            if (!fac.a || !fac.b)
                fail(path, ": ", module, " has ", fac.a ? a_name : b_name, " but no ", fac.a ? b_name : a_name);
            // The layers' matrices as the config shapes them (a pre-quantized base stores them
            // packed or as a Hub format's qweight); the vocabulary matrices as stored (a padded vocabulary).
            auto [rows, cols] = module_shape(cfg, module);
            const TensorInfo* stored = base.find(target);
            if ((fac.embedding || module == "lm_head") && stored && stored->shape.size() == 2) {
                rows = stored->shape[0];
                cols = stored->shape[1];
            }
            const int64_t rank = ac.rank_of(module);
            // Linear: W [out, in] += B [out, r] A [r, in]. Embedding: E [vocab, hidden] += (B [hidden, r] A [r, vocab])^T.
            const std::vector<int64_t> want_a = fac.embedding ? std::vector<int64_t>{rank, rows} : std::vector<int64_t>{rank, cols};
            const std::vector<int64_t> want_b = fac.embedding ? std::vector<int64_t>{cols, rank} : std::vector<int64_t>{rows, rank};
            auto check = [&](const TensorInfo* t, const std::vector<int64_t>& want) {
                if (t->shape == want) return;
                TensorInfo shape;
                shape.shape = want;
                fail(path, ": tensor ", t->name, " has shape ", t->shape_str(), ", expected ", shape.shape_str(), " (rank ", rank,
                     " from ", ac.origin, ", the base model's ", target, " [", rows, ", ", cols, "])");
            };
            check(fac.a, want_a);
            check(fac.b, want_b);
            fac.rank = rank;
            const double alpha = ac.alpha_of(module);
            fac.scale = float(double(ad.scale) * alpha / (ac.rslora ? std::sqrt(double(rank)) : double(rank)));
            by_tensor_[target].push_back(fac);
        }
    }
}

const std::vector<LoraFactors>* LoraSet::find(const std::string& name) const {
    auto it = by_tensor_.find(name);
    return it == by_tensor_.end() ? nullptr : &it->second;
}

std::vector<std::string> LoraSet::targets() const {
    std::vector<std::string> v;
    for (const auto& [name, f] : by_tensor_) v.push_back(name);
    return v;
}

LoraDelta LoraSet::delta(const std::string& name, int64_t rows, int64_t cols) const {
    const std::vector<LoraFactors>* fs = find(name);
    SHARDLM_CHECK(fs, "LoraSet::delta: no factors for ", name);
    LoraDelta d;
    d.rows = rows;
    d.cols = cols;
    for (const LoraFactors& f : *fs) d.rank += f.rank;
    d.left.assign(size_t(rows * d.rank), 0.0f);
    d.right.assign(size_t(d.rank * cols), 0.0f);
    int64_t k0 = 0;
    for (const LoraFactors& f : *fs) {
        const std::vector<float> a = to_f32(*f.a), b = to_f32(*f.b);
        const int64_t r = f.rank;
        for (int64_t k = 0; k < r; ++k) {
            for (int64_t i = 0; i < rows; ++i)  // left: B [rows, r] (embedding: A^T)
                d.left[size_t(i * d.rank + k0 + k)] = f.scale * (f.embedding ? a[size_t(k * rows + i)] : b[size_t(i * r + k)]);
            for (int64_t c = 0; c < cols; ++c)  // right: A [r, cols] (embedding: B^T)
                d.right[size_t((k0 + k) * cols + c)] = f.embedding ? b[size_t(c * r + k)] : a[size_t(k * cols + c)];
        }
        k0 += r;
    }
    return d;
}

}  // namespace shardlm
