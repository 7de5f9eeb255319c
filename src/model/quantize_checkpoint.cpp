#include "model/quantize_checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"
#include "model/checkpoint.h"
#include "model/safetensors_writer.h"
#include "model/shard.h"

namespace shardlm {

namespace {

TensorToWrite copy_tensor(const std::string& name, const TensorInfo& t) {
    return {name, t.dtype_str, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)};
}

}  // namespace

void check_quantize(const std::string& src, const std::string& out, const LoadOptions& opt) {
    if (!is_quantized(opt.format)) fail("--weights: quantize writes int8, w8a8, int4 or w4a8, not ", weight_format_name(opt.format));
    if (load_config(src).quant.present) fail(src, ": already pre-quantized");
    // refuse to mix with an older checkpoint's shards, or to overwrite the source (--out = --model)
    if (file_exists(out + "/config.json")) fail(out, ": already holds a checkpoint; choose an empty folder");
    // A folder that cannot be created or written into, found before the load, not after it.
    const std::string why = unwritable_reason(out, true);
    if (!why.empty()) fail("--out ", out, ": cannot create or write this folder: ", why);
}

void write_quantized_checkpoint(const std::string& src, const std::string& out, const LoadOptions& opt, size_t shard_bytes) {
    check_quantize(src, out, opt);  // before the load (the whole model, quantized)
    const ModelConfig cfg = load_config(src);
    const Checkpoint ck(src);
    LoadOptions lo = opt;
    lo.headless_ok = true;  // an embedding or classification checkpoint quantizes as it is (no lm_head)
    const ModelWeights w = load_weights(ck, cfg, lo, plan_shard(cfg, 0, 1));
    if (::mkdir(out.c_str(), 0755) != 0 && errno != EEXIST) fail(out, ": cannot create: ", std::strerror(errno));

    // The quantized views by name; every other tensor is copied from the source.
    std::map<std::string, WeightView> quantized;
    auto note = [&](const Linear& l) {
        if (l.w.quantized()) quantized[l.name] = l.w;
    };
    for (const auto& L : w.layers)
        for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) note(*l);
    if (w.lm_head.dtype == DType::I8)
        quantized[cfg.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"] = w.lm_head;

    // Tensors that channel scales (AWQ) or LoRA adapters changed and that are not quantized: norm
    // weights, biases (in F32), Linear matrices kept in 16 bits and an untied embedding (in the
    // dtype they are held in). They are written as loaded.
    std::map<std::string, TensorToWrite> rescaled;
    auto scaled = [&](const std::string& n) { return opt.scales.in.count(n) || opt.scales.out.count(n); };
    std::set<std::string> merged;
    if (!opt.lora.empty())
        for (const std::string& t : LoraSet(opt.lora, ck, cfg).targets()) merged.insert(t);
    auto as_loaded = [&](const std::string& n, const WeightView& v) {  // a float matrix, in the dtype it is held in
        const char* dt = v.dtype == DType::F32 ? "F32" : v.dtype == DType::F16 ? "F16" : "BF16";
        const uint8_t* b = static_cast<const uint8_t*>(v.data);
        rescaled[n] = {n, dt, {v.rows, v.cols}, std::vector<uint8_t>(b, b + size_t(v.rows * weight_row_bytes(v)))};
    };
    auto vec = [&](const std::string& n, const std::vector<float>& v) {
        if (!scaled(n)) return;
        const uint8_t* b = reinterpret_cast<const uint8_t*>(v.data());
        rescaled[n] = {n, "F32", {int64_t(v.size())}, std::vector<uint8_t>(b, b + v.size() * 4)};
    };
    for (int64_t i = 0; i < int64_t(w.layers.size()); ++i) {
        const auto& L = w.layers[size_t(i)];
        const std::string pre = "model.layers." + std::to_string(i);
        vec(pre + ".input_layernorm.weight", L.input_norm);
        vec(pre + ".post_attention_layernorm.weight", L.post_attn_norm);
        for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) {
            if (!l->bias.empty()) vec(l->name.substr(0, l->name.size() - 7) + ".bias", l->bias);
            if (!l->w.quantized() && (scaled(l->name) || merged.count(l->name))) as_loaded(l->name, l->w);
        }
    }
    if (!cfg.tie_embeddings) {  // a tied vocabulary matrix takes no adapter (model/lora.h)
        if (merged.count("model.embed_tokens.weight")) as_loaded("model.embed_tokens.weight", w.embed);
        if (!w.lm_head.quantized() && merged.count("lm_head.weight")) as_loaded("lm_head.weight", w.lm_head);
    }

    // Tensors in checkpoint order (sorted by name within each source file), grouped into shards.
    std::vector<std::vector<TensorToWrite>> files(1);
    size_t in_file = 0;
    auto add = [&](TensorToWrite t) {
        if (in_file > 0 && in_file + t.bytes.size() > shard_bytes) {
            files.emplace_back();
            in_file = 0;
        }
        in_file += t.bytes.size();
        files.back().push_back(std::move(t));
    };
    // Every tensor the source holds, under the names the loader uses (a base-model checkpoint's
    // gain "model.": the output is a causal-LM checkpoint).
    std::vector<std::string> names;
    for (const auto& kv : ck.tensors()) names.push_back(kv.first);
    for (const auto& name : names) {
        if (name.rfind("__pad_", 0) == 0) continue;
        if (cfg.tie_embeddings && name == "lm_head.weight") continue;  // the embedding is the truth
        auto q = quantized.find(name);
        if (q == quantized.end()) {
            auto r = rescaled.find(name);
            add(r != rescaled.end() ? std::move(r->second) : copy_tensor(name, ck.get(name)));
            continue;
        }
        const WeightView& v = q->second;
        const int64_t groups = v.cols / v.group_size;
        const uint8_t* qd = static_cast<const uint8_t*>(v.data);
        const bool i4 = v.dtype == DType::I4;
        const int64_t row_bytes = weight_row_bytes(v);
        add({name, i4 ? "U8" : "I8", {v.rows, row_bytes}, std::vector<uint8_t>(qd, qd + v.rows * row_bytes)});
        auto floats = [&](const std::string& n, const float* p) {
            const uint8_t* b = reinterpret_cast<const uint8_t*>(p);
            add({n, "F32", {v.rows, groups}, std::vector<uint8_t>(b, b + size_t(v.rows * groups) * 4)});
        };
        floats(name + "_scale", v.scales);
        if (i4) floats(name + "_min", v.mins);
    }
    nlohmann::ordered_json index;
    index["metadata"] = {{"quantized_by", "shardlm"}};
    index["weight_map"] = nlohmann::ordered_json::object();
    for (size_t i = 0; i < files.size(); ++i) {
        char fname[64];
        std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", i + 1, files.size());
        const std::string name = files.size() == 1 ? "model.safetensors" : fname;
        write_safetensors(out + "/" + name, files[i], /*align_tensors=*/true);
        for (const auto& t : files[i]) index["weight_map"][t.name] = name;
    }
    if (files.size() > 1) {
        std::ofstream f(out + "/model.safetensors.index.json");
        f << index.dump(2) << "\n";
        if (!f) fail(out, ": cannot write model.safetensors.index.json");
    }

    auto j = nlohmann::ordered_json::parse(read_text_file(src + "/config.json"));
    j["quantization_config"] = {{"quant_method", "shardlm"},
                                {"format", weight_format_name(opt.format)},
                                {"group_size", w.group_size},
                                {"keep_fp16", opt.keep_fp16}};
    {
        std::ofstream f(out + "/config.json");
        f << j.dump(2) << "\n";
        if (!f) fail(out, ": cannot write config.json");
    }
    // Side files (tokenizer, generation config, ...): everything but weights, index and config.
    if (DIR* d = ::opendir(src.c_str())) {
        while (dirent* e = ::readdir(d)) {
            const std::string n = e->d_name;
            const bool weights = n.size() > 12 && n.substr(n.size() - 12) == ".safetensors";
            if (n == "." || n == ".." || weights || n == "config.json" || n == "model.safetensors.index.json") continue;
            // sentence-transformers' module folders (1_Pooling/config.json): how an embedding
            // model pools (runtime/embed.h).
            if (file_exists(src + "/" + n + "/config.json")) {
                ::mkdir((out + "/" + n).c_str(), 0755);
                std::ofstream f(out + "/" + n + "/config.json", std::ios::binary);
                f << read_text_file(src + "/" + n + "/config.json");
                if (!f) fail(out, ": cannot write ", n, "/config.json");
                continue;
            }
            if (!file_exists(src + "/" + n)) continue;
            std::ofstream f(out + "/" + n, std::ios::binary);
            f << read_text_file(src + "/" + n);
        }
        ::closedir(d);
    }
}

}  // namespace shardlm
