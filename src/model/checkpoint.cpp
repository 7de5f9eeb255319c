#include "model/checkpoint.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"

namespace shardlm {

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
    const std::string index_path = dir + "/model.safetensors.index.json";
    std::vector<std::string> names;
    std::map<std::string, std::string> weight_map;  // tensor -> file, when sharded
    if (file_exists(index_path)) {
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(read_text_file(index_path));
        } catch (const nlohmann::json::exception& e) {
            fail(index_path, ": malformed JSON: ", e.what());
        }
        if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
            fail(index_path, ": missing \"weight_map\" object");
        std::set<std::string> files;
        for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
            if (!it.value().is_string()) fail(index_path, ": weight_map entry ", it.key(), " is not a file name");
            const std::string f = it.value().get<std::string>();
            if (f.empty() || f.find('/') != std::string::npos || f == "..")
                fail(index_path, ": weight_map entry ", it.key(), " names an invalid file \"", f, "\"");
            weight_map[it.key()] = f;
            files.insert(f);
        }
        names.assign(files.begin(), files.end());
    } else if (file_exists(dir + "/model.safetensors")) {
        names.push_back("model.safetensors");
    } else {
        fail(dir, ": no model.safetensors or model.safetensors.index.json");
    }
    std::map<std::string, const SafetensorsFile*> by_name;
    for (const auto& n : names) {
        files_.push_back(std::make_unique<SafetensorsFile>(dir + "/" + n));
        by_name[n] = files_.back().get();
    }
    for (const auto& f : files_) {
        for (const auto& kv : f->tensors()) {
            if (kv.first.rfind("__pad_", 0) == 0) continue;  // alignment padding (safetensors_writer.h)
            auto ins = index_.emplace(kv.first, &kv.second);
            if (!ins.second)
                fail(dir, ": tensor ", kv.first, " appears in both ", ins.first->second->file, " and ", f->path());
        }
    }
    // The index must not promise tensors that its files do not hold.
    for (const auto& kv : weight_map) {
        const TensorInfo* t = by_name[kv.second]->find(kv.first);
        if (!t) fail(index_path, ": tensor ", kv.first, " is mapped to ", kv.second, " which does not contain it");
    }
    // Saved from the base model class (Qwen3Model, LlamaModel): no "model." on any name. Index them
    // as the causal-LM class names them, which is what the loader looks up.
    const bool any_prefixed = std::any_of(index_.begin(), index_.end(),
                                          [](const auto& kv) { return kv.first.rfind("model.", 0) == 0; });
    if (!any_prefixed && index_.count("embed_tokens.weight")) {
        std::map<std::string, const TensorInfo*> renamed;
        for (const auto& kv : index_) renamed.emplace("model." + kv.first, kv.second);
        index_.swap(renamed);
        prefixed_ = true;
    }
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : it->second;
}

const TensorInfo& Checkpoint::get(const std::string& name) const {
    const TensorInfo* t = find(name);
    if (!t && prefixed_ && name.rfind("model.", 0) == 0)  // name it as the files would, not by a name they never use
        fail(dir_, ": missing tensor ", name.substr(6), " (", name, "; this checkpoint's tensor names lack the \"model.\" prefix)");
    if (!t) fail(dir_, ": missing tensor ", name);
    return *t;
}

size_t Checkpoint::total_bytes() const {
    size_t n = 0;
    for (const auto& kv : index_) n += kv.second->nbytes;
    return n;
}

}  // namespace shardlm
