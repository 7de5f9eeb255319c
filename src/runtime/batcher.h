// Continuous batching with chunked prefill, one engine step at a time: the scheduler behind
// generate() (runtime/generate.h) and shardlm serve. Requests queue in the order they are added;
// at most max_running sequences hold a KV-cache slot at once, and a sequence that ends hands its
// slot to the next request at once. Each step carries one token of every decoding sequence first
// and fills the rest of prefill_chunk with prompt chunks of the others in the order they came (at
// least one prompt token while a prompt waits): a decode token costs a pass over the weights
// alone, next to a prompt chunk almost nothing (vLLM's chunked-prefill scheduler).
//
// Each request carries its own sampler options. A step hands back only each row's ranked
// candidates when every row's sampler reads candidates (the most any of them needs), each row's
// nucleus mass when every row samples top-p alone at one temperature, and whole rows otherwise.
// Under tensor parallelism every rank runs the same Batcher on the same requests and calls.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/draft_model.h"
#include "runtime/engine.h"
#include "runtime/json_mode.h"
#include "runtime/sampler.h"

namespace shardlm {

struct BatchRequest {
    std::vector<int32_t> prompt;
    int64_t max_new_tokens = 64;
    SamplerOptions sampler;
    uint64_t stream = 0;    // the sampler's stream: a batch samples what each request samples alone
    int64_t logprobs = -1;  // token_logprobs' top n per generated token (-1: none)
    // token_logprobs' top n for each prompt token after the first (-1: none; OpenAI's echo):
    // the prompt runs in chunks with a logits row per token (all_logits, as many as the engine's
    // max_logit_rows leave room for), its last token alone in a later step. Not from the prefix
    // cache. With it max_new_tokens may be 0: the prompt is scored, nothing is generated.
    int64_t prompt_logprobs = -1;
    bool keep_prompt_logits = false;
    // The KV-cache slot the request must run in (-1: the lowest free one; it waits, and those
    // after it, until that slot is free), and how many of its first tokens that slot already
    // holds at positions [0, cached) (a conversation's earlier turns): prefill starts there, at
    // least the last prompt token is always run. A cached prefix needs a slot.
    int64_t slot = -1;
    int64_t cached = 0;
    // vLLM's ignore_eos (an end-of-sequence id does not end it: benchmarks of fixed lengths) and
    // min_tokens (the end-of-sequence ids' logits are -inf until it has this many tokens; stop
    // strings still apply), min_tokens <= max_new_tokens.
    bool ignore_eos = false;
    int64_t min_tokens = 0;
    // vLLM's stop_token_ids: any of these ends the sequence ("stop", the token kept, as an
    // end-of-sequence id is); min_tokens bans them too until it is reached.
    std::vector<int32_t> stop_ids;
    // vLLM's allowed_token_ids: every generated token is one of these ids (distinct; empty: any
    // id). An end-of-sequence id left out of them never comes: max_new_tokens or a stop ends the
    // request.
    std::vector<int32_t> allowed_ids;
    // vLLM's bad_words, as token sequences (each non-empty): a sequence's last id is banned
    // wherever the generated tokens (not the prompt's) end with the ids before it, so the
    // generated tokens never hold the whole sequence; a one-token sequence is banned always.
    std::vector<std::vector<int32_t>> bad_words;
    // JSON mode and structured output (runtime/json_mode.h; OpenAI's response_format json_object
    // and json_schema): each choice only among the tokens that keep the text the start of one
    // value of this schema (BatcherOptions::json_vocab's bytes), and the request ends ("stop")
    // once the value is complete. Its rows are whole. Null: free text.
    std::shared_ptr<const JsonSchema> json;
    // With `json`: reasoning first (vLLM's structured outputs under a reasoning parser): the first
    // token may also be think_open, and then the sequence is free up to think_close (both ids
    // of single-token tags, e.g. Qwen3's <think> and </think>); the constraint holds after it.
    // -1: the constraint holds from the first token. think_first: the sequence starts free, as
    // its prompt opened the reasoning (DeepSeek R1's template ends with <think>).
    int32_t think_open = -1, think_close = -1;
    bool think_first = false;
    // vLLM's priority: among waiting requests, a lower value is admitted first (then the earlier
    // arrival); one that finds no free slot preempts the running sequence of the highest value
    // above its own (Batcher::preempt), which waits again and later goes on with the same tokens.
    int64_t priority = 0;
    // vLLM's cache_salt: the prefix cache shares keys and values only between requests of the
    // same salt ("" is one too), so a tenant cannot learn by timing what another's prompts held.
    std::string cache_salt;
    // The LoRA adapter the sequence runs under (SeqChunk::adapter; -1: the base model). Keys and
    // values are shared only between sequences of one adapter, as of one salt.
    int64_t adapter = -1;
};

struct SequenceResult {
    std::vector<int32_t> prompt;
    std::vector<int32_t> tokens;  // generated ids (the stopping EOS included)
    std::string stop_reason;      // "eos", "stop" (StopCheck, finish() or a complete JSON value), "length", or finish()'s
    std::vector<float> prompt_logits;     // when asked
    std::vector<TokenLogprobs> logprobs;  // per generated token, when asked
    std::vector<TokenLogprobs> prompt_logprobs;  // per prompt token after the first, when asked
    int64_t cached_tokens = 0;            // prompt tokens its slot's cache already held (not run)
};

// Steps that carry prompt tokens count as prefill (with the decode tokens riding along in them),
// the others as decode steps.
struct GenerateTimings {
    double prefill_ms = 0, decode_ms = 0;
    double total_ms = 0;  // the whole run, host work between the steps included (generate())
    int64_t prefill_tokens = 0, prefill_steps = 0, decode_steps = 0, decode_tokens = 0;
    int64_t context_shifts = 0;  // --context-overflow slide: KV shifts made
    int64_t draft_tokens = 0, accepted_tokens = 0;  // speculate: tokens proposed, and confirmed
    double draft_ms = 0;  // a draft model's steps (counted in prefill_ms / decode_ms too)
    int64_t preemptions = 0;  // running sequences sent back to wait for a request of a lower priority value
    // The prefix cache's host tier (BatcherOptions::host_cache_bytes): prefixes saved and loaded,
    // and the prompt tokens the loads spared.
    int64_t host_saves = 0, host_loads = 0, host_tokens = 0;
};

// A prefix the host tier keeps: its tokens, and the keys and values of their positions on this
// rank as Engine::save_kv lays them out (tokens.size() x kv_position_bytes()).
struct SavedPrefix {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> kv;
    std::string salt;  // the cache_salt of the request that ran it
    int64_t adapter = -1;  // and its LoRA adapter
};

// Called after each step with (request index, new token); for streaming.
using TokenCallback = std::function<void(size_t, int32_t)>;
// Called with (request index, new token) for each token that is not an end-of-sequence id, after
// the TokenCallback: true stops the sequence there, stop_reason "stop" (--stop strings). Under
// tensor parallelism every rank must answer alike (each runs it on the same tokens).
using StopCheck = std::function<bool(size_t, int32_t)>;

struct BatcherOptions {
    int64_t prefill_chunk = 256;  // tokens per step (decode tokens first)
    int64_t max_running = 0;      // sequences at once (0: the engine's slots)
    // --context-overflow slide: a sequence whose next position would pass the context keeps its
    // first sink_tokens positions, drops the older half of the rest and goes on (Engine::shift_kv).
    bool slide = false;
    int64_t sink_tokens = 4;
    // Prefix caching (llama.cpp's cache_prompt, vLLM's automatic prefix caching at slot grain):
    // a freed slot keeps the keys and values of the tokens its last sequence ran, and a request
    // without a slot of its own takes the free slot that holds the longest prefix of its prompt
    // (ties: the slot freed longest ago, so the most recent prefixes stay) and starts its prefill
    // after it. A shared system prompt or a conversation's earlier turns are then prefilled once.
    // A slot whose ring wrapped, or whose sequence slid, keeps nothing. Sequences share prefixes
    // too: before its first step a request copies (Engine::copy_kv) the longest prefix of its
    // prompt that another slot holds, a running sequence's included, and while a sequence admitted
    // before it is still prefilling a longer one (kMinPrefixWait tokens or more) it waits for it:
    // a burst of requests with one system prompt prefills it once.
    bool reuse_prefix = false;
    // The prefix cache's host tier (llama.cpp's --cache-ram, vLLM's KV offloading), 0: none. With
    // reuse_prefix: before a request takes a free slot whose held tokens it does not reuse whole,
    // the slot's keys and values are saved to host memory (Engine::save_kv), at most this many
    // bytes on each rank (the least recently used saves dropped for room); a request whose prompt
    // starts with more of a saved prefix than any slot holds loads it into its slot
    // (Engine::load_kv) and prefills after it. More conversations than slots then keep their
    // earlier turns. Prefixes shorter than kMinHostPrefix are not saved.
    size_t host_cache_bytes = 0;
    // Speculative decoding by prompt lookup (runtime/speculate.h), 0: off. Each step a decoding
    // sequence runs up to `speculate` proposed tokens after its last one in the same chunk, with a
    // logits row each, and keeps the proposals its own choices confirm (greedy or drawn, token
    // penalties applied per row on the host) plus the choice after them: the tokens it makes
    // without speculation, seeded draws included, in fewer steps where the text repeats (a
    // decode step reads the weights once for all of them). A verify row hands back what a decode
    // row would (candidates, or the nucleus), or the whole row where penalties apply.
    // Proposals take only the logits rows and step tokens the others leave
    // (EngineOptions::max_logit_rows).
    int64_t speculate = 0;
    // Proposals only in steps with at most this many decoding sequences (0: any; vLLM's
    // speculative_disable_by_batch_size): where a step's time grows with its tokens (a CPU's
    // arithmetic), verifying several sequences' proposals costs more than the steps it saves.
    int64_t speculate_max_batch = 0;
    // At most this many tokens in a step that carries proposals, decode tokens included (0: only
    // the step's own limit): verifying stays cheap while a step's tokens fit the engine's decode
    // path (the CUDA GEMVs take up to 8 token rows; the CPU's arithmetic grows with every row),
    // so a batch of several sequences shares a few proposals instead of each taking `speculate`.
    int64_t speculate_max_tokens = 0;
    // A draft model (runtime/draft_model.h) proposes the `speculate` tokens instead of prompt
    // lookup: its engine, with the batcher's slots and the target's ctx, not owned. Not for a
    // sequence whose context slid (its positions no longer match its tokens').
    Engine* draft = nullptr;
    // With `draft`: a proposal ends before a token the draft gives less than this probability
    // (llama.cpp's --draft-p-min; 0: always `speculate` tokens).
    float draft_p_min = 0.0f;
    // The vocabulary's bytes for JSON-mode requests (BatchRequest::json), not owned; its
    // masks are kept there between steps. Ids past its size are never taken in JSON mode.
    JsonVocab* json_vocab = nullptr;
    // vLLM's --max-loras: at most this many LoRA adapters (BatchRequest::adapter other than -1)
    // among the running sequences (0: any). A waiting request under another adapter is passed
    // over, and those after it are admitted as they can; once one is passed over, only requests
    // of the base model pass it, so the running adapters drain and it cannot wait for ever (vLLM
    // lets later requests under a running adapter pass too). Each adapter in a step runs its own
    // products, so this bounds a step's LoRA work.
    int64_t max_adapters = 0;
};

// A request waits for another's prefill only to save at least this many tokens of its own: a
// template's first few tokens in common are not worth a step's delay.
constexpr int64_t kMinPrefixWait = 32;
// The shortest prefix the host tier saves: a few tokens prefill faster than a copy is made.
constexpr int64_t kMinHostPrefix = 16;

class Batcher {
public:
    // The engine's options bound what it checks; requests are checked by the caller
    // (check_generate, or the server's own checks) before add().
    Batcher(Engine& engine, const BatcherOptions& opt);
    ~Batcher();
    // Queues a request; returns its index (0, 1, ... in the order of the calls).
    size_t add(BatchRequest r);
    // Ends request `id` before the next step with `reason` (a stop string seen by the caller, a
    // client gone): a waiting one never runs, a running one frees its slot. No effect on one that
    // has ended.
    void finish(size_t id, const std::string& reason);
    bool busy() const;  // a request waits or runs
    int64_t running() const { return int64_t(running_.size()); }  // requests holding a slot
    int64_t waiting() const;                                       // requests not yet admitted
    // Admits what fits and runs one engine step (nothing when idle).
    void step(const TokenCallback& on_token = nullptr, const StopCheck& stop = nullptr);
    const SequenceResult& result(size_t id) const;
    bool ended(size_t id) const;
    // Whether a request that has not ended runs or waits under LoRA adapter `adapter`.
    bool uses_adapter(int64_t adapter) const;
    // The distinct LoRA adapters of the running sequences, and of the waiting ones, ascending
    // (-1, the base model, left out): vLLM's lora_requests_info.
    std::vector<int64_t> running_adapters() const { return adapters_of(running_); }
    std::vector<int64_t> waiting_adapters() const { return adapters_of(waiting_); }
    // Drops an ended request's result (a server's memory); its index stays taken.
    void release(size_t id);
    const GenerateTimings& timings() const { return timings_; }
    // The host tier's saved prefixes and the bytes they take on this rank.
    int64_t host_prefixes() const { return int64_t(host_.size()); }
    size_t host_bytes() const { return host_bytes_; }
    // The host tier across runs (runtime/prefix_file.h). save_slots: what every free slot holds
    // joins the tier, as if a request were taking the slot (before the process ends).
    // take_host: the tier's saves, the least recently used first, leaving it empty.
    // restore_host: saves of an earlier run join the tier in that order (the most recent are
    // kept when they outgrow the budget; one larger than the budget alone is skipped); returns
    // the saves the tier then holds. Each kv must be tokens.size() x engine.kv_position_bytes().
    void save_slots();
    std::vector<SavedPrefix> take_host();
    int64_t restore_host(std::vector<SavedPrefix> saved);

private:
    struct Seq;
    std::vector<int64_t> adapters_of(const std::vector<size_t>& list) const;
    bool accept(Seq& q, size_t row, bool cand, const TokenCallback& on_token, const StopCheck& stop);
    void end(Seq& q, const std::string& reason);
    // q.pens: the penalties of q's next logits row, from its tokens so far (q.recent set).
    void row_penalties(Seq& q) const;
    // Whether q's rows are masked (constrain): JSON mode, allowed_ids or bad_words. Its rows are
    // then whole.
    static bool masked(const Seq& q);
    // The tokens q may not take next get -inf in `row`: those that would not continue its JSON
    // value (JSON mode, q.json set), those not in allowed_ids and those bad_words ban. A row left
    // with no finite logit ends the sequence (its end-of-sequence ids get 0).
    void constrain(const Seq& q, float* row) const;
    void constrain_json(const Seq& q, float* row) const;
    void free_slot(const Seq& q);
    std::vector<int32_t> ran(const Seq& q) const;
    void share_prefixes();
    bool preempt(int64_t priority, const std::function<bool(size_t, size_t)>& before);
    // A prefix the host tier saved from a slot, and when it was last saved or loaded (a count
    // of uses).
    struct HostPrefix : SavedPrefix {
        uint64_t used = 0;
    };
    // A copy of what `slot` holds, unless a request keeps the first `kept` of it or a saved prefix
    // already holds it all (then none: no tokens); keep_host adds it, dropping the saves it holds
    // whole and then the least recently used until it fits.
    HostPrefix save_held(int64_t slot, int64_t kept);
    void keep_host(HostPrefix e);
    // The saved prefix of that salt sharing the most tokens with p; returns that count (0: none).
    int64_t host_match(const std::vector<int32_t>& p, const BatchRequest& r, size_t& which) const;
    Engine& engine_;
    BatcherOptions opt_;
    int64_t slots_ = 0;
    std::vector<std::unique_ptr<Seq>> seqs_;
    std::vector<size_t> waiting_;  // requests not yet admitted, by priority, then arrival
    std::vector<size_t> running_;  // in the order they were admitted
    std::vector<int64_t> free_slots_;  // the lowest on top
    // reuse_prefix: per slot, the tokens whose keys and values its cache holds at positions
    // [0, size) once its sequence has ended, and when it was freed (a count of frees).
    std::vector<std::vector<int32_t>> held_;
    std::vector<std::string> held_salt_;  // and the cache_salt of the sequence that ran them
    std::vector<int64_t> held_adapter_;   // and its LoRA adapter
    std::vector<uint64_t> freed_at_;
    uint64_t frees_ = 0;
    int64_t capacity_ = 0;  // kv_capacity: a slot that wrote more positions has wrapped
    // host_cache_bytes: prefixes saved from slots; the bytes they take.
    std::vector<HostPrefix> host_;
    size_t host_bytes_ = 0;
    uint64_t host_uses_ = 0;
    GenerateTimings timings_;
    std::unique_ptr<DraftModel> drafter_;  // BatcherOptions::draft set
    double draft_ms_ = 0;                  // drafter_->ms() counted in timings_ so far
    // The step's buffers: rows of logits or candidates.
    std::vector<float> logits_, vals_;
    std::vector<int32_t> ids_;
    std::vector<uint64_t> mass_;
    int64_t step_k_ = 0;  // candidates per row in vals_/ids_ (0: whole rows in logits_)
};

}  // namespace shardlm
