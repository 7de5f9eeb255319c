// shardlm bench --requests N: serving throughput. N requests of random prompt lengths and output
// limits go through generate()'s continuous batching with B slots, and, in the same run, as static
// batches of B one after the other (what a runtime without continuous batching does): generated
// tokens/s and requests/s of both.
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
// n requests, prompt lengths uniform in [1, max_prompt], output limits uniform in [1, max_gen],
// ids uniform in the vocabulary: the same for a given seed everywhere.
ServingRequests serving_requests(int64_t n, int64_t max_prompt, int64_t max_gen, int64_t vocab, uint64_t seed);

struct ServingRun {
    double ms = 0;
    int64_t generated = 0, steps = 0;
};
// Greedy generation of every request with at most `slots` sequences at once, prompt tokens per
// step up to `chunk`: continuously batched (static = false), or in batches of `slots` requests,
// each run to its end before the next starts (static = true).
ServingRun run_serving(Engine& e, const ServingRequests& r, int64_t slots, int64_t chunk, bool static_batches);

}  // namespace shardlm
