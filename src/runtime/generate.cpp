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

int64_t max_penalties(const SamplerOptions& opt, int64_t ctx, int64_t vocab, bool slide, int64_t banned) {
    int64_t n = std::min(penalty_window(opt, ctx), vocab);
    if (!slide) n = std::min(n, ctx);
    return std::min(n + int64_t(opt.logit_bias.size()) + banned, vocab);
}

bool adjusts_logits(const SamplerOptions& opt) { return penalties_enabled(opt) || !opt.logit_bias.empty(); }

namespace {
// The bias of every biased id into `out`: where at(id) names an entry of id, its offset lowered
// by the bias, else a new entry that adds the bias alone.
template <typename At>
void add_logit_bias(const SamplerOptions& opt, std::vector<PenaltyEntry>& out, At at) {
    for (const auto& [id, bias] : opt.logit_bias) {
        const int64_t i = at(id);
        if (i >= 0) {
            out[size_t(i)].offset -= bias;
            continue;
        }
        PenaltyEntry e;
        e.id = id;
        e.offset = -bias;
        out.push_back(e);
    }
}
}  // namespace

std::vector<PenaltyEntry> token_penalties(const SamplerOptions& opt, int64_t window, const int32_t* tokens, int64_t n) {
    std::vector<PenaltyEntry> out;
    if (penalties_enabled(opt) && window > 0) {
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
    }
    const size_t penalised = out.size();
    add_logit_bias(opt, out, [&](int32_t id) -> int64_t {
        const auto it = std::lower_bound(out.begin(), out.begin() + ptrdiff_t(penalised), id,
                                         [](const PenaltyEntry& e, int32_t x) { return e.id < x; });
        return it != out.begin() + ptrdiff_t(penalised) && it->id == id ? it - out.begin() : -1;
    });
    std::sort(out.begin(), out.end(), [](const PenaltyEntry& a, const PenaltyEntry& b) { return a.id < b.id; });
    return out;
}

RecentTokens::RecentTokens(int64_t window, int64_t vocab) : window_(window) {
    SHARDLM_CHECK(window >= 0 && vocab > 0, "RecentTokens: window ", window, ", vocabulary ", vocab);
    if (window > 0) {
        count_.assign(size_t(vocab), 0);
        at_.assign(size_t(vocab), -1);
    }
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
    if (window_ == 0) return;
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
    // (ids_ lists the penalised ids in entry order: at_ is an id's entry.)
    add_logit_bias(opt, out, [&](int32_t id) -> int64_t {
        return size_t(id) < count_.size() && count_[size_t(id)] > 0 ? at_[size_t(id)] : -1;
    });
}

void check_logit_bias(const SamplerOptions& opt, int64_t vocab) {
    for (const auto& [id, bias] : opt.logit_bias)
        if (id < 0 || id >= vocab) fail("--logit-bias: token id ", id, " is outside the vocabulary [0, ", vocab, ")");
}

void check_generate(const ModelConfig& cfg, const EngineOptions& eo, const std::vector<std::vector<int32_t>>& prompts,
                    const GenerateOptions& opt, const std::string& source) {
    const int64_t ctx = eo.ctx;
    const size_t B = prompts.size();
    if (B == 0) fail("no prompt given");
    if (eo.max_batch < 1) fail("the engine has no KV-cache slot");
    if (opt.prompt_logprobs < -1 || opt.prompt_logprobs > cfg.vocab)
        fail("--prompt-logprobs ", opt.prompt_logprobs, " must be in [0, ", cfg.vocab, "] (the vocabulary)");
    if (opt.max_new_tokens < (opt.prompt_logprobs >= 0 ? 0 : 1))
        fail("--max-new-tokens must be at least 1 (0 with --prompt-logprobs: the prompts are scored)");
    if (opt.prompt_logprobs >= 0 && !opt.cached.empty()) fail("--prompt-logprobs with cached prefixes (they were not scored)");
    SHARDLM_CHECK(opt.max_new_each.empty() || opt.max_new_each.size() == B, "max_new_each holds ",
                  opt.max_new_each.size(), " limits for ", B, " prompts");
    for (const int64_t m : opt.max_new_each) SHARDLM_CHECK(m >= 1, "max_new_each: a limit of ", m);
    SHARDLM_CHECK(opt.max_running >= 0 && opt.max_running <= eo.max_batch, "max_running ", opt.max_running,
                  " with ", eo.max_batch, " slots");
    if (opt.prefill_chunk < 1) fail("--prefill-chunk must be at least 1");
    if (opt.logprobs < -1 || opt.logprobs > cfg.vocab)
        fail("--logprobs ", opt.logprobs, " must be in [0, ", cfg.vocab, "] (the vocabulary)");
    check_logit_bias(opt.sampler, cfg.vocab);
    if (opt.min_new_tokens < 0 || opt.min_new_tokens > opt.max_new_tokens)
        fail("--min-new-tokens ", opt.min_new_tokens, " must be in [0, --max-new-tokens ", opt.max_new_tokens, "]");
    for (const int64_t m : opt.max_new_each)
        SHARDLM_CHECK(opt.min_new_tokens <= m, "--min-new-tokens ", opt.min_new_tokens, " above a prompt's limit of ", m);
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
    const int64_t room =
        max_penalties(opt.sampler, ctx, cfg.vocab, opt.slide,
                      opt.min_new_tokens > 0 ? int64_t(cfg.eos_ids.size() + opt.stop_ids.size()) : 0);
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
    check_generate(engine.config(), engine.options(), prompts, opt);
    BatcherOptions bo;
    bo.prefill_chunk = opt.prefill_chunk;
    bo.max_running = opt.max_running;
    bo.slide = opt.slide;
    bo.sink_tokens = opt.sink_tokens;
    bo.reuse_prefix = opt.reuse_prefix;
    bo.host_cache_bytes = opt.host_cache_bytes;
    bo.speculate = opt.speculate;
    bo.speculate_max_batch = opt.speculate_max_batch;
    bo.speculate_max_tokens = opt.speculate_max_tokens;
    bo.draft = opt.draft;
    bo.draft_p_min = opt.draft_p_min;
    bo.json_vocab = opt.json_vocab;
    Batcher b(engine, bo);
    if (opt.host_saves) b.restore_host(std::move(*opt.host_saves));
    for (size_t s = 0; s < prompts.size(); ++s) {
        BatchRequest r;
        r.prompt = prompts[s];
        r.max_new_tokens = opt.max_new_each.empty() ? opt.max_new_tokens : opt.max_new_each[s];
        r.sampler = opt.sampler;
        r.stream = s;  // seeded by the prompt's index, not its slot or step
        r.logprobs = opt.logprobs;
        r.prompt_logprobs = opt.prompt_logprobs;
        r.keep_prompt_logits = opt.keep_prompt_logits;
        r.ignore_eos = opt.ignore_eos;
        r.min_tokens = opt.min_new_tokens;
        r.stop_ids = opt.stop_ids;
        r.json = opt.json;
        if (!opt.cached.empty()) {  // prompt s in slot s
            r.slot = int64_t(s);
            r.cached = opt.cached[s];
        }
        b.add(std::move(r));
    }
    const double t0 = now_ms();
    while (b.busy()) b.step(on_token, stop);
    GenerateResult res;
    res.timings = b.timings();
    res.timings.total_ms = now_ms() - t0;
    for (size_t s = 0; s < prompts.size(); ++s) res.seqs.push_back(b.result(s));
    if (opt.host_saves) {
        b.save_slots();
        res.timings.host_saves = b.timings().host_saves;  // the slots' saves at the end too
        *opt.host_saves = b.take_host();
    }
    return res;
}

}  // namespace shardlm
