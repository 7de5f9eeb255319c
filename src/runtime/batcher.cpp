#include "runtime/batcher.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/cpu/penalty.h"
#include "runtime/generate.h"
#include "runtime/json_mode.h"
#include "runtime/speculate.h"

namespace shardlm {

namespace {
double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
// Top-p without a top-k limit: the engine can hand back the candidates and the row's nucleus mass.
bool nucleus_only(const SamplerOptions& o) { return o.temperature > 0.0f && o.top_k == 0 && o.top_p < 1.0f; }
// min_tokens: the end-of-sequence ids banned from a row, in its entries: an offset of the largest
// float leaves them at -FLT_MAX or below, probability 0 at any temperature (the engines take
// finite offsets only).
// min_tokens not reached: the end-of-sequence ids and the request's stop ids get -inf.
void ban_ends(const ModelConfig& cfg, const std::vector<int32_t>& stop_ids, std::vector<PenaltyEntry>& pens) {
    std::vector<int64_t> ends(cfg.eos_ids.begin(), cfg.eos_ids.end());
    ends.insert(ends.end(), stop_ids.begin(), stop_ids.end());
    for (const int64_t id : ends) {
        auto it = std::find_if(pens.begin(), pens.end(), [&](const PenaltyEntry& e) { return e.id == id; });
        if (it == pens.end()) {
            pens.emplace_back();
            it = pens.end() - 1;
            it->id = int32_t(id);
        }
        it->offset = std::numeric_limits<float>::max();
    }
}
}  // namespace

struct Batcher::Seq {
    BatchRequest req;
    SequenceResult res;
    Sampler sampler;
    int64_t slot = -1;
    int64_t done = 0;     // prompt tokens in its cache
    int64_t dropped = 0;  // positions shifted out of its cache (slide): its next position is length - dropped
    int64_t written = 0;  // positions written to its cache: [0, written) (rejected proposals included)
    // Preempted: its first `base` generated tokens joined req.prompt, to be run again on its return.
    int64_t base = 0;
    int32_t last = 0;     // the decode step's input
    int64_t window = 0;   // token penalties' window (0: none)
    std::unique_ptr<RecentTokens> recent;  // while it runs
    std::unique_ptr<JsonAcceptor> json;    // JSON mode or a schema: the text so far
    std::vector<PenaltyEntry> pens;        // the step's entries (alive until the next step)
    std::vector<int32_t> spec;             // the step's decode input and proposals (speculate)
    bool ended = false;
    bool fresh = true;   // no chunk of it has run yet (reuse_prefix may still fill its cache)
    bool waits = false;  // this step: for a prefix another sequence is prefilling
    bool thinking = false;  // between req.think_open and req.think_close: json holds nothing yet
    size_t index = 0;  // for the callbacks
    Seq(BatchRequest r, size_t i, int64_t ctx)
        : req(std::move(r)), sampler(req.sampler, req.stream), done(req.cached), window(penalty_window(req.sampler, ctx)),
          thinking(req.json && req.think_first), index(i) {
        res.prompt = req.prompt;
    }
};

Batcher::Batcher(Engine& engine, const BatcherOptions& opt) : engine_(engine), opt_(opt) {
    const EngineOptions& eo = engine.options();
    SHARDLM_CHECK(opt.max_running >= 0 && opt.max_running <= eo.max_batch && eo.max_batch >= 1, "max_running ",
                  opt.max_running, " with ", eo.max_batch, " slots");
    SHARDLM_CHECK(opt.prefill_chunk >= 1, "prefill_chunk ", opt.prefill_chunk);
    SHARDLM_CHECK(opt.speculate >= 0 && opt.speculate_max_batch >= 0 && opt.speculate_max_tokens >= 0, "speculate ",
                  opt.speculate, ", max batch ", opt.speculate_max_batch, ", max tokens ", opt.speculate_max_tokens);
    SHARDLM_CHECK(opt.host_cache_bytes == 0 || opt.reuse_prefix, "host_cache_bytes without reuse_prefix");
    slots_ = opt.max_running > 0 ? opt.max_running : eo.max_batch;
    for (int64_t i = slots_; i-- > 0;) free_slots_.push_back(i);
    held_.resize(size_t(slots_));
    held_salt_.resize(size_t(slots_));
    held_adapter_.assign(size_t(slots_), -1);
    freed_at_.assign(size_t(slots_), 0);
    capacity_ = kv_capacity(engine.config(), eo);
    if (opt.draft) {
        const EngineOptions& de = opt.draft->options();
        SHARDLM_CHECK(de.max_batch >= slots_ && de.ctx >= eo.ctx, "draft engine: ", de.max_batch, " slots of ", de.ctx,
                      " positions for ", slots_, " of ", eo.ctx);
        drafter_ = std::make_unique<DraftModel>(*opt.draft, engine.config().vocab, opt.prefill_chunk, opt.draft_p_min);
    }
}

Batcher::~Batcher() = default;

size_t Batcher::add(BatchRequest r) {
    const ModelConfig& cfg = engine_.config();
    SHARDLM_CHECK(!r.prompt.empty() && (r.max_new_tokens >= 1 || (r.max_new_tokens == 0 && r.prompt_logprobs >= 0)) &&
                      r.logprobs >= -1 && r.logprobs <= cfg.vocab && r.prompt_logprobs >= -1 &&
                      r.prompt_logprobs <= cfg.vocab && r.slot < slots_ && r.cached >= 0 &&
                      r.cached < int64_t(r.prompt.size()) && (r.cached == 0 || r.slot >= 0) &&
                      (r.cached == 0 || r.prompt_logprobs < 0) && r.min_tokens >= 0 &&
                      r.min_tokens <= r.max_new_tokens,
                  "Batcher::add: a request of ", r.prompt.size(), " tokens, max_new_tokens ", r.max_new_tokens, ", logprobs ",
                  r.logprobs, ", prompt_logprobs ", r.prompt_logprobs, ", slot ", r.slot, " of ", slots_, ", cached ", r.cached,
                  ", min_tokens ", r.min_tokens);
    for (const auto& [id, bias] : r.sampler.logit_bias)
        SHARDLM_CHECK(id >= 0 && id < cfg.vocab, "Batcher::add: logit_bias for token ", id, " of ", cfg.vocab);
    for (const int32_t id : r.stop_ids)
        SHARDLM_CHECK(id >= 0 && id < cfg.vocab, "Batcher::add: stop id ", id, " of ", cfg.vocab);
    for (const int32_t id : r.allowed_ids)
        SHARDLM_CHECK(id >= 0 && id < cfg.vocab, "Batcher::add: allowed id ", id, " of ", cfg.vocab);
    for (const std::vector<int32_t>& w : r.bad_words) {
        SHARDLM_CHECK(!w.empty(), "Batcher::add: an empty bad word");
        for (const int32_t id : w) SHARDLM_CHECK(id >= 0 && id < cfg.vocab, "Batcher::add: bad word id ", id, " of ", cfg.vocab);
    }
    SHARDLM_CHECK(!r.json || opt_.json_vocab, "Batcher::add: a JSON-mode request without the vocabulary's bytes");
    SHARDLM_CHECK((r.think_open == -1 && r.think_close == -1) ||
                      (r.think_open >= 0 && r.think_open < cfg.vocab && r.think_close >= 0 && r.think_close < cfg.vocab &&
                       r.think_open != r.think_close),
                  "Batcher::add: reasoning tags ", r.think_open, " and ", r.think_close, " of ", cfg.vocab);
    SHARDLM_CHECK(!r.think_first || r.think_close >= 0, "Batcher::add: think_first without reasoning tags");
    seqs_.push_back(std::make_unique<Seq>(std::move(r), seqs_.size(), engine_.options().ctx));
    waiting_.push_back(seqs_.size() - 1);
    return seqs_.size() - 1;
}

bool Batcher::busy() const { return !waiting_.empty() || !running_.empty(); }

bool Batcher::uses_adapter(int64_t adapter) const {
    for (const std::vector<size_t>* list : {&waiting_, &running_})
        for (const size_t i : *list)
            if (seqs_[i] && !seqs_[i]->ended && seqs_[i]->req.adapter == adapter) return true;
    return false;
}

std::vector<int64_t> Batcher::adapters_of(const std::vector<size_t>& list) const {
    std::vector<int64_t> out;
    for (const size_t i : list)
        if (seqs_[i] && !seqs_[i]->ended && seqs_[i]->req.adapter >= 0) out.push_back(seqs_[i]->req.adapter);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

int64_t Batcher::waiting() const {
    int64_t n = 0;
    for (const size_t i : waiting_) n += seqs_[i] && !seqs_[i]->ended;
    return n;
}

const SequenceResult& Batcher::result(size_t id) const {
    SHARDLM_CHECK(id < seqs_.size() && seqs_[id], "Batcher: no request ", id);
    return seqs_[id]->res;
}

bool Batcher::ended(size_t id) const {
    SHARDLM_CHECK(id < seqs_.size(), "Batcher: no request ", id);
    return !seqs_[id] || seqs_[id]->ended;
}

void Batcher::release(size_t id) {
    SHARDLM_CHECK(ended(id), "Batcher: request ", id, " has not ended");
    seqs_[id].reset();
}

void Batcher::end(Seq& q, const std::string& reason) {
    q.ended = true;
    if (q.res.stop_reason.empty()) q.res.stop_reason = reason;
    q.recent.reset();
    q.pens = {};
}

// The tokens whose keys and values q's slot holds at positions [0, size) before the next step:
// the prompt tokens prefilled so far, and every generated token but the last (sampled, never
// run). None once its sequence slid or its ring wrapped (early positions gone, rejected
// speculative proposals' rows included).
std::vector<int32_t> Batcher::ran(const Seq& q) const {
    std::vector<int32_t> h;
    if (q.dropped > 0) return h;
    const std::vector<int32_t>& p = q.req.prompt;
    const std::vector<int32_t>& t = q.res.tokens;
    h.assign(p.begin(), p.begin() + q.done);
    if (q.done == int64_t(p.size()) && int64_t(t.size()) > q.base) h.insert(h.end(), t.begin() + q.base, t.end() - 1);
    if (std::max(int64_t(h.size()), q.written) > capacity_) h.clear();
    return h;
}

// Hands q's slot back; with reuse_prefix it keeps what q's sequence ran.
void Batcher::free_slot(const Seq& q) {
    if (opt_.reuse_prefix) {
        held_[size_t(q.slot)] = ran(q);
        held_salt_[size_t(q.slot)] = q.req.cache_salt;
        held_adapter_[size_t(q.slot)] = q.req.adapter;
        freed_at_[size_t(q.slot)] = ++frees_;
    }
    free_slots_.push_back(q.slot);
}

Batcher::HostPrefix Batcher::save_held(int64_t slot, int64_t kept) {
    const std::vector<int32_t>& held = held_[size_t(slot)];
    const std::string& salt = held_salt_[size_t(slot)];
    const int64_t adapter = held_adapter_[size_t(slot)];
    const size_t per = engine_.kv_position_bytes();
    // What fits the budget alone (a prefix of a prefix is one too).
    const int64_t n = std::min<int64_t>(int64_t(held.size()), int64_t(opt_.host_cache_bytes / per));
    HostPrefix e;
    if (n <= kept || n < kMinHostPrefix) return e;
    for (HostPrefix& h : host_)
        if (h.salt == salt && h.adapter == adapter && int64_t(h.tokens.size()) >= n && std::equal(held.begin(), held.begin() + n, h.tokens.begin())) {
            h.used = ++host_uses_;  // saved already (with more after it, perhaps)
            return e;
        }
    e.tokens.assign(held.begin(), held.begin() + n);
    e.salt = salt;
    e.adapter = adapter;
    e.kv.resize(size_t(n) * per);
    engine_.save_kv(slot, n, e.kv.data());
    timings_.host_saves += 1;
    return e;
}

void Batcher::keep_host(HostPrefix e) {
    // Saves that this one holds whole go; then the least recently used until it fits.
    for (size_t i = host_.size(); i-- > 0;)
        if (host_[i].salt == e.salt && host_[i].adapter == e.adapter && host_[i].tokens.size() <= e.tokens.size() &&
            std::equal(host_[i].tokens.begin(), host_[i].tokens.end(), e.tokens.begin())) {
            host_bytes_ -= host_[i].kv.size();
            host_.erase(host_.begin() + std::ptrdiff_t(i));
        }
    while (!host_.empty() && host_bytes_ + e.kv.size() > opt_.host_cache_bytes) {
        auto lru = std::min_element(host_.begin(), host_.end(),
                                    [](const HostPrefix& a, const HostPrefix& b) { return a.used < b.used; });
        host_bytes_ -= lru->kv.size();
        host_.erase(lru);
    }
    e.used = ++host_uses_;
    host_bytes_ += e.kv.size();
    host_.push_back(std::move(e));
}

void Batcher::save_slots() {
    if (opt_.host_cache_bytes == 0) return;
    // The slot freed longest ago first, so the tier's order of use stays the slots' order.
    std::vector<int64_t> order(free_slots_);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return freed_at_[size_t(a)] < freed_at_[size_t(b)]; });
    for (const int64_t slot : order) {
        HostPrefix e = save_held(slot, 0);
        if (!e.tokens.empty()) keep_host(std::move(e));
    }
}

std::vector<SavedPrefix> Batcher::take_host() {
    std::sort(host_.begin(), host_.end(), [](const HostPrefix& a, const HostPrefix& b) { return a.used < b.used; });
    std::vector<SavedPrefix> out;
    out.reserve(host_.size());
    for (HostPrefix& h : host_) out.push_back(std::move(static_cast<SavedPrefix&>(h)));
    host_.clear();
    host_bytes_ = 0;
    return out;
}

int64_t Batcher::restore_host(std::vector<SavedPrefix> saved) {
    const size_t per = engine_.kv_position_bytes();
    for (SavedPrefix& p : saved) {
        SHARDLM_CHECK(!p.tokens.empty() && p.kv.size() == p.tokens.size() * per, "restore_host: a prefix of ",
                      p.tokens.size(), " tokens with ", p.kv.size(), " bytes of keys and values (", per, " per position)");
        if (p.kv.size() > opt_.host_cache_bytes) continue;
        HostPrefix e;
        static_cast<SavedPrefix&>(e) = std::move(p);
        keep_host(std::move(e));
    }
    return int64_t(host_.size());
}

int64_t Batcher::host_match(const std::vector<int32_t>& p, const BatchRequest& r, size_t& which) const {
    int64_t best = 0;
    for (size_t i = 0; i < host_.size(); ++i) {
        if (host_[i].salt != r.cache_salt || host_[i].adapter != r.adapter) continue;
        const std::vector<int32_t>& t = host_[i].tokens;
        const int64_t n = std::mismatch(t.begin(), t.end(), p.begin(), p.end()).first - t.begin();
        if (n > best) {
            best = n;
            which = i;
        }
    }
    return best;
}

// reuse_prefix between slots, for each running sequence that has not run a chunk yet: it waits
// while one admitted before it is still prefilling a longer prefix of its prompt than any slot
// holds now (by kMinPrefixWait tokens or more past its own cache: those tokens are run once
// anyway, and waiting costs it no more than running them beside), else copies the longest prefix
// of its prompt that another slot holds (a running sequence's, or a free slot's) when that is
// more than its own.
// Every decision rests on tokens alone, so every rank of a TP job makes the same copies.
void Batcher::share_prefixes() {
    for (size_t a = 0; a < running_.size(); ++a) {
        Seq& q = *seqs_[running_[a]];
        q.waits = false;
        if (!q.fresh || q.req.prompt_logprobs >= 0) continue;
        const std::vector<int32_t>& p = q.req.prompt;
        // The last prompt token always runs, for its logits.
        auto common = [&](const int32_t* b, int64_t n) {
            return std::min<int64_t>(std::mismatch(b, b + n, p.begin(), p.end()).first - b, int64_t(p.size()) - 1);
        };
        int64_t now = q.done, src = -1, later = 0;
        auto consider = [&](const std::vector<int32_t>& h, int64_t slot) {
            const int64_t n = common(h.data(), int64_t(h.size()));
            if (n > now) {
                now = n;
                src = slot;
            }
        };
        for (size_t b = 0; b < running_.size(); ++b) {
            const Seq& s = *seqs_[running_[b]];
            if (b == a || s.req.cache_salt != q.req.cache_salt || s.req.adapter != q.req.adapter) continue;
            consider(ran(s), s.slot);
            const int64_t len = int64_t(s.req.prompt.size());
            if (b < a && s.dropped == 0 && s.done < len)
                later = std::max(later, common(s.req.prompt.data(), std::min(len, capacity_)));
        }
        for (const int64_t f : free_slots_)
            if (held_salt_[size_t(f)] == q.req.cache_salt && held_adapter_[size_t(f)] == q.req.adapter)
                consider(held_[size_t(f)], f);
        if (later > now && later >= q.done + kMinPrefixWait) {
            q.waits = true;
        } else if (src >= 0) {
            engine_.copy_kv(src, q.slot, now);
            q.done = now;
            if (q.base == 0) q.res.cached_tokens = now;  // (a preempted one's count is its first admission's)
        }
    }
}

// Priority preemption (vLLM's priority scheduling, recompute mode): the running sequence of the
// highest priority value above `priority` (the latest admitted of equals) hands its slot back and
// waits again, by its priority and arrival. What it generated joins its prompt, so on its return
// the prefill of that prompt ends with the row its next decode step would have given: the same
// tokens, its sampler's stream going on (with reuse_prefix its old slot's cache may still hold
// them all). Sequences bound to a slot, scoring their prompt, keeping its logits, or slid are
// never preempted. Returns whether one was.
bool Batcher::preempt(int64_t priority, const std::function<bool(size_t, size_t)>& before) {
    size_t victim = running_.size();
    for (size_t a = 0; a < running_.size(); ++a) {
        const Seq& s = *seqs_[running_[a]];
        if (s.req.priority <= priority || s.req.slot >= 0 || s.req.prompt_logprobs >= 0 || s.req.keep_prompt_logits ||
            s.dropped > 0)
            continue;
        if (victim == running_.size() || s.req.priority >= seqs_[running_[victim]]->req.priority) victim = a;
    }
    if (victim == running_.size()) return false;
    const size_t id = running_[victim];
    Seq& q = *seqs_[id];
    running_.erase(running_.begin() + ptrdiff_t(victim));
    free_slot(q);
    std::sort(free_slots_.begin(), free_slots_.end(), std::greater<int64_t>());
    const std::vector<int32_t>& t = q.res.tokens;
    q.req.prompt.insert(q.req.prompt.end(), t.begin() + q.base, t.end());
    q.base = int64_t(t.size());
    q.slot = -1;
    q.done = q.written = 0;
    q.fresh = true;
    q.waits = false;
    q.recent.reset();  // rebuilt from the prompt on return
    q.pens = {};
    waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), id, before), id);
    timings_.preemptions += 1;
    return true;
}

void Batcher::finish(size_t id, const std::string& reason) {
    SHARDLM_CHECK(id < seqs_.size(), "Batcher: no request ", id);
    if (ended(id)) return;
    Seq& q = *seqs_[id];
    end(q, reason);
    const auto it = std::find(running_.begin(), running_.end(), id);
    if (it != running_.end()) {
        running_.erase(it);
        free_slot(q);
        std::sort(free_slots_.begin(), free_slots_.end(), std::greater<int64_t>());
    }
}

bool Batcher::masked(const Seq& q) { return q.json || !q.req.allowed_ids.empty() || !q.req.bad_words.empty(); }

void Batcher::constrain(const Seq& q, float* row) const {
    if (q.json && !q.thinking) constrain_json(q, row);  // free while it reasons
    const int64_t vocab = engine_.config().vocab;
    if (!q.req.allowed_ids.empty()) {
        // Keep the allowed ids' logits, then -inf everywhere and the kept ones back.
        std::vector<float> keep(q.req.allowed_ids.size());
        for (size_t i = 0; i < keep.size(); ++i) keep[i] = row[q.req.allowed_ids[i]];
        std::fill(row, row + vocab, -INFINITY);
        for (size_t i = 0; i < keep.size(); ++i) row[q.req.allowed_ids[i]] = keep[i];
    }
    const std::vector<int32_t>& t = q.res.tokens;
    for (const std::vector<int32_t>& w : q.req.bad_words) {
        const size_t before = w.size() - 1;  // the ids that must end the generated tokens
        if (before <= t.size() && std::equal(w.begin(), w.end() - 1, t.end() - ptrdiff_t(before))) row[w.back()] = -INFINITY;
    }
    // Nothing left to draw (the JSON value's ids, or the allowed ones, all banned): end here
    // rather than draw from a row of -inf. (A row of NaN stays: accept() names it.)
    if (std::all_of(row, row + vocab, [](float x) { return x == -INFINITY; }))
        for (const int64_t id : engine_.config().eos_ids) row[id] = 0.0f;
}

void Batcher::constrain_json(const Seq& q, float* row) const {
    const int64_t vocab = engine_.config().vocab;
    // The first token may open the reasoning instead.
    const bool may_think = q.req.think_open >= 0 && q.req.think_open < vocab && q.res.tokens.empty();
    const float think = may_think ? row[q.req.think_open] : 0.0f;
    // A text that may end here but also go on (guided_regex): its end-of-sequence logits stay.
    const std::vector<int64_t>& ends = engine_.config().eos_ids;
    std::vector<float> end_logits;
    if (q.json->may_end() && !q.json->complete())
        for (const int32_t id : ends) end_logits.push_back(row[id]);
    const std::vector<uint8_t>& ok = opt_.json_vocab->allowed(*q.json);
    const int64_t n = std::min<int64_t>(vocab, int64_t(ok.size()));
    bool any = false;
    for (int64_t i = 0; i < n; ++i) {
        if (ok[size_t(i)]) any = true;
        else row[i] = -INFINITY;
    }
    for (int64_t i = n; i < vocab; ++i) row[i] = -INFINITY;
    // No token of this vocabulary goes on from here (it lacks the bytes): end the sequence.
    if (!any)
        for (const int64_t id : engine_.config().eos_ids) row[id] = 0.0f;
    for (size_t k = 0; k < end_logits.size(); ++k) row[ends[k]] = end_logits[k];
    if (may_think) row[q.req.think_open] = think;
}

void Batcher::row_penalties(Seq& q) const {
    q.recent->entries(q.req.sampler, q.pens);
    if (int64_t(q.res.tokens.size()) < q.req.min_tokens) ban_ends(engine_.config(), q.req.stop_ids, q.pens);
}

// Appends the token sampled from row `row` of the step (cand: from its candidates); returns
// whether the sequence goes on.
bool Batcher::accept(Seq& q, size_t row, bool cand, const TokenCallback& on_token, const StopCheck& stop) {
    const ModelConfig& cfg = engine_.config();
    const int64_t vocab = cfg.vocab, k = step_k_;
    SequenceResult& r = q.res;
    const SamplerOptions& so = q.req.sampler;
    int32_t id = -1;
    if (cand) {
        const float* v = vals_.data() + row * size_t(k);
        const int32_t* c = ids_.data() + row * size_t(k);
        id = nucleus_only(so) ? q.sampler.sample_nucleus(v, c, k, mass_[row]) : q.sampler.sample_top(v, c, k);
    }
    // NaN ranks below every number, so a NaN where the sampler looked first means the whole row
    // is NaN: the weights hold NaN or the forward pass overflowed. Sampling on would print token 0
    // for ever; stop with the reason instead.
    auto nan_row = [&]() {
        fail("the logits of sequence ", q.index, " are all NaN at generated token ", r.tokens.size(),
             " (NaN in the weights, or activations that overflowed their precision; try --weights fp32 or bf16)");
    };
    if (cand && std::isnan(vals_[row * size_t(k)]) &&
        std::all_of(vals_.begin() + ptrdiff_t(row * size_t(k)), vals_.begin() + ptrdiff_t((row + 1) * size_t(k)),
                    [](float v) { return std::isnan(v); }))
        nan_row();
    if (id < 0) {
        float* lg = logits_.data() + row * size_t(vocab);
        if (cand) engine_.nucleus_row(int64_t(row), lg);  // the nucleus reaches past the candidates
        id = q.sampler.sample(lg, vocab);
        if (std::isnan(lg[id])) nan_row();
        if (q.req.logprobs >= 0) r.logprobs.push_back(token_logprobs(lg, vocab, id, q.req.logprobs));
    }
    r.tokens.push_back(id);
    if (q.recent) q.recent->push(id);
    const bool eos = is_eos_id(cfg, id);
    // Reasoning before a constrained reply: its tokens, the tags included, are not the JSON's.
    const bool reasoning = q.thinking || (q.json && r.tokens.size() == 1 && id == q.req.think_open);
    if (reasoning) q.thinking = id != q.req.think_close;
    if (q.json && !reasoning && !eos && (id >= opt_.json_vocab->size() || !q.json->push(opt_.json_vocab->bytes(id))))
        fail("JSON mode: sequence ", q.index, " drew token ", id, ", which does not continue its JSON value (its logits row was all -inf?)");
    if (on_token) on_token(q.index, id);
    if (eos && !q.req.ignore_eos) r.stop_reason = "eos";
    else if (std::find(q.req.stop_ids.begin(), q.req.stop_ids.end(), id) != q.req.stop_ids.end()) r.stop_reason = "stop";
    else if (q.json && q.json->complete()) r.stop_reason = "stop";
    else if (stop && stop(q.index, id)) r.stop_reason = "stop";
    else if (int64_t(r.tokens.size()) >= q.req.max_new_tokens) r.stop_reason = "length";
    return r.stop_reason.empty();
}

void Batcher::step(const TokenCallback& on_token, const StopCheck& stop) {
    const ModelConfig& cfg = engine_.config();
    const EngineOptions& eo = engine_.options();
    const int64_t vocab = cfg.vocab, ctx = eo.ctx;
    // Admission by priority (lower first), then in order of arrival; a request bound to a busy
    // slot holds back those after it. Without a free slot, a running sequence of a higher value
    // makes way (preempt).
    const auto before = [&](size_t a, size_t b) {
        const int64_t pa = seqs_[a] ? seqs_[a]->req.priority : INT64_MIN, pb = seqs_[b] ? seqs_[b]->req.priority : INT64_MIN;
        return pa < pb || (pa == pb && a < b);
    };
    std::sort(waiting_.begin(), waiting_.end(), before);
    // max_adapters: the adapters running, and whether a request was passed over for the limit.
    std::vector<int64_t> adapters = opt_.max_adapters > 0 ? running_adapters() : std::vector<int64_t>{};
    bool passed_over = false;
    size_t at = 0;  // waiting_[at] is the next to admit; those before it were passed over
    while (at < waiting_.size()) {
        const size_t id = waiting_[at];
        if (!seqs_[id] || seqs_[id]->ended) {  // finished before it ran
            waiting_.erase(waiting_.begin() + ptrdiff_t(at));
            continue;
        }
        Seq& q = *seqs_[id];
        if (q.req.max_new_tokens == 0 && q.req.prompt.size() == 1) {  // nothing to score, nothing to generate
            end(q, "length");
            waiting_.erase(waiting_.begin() + ptrdiff_t(at));
            continue;
        }
        if (opt_.max_adapters > 0 && q.req.adapter >= 0 &&
            (passed_over || (int64_t(adapters.size()) >= opt_.max_adapters &&
                             !std::binary_search(adapters.begin(), adapters.end(), q.req.adapter)))) {
            passed_over = true;
            ++at;
            continue;
        }
        if (free_slots_.empty() && (q.req.slot >= 0 || !preempt(q.req.priority, before))) break;
        auto it = q.req.slot >= 0 ? std::find(free_slots_.begin(), free_slots_.end(), q.req.slot) : free_slots_.end() - 1;
        if (it == free_slots_.end()) break;
        int64_t load = 0;  // positions to load from the host tier
        size_t entry = 0;
        int64_t kept = q.done;  // of the tokens the slot holds, those the request keeps
        if (q.req.slot < 0 && opt_.reuse_prefix && q.req.prompt_logprobs < 0) {
            const std::vector<int32_t>& p = q.req.prompt;
            int64_t best = -1;
            for (auto f = free_slots_.end(); f-- != free_slots_.begin();) {  // the lowest first
                const std::vector<int32_t>& h = held_[size_t(*f)];
                const int64_t n = held_salt_[size_t(*f)] != q.req.cache_salt || held_adapter_[size_t(*f)] != q.req.adapter
                                      ? 0
                                      : std::mismatch(h.begin(), h.end(), p.begin(), p.end()).first - h.begin();
                if (n > best || (n == best && freed_at_[size_t(*f)] < freed_at_[size_t(*it)])) {
                    best = n;
                    it = f;
                }
            }
            q.done = std::min(best, int64_t(p.size()) - 1);  // the last prompt token runs for its logits
            kept = best;  // (the last prompt token's row is written again alike)
            const int64_t saved = std::min(host_match(p, q.req, entry), int64_t(p.size()) - 1);
            if (saved > q.done) load = saved;
        }
        // What the slot holds goes to the host tier before anything overwrites it, and joins it
        // after the load (which may then make room by dropping what it loaded).
        HostPrefix out = opt_.host_cache_bytes > 0 ? save_held(*it, kept) : HostPrefix{};
        if (load > 0) {
            engine_.load_kv(*it, load, host_[entry].kv.data(), int64_t(host_[entry].tokens.size()));
            host_[entry].used = ++host_uses_;
            timings_.host_loads += 1;
            timings_.host_tokens += load - q.done;
            q.done = load;
        }
        if (!out.tokens.empty()) keep_host(std::move(out));
        if (q.base == 0) q.res.cached_tokens = q.done;
        q.slot = *it;
        free_slots_.erase(it);
        running_.push_back(id);
        waiting_.erase(waiting_.begin() + ptrdiff_t(at));
        if (q.req.adapter >= 0 && !std::binary_search(adapters.begin(), adapters.end(), q.req.adapter))
            adapters.insert(std::upper_bound(adapters.begin(), adapters.end(), q.req.adapter), q.req.adapter);
        if (adjusts_logits(q.req.sampler) || q.req.min_tokens > 0) {
            q.recent = std::make_unique<RecentTokens>(q.window, vocab);
            for (const int32_t id : q.req.prompt) q.recent->push(id);
        }
        if (q.req.json && !q.json) q.json = std::make_unique<JsonAcceptor>(q.req.json);
    }
    if (running_.empty()) return;
    if (opt_.reuse_prefix) share_prefixes();

    auto add_penalties = [&](SeqChunk& ch, Seq& q) {
        if (!q.recent) return;
        row_penalties(q);
        ch.penalties = q.pens.data();
        ch.n_penalties = int64_t(q.pens.size());
    };
    std::vector<SeqChunk> chunks;
    std::vector<Seq*> chunk_seq;
    for (const size_t i : running_) {
        Seq& q = *seqs_[i];
        if (q.done < int64_t(q.req.prompt.size())) continue;  // still prefilling
        q.last = q.res.tokens.back();
        SeqChunk ch;
        ch.slot = q.slot;
        ch.adapter = q.req.adapter;
        ch.tokens = &q.last;
        ch.n = 1;
        ch.pos = int64_t(q.res.prompt.size() + q.res.tokens.size()) - 1 - q.dropped;
        if (ch.pos >= ctx) {
            // Full: keep the sinks, drop the older half of the rest (llama.cpp's context shift).
            const int64_t discard = (ch.pos - opt_.sink_tokens) / 2;
            engine_.shift_kv(ch.slot, opt_.sink_tokens, discard, ch.pos);
            q.dropped += discard;
            ch.pos -= discard;
            timings_.context_shifts += 1;
        }
        ch.want_logits = true;
        add_penalties(ch, q);
        chunks.push_back(ch);
        chunk_seq.push_back(&q);
    }
    const size_t n_decode = chunks.size();
    const int64_t budget_max = std::min(opt_.prefill_chunk, eo.max_step_tokens);
    int64_t rows_left = (eo.max_logit_rows > 0 ? eo.max_logit_rows : eo.max_batch) - int64_t(n_decode);
    int64_t spec_tokens = 0;
    if (opt_.speculate > 0 && (opt_.speculate_max_batch == 0 || int64_t(n_decode) <= opt_.speculate_max_batch)) {
        // Proposals take what the decode tokens leave of the step, less a row and a token for
        // each prompt still to prefill (prompts go first: they wait for their first token).
        int64_t prefilling = 0;
        for (const size_t i : running_) prefilling += seqs_[i]->done < int64_t(seqs_[i]->req.prompt.size());
        int64_t rows = rows_left - prefilling, tokens = budget_max - int64_t(n_decode) - prefilling;
        if (opt_.speculate_max_tokens > 0) tokens = std::min(tokens, opt_.speculate_max_tokens - int64_t(n_decode) - prefilling);
        // Decode chunk c becomes its last token and the proposals d, a logits row each.
        auto verify = [&](size_t c, const std::vector<int32_t>& d) {
            Seq& q = *chunk_seq[c];
            SeqChunk& ch = chunks[c];
            q.spec.assign(1, q.last);
            q.spec.insert(q.spec.end(), d.begin(), d.end());
            ch.tokens = q.spec.data();
            ch.n = int64_t(q.spec.size());
            ch.want_logits = false;
            ch.all_logits = true;  // row j: the choice after token j, checked against proposal j + 1
            ch.penalties = nullptr;  // applied here row by row, from the tokens kept before it
            ch.n_penalties = 0;
            rows -= int64_t(d.size());
            tokens -= int64_t(d.size());
            spec_tokens += int64_t(d.size());
        };
        std::vector<DraftModel::Query> queries;  // a draft model's, all at once
        std::vector<size_t> query_chunk;
        for (size_t c = 0; c < n_decode && rows > 0 && tokens > 0; ++c) {
            Seq& q = *chunk_seq[c];
            const int64_t left = q.req.max_new_tokens - int64_t(q.res.tokens.size());  // the last one needs no proposal
            // Under a step limit each sequence still to come gets its share of what is left.
            const int64_t share =
                opt_.speculate_max_tokens > 0 ? std::max<int64_t>(1, tokens / int64_t(n_decode - c)) : tokens;
            const int64_t k = std::min({opt_.speculate, rows, tokens, share, left - 1, ctx - 1 - chunks[c].pos});
            if (k <= 0 || (drafter_ && q.dropped > 0)) continue;
            q.spec = q.req.prompt;
            q.spec.insert(q.spec.end(), q.res.tokens.begin() + q.base, q.res.tokens.end());
            if (drafter_) {  // reserved now, proposed below for all sequences in one go
                DraftModel::Query dq;
                dq.slot = q.slot;
                dq.k = k;
                dq.salt = q.req.cache_salt;
                queries.push_back(dq);
                query_chunk.push_back(c);
                rows -= k;
                tokens -= k;
                continue;
            }
            const std::vector<int32_t> d = lookup_draft(q.spec.data(), int64_t(q.spec.size()), k);
            if (!d.empty()) verify(c, d);
        }
        if (drafter_ && !queries.empty()) {
            for (size_t i = 0; i < queries.size(); ++i) {  // q.spec stays put from here on
                const Seq& q = *chunk_seq[query_chunk[i]];
                queries[i].seq = q.spec.data();
                queries[i].n = int64_t(q.spec.size());
            }
            drafter_->propose(queries);
            for (size_t i = 0; i < queries.size(); ++i) {
                rows += queries[i].k;  // verify() takes what the proposals use
                tokens += queries[i].k;
                if (!queries[i].out.empty()) verify(query_chunk[i], queries[i].out);
            }
        }
        rows_left -= spec_tokens;
    }
    // Prompt chunks, logits only at each prompt's last token (and at every one but the last of a
    // prompt whose logprobs are asked for), within the engine's logits rows.
    int64_t budget = std::max<int64_t>(1, budget_max - int64_t(n_decode) - spec_tokens), prompt_tokens = 0;
    for (const size_t i : running_) {
        Seq& q = *seqs_[i];
        const int64_t len = int64_t(q.req.prompt.size());
        if (budget == 0) break;
        if (q.done == len || q.waits) continue;
        int64_t n = std::min(budget, len - q.done);
        SeqChunk ch;
        if (q.req.prompt_logprobs >= 0 && q.done < len - 1) {
            n = std::min({n, len - 1 - q.done, rows_left});  // the last token runs alone, for its sample
            ch.all_logits = true;
            rows_left -= n;
        } else if (q.done + n == len) {
            if (rows_left == 0) n -= 1;  // no logits row left for the prompt's end: stop short of it
            else rows_left -= 1;
        }
        if (n == 0) continue;
        ch.slot = q.slot;
        ch.adapter = q.req.adapter;
        ch.tokens = q.req.prompt.data() + q.done;
        ch.n = n;
        ch.pos = q.done;
        q.done += n;
        q.fresh = false;
        ch.want_logits = !ch.all_logits && q.done == len;
        if (ch.want_logits) add_penalties(ch, q);
        chunks.push_back(ch);
        chunk_seq.push_back(&q);
        budget -= n;
        prompt_tokens += n;
    }

    // What the rows' samplers need from the engine: whole rows when one of them reads the whole
    // row (a sampler without a top-k limit, logprobs, kept prompt logits, prompt logprobs, a
    // verify row's penalties applied here); each row's nucleus mass when all sample top-p alone
    // at one temperature; else the most candidates any reads (a verify row's too: greedy
    // speculation moves one candidate per row, not the vocabulary).
    bool full = false, nucleus = true;
    int64_t k = 0, rows = 0;
    float temperature = -1.0f;
    int64_t all_rows = 0;  // of all_logits chunks
    for (size_t c = 0; c < chunks.size(); ++c) {
        const bool verify = c < n_decode && chunks[c].all_logits;
        if (chunks[c].all_logits) {
            full = full || !verify;
            all_rows += chunks[c].n;
        }
        if (!chunks[c].want_logits && !verify) continue;
        ++rows;
        const Seq& q = *chunk_seq[c];
        const BatchRequest& r = q.req;
        const SamplerOptions& so = r.sampler;
        full = full || r.logprobs >= 0 || (c >= n_decode && r.keep_prompt_logits) || (verify && q.recent) || masked(q);
        const bool nuc = nucleus_only(so) && (temperature < 0.0f || so.temperature == temperature);
        if (nuc) temperature = so.temperature;
        nucleus = nucleus && nuc;
        const int64_t need = sampler_candidates(so, vocab);
        if (need == 0 && !nucleus_only(so)) full = true;
        k = std::max(k, need);
    }
    if (nucleus) k = std::min(vocab, kMaxTopCandidates);
    // (A step of prompt chunks that all end short of their prompt's end has no row: plain forward.)
    if (rows == 0 || k == 0 || k > kMaxTopCandidates) full = true;
    const size_t cap = size_t(slots_);
    step_k_ = full ? 0 : k;
    logits_.resize((cap + size_t(all_rows)) * size_t(vocab));
    vals_.resize(full ? 0 : (cap + size_t(all_rows)) * size_t(k));
    ids_.resize(vals_.size());
    mass_.resize(full ? 0 : cap + size_t(all_rows));
    for (size_t c = 0; c < chunks.size(); ++c)
        chunk_seq[c]->written = std::max(chunk_seq[c]->written, chunks[c].pos + chunks[c].n);
    double t0 = now_ms();
    if (drafter_) {  // the draft model's steps belong to this step's time
        t0 -= drafter_->ms() - draft_ms_;
        timings_.draft_ms += drafter_->ms() - draft_ms_;
        draft_ms_ = drafter_->ms();
    }
    bool cand = false;
    if (!full && !nucleus) {
        engine_.forward_top(chunks, k, vals_.data(), ids_.data());
        cand = true;
    } else if (!full && engine_.forward_nucleus(chunks, k, temperature, vals_.data(), ids_.data(), mass_.data())) {
        cand = true;
    } else {
        engine_.forward(chunks, logits_.data());
    }
    size_t row = 0;
    int64_t made = 0;  // tokens the decoding sequences generated
    for (size_t c = 0; c < chunks.size(); ++c) {
        Seq& q = *chunk_seq[c];
        if (c < n_decode && chunks[c].all_logits) {  // speculation: row j checks proposal j + 1
            // A proposal is a single token, not a distribution, so speculative sampling's rule
            // (keep proposal d with probability min(1, p(d) / q(d)) = p(d), else draw from p with d
            // taken out) is the same as drawing from p as usual and keeping d if the draw is d.
            // Each kept token is thus drawn by the sequence's own generator from the row it would
            // be drawn from without speculation, its penalties reckoned from the tokens kept
            // before it, one draw per token; the rows after the first other choice are not drawn
            // from. So the tokens are those made without speculation, seeded draws included (up
            // to the last bits a row computed in a chunk may differ by from a one-token step's).
            const SeqChunk& ch = chunks[c];
            timings_.draft_tokens += ch.n - 1;
            bool going = true;  // until a stop, or a choice other than the proposal: the rest is void
            for (int64_t j = 0; j < ch.n; ++j) {
                const size_t r = row++;
                if (!going) continue;
                if (q.recent) {
                    row_penalties(q);
                    apply_penalties_ref(logits_.data() + r * size_t(vocab), vocab, 0, q.pens.data(),
                                        int64_t(q.pens.size()));
                }
                if (masked(q)) constrain(q, logits_.data() + r * size_t(vocab));
                ++made;
                if (!accept(q, r, cand, on_token, stop)) {
                    end(q, q.res.stop_reason);
                    going = false;
                } else if (j + 1 == ch.n || q.res.tokens.back() != ch.tokens[j + 1]) {
                    going = false;
                } else {
                    timings_.accepted_tokens += 1;
                }
            }
            continue;
        }
        if (chunks[c].all_logits) {  // row j predicts prompt token pos + j + 1
            const SeqChunk& ch = chunks[c];
            for (int64_t j = 0; j < ch.n; ++j, ++row)
                q.res.prompt_logprobs.push_back(token_logprobs(logits_.data() + row * size_t(vocab), vocab,
                                                               q.req.prompt[size_t(ch.pos + j + 1)], q.req.prompt_logprobs));
            if (q.req.max_new_tokens == 0 && q.done == int64_t(q.req.prompt.size()) - 1) end(q, "length");
            continue;
        }
        if (!chunks[c].want_logits) continue;
        if (c >= n_decode && q.req.keep_prompt_logits) {
            const float* lg = logits_.data() + row * size_t(vocab);
            q.res.prompt_logits.assign(lg, lg + vocab);
        }
        made += c < n_decode;
        if (masked(q)) constrain(q, logits_.data() + row * size_t(vocab));
        if (!accept(q, row++, cand, on_token, stop)) end(q, q.res.stop_reason);
    }
    // Ended sequences hand their slot on (the lowest free slot on top: a sequence's results never
    // depend on its slot; this only keeps the slots of requests that all fit those of their order).
    size_t kept = 0;
    for (const size_t i : running_) {
        if (!seqs_[i]->ended) {
            running_[kept++] = i;
            continue;
        }
        free_slot(*seqs_[i]);
    }
    running_.resize(kept);
    std::sort(free_slots_.begin(), free_slots_.end(), std::greater<int64_t>());
    const double t1 = now_ms();
    if (prompt_tokens > 0) {
        timings_.prefill_ms += t1 - t0;
        timings_.prefill_tokens += prompt_tokens;
        timings_.prefill_steps += 1;
    } else {
        timings_.decode_ms += t1 - t0;
        timings_.decode_steps += 1;
        timings_.decode_tokens += made;
    }
}

}  // namespace shardlm
