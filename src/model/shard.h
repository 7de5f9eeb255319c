// Which slice of the model one rank of a tensor-parallel job holds (Megatron layout):
//   q/k/v_proj    column-parallel by heads: rank r has query heads [q_head0, q_head0 + n_q_heads)
//                 and the KV heads they read, [kv_head0, kv_head0 + n_kv_heads). KV heads are split
//                 when kv_heads % tp == 0 and replicated (one per rank) when tp % kv_heads == 0.
//   o_proj        row-parallel: the input columns of this rank's query heads; all-reduce after.
//   gate/up_proj  column-parallel: intermediate rows [inter0, inter0 + n_inter).
//   down_proj     row-parallel: the same intermediate columns; all-reduce after.
//   embed_tokens  vocab-parallel rows [vocab0, vocab0 + n_vocab); all-reduce after the lookup.
//   lm_head       vocab-parallel rows, the same split; logits all-gathered (padded to vocab_per_rank).
//   norms         replicated.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace shardlm {

struct ShardPlan {
    int rank = 0, tp = 1;
    int64_t q_head0 = 0, n_q_heads = 0;
    int64_t kv_head0 = 0, n_kv_heads = 0;
    int64_t inter0 = 0, n_inter = 0;
    int64_t vocab_per_rank = 0;  // ceil(vocab / tp): every rank gathers this many logits
    int64_t vocab0 = 0, n_vocab = 0;  // rows this rank really holds (the last rank may hold fewer)
};

// Throws Error naming the dimension when `tp` cannot split the model.
ShardPlan plan_shard(const ModelConfig& c, int rank, int tp);

// Parameters one rank holds under `p` (replicated norms counted on every rank).
int64_t shard_parameter_count(const ModelConfig& c, const ShardPlan& p);

}  // namespace shardlm
