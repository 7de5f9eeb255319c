// Hugging Face pre-quantized checkpoints as the tools write them, for the tests: AutoAWQ's GEMM
// packing, AutoGPTQ/GPTQModel's 4 and 8 bits (act-order too) and llm-compressor's
// compressed-tensors. Each layer's truth (codes, zero points, 16-bit scales, groups) is drawn at
// random and packed as the tools do (the packing written here from the tools' description: AWQ's
// order map [0, 2, 4, 6, 1, 3, 5, 7], GPTQ's columns along a word, zero points less one in
// AutoGPTQ's format, compressed-tensors' rows of words holding the signed values plus 8), beside an
// FP32 checkpoint of the same model holding W = (q - z) * s.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors_writer.h"

namespace shardlm::test {

struct HfQuantCase {
    std::string method;  // "awq", "gptq" or "ct" (compressed-tensors)
    int bits = 4;
    int64_t group = 32;  // -1: one group per output channel; -2 (ct): one scale for the tensor
    std::string format = "gptq";  // GPTQ's checkpoint_format
    bool acts = false;            // ct: INT8 inputs per token (W8A8)
    // gptq and ct: act-order (desc_act; actorder "group"): the groups gather the columns in a
    // random order of their own, g_idx saying which group each column is in. One order for the
    // layers of one input (q/k/v, gate/up), as GPTQ's (the order of the input's Hessian diagonal);
    // `orders_apart`: each layer its own.
    bool act_order = false;
    bool orders_apart = false;
    std::string name() const {
        return method + std::to_string(bits) + "_g" + (group == -1 ? "ch" : group == -2 ? "tensor" : std::to_string(group)) +
               (method == "gptq" ? "_" + format : "") + (acts ? "_a8" : "") + (act_order ? "_act" : "") +
               (orders_apart ? "_apart" : "");
    }
};

// One layer [rows, cols] as the tool quantized it.
struct HfQuantTruth {
    int64_t rows = 0, cols = 0, group = 0;
    std::vector<uint32_t> q;  // [rows, cols]
    std::vector<uint32_t> z;  // [groups, rows]
    std::vector<float> s;     // [groups, rows], each exact in the file's 16 bits
    std::vector<uint32_t> g_idx;  // [cols]: each column's group
    float w(int64_t r, int64_t c) const {
        const size_t k = size_t(g_idx[size_t(c)] * rows + r);
        return (float(q[size_t(r * cols + c)]) - float(z[k])) * s[k];
    }
};

// Little-endian int32 words, and 16-bit floats (bf16 or f16) of v, as tensors.
TensorToWrite words(const std::string& name, std::vector<int64_t> shape, const std::vector<uint32_t>& w);
TensorToWrite sixteen(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v, bool bf16);

// A layer's Linear weight (what the tools quantize), not a norm, bias, embedding or lm_head.
bool is_linear_weight(const std::string& name);

// `hf`: the checkpoint of cfg's synthetic model (seeded by `seed`) as the tool writes it (the
// embedding, norms, biases and lm_head in fp16 as a float checkpoint has them; `edit` may change
// its config.json); `ref`: an FP32 checkpoint of the same model with W = (q - z) * s. Returns each
// layer's truth by its weight's name.
std::map<std::string, HfQuantTruth> write_pair(const ModelConfig& cfg, const HfQuantCase& cs, const std::string& hf,
                                               const std::string& ref, uint64_t seed,
                                               const std::function<void(nlohmann::json&)>& edit = {});

}  // namespace shardlm::test
