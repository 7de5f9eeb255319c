// The model's weights in memory, as the kernels read them. Matrices either point straight into the
// checkpoint's memory map (dtype kept, aligned) or into buffers owned here (converted on load).
// Norm weights and biases are always f32: they are tiny and the math on them is FP32.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "kernels/cpu/weights_view.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/shard.h"

namespace shardlm {

// What precision to keep Linear/embedding matrices in. Auto keeps each tensor's checkpoint dtype
// (or a pre-quantized checkpoint's format). Int8 is W8A16: INT8 weights with f32 activations;
// W8A8 also quantizes activations per token and accumulates in INT32. Int4 is W4A16: the layers'
// Linear matrices in asymmetric group-wise 4-bit (AWQ's format, kernels/cpu/weights_view.h); the
// vocabulary matrix (lm_head, and the tied embedding) stays INT8 per output channel, the layer a
// 4-bit model is most sensitive in (AWQ keeps it 16-bit; INT8 costs it nothing measurable).
// W4A8 holds the same weights as Int4 and also quantizes the layers' activations to INT8 per group
// of the weights' group size (the 4-bit codes are VNNI's unsigned operand, and __dp4a's signed one,
// as they are).
enum class WeightFormat { Auto, F32, F16, BF16, Int8, W8A8, Int4, W4A8 };

WeightFormat parse_weight_format(const std::string& s);  // throws Error naming --weights
const char* weight_format_name(WeightFormat f);
inline bool is_int8(WeightFormat f) { return f == WeightFormat::Int8 || f == WeightFormat::W8A8; }
inline bool is_int4(WeightFormat f) { return f == WeightFormat::Int4 || f == WeightFormat::W4A8; }
inline bool is_quantized(WeightFormat f) { return is_int8(f) || is_int4(f); }
// Whether the layers' activations are quantized to INT8 too (W8A8, W4A8).
inline bool quantizes_acts(WeightFormat f) { return f == WeightFormat::W8A8 || f == WeightFormat::W4A8; }

// The group size int4 uses when --group-size is 0 (AWQ's default).
constexpr int64_t kInt4DefaultGroup = 128;

// Per-channel scaling folded into the weights as they load (AWQ; runtime/awq.h finds the scales).
// A Linear matrix named in `in` has input column c multiplied by in[name][c]; a tensor named in
// `out` (a norm weight, a Linear matrix's output rows, a bias) has element or row i divided by
// out[name][i]. The scales come in pairs that cancel (a norm weight divided by what the next
// matrices' columns are multiplied by), so the float model computes the same function; quantized,
// the channels with large activations get finer steps. Indices are the full tensor's (any rank).
//
// `clip` (INT4 only, AWQ's second step) is lossy: for an INT4 Linear matrix named in it, the
// weights of row r and group k (after the scaling) are clamped to +-clip[name][r * groups + k]
// times that group's largest |w| before quantizing, trading the few largest weights' error for
// finer steps on the rest where that lowers the output error.
struct ChannelScales {
    std::map<std::string, std::vector<float>> in, out, clip;
    bool empty() const { return in.empty() && out.empty() && clip.empty(); }
};

struct LoadOptions {
    LoadOptions(WeightFormat f = WeightFormat::Auto, int64_t group = 0, std::string keep = "")
        : format(f), group_size(group), keep_fp16(std::move(keep)) {}

    WeightFormat format = WeightFormat::Auto;
    // Quantized formats: scales per group of this many input columns (0: one per output channel
    // for INT8, kInt4DefaultGroup for INT4).
    int64_t group_size = 0;
    // Quantized formats: Linear tensors whose HF name matches (std::regex_search, ECMAScript) stay
    // 16-bit (the checkpoint's FP16/BF16, or BF16 from an FP32 checkpoint). Norms are never quantized.
    std::string keep_fp16;
    ChannelScales scales;
    // Ranks of the job on this node (EngineOptions::ranks_on_node): each converts its own slice
    // into host memory at the same time, so the converted weights are weighed against
    // 1/ranks_on_node of what the machine can back (load_weights).
    int ranks_on_node = 1;
    // --no-mmap: weights the checkpoint holds as the engine reads them are copied into this
    // process's memory (2 MB pages, core/buffer.h) instead of read through the file map, whose 4 KB
    // page-cache pages the CPU GEMVs stream more slowly (README, "Huge pages"); each tensor's pages
    // of the map are released once copied.
    bool copy_mapped = false;
    // LoRA adapters merged into the float weights as they load (model/lora.h), before any channel
    // scaling or quantization; a matrix with an adapter is converted (copied), not mapped.
    std::vector<LoraAdapter> lora;
    // Embeddings only (shardlm embed, serve --embeddings): an untied checkpoint without
    // lm_head.weight (an embedding model saved from the base class, e.g. an 8B one) loads without
    // it (ModelWeights::headless) instead of being refused for the missing tensor.
    bool headless_ok = false;
};

struct Linear {
    std::string name;  // HF tensor name of the weight, e.g. "model.layers.0.mlp.up_proj.weight"
    WeightView w;  // [out, in]
    std::vector<float> bias;  // empty when the layer has none
    const float* bias_ptr() const { return bias.empty() ? nullptr : bias.data(); }
    // Act-order GPTQ or compressed-tensors (model/hf_quant.h act_order): w's columns sorted by
    // their group, column j reading element input_order[j] ([w.cols]) of the whole input, of
    // input_width elements. A row-parallel layer split over ranks reads every rank's part of its
    // input (in rank order: the engine gathers them), since its groups mix the ranks' columns.
    // Empty: column j reads element j of this rank's input, as usual.
    std::vector<int32_t> input_order;
    int64_t input_width = 0;
};

struct LayerWeights {
    std::vector<float> input_norm, post_attn_norm;  // [hidden]
    std::vector<float> q_norm, k_norm;              // [head_dim], Qwen3 only
    Linear q, k, v, o;                              // q [n_heads*hd, hidden], k/v [n_kv*hd, hidden], o [hidden, n_heads*hd]
    Linear gate, up, down;                          // gate/up [inter, hidden], down [hidden, inter]
    // Where down_proj is act-order: the elements of the whole intermediate that gate/up's rows
    // make and down's columns read, in this order (down's sorted columns' order, this rank's
    // block of it), down itself then without an input_order. Empty: elements inter0 .. in order.
    std::vector<int32_t> inter_rows;
};

// Shapes below are this rank's slices (see model/shard.h); with one rank, the whole model.
struct ModelWeights {
    ShardPlan plan;
    WeightView embed;    // [n_vocab, hidden]: vocabulary rows vocab0 ..
    WeightView lm_head;  // [n_vocab, hidden]; the embedding itself when tied
    // No lm_head in the checkpoint (LoadOptions::headless_ok): lm_head views the embedding only so
    // that the engines' layouts stay one shape; the engines refuse every step that wants logits.
    bool headless = false;
    // A sequence-classification model's head (ModelConfig::labels): score.weight [labels, hidden]
    // as f32, whole on every rank (runtime/classify.h applies it to the last token's state).
    std::vector<float> score;
    std::vector<float> final_norm;
    std::vector<LayerWeights> layers;
    WeightFormat format = WeightFormat::Auto;  // as loaded (Int8/W8A8/Int4/W4A8 for pre-quantized checkpoints)
    int64_t group_size = 0;                    // quantized formats (the layers' group; see LoadOptions)
    size_t bytes = 0;         // bytes of all matrices and vectors as held (mapped + owned), scales included
    std::vector<Buffer> owned;  // converted or realigned matrices
};

// The widest whole input (Linear::input_width) of w's act-order layers, 0 where none is: the
// engines' gather buffers.
int64_t widest_input_order(const ModelWeights& w);

// Throws Error naming `what` unless `re` (a --keep-fp16 regex) compiles as the loader compiles it
// (ECMAScript). The loader runs it; AWQ calibration, which matches the regex itself after a float
// load and a forward pass, runs it before them.
void check_keep_fp16(const std::string& re, const std::string& what = "--keep-fp16");

// Validates every tensor's presence, dtype and shape against the config and builds the views of
// this rank's slices, reading only their bytes. `ckpt` must outlive the result (views point into
// its maps).
//
// Weights converted on load (quantized, or held in another dtype than stored, or rescaled by
// channel scales) go to host buffers owned here, written as they are made: before the first of
// them is allocated, their total on this rank (converted_weight_bytes) is weighed against
// 1/opt.ranks_on_node of the memory the machine can back (core/host_memory.h), and more is
// refused with an Error naming the model folder, --weights and both figures, instead of meeting
// the OOM killer halfway through the load. A checkpoint used as stored is mapped and costs none.
// The CUDA engine loads through here too (it uploads these host buffers, then frees them).
ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const LoadOptions& opt,
                          const ShardPlan& plan);

// Bytes of the buffers load_weights allocates on this rank for the weights it converts (see
// above), without allocating or converting anything; throws what load_weights would for a
// checkpoint that does not match. Not counted: copies of a slice in the stored dtype (the
// row-parallel columns under TP, a misaligned tensor; with copy_mapped every copy counts), the f32
// norms and biases, and the transient f32 copy of one matrix that INT4 quantizes from.
size_t converted_weight_bytes(const Checkpoint& ckpt, const ModelConfig& cfg, const LoadOptions& opt,
                              const ShardPlan& plan);

}  // namespace shardlm
