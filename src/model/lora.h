// LoRA adapters merged into the base model's weights as they load (llama.cpp's --lora, PEFT's
// merge_and_unload). An adapter is the folder PEFT's save_pretrained writes:
//   adapter_config.json        {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "use_rslora": false,
//                               "rank_pattern": {...}, "alpha_pattern": {...}, ...}
//   adapter_model.safetensors  base_model.model.<module>.lora_A.weight  [r, in]
//                              base_model.model.<module>.lora_B.weight  [out, r]
//                              (an embedding: <module>.lora_embedding_A [r, vocab], lora_embedding_B [hidden, r])
// and a Linear module's weight becomes W + s * (alpha / r) * B A (alpha / sqrt(r) under rslora),
// s the user's scale; an embedding's E + s * (alpha / r) * (B A)^T. Several adapters add up.
//
// The sum is made in f32 on each row as the loader reads it (model/weights.cpp), before any
// channel scaling or quantization: an INT8/INT4 load quantizes the merged weights, as quantizing
// a merged checkpoint would. What PEFT can save but a merge here cannot express is refused by
// name: DoRA, other PEFT methods, trained biases, modules_to_save (whole replaced modules, often
// a resized vocabulary), fan_in_fan_out, layer replication, and an adapter on the vocabulary
// matrix of a model whose embedding and lm_head are tied (the merge would change both).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace shardlm {

// One adapter as the command line names it (--lora DIR, --lora-scale S).
struct LoraAdapter {
    std::string dir;
    float scale = 1.0f;
};

// One adapter's factors of one base tensor.
struct LoraFactors {
    std::string adapter;  // its folder, for messages
    const TensorInfo* a = nullptr;  // lora_A [r, in] (embedding: lora_embedding_A [r, vocab])
    const TensorInfo* b = nullptr;  // lora_B [out, r] (embedding: lora_embedding_B [hidden, r])
    bool embedding = false;
    int64_t rank = 0;
    float scale = 0;  // alpha / r (or / sqrt(r)) times the adapter's scale
};

// The delta of one [rows, cols] tensor, every adapter's factors side by side in f32: row r of the
// delta is sum_k left[r, k] * right[k, :], the scales folded into `left`.
struct LoraDelta {
    int64_t rows = 0, cols = 0, rank = 0;  // rank: the adapters' ranks summed
    std::vector<float> left;               // [rows, rank]
    std::vector<float> right;              // [rank, cols]
    // out[0 .. c1 - c0) += columns [c0, c1) of row r (full-tensor coordinates).
    void add_row(int64_t r, int64_t c0, int64_t c1, float* out) const;
};

// The adapters of one load, opened and checked against the base model: every factor's tensors
// present, in F32/F16/BF16, with the shapes of the base tensor and of the rank the adapter's
// config gives its module. Throws Error naming the adapter folder, the file or the tensor.
class LoraSet {
public:
    LoraSet(const std::vector<LoraAdapter>& adapters, const Checkpoint& base, const ModelConfig& cfg);

    bool empty() const { return by_tensor_.empty(); }
    // The factors merged into base tensor `name` (e.g. "model.layers.0.self_attn.q_proj.weight"), or nullptr.
    const std::vector<LoraFactors>* find(const std::string& name) const;
    // f32 factors of base tensor `name` [rows, cols] (which find() must know).
    LoraDelta delta(const std::string& name, int64_t rows, int64_t cols) const;
    // Base tensor names with factors, for the loader's check that it merged every one.
    std::vector<std::string> targets() const;

private:
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, std::vector<LoraFactors>> by_tensor_;
};

}  // namespace shardlm
