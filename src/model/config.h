// config.json of a Hugging Face Llama-family checkpoint -> ModelConfig.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace shardlm {

enum class Arch { Llama, Mistral, Qwen2, Qwen3 };

const char* arch_name(Arch a);  // the HF class name, e.g. "Qwen3ForCausalLM"

// What sits on the decoder, from the architecture's class: CausalLM's lm_head ("Qwen3ForCausalLM");
// nothing (the base class, "Qwen3Model": an embedding model's final hidden states); or a
// sequence-classification head ("Qwen3ForSequenceClassification": score.weight [num_labels,
// hidden] on the last token's state; rerankers and reward models). Without lm_head a model loads
// for embed / classify only (LoadOptions::headless_ok).
enum class Head { CausalLM, None, Classifier };

// RoPE frequency plan (rope_scaling / rope_parameters). `llama3` rescales the inverse frequencies
// by wavelength band (HF's _compute_llama3_parameters), `linear` divides them all by factor,
// `yarn` ramps between both (kernels/cpu/rope.h) and scales attention by attention_factor^2
// (HF multiplies cos and sin by it); `none` is the plain 1/theta^(2i/d).
struct RopeScaling {
    enum class Kind { None, Llama3, Linear, Yarn } kind = Kind::None;
    float factor = 1.0f;
    float low_freq_factor = 1.0f;
    float high_freq_factor = 4.0f;
    int64_t original_max_position = 8192;
    float beta_fast = 32.0f, beta_slow = 1.0f;  // yarn
    bool truncate = true;                        // yarn
    float attention_factor = 1.0f;               // yarn: given, or 0.1 ln(factor) + 1
};

const char* rope_kind_name(RopeScaling::Kind k);  // "default", "llama3", "linear", "yarn"

// quantization_config of a pre-quantized checkpoint: one written by `shardlm quantize` (method
// Shardlm), or a Hugging Face one quantized by AutoAWQ (Awq: 4-bit GEMM packing), by
// AutoGPTQ/GPTQModel (Gptq: 4 or 8 bits, act-order too) or by llm-compressor
// (CompressedTensors: symmetric INT8 "int-quantized", W8A8 with dynamic per-token activations or
// W8A16, and 4-bit "pack-quantized" W4A16), whose Linear layers the loader unpacks into the same
// INT4/INT8 layouts (model/hf_quant.h). Other tools' configs are refused with an error naming them.
enum class QuantMethod { Shardlm, Awq, Gptq, CompressedTensors };

struct QuantConfig {
    bool present = false;
    QuantMethod method = QuantMethod::Shardlm;
    std::string format;       // "int8", "w8a8", "int4" or "w4a8" (Awq/Gptq: "int4", or "int8" for 8-bit GPTQ)
    int64_t group_size = 0;   // 0: one scale per output channel (int8/w8a8); int4: the layers' group
    std::string keep_fp16;    // the --keep-fp16 regex it was quantized with: matching Linear tensors stayed float
    // Hugging Face methods: the bits, the checkpoint's own group (0: one per output channel, which a
    // 4-bit layout repeats over groups of group_size; per_tensor: one scale for the whole matrix)
    // and the offset of the zero points: what a GPTQ checkpoint's stored ones lack (1 in AutoGPTQ's
    // format, "checkpoint_format": "gptq"; 0 in "gptq_v2"), compressed-tensors' 4-bit zero (8: its
    // codes are the signed values plus 8).
    int bits = 0;
    int64_t packed_group = 0;
    bool per_tensor = false;
    int zero_offset = 0;
    // GPTQ's desc_act without static_groups, compressed-tensors' actorder "group": the layers'
    // g_idx put their columns in groups of an order of the tool's own, which the loader sorts
    // (model/hf_quant.h act_order; the engines gather each layer's input into that order). What `shardlm info` says: the loader
    // goes by each layer's g_idx, whatever this says.
    bool act_order = false;
};

const char* quant_method_name(QuantMethod m);  // "shardlm", "awq", "gptq", "compressed-tensors"

// FP8 (E4M3) Linear weights with their scales: Hugging Face's "quant_method": "fp8" (Qwen3-*-FP8,
// DeepSeek's format: a weight_scale_inv per block of weight_block_size) or compressed-tensors'
// "float-quantized" (a weight_scale per channel, block or tensor). They are a float checkpoint to
// the loader: each element is code * scale of its block, widened to f32 as it reads a row, then
// held as the options say (BF16 under --weights auto; int8, int4, ... quantized from those rows).
struct Fp8Weights {
    bool present = false;
    std::string scale_suffix;                // after the weight's name: "_scale_inv" or "_scale"
    int64_t block_rows = 0, block_cols = 0;  // rows/columns a scale spans; 0: all of them
};

struct ModelConfig {
    Arch arch = Arch::Llama;
    Head head = Head::CausalLM;
    std::string architecture;         // architectures[0] as the file says, for messages
    std::vector<std::string> labels;  // Classifier: id2label in id order (num_labels of them)
    bool multi_label = false;         // Classifier: problem_type multi_label_classification (sigmoid per label)
    int64_t pad_id = -1;              // pad_token_id (-1: none): a Classifier pools the last token that is not it
    int64_t hidden = 0;        // hidden_size
    int64_t n_layers = 0;      // num_hidden_layers
    int64_t n_heads = 0;       // num_attention_heads
    int64_t n_kv_heads = 0;    // num_key_value_heads (defaults to n_heads)
    int64_t head_dim = 0;      // head_dim (defaults to hidden / n_heads)
    int64_t intermediate = 0;  // intermediate_size
    int64_t vocab = 0;         // vocab_size
    int64_t max_position = 0;  // max_position_embeddings (0 when absent)
    int64_t sliding_window = 0;  // 0: full attention
    int64_t window_from_layer = 0;  // layers from this one on use sliding_window (Qwen2's max_window_layers)
    float rms_eps = 1e-6f;
    float rope_theta = 10000.0f;
    RopeScaling rope;
    bool tie_embeddings = false;
    bool qkv_bias = false;  // Qwen2 always; others from attention_bias
    bool qk_norm = false;   // Qwen3: per-head RMSNorm on q and k before RoPE
    std::vector<int64_t> eos_ids;
    int64_t bos_id = -1;
    DType torch_dtype = DType::F32;
    QuantConfig quant;
    Fp8Weights fp8;
};

// The sliding window of layer l's attention (0: full attention).
inline int64_t layer_window(const ModelConfig& c, int64_t l) {
    return c.sliding_window > 0 && l >= c.window_from_layer ? c.sliding_window : 0;
}

// Parses the JSON text of config.json; `origin` names the file in errors.
ModelConfig parse_config(const std::string& json_text, const std::string& origin);
// MODEL_DIR/config.json, with the end-of-sequence ids of MODEL_DIR/generation_config.json (when
// there) added to its own: transformers' generate and vLLM stop on those, and instruct checkpoints
// list their turn-end token there (Llama 3's <|eot_id|>, Qwen's <|endoftext|> beside <|im_end|>).
ModelConfig load_config(const std::string& model_dir);
// generation_config.json's eos_token_id (an id or a list, each below c.vocab) joined to c's.
void add_generation_eos(ModelConfig& c, const std::string& json_text, const std::string& origin);

// The sampling defaults a checkpoint's generation_config.json gives (vLLM's --generation-config
// auto takes these as the defaults of requests that do not set them): each field when present.
struct GenerationDefaults {
    std::optional<double> temperature, top_p, min_p, repetition_penalty;
    std::optional<int64_t> top_k;  // -1 or 0: off
    bool any() const { return temperature || top_p || min_p || repetition_penalty || top_k; }
};
// Reads them from the JSON text of a generation_config.json; a value of the wrong type or out of
// the range a request could give is an error naming `origin` and the key.
GenerationDefaults parse_generation_defaults(const std::string& json_text, const std::string& origin);

// Number of parameters the checkpoint holds (embedding counted once when tied).
int64_t parameter_count(const ModelConfig& c);
// Whether `id` is one of the model's end-of-sequence ids (eos_token_id, one or a list).
bool is_eos_id(const ModelConfig& c, int64_t id);

}  // namespace shardlm
