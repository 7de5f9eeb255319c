#include "runtime/draft_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/nucleus.h"

namespace shardlm {

DraftModel::DraftModel(Engine& draft, int64_t vocab, int64_t prefill_chunk, float p_min)
    : e_(draft), vocab_(vocab), chunk_(std::min(prefill_chunk, draft.options().max_step_tokens)), p_min_(p_min),
      held_(size_t(draft.options().max_batch)), held_salt_(size_t(draft.options().max_batch)) {
    SHARDLM_CHECK(chunk_ >= 1 && p_min >= 0.0f && p_min <= 1.0f, "DraftModel: prefill chunk ", prefill_chunk, ", p_min ", p_min);
}

std::vector<int32_t> DraftModel::run(const std::vector<SeqChunk>& chunks, std::vector<double>& p) {
    int64_t rows = 0;
    for (const SeqChunk& c : chunks) rows += c.want_logits;
    std::vector<float> vals(static_cast<size_t>(rows));
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    p.assign(size_t(rows), 1.0);
    const auto t0 = std::chrono::steady_clock::now();
    if (p_min_ <= 0.0f) {
        e_.forward_top(chunks, 1, vals.data(), ids.data());
    } else {
        // The top token's probability: its nucleus weight (2^kNucleusBits, the row's largest) over
        // the row's total at temperature 1, where the engine sums it (the GPU); else from whole rows.
        std::vector<uint64_t> mass(static_cast<size_t>(rows));
        if (e_.forward_nucleus(chunks, 1, 1.0f, vals.data(), ids.data(), mass.data())) {
            for (int64_t r = 0; r < rows; ++r) p[size_t(r)] = std::ldexp(1.0, kNucleusBits) / double(mass[size_t(r)]);
        } else {
            const int64_t V = e_.config().vocab;
            std::vector<float> logits(static_cast<size_t>(rows * V));
            e_.forward(chunks, logits.data());
            for (int64_t r = 0; r < rows; ++r) {
                const float* x = logits.data() + r * V;
                const int64_t best = std::max_element(x, x + V) - x;  // the first of equal maxima: greedy's
                double sum = 0;
                for (int64_t i = 0; i < V; ++i) sum += std::exp(double(x[i]) - double(x[best]));
                ids[size_t(r)] = int32_t(best);
                p[size_t(r)] = 1.0 / sum;
            }
        }
    }
    ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return ids;
}

void DraftModel::propose(std::vector<Query>& qs) {
    const int64_t rows_max = e_.options().max_logit_rows > 0 ? e_.options().max_logit_rows : e_.options().max_batch;
    std::vector<double> p;
    std::vector<char> cut(qs.size(), 0);  // the draft was not sure of its next token: no more proposals
    auto take = [&](size_t i, int32_t id, double prob) {
        if (prob < double(p_min_)) cut[i] = 1;
        else qs[i].out.push_back(id);
    };
    // Catch up: run each sequence's tokens after the start its slot's cache shares with it (at
    // least its last token, whose logits give the first proposal), in steps of chunk_ tokens.
    std::vector<int64_t> at(qs.size());
    for (size_t i = 0; i < qs.size(); ++i) {
        Query& q = qs[i];
        SHARDLM_CHECK(q.slot >= 0 && q.slot < int64_t(held_.size()) && q.n >= 1 && q.k >= 1 && q.n + q.k <= e_.options().ctx + 1,
                      "DraftModel::propose: slot ", q.slot, ", ", q.n, " tokens, k ", q.k);
        std::vector<int32_t>& h = held_[size_t(q.slot)];
        if (held_salt_[size_t(q.slot)] != q.salt) h.clear();
        held_salt_[size_t(q.slot)] = q.salt;
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
            if (last && rows == 0) continue;  // no logits row left this step
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
        const std::vector<int32_t> ids = run(chunks, p);  // never empty: the first query left always fits
        size_t row = 0;
        for (size_t c = 0; c < chunks.size(); ++c) {
            Query& q = qs[owner[c]];
            held_[size_t(q.slot)].insert(held_[size_t(q.slot)].end(), chunks[c].tokens, chunks[c].tokens + chunks[c].n);
            at[owner[c]] += chunks[c].n;
            if (chunks[c].want_logits) take(owner[c], ids[row], p[row]), ++row;
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
            if (j >= q.k || cut[i] || int64_t(q.out.size()) != j || !valid(q)) continue;
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
        const std::vector<int32_t> ids = run(chunks, p);
        for (size_t c = 0; c < chunks.size(); ++c) {
            Query& q = qs[owner[c]];
            held_[size_t(q.slot)].push_back(*chunks[c].tokens);
            take(owner[c], ids[c], p[c]);
        }
    }
    for (Query& q : qs)
        while (!q.out.empty() && (q.out.back() < 0 || q.out.back() >= vocab_)) q.out.pop_back();
}

}  // namespace shardlm
