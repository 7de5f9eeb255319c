// Token penalties on logits rows, applied before sampling as llama.cpp and vLLM apply them: the
// logit x of a token the sequence has used recently becomes
//     (x > 0 ? x / repetition : x * repetition) - offset
// where `repetition` is the repetition penalty (CTRL's, as Hugging Face and vLLM define it; 1:
// none) and offset = frequency * count + presence (OpenAI's frequency and presence penalties; the
// host computes it per token from its count). Each operation rounds once, never fused into a
// multiply-add, so the CUDA kernel (kernels/cuda/penalty.h) gives the same bits as this reference;
// NaN stays NaN, a penalised 0 is -offset.
#pragma once

#include <cstdint>

namespace shardlm {

// One penalised token of one logits row. Plain data, copied to the GPU as is (16 bytes).
struct PenaltyEntry {
    int32_t row = 0;          // logits row within the step
    int32_t id = 0;           // global vocabulary id
    float repetition = 1.0f;  // > 0
    float offset = 0.0f;
};
static_assert(sizeof(PenaltyEntry) == 16, "PenaltyEntry is copied to the device as 16-byte records");

// The penalised value of one logit.
float penalize(float x, float repetition, float offset);

// Applies entries [0, n) to rows of `vocab` logits holding ids [id_offset, id_offset + vocab) (a
// rank's vocabulary slice under tensor parallelism): row r is logits + r * vocab. Entries whose id
// lies outside the slice are skipped; within a row the ids must be distinct (each is applied once).
void apply_penalties_ref(float* logits, int64_t vocab, int32_t id_offset, const PenaltyEntry* entries, int64_t n);

}  // namespace shardlm
