// A test engine that passes every step on to another and records its chunks.
#pragma once

#include <vector>

#include "runtime/engine.h"

namespace shardlm::test {

// Records the chunks of every step it passes on to the engine it wraps (generate()'s schedule).
class RecordingEngine : public Engine {
public:
    explicit RecordingEngine(Engine& e) : e_(e) {}
    struct Chunk {
        int64_t slot, pos, n;
        std::vector<int32_t> tokens;
        bool all_logits;  // a logits row at every token (perplexity, speculation's verifying chunks)
        int64_t adapter;  // SeqChunk::adapter
    };
    std::vector<std::vector<Chunk>> steps;

    void forward(const std::vector<SeqChunk>& chunks, float* logits) override {
        record(chunks);
        e_.forward(chunks, logits);
    }
    void forward_hidden(const std::vector<SeqChunk>& chunks, float* hidden) override {
        record(chunks);
        e_.forward_hidden(chunks, hidden);
    }
    void forward_top(const std::vector<SeqChunk>& chunks, int64_t k, float* vals, int32_t* ids) override {
        record(chunks);
        e_.forward_top(chunks, k, vals, ids);
    }
    bool forward_nucleus(const std::vector<SeqChunk>& chunks, int64_t k, float t, float* vals, int32_t* ids,
                         uint64_t* mass) override {
        const bool ran = e_.forward_nucleus(chunks, k, t, vals, ids, mass);
        if (ran) record(chunks);
        return ran;
    }
    void nucleus_row(int64_t row, float* logits) override { e_.nucleus_row(row, logits); }
    void shift_kv(int64_t slot, int64_t keep, int64_t discard, int64_t len) override {
        e_.shift_kv(slot, keep, discard, len);
    }
    void copy_kv(int64_t src, int64_t dst, int64_t n) override { e_.copy_kv(src, dst, n); }
    size_t kv_position_bytes() const override { return e_.kv_position_bytes(); }
    void save_kv(int64_t slot, int64_t n, uint8_t* out) override { e_.save_kv(slot, n, out); }
    void load_kv(int64_t slot, int64_t n, const uint8_t* in, int64_t saved) override { e_.load_kv(slot, n, in, saved); }
    const ModelConfig& config() const override { return e_.config(); }
    const EngineOptions& options() const override { return e_.options(); }
    size_t weight_bytes() const override { return e_.weight_bytes(); }
    size_t kv_bytes() const override { return e_.kv_bytes(); }
    size_t workspace_bytes() const override { return e_.workspace_bytes(); }
    std::string device() const override { return e_.device(); }

private:
    void record(const std::vector<SeqChunk>& chunks) {
        std::vector<Chunk> step;
        for (const SeqChunk& c : chunks) step.push_back({c.slot, c.pos, c.n, {c.tokens, c.tokens + c.n}, c.all_logits, c.adapter});
        steps.push_back(step);
    }
    Engine& e_;
};

}  // namespace shardlm::test
