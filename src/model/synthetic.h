// Random-weight checkpoints in Hugging Face format, for tests, the demo and benchmarks. The
// weights are random but scaled like a trained model's (unit-variance activations, logits with a
// standard deviation of a few units) so that greedy decoding is well conditioned.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace shardlm {

// Built-in shapes: "tiny" (a few hundred thousand parameters), "qwen3-1.7b", "smollm2-1.7b",
// "llama3.2-1b". Throws Error listing the names for an unknown one.
ModelConfig synthetic_config(const std::string& name);
std::vector<std::string> synthetic_names();

// A small config of the given architecture with its distinguishing features switched on
// (Qwen2 biases, Qwen3 q/k norm, GQA); used by tests.
ModelConfig tiny_config(Arch arch);

struct SyntheticOptions {
    DType dtype = DType::BF16;  // F32, F16 or BF16 on disk
    int shards = 1;             // >1 writes model-0000i-of-0000n.safetensors + index
    uint64_t seed = 1;
};

// The most files a checkpoint of `cfg` is spread over: the layers go to files in order, the
// final norm (and lm_head) to the last, so one file per layer plus one; more would hold nothing.
int max_synthetic_shards(const ModelConfig& cfg);

// config.json + safetensors into `dir` (created if missing); opt.shards in [1, max_synthetic_shards].
void write_synthetic_checkpoint(const std::string& dir, const ModelConfig& cfg, const SyntheticOptions& opt);

// A random LoRA adapter as PEFT saves it (adapter_config.json: r = rank, lora_alpha = rank, so
// its scale is 1; adapter_model.safetensors) on the q/k/v/o and gate/up/down projections of every
// layer of `cfg` into `dir` (created if missing), in opt.dtype. Unlike a fresh PEFT adapter (B = 0)
// both factors are random, B A changing each matrix by about 5% of its own spread: what
// benchmarks and demos of adapters need. opt.shards is ignored.
void write_synthetic_lora(const std::string& dir, const ModelConfig& cfg, int64_t rank, const SyntheticOptions& opt);

// The config.json text HF would write for `cfg`.
std::string config_json(const ModelConfig& cfg);

}  // namespace shardlm
