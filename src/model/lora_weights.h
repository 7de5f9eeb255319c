// LoRA adapters kept beside the base weights and chosen per sequence (vLLM's multi-LoRA serving,
// `serve --lora-modules NAME=DIR`), where --lora (model/lora.h) merges them once for every
// sequence. Each adapter is read from PEFT's folder by LoraSet (the same checks and scales) and
// held in f32 as this rank's slices of its factors:
//   y += (x A^T) B^T   with A [r, in] and B [out, r], alpha / r (or / sqrt(r)) and the scale in B,
// kept as B^T [r, out] for kernels/cpu/lora.h.
// Under tensor parallelism the factors split as their base matrix does (model/shard.h): a
// column-parallel matrix (q/k/v, gate/up) keeps A whole and its rows of B; a row-parallel one
// (o, down) its columns of A and B whole, so each rank's x_slice A_slice^T B^T is a partial sum
// that the all-reduce after the base product completes. The engine adds the product after the
// base matrix's, so quantized base weights (--weights int8, w8a8, int4) keep their adapters in
// f32, as vLLM's do. Refused by name: an adapter on lm_head or the embedding (merge it with --lora).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/shard.h"

namespace shardlm {

// One matrix's factors on this rank; rank 0 where the adapter leaves the matrix alone.
struct LoraMatrix {
    int64_t rank = 0, in = 0, out = 0;  // this rank's slice: in columns of x, out rows of y
    std::vector<float> a;   // [rank, in]
    std::vector<float> bt;  // B^T [rank, out], scaled
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

// Reads adapter `ad` for the base model in `base` and keeps this rank's slices (plan).
// Throws Error naming the folder, file or tensor (LoraSet's checks, and the targets refused here),
// or the rank when one of its matrices' is above max_rank (vLLM's --max-lora-rank; 0: any).
LoraWeights load_lora_weights(const std::string& name, const LoraAdapter& ad, const Checkpoint& base,
                              const ModelConfig& cfg, const ShardPlan& plan, int64_t max_rank = 0);

}  // namespace shardlm
