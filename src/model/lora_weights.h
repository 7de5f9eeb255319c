// LoRA adapters kept beside the base weights and chosen per sequence (vLLM's multi-LoRA serving,
// `serve --lora-modules NAME=DIR`), where --lora (model/lora.h) merges them once for every
// sequence. Each adapter is read from PEFT's folder by LoraSet (the same checks and scales) and
// held in f32 (or BF16: lora_factor_dtype) as this rank's slices of its factors:
//   y += (x A^T) B^T   with A [r, in] and B [out, r], alpha / r (or / sqrt(r)) and the scale in B,
// kept as B^T [r, out] for kernels/cpu/lora.h.
// Under tensor parallelism the factors split as their base matrix does (model/shard.h): a
// column-parallel matrix (q/k/v, gate/up) keeps A whole and its rows of B; a row-parallel one
// (o, down) its columns of A and B whole, so each rank's x_slice A_slice^T B^T is a partial sum
// that the all-reduce after the base product completes. The engine adds the product after the
// base matrix's, so quantized base weights (--weights int8, w8a8, int4) keep their adapters in
// BF16, unquantized, as vLLM keeps them in the model's 16-bit type. Refused by name: an adapter on
// lm_head or the embedding (merge it with --lora).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/shard.h"
#include "model/weights.h"

namespace shardlm {

// One matrix's factors on this rank; rank 0 where the adapter leaves the matrix alone.
struct LoraMatrix {
    int64_t rank = 0, in = 0, out = 0;  // this rank's slice: in columns of x, out rows of y
    DType dtype = DType::F32;           // of a and bt: F32 or BF16
    std::vector<uint8_t> a;   // [rank, in]
    std::vector<uint8_t> bt;  // B^T [rank, out], scaled (then rounded to dtype), in kernels/cpu/lora.h's column tiles
};

struct LoraLayer {
    LoraMatrix q, k, v, o, gate, up, down;
};

// One adapter, as serve names it.
struct LoraWeights {
    std::string name;  // the model name requests give ("model": NAME)
    std::string dir;
    std::vector<LoraLayer> layers;  // one per layer of the model
    int64_t max_rank = 0;           // over its matrices
    size_t bytes() const;
};

// Reads adapter `ad` for the base model in `base` and keeps this rank's slices of it: those of
// `weights`, this rank's base weights (their plan, and the order of an act-order layer's
// intermediate: LayerWeights::inter_rows).
// Throws Error naming the folder, file or tensor (LoraSet's checks, and the targets refused here),
// or the rank when one of its matrices' is above max_rank (vLLM's --max-lora-rank; 0: any).
// factors: F32, or BF16 (lora_factor_dtype).
LoraWeights load_lora_weights(const std::string& name, const LoraAdapter& ad, const Checkpoint& base,
                              const ModelConfig& cfg, const ModelWeights& weights, DType factors = DType::F32,
                              int64_t max_rank = 0);

// The factors' type over these base weights: F32 over FP32 weights (--weights fp32, or auto on an
// FP32 checkpoint), else BF16, as vLLM keeps adapters in the model's 16-bit type: the update then
// rounds no more than the base does, and decode reads half the factor bytes.
DType lora_factor_dtype(const ModelWeights& w);

}  // namespace shardlm
