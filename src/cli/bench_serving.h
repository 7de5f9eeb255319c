// shardlm bench --requests N: serving throughput. N requests of random prompt lengths and output
// limits go through generate()'s continuous batching with B slots, and, in the same run, as static
// batches of B one after the other (what a runtime without continuous batching does): generated
// tokens/s and requests/s of both. With a shared prefix (a system prompt every request starts
// with) also continuously batched with the prefix cache (BatcherOptions::reuse_prefix). And
// two-turn conversations through fewer slots, with and without the prefix cache's host tier.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine.h"

namespace shardlm {

struct ServingRequests {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int64_t> max_new;
    int64_t prompt_tokens = 0;
};
// n requests, each the same `shared` tokens then its own, prompt lengths uniform in [1, max_prompt]
// past those, output limits uniform in [1, max_gen], ids uniform in the vocabulary: the same for
// a given seed everywhere.
ServingRequests serving_requests(int64_t n, int64_t max_prompt, int64_t max_gen, int64_t vocab, uint64_t seed,
                                 int64_t shared = 0);

struct ServingRun {
    double ms = 0;
    int64_t generated = 0, steps = 0;
    int64_t prefilled = 0;  // prompt tokens run (the rest came from the prefix cache)
    // Latency as a client would see it, every request arriving at the start of the run: time to
    // its first token (queueing included), and its mean time per output token after the first.
    double ttft_p50_ms = 0, ttft_p90_ms = 0, tpot_mean_ms = 0;
};
// Greedy generation of every request with at most `slots` sequences at once, prompt tokens per
// step up to `chunk`: continuously batched (static = false), or in batches of `slots` requests,
// each run to its end before the next starts (static = true); reuse_prefix: with the prefix cache.
ServingRun run_serving(Engine& e, const ServingRequests& r, int64_t slots, int64_t chunk, bool static_batches,
                       bool reuse_prefix = false);

// Multi-turn chat through fewer slots than conversations (bench --conversations): each request of
// `r` is a conversation's first turn (greedy, its max_new tokens, end-of-sequence ids ignored); once
// all have ended, each conversation's second turn arrives at once: its first prompt, its reply and
// `more` tokens of its own, generating max_new again. Run without the prefix cache
// (reuse_prefix false), with it in the slots alone (host_bytes 0), or with its host tier
// (BatcherOptions::host_cache_bytes). Timed: the second turns.
struct ConversationRun {
    double ms = 0;  // from the second turns' arrival to the last one's end
    int64_t generated = 0, steps = 0;
    int64_t prefilled = 0;  // prompt tokens the second turns ran (the rest came from a cache)
    int64_t loads = 0;      // prefixes the host tier loaded back
    double ttft_p50_ms = 0;
};
ConversationRun run_conversations(Engine& e, const ServingRequests& r, int64_t more, int64_t slots, int64_t chunk,
                                  bool reuse_prefix, size_t host_bytes);

}  // namespace shardlm
