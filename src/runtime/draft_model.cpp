#include "runtime/draft_model.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace shardlm {

DraftModel::DraftModel(Engine& draft, int64_t vocab, int64_t prefill_chunk)
    : e_(draft), vocab_(vocab), chunk_(std::min(prefill_chunk, draft.options().max_step_tokens)),
      held_(size_t(draft.options().max_batch)) {
    SHARDLM_CHECK(chunk_ >= 1, "DraftModel: prefill chunk ", prefill_chunk);
}

std::vector<int32_t> DraftModel::run(const std::vector<SeqChunk>& chunks) {
    int64_t rows = 0;
    for (const SeqChunk& c : chunks) rows += c.want_logits;
    std::vector<float> vals(static_cast<size_t>(rows));
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    const auto t0 = std::chrono::steady_clock::now();
    e_.forward_top(chunks, 1, vals.data(), ids.data());
    ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return ids;
}

void DraftModel::propose(std::vector<Query>& qs) {
    const int64_t rows_max = e_.options().max_logit_rows > 0 ? e_.options().max_logit_rows : e_.options().max_batch;
    // Catch up: run each sequence's tokens after the start its slot's cache shares with it (at
    // least its last token, whose logits give the first proposal), in steps of chunk_ tokens.
    std::vector<int64_t> at(qs.size());
    for (size_t i = 0; i < qs.size(); ++i) {
        Query& q = qs[i];
        SHARDLM_CHECK(q.slot >= 0 && q.slot < int64_t(held_.size()) && q.n >= 1 && q.k >= 1 && q.n + q.k <= e_.options().ctx + 1,
                      "DraftModel::propose: slot ", q.slot, ", ", q.n, " tokens, k ", q.k);
        std::vector<int32_t>& h = held_[size_t(q.slot)];
        const int64_t same = std::mismatch(h.begin(), h.end(), q.seq, q.seq + q.n).first - h.begin();
        at[i] = std::min(same, q.n - 1);
        h.assign(q.seq, q.seq + at[i]);
        q.out.clear();
    }
    for (bool left = true; left;) {
        left = false;
        std::vector<SeqChunk> chunks;
        std::vector<size_t> owner;
        int64_t budget = chunk_, rows = rows_max;
        for (size_t i = 0; i < qs.size() && budget > 0; ++i) {
            Query& q = qs[i];
            if (at[i] == q.n) continue;
            const int64_t n = std::min(budget, q.n - at[i]);
            const bool last = at[i] + n == q.n;
            if (last && rows == 0) {  // no logits row left this step
                left = true;
                continue;
            }
            SeqChunk ch;
            ch.slot = q.slot;
            ch.tokens = q.seq + at[i];
            ch.n = n;
            ch.pos = at[i];
            ch.want_logits = last;
            rows -= last;
            budget -= n;
            chunks.push_back(ch);
            owner.push_back(i);
        }
        for (size_t i = 0; i < qs.size(); ++i) left = left || at[i] < qs[i].n;
        if (chunks.empty()) continue;
        const std::vector<int32_t> ids = run(chunks);
        size_t row = 0;
        for (size_t c = 0; c < chunks.size(); ++c) {
            Query& q = qs[owner[c]];
            held_[size_t(q.slot)].insert(held_[size_t(q.slot)].end(), chunks[c].tokens, chunks[c].tokens + chunks[c].n);
            at[owner[c]] += chunks[c].n;
            if (chunks[c].want_logits) q.out.push_back(ids[row++]);
        }
        for (size_t i = 0; i < qs.size(); ++i) left = left || at[i] < qs[i].n;
    }
    // Then one token at a time: each sequence's latest proposal in, the next one out, until it has
    // k (or proposed an id the target does not have).
    auto valid = [&](const Query& q) { return !q.out.empty() && q.out.back() >= 0 && q.out.back() < vocab_; };
    for (int64_t j = 1;; ++j) {
        std::vector<SeqChunk> chunks;
        std::vector<size_t> owner;
        for (size_t i = 0; i < qs.size(); ++i) {
            Query& q = qs[i];
            if (j >= q.k || int64_t(q.out.size()) != j || !valid(q)) continue;
            SeqChunk ch;
            ch.slot = q.slot;
            ch.tokens = &q.out.back();
            ch.n = 1;
            ch.pos = q.n + j - 1;
            ch.want_logits = true;
            chunks.push_back(ch);
            owner.push_back(i);
        }
        if (chunks.empty()) break;
        // Rows: one per chunk, at most the draft's slots (one chunk per slot).
        const std::vector<int32_t> ids = run(chunks);
        for (size_t c = 0; c < chunks.size(); ++c) {
            Query& q = qs[owner[c]];
            held_[size_t(q.slot)].push_back(*chunks[c].tokens);
            q.out.push_back(ids[c]);
        }
    }
    for (Query& q : qs)
        while (!q.out.empty() && (q.out.back() < 0 || q.out.back() >= vocab_)) q.out.pop_back();
}

}  // namespace shardlm
