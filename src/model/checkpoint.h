// A Hugging Face checkpoint folder: config.json plus model.safetensors, or shards listed by
// model.safetensors.index.json ({"weight_map": {tensor name: file name}}).
// A checkpoint saved from the base model class (e.g. Qwen3Model) names its tensors without the
// "model." prefix ("embed_tokens.weight", "layers.0. ..."); it is indexed under the prefixed names
// the loader uses, with TensorInfo::name still the file's own name.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace shardlm {

class Checkpoint {
public:
    explicit Checkpoint(const std::string& dir);  // maps every file; throws Error

    const std::string& dir() const { return dir_; }
    // The tensor or nullptr.
    const TensorInfo* find(const std::string& name) const;
    // The tensor, or an Error naming it and the checkpoint folder.
    const TensorInfo& get(const std::string& name) const;
    // Every tensor by name (alignment padding excluded).
    const std::map<std::string, const TensorInfo*>& tensors() const { return index_; }
    // Whether the file's names lacked "model." and were given it here.
    bool prefixed() const { return prefixed_; }
    size_t file_count() const { return files_.size(); }
    size_t total_bytes() const;

private:
    std::string dir_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, const TensorInfo*> index_;
    bool prefixed_ = false;
};

}  // namespace shardlm
