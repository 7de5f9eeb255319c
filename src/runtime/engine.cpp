#include "runtime/engine.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/topk.h"
#include "model/lora_weights.h"

namespace shardlm {

AttentionImpl parse_attention(const std::string& s) {
    if (s == "flash") return AttentionImpl::Flash;
    if (s == "naive") return AttentionImpl::Naive;
    fail("--attention: unknown kind \"", s, "\" (flash, naive)");
}

bool Engine::forward_nucleus(const std::vector<SeqChunk>&, int64_t, float, float*, int32_t*, uint64_t*) {
    return false;
}

void Engine::nucleus_row(int64_t, float*) { fail("nucleus_row: this engine hands back no nucleus candidates"); }

void Engine::forward_top(const std::vector<SeqChunk>& chunks, int64_t k, float* vals, int32_t* ids) {
    const int64_t vocab = config().vocab;
    SHARDLM_CHECK(k >= 1 && k <= std::min(vocab, kMaxTopCandidates), "forward_top: ", k, " candidates of ", vocab);
    const StepShape shape = check_step(config(), options(), chunks);
    std::vector<float> logits(size_t(shape.logit_rows * vocab));
    forward(chunks, logits.data());
    for (int64_t r = 0; r < shape.logit_rows; ++r) topk_ref(logits.data() + r * vocab, vocab, k, vals + r * k, ids + r * k);
}

void merge_candidates(const std::vector<CandidateList>& parts, int64_t k, float* vals, int32_t* ids) {
    std::vector<std::pair<float, int32_t>> cand;
    for (const CandidateList& p : parts)
        for (int64_t j = 0; j < p.n; ++j) cand.emplace_back(p.vals[j], p.ids[j]);
    SHARDLM_CHECK(k >= 0 && k <= int64_t(cand.size()), "merge_candidates: ", k, " of ", cand.size(), " candidates");
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(),
                      [](const auto& a, const auto& b) { return topk_before(a.first, a.second, b.first, b.second); });
    for (int64_t j = 0; j < k; ++j) {
        vals[j] = cand[size_t(j)].first;
        ids[j] = cand[size_t(j)].second;
    }
}

void Engine::set_adapters(const std::vector<LoraWeights>* adapters) {
    if (adapters && !adapters->empty()) fail("LoRA adapters chosen per request: the ", device(), " engine runs none");
}

void check_adapters(const std::vector<SeqChunk>& chunks, const std::vector<LoraWeights>* adapters) {
    const int64_t n = adapters ? int64_t(adapters->size()) : 0;
    for (const SeqChunk& ch : chunks)
        if (ch.adapter < -1 || ch.adapter >= n || (ch.adapter >= 0 && (*adapters)[size_t(ch.adapter)].layers.empty()))
            fail("chunk of slot ", ch.slot, ": LoRA adapter ", ch.adapter, " of ", n, " this engine holds",
                 ch.adapter >= 0 && ch.adapter < n ? " (unloaded)" : "");
}

std::string headless_message() {
    return "this model was loaded without an lm_head (a base or sequence-classification model, or a checkpoint "
           "without lm_head.weight that does not tie it to the embedding): it gives embeddings and classifications "
           "only (shardlm embed and classify, serve --embeddings and --rerank), not logits";
}

RopeParams rope_params(const ModelConfig& c) {
    RopeParams rp;
    rp.head_dim = c.head_dim;
    rp.theta = c.rope_theta;
    switch (c.rope.kind) {
        case RopeScaling::Kind::None: rp.freqs = RopeFreqs::Plain; break;
        case RopeScaling::Kind::Llama3: rp.freqs = RopeFreqs::Llama3; break;
        case RopeScaling::Kind::Linear: rp.freqs = RopeFreqs::Linear; break;
        case RopeScaling::Kind::Yarn: rp.freqs = RopeFreqs::Yarn; break;
    }
    rp.factor = c.rope.factor;
    rp.low_freq_factor = c.rope.low_freq_factor;
    rp.high_freq_factor = c.rope.high_freq_factor;
    rp.original_max_position = c.rope.original_max_position;
    rp.beta_fast = c.rope.beta_fast;
    rp.beta_slow = c.rope.beta_slow;
    rp.truncate = c.rope.truncate;
    return rp;
}

float attention_scale(const ModelConfig& c) {
    const float af = c.rope.kind == RopeScaling::Kind::Yarn ? c.rope.attention_factor : 1.0f;
    return af * af / std::sqrt(float(c.head_dim));
}

namespace {
// A chunk's token penalties: on its one logits row, within the engine's room, distinct ids of the
// vocabulary, a finite repetition > 0 and a finite offset (else one NaN would spread to a row).
void check_penalties(const ModelConfig& c, const EngineOptions& opt, const SeqChunk& ch) {
    SHARDLM_CHECK(ch.want_logits && !ch.all_logits && ch.penalties && ch.n_penalties > 0,
                  "token penalties go with one logits row per chunk (want_logits, not all_logits)");
    SHARDLM_CHECK(ch.n_penalties <= opt.max_penalties, "a logits row with ", ch.n_penalties,
                  " penalised tokens; the engine has room for ", opt.max_penalties);
    // One bit per vocabulary id (19 KB for 152k): linear in the list, where sorting a list of
    // 30k ids (a whole-context window) cost more than building it.
    std::vector<bool> seen(size_t(c.vocab), false);
    for (int64_t i = 0; i < ch.n_penalties; ++i) {
        const PenaltyEntry& e = ch.penalties[i];
        SHARDLM_CHECK(e.id >= 0 && e.id < c.vocab, "penalised token id ", e.id, " is outside the vocabulary [0, ",
                      c.vocab, ")");
        SHARDLM_CHECK(std::isfinite(e.repetition) && e.repetition > 0.0f && std::isfinite(e.offset),
                      "token penalty of id ", e.id, ": repetition ", e.repetition, ", offset ", e.offset);
        SHARDLM_CHECK(!seen[size_t(e.id)], "token id ", e.id, " is penalised twice in one row");
        seen[size_t(e.id)] = true;
    }
}
}  // namespace

std::vector<PenaltyEntry> step_penalties(const std::vector<SeqChunk>& chunks) {
    std::vector<PenaltyEntry> out;
    int32_t row = 0;
    for (const SeqChunk& ch : chunks) {
        for (int64_t i = 0; i < ch.n_penalties; ++i) {
            out.push_back(ch.penalties[i]);
            out.back().row = row;
        }
        row += int32_t(ch.all_logits ? ch.n : ch.want_logits ? 1 : 0);
    }
    return out;
}

StepShape check_step(const ModelConfig& c, const EngineOptions& opt, const std::vector<SeqChunk>& chunks, bool hidden) {
    StepShape s;
    for (const SeqChunk& ch : chunks) {
        SHARDLM_CHECK(ch.n > 0 && ch.slot >= 0 && ch.slot < opt.max_batch);
        SHARDLM_CHECK(ch.pos >= 0 && ch.pos + ch.n <= opt.ctx, "positions ", ch.pos, "+", ch.n,
                      " exceed the KV cache capacity ", opt.ctx);
        for (int64_t i = 0; i < ch.n; ++i) {
            const int32_t id = ch.tokens[i];
            if (id < 0 || id >= c.vocab) fail("token id ", id, " is outside the vocabulary [0, ", c.vocab, ")");
        }
        if (ch.n_penalties != 0) check_penalties(c, opt, ch);
        s.tokens += ch.n;
        s.logit_rows += ch.all_logits ? ch.n : ch.want_logits ? 1 : 0;
    }
    SHARDLM_CHECK(s.tokens <= opt.max_step_tokens, "step of ", s.tokens, " tokens exceeds the workspace of ",
                  opt.max_step_tokens);
    SHARDLM_CHECK(hidden || s.logit_rows <= opt.max_logit_rows, "logit rows ", s.logit_rows, " exceed the workspace of ",
                  opt.max_logit_rows);
    return s;
}

int64_t kv_capacity(const ModelConfig& c, const EngineOptions& opt) {
    if (c.sliding_window <= 0 || c.window_from_layer > 0) return opt.ctx;
    return std::min(opt.ctx, c.sliding_window + opt.max_step_tokens - 1);
}

KVCacheShape kv_cache_shape(const ModelConfig& c, int64_t n_kv_heads, const EngineOptions& opt) {
    KVCacheShape s;
    s.n_layers = c.n_layers;
    s.n_slots = opt.max_batch;
    s.capacity = kv_capacity(c, opt);
    s.n_kv_heads = n_kv_heads;
    s.head_dim = c.head_dim;
    s.dtype = opt.kv;
    return s;
}

void check_shift(const ModelConfig& c, const EngineOptions& opt, int64_t slot, int64_t keep, int64_t discard,
                 int64_t len) {
    const int64_t cap = kv_capacity(c, opt);
    SHARDLM_CHECK(slot >= 0 && slot < opt.max_batch, "KV shift: slot ", slot, " of ", opt.max_batch);
    SHARDLM_CHECK(keep >= 0 && discard > 0 && keep + discard <= len && len <= cap, "KV shift: keep ", keep,
                  ", discard ", discard, " of ", len, " cached positions (capacity ", cap, ")");
}

void check_copy(const ModelConfig& c, const EngineOptions& opt, int64_t src, int64_t dst, int64_t n) {
    const int64_t cap = kv_capacity(c, opt);
    SHARDLM_CHECK(src >= 0 && src < opt.max_batch && dst >= 0 && dst < opt.max_batch && src != dst, "KV copy: slot ",
                  src, " to slot ", dst, " of ", opt.max_batch);
    SHARDLM_CHECK(n >= 1 && n <= cap, "KV copy: ", n, " positions (capacity ", cap, ")");
}

void check_kv_io(const ModelConfig& c, const EngineOptions& opt, int64_t slot, int64_t n, int64_t saved) {
    const int64_t cap = kv_capacity(c, opt);
    SHARDLM_CHECK(slot >= 0 && slot < opt.max_batch, "KV host copy: slot ", slot, " of ", opt.max_batch);
    SHARDLM_CHECK(n >= 1 && n <= cap, "KV host copy: ", n, " positions (capacity ", cap, ")");
    SHARDLM_CHECK(n <= saved, "KV host copy: ", n, " positions of a copy of ", saved);
}

}  // namespace shardlm
