// The model's weights in memory, as the kernels read them. Matrices either point straight into the
// checkpoint's memory map (dtype kept, aligned) or into buffers owned here (converted on load).
// Norm weights and biases are always f32: they are tiny and the math on them is FP32.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "kernels/cpu/weights_view.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/shard.h"

namespace shardlm {

// What precision to keep Linear/embedding matrices in. Auto keeps each tensor's checkpoint dtype.
enum class WeightFormat { Auto, F32, F16, BF16 };

WeightFormat parse_weight_format(const std::string& s);  // throws Error naming --weights
const char* weight_format_name(WeightFormat f);

struct Linear {
    WeightView w;  // [out, in]
    std::vector<float> bias;  // empty when the layer has none
    const float* bias_ptr() const { return bias.empty() ? nullptr : bias.data(); }
};

struct LayerWeights {
    std::vector<float> input_norm, post_attn_norm;  // [hidden]
    std::vector<float> q_norm, k_norm;              // [head_dim], Qwen3 only
    Linear q, k, v, o;                              // q [n_heads*hd, hidden], k/v [n_kv*hd, hidden], o [hidden, n_heads*hd]
    Linear gate, up, down;                          // gate/up [inter, hidden], down [hidden, inter]
};

// Shapes below are this rank's slices (see model/shard.h); with one rank, the whole model.
struct ModelWeights {
    ShardPlan plan;
    WeightView embed;    // [n_vocab, hidden]: vocabulary rows vocab0 ..
    WeightView lm_head;  // [n_vocab, hidden]; the embedding itself when tied
    std::vector<float> final_norm;
    std::vector<LayerWeights> layers;
    size_t bytes = 0;         // bytes of all matrices and vectors as held (mapped + owned)
    std::vector<Buffer> owned;  // converted or realigned matrices
};

// Validates every tensor's presence, dtype and shape against the config and builds the views of
// this rank's slices, reading only their bytes. `ckpt` must outlive the result (views point into
// its maps).
ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& cfg, WeightFormat fmt,
                          const ShardPlan& plan);

}  // namespace shardlm
