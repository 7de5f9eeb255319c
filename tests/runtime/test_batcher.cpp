// The Batcher (runtime/batcher.h) with what generate() does not use: a sampler per request, and
// requests ended from outside (finish) while they wait or run.
#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "core/error.h"
#include "fixtures.h"
#include "runtime/batcher.h"
#include "runtime/session.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

// (The engine keeps the communicator: it outlives the session.)
std::unique_ptr<Session> open_tiny(const std::string& dir, int64_t slots, Communicator& comm) {
    SessionOptions so;
    so.model_dir = dir;
    so.ctx = 40;
    so.max_batch = slots;
    so.prefill_chunk = 5;
    so.max_penalties = 16;
    return open_session(so, comm);
}

BatchRequest request(const std::vector<int32_t>& prompt, const SamplerOptions& so, uint64_t stream, int64_t logprobs = -1) {
    BatchRequest r;
    r.prompt = prompt;
    r.max_new_tokens = 8;
    r.sampler = so;
    r.stream = stream;
    r.logprobs = logprobs;
    return r;
}

}  // namespace

// Greedy, top-k, top-p alone (the nucleus path), a whole-row sampler, penalties and logprobs in
// one batch through two slots: each request draws what it draws alone, so a step hands back
// what its most demanding row needs and every row samples from it alike.
TEST(Batcher, MixedSamplersEachAsAlone) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Qwen2);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 19});
    SamplerOptions greedy;
    greedy.temperature = 0;
    SamplerOptions topk;
    topk.temperature = 1.3f;
    topk.top_k = 20;
    topk.top_p = 1;
    topk.seed = 4;
    SamplerOptions nucleus = topk;
    nucleus.top_k = 0;
    nucleus.top_p = 0.8f;
    SamplerOptions whole = topk;
    whole.top_k = 0;
    whole.top_p = 1;
    whole.min_p = 0.01f;
    SamplerOptions penalised = topk;
    penalised.repetition_penalty = 1.4f;
    penalised.frequency_penalty = 0.3f;
    penalised.penalty_last_n = 16;
    const std::vector<BatchRequest> reqs = {
        request(make_prompt(7, cfg.vocab, 1), greedy, 0),    request(make_prompt(3, cfg.vocab, 2), topk, 1),
        request(make_prompt(11, cfg.vocab, 3), nucleus, 2), request(make_prompt(2, cfg.vocab, 4), whole, 3),
        request(make_prompt(6, cfg.vocab, 5), penalised, 4), request(make_prompt(4, cfg.vocab, 6), greedy, 5, 3),
        request(make_prompt(9, cfg.vocab, 7), nucleus, 6, 0)};
    SingleRank comm;
    auto s = open_tiny(d.path(), 2, comm);
    BatcherOptions bo;
    bo.prefill_chunk = 5;
    Batcher all(*s->engine, bo);
    for (const BatchRequest& r : reqs) all.add(r);
    while (all.busy()) all.step();
    for (size_t i = 0; i < reqs.size(); ++i) {
        Batcher one(*s->engine, bo);
        one.add(reqs[i]);
        while (one.busy()) one.step();
        EXPECT_EQ(all.result(i).tokens, one.result(0).tokens) << "request " << i;
        EXPECT_EQ(all.result(i).tokens.size(), 8u) << "request " << i;
        EXPECT_EQ(all.result(i).logprobs.size(), reqs[i].logprobs >= 0 ? 8u : 0u) << "request " << i;
    }
    EXPECT_EQ(all.result(5).logprobs[0].top.size(), 3u);
}

// finish() ends a running request before the next step (its slot goes to the next one) and a
// waiting one before it runs; an ended request's result can be released.
TEST(Batcher, FinishEndsWaitingAndRunningRequests) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 21});
    SingleRank comm;
    auto s = open_tiny(d.path(), 1, comm);
    SamplerOptions greedy;
    greedy.temperature = 0;
    Batcher b(*s->engine, BatcherOptions{});
    for (uint64_t i = 0; i < 3; ++i) b.add(request(make_prompt(4, cfg.vocab, i + 1), greedy, i));
    std::vector<std::pair<size_t, int32_t>> seen;
    const TokenCallback on_token = [&](size_t i, int32_t id) { seen.emplace_back(i, id); };
    b.step(on_token);  // request 0's prefill and first token
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].first, 0u);
    b.finish(0, "cancelled");
    b.finish(2, "cancelled");  // still waiting
    EXPECT_TRUE(b.ended(0));
    EXPECT_FALSE(b.ended(1));
    b.step(on_token);  // request 1 takes the slot at once
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[1].first, 1u);
    while (b.busy()) b.step(on_token);
    EXPECT_EQ(b.result(0).tokens.size(), 1u);
    EXPECT_EQ(b.result(0).stop_reason, "cancelled");
    EXPECT_EQ(b.result(1).tokens.size(), 8u);
    EXPECT_EQ(b.result(1).stop_reason, "length");
    EXPECT_TRUE(b.result(2).tokens.empty());
    EXPECT_EQ(b.result(2).stop_reason, "cancelled");
    for (size_t i = 1; i < seen.size(); ++i) EXPECT_EQ(seen[i].first, 1u);  // request 2 never ran
    b.finish(1, "late");  // ended already: nothing changes
    EXPECT_EQ(b.result(1).stop_reason, "length");
    b.release(2);
    EXPECT_THROW(b.result(2), Error);
    EXPECT_TRUE(b.ended(2));
    // A request bound to a slot beyond the batcher's is refused.
    BatchRequest bad = request(make_prompt(4, cfg.vocab, 9), greedy, 9);
    bad.slot = 1;
    EXPECT_THROW(b.add(bad), Error);
}
