// The Batcher (runtime/batcher.h) with what generate() does not use: a sampler per request, and
// requests ended from outside (finish) while they wait or run.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/error.h"
#include "fixtures.h"
#include "recording_engine.h"
#include "runtime/batcher.h"
#include "runtime/prefix_file.h"
#include "runtime/session.h"
#include "runtime/speculate.h"

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

// Runs the requests through one Batcher to the end: their results appended to `out`, the timings.
GenerateTimings run_all(Engine& e, const BatcherOptions& bo, const std::vector<BatchRequest>& r,
                        std::vector<SequenceResult>& out) {
    Batcher b(e, bo);
    for (const BatchRequest& q : r) b.add(q);
    while (b.busy()) b.step();
    for (size_t i = 0; i < r.size(); ++i) out.push_back(b.result(i));
    return b.timings();
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

// A vocabulary of JSON pieces for JSON-mode tests: id i > 2 spells kJsonPieces[i % size] (0-2:
// special, no bytes).
const std::vector<std::string> kJsonPieces = {"{", "}", "[", "]", "\"", ":", ",", " ", "0", "1", "-", ".", "true",
                                              "null", "a", "b", "\"k\":", "\"}", "}]", "]}", ", \"", "12", "e5", "\\n",
                                              "xyz"};
std::vector<std::string> json_piece_bytes(int64_t vocab) {
    std::vector<std::string> bytes(static_cast<size_t>(vocab));
    for (size_t id = 3; id < bytes.size(); ++id) bytes[id] = kJsonPieces[id % kJsonPieces.size()];
    return bytes;
}

// JSON-mode requests through 3 slots (12 logits rows), with `speculate` proposals per step.
GenerateTimings run_json(const std::string& dir, int64_t ctx, JsonVocab& vocab, int64_t speculate,
                         const std::vector<BatchRequest>& r, std::vector<SequenceResult>& out) {
    SingleRank comm;
    SessionOptions so;
    so.model_dir = dir;
    so.ctx = ctx;
    so.max_batch = 3;
    so.max_logit_rows = 12;
    so.max_penalties = 8;
    auto s = open_session(so, comm);
    BatcherOptions bo;
    bo.speculate = speculate;
    bo.json_vocab = &vocab;
    return run_all(*s->engine, bo, r, out);
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

// Priorities (vLLM's): waiting requests are admitted lowest priority first, then by arrival; the
// first of priority -1 preempts request 0 (priority 0), which comes back before request 3 (the
// same priority, a later arrival); the tokens are each request's own.
TEST(Batcher, PrioritiesOrderTheWaitingRequests) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 21});
    SingleRank comm;
    auto s = open_tiny(d.path(), 1, comm);
    SamplerOptions greedy;
    greedy.temperature = 0;
    const int64_t prio[] = {0, 5, -1, 0, -1};
    std::vector<BatchRequest> r;
    for (uint64_t i = 0; i < 5; ++i) {
        r.push_back(request(make_prompt(4, cfg.vocab, i + 1), greedy, i));
        r.back().max_new_tokens = 3;
        r.back().priority = prio[i];
    }
    Batcher b(*s->engine, BatcherOptions{});
    b.add(r[0]);
    std::vector<size_t> order;  // the requests in the order of their first tokens
    const TokenCallback on_token = [&](size_t i, int32_t) {
        if (std::find(order.begin(), order.end(), i) == order.end()) order.push_back(i);
    };
    b.step(on_token);  // request 0 runs; the others arrive while it does
    for (size_t i = 1; i < 5; ++i) b.add(r[i]);
    EXPECT_EQ(b.waiting(), 4);
    while (b.busy()) b.step(on_token);
    EXPECT_EQ(order, (std::vector<size_t>{0, 2, 4, 3, 1}));
    EXPECT_EQ(b.timings().preemptions, 1);
    std::vector<SequenceResult> alone;
    for (size_t i = 0; i < 5; ++i) {
        run_all(*s->engine, BatcherOptions{}, {r[i]}, alone);
        EXPECT_EQ(b.result(i).tokens, alone.back().tokens) << i;
    }
}

// Preemption: a request of a lower priority value that finds every slot taken sends the running
// sequence of the highest value back to wait; it runs to its end, then the preempted one goes on
// from what it had made: its tokens (greedy, or seeded draws with penalties) are those it makes
// alone, its prompt and cached counts its own, with and without the prefix cache and its host
// tier (after its end its slot holds all it ran, for a conversation's next turn).
TEST(Batcher, PreemptedSequencesGoOnWithTheirOwnTokens) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 31});
    SingleRank comm;
    auto s = open_tiny(d.path(), 2, comm);
    // (The tiny random model's rows are sharp: a presence penalty over the last two tokens keeps
    // greedy choices moving, and a high temperature makes draws vary.)
    SamplerOptions greedy, drawn;
    greedy.temperature = 0;
    greedy.presence_penalty = 60.0f;
    greedy.penalty_last_n = 2;
    drawn.temperature = 1.5f;
    drawn.presence_penalty = 2.0f;
    drawn.penalty_last_n = 8;  // (the engine's room: 16 penalised ids a row)
    drawn.seed = 7;
    // Without the prefix cache, with it, and with its host tier (which saves what the preempted
    // sequence ran when the other takes its slot, so that its return loads it instead of running
    // it again: vLLM's swap preemption).
    for (const int mode : {0, 1, 2}) {
        const bool reuse = mode > 0;
        BatcherOptions bo;
        bo.max_running = 1;
        bo.reuse_prefix = reuse;
        bo.host_cache_bytes = mode == 2 ? size_t(1) << 20 : 0;
        for (const SamplerOptions& so : {greedy, drawn}) {
            BatchRequest low = request(make_prompt(18, cfg.vocab, 3), so, 1);
            low.max_new_tokens = 10;
            low.ignore_eos = true;
            low.priority = 2;
            BatchRequest high = request(make_prompt(6, cfg.vocab, 4), greedy, 2);
            high.max_new_tokens = 4;
            high.ignore_eos = true;
            Batcher b(*s->engine, bo);
            std::vector<size_t> order;  // the request of each token
            const TokenCallback on_token = [&](size_t i, int32_t) { order.push_back(i); };
            b.add(low);
            while (b.result(0).tokens.size() < 3) b.step(on_token);
            b.add(high);
            b.step(on_token);
            EXPECT_EQ(b.running(), 1);
            EXPECT_EQ(b.waiting(), 1);
            while (b.busy()) b.step(on_token);
            EXPECT_EQ(b.timings().preemptions, 1);
            EXPECT_EQ(order, (std::vector<size_t>{0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0})) << reuse;
            // Its prompt, the other's, then on its return its prompt and 3 tokens again, or (host
            // tier) the last of them alone: the 18 + 3 - 1 it had run were loaded back.
            EXPECT_EQ(b.timings().host_loads, mode == 2 ? 1 : 0);
            EXPECT_EQ(b.timings().host_tokens, mode == 2 ? 20 : 0);
            EXPECT_EQ(b.timings().prefill_tokens, 18 + 6 + (mode == 2 ? 1 : 21)) << mode;
            std::vector<SequenceResult> alone;
            run_all(*s->engine, bo, {low}, alone);
            run_all(*s->engine, bo, {high}, alone);
            EXPECT_EQ(b.result(0).tokens, alone[0].tokens) << reuse;
            // Tokens that move (else a resume at the wrong place could give the same ones).
            EXPECT_GE(std::set<int32_t>(alone[0].tokens.begin(), alone[0].tokens.end()).size(), 3u);
            EXPECT_EQ(b.result(1).tokens, alone[1].tokens) << reuse;
            EXPECT_EQ(b.result(0).prompt, low.prompt);
            EXPECT_EQ(b.result(0).cached_tokens, 0);
            EXPECT_EQ(b.result(0).stop_reason, "length");
            if (reuse) {  // its slot holds what it ran after its return: the prompt, all its tokens but the last
                BatchRequest next = request(low.prompt, greedy, 3);
                next.prompt.insert(next.prompt.end(), b.result(0).tokens.begin(), b.result(0).tokens.end());
                const size_t n = b.add(next);
                while (b.busy()) b.step();
                EXPECT_EQ(b.result(n).cached_tokens, int64_t(next.prompt.size()) - 1);
            }
        }
    }
    // Not for an equal or higher value, nor for a request bound to a slot.
    BatcherOptions one;
    one.max_running = 1;
    Batcher b(*s->engine, one);
    BatchRequest a = request(make_prompt(5, cfg.vocab, 5), greedy, 1);
    a.priority = 1;
    b.add(a);
    b.step();
    BatchRequest same = a, bound = a;
    bound.priority = 0;
    bound.slot = 0;
    b.add(same);
    b.add(bound);
    b.step();
    EXPECT_EQ(b.timings().preemptions, 0);
    EXPECT_EQ(b.waiting(), 2);
}

// stop_ids (vLLM's stop_token_ids): a request ends with "stop" at the first of them it draws, the
// token kept; under min_tokens they are banned until it is reached.
TEST(Batcher, StopIdsEndTheSequence) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 21});
    SingleRank comm;
    auto s = open_tiny(d.path(), 2, comm);
    SamplerOptions greedy;
    greedy.temperature = 0;
    BatchRequest plain = request(make_prompt(4, cfg.vocab, 5), greedy, 0);
    plain.max_new_tokens = 10;
    plain.ignore_eos = true;  // ten tokens whatever they are
    std::vector<SequenceResult> out;
    run_all(*s->engine, BatcherOptions{}, {plain}, out);
    const std::vector<int32_t> free_run = out[0].tokens;
    ASSERT_EQ(free_run.size(), 10u);
    // The first token that was not drawn before it: the sequence stops right there.
    size_t at = 1;
    while (std::find(free_run.begin(), free_run.begin() + ptrdiff_t(at), free_run[at]) != free_run.begin() + ptrdiff_t(at)) ++at;
    BatchRequest stopped = plain;
    stopped.stop_ids = {free_run[at], int32_t(cfg.vocab - 1) == free_run[at] ? 0 : int32_t(cfg.vocab - 1)};
    out.clear();
    run_all(*s->engine, BatcherOptions{}, {stopped}, out);
    EXPECT_EQ(out[0].tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + ptrdiff_t(at) + 1));
    EXPECT_EQ(out[0].stop_reason, "stop");
    // min_tokens past it: the stop id is banned until then.
    BatchRequest banned = stopped;
    banned.min_tokens = int64_t(at) + 2;
    banned.sampler.logit_bias = {{free_run[at], 50.0f}};  // it would be drawn at every step
    out.clear();
    run_all(*s->engine, BatcherOptions{}, {banned}, out);
    ASSERT_EQ(out[0].tokens.size(), size_t(at) + 3);
    for (size_t i = 0; i < size_t(at) + 2; ++i) EXPECT_NE(out[0].tokens[i], free_run[at]) << i;
    EXPECT_EQ(out[0].tokens.back(), free_run[at]);
    EXPECT_EQ(out[0].stop_reason, "stop");
}

namespace {
// The host tier's tests: one slot of 96 positions, prompts in chunks of 8.
std::unique_ptr<Session> open_one_slot(const std::string& dir, KVFormat kv, Communicator& comm) {
    SessionOptions so;
    so.model_dir = dir;
    so.ctx = 96;
    so.max_batch = 1;
    so.prefill_chunk = 8;
    so.kv = kv;
    return open_session(so, comm);
}

std::vector<int32_t> joined(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}
}  // namespace

// Prefix caching: a freed slot keeps what its sequence ran, and a later request takes the free
// slot holding the longest prefix of its prompt (ties: the slot freed first) and prefills only
// the rest. Tokens and prompt logits equal those of the same requests run without it.
TEST(Batcher, PrefixReuseTakesTheLongestHeldPrefix) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Qwen2);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 23});
    SingleRank comm;
    auto s = open_tiny(d.path(), 2, comm);
    SamplerOptions greedy;
    greedy.temperature = 0;
    const std::vector<int32_t> sys = make_prompt(12, cfg.vocab, 31);  // a shared system prompt
    auto run = [&](bool reuse, std::vector<SequenceResult>& out) {
        BatcherOptions bo;
        bo.prefill_chunk = 5;
        bo.reuse_prefix = reuse;
        Batcher b(*s->engine, bo);
        std::vector<BatchRequest> r = {request(joined(sys, {1, 2}), greedy, 0), request(joined(sys, {3}), greedy, 1)};
        r[1].max_new_tokens = 3;  // ends first: its slot is the one freed longer ago
        for (BatchRequest& q : r) q.keep_prompt_logits = true;
        b.add(r[0]);
        b.add(r[1]);
        while (b.busy()) b.step();
        // The shared start with a new tail, and request 0's conversation going on (its prompt,
        // its reply, a new turn).
        r.push_back(request(joined(sys, {4, 5, 6}), greedy, 2));
        r.push_back(request(joined(joined(r[0].prompt, b.result(0).tokens), {7}), greedy, 3));
        r[2].keep_prompt_logits = r[3].keep_prompt_logits = true;
        b.add(r[2]);
        b.add(r[3]);
        while (b.busy()) b.step();
        for (size_t i = 0; i < r.size(); ++i) out.push_back(b.result(i));
        return b.timings().prefill_tokens;
    };
    std::vector<SequenceResult> fresh, reused;
    const int64_t fresh_tokens = run(false, fresh), reused_tokens = run(true, reused);
    ASSERT_EQ(fresh[0].tokens.size(), 8u);
    ASSERT_EQ(fresh[1].tokens.size(), 3u);
    // Request 1 gets no prompt token before request 0's first two chunks have run (5 tokens a
    // step): it copies the 10 of them it shares (a 12-token prefix is too short to wait for).
    const std::vector<int64_t> cached = {0, 10, 12, 14 + 8 - 1};
    int64_t prompt_tokens = 0;
    for (size_t i = 0; i < fresh.size(); ++i) {
        EXPECT_EQ(fresh[i].cached_tokens, 0) << "request " << i;
        EXPECT_EQ(reused[i].cached_tokens, cached[i]) << "request " << i;
        EXPECT_EQ(reused[i].tokens, fresh[i].tokens) << "request " << i;
        EXPECT_LT(max_abs_diff(reused[i].prompt_logits, fresh[i].prompt_logits), 1e-4) << "request " << i;
        prompt_tokens += int64_t(fresh[i].prompt.size());
    }
    EXPECT_EQ(fresh_tokens, prompt_tokens);
    EXPECT_EQ(reused_tokens, prompt_tokens - 10 - 12 - 21);
}

// The prefix cache's host tier (BatcherOptions::host_cache_bytes): two conversations through one
// slot, each prompt then its next turn (its prompt, its reply, a new turn), then a prompt that
// leaves the first conversation after 18 tokens. Without the tier the slot holds only another
// conversation, and every prompt is prefilled whole. With it, each request that takes the slot
// first saves what the slot held, and each next turn loads its conversation's keys and values
// back (the last one only part of a save): it prefills only the rest, with the tokens and prompt
// logits of runs without any reuse. Budgets: room for all, for one save at a time (each load
// comes before the save that drops it), for the first 20 positions of each (a prefix of a prefix
// is one too), and for less than kMinHostPrefix (nothing saved).
TEST(Batcher, HostTierKeepsMoreConversationsThanSlots) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 37});
    SingleRank comm;
    SamplerOptions greedy;
    greedy.temperature = 0;
    const std::vector<int32_t> a = make_prompt(20, cfg.vocab, 41), b = make_prompt(24, cfg.vocab, 43);
    for (const KVFormat kv : {KVFormat::F32, KVFormat::Int8}) {
        struct Run {
            std::vector<SequenceResult> res;
            GenerateTimings t;
            int64_t prefixes = 0;
            size_t bytes = 0, per = 0;
        };
        // budget: positions the tier may hold (-1: no reuse at all).
        auto run = [&](int64_t budget) {
            auto s = open_one_slot(d.path(), kv, comm);
            Run out;
            out.per = s->engine->kv_position_bytes();
            BatcherOptions bo;
            bo.prefill_chunk = 8;
            bo.reuse_prefix = budget >= 0;
            bo.host_cache_bytes = size_t(std::max<int64_t>(budget, 0)) * out.per;
            Batcher bt(*s->engine, bo);
            std::vector<BatchRequest> r = {request(a, greedy, 0), request(b, greedy, 1)};
            for (BatchRequest& q : r) bt.add(q);
            while (bt.busy()) bt.step();
            r.push_back(request(joined(joined(a, bt.result(0).tokens), {5, 6}), greedy, 2));
            r.push_back(request(joined(joined(b, bt.result(1).tokens), {7}), greedy, 3));
            for (size_t i = 2; i < 4; ++i) {
                r[i].keep_prompt_logits = true;
                bt.add(r[i]);
            }
            while (bt.busy()) bt.step();
            // A prompt that leaves a's conversation after its first 18 tokens: a load of part of
            // a save (each head's rows at the save's pitch).
            std::vector<int32_t> off(a.begin(), a.begin() + 18);
            off.push_back(int32_t((a[18] + 1) % cfg.vocab));
            off.push_back(5);
            r.push_back(request(off, greedy, 4));
            r[4].keep_prompt_logits = true;
            bt.add(r[4]);
            while (bt.busy()) bt.step();
            for (size_t i = 0; i < r.size(); ++i) out.res.push_back(bt.result(i));
            out.t = bt.timings();
            out.prefixes = bt.host_prefixes();
            out.bytes = bt.host_bytes();
            return out;
        };
        const Run fresh = run(-1);
        ASSERT_EQ(fresh.res[0].tokens.size(), 8u);
        ASSERT_EQ(fresh.res[1].tokens.size(), 8u);
        // What a slot holds after a request: its prompt and its tokens but the last.
        const int64_t held_a = 20 + 7, held_b = 24 + 7, held_a2 = 20 + 8 + 2 + 7, held_b2 = 24 + 8 + 1 + 7;
        struct Budget {
            int64_t positions;
            std::vector<int64_t> cached;
            int64_t saves, prefixes, bytes;  // (bytes in positions)
        };
        // The last request loads 18 positions of a2's save (or of a2's first 20), and b2's is saved
        // (replacing b's, or making room by dropping a2's after the load).
        const Budget budgets[] = {
            {0, {0, 0, 0, 0, 0}, 0, 0, 0},  // the slot tier alone: it holds the other conversation
            {1000, {0, 0, held_a, held_b, 18}, 4, 2, held_a2 + held_b2},  // a's save held whole by a2's
            {40, {0, 0, held_a, held_b, 18}, 4, 1, held_b2},
            {20, {0, 0, 20, 20, 18}, 4, 1, 20},  // a2's first 20 (a's) saved again: a's save had gone
            {kMinHostPrefix - 1, {0, 0, 0, 0, 0}, 0, 0, 0},
        };
        for (const Budget& bu : budgets) {
            const Run got = run(bu.positions);
            const std::string what = "kv " + std::string(kv_name(kv_dtype(kv))) + ", budget " + std::to_string(bu.positions);
            int64_t loaded = 0, loads = 0;
            for (size_t i = 0; i < 5; ++i) {
                EXPECT_EQ(fresh.res[i].cached_tokens, 0);
                EXPECT_EQ(got.res[i].cached_tokens, bu.cached[i]) << "request " << i << ", " << what;
                EXPECT_EQ(got.res[i].tokens, fresh.res[i].tokens) << "request " << i << ", " << what;
                EXPECT_LT(max_abs_diff(got.res[i].prompt_logits, fresh.res[i].prompt_logits), 1e-4)
                    << "request " << i << ", " << what;
                loaded += bu.cached[i];
                loads += bu.cached[i] > 0;
            }
            EXPECT_EQ(got.t.host_saves, bu.saves) << what;
            EXPECT_EQ(got.t.host_loads, loads) << what;
            EXPECT_EQ(got.t.host_tokens, loaded) << what;
            EXPECT_EQ(got.t.prefill_tokens, fresh.t.prefill_tokens - loaded) << what;
            EXPECT_EQ(got.prefixes, bu.prefixes) << what;
            EXPECT_EQ(got.bytes, size_t(bu.bytes) * got.per) << what;
        }
    }
}

// The tier across processes (generate --prompt-cache, serve --cache-file): one engine's saves,
// the slot's at the end included, written to a file, read back and restored into a new engine's
// Batcher, where the next turns load them and go on as runs that prefill everything.
TEST(Batcher, SavedPrefixesGoOnInANewEngine) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 37});
    SingleRank comm;
    SamplerOptions greedy;
    greedy.temperature = 0;
    const std::vector<int32_t> a = make_prompt(20, cfg.vocab, 41), b = make_prompt(24, cfg.vocab, 43);
    for (const KVFormat kv : {KVFormat::F32, KVFormat::Int8}) {
        const std::string what = std::string("kv ") + kv_name(kv_dtype(kv));
        BatcherOptions bo;
        bo.prefill_chunk = 8;
        bo.reuse_prefix = true;
        std::vector<SavedPrefix> saved;
        std::vector<SequenceResult> first;
        size_t per = 0;
        {
            auto s = open_one_slot(d.path(), kv, comm);
            per = s->engine->kv_position_bytes();
            bo.host_cache_bytes = 1000 * per;
            Batcher bt(*s->engine, bo);
            bt.add(request(a, greedy, 0));
            while (bt.busy()) bt.step();
            bt.add(request(b, greedy, 1));  // a is saved as b takes the slot
            while (bt.busy()) bt.step();
            EXPECT_EQ(bt.host_prefixes(), 1) << what;
            bt.save_slots();  // b, from the slot
            bt.save_slots();  // (held already: no second copy)
            EXPECT_EQ(bt.timings().host_saves, 2) << what;
            saved = bt.take_host();
            EXPECT_EQ(bt.host_prefixes(), 0) << what;
            EXPECT_EQ(bt.host_bytes(), 0u) << what;
            first = {bt.result(0), bt.result(1)};
        }
        ASSERT_EQ(saved.size(), 2u) << what;
        EXPECT_EQ(saved[0].tokens, joined(a, {first[0].tokens.begin(), first[0].tokens.end() - 1})) << what;  // the older first
        EXPECT_EQ(saved[1].tokens, joined(b, {first[1].tokens.begin(), first[1].tokens.end() - 1})) << what;
        const std::string path = d.file("prefixes.kv");
        const PrefixFileKey key = {{"model", "tiny"}, {"position_bytes", std::to_string(per)}};
        write_prefix_file(path, key, saved);
        std::vector<SavedPrefix> back;
        std::string why;
        ASSERT_TRUE(read_prefix_file(path, key, back, why)) << why;
        ASSERT_EQ(back.size(), 2u);
        for (size_t i = 0; i < 2; ++i) {
            EXPECT_EQ(back[i].tokens, saved[i].tokens) << what;
            EXPECT_EQ(back[i].kv, saved[i].kv) << what;
        }
        const std::vector<BatchRequest> next = [&] {
            std::vector<BatchRequest> r = {request(joined(joined(a, first[0].tokens), {5, 6}), greedy, 2),
                                           request(joined(joined(b, first[1].tokens), {7}), greedy, 3)};
            for (BatchRequest& q : r) q.keep_prompt_logits = true;
            return r;
        }();
        auto s = open_one_slot(d.path(), kv, comm);
        std::vector<SequenceResult> fresh, resumed;
        run_all(*s->engine, BatcherOptions{}, next, fresh);
        {
            Batcher bt(*s->engine, bo);
            EXPECT_EQ(bt.restore_host(back), 2) << what;
            EXPECT_EQ(bt.host_bytes(), (saved[0].tokens.size() + saved[1].tokens.size()) * per) << what;
            for (const BatchRequest& q : next) bt.add(q);
            while (bt.busy()) bt.step();
            for (size_t i = 0; i < 2; ++i) resumed.push_back(bt.result(i));
            EXPECT_EQ(bt.timings().host_loads, 2) << what;
        }
        for (size_t i = 0; i < 2; ++i) {
            EXPECT_EQ(resumed[i].cached_tokens, int64_t(saved[i].tokens.size())) << "request " << i << ", " << what;
            EXPECT_EQ(resumed[i].tokens, fresh[i].tokens) << "request " << i << ", " << what;
            EXPECT_LT(max_abs_diff(resumed[i].prompt_logits, fresh[i].prompt_logits), 1e-4) << "request " << i << ", " << what;
        }
        // A budget that holds a's save but not b's: b's is skipped, not a's dropped for it.
        BatcherOptions small = bo;
        small.host_cache_bytes = saved[0].tokens.size() * per;
        Batcher bt(*s->engine, small);
        EXPECT_EQ(bt.restore_host(back), 1) << what;
        EXPECT_EQ(bt.host_bytes(), saved[0].kv.size()) << what;
        std::vector<SavedPrefix> bad = {saved[0]};
        bad[0].kv.pop_back();
        EXPECT_THROW(bt.restore_host(bad), Error) << what;
    }
}

// Prefix sharing between running sequences: four requests arriving together with one 48-token
// start (a system prompt). The first prefills it; the others wait while it does (it is longer
// than kMinPrefixWait), copy its keys and values (Engine::copy_kv, INT8 rows with their scales
// too) and prefill only their tails. A fifth, admitted once a slot frees, reuses what that slot
// holds. Tokens and prompt logits equal those of the same requests run without any reuse.
TEST(Batcher, BurstPrefillsASharedPrefixOnce) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 29});
    SingleRank comm;
    SamplerOptions greedy;
    greedy.temperature = 0;
    const std::vector<int32_t> sys = make_prompt(48, cfg.vocab, 61);
    std::vector<BatchRequest> r;
    for (int64_t i = 0; i < 4; ++i) {
        r.push_back(request(joined(sys, make_prompt(1 + (i * 2) % 5, cfg.vocab, 70 + uint64_t(i))), greedy, uint64_t(i)));
        r.back().keep_prompt_logits = true;
    }
    r[1].max_new_tokens = 2;  // ends first: request 4 then takes its slot
    r.push_back(request(joined(sys, {5, 6, 7}), greedy, 4));
    r[4].keep_prompt_logits = true;
    for (const KVFormat kv : {KVFormat::F32, KVFormat::Int8}) {
        auto run = [&](bool reuse, std::vector<SequenceResult>& out) {
            // A session each: the slots must hold nothing of the other run's prompts.
            SessionOptions so;
            so.model_dir = d.path();
            so.ctx = 96;
            so.max_batch = 4;
            so.prefill_chunk = 64;  // room for every prompt in the first step, were none to wait
            so.kv = kv;
            auto s = open_session(so, comm);
            BatcherOptions bo;
            bo.prefill_chunk = 64;
            bo.reuse_prefix = reuse;
            return run_all(*s->engine, bo, r, out);
        };
        std::vector<SequenceResult> fresh, shared;
        const GenerateTimings tf = run(false, fresh), ts = run(true, shared);
        int64_t cached = 0;
        for (size_t i = 0; i < r.size(); ++i) {
            const int64_t want = i == 0 ? 0 : 48;
            EXPECT_EQ(shared[i].cached_tokens, want) << "request " << i << ", kv " << int(kv);
            EXPECT_EQ(shared[i].tokens, fresh[i].tokens) << "request " << i << ", kv " << int(kv);
            EXPECT_LT(max_abs_diff(shared[i].prompt_logits, fresh[i].prompt_logits), 1e-4) << "request " << i;
            cached += shared[i].cached_tokens;
        }
        EXPECT_EQ(ts.prefill_tokens, tf.prefill_tokens - cached);
        // The first prompt runs alone, then the other tails together.
        EXPECT_EQ(ts.prefill_steps, 2 + 1) << "kv " << int(kv);  // (and request 4's tail later)
    }
}

// vLLM's cache_salt: keys and values are shared only between requests of one salt ("" is one
// too), through every path of the prefix cache. A burst of four with one 48-token start: the one
// of the first's salt copies its prefix, the others of other salts prefill it themselves; then
// freed slots serve later requests of their salt only. Through one slot and the host tier: a
// request of another salt finds nothing, while each salt's next request loads its own save. The
// tokens are those of runs without any reuse.
TEST(Batcher, CacheSaltKeepsPrefixesApart) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 29});
    SingleRank comm;
    SamplerOptions greedy;
    greedy.temperature = 0;
    const std::vector<int32_t> sys = make_prompt(48, cfg.vocab, 61);
    auto salted = [&](std::vector<int32_t> prompt, const std::string& salt, uint64_t stream) {
        BatchRequest q = request(std::move(prompt), greedy, stream);
        q.cache_salt = salt;
        return q;
    };
    // Phase 1, together: salts a, b, a, "" (the burst); phase 2, once they are done: b, c, "".
    const std::vector<BatchRequest> burst = {salted(joined(sys, {1}), "a", 0), salted(joined(sys, {2, 3}), "b", 1),
                                             salted(joined(sys, {4}), "a", 2), salted(joined(sys, {5, 6}), "", 3)};
    const std::vector<BatchRequest> later = {salted(joined(sys, {7}), "b", 4), salted(joined(sys, {8}), "c", 5),
                                             salted(joined(sys, {9}), "", 6)};
    auto run = [&](bool reuse, std::vector<SequenceResult>& out) {
        SessionOptions so;
        so.model_dir = d.path();
        so.ctx = 96;
        so.max_batch = 4;
        so.prefill_chunk = 64;
        auto s = open_session(so, comm);
        BatcherOptions bo;
        bo.prefill_chunk = 64;
        bo.reuse_prefix = reuse;
        Batcher b(*s->engine, bo);
        for (const BatchRequest& q : burst) b.add(q);
        while (b.busy()) b.step();
        for (const BatchRequest& q : later) b.add(q);
        while (b.busy()) b.step();
        for (size_t i = 0; i < burst.size() + later.size(); ++i) out.push_back(b.result(i));
    };
    std::vector<SequenceResult> fresh, shared;
    run(false, fresh);
    run(true, shared);
    const std::vector<int64_t> cached = {0, 0, 48, 0, 48, 0, 48};
    for (size_t i = 0; i < cached.size(); ++i) {
        EXPECT_EQ(shared[i].cached_tokens, cached[i]) << "request " << i;
        EXPECT_EQ(shared[i].tokens, fresh[i].tokens) << "request " << i;
    }

    // One slot and the host tier: x, then y of the same prompt (nothing: the slot holds x's),
    // then x's next turn (its save loads), then a prompt of salt w that the tier holds under x
    // and y only (nothing), then y's prompt again (its save loads).
    const std::vector<int32_t> p = make_prompt(20, cfg.vocab, 41);
    auto s = open_one_slot(d.path(), KVFormat::F32, comm);
    BatcherOptions bo;
    bo.prefill_chunk = 8;
    bo.reuse_prefix = true;
    bo.host_cache_bytes = 1000 * s->engine->kv_position_bytes();
    Batcher b(*s->engine, bo);
    auto one = [&](BatchRequest q) {
        const size_t id = b.add(std::move(q));
        while (b.busy()) b.step();
        return b.result(id);
    };
    const SequenceResult x = one(salted(p, "x", 0)), y = one(salted(p, "y", 1));
    EXPECT_EQ(y.tokens, x.tokens);  // the same prompt, greedy
    EXPECT_EQ(y.cached_tokens, 0);
    EXPECT_EQ(one(salted(joined(joined(p, x.tokens), {5}), "x", 2)).cached_tokens, 20 + 7);  // x's prompt and tokens but the last
    const SequenceResult w = one(salted(p, "w", 3));
    EXPECT_EQ(w.cached_tokens, 0);
    EXPECT_EQ(w.tokens, x.tokens);
    const SequenceResult y2 = one(salted(p, "y", 4));
    EXPECT_EQ(y2.cached_tokens, 20 - 1);  // (the last prompt token runs for its logits)
    EXPECT_EQ(y2.tokens, x.tokens);
    EXPECT_EQ(b.timings().host_loads, 2);
}

// ignore_eos and min_tokens on a model pushed to end at once (+100 on its end-of-sequence id):
// plain, it stops at its first token; with ignore_eos it runs to max_new_tokens; with min_tokens
// the end-of-sequence id is banned until then, through candidates (top-k) and whole rows alike.
TEST(Batcher, IgnoreEosAndMinTokens) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Qwen2);
    ASSERT_EQ(cfg.eos_ids, std::vector<int64_t>{2});
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 33});
    SingleRank comm;
    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 40;
    so.max_batch = 3;
    so.max_penalties = 2;
    auto s = open_session(so, comm);
    for (const int64_t k : {int64_t(1), int64_t(0)}) {
        SamplerOptions eos;
        eos.temperature = k == 1 ? 0.0f : 0.7f;
        eos.top_k = k;
        eos.top_p = 1;
        eos.logit_bias = {{2, 100.0f}};
        Batcher b(*s->engine, BatcherOptions{});
        std::vector<BatchRequest> r(3, request(make_prompt(4, cfg.vocab, 90), eos, 0));
        r[1].ignore_eos = true;
        r[2].min_tokens = 5;
        for (const BatchRequest& q : r) b.add(q);
        while (b.busy()) b.step();
        EXPECT_EQ(b.result(0).tokens, std::vector<int32_t>{2});
        EXPECT_EQ(b.result(0).stop_reason, "eos");
        EXPECT_EQ(b.result(1).tokens, std::vector<int32_t>(8, 2));
        EXPECT_EQ(b.result(1).stop_reason, "length");
        const std::vector<int32_t>& t = b.result(2).tokens;
        ASSERT_EQ(t.size(), 6u) << "top_k " << k;
        for (size_t i = 0; i < 5; ++i) EXPECT_NE(t[i], 2) << "token " << i;
        EXPECT_EQ(t[5], 2);
        EXPECT_EQ(b.result(2).stop_reason, "eos");
        BatchRequest bad = r[2];
        bad.min_tokens = 9;  // above max_new_tokens
        EXPECT_THROW(b.add(bad), Error);
    }
}

// Prompt lookup: the tokens after the latest earlier occurrence of the longest n-gram (2 to 4)
// that ends the sequence, read on as a repetition past the end; nothing for a fresh n-gram.
TEST(Speculate, LookupProposesWhatFollowedTheLatestMatch) {
    auto draft = [](std::vector<int32_t> s, int64_t k) { return lookup_draft(s.data(), int64_t(s.size()), k); };
    EXPECT_TRUE(draft({1, 2, 3, 4, 5}, 4).empty());
    EXPECT_TRUE(draft({7, 1, 7}, 4).empty());  // a one-token match is not enough
    EXPECT_EQ(draft({1, 2, 3, 9, 9, 1, 2}, 2), (std::vector<int32_t>{3, 9}));
    // The latest occurrence of "1 2" wins; "5 1 2" (longer) beats both.
    EXPECT_EQ(draft({1, 2, 3, 1, 2, 4, 8, 1, 2}, 1), (std::vector<int32_t>{4}));
    EXPECT_EQ(draft({5, 1, 2, 6, 1, 2, 7, 5, 1, 2}, 1), (std::vector<int32_t>{6}));
    // A loop of period 3: the proposal goes on repeating it past the end.
    EXPECT_EQ(draft({4, 5, 6, 4, 5, 6}, 7), (std::vector<int32_t>{4, 5, 6, 4, 5, 6, 4}));
    EXPECT_EQ(draft({3, 3, 3}, 3), (std::vector<int32_t>{3, 3, 3}));
    EXPECT_TRUE(draft({3, 3, 3}, 0).empty());
}

// Speculative decoding: greedy requests give the tokens they give without it, in fewer steps on
// text that repeats (a prompt that is a phrase said three times, and tiny random models' greedy
// loops); a sampled request in the same batch keeps its tokens too. The length limit and the logits
// rows' budget (the engine's default: a row per slot, free once a sequence ends) are respected.
TEST(Batcher, SpeculationKeepsGreedyTokensInFewerSteps) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 31});
    SingleRank comm;
    SamplerOptions greedy, sampled;
    greedy.temperature = 0;
    sampled.temperature = 0.9f;
    sampled.seed = 5;
    const std::vector<int32_t> phrase = make_prompt(6, cfg.vocab, 81);
    const std::vector<int32_t> said_thrice = joined(joined(phrase, phrase), phrase);
    std::vector<BatchRequest> r = {request(said_thrice, greedy, 0), request(make_prompt(5, cfg.vocab, 82), greedy, 1),
                                   request(make_prompt(4, cfg.vocab, 83), sampled, 2)};
    for (BatchRequest& q : r) q.max_new_tokens = 30;
    r[1].max_new_tokens = 23;
    r[2].max_new_tokens = 10;
    for (const int64_t rows : {int64_t(0), int64_t(6)}) {  // 0: the engine's default, one row per slot
        auto run = [&](int64_t speculate, std::vector<SequenceResult>& out, int64_t max_batch = 0) {
            SessionOptions so;
            so.model_dir = d.path();
            so.ctx = 64;
            so.max_batch = 3;
            so.prefill_chunk = 16;
            so.max_logit_rows = rows;
            auto s = open_session(so, comm);
            BatcherOptions bo;
            bo.prefill_chunk = 16;
            bo.speculate = speculate;
            bo.speculate_max_batch = max_batch;
            return run_all(*s->engine, bo, r, out);
        };
        std::vector<SequenceResult> plain, spec;
        const GenerateTimings tp = run(0, plain), ts = run(4, spec);
        for (size_t i = 0; i < r.size(); ++i) {
            EXPECT_EQ(spec[i].tokens, plain[i].tokens) << "request " << i << ", rows " << rows;
            EXPECT_EQ(spec[i].stop_reason, plain[i].stop_reason) << "request " << i;
        }
        EXPECT_EQ(tp.draft_tokens, 0);
        EXPECT_EQ(ts.decode_tokens, tp.decode_tokens);
        if (rows == 0) continue;  // rows to spare only once a sequence has ended
        EXPECT_GT(ts.accepted_tokens, 0);
        EXPECT_LE(ts.accepted_tokens, ts.draft_tokens);
        EXPECT_LT(ts.decode_steps, tp.decode_steps);
        // Only in steps with one decoding sequence: once the two shorter requests have ended.
        std::vector<SequenceResult> late;
        const GenerateTimings tl = run(4, late, 1);
        for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(late[i].tokens, plain[i].tokens) << "request " << i;
        EXPECT_GT(tl.draft_tokens, 0);
        EXPECT_LT(tl.draft_tokens, ts.draft_tokens);
    }
}

// A draft model (BatcherOptions::draft) proposes instead of prompt lookup, and the tokens stay
// those of decoding without speculation, greedy and seeded draws, with two slots for three
// requests (a slot's draft cache then holds another sequence's tokens) and a penalised request.
// Drafts: the target itself (its greedy proposals are all confirmed: fewer steps), another random
// model of the shape (few are), and a one-layer model with 64 ids past the target's vocabulary
// (a proposal ends before such an id).
TEST(Batcher, DraftModelKeepsTheTokens) {
    const ModelConfig cfg = tiny_config(Arch::Llama);
    ModelConfig wide = cfg;
    wide.vocab += 64;
    wide.n_layers = 1;
    TempDir d, other, w;
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 31});
    write_synthetic_checkpoint(other.path(), cfg, {DType::F32, 1, 32});
    write_synthetic_checkpoint(w.path(), wide, {DType::F32, 1, 33});
    SingleRank comm;
    SamplerOptions greedy, sampled, penalised;
    greedy.temperature = 0;
    sampled.temperature = 0.9f;
    sampled.seed = 5;
    penalised.temperature = 0;
    penalised.presence_penalty = 60.0f;
    penalised.penalty_last_n = 2;
    std::vector<BatchRequest> r = {request(make_prompt(9, cfg.vocab, 81), greedy, 0), request(make_prompt(5, cfg.vocab, 82), sampled, 1),
                                   request(make_prompt(4, cfg.vocab, 83), greedy, 2), request(make_prompt(6, cfg.vocab, 84), penalised, 3)};
    for (BatchRequest& q : r) q.max_new_tokens = 20;
    r[1].max_new_tokens = 12;
    auto open = [&](const std::string& dir) {
        SessionOptions so;
        so.model_dir = dir;
        so.ctx = 64;
        so.max_batch = 2;
        so.prefill_chunk = 16;
        so.max_logit_rows = 10;
        so.max_penalties = 16;
        return open_session(so, comm);
    };
    auto target = open(d.path());
    BatcherOptions bo;
    bo.prefill_chunk = 16;
    std::vector<SequenceResult> plain;
    const GenerateTimings tp = run_all(*target->engine, bo, r, plain);
    for (const std::string& dir : {d.path(), other.path(), w.path()}) {
        auto draft = open(dir);
        bo.speculate = 4;
        bo.draft = draft->engine.get();
        std::vector<SequenceResult> spec;
        const GenerateTimings ts = run_all(*target->engine, bo, r, spec);
        for (size_t i = 0; i < r.size(); ++i) {
            EXPECT_EQ(spec[i].tokens, plain[i].tokens) << dir << " request " << i;
            EXPECT_EQ(spec[i].stop_reason, plain[i].stop_reason) << dir << " request " << i;
        }
        EXPECT_GT(ts.draft_tokens, 0) << dir;
        EXPECT_GT(ts.draft_ms, 0.0) << dir;
        EXPECT_LE(ts.accepted_tokens, ts.draft_tokens);
        // The target drafting for itself: its own greedy choices, confirmed but where the
        // sampled and the penalised requests choose otherwise.
        if (dir == d.path()) {
            EXPECT_GE(ts.accepted_tokens * 4, ts.draft_tokens * 3) << ts.accepted_tokens << " of " << ts.draft_tokens;
            EXPECT_LT(ts.decode_steps * 2, tp.decode_steps) << ts.decode_steps << " steps against " << tp.decode_steps;
        }
    }
    // A probability floor (--draft-p-min) cuts a proposal before the draft's unsure tokens: fewer
    // proposed, the same tokens; with a floor of 1 only certainties are proposed.
    {
        auto draft = open(d.path());
        bo.draft = draft->engine.get();
        int64_t proposed = std::numeric_limits<int64_t>::max();
        for (const float p_min : {0.0f, 0.9f, 1.0f}) {
            bo.draft_p_min = p_min;
            std::vector<SequenceResult> spec;
            const GenerateTimings ts = run_all(*target->engine, bo, r, spec);
            for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(spec[i].tokens, plain[i].tokens) << "p_min " << p_min << " request " << i;
            EXPECT_LE(ts.draft_tokens, proposed) << "p_min " << p_min;
            if (p_min > 0) {
                EXPECT_LT(ts.draft_tokens, 62) << "p_min " << p_min;  // 62 without a floor (above)
            }
            proposed = ts.draft_tokens;
        }
        bo.draft_p_min = 0;
    }
    // A draft engine with fewer slots than the batcher runs is a programming error.
    SessionOptions one;
    one.model_dir = other.path();
    one.ctx = 64;
    one.max_batch = 1;
    auto small = open_session(one, comm);
    bo.draft = small->engine.get();
    EXPECT_THROW(Batcher(*target->engine, bo), Error);
}

// BatcherOptions::speculate_max_tokens: a step that carries proposals holds at most that many
// tokens, its decode tokens included, the proposals shared among the sequences; the tokens stay
// those of decoding without speculation (f32 weights: one kernel path for any row count).
TEST(Batcher, SpeculationWithinAStepTokenLimit) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 31});
    SingleRank comm;
    SamplerOptions greedy;
    greedy.temperature = 0;
    const std::vector<int32_t> phrase = make_prompt(6, cfg.vocab, 81);
    std::vector<BatchRequest> r;
    for (uint64_t i = 0; i < 3; ++i) r.push_back(request(joined(joined(make_prompt(3, cfg.vocab, 90 + i), phrase), phrase), greedy, i));
    for (BatchRequest& q : r) q.max_new_tokens = 24;
    auto run = [&](int64_t speculate, int64_t max_tokens, std::vector<SequenceResult>& out, int64_t* most) {
        SessionOptions so;
        so.model_dir = d.path();
        so.ctx = 64;
        so.max_batch = 3;
        so.prefill_chunk = 32;
        so.max_logit_rows = 16;
        auto s = open_session(so, comm);
        RecordingEngine e(*s->engine);
        BatcherOptions bo;
        bo.prefill_chunk = 32;
        bo.speculate = speculate;
        bo.speculate_max_tokens = max_tokens;
        const GenerateTimings t = run_all(e, bo, r, out);
        *most = 0;  // the most tokens of a step that carried proposals
        for (const auto& step : e.steps) {
            int64_t tokens = 0;
            bool spec = false;
            for (const RecordingEngine::Chunk& c : step) {
                tokens += c.n;
                spec = spec || (c.all_logits && c.n > 1);
            }
            if (spec) *most = std::max(*most, tokens);
        }
        return t;
    };
    std::vector<SequenceResult> plain, wide, capped;
    int64_t most_plain = 0, most_wide = 0, most_capped = 0;
    const GenerateTimings tp = run(0, 0, plain, &most_plain), tw = run(4, 0, wide, &most_wide),
                          tc = run(4, 5, capped, &most_capped);
    EXPECT_EQ(most_plain, 0);
    EXPECT_GT(most_wide, 5);  // three sequences with up to four proposals each
    EXPECT_GT(most_capped, 3);
    EXPECT_LE(most_capped, 5);
    EXPECT_GT(tc.draft_tokens, 0);
    EXPECT_LT(tc.draft_tokens, tw.draft_tokens);
    EXPECT_LE(tc.decode_steps, tp.decode_steps);
    for (size_t i = 0; i < r.size(); ++i) {
        EXPECT_EQ(wide[i].tokens, plain[i].tokens) << i;
        EXPECT_EQ(capped[i].tokens, plain[i].tokens) << i;
    }
}

// Every request speculates: a proposal is one token, so keeping it when the sequence's own draw
// from the row is that token is speculative sampling's rule, and each row's token penalties, bias
// and min_tokens ban are reckoned on the host from the tokens kept before it. The draws, one per
// kept token, are the ones made without speculation: the same tokens and logprobs for each
// sampler path (whole rows, top-k candidates, top-p alone, min-p) and with penalties, greedy and
// sampled, with proposals both kept and rejected.
TEST(Batcher, SpeculationKeepsSampledAndPenalisedTokens) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 31});
    SingleRank comm;
    std::vector<SamplerOptions> samplers(6);
    for (size_t i = 0; i < samplers.size(); ++i) samplers[i].seed = 11 + i;
    samplers[0].top_k = 0;  // whole rows
    samplers[0].top_p = 1.0f;
    samplers[0].temperature = 0.6f;
    samplers[1].top_k = 8;  // candidates
    samplers[1].temperature = 1.0f;
    samplers[2].top_k = 0;  // top-p alone
    samplers[2].top_p = 0.9f;
    samplers[2].temperature = 0.8f;
    samplers[3].min_p = 0.05f;
    samplers[3].temperature = 0.7f;
    // Penalties that decide every token, and loops that lookup predicts: ids biased far above the
    // rest, the latest one or two pushed back below the others by a presence penalty over a
    // window of 1 or 2. Greedy: 7 and 9 in turn. Sampled: 11, 12, 13 round and round until
    // min_tokens lets the end-of-sequence id (2, biased higher still) end it.
    samplers[4].temperature = 0;
    samplers[4].logit_bias = {{7, 50.0f}, {9, 50.0f}};
    samplers[4].presence_penalty = 60.0f;
    samplers[4].penalty_last_n = 1;
    samplers[5].temperature = 0.5f;
    samplers[5].logit_bias = {{11, 50.0f}, {12, 50.0f}, {13, 50.0f}, {2, 100.0f}};
    samplers[5].presence_penalty = 60.0f;
    samplers[5].penalty_last_n = 2;
    const std::vector<int32_t> phrase = make_prompt(6, cfg.vocab, 81);
    std::vector<BatchRequest> r;
    for (size_t i = 0; i < samplers.size(); ++i) {
        r.push_back(request(joined(joined(phrase, make_prompt(2, cfg.vocab, 90 + i)), phrase), samplers[i], int64_t(i)));
        r.back().max_new_tokens = 40;
    }
    r[1].logprobs = 2;
    r[5].min_tokens = 25;
    auto run = [&](int64_t speculate, std::vector<SequenceResult>& out) {
        SessionOptions so;
        so.model_dir = d.path();
        so.ctx = 96;
        so.max_batch = 6;
        so.prefill_chunk = 32;
        so.max_logit_rows = 24;
        so.max_penalties = 64;
        auto s = open_session(so, comm);
        BatcherOptions bo;
        bo.prefill_chunk = 32;
        bo.speculate = speculate;
        return run_all(*s->engine, bo, r, out);
    };
    std::vector<SequenceResult> plain, spec;
    const GenerateTimings tp = run(0, plain), ts = run(4, spec);
    for (size_t i = 0; i < r.size(); ++i) {
        EXPECT_EQ(spec[i].tokens, plain[i].tokens) << "request " << i;
        EXPECT_EQ(spec[i].stop_reason, plain[i].stop_reason) << "request " << i;
    }
    ASSERT_EQ(spec[1].logprobs.size(), plain[1].logprobs.size());
    for (size_t t = 0; t < plain[1].logprobs.size(); ++t) {
        EXPECT_EQ(spec[1].logprobs[t].token.id, plain[1].logprobs[t].token.id);
        EXPECT_NEAR(spec[1].logprobs[t].token.logprob, plain[1].logprobs[t].token.logprob, 1e-4f) << "token " << t;
    }
    EXPECT_EQ(ts.decode_tokens, tp.decode_tokens);
    EXPECT_GT(ts.accepted_tokens, 0);
    EXPECT_LT(ts.accepted_tokens, ts.draft_tokens);  // some proposals were drawn against
    // The penalised requests alone (the same streams): proposals of theirs were kept too.
    const std::vector<BatchRequest> all = r;
    r = {all[4], all[5]};
    std::vector<SequenceResult> penalised;
    const GenerateTimings tq = run(4, penalised);
    for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(penalised[i].tokens, plain[4 + i].tokens) << "request " << 4 + i;
    EXPECT_GT(tq.accepted_tokens, 0);
    ASSERT_EQ(plain[5].tokens.size(), 26u);
    EXPECT_EQ(plain[5].tokens.back(), 2);
    std::printf("speculation: %lld of %lld proposals kept, penalised requests alone %lld of %lld\n",
                (long long)ts.accepted_tokens, (long long)ts.draft_tokens, (long long)tq.accepted_tokens,
                (long long)tq.draft_tokens);
}

// JSON mode: every choice keeps the text one JSON object's start (a vocabulary of JSON pieces
// over the tiny model's ids), a closed object ends the request ("stop") and parses; a bias
// towards '}' closes it at once; speculation keeps the tokens; no vocabulary, no request.
TEST(Batcher, JsonModeKeepsTheTextOneObject) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 31});
    const std::vector<std::string>& pieces = kJsonPieces;
    const std::vector<std::string> bytes = json_piece_bytes(cfg.vocab);
    JsonVocab vocab(bytes);
    SingleRank comm;
    std::vector<BatchRequest> r;
    const auto json_mode = std::make_shared<const JsonSchema>(json_object_schema());
    for (uint64_t i = 0; i < 6; ++i) {
        SamplerOptions so;
        so.temperature = i < 4 ? 1.0f : 0.0f;
        so.top_k = 0;
        so.top_p = 1.0f;
        so.seed = 40 + i;
        r.push_back(request(make_prompt(5, cfg.vocab, 70 + i), so, i));
        r.back().max_new_tokens = 48;
        r.back().json = json_mode;
    }
    const int32_t close = int32_t(3 + (1 + pieces.size() - 3 % pieces.size()) % pieces.size());  // an id of "}"
    ASSERT_EQ(bytes[size_t(close)], "}");
    r[5].sampler.logit_bias = {{close, 30.0f}};
    std::vector<SequenceResult> out, spec;
    run_json(d.path(), 96, vocab, 0, r, out);
    run_json(d.path(), 96, vocab, 3, r, spec);
    int closed = 0;
    for (size_t i = 0; i < r.size(); ++i) {
        EXPECT_EQ(spec[i].tokens, out[i].tokens) << "request " << i;
        std::string text;
        for (const int32_t t : out[i].tokens) text += bytes[size_t(t)];
        JsonAcceptor a;
        EXPECT_TRUE(a.push(text)) << "request " << i << ": " << text;
        if (out[i].stop_reason == "stop") {
            EXPECT_TRUE(a.complete()) << text;
            const nlohmann::json j = nlohmann::json::parse(text);
            EXPECT_TRUE(j.is_object()) << text;
            ++closed;
        } else {
            EXPECT_EQ(out[i].stop_reason, "length") << text;
            EXPECT_FALSE(a.complete()) << text;
        }
    }
    EXPECT_EQ(out[5].tokens.size(), 2u);  // "{" then the biased "}"
    EXPECT_EQ(out[5].stop_reason, "stop");
    EXPECT_GE(closed, 2) << "objects closed";
    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 32;
    auto s = open_session(so, comm);
    Batcher b(*s->engine, BatcherOptions{});
    EXPECT_THROW(b.add(r[0]), Error);
}

// vLLM's allowed_token_ids and bad_words (BatchRequest::allowed_ids, bad_words). Each greedy
// token is checked against its own reference: the unmasked logits row after the prompt and the
// tokens before it (keep_prompt_logits of a request that ends there), with the ids the request
// bans at that point taken out, gives the token by its argmax. Sampled and speculated runs keep
// the bans, and speculation keeps the tokens.
TEST(Batcher, AllowedIdsAndBadWordsBanTokens) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 31});
    SingleRank comm;
    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 64;
    so.max_batch = 3;
    so.prefill_chunk = 16;
    so.max_logit_rows = 6;
    auto s = open_session(so, comm);
    SamplerOptions greedy;
    greedy.temperature = 0;
    const std::vector<int32_t> phrase = make_prompt(6, cfg.vocab, 81);
    const std::vector<int32_t> prompt = joined(joined(phrase, phrase), phrase);  // prompt lookup finds proposals
    BatchRequest plain = request(prompt, greedy, 0);
    plain.max_new_tokens = 12;
    plain.ignore_eos = true;
    std::vector<SequenceResult> out;
    run_all(*s->engine, BatcherOptions{}, {plain}, out);
    const std::vector<int32_t> free_run = out[0].tokens;
    ASSERT_EQ(free_run.size(), 12u);

    // Whether a request bans `id` after the generated tokens `t`.
    auto banned = [](const BatchRequest& q, const std::vector<int32_t>& t, int32_t id) {
        if (!q.allowed_ids.empty() && std::find(q.allowed_ids.begin(), q.allowed_ids.end(), id) == q.allowed_ids.end())
            return true;
        for (const std::vector<int32_t>& w : q.bad_words)
            if (w.back() == id && w.size() - 1 <= t.size() && std::equal(w.begin(), w.end() - 1, t.end() - ptrdiff_t(w.size() - 1)))
                return true;
        return false;
    };
    auto check_greedy = [&](const BatchRequest& q, const std::vector<int32_t>& got, const std::string& what) {
        std::vector<BatchRequest> refs;
        for (size_t k = 0; k < got.size(); ++k) {
            BatchRequest r = request(joined(prompt, std::vector<int32_t>(got.begin(), got.begin() + ptrdiff_t(k))), greedy, 0);
            r.max_new_tokens = 1;
            r.keep_prompt_logits = true;
            refs.push_back(r);
        }
        std::vector<SequenceResult> rows;
        run_all(*s->engine, BatcherOptions{}, refs, rows);
        for (size_t k = 0; k < got.size(); ++k) {
            const std::vector<int32_t> before(got.begin(), got.begin() + ptrdiff_t(k));
            int32_t best = -1;
            for (int32_t id = 0; id < int32_t(cfg.vocab); ++id)
                if (!banned(q, before, id) && (best < 0 || rows[k].prompt_logits[size_t(id)] > rows[k].prompt_logits[size_t(best)]))
                    best = id;
            EXPECT_EQ(got[k], best) << what << ", token " << k;
        }
    };

    // Allowed ids that hold the free run's tokens bind nothing; five others bind every token.
    BatchRequest loose = plain;
    loose.allowed_ids = free_run;
    std::sort(loose.allowed_ids.begin(), loose.allowed_ids.end());
    loose.allowed_ids.erase(std::unique(loose.allowed_ids.begin(), loose.allowed_ids.end()), loose.allowed_ids.end());
    loose.allowed_ids.push_back(int32_t(cfg.vocab - 1) == free_run[0] ? 0 : int32_t(cfg.vocab - 1));
    BatchRequest tight = plain;
    for (int32_t id = 5; tight.allowed_ids.size() < 5; id += 37)
        if (std::find(free_run.begin(), free_run.end(), id) == free_run.end()) tight.allowed_ids.push_back(id);
    // Bad words: the free run's third token alone, and the pair of its fifth and sixth.
    BatchRequest words = plain;
    words.bad_words = {{free_run[2]}, {free_run[4], free_run[5]}};
    BatchRequest both = tight;
    both.bad_words = {{tight.allowed_ids[0]}, {tight.allowed_ids[1], tight.allowed_ids[2]}};
    const std::vector<BatchRequest> r = {loose, tight, words, both};
    std::vector<SequenceResult> got, spec;
    run_all(*s->engine, BatcherOptions{}, r, got);
    BatcherOptions speculating;
    speculating.speculate = 3;
    const GenerateTimings ts = run_all(*s->engine, speculating, r, spec);
    EXPECT_GT(ts.draft_tokens, 0);
    EXPECT_EQ(got[0].tokens, free_run);
    const char* names[] = {"allowed, loose", "allowed, tight", "bad words", "allowed and bad words"};
    for (size_t i = 0; i < r.size(); ++i) {
        ASSERT_EQ(got[i].tokens.size(), 12u) << names[i];
        check_greedy(r[i], got[i].tokens, names[i]);
        EXPECT_EQ(spec[i].tokens, got[i].tokens) << names[i] << ", speculating";
    }
    for (const int32_t t : got[1].tokens)
        EXPECT_NE(std::find(tight.allowed_ids.begin(), tight.allowed_ids.end(), t), tight.allowed_ids.end()) << t;
    // The bans bind: the single bad word was the third token, the pair's second the sixth.
    EXPECT_EQ(std::vector<int32_t>(got[2].tokens.begin(), got[2].tokens.begin() + 2),
              std::vector<int32_t>(free_run.begin(), free_run.begin() + 2));
    EXPECT_NE(got[2].tokens[2], free_run[2]);

    // Sampled: never a banned token, over seeds, whole rows or speculating.
    std::vector<BatchRequest> sampled;
    for (uint64_t seed = 0; seed < 6; ++seed)
        for (const BatchRequest& q : {tight, words, both}) {
            BatchRequest x = q;
            x.sampler.temperature = 1.5f;
            x.sampler.top_k = seed % 2 ? 0 : 20;
            x.sampler.top_p = seed % 3 ? 1.0f : 0.9f;
            x.sampler.seed = seed;
            x.stream = seed;
            sampled.push_back(x);
        }
    for (const BatcherOptions& bo : {BatcherOptions{}, speculating}) {
        std::vector<SequenceResult> drawn;
        run_all(*s->engine, bo, sampled, drawn);
        for (size_t i = 0; i < sampled.size(); ++i) {
            const std::vector<int32_t>& t = drawn[i].tokens;
            for (size_t k = 0; k < t.size(); ++k)
                EXPECT_FALSE(banned(sampled[i], std::vector<int32_t>(t.begin(), t.begin() + ptrdiff_t(k)), t[k]))
                    << "request " << i << ", token " << k;
        }
    }

    // Nothing left to draw: the sequence ends on its end-of-sequence id.
    BatchRequest none = plain;
    none.ignore_eos = false;
    none.allowed_ids = {free_run[0]};
    none.bad_words = {{free_run[0]}};
    out.clear();
    run_all(*s->engine, BatcherOptions{}, {none}, out);
    ASSERT_EQ(out[0].tokens.size(), 1u);
    EXPECT_EQ(out[0].tokens[0], int32_t(cfg.eos_ids[0]));
    EXPECT_EQ(out[0].stop_reason, "eos");
    // Ids past the vocabulary, and an empty bad word.
    Batcher b(*s->engine, BatcherOptions{});
    BatchRequest bad = plain;
    bad.allowed_ids = {int32_t(cfg.vocab)};
    EXPECT_THROW(b.add(bad), Error);
    bad = plain;
    bad.bad_words = {{1}, {}};
    EXPECT_THROW(b.add(bad), Error);
    bad.bad_words = {{1, int32_t(cfg.vocab)}};
    EXPECT_THROW(b.add(bad), Error);
}

// Reasoning before a constrained reply (serve --reasoning-parser): the first token may open it
// (think_open, whose bytes no JSON value starts with), the sequence is free until think_close, and
// the JSON constraint holds from there; with speculation the same tokens. Without the tags the
// opening token is never drawn; a reply that starts with JSON stays constrained throughout.
TEST(Batcher, ReasoningBeforeAConstrainedReply) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 31});
    const std::vector<std::string> bytes = json_piece_bytes(cfg.vocab);
    JsonVocab vocab(bytes);
    const int32_t open = 24, close = 49;  // both "xyz"
    ASSERT_EQ(bytes[size_t(open)], "xyz");
    ASSERT_EQ(bytes[size_t(close)], "xyz");
    SingleRank comm;
    const auto json_mode = std::make_shared<const JsonSchema>(json_object_schema());
    SamplerOptions greedy;
    greedy.temperature = 0;
    std::vector<BatchRequest> r;
    for (uint64_t i = 0; i < 3; ++i) {
        r.push_back(request(make_prompt(5, cfg.vocab, 90 + i), greedy, i));
        r.back().max_new_tokens = 24;
        r.back().json = json_mode;
    }
    r[0].think_open = r[2].think_open = open;
    r[0].think_close = r[2].think_close = close;
    r[0].sampler.logit_bias = r[1].sampler.logit_bias = {{open, 50.0f}, {close, 100.0f}};
    // Started inside the reasoning (DeepSeek R1's prompt opened it): 3 never closes it, so it runs
    // as free as 5 (the same without JSON); 4 closes it at once and is held to JSON after.
    for (uint64_t i = 3; i < 6; ++i) {
        r.push_back(request(make_prompt(5, cfg.vocab, 93), greedy, i));
        r.back().max_new_tokens = 24;
        r.back().json = i < 5 ? json_mode : nullptr;
        r.back().think_open = open;
        r.back().think_close = close;
        r.back().think_first = i < 5;
        r.back().sampler.logit_bias = {{close, i == 4 ? 100.0f : -100.0f}};
    }
    std::vector<SequenceResult> out, spec;
    run_json(d.path(), 64, vocab, 0, r, out);
    run_json(d.path(), 64, vocab, 3, r, spec);
    for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(spec[i].tokens, out[i].tokens) << "request " << i;
    auto json_text = [&](const std::vector<int32_t>& t, size_t from) {
        std::string text;
        for (size_t k = from; k < t.size(); ++k) text += bytes[size_t(t[k])];
        return text;
    };
    // Opened (the bias), closed at once (the larger bias), then one JSON value's start or whole.
    ASSERT_GE(out[0].tokens.size(), 3u);
    EXPECT_EQ(out[0].tokens[0], open);
    EXPECT_EQ(out[0].tokens[1], close);
    JsonAcceptor a;
    EXPECT_TRUE(a.push(json_text(out[0].tokens, 2))) << json_text(out[0].tokens, 2);
    EXPECT_EQ(a.complete(), out[0].stop_reason == "stop");
    // No tags: the same bias cannot open anything; JSON from the first token.
    EXPECT_NE(out[1].tokens[0], open);
    JsonAcceptor b;
    EXPECT_TRUE(b.push(json_text(out[1].tokens, 0))) << json_text(out[1].tokens, 0);
    // Tags, but a reply that starts with JSON: constrained all along.
    EXPECT_NE(out[2].tokens[0], open);
    JsonAcceptor c;
    EXPECT_TRUE(c.push(json_text(out[2].tokens, 0))) << json_text(out[2].tokens, 0);
    EXPECT_EQ(out[3].tokens, out[5].tokens);
    EXPECT_EQ(out[3].tokens.size(), 24u);
    JsonAcceptor free_text;
    EXPECT_FALSE(free_text.push(json_text(out[3].tokens, 0))) << "the free reply happens to be JSON: a weak check";
    ASSERT_GE(out[4].tokens.size(), 2u);
    EXPECT_EQ(out[4].tokens[0], close);
    JsonAcceptor d4;
    EXPECT_TRUE(d4.push(json_text(out[4].tokens, 1))) << json_text(out[4].tokens, 1);
    // Tags out of the vocabulary are refused.
    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 32;
    auto s = open_session(so, comm);
    BatcherOptions bo;
    bo.json_vocab = &vocab;
    Batcher bad(*s->engine, bo);
    BatchRequest q = r[0];
    q.think_close = int32_t(cfg.vocab);
    EXPECT_THROW(bad.add(q), Error);
    BatchRequest first = r[1];  // starting inside reasoning that has no tags
    first.think_first = true;
    EXPECT_THROW(bad.add(first), Error);
}

// On a model that slides over a window on every layer the slot is a ring of window + chunk - 1
// positions: a freed slot that wrote no more than that keeps its prefix, one that wrapped keeps
// nothing (its early positions were overwritten).
TEST(Batcher, PrefixReuseSkipsAWrappedRing) {
    TempDir d;
    ModelConfig cfg = tiny_config(Arch::Mistral);
    cfg.sliding_window = 4;
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 25});
    SingleRank comm;
    auto s = open_tiny(d.path(), 1, comm);
    ASSERT_EQ(kv_capacity(s->cfg, s->engine->options()), 4 + 5 - 1);
    SamplerOptions greedy;
    greedy.temperature = 0;
    auto run = [&](bool reuse, std::vector<SequenceResult>& out) {
        BatcherOptions bo;
        bo.prefill_chunk = 5;
        bo.reuse_prefix = reuse;
        Batcher b(*s->engine, bo);
        // Each request goes on from the one before it: 3 + 1 positions written (kept), then
        // 5 + 7 (wrapped).
        std::vector<int32_t> prompt = make_prompt(3, cfg.vocab, 41);
        for (const int64_t max_new : {2, 1, 8, 2}) {
            BatchRequest r = request(prompt, greedy, out.size());
            r.max_new_tokens = max_new;
            const size_t id = b.add(r);
            while (b.busy()) b.step();
            out.push_back(b.result(id));
            prompt = joined(joined(prompt, out.back().tokens), {int32_t(max_new)});
            if (max_new == 1) prompt = make_prompt(5, cfg.vocab, 42);  // a new conversation
        }
    };
    std::vector<SequenceResult> fresh, reused;
    run(false, fresh);
    run(true, reused);
    ASSERT_EQ(fresh[2].tokens.size(), 8u);
    const std::vector<int64_t> cached = {0, 4, 0, 0};
    for (size_t i = 0; i < fresh.size(); ++i) {
        EXPECT_EQ(reused[i].cached_tokens, cached[i]) << "request " << i;
        EXPECT_EQ(reused[i].tokens, fresh[i].tokens) << "request " << i;
    }
}

// Rejected speculative proposals are written to the cache too: on a sliding-window ring (8 rows)
// a sequence whose proposals ran past the ring holds nothing reusable even when the tokens it
// kept would fit, and a later request with its prompt prefills it whole (reusing it would read
// rows the proposals overwrote).
TEST(Batcher, PrefixReuseSkipsARingSpeculationWrapped) {
    TempDir d;
    ModelConfig cfg = tiny_config(Arch::Mistral);
    cfg.sliding_window = 4;
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 37});
    SingleRank comm;
    SessionOptions so;
    so.model_dir = d.path();
    so.ctx = 40;
    so.max_batch = 1;
    so.prefill_chunk = 5;
    so.max_logit_rows = 5;
    auto s = open_session(so, comm);
    ASSERT_EQ(kv_capacity(s->cfg, s->engine->options()), 8);
    SamplerOptions greedy;
    greedy.temperature = 0;
    BatcherOptions bo;
    bo.prefill_chunk = 5;
    bo.speculate = 4;
    bo.reuse_prefix = true;
    // A two-token prompt whose greedy text falls into a loop early: the first step that proposes
    // (four tokens) writes past the ring's 8 rows while the tokens kept still fit in it.
    bool found = false;
    for (uint64_t seed = 0; seed < 400 && !found; ++seed) {
        BatchRequest r = request(make_prompt(2, cfg.vocab, 100 + seed), greedy, 0);
        r.max_new_tokens = 12;
        r.keep_prompt_logits = true;
        Batcher b(*s->engine, bo);
        b.add(r);
        while (b.busy() && b.timings().draft_tokens == 0) b.step();
        const GenerateTimings& t = b.timings();
        const int64_t kept = 2 + int64_t(b.result(0).tokens.size()) - 1;  // positions whose tokens it kept
        const int64_t before = kept - 1 - t.accepted_tokens;                // the proposing step's first position
        if (!b.busy() || t.draft_tokens != 4 || kept > 8 || before + 5 <= 8) continue;
        found = true;
        b.finish(0, "stop");
        const size_t again = b.add(r);
        while (b.busy()) b.step();
        EXPECT_EQ(b.result(again).cached_tokens, 0) << "seed " << seed;
        Batcher fresh(*s->engine, BatcherOptions{});
        fresh.add(r);
        while (fresh.busy()) fresh.step();
        EXPECT_LT(max_abs_diff(b.result(again).prompt_logits, fresh.result(0).prompt_logits), 1e-4);
    }
    ASSERT_TRUE(found) << "no prompt made its first proposals run past the ring with the kept tokens inside it";
}

// Prompt logprobs (OpenAI's echo): a prompt scored token by token gives, for its tokens after
// the first, the logprobs generation gave those tokens: here a prompt followed by its own greedy
// continuation. Its chunks take a logits row per token within the engine's rows (two: the slots),
// next to a request that decodes meanwhile; with max_new_tokens 0 nothing is generated, and a
// one-token prompt has nothing to score.
TEST(Batcher, PromptLogprobsScoreThePrompt) {
    TempDir d;
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(d.path(), cfg, {DType::F32, 1, 27});
    SingleRank comm;
    auto s = open_tiny(d.path(), 2, comm);
    SamplerOptions greedy;
    greedy.temperature = 0;
    BatcherOptions bo;
    bo.prefill_chunk = 5;
    bo.reuse_prefix = true;  // (never for a scored prompt)
    const std::vector<int32_t> prompt = make_prompt(6, cfg.vocab, 51);
    Batcher b(*s->engine, bo);
    b.add(request(prompt, greedy, 0, 2));
    while (b.busy()) b.step();
    const SequenceResult gen = b.result(0);
    ASSERT_EQ(gen.tokens.size(), 8u);
    // The prompt and its continuation, scored; beside it another request; then the same scored
    // and continued (max_new_tokens 3), and a one-token prompt.
    const std::vector<int32_t> whole = joined(prompt, gen.tokens);
    BatchRequest score = request(whole, greedy, 1);
    score.max_new_tokens = 0;
    score.prompt_logprobs = 2;
    BatchRequest go_on = score;
    go_on.max_new_tokens = 3;
    BatchRequest one = score;
    one.prompt = {whole[0]};
    b.add(request(make_prompt(3, cfg.vocab, 52), greedy, 2));
    const size_t a = b.add(score), c = b.add(go_on), e = b.add(one);
    while (b.busy()) b.step();
    for (const size_t id : {a, c}) {
        const SequenceResult& r = b.result(id);
        EXPECT_EQ(r.cached_tokens, 0);
        ASSERT_EQ(r.prompt_logprobs.size(), whole.size() - 1);
        for (size_t t = 0; t < gen.tokens.size(); ++t) {
            const TokenLogprobs& got = r.prompt_logprobs[prompt.size() - 1 + t];
            EXPECT_EQ(got.token.id, gen.tokens[t]);
            EXPECT_NEAR(got.token.logprob, gen.logprobs[t].token.logprob, 1e-4) << "token " << t;
            ASSERT_EQ(got.top.size(), 2u);
            EXPECT_EQ(got.top[0].id, gen.logprobs[t].top[0].id);
            EXPECT_EQ(got.top[1].id, gen.logprobs[t].top[1].id);
        }
        for (size_t t = 0; t + 1 < whole.size(); ++t) EXPECT_EQ(r.prompt_logprobs[t].token.id, whole[t + 1]);
    }
    EXPECT_TRUE(b.result(a).tokens.empty());
    EXPECT_EQ(b.result(a).stop_reason, "length");
    EXPECT_EQ(b.result(c).tokens.size(), 3u);
    EXPECT_TRUE(b.result(e).tokens.empty());
    EXPECT_TRUE(b.result(e).prompt_logprobs.empty());
    EXPECT_EQ(b.result(e).stop_reason, "length");
    // Without prompt logprobs, at least one token is generated.
    BatchRequest none = request(prompt, greedy, 3);
    none.max_new_tokens = 0;
    EXPECT_THROW(b.add(none), Error);
}
