// The generation loop: continuous batching with chunked prefill. At most the engine's slots of
// sequences run at once (the other prompts wait in order and take the slot of one that ends);
// each step carries one token of every decoding sequence and fills the rest of --prefill-chunk
// with prompt chunks. A sequence stops on an end-of-sequence id, at a stop check (--stop) or
// after max_new_tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/batcher.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace shardlm {

struct GenerateOptions {
    int64_t max_new_tokens = 64;
    // Per prompt (empty: max_new_tokens for each): its own limit (a serving benchmark's requests).
    std::vector<int64_t> max_new_each;
    // Sequences run at once (0: the engine's slots; never more than them).
    int64_t max_running = 0;
    // Tokens per forward step: decode tokens first, prompt tokens fill the rest (at least one
    // prompt token while a prompt waits, so a step may pass it by the decode tokens).
    int64_t prefill_chunk = 256;
    SamplerOptions sampler;
    bool keep_prompt_logits = false;  // keep the logits at each prompt's last position
    // --logprobs: each generated token's log-probability and the n most probable of its row
    // (runtime/sampler.h: token_logprobs); -1: none. Steps then hand back whole rows (on the GPU a
    // copy of the vocabulary per sequence and step).
    int64_t logprobs = -1;
    // --prompt-logprobs: the same for each prompt token after the first, from the logits row
    // before it (BatchRequest::prompt_logprobs); -1: none. max_new_tokens may then be 0.
    int64_t prompt_logprobs = -1;
    // --context-overflow slide: a sequence whose next position would pass the context keeps its
    // first sink_tokens positions (attention sinks), drops the older half of the rest and goes on
    // (Engine::shift_kv), as often as it needs. Off: each prompt plus max_new_tokens must fit.
    bool slide = false;
    int64_t sink_tokens = 4;
    // The flags the engine's ctx was derived from when no --ctx was given
    // (SessionOptions::ctx_origin): errors name them instead of a --ctx never given.
    std::string ctx_origin;
    // Per prompt (empty: none): how many of its first tokens its slot's KV cache already holds at
    // positions [0, cached) from an earlier generate() (a conversation's earlier turns: shardlm
    // chat). Prompt s is in slot s (so no more prompts than slots). Prefill starts there; at
    // least the last prompt token is always run. Not with slide.
    std::vector<int64_t> cached;
    // --prefix-cache: a prompt takes the free slot whose cache holds the longest prefix of it
    // (from a sequence that ended earlier in this run) and prefills the rest
    // (BatcherOptions::reuse_prefix). Pays with more prompts than --batch slots sharing a start.
    bool reuse_prefix = false;
    // With reuse_prefix, the prefix cache's host tier (BatcherOptions::host_cache_bytes; 0: none).
    size_t host_cache_bytes = 0;
    // With host_cache_bytes (generate --prompt-cache, runtime/prefix_file.h), not owned: saves of
    // an earlier run that join the tier before the first request (Batcher::restore_host), and in
    // their place after the run the tier with every slot's prefix in it (save_slots, take_host;
    // the timings' host_saves count those saves too).
    std::vector<SavedPrefix>* host_saves = nullptr;
    // --speculate: each sequence verifies up to this many tokens proposed by prompt lookup per
    // step (BatcherOptions::speculate); 0: off.
    int64_t speculate = 0;
    int64_t speculate_max_batch = 0;  // --speculate-max-batch (BatcherOptions::speculate_max_batch)
    int64_t speculate_max_tokens = 0;  // --speculate-max-tokens (BatcherOptions::speculate_max_tokens)
    Engine* draft = nullptr;           // --draft-model's engine (BatcherOptions::draft), not owned
    float draft_p_min = 0.0f;          // --draft-p-min (BatcherOptions::draft_p_min)
    // --ignore-eos, --min-new-tokens (BatchRequest::ignore_eos, min_tokens; the latter needs
    // room for the end-of-sequence ids in the engine's penalty rows: max_penalties' `banned`).
    bool ignore_eos = false;
    // Tokens that end a sequence besides its end-of-sequence ids (BatchRequest::stop_ids; the FIM
    // separators of generate --suffix).
    std::vector<int32_t> stop_ids;
    // --json-object / --json-schema: every prompt's text one value of this schema
    // (BatchRequest::json) over these token bytes (not owned); null: off.
    std::shared_ptr<const JsonSchema> json;
    JsonVocab* json_vocab = nullptr;
    int64_t min_new_tokens = 0;
};

struct GenerateResult {
    std::vector<SequenceResult> seqs;
    GenerateTimings timings;
};

// Token penalties (SamplerOptions::repetition_penalty & co.): how many tokens of a sequence they
// look back over (penalty_last_n, or the context for -1; 0 when off), and the most distinct ids
// one logits row can then list: what EngineOptions::max_penalties must hold (at most the window,
// the vocabulary, and without --context-overflow slide the context; the logit_bias ids added,
// and `banned` more: the end-of-sequence ids of a request with min_tokens).
int64_t penalty_window(const SamplerOptions& opt, int64_t ctx);
int64_t max_penalties(const SamplerOptions& opt, int64_t ctx, int64_t vocab, bool slide, int64_t banned = 0);
// Whether a sequence's logits rows carry entries: penalties or a logit bias.
bool adjusts_logits(const SamplerOptions& opt);
// The penalties of a sequence's next token from its last `window` tokens (tokens [0, n), prompt
// then generated): one entry per distinct id, ascending, with offset = frequency * count +
// presence, and the logit bias: a biased id's offset lowered by its bias (an id not penalised:
// repetition 1, offset -bias). Empty when the options adjust nothing. The plain definition:
// generate() keeps a RecentTokens per sequence instead, which gives the same entries (in another
// order).
std::vector<PenaltyEntry> token_penalties(const SamplerOptions& opt, int64_t window, const int32_t* tokens, int64_t n);

// A sequence's last `window` tokens as a count per id and the list of ids counted, updated one
// token at a time, so that a step's penalties cost O(distinct ids) rather than a sort of the
// window (2 ms per sequence and step at 32k tokens). Two int32 per vocabulary entry (none for a
// window of 0: a logit bias alone).
class RecentTokens {
public:
    RecentTokens(int64_t window, int64_t vocab);
    void push(int32_t id);  // the newest token; the oldest leaves once there are `window`
    // What token_penalties() gives for the window and opt's logit bias: the penalised ids in
    // the order they came in, then the biased ids not among them.
    void entries(const SamplerOptions& opt, std::vector<PenaltyEntry>& out) const;

private:
    void count(int32_t id, int32_t delta);
    int64_t window_;
    std::vector<int32_t> ring_;   // the window's tokens, oldest at ring_[head_] once full
    size_t head_ = 0;
    std::vector<int32_t> count_;  // [vocab]
    std::vector<int32_t> at_;     // [vocab]: index in ids_ of a counted id
    std::vector<int32_t> ids_;    // the ids with a count > 0
};

// Throws Error naming --logit-bias unless every biased id is within [0, vocab).
void check_logit_bias(const SamplerOptions& opt, int64_t vocab);

// The checks generate() makes before it runs anything, on flags, prompts and config alone: at
// least one slot (cached prefixes: a slot per prompt), each prompt (plus max_new_tokens, unless sliding) within the
// context, --sink-tokens, slide on a model whose cache is a sliding-window ring, room in the engine
// for the token penalties, and each prompt id within [0, cfg.vocab) (`source`, where the prompts came from, begins that error: "--prompt-ids").
// Throws Error naming the flags. The CLI calls it before loading the weights (eo as
// engine_options() gives them).
void check_generate(const ModelConfig& cfg, const EngineOptions& eo, const std::vector<std::vector<int32_t>>& prompts,
                    const GenerateOptions& opt, const std::string& source = "");

GenerateResult generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                        const GenerateOptions& opt, const TokenCallback& on_token = nullptr,
                        const StopCheck& stop = nullptr);

}  // namespace shardlm
