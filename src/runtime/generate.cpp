#include "runtime/generate.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>

#include "core/error.h"

namespace shardlm {

namespace {
int64_t saturating_add(int64_t a, int64_t b) {  // a, b >= 0
    return b > std::numeric_limits<int64_t>::max() - a ? std::numeric_limits<int64_t>::max() : a + b;
}
double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int64_t penalty_window(const SamplerOptions& opt, int64_t ctx) {
    if (!penalties_enabled(opt)) return 0;
    return opt.penalty_last_n < 0 ? ctx : opt.penalty_last_n;
}

int64_t max_penalties(const SamplerOptions& opt, int64_t ctx, int64_t vocab, bool slide) {
    int64_t n = std::min(penalty_window(opt, ctx), vocab);
    return slide ? n : std::min(n, ctx);
}

std::vector<PenaltyEntry> token_penalties(const SamplerOptions& opt, int64_t window, const int32_t* tokens, int64_t n) {
    std::vector<PenaltyEntry> out;
    if (!penalties_enabled(opt) || window <= 0) return out;
    const int64_t from = std::max<int64_t>(0, n - window);
    std::vector<int32_t> ids(tokens + from, tokens + n);
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
        size_t j = i;
        while (j < ids.size() && ids[j] == ids[i]) ++j;
        PenaltyEntry e;
        e.id = ids[i];
        e.repetition = opt.repetition_penalty;
        e.offset = opt.frequency_penalty * float(j - i) + opt.presence_penalty;
        out.push_back(e);
        i = j;
    }
    return out;
}

RecentTokens::RecentTokens(int64_t window, int64_t vocab)
    : window_(window), count_(size_t(vocab), 0), at_(size_t(vocab), -1) {
    SHARDLM_CHECK(window > 0 && vocab > 0, "RecentTokens: window ", window, ", vocabulary ", vocab);
}

void RecentTokens::count(int32_t id, int32_t delta) {
    int32_t& c = count_[size_t(id)];
    if (c == 0) {
        at_[size_t(id)] = int32_t(ids_.size());
        ids_.push_back(id);
    }
    c += delta;
    if (c == 0) {  // swap the last id into its place
        const int32_t last = ids_.back();
        ids_[size_t(at_[size_t(id)])] = last;
        at_[size_t(last)] = at_[size_t(id)];
        ids_.pop_back();
    }
}

void RecentTokens::push(int32_t id) {
    SHARDLM_CHECK(id >= 0 && size_t(id) < count_.size(), "RecentTokens: id ", id);
    count(id, 1);
    if (int64_t(ring_.size()) < window_) {
        ring_.push_back(id);
        return;
    }
    count(ring_[head_], -1);
    ring_[head_] = id;
    head_ = (head_ + 1) % ring_.size();
}

void RecentTokens::entries(const SamplerOptions& opt, std::vector<PenaltyEntry>& out) const {
    out.clear();
    for (const int32_t id : ids_) {
        PenaltyEntry e;
        e.id = id;
        e.repetition = opt.repetition_penalty;
        e.offset = opt.frequency_penalty * float(count_[size_t(id)]) + opt.presence_penalty;  // as token_penalties
        out.push_back(e);
    }
}

void check_generate(const ModelConfig& cfg, const EngineOptions& eo, const std::vector<std::vector<int32_t>>& prompts,
                    const GenerateOptions& opt, const std::string& source) {
    const int64_t ctx = eo.ctx;
    const size_t B = prompts.size();
    if (B == 0) fail("no prompt given");
    if (eo.max_batch < 1) fail("the engine has no KV-cache slot");
    if (opt.max_new_tokens < 1) fail("--max-new-tokens must be at least 1");
    SHARDLM_CHECK(opt.max_new_each.empty() || opt.max_new_each.size() == B, "max_new_each holds ",
                  opt.max_new_each.size(), " limits for ", B, " prompts");
    for (const int64_t m : opt.max_new_each) SHARDLM_CHECK(m >= 1, "max_new_each: a limit of ", m);
    SHARDLM_CHECK(opt.max_running >= 0 && opt.max_running <= eo.max_batch, "max_running ", opt.max_running,
                  " with ", eo.max_batch, " slots");
    if (opt.prefill_chunk < 1) fail("--prefill-chunk must be at least 1");
    if (opt.logprobs < -1 || opt.logprobs > cfg.vocab)
        fail("--logprobs ", opt.logprobs, " must be in [0, ", cfg.vocab, "] (the vocabulary)");
    if (!opt.cached.empty()) {
        SHARDLM_CHECK(opt.cached.size() == B, "cached prefixes for ", opt.cached.size(), " of ", B, " prompts");
        // Prompt s runs in slot s only when every prompt has a slot from the start.
        const int64_t slots = opt.max_running > 0 ? opt.max_running : eo.max_batch;
        SHARDLM_CHECK(int64_t(B) <= slots, "cached prefixes for ", B, " prompts in ", slots, " slots");
        SHARDLM_CHECK(!opt.slide, "a cached prefix with --context-overflow slide (shifted caches hold other positions)");
        for (size_t s = 0; s < B; ++s)
            SHARDLM_CHECK(opt.cached[s] >= 0 && opt.cached[s] < int64_t(prompts[s].size()), "prompt ", s, " of ",
                          prompts[s].size(), " tokens cannot have ", opt.cached[s], " cached");
    }
    for (size_t s = 0; s < B; ++s) {
        const int64_t n = int64_t(prompts[s].size());
        const int64_t max_new = opt.max_new_each.empty() ? opt.max_new_tokens : opt.max_new_each[s];
        if (n == 0) fail("prompt ", s, " is empty");
        if (opt.slide && n > ctx)
            fail("prompt ", s, " has ", n, " tokens but --ctx is ", ctx, " (--context-overflow slide slides over ",
                 "generated tokens; the prompt must fit)");
        if (!opt.slide && max_new > ctx - n)  // n + max_new may overflow
            fail("prompt ", s, " has ", n, " tokens; with --max-new-tokens ", max_new,
                 " it needs a context of ", saturating_add(n, max_new), " but --ctx is ", ctx,
                 " (or --context-overflow slide)");
    }
    if (opt.slide && (opt.sink_tokens < 0 || opt.sink_tokens > ctx - 2)) {
        // The context as the user set it: "--ctx N", or the flags it was derived from.
        const std::string ctx_named = opt.ctx_origin.empty() ? "--ctx " + std::to_string(ctx)
                                                             : cat("the context of ", ctx, " positions (", opt.ctx_origin, ")");
        fail("--sink-tokens ", opt.sink_tokens, " must be >= 0 and leave at least 2 of ", ctx_named, " to slide over");
    }
    if (opt.slide && kv_capacity(cfg, eo) < ctx)
        fail("--context-overflow slide: this model attends within a sliding window of ", cfg.sliding_window,
             " and its cache holds only the newest ", kv_capacity(cfg, eo),
             " positions; raise --ctx instead (up to max_position_embeddings ", cfg.max_position, ")");
    const int64_t room = max_penalties(opt.sampler, ctx, cfg.vocab, opt.slide);
    SHARDLM_CHECK(room <= eo.max_penalties, "the engine has room for ", eo.max_penalties,
                  " penalised tokens per row, the penalty flags need ", room, " (EngineOptions::max_penalties)");
    // Before any step: the engine would refuse the id only in the step that embeds it, after the
    // prompts before it had been prefilled.
    for (size_t s = 0; s < B; ++s)
        for (int32_t id : prompts[s])
            if (id < 0 || id >= cfg.vocab)
                fail(source.empty() ? "" : source + ": ", "prompt ", s, " has token id ", id, " outside the vocabulary [0, ",
                     cfg.vocab, ")");
}

GenerateResult generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                        const GenerateOptions& opt, const TokenCallback& on_token, const StopCheck& stop) {
    const ModelConfig& cfg = engine.config();
    const EngineOptions& eo = engine.options();
    check_generate(cfg, eo, prompts, opt);
    const int64_t ctx = eo.ctx;
    const size_t B = prompts.size();
    const int64_t vocab = cfg.vocab;
    // At most `slots` sequences run at once; the rest wait in prompt order for a slot to free.
    const size_t slots = size_t(std::min<int64_t>(opt.max_running > 0 ? opt.max_running : eo.max_batch, int64_t(B)));
    GenerateResult res;
    res.seqs.resize(B);
    std::vector<Sampler> samplers;
    for (size_t s = 0; s < B; ++s) {
        res.seqs[s].prompt = prompts[s];
        samplers.emplace_back(opt.sampler, s);  // seeded by the prompt's index, not its slot or step
    }
    // Samplers with top-k (or greedy) read only each row's first k ranked candidates: the engine
    // hands back just those (on the GPU it selects them there instead of copying the vocabulary).
    // Top-p without a top-k limit needs the row's whole mass: an engine that sums it on the GPU
    // hands back the first kMaxTopCandidates candidates and that sum (forward_nucleus), and the
    // rare nucleus that reaches past them takes its row after all.
    const SamplerOptions& so = opt.sampler;
    const bool nucleus = so.temperature > 0.0f && so.top_k == 0 && so.top_p < 1.0f;
    const int64_t k = nucleus ? std::min(vocab, kMaxTopCandidates) : sampler_candidates(so, vocab);
    const bool top = k > 0 && k <= kMaxTopCandidates;
    // A step has at most one logits row per running sequence.
    std::vector<float> logits(slots * size_t(vocab)), vals;
    std::vector<int32_t> ids;
    std::vector<uint64_t> mass(slots);
    if (top) {
        vals.resize(slots * size_t(k));
        ids.resize(vals.size());
    }
    // Runs a step; rows of logits (or candidates) in chunk order. Returns whether it handed back
    // candidates.
    auto step = [&](const std::vector<SeqChunk>& chunks, bool full) {
        if (top && !full && !nucleus) {
            engine.forward_top(chunks, k, vals.data(), ids.data());
            return true;
        }
        if (top && !full && engine.forward_nucleus(chunks, k, so.temperature, vals.data(), ids.data(), mass.data()))
            return true;
        engine.forward(chunks, logits.data());
        return false;
    };
    // Token penalties: each logits row's entries, built from its sequence's last `window` tokens
    // just before the step (they live in pens[s] until the next). A sequence's RecentTokens
    // (two int32 per vocabulary entry) lives only while it runs.
    const int64_t window = penalty_window(so, ctx);
    std::vector<std::vector<PenaltyEntry>> pens(B);
    std::vector<std::unique_ptr<RecentTokens>> recent(B);
    auto add_penalties = [&](SeqChunk& ch, size_t s) {
        if (window == 0) return;
        recent[s]->entries(so, pens[s]);
        ch.penalties = pens[s].data();
        ch.n_penalties = int64_t(pens[s].size());
    };
    // Appends the token sampled from row `row` of the step (cand: from its candidates); returns
    // whether the sequence goes on.
    auto accept = [&](size_t s, size_t row, bool cand) {
        SequenceResult& r = res.seqs[s];
        int32_t id = -1;
        if (cand) {
            const float* v = vals.data() + row * size_t(k);
            const int32_t* c = ids.data() + row * size_t(k);
            id = nucleus ? samplers[s].sample_nucleus(v, c, k, mass[row]) : samplers[s].sample_top(v, c, k);
        }
        // NaN ranks below every number, so a NaN where the sampler looked first means the whole row
        // is NaN: the weights hold NaN or the forward pass overflowed. Sampling on would print
        // token 0 for ever; stop with the reason instead.
        auto nan_row = [&]() {
            fail("the logits of sequence ", s, " are all NaN at generated token ", r.tokens.size(),
                 " (NaN in the weights, or activations that overflowed their precision; try --weights fp32 or bf16)");
        };
        if (cand && std::isnan(vals[row * size_t(k)]) &&
            std::all_of(vals.begin() + ptrdiff_t(row * size_t(k)), vals.begin() + ptrdiff_t((row + 1) * size_t(k)),
                        [](float v) { return std::isnan(v); }))
            nan_row();
        if (id < 0) {
            float* lg = logits.data() + row * size_t(vocab);
            if (cand) engine.nucleus_row(int64_t(row), lg);  // the nucleus reaches past the candidates
            id = samplers[s].sample(lg, vocab);
            if (std::isnan(lg[id])) nan_row();
            if (opt.logprobs >= 0) r.logprobs.push_back(token_logprobs(lg, vocab, id, opt.logprobs));
        }
        r.tokens.push_back(id);
        if (window > 0) recent[s]->push(id);
        if (on_token) on_token(s, id);
        if (is_eos_id(cfg, id)) r.stop_reason = "eos";
        else if (stop && stop(s, id)) r.stop_reason = "stop";
        else if (int64_t(r.tokens.size()) >= (opt.max_new_each.empty() ? opt.max_new_tokens : opt.max_new_each[s]))
            r.stop_reason = "length";
        return r.stop_reason.empty();
    };

    // Continuous batching with chunked prefill (vLLM's scheduler): each step first carries one
    // token of every running sequence whose prompt is cached, then fills the rest of the step's
    // budget (--prefill-chunk tokens, at least one) with prompt chunks of the others in the order
    // they came. A finished sequence frees its slot at once for the next waiting prompt, whose
    // prefill then rides in the same steps as the others' decode tokens: a decode token costs a
    // pass over the weights alone, next to a prompt chunk almost nothing.
    // done[s]: prompt tokens of s in its cache; dropped[s]: positions s has shifted out of it
    // (--context-overflow slide), so its next position is its length - dropped.
    std::vector<int64_t> done = opt.cached.empty() ? std::vector<int64_t>(B, 0) : opt.cached;
    std::vector<int64_t> dropped(B, 0), slot_of(B, -1);
    std::vector<int32_t> last(B);
    std::vector<size_t> running;  // in the order they were admitted
    std::vector<int64_t> free_slots;
    for (size_t i = slots; i-- > 0;) free_slots.push_back(int64_t(i));  // the lowest on top: prompt s < slots gets slot s
    const int64_t budget_max = std::min(opt.prefill_chunk, eo.max_step_tokens);
    size_t next = 0;  // the first prompt still waiting
    std::vector<SeqChunk> chunks;
    std::vector<size_t> chunk_seq;
    const double t_begin = now_ms();
    for (;;) {
        while (next < B && !free_slots.empty()) {
            const size_t s = next++;
            slot_of[s] = free_slots.back();
            free_slots.pop_back();
            running.push_back(s);
            if (window > 0) {
                recent[s] = std::make_unique<RecentTokens>(window, vocab);
                for (const int32_t id : prompts[s]) recent[s]->push(id);
            }
        }
        if (running.empty()) break;
        chunks.clear();
        chunk_seq.clear();
        for (const size_t s : running) {
            SequenceResult& r = res.seqs[s];
            if (r.tokens.empty()) continue;  // still prefilling
            last[s] = r.tokens.back();
            SeqChunk ch;
            ch.slot = slot_of[s];
            ch.tokens = &last[s];
            ch.n = 1;
            ch.pos = int64_t(r.prompt.size() + r.tokens.size()) - 1 - dropped[s];
            if (ch.pos >= ctx) {
                // Full: keep the sinks, drop the older half of the rest (llama.cpp's context shift).
                const int64_t discard = (ch.pos - opt.sink_tokens) / 2;
                engine.shift_kv(ch.slot, opt.sink_tokens, discard, ch.pos);
                dropped[s] += discard;
                ch.pos -= discard;
                res.timings.context_shifts += 1;
            }
            ch.want_logits = true;
            add_penalties(ch, s);
            chunks.push_back(ch);
            chunk_seq.push_back(s);
        }
        const size_t n_decode = chunks.size();
        // Prompt chunks, logits only at each prompt's last token.
        int64_t budget = std::max<int64_t>(1, budget_max - int64_t(n_decode)), prompt_tokens = 0;
        bool full = opt.logprobs >= 0;  // whole rows: for --logprobs, or a prompt's last row kept (--dump-logits)
        for (const size_t s : running) {
            const int64_t len = int64_t(prompts[s].size());
            if (budget == 0) break;
            if (done[s] == len) continue;
            const int64_t n = std::min(budget, len - done[s]);
            SeqChunk ch;
            ch.slot = slot_of[s];
            ch.tokens = prompts[s].data() + done[s];
            ch.n = n;
            ch.pos = done[s];
            done[s] += n;
            ch.want_logits = done[s] == len;
            if (ch.want_logits) add_penalties(ch, s);
            full = full || (ch.want_logits && opt.keep_prompt_logits);
            chunks.push_back(ch);
            chunk_seq.push_back(s);
            budget -= n;
            prompt_tokens += n;
        }
        const double t0 = now_ms();
        const bool cand = step(chunks, full);
        size_t row = 0;
        for (size_t c = 0; c < chunks.size(); ++c) {
            if (!chunks[c].want_logits) continue;
            const size_t s = chunk_seq[c];
            if (c >= n_decode && opt.keep_prompt_logits) {
                const float* lg = logits.data() + row * size_t(vocab);
                res.seqs[s].prompt_logits.assign(lg, lg + vocab);
            }
            accept(s, row++, cand);
        }
        // Steps that carry prompt tokens count as prefill (with any decode tokens riding along),
        // the others as decode steps.
        const double t1 = now_ms();
        if (prompt_tokens > 0) {
            res.timings.prefill_ms += t1 - t0;
            res.timings.prefill_tokens += prompt_tokens;
            res.timings.prefill_steps += 1;
        } else {
            res.timings.decode_ms += t1 - t0;
            res.timings.decode_steps += 1;
            res.timings.decode_tokens += int64_t(n_decode);
        }
        // Finished sequences hand their slot on.
        size_t kept = 0;
        for (const size_t s : running) {
            if (res.seqs[s].stop_reason.empty()) {
                running[kept++] = s;
                continue;
            }
            free_slots.push_back(slot_of[s]);
            recent[s].reset();
            pens[s] = {};
        }
        running.resize(kept);
        // The lowest free slot on top (a sequence's results never depend on its slot; this only
        // keeps the slot numbers of a batch that fits the engine those of the prompts).
        std::sort(free_slots.begin(), free_slots.end(), std::greater<int64_t>());
    }
    res.timings.total_ms = now_ms() - t_begin;
    return res;
}

}  // namespace shardlm
