#include "model/shard.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm {

ShardPlan plan_shard(const ModelConfig& c, int rank, int tp) {
    if (tp < 1) fail("tensor-parallel size must be at least 1, got ", tp);
    if (c.n_heads % tp != 0)
        fail("tensor parallelism ", tp, " does not divide the ", c.n_heads, " attention heads");
    if (c.n_kv_heads % tp != 0 && tp % c.n_kv_heads != 0)
        fail("tensor parallelism ", tp, " neither divides nor is a multiple of the ", c.n_kv_heads, " KV heads");
    if (c.intermediate % tp != 0)
        fail("tensor parallelism ", tp, " does not divide intermediate_size ", c.intermediate);
    ShardPlan p;
    p.rank = rank;
    p.tp = tp;
    p.n_q_heads = c.n_heads / tp;
    p.q_head0 = rank * p.n_q_heads;
    const int64_t group = c.n_heads / c.n_kv_heads;  // query heads per KV head
    p.kv_head0 = p.q_head0 / group;
    p.n_kv_heads = (p.q_head0 + p.n_q_heads - 1) / group + 1 - p.kv_head0;
    p.n_inter = c.intermediate / tp;
    p.inter0 = rank * p.n_inter;
    p.vocab_per_rank = (c.vocab + tp - 1) / tp;
    p.vocab0 = std::min<int64_t>(c.vocab, rank * p.vocab_per_rank);
    p.n_vocab = std::min<int64_t>(c.vocab, p.vocab0 + p.vocab_per_rank) - p.vocab0;
    return p;
}

}  // namespace shardlm

namespace shardlm {

int64_t shard_parameter_count(const ModelConfig& c, const ShardPlan& p) {
    const int64_t q = p.n_q_heads * c.head_dim, kv = p.n_kv_heads * c.head_dim;
    int64_t layer = c.hidden * q + 2 * c.hidden * kv + q * c.hidden  // q, k, v, o slices
                    + 3 * c.hidden * p.n_inter                          // gate, up, down slices
                    + 2 * c.hidden;                                     // replicated norms
    if (c.qkv_bias) layer += q + 2 * kv;
    if (c.qk_norm) layer += 2 * c.head_dim;
    int64_t total = c.n_layers * layer + p.n_vocab * c.hidden + c.hidden;
    // lm_head: its own rows unless tied; none on a base or classification model, whose head (a
    // classifier's score [labels, hidden]) is whole on every rank.
    if (!c.tie_embeddings && c.head == Head::CausalLM) total += p.n_vocab * c.hidden;
    if (c.head == Head::Classifier) total += int64_t(c.labels.size()) * c.hidden;
    return total;
}

}  // namespace shardlm
