// shardlm serve: an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions,
// /v1/models, /health, /metrics, /tokenize, /detokenize; with --embeddings /v1/embeddings, /score
// and /rerank instead of the text routes, with --rerank /classify, /score and /rerank; tool calls for Qwen's, Llama 3.1/3.2's
// and Mistral v3's templates; JSON schemas, regexes and GBNF grammars for structured output),
// over HTTPS and behind an API key on request, over the continuous-batching scheduler
// (runtime/batcher.h).
//
// Rank 0 runs the HTTP server: its handler threads parse each request (cli/openai_api.h) and hand
// it to the engine loop, then wait for its text (streamed as server-sent events with "stream").
// Every rank runs the engine loop in lock step: each iteration rank 0 broadcasts a control
// message (the requests that came in, the ones to end: stop strings it found, clients gone, and
// shutdown), every rank applies it to its own Batcher, and all run one engine step. Stop strings
// are matched on rank 0 alone; the request ends on every rank before the next step.
#include <algorithm>
#include <set>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <ctime>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <unistd.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/openai_api.h"
#include "cli/options.h"
#include "cli/prefix_cache_file.h"
#include "cli/responses_api.h"
#include "comm/communicator.h"
#include "comm/together.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "runtime/batcher.h"
#include "runtime/beam_search.h"
#include "runtime/classify.h"
#include "runtime/embed.h"
#include "runtime/generate.h"
#include "runtime/grammar.h"
#include "runtime/session.h"
#include "tokenizer/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

namespace {

using json = nlohmann::ordered_json;

volatile std::sig_atomic_t g_signalled = 0;
extern "C" void on_signal(int) { g_signalled = 1; }

// One choice of a request as it forms: the engine loop writes it, the handler thread reads it.
struct ChoiceState {
    ApiChoice out;     // out.text: the settled text so far, all of it once done
    size_t sent = 0;   // streaming: how much of the content (content() below) went out
    size_t reasoning_sent = 0;  // streaming: the end of the reasoning that went out, in out.text
    size_t lps_sent = 0, lps_offset = 0;  // streaming: logprob entries out, and their text's bytes
    std::vector<size_t> args_sent;  // streaming: each begun tool call's arguments bytes out
    // Streaming with echo: the prompt's text went out (its own event, first), and the prompt's
    // logprobs are in out.prompt_lps (set with the first token, or at the end).
    bool echo_sent = false, prompt_scored = false;
    size_t ids_sent = 0;  // streaming with return_token_ids: the generated ids out
    bool prompt_ids_sent = false;  // ... and (completions) the prompt's
    bool done = false, finish_sent = false;
    bool role_sent = false;  // streaming chat: the first event, with the role, went out
    // Streaming: what the text so far holds, worked out once per look. rs: its reasoning
    // (reasoning_span); content: out.text past it (all of it without); calls: the tool calls in
    // it so far; upto: how much of content may go out now (api_sendable: with tool calls, not
    // what may become one).
    struct Pending {
        ReasoningSpan rs;
        std::string content;
        ToolCallsSoFar calls;
        size_t upto = 0;
    };
    Pending pending(const ApiRequest& r) const {
        Pending p;
        p.rs = reasoning_span(r, out.text, done);
        p.content = out.text.substr(p.rs.content);
        p.calls = api_tool_calls_so_far(r, p.content, done);
        p.upto = api_sendable(r, p.calls, p.content, done, sent);
        return p;
    }
    // Whether reasoning not yet sent may go out.
    bool reasoning_due(const Pending& p) const { return p.rs.end > std::max(p.rs.begin, reasoning_sent); }
    // Whether tool calls or their arguments not yet sent may go out (without parallel_tool_calls,
    // the first call's only: api_tool_call_deltas sends no other).
    bool calls_due(const ApiRequest& r, const Pending& p) const {
        if (p.calls.plain) return false;
        if (std::min(p.calls.calls.size(), r.parallel_tool_calls ? p.calls.calls.size() : size_t(1)) > args_sent.size())
            return true;
        for (size_t k = 0; k < args_sent.size(); ++k)
            if (p.calls.calls[k].arguments.size() > args_sent[k]) return true;
        return false;
    }
};

// A stream's own state (what went out of each choice is in its job's choices): the Responses
// events' builder (null for a chat or completions stream), and whether its first events went out.
struct StreamState {
    std::shared_ptr<ResponsesStream> rs;
    bool started = false, started_ids = false;
};

// The Responses API's ids in use. A response holds its id from its request until it is answered
// (a stored one is then in the store; a background one is there from the start), so that two
// requests never run under one id: the store alone knows only the responses that ended (or were
// put there queued). Safe from any thread.
class ResponseIds {
public:
    class Hold {
    public:
        Hold(ResponseIds& ids, std::string id) : ids_(ids), id_(std::move(id)) {}
        ~Hold() {
            std::lock_guard<std::mutex> lk(ids_.m_);
            ids_.held_.erase(id_);
        }
        Hold(const Hold&) = delete;
        Hold& operator=(const Hold&) = delete;

    private:
        ResponseIds& ids_;
        std::string id_;
    };
    // `id` held for as long as the Hold lives; null where another request holds it.
    std::unique_ptr<Hold> hold(const std::string& id) {
        std::lock_guard<std::mutex> lk(m_);
        if (!held_.insert(id).second) return nullptr;
        return std::make_unique<Hold>(*this, id);
    }

private:
    std::mutex m_;
    std::set<std::string> held_;
};

// One HTTP request (its prompts x n choices, a sequence each), shared by its handler thread and
// the engine loop on rank 0.
struct Job {
    ApiRequest req;
    std::string id;
    std::unique_ptr<ResponseIds::Hold> id_hold;  // a response's (ResponseIds)
    int64_t created = 0;
    std::mutex m;
    std::condition_variable cv;
    std::vector<ChoiceState> choices;
    size_t ended = 0;      // choices done
    bool aborted = false;  // the server is shutting down: the client gets a 503 (or "abort" events)
    std::atomic<bool> gone{false};  // the client went away: end the request
    double arrived = 0;  // seconds (steady clock) when its handler took it
    // A background response (the Responses API's "background"): no handler waits for it. The
    // engine loop calls on_done once when it ends (ended or aborted), without m held; it stores
    // the response and sets `stored`. `started`: it has made its first token (in_progress);
    // `cancelled`: POST /v1/responses/{id}/cancel asked for its end (with gone).
    std::function<void(Job&)> on_done;
    std::atomic<bool> started{false};
    bool cancelled = false, stored = false, done_called = false;
    // A background response made with "stream": its Responses events so far, one per entry (entry
    // k has sequence_number k; the store keeps them once it ends). Whichever reader comes (the
    // POST's stream, a GET with ?stream=true) makes the events due, under m; on_done the last.
    std::shared_ptr<StreamState> bg_stream;
    std::shared_ptr<std::vector<std::string>> events;
    bool done() const { return aborted || ended == choices.size(); }
    std::vector<ApiChoice> outs() const {  // the choices as they stand (the caller holds m)
        std::vector<ApiChoice> o;
        for (const ChoiceState& cs : choices) o.push_back(cs.out);
        return o;
    }
};

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A Prometheus histogram: counts per upper bound (cumulative when written), their sum and count.
struct Histogram {
    std::vector<double> bounds;  // ascending; +Inf is implied
    std::vector<int64_t> counts = std::vector<int64_t>(bounds.size() + 1, 0);
    double sum = 0;
    int64_t count = 0;
    void add(double v) {
        counts[size_t(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin())] += 1;
        sum += v;
        count += 1;
    }
    std::string text(const char* name) const {
        std::string out;
        int64_t cum = 0;
        for (size_t i = 0; i <= bounds.size(); ++i) {
            cum += counts[i];
            out += cat(name, "_bucket{le=\"", i < bounds.size() ? cat(bounds[i]) : std::string("+Inf"), "\"} ", cum, "\n");
        }
        return out + cat(name, "_sum ", sum, "\n", name, "_count ", count, "\n");
    }
};

// Rank 0's counters for GET /metrics, written by the engine loop after each step.
struct Stats {
    std::mutex m;
    int64_t running = 0, waiting = 0;
    std::map<std::string, int64_t> finished;  // requests by finish reason ("abort": the client left)
    int64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
    // --embeddings / --rerank: the requests that got their numbers, and their inputs (no sequence
    // of theirs counts as finished: none generates).
    int64_t pooling_requests = 0, pooling_inputs = 0;
    GenerateTimings steps;  // the Batcher's running totals
    size_t host_bytes = 0;  // Batcher::host_bytes
    // With LoRA adapters (--lora-modules, --allow-runtime-lora-updating): --max-loras, and the
    // names of the adapters running and waiting (vLLM's lora_requests_info).
    bool lora = false;
    int64_t max_loras = 0;
    std::vector<std::string> running_adapters, waiting_adapters;
    // Per sequence that made a token: from its request's arrival to its first token, the mean
    // time per later token, and from arrival to its end (seconds).
    Histogram ttft{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
    Histogram tpot{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
    Histogram e2e{{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}};
};

// Prometheus' text exposition format (what vLLM's /metrics speaks, with shardlm_ names).
std::string metrics_text(Stats& st) {
    std::lock_guard<std::mutex> lk(st.m);
    std::string out;
    auto metric = [&](const char* name, const char* type, const char* help, const std::string& samples) {
        out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", samples);
    };
    auto one = [](const char* name, double v) { return cat(name, " ", v, "\n"); };
    metric("shardlm_requests_running", "gauge", "Requests holding a KV-cache slot.", one("shardlm_requests_running", double(st.running)));
    metric("shardlm_requests_waiting", "gauge", "Requests waiting for a slot.", one("shardlm_requests_waiting", double(st.waiting)));
    std::string fin;
    for (const char* why : {"stop", "length", "abort"})
        fin += cat("shardlm_sequences_finished_total{finish_reason=\"", why, "\"} ", st.finished[why], "\n");
    metric("shardlm_sequences_finished_total", "counter", "Sequences (a request's choices) that ended, by finish reason.", fin);
    metric("shardlm_pooling_requests_total", "counter",
           "Embedding, classification, score and rerank requests answered (--embeddings, --rerank).",
           one("shardlm_pooling_requests_total", double(st.pooling_requests)));
    metric("shardlm_pooling_inputs_total", "counter", "Their inputs (texts or pairs), each pooled once.",
           one("shardlm_pooling_inputs_total", double(st.pooling_inputs)));
    metric("shardlm_prompt_tokens_total", "counter", "Prompt tokens of the ended requests.",
           one("shardlm_prompt_tokens_total", double(st.prompt_tokens)));
    metric("shardlm_prompt_tokens_cached_total", "counter", "Of them, taken from the prefix cache.",
           one("shardlm_prompt_tokens_cached_total", double(st.cached_tokens)));
    metric("shardlm_generation_tokens_total", "counter", "Generated tokens of the ended requests.",
           one("shardlm_generation_tokens_total", double(st.generated_tokens)));
    const GenerateTimings& t = st.steps;
    metric("shardlm_engine_steps_total", "counter", "Engine steps: with prompt tokens (prefill) or decode tokens only.",
           cat("shardlm_engine_steps_total{kind=\"prefill\"} ", t.prefill_steps, "\nshardlm_engine_steps_total{kind=\"decode\"} ",
               t.decode_steps, "\n"));
    metric("shardlm_engine_step_seconds_total", "counter", "Time in engine steps.",
           cat("shardlm_engine_step_seconds_total{kind=\"prefill\"} ", t.prefill_ms / 1000.0,
               "\nshardlm_engine_step_seconds_total{kind=\"decode\"} ", t.decode_ms / 1000.0, "\n"));
    metric("shardlm_engine_prefill_tokens_total", "counter", "Prompt tokens run (not from the prefix cache).",
           one("shardlm_engine_prefill_tokens_total", double(t.prefill_tokens)));
    metric("shardlm_prefix_cache_host_bytes", "gauge", "Bytes of keys and values the prefix cache keeps in host memory (--cache-ram; rank 0's).",
           one("shardlm_prefix_cache_host_bytes", double(st.host_bytes)));
    metric("shardlm_prefix_cache_host_transfers_total", "counter", "Prefixes saved to the host tier and loaded back from it.",
           cat("shardlm_prefix_cache_host_transfers_total{direction=\"save\"} ", t.host_saves,
               "\nshardlm_prefix_cache_host_transfers_total{direction=\"load\"} ", t.host_loads, "\n"));
    metric("shardlm_prefix_cache_host_tokens_total", "counter", "Prompt tokens the host tier's loads spared (within the cached prompt tokens).",
           one("shardlm_prefix_cache_host_tokens_total", double(t.host_tokens)));
    metric("shardlm_num_preemptions_total", "counter", "Running sequences sent back to wait for a request of a lower priority value.",
           one("shardlm_num_preemptions_total", double(t.preemptions)));
    metric("shardlm_spec_decode_draft_tokens_total", "counter", "Tokens proposed by prompt lookup or the draft model (--speculate).",
           one("shardlm_spec_decode_draft_tokens_total", double(t.draft_tokens)));
    metric("shardlm_spec_decode_accepted_tokens_total", "counter", "Of them, confirmed by the sequences' own choices.",
           one("shardlm_spec_decode_accepted_tokens_total", double(t.accepted_tokens)));
    metric("shardlm_spec_decode_draft_seconds_total", "counter", "Time in the draft model's steps (--draft-model; within the engine steps' time).",
           one("shardlm_spec_decode_draft_seconds_total", t.draft_ms / 1000.0));
    // Names as one label value: comma-separated, with \\, \" and newlines escaped.
    auto label = [](const std::vector<std::string>& names) {
        std::string out;
        for (const std::string& n : names) {
            if (!out.empty()) out += ',';
            for (const char ch : n) out += ch == '\\' ? "\\\\" : ch == '"' ? "\\\"" : ch == '\n' ? "\\n" : std::string(1, ch);
        }
        return out;
    };
    if (st.lora)
        metric("shardlm_lora_requests_info", "gauge",
               "The LoRA adapters of the running and the waiting requests (names, comma-separated), and --max-loras (0: any).",
               cat("shardlm_lora_requests_info{running_lora_adapters=\"", label(st.running_adapters), "\",waiting_lora_adapters=\"",
                   label(st.waiting_adapters), "\",max_lora=\"", st.max_loras, "\"} 1\n"));
    metric("shardlm_time_to_first_token_seconds", "histogram",
           "From a request's arrival to a sequence's first token (queueing and prefill included).",
           st.ttft.text("shardlm_time_to_first_token_seconds"));
    metric("shardlm_time_per_output_token_seconds", "histogram", "A sequence's mean time per token after its first.",
           st.tpot.text("shardlm_time_per_output_token_seconds"));
    metric("shardlm_e2e_request_latency_seconds", "histogram", "From a request's arrival to a sequence's end.",
           st.e2e.text("shardlm_e2e_request_latency_seconds"));
    return out;
}

// One /v1/embeddings request (serve --embeddings), shared by its handler thread and the engine
// loop on rank 0.
struct EmbedJob {
    EmbeddingRequest req;
    std::mutex m;
    std::condition_variable cv;
    std::vector<std::vector<float>> vectors;
    bool done = false, aborted = false;
    double arrived = 0;
};

void end_embed_job(EmbedJob& job, bool aborted) {
    {
        std::lock_guard<std::mutex> lk(job.m);
        job.done = true;
        job.aborted = aborted;
    }
    job.cv.notify_all();
}

// A LoRA adapter loaded or unloaded while serving (--allow-runtime-lora-updating): the handler
// waits for the engine loop's answer.
struct AdapterOp {
    bool load = true;
    std::string name, dir;  // dir: a load's
    int64_t index = -1;     // an unload's: the adapter's index
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    int status = 200;
    std::string message;
    void answer(int st, const std::string& msg) {
        {
            std::lock_guard<std::mutex> lk(m);
            status = st;
            message = msg;
            done = true;
        }
        cv.notify_all();
    }
};

// The adapters as /v1/models lists them (a name and its folder), replaced whole as lim.adapters is.
// parent: --lora-modules' base_model_name, else the served model's name.
struct AdapterCard {
    std::string name, dir, parent;
};

// One --lora-modules value: NAME=DIR, or vLLM's JSON form {"name", "path", "base_model_name"?}.
AdapterCard parse_lora_module(const std::string& m) {
    if (!m.empty() && m[0] == '{') {
        json j;
        try {
            j = json::parse(m);
        } catch (const json::exception& e) {
            fail("--lora-modules '", m, "': not valid JSON: ", e.what());
        }
        for (const auto& [key, v] : j.items())
            if (key != "name" && key != "path" && key != "base_model_name")
                fail("--lora-modules '", m, "': unknown key \"", key, "\" (name, path, base_model_name)");
        auto text = [&](const char* key, bool required) {
            if (!j.contains(key)) {
                if (required) fail("--lora-modules '", m, "': \"", key, "\" is missing");
                return std::string();
            }
            if (!j[key].is_string() || j[key].get<std::string>().empty())
                fail("--lora-modules '", m, "': \"", key, "\" must be a non-empty string");
            return j[key].get<std::string>();
        };
        return {text("name", true), text("path", true), text("base_model_name", false)};
    }
    const size_t eq = m.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == m.size())
        fail("--lora-modules \"", m, "\": expected NAME=DIR or {\"name\": NAME, \"path\": DIR}");
    return {m.substr(0, eq), m.substr(eq + 1), ""};
}

// How a request's generated ids become its text: skip_special_tokens as it asks, and a
// completion continuing its prompt's text (SentencePiece's leading space kept, as in vLLM's
// completions) where a chat reply is a message of its own.
DecodeOptions text_decoding(const ApiRequest& r) {
    DecodeOptions d;
    d.skip_special_tokens = r.skip_special_tokens;
    d.continuation = !r.chat;
    return d;
}

// The background responses still running (the Responses API's "background"), by id: the job
// and its queued response object, which GET /v1/responses/{id} gives with the status of the
// moment. Safe from any thread.
class BackgroundJobs {
public:
    void put(const std::string& id, std::shared_ptr<Job> job, json queued) {
        std::lock_guard<std::mutex> lk(m_);
        jobs_[id] = {std::move(job), std::move(queued)};
    }
    void erase(const std::string& id) {
        std::lock_guard<std::mutex> lk(m_);
        jobs_.erase(id);
    }
    std::shared_ptr<Job> job(const std::string& id) {
        std::lock_guard<std::mutex> lk(m_);
        const auto it = jobs_.find(id);
        return it == jobs_.end() ? nullptr : it->second.first;
    }
    // The object as it stands: "queued" until the job's first token, then "in_progress".
    std::optional<json> object(const std::string& id) {
        std::lock_guard<std::mutex> lk(m_);
        const auto it = jobs_.find(id);
        if (it == jobs_.end()) return std::nullopt;
        json o = it->second.second;
        if (it->second.first->started) o["status"] = "in_progress";
        return o;
    }

private:
    std::mutex m_;
    std::map<std::string, std::pair<std::shared_ptr<Job>, json>> jobs_;
};

// The handler threads' requests for the engine loop.
struct Inbox {
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::shared_ptr<Job>> jobs;
    std::deque<std::shared_ptr<AdapterOp>> adapter_ops;
    std::deque<std::shared_ptr<EmbedJob>> embeds;
    std::vector<std::shared_ptr<EmbedJob>> embedding;  // rank 0: the ones the engine loop runs now
    bool closed = false;
};

// After a change to a job's state: its on_done, once, when it is done; then its waiters.
void job_ended(Job& job) {
    bool call = false;
    {
        std::lock_guard<std::mutex> lk(job.m);
        call = job.on_done && job.done() && !job.done_called;
        job.done_called = job.done_called || call;
    }
    if (call) job.on_done(job);
    job.cv.notify_all();
}

void finish_choice(Job& job, size_t c, const std::string& text, const std::string& finish, const SequenceResult& r) {
    {
        std::lock_guard<std::mutex> lk(job.m);
        ChoiceState& cs = job.choices[c];
        if (cs.done) return;
        cs.out.text = text;
        cs.out.finish = finish;
        cs.out.completion_tokens = int64_t(r.tokens.size());
        cs.out.cached_tokens = r.cached_tokens;
        cs.out.prompt_lps = r.prompt_logprobs;
        if (job.req.return_token_ids) cs.out.token_ids = r.tokens;  // (a copy only where they are asked)
        cs.prompt_scored = true;
        cs.done = true;
        job.ended += 1;
    }
    job_ended(job);
}

void abort_job(Job& job) {
    {
        std::lock_guard<std::mutex> lk(job.m);
        job.aborted = true;
    }
    job_ended(job);
}

// Rank 0's control message to every rank, as JSON text.
void broadcast_control(Communicator& comm, json& ctl) {
    if (comm.size() == 1) return;
    std::string s = comm.rank() == 0 ? ctl.dump() : std::string();
    uint64_t n = s.size();
    comm.broadcast_idle(&n, sizeof n, 0);  // the other ranks wait here while the server idles
    s.resize(n);
    comm.broadcast(s.data(), n, 0);
    if (comm.rank() != 0) ctl = json::parse(s);
}

// Choice c of request r as the Batcher's request, in the control message.
json request_json(const ApiRequest& r, size_t c) {
    const SamplerOptions& s = r.sampler;
    return {{"prompt", r.prompt_of(c)},
            {"stream", c % size_t(r.n)},  // a prompt's n choices: n sampler streams of its seed
            {"max_tokens", r.max_tokens},
            {"temperature", s.temperature},
            {"top_k", s.top_k},
            {"top_p", s.top_p},
            {"min_p", s.min_p},
            {"seed", s.seed},
            {"repetition_penalty", s.repetition_penalty},
            {"presence_penalty", s.presence_penalty},
            {"frequency_penalty", s.frequency_penalty},
            {"penalty_last_n", s.penalty_last_n},
            {"logit_bias", s.logit_bias},
            {"logprobs", r.logprobs},
            {"ignore_eos", r.ignore_eos},
            {"min_tokens", r.min_tokens},
            {"priority", r.priority},
            {"cache_salt", r.cache_salt},
            {"adapter", r.adapter},
            {"stop_token_ids", r.stop_token_ids},
            {"allowed_token_ids", r.allowed_ids},
            {"bad_words", r.bad_words},
            {"json_object", r.json_object},
            {"json_schema", r.json_schema},
            {"guided_choice", r.guided_choice},
            {"guided_regex", r.guided_regex},
            {"guided_grammar", r.guided_grammar},
            {"think", {r.think_open, r.think_close, r.think_first}},
            {"prompt_logprobs", r.prompt_logprobs()}};
}

BatchRequest batch_request(const json& j) {
    BatchRequest b;
    b.prompt = j["prompt"].get<std::vector<int32_t>>();
    b.max_new_tokens = j["max_tokens"];
    SamplerOptions& s = b.sampler;
    s.temperature = j["temperature"];
    s.top_k = j["top_k"];
    s.top_p = j["top_p"];
    s.min_p = j["min_p"];
    s.seed = j["seed"];
    s.repetition_penalty = j["repetition_penalty"];
    s.presence_penalty = j["presence_penalty"];
    s.frequency_penalty = j["frequency_penalty"];
    s.penalty_last_n = j["penalty_last_n"];
    s.logit_bias = j["logit_bias"].get<std::vector<std::pair<int32_t, float>>>();
    b.logprobs = j["logprobs"];
    b.ignore_eos = j["ignore_eos"];
    b.min_tokens = j["min_tokens"];
    b.priority = j["priority"];
    b.cache_salt = j["cache_salt"];
    b.adapter = j["adapter"];
    b.stop_ids = j["stop_token_ids"].get<std::vector<int32_t>>();
    b.allowed_ids = j["allowed_token_ids"].get<std::vector<int32_t>>();
    b.bad_words = j["bad_words"].get<std::vector<std::vector<int32_t>>>();
    b.prompt_logprobs = j["prompt_logprobs"];
    b.stream = j["stream"];
    b.think_open = j["think"][0];
    b.think_close = j["think"][1];
    b.think_first = j["think"][2];
    return b;
}

std::string sse(const json& j) { return "data: " + j.dump() + "\n\n"; }

// An error answer: the status and OpenAI's error object naming it.
void send_error(httplib::Response& res, int status, const std::string& message) {
    res.status = status;
    res.set_content(api_error(message, status).dump(), "application/json");
}

// Whether a choice of the job has something its stream has not sent (the caller holds job.m).
bool stream_news(const Job& job) {
    const ApiRequest& req = job.req;
    return std::any_of(job.choices.begin(), job.choices.end(), [&](const ChoiceState& cs) {
        const ChoiceState::Pending p = cs.pending(req);
        if (req.echo && !cs.echo_sent) return req.chat || req.logprobs < 0 || cs.prompt_scored;
        return (req.chat && !cs.role_sent) || p.upto > cs.sent || cs.reasoning_due(p) || cs.calls_due(req, p) ||
               cs.out.lps.size() > cs.lps_sent || (cs.done && !cs.finish_sent);
    });
}

// A stream's events since its last call, each choice's (its role, echo, reasoning, text with
// logprobs, tool calls and finish), the Responses stream's first ones before them; not the
// ending (usage, the Responses stream's last event, [DONE]). The caller holds job.m.
std::string stream_events(Job& job, StreamState& st, const Tokenizer& tk) {
    const ApiRequest& req = job.req;
    const std::string& model_name = req.model;
    std::string out;
    if (st.rs && !st.started) out += st.rs->start(bool(job.bg_stream));
    st.started = true;
    for (size_t c = 0; c < job.choices.size(); ++c) {
        ChoiceState& cs = job.choices[c];
        const ChoiceState::Pending p = cs.pending(req);
        // An event of this choice (continuous_usage_stats: with its usage so far), or the
        // Responses events it makes.
        auto event = [&](json ev) {
            if (req.continuous_usage) ev["usage"] = api_choice_usage(req, c, cs.out.completion_tokens);
            if (req.return_token_ids) {  // (vLLM's: the prompt's first, then the ids since the last event)
                if (!st.started_ids && req.chat) ev["prompt_token_ids"] = req.prompts[0];
                json& choice = ev["choices"][0];
                if (!req.chat && !cs.prompt_ids_sent) choice["prompt_token_ids"] = req.prompts[c / size_t(req.n)];
                const std::vector<int32_t>& ids = cs.out.token_ids;
                choice["token_ids"] = std::vector<int32_t>(ids.begin() + ptrdiff_t(std::min(cs.ids_sent, ids.size())), ids.end());
                cs.ids_sent = std::max(cs.ids_sent, ids.size());
                cs.prompt_ids_sent = st.started_ids = true;
            }
            return st.rs ? st.rs->push(ev) : sse(ev);
        };
        if (req.chat && !cs.role_sent) {
            out += event(api_role_chunk(req, job.id, job.created, model_name, c));
            cs.role_sent = true;
        }
        // echo: completions' prompt text (and its logprobs, once scored) before the generated
        // text, whose offsets then go on after it; chat's assistant message so far before the
        // reply's content (vLLM's).
        if (req.echo && !cs.echo_sent && req.chat) {
            if (!req.echo_text.empty()) out += event(api_chunk(req, job.id, job.created, model_name, c, req.echo_text, "", nullptr));
            cs.echo_sent = true;
        } else if (req.echo && !cs.echo_sent) {
            if (req.logprobs >= 0 && !cs.prompt_scored && !job.aborted) continue;
            const std::vector<int32_t>& prompt = req.prompts[c / size_t(req.n)];
            out += event(api_chunk(req, job.id, job.created, model_name, c, req.prompt_texts[c / size_t(req.n)], "",
                                   api_logprobs(req, tk, {}, 0, &prompt, &cs.out.prompt_lps)));
            cs.lps_offset += tokens_text_bytes(tk, prompt);
            cs.echo_sent = true;
        }
        if (cs.reasoning_due(p)) {
            const size_t from = std::max(p.rs.begin, cs.reasoning_sent);
            out += event(api_reasoning_chunk(req, job.id, job.created, model_name, c, cs.out.text.substr(from, p.rs.end - from)));
            cs.reasoning_sent = p.rs.end;
        }
        const std::string& content = p.content;
        const size_t upto = p.upto;
        if (upto > cs.sent || cs.out.lps.size() > cs.lps_sent) {
            // The logprobs of the tokens since the last event (their text may be held back a while
            // for a stop string, a character's rest or a possible tool call).
            const std::vector<TokenLogprobs> fresh(cs.out.lps.begin() + ptrdiff_t(cs.lps_sent), cs.out.lps.end());
            out += event(api_chunk(req, job.id, job.created, model_name, c, content.substr(cs.sent, upto > cs.sent ? upto - cs.sent : 0),
                                   "", api_logprobs(req, tk, fresh, cs.lps_offset)));
            cs.sent = std::max(cs.sent, upto);
            cs.lps_sent = cs.out.lps.size();
            cs.lps_offset += logprobs_text_bytes(tk, fresh);
        }
        // Tool calls as they form: a call's name once it is whole, then its arguments as the
        // model writes them.
        if (!p.calls.plain && !p.calls.calls.empty()) {
            const json deltas = api_tool_call_deltas(req, job.id, job.created, c, p.calls.calls, cs.args_sent);
            if (!deltas.empty()) out += event(api_tool_calls_chunk(req, job.id, job.created, model_name, c, deltas));
        }
        if ((cs.done || job.aborted) && !cs.finish_sent) {
            const bool called = cs.done && req.tools != ApiRequest::Tools::None && !p.calls.plain;
            out += event(api_chunk(req, job.id, job.created, model_name, c, "", !cs.done ? "abort" : called ? "tool_calls" : cs.out.finish));
            cs.sent = content.size();
            cs.finish_sent = true;
        }
    }
    return out;
}

// Adds a Responses stream's text to a background response's events, one entry per event (an
// event's data is one line of JSON, so "\n\n" ends each).
void log_events(std::vector<std::string>& log, const std::string& text) {
    for (size_t at = 0; at < text.size();) {
        const size_t end = text.find("\n\n", at);
        const size_t next = end == std::string::npos ? text.size() : end + 2;
        log.push_back(text.substr(at, next - at));
        at = next;
    }
}

// A background response's stream from after sequence number `after`: its events as they come
// (each reader makes those due from the job, under its lock), until it is stored. A reader that
// goes away leaves the response running.
std::function<bool(size_t, httplib::DataSink&)> background_stream(std::shared_ptr<Job> job, int64_t after, const Tokenizer& tk) {
    return [job = std::move(job), next = size_t(after + 1), tk = &tk](size_t, httplib::DataSink& sink) mutable {
        std::unique_lock<std::mutex> lk(job->m);
        job->cv.wait_for(lk, std::chrono::milliseconds(200),
                         [&] { return job->stored || next < job->events->size() || stream_news(*job); });
        if (!sink.is_writable()) return false;
        if (!job->stored) log_events(*job->events, stream_events(*job, *job->bg_stream, *tk));
        std::string out;
        for (; next < job->events->size(); ++next) out += (*job->events)[next];
        const bool end = job->stored;
        lk.unlock();
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
        if (end) sink.done();
        return true;
    };
}

// A stored background response's events after sequence number `after`, all at once.
std::function<bool(size_t, httplib::DataSink&)> stored_stream(std::shared_ptr<const std::vector<std::string>> events, int64_t after) {
    return [events = std::move(events), after](size_t, httplib::DataSink& sink) {
        std::string out;
        for (size_t k = size_t(after + 1); k < events->size(); ++k) out += (*events)[k];
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
        sink.done();
        return true;
    };
}

// A route whose whole answer is `f` of the request's JSON body. A body that is not JSON (or nests
// too deep), an ApiError and an Error (e.g. an id the tokenizer does not know) become error objects.
void answer_json(const httplib::Request& req, httplib::Response& res, const std::function<json(const json&)>& f) {
    try {
        check_body_depth(req.body);
        res.set_content(f(json::parse(req.body)).dump(), "application/json");
    } catch (const json::exception& e) {
        res.status = 400;
        res.set_content(api_error(std::string("the request body is not valid JSON: ") + e.what(), 400).dump(),
                        "application/json");
    } catch (const ApiError& e) {
        res.status = e.status;
        res.set_content(api_error(e.what(), e.status).dump(), "application/json");
    } catch (const Error& e) {
        res.status = 400;
        res.set_content(api_error(e.what(), 400).dump(), "application/json");
    }
}

// serve --embeddings' and --rerank's engine loop, on every rank: each iteration rank 0 takes the
// requests that came in (waiting for one only when nothing runs) and broadcasts their inputs (or
// shutdown); every rank queues them in its Pooler and runs one step. Requests take the slots in
// turn (runtime/embed.h: Pooler), so a short request that arrives during a long one is not held
// until that one ends. Rank 0 hands each request its vectors when its last input is done: cut to
// its dimensions and normalized as it asks (embeddings, `eo`), or its logits as they are (--rerank).
void embedding_loop(Communicator& comm, Inbox& inbox, Stats& stats, Pooler& pooler, const EmbedOptions* eo) {
    const bool root = comm.rank() == 0;
    struct Running {
        std::shared_ptr<EmbedJob> job;
        std::vector<std::vector<float>> vectors;
        size_t left = 0;
    };
    std::map<int64_t, Running> running;  // rank 0: by request number
    int64_t next_request = 0;            // every rank numbers the requests in broadcast order
    for (;;) {
        json ctl = {{"requests", json::array()}, {"shutdown", false}};
        std::vector<std::shared_ptr<EmbedJob>> jobs;
        if (root) {
            std::unique_lock<std::mutex> lk(inbox.m);
            if (pooler.idle())
                inbox.cv.wait_for(lk, std::chrono::milliseconds(200), [&] { return !inbox.embeds.empty() || g_signalled; });
            jobs.assign(inbox.embeds.begin(), inbox.embeds.end());
            inbox.embeds.clear();
            inbox.embedding.insert(inbox.embedding.end(), jobs.begin(), jobs.end());
            if (g_signalled) {
                inbox.closed = true;
                ctl["shutdown"] = true;
            }
            lk.unlock();
            for (const auto& job : jobs) ctl["requests"].push_back(job->req.inputs);
        }
        broadcast_control(comm, ctl);
        if (ctl["shutdown"]) break;
        for (size_t k = 0; k < ctl["requests"].size(); ++k) {
            auto inputs = ctl["requests"][k].get<std::vector<std::vector<int32_t>>>();
            const int64_t id = next_request++;
            if (root) running[id] = Running{jobs[k], std::vector<std::vector<float>>(inputs.size()), inputs.size()};
            pooler.add(id, std::move(inputs));
        }
        if (pooler.idle()) continue;
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<Pooler::Done> done = pooler.step();
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (!root) continue;
        std::lock_guard<std::mutex> st(stats.m);
        stats.steps.prefill_tokens += pooler.last_step_tokens();
        stats.steps.prefill_ms += ms;
        for (Pooler::Done& d : done) {
            Running& r = running.at(d.request);
            EmbedJob& job = *r.job;
            if (eo) finish_embedding(d.pooled, job.req.dimensions, job.req.normalize < 0 ? eo->normalize : job.req.normalize == 1);
            r.vectors[size_t(d.index)] = std::move(d.pooled);
            if (--r.left > 0) continue;
            int64_t tokens = 0;
            for (const auto& in : job.req.inputs) tokens += int64_t(in.size());
            {
                std::lock_guard<std::mutex> lk(job.m);
                job.vectors = std::move(r.vectors);
            }
            {
                std::lock_guard<std::mutex> lk(inbox.m);
                inbox.embedding.erase(std::find(inbox.embedding.begin(), inbox.embedding.end(), r.job));
            }
            end_embed_job(job, false);
            stats.pooling_requests += 1;
            stats.pooling_inputs += int64_t(job.req.inputs.size());
            stats.prompt_tokens += tokens;
            stats.e2e.add(now_s() - job.arrived);
            running.erase(d.request);
        }
    }
}

}  // namespace

int cmd_serve(const Args& args, Communicator& comm) {
    po::options_description d("serve options");
    std::string generation_config = "auto";
    GenerationDefaults sampling_defaults;  // --generation-config
    std::string model, host = "127.0.0.1", name, api_key, ssl_cert, ssl_key, reasoning_parser, pooling, token_list,
        rerank_template, cache_file, chat_template;
    DraftFlags draftf;
    BackendFlags backend;
    PrecisionFlags prec;
    int64_t batch = 8, ctx = 0, chunk = 256, penalty_last_n = 64, speculate = 0, speculate_max_batch = 0,
            speculate_max_tokens = 8, cache_ram = 0, stored_responses = int64_t(kMaxStoredResponses);
    double cache_save_every = 0;
    std::vector<std::string> lora_modules;  // --lora-modules NAME=DIR ...
    std::vector<AdapterCard> lora_cards;    // and as parsed
    bool runtime_lora = false;              // --allow-runtime-lora-updating
    int64_t max_loras = 0, max_lora_rank = 0;
    int port = 8000, threads = 0, tp = 0, json_whitespace = JsonSchema::kDefaultSpace;
    d.add_options()
        ("help", "show this help")
        ("model", po::value(&model)->required(), "Hugging Face checkpoint folder with its tokenizer.json")
        ("host", po::value(&host)->default_value("127.0.0.1"), "address to listen on (0.0.0.0: every interface)")
        ("port", po::value(&port)->default_value(8000), "TCP port (0: any free one; the address is printed on stderr)")
        ("served-model-name", po::value(&name), "the model's name in the API (default: the folder's name)")
        ("lora-modules", po::value(&lora_modules)->multitoken()->composing(),
         "NAME=DIR ...: LoRA adapters (PEFT's folders) kept beside the weights; a request whose \"model\" is NAME "
         "runs under that adapter (vLLM's multi-LoRA serving; repeatable). vLLM's JSON form "
         "'{\"name\": NAME, \"path\": DIR, \"base_model_name\": PARENT}' too (PARENT: /v1/models' parent)")
        ("max-loras", po::value(&max_loras)->default_value(0),
         "at most N LoRA adapters among the running sequences (vLLM's; 0: any); a request under another waits, "
         "and the base model's requests go on past it. On a GPU, N adapters' factors in device memory, the others "
         "copied in from host memory when their turn comes")
        ("max-lora-rank", po::value(&max_lora_rank)->default_value(0),
         "refuse an adapter whose rank is above R, at start and on /v1/load_lora_adapter (vLLM's; 0: any)")
        ("allow-runtime-lora-updating", po::bool_switch(&runtime_lora),
         "serve POST /v1/load_lora_adapter {\"lora_name\", \"lora_path\"} and /v1/unload_lora_adapter {\"lora_name\"} "
         "(vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING; the CPU engine)")
        ("api-key", po::value(&api_key),
         "answer only requests that send \"Authorization: Bearer KEY\" (/health and /metrics stay open; default: "
         "$SHARDLM_API_KEY, else no key)")
        ("ssl-certfile", po::value(&ssl_cert), "serve HTTPS with this PEM certificate (chain); needs --ssl-keyfile")
        ("ssl-keyfile", po::value(&ssl_key), "the PEM private key of --ssl-certfile (not encrypted)")
        ("batch", po::value(&batch)->default_value(8), "sequences run at once (KV-cache slots); more requests wait")
        ("ctx", po::value(&ctx)->default_value(0),
         "KV positions per sequence, prompt and completion (0: 4096, at most max_position_embeddings)")
        ("prefill-chunk", po::value(&chunk)->default_value(256), "tokens per step (decode tokens first)")
        ("penalty-last-n", po::value(&penalty_last_n)->default_value(64),
         "tokens the requests' repetition, presence and frequency penalties look back over")
        ("embeddings",
         "serve /v1/embeddings instead of the text routes: each input's final hidden states pooled as the folder's "
         "sentence-transformers files say (else the last token's, normalized), as shardlm embed does")
        ("pooling", po::value(&pooling), "--embeddings: last, mean or cls instead of the folder's pooling")
        ("rerank",
         "serve a sequence classifier instead of the text routes: /classify (each input's label probabilities), "
         "and /score and /rerank as a cross-encoder's relevance of each (query, document) pair, as shardlm classify "
         "does (a ...ForSequenceClassification model, or a causal LM with --classifier-tokens)")
        ("rerank-template", po::value(&rerank_template),
         "--rerank: /score and /rerank fill each pair into this text, where {query} and {document} stand for the two "
         "(llama.cpp's rerank template; e.g. Qwen3-Reranker's instruction and chat framing), instead of the tokenizer's "
         "pair template")
        ("classifier-tokens", po::value(&token_list),
         "--rerank with a causal LM: the labels are these tokens' logits at the last position, e.g. no,yes "
         "(Qwen3-Reranker; vLLM's classifier_from_token)")
        ("no-prefix-cache",
         "prefill every prompt whole (by default a request takes the free slot whose KV cache holds the longest "
         "start of its prompt, e.g. a shared system prompt or the conversation so far, and prefills only the rest)")
        ("cache-ram", po::value(&cache_ram)->default_value(0),
         "the prefix cache's host tier, at most N MiB on each rank (0: none): before a request takes a slot, the "
         "keys and values that slot holds are saved to host memory, and a later request starting with more of a "
         "saved prefix than any slot holds loads it back instead of prefilling it, so more conversations than "
         "--batch keep their earlier turns (llama.cpp's --cache-ram; the least recently used saves go first)")
        ("cache-file", po::value(&cache_file),
         "--cache-ram across restarts: the saved prefixes are loaded from FILE at start and, with what every free "
         "slot holds, written back at shutdown (SIGINT/SIGTERM); under mpirun rank r keeps FILE.rank<r>; a file made "
         "with another model, weight or KV format, device or rank count is not used, and replaced")
        ("cache-save-every", po::value(&cache_save_every)->default_value(0),
         "also write --cache-file while serving: at most every N seconds, once requests have finished since the "
         "last write, so that a crash or SIGKILL loses at most that much (0: at shutdown only; each write holds "
         "the steps for as long as it takes)")
        ("speculate", po::value(&speculate)->default_value(0),
         "speculative decoding by prompt lookup: up to N proposed tokens verified per step and request, the "
         "tokens made without it up to rounding (0: off)")
        ("speculate-max-batch", po::value(&speculate_max_batch)->default_value(0),
         "--speculate only in steps with at most N decoding sequences (0: any)")
        ("speculate-max-tokens", po::value(&speculate_max_tokens)->default_value(8),
         "--speculate: at most N tokens in a step that carries proposals, its decode tokens included, shared out "
         "among the decoding sequences: verifying costs little while a step fits the CUDA GEMVs' 8 token rows or a "
         "CPU's spare arithmetic (0: no limit but the step's)")
        ("generation-config", po::value(&generation_config)->default_value("auto"),
         "auto: the model's generation_config.json sets the defaults of temperature, top_p, top_k, min_p and "
         "repetition_penalty for requests that do not set them (vLLM's default); vllm: the API's own defaults; a "
         "folder: its generation_config.json")
        ("reasoning-parser", po::value(&reasoning_parser),
         "qwen3: a chat reply's <think>...</think> part comes as message.reasoning_content (streamed: "
         "delta.reasoning_content), the rest as its content; deepseek_r1: the same for a reply that starts in "
         "its reasoning (R1's prompt opens it) and ends it with </think> (vLLM's flag)")
        ("json-whitespace", po::value(&json_whitespace)->default_value(JsonSchema::kDefaultSpace),
         "response_format json_object/json_schema: most whitespace bytes in a row between the JSON's parts, one "
         "line break among them (0: compact JSON, for models that would spend tokens on it)")
        ("threads", po::value(&threads)->default_value(0), "CPU threads per rank (0: one per core)")
        ("tp", po::value(&tp)->default_value(0), "expected tensor-parallel size: must equal the mpirun rank count (0: any)")
        ("max-stored-responses", po::value(&stored_responses)->default_value(int64_t(kMaxStoredResponses)),
         "/v1/responses made with store kept in memory for previous_response_id and GET, the least recently used "
         "dropped first (0: none kept)");
    add_chat_template_option(d, chat_template);
    add_precision_options(d, prec);
    add_draft_options(d, draftf);
    add_backend_options(d, backend);
    po::variables_map vm;
    const bool root = comm.rank() == 0;
    bool help = false;
    std::unique_ptr<Tokenizer> tok;
    EmbeddingConfig ecfg;
    bool embeddings = false, rerank = false;
    std::vector<std::pair<std::string, int32_t>> label_tokens;
    run_together(comm, [&] {
        help = !parse_args(args, d, vm, "usage: shardlm serve --model DIR [--host H] [--port P] [--batch N] [flags]", root);
        if (help) return;
        embeddings = vm.count("embeddings") > 0;
        rerank = vm.count("rerank") > 0;
        if (embeddings && rerank) fail("--embeddings and --rerank exclude each other (one server pools one way)");
        if (vm.count("classifier-tokens") && !rerank) fail("--classifier-tokens applies to --rerank");
        if (vm.count("rerank-template")) {
            if (!rerank) fail("--rerank-template applies to --rerank");
            check_rerank_template(rerank_template, "--rerank-template");
        }
        SessionOptions check_flags;
        apply_backend(backend, check_flags);
        apply_precision(prec, check_flags);
        if (batch < 1) fail("--batch must be at least 1");
        if (chunk < 1) fail("--prefill-chunk must be at least 1");
        if (ctx < 0) fail("--ctx must be >= 0");
        if (port < 0 || port > 65535) fail("--port must be in [0, 65535]");
        if (penalty_last_n < 0) fail("--penalty-last-n must be >= 0");
        if (speculate < 0 || speculate > kMaxSpeculate) fail("--speculate must be in [0, ", kMaxSpeculate, "]");
        check_draft_flags(draftf, vm);
        if (speculate_max_batch < 0) fail("--speculate-max-batch must be >= 0");
        if (speculate_max_tokens < 0) fail("--speculate-max-tokens must be >= 0");
        if (cache_ram < 0 || cache_ram > (int64_t(1) << 40)) fail("--cache-ram must be in [0, 2^40] MiB");
        if (cache_ram > 0 && vm.count("no-prefix-cache")) fail("--cache-ram is the prefix cache's host tier: not with --no-prefix-cache");
        if (vm.count("cache-file")) {
            if (cache_ram == 0) fail("--cache-file keeps the host tier across restarts: it needs --cache-ram above 0");
            check_prefix_cache_path(cache_file, "--cache-file", comm.rank());  // before the load, not at shutdown
        }
        if (stored_responses < 0 || stored_responses > (int64_t(1) << 30)) fail("--max-stored-responses must be in [0, 2^30]");
        if (!vm["cache-save-every"].defaulted()) {
            if (!vm.count("cache-file")) fail("--cache-save-every writes --cache-file while serving: it needs --cache-file");
            if (!(cache_save_every >= 0 && cache_save_every <= 1e9)) fail("--cache-save-every must be in [0, 1e9] seconds");
        }
        check_json_whitespace(json_whitespace);
        if (vm.count("api-key") && api_key.empty()) fail("--api-key must not be empty");
        if (!vm.count("api-key"))
            if (const char* env = std::getenv("SHARDLM_API_KEY")) api_key = env;
        if (vm.count("reasoning-parser") && reasoning_parser != "qwen3" && reasoning_parser != "deepseek_r1")
            fail("--reasoning-parser \"", reasoning_parser, "\" is not supported (qwen3, deepseek_r1)");
        sampling_defaults = load_generation_defaults(generation_config, model);
        for (const std::string& m : lora_modules) {
            lora_cards.push_back(parse_lora_module(m));
            for (size_t j = 0; j + 1 < lora_cards.size(); ++j)
                if (lora_cards[j].name == lora_cards.back().name)
                    fail("--lora-modules: the name \"", lora_cards.back().name, "\" is given twice");
        }
        if (max_loras < 0) fail("--max-loras must be 0 (any) or more");
        if (max_lora_rank < 0) fail("--max-lora-rank must be 0 (any) or more");
        for (const char* flag : {"max-loras", "max-lora-rank"})
            if (!vm[flag].defaulted() && lora_modules.empty() && !runtime_lora)
                fail("--", flag, " applies to LoRA adapters: give --lora-modules or --allow-runtime-lora-updating");
        if ((!lora_modules.empty() || runtime_lora) && (vm.count("embeddings") || vm.count("rerank")))
            fail(lora_modules.empty() ? "--allow-runtime-lora-updating" : "--lora-modules",
                 " applies to text generation, not to --embeddings or --rerank");
        if (ssl_cert.empty() != ssl_key.empty()) fail("--ssl-certfile and --ssl-keyfile go together: give both or neither");
        for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--ssl-certfile", ssl_cert},
                                         std::pair<const char*, const std::string&>{"--ssl-keyfile", ssl_key}})
            if (!path.empty() && !std::ifstream(path)) fail(flag, ": cannot read ", path);
        check_tp_flag(tp, comm);
        set_threads(threads);
        if (name.empty()) {
            std::string dir = model;
            while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
            name = dir.substr(dir.find_last_of('/') + 1);
        }
        for (AdapterCard& a : lora_cards) {
            if (a.name == name) fail("--lora-modules: the name \"", name, "\" is the served model's (--served-model-name)");
            if (a.parent.empty()) a.parent = name;
        }
        // Every rank: JSON mode's token masks are made where the choices are.
        if (!Tokenizer::exists(model)) fail("shardlm serve needs the model's tokenizer: ", model, "/tokenizer.json does not exist");
        tok = std::make_unique<Tokenizer>(Tokenizer::load(model, chat_template_override(chat_template)));
        // A template given here is checked now (one the model ships, when a chat request comes).
        if (!chat_template.empty()) tok->apply_chat_template(std::nullopt, std::vector<ChatMessage>{{"user", "x"}});
        if (vm.count("pooling") && !embeddings) fail("--pooling applies to --embeddings");
        if (embeddings) {
            if (!draftf.model.empty() || speculate > 0)
                fail("--embeddings generates no text: --speculate and --draft-model do not apply");
            if (cache_ram > 0) fail("--cache-ram applies to text generation, not to --embeddings");
            ecfg = load_embedding_config(model);
            if (vm.count("pooling")) ecfg.pooling = parse_pooling(pooling);
        }
        if (rerank) {
            if (!draftf.model.empty() || speculate > 0) fail("--rerank generates no text: --speculate and --draft-model do not apply");
            if (cache_ram > 0) fail("--cache-ram applies to text generation, not to --rerank");
            label_tokens = classifier_tokens(model, token_list);
        }
    });
    if (help) return 0;

    SessionOptions so;
    so.model_dir = model;
    apply_precision(prec, so);
    apply_backend(backend, so);
    so.max_batch = batch;
    so.prefill_chunk = chunk;
    for (const AdapterCard& a : lora_cards) so.adapters.push_back({a.name, {a.dir, 1.0f}});
    so.max_lora_rank = max_lora_rank;
    so.max_loras = max_loras;
    if (embeddings || rerank) {
        so.load.headless_ok = true;  // an embedding or classification checkpoint may have no lm_head
    } else {
        set_scoring_rows(so);  // echo requests score their prompts
        set_speculation_rows(so, speculate);
    }
    std::unique_ptr<Session> s, ds;  // the model, and --draft-model's
    Classifier head;                 // --rerank
    run_together(comm, [&] {
        maybe_inject_failure(comm, "load");
        const ModelConfig cfg = load_config(model);
        set_session_ctx(so, ctx, cfg, "shardlm serve");
        check_context(cfg, so);
        // Each row: the penalty window's distinct ids, a request's logit_bias ids, and the
        // end-of-sequence and stop_token_ids min_tokens bans.
        if (rerank) check_classifier_config(cfg, !label_tokens.empty(), model + "/config.json");
        if (!embeddings && !rerank) so.max_penalties = std::min(std::min(penalty_last_n, so.ctx) + kMaxApiLogitBias + int64_t(cfg.eos_ids.size()) +
                                        kMaxApiStopTokenIds,
                                    cfg.vocab);
        if (!draftf.model.empty()) check_draft_model(draftf.model, so, speculate);
        s = open_session(so, comm);
        if (!draftf.model.empty()) ds = open_draft_session(draftf.model, so, comm);
        if (rerank) head = make_classifier(s->cfg, s->weights, label_tokens);
        // The host tier fills up as prefixes leave the slots: refuse a budget the memory left
        // after loading could not back (this rank's part of it: the node's ranks each keep one).
        const HostMemory avail = host_memory_available();
        const int ranks = s->engine->options().ranks_on_node;
        if (cache_ram > 0 && avail.bytes != SIZE_MAX && size_t(cache_ram) << 20 > avail.bytes / size_t(ranks))
            fail("--cache-ram ", cache_ram, " MiB is more than this rank's part of the host memory left after loading: ",
                 avail.bytes >> 20, " MiB (", avail.source, ")", ranks > 1 ? cat(" / ", ranks, " ranks on the node") : "");
    });
    run_together(comm, [&] { check_same_request(comm, args, *s); });
    Engine& engine = *s->engine;
    ApiLimits lim;
    lim.model = name;
    std::shared_ptr<const std::vector<AdapterCard>> adapter_cards;  // /v1/models' (rank 0; atomic_load/store)
    {
        std::vector<std::string> names;
        for (const AdapterCard& a : lora_cards) names.push_back(a.name);
        lim.adapters = std::make_shared<const std::vector<std::string>>(std::move(names));
        adapter_cards = std::make_shared<const std::vector<AdapterCard>>(lora_cards);
    }
    lim.ctx = engine.options().ctx;
    lim.vocab = s->cfg.vocab;
    lim.penalty_last_n = penalty_last_n;
    lim.reasoning = reasoning_parser == "qwen3"         ? ReasoningParser::Qwen3
                    : reasoning_parser == "deepseek_r1" ? ReasoningParser::DeepSeekR1
                                                        : ReasoningParser::None;
    lim.defaults = sampling_defaults;
    // --cache-file: every rank reads its file before rank 0 listens, so that "listening" means
    // the saves are in (they join the Batcher's tier below).
    PrefixCacheFile cache;
    if (!cache_file.empty()) cache = open_prefix_cache(comm, *s, so, cache_file, "--cache-file");

    // Rank 0: the HTTP server on its own threads. The guard stops it however this function ends
    // (an error in a step must not leave a joinable thread behind: that would abort the process
    // instead of printing the error).
    ResponseIds response_ids;  // (before everything that holds a Job)
    Inbox inbox;
    Stats stats;
    stats.lora = !lora_cards.empty() || runtime_lora;
    stats.max_loras = max_loras;
    std::atomic<uint64_t> counter{0};
    std::unique_ptr<httplib::Server> svr;
    std::thread http;
    // Rank 0: the sequences in the Batcher, by index: their request and choice.
    std::map<size_t, std::pair<std::shared_ptr<Job>, size_t>> jobs;
    // What the HTTP handlers use by reference lives at function scope, before the guard: they run
    // on the server's threads until stop_http. The flag a pooling server runs with ("": text).
    const char* mode = embeddings ? "--embeddings" : rerank ? "--rerank" : "";
    // The pooling routes' requests: runs one's inputs; their vectors (ApiError 503 when the server
    // stops first). Here too for the handlers that call it from the HTTP threads.
    auto run_embedding = [&](EmbeddingRequest r) {
        auto job = std::make_shared<EmbedJob>();
        job->req = std::move(r);
        job->arrived = now_s();
        {
            std::lock_guard<std::mutex> lk(inbox.m);
            if (inbox.closed) throw ApiError(503, "the server is shutting down");
            inbox.embeds.push_back(job);
        }
        inbox.cv.notify_one();
        std::unique_lock<std::mutex> lk(job->m);
        job->cv.wait(lk, [&] { return job->done; });
        if (job->aborted) throw ApiError(503, "the server is shutting down");
        return job;
    };
    ResponseStore responses_store(size_t(std::max<int64_t>(stored_responses, 0)));  // /v1/responses made with "store" (cli/responses_api.h)
    BackgroundJobs background_jobs;  // those made with "background" until they end
    // Queues a job for the engine loop and waits for its end; false when the server is
    // shutting down (then or before it ended).
    // A request parsed under an adapter that was unloaded before it reached the inbox (checked
    // under the inbox's lock, which an unload takes to drop the name: nothing queued after an
    // unload runs under its adapter).
    auto adapter_gone = [&](const ApiRequest& r) {
        return r.adapter >= 0 && (*adapter_names(lim))[size_t(r.adapter)] != r.model;
    };
    const auto gone_message = [](const ApiRequest& r) {
        return "The model `" + r.model + "` does not exist (its LoRA adapter was unloaded)";
    };
    auto run_job = [&](const std::shared_ptr<Job>& job) {
        {
            std::lock_guard<std::mutex> lk(inbox.m);
            if (inbox.closed) return false;
            if (adapter_gone(job->req)) throw ApiError(404, gone_message(job->req));
            inbox.jobs.push_back(job);
        }
        inbox.cv.notify_one();
        std::unique_lock<std::mutex> lk(job->m);
        job->cv.wait(lk, [&] { return job->done(); });
        return !job->aborted;
    };
    // use_beam_search (runtime/beam_search.h): each step a job of the live beams' sequences,
    // one token each with their 2 x n most probable next tokens (the prefix cache prefills only
    // the newest token of each); the n best beams of each prompt are its choices.
    const std::vector<int32_t> eos_ids(s->cfg.eos_ids.begin(), s->cfg.eos_ids.end());
    auto beam_search = [&](const Job& job) {
        const ApiRequest& r = job.req;
        BeamOptions bo;
        bo.width = r.n;
        bo.max_tokens = r.max_tokens;
        bo.length_penalty = r.length_penalty;
        bo.eos_ids = eos_ids;
        bo.stop_ids = r.stop_token_ids;
        bo.ignore_eos = r.ignore_eos;
        BeamSearch bs(r.prompts, bo);
        std::vector<int64_t> cached(r.prompts.size(), 0);  // the first step's, per prompt
        for (bool first = true; !bs.done(); first = false) {
            auto step = std::make_shared<Job>();
            step->req = r;
            step->req.beam = false;
            step->req.beam_step = true;
            step->req.prompts = bs.step();
            step->req.n = 1;
            step->req.max_tokens = 1;
            step->req.min_tokens = 0;
            step->req.logprobs = std::min<int64_t>(bs.candidates(), lim.vocab);
            step->req.sampler.temperature = 0;  // the token drawn is not used: its row's logprobs are
            step->id = job.id + "-step";
            step->arrived = now_s();
            step->created = job.created;
            step->choices.resize(step->req.choices());
            if (!run_job(step)) throw ApiError(503, "the server is shutting down");
            std::vector<TokenLogprobs> scored;
            for (const ChoiceState& cs : step->choices) {
                if (cs.out.lps.empty()) throw ApiError(500, "use_beam_search: a step's sequence came back without logprobs");
                scored.push_back(cs.out.lps[0]);
            }
            if (first)
                for (size_t p = 0; p < cached.size(); ++p) cached[p] = step->choices[p].out.cached_tokens;
            bs.advance(scored);
        }
        std::vector<ApiChoice> outs;
        const DecodeOptions decode = text_decoding(r);
        for (size_t p = 0; p < r.prompts.size(); ++p) {
            const std::vector<Beam> best = bs.best(p);
            if (int64_t(best.size()) < r.n)
                throw ApiError(400, cat("use_beam_search: only ", best.size(), " beams of \"n\" ", r.n, " could be made"));
            for (const Beam& b : best) {
                ApiChoice c;
                std::vector<int32_t> text_ids = b.tokens;
                // An end-of-sequence id is not text (a stop id is, as without beams).
                if (b.finish == "stop" && is_eos_id(s->cfg, b.tokens.back()))
                    text_ids.pop_back();
                c.text = tok->decode(text_ids, decode);
                c.finish = b.finish;
                c.completion_tokens = int64_t(b.tokens.size());
                if (r.return_token_ids) c.token_ids = b.tokens;
                c.cached_tokens = cached[p];
                outs.push_back(std::move(c));
            }
        }
        return api_response(r, job.id, job.created, job.req.model, outs, *tok);
    };
    // Answers whatever has not finished with 503 (so that no handler thread waits on), then stops
    // the server: at the end, or on an error.
    auto stop_http = [&] {
        if (!svr) return;
        for (auto& [id, jc] : jobs) abort_job(*jc.first);
        {
            std::lock_guard<std::mutex> lk(inbox.m);
            inbox.closed = true;
            for (auto& job : inbox.jobs) abort_job(*job);
            inbox.jobs.clear();
            for (auto& op : inbox.adapter_ops) op->answer(503, "the server is shutting down");
            inbox.adapter_ops.clear();
            for (auto& job : inbox.embeds) end_embed_job(*job, true);
            for (auto& job : inbox.embedding) end_embed_job(*job, true);
            inbox.embeds.clear();
            inbox.embedding.clear();
        }
        svr->stop();
        if (http.joinable()) http.join();
        svr.reset();
    };
    struct Guard {
        std::function<void()> f;
        ~Guard() { f(); }
    } guard{stop_http};
    if (root) {
        // A write to a client that has gone must fail with EPIPE, not kill the server: OpenSSL
        // writes TLS records with write(), which raises SIGPIPE.
        std::signal(SIGPIPE, SIG_IGN);
        if (ssl_cert.empty()) {
            svr = std::make_unique<httplib::Server>();
        } else {
            auto tls = std::make_unique<httplib::SSLServer>(ssl_cert.c_str(), ssl_key.c_str());
            if (!tls->is_valid())
                fail("serve: cannot use the TLS certificate ", ssl_cert, " with the key ", ssl_key,
                     " (PEM files, the key not encrypted and matching the certificate)");
            svr = std::move(tls);
        }
        // With a key, every route but the probes a load balancer or Prometheus polls asks for it.
        if (!api_key.empty())
            svr->set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
                if (req.path == "/health" || req.path == "/metrics" ||
                    api_key_accepted(req.get_header_value("Authorization"), api_key))
                    return httplib::Server::HandlerResponse::Unhandled;
                res.status = 401;
                res.set_header("WWW-Authenticate", "Bearer");
                res.set_content(api_error("a valid API key is needed: send the header \"Authorization: Bearer KEY\"", 401)
                                    .dump(),
                                "application/json");
                return httplib::Server::HandlerResponse::Handled;
            });
        // Each request waits on its own thread while it runs: enough threads for every slot and
        // as many waiting.
        const size_t pool = size_t(2 * batch + 4);
        svr->new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
        svr->Get("/health", [](const httplib::Request&, httplib::Response& res) {
            res.set_content(R"({"status":"ok"})", "application/json");
        });
        svr->Get("/version", [](const httplib::Request&, httplib::Response& res) {  // vLLM's
            res.set_content(json{{"version", SHARDLM_VERSION}}.dump(), "application/json");
        });
        svr->Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
            res.set_content(metrics_text(stats), "text/plain; version=0.0.4");
        });
        // vLLM's /tokenize and /detokenize: the server's tokenizer, nothing run.
        auto tokenizer_route = [&](json (*f)(const json&, const Tokenizer&, const ApiLimits&)) {
            return [&, f](const httplib::Request& req, httplib::Response& res) {
                answer_json(req, res, [&](const json& body) { return f(body, *tok, lim); });
            };
        };
        svr->Post("/tokenize", tokenizer_route(api_tokenize));
        svr->Post("/detokenize", tokenizer_route(api_detokenize));
        svr->Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
            json data = json::array({{{"id", name}, {"object", "model"}, {"owned_by", "shardlm"}, {"root", model},
                                      {"parent", nullptr}, {"max_model_len", lim.ctx}}});
            // The adapters as vLLM lists them: their folder as root, the base model as parent.
            for (const AdapterCard& a : *std::atomic_load(&adapter_cards))
                if (!a.name.empty())
                    data.push_back({{"id", a.name}, {"object", "model"}, {"owned_by", "shardlm"}, {"root", a.dir},
                                    {"parent", a.parent}, {"max_model_len", lim.ctx}});
            const json j = {{"object", "list"}, {"data", data}};
            res.set_content(j.dump(), "application/json");
        });
        // vLLM's runtime LoRA updates: a load is made by every rank in the engine loop (the name
        // joins lim.adapters once all have it); an unload drops the name at once, under the inbox's
        // lock, and the factors go once no sequence runs under them. Success is vLLM's plain text.
        auto adapter_route = [&](bool load) {
            return [&, load](const httplib::Request& req, httplib::Response& res) {
                auto op = std::make_shared<AdapterOp>();
                op->load = load;
                try {
                    check_body_depth(req.body);
                    const json body = json::parse(req.body);
                    auto text = [&](const char* key) {
                        if (!body.is_object() || !body.contains(key) || !body[key].is_string() || body[key].get<std::string>().empty())
                            throw ApiError(400, std::string("\"") + key + "\" must be a non-empty string");
                        return body[key].get<std::string>();
                    };
                    op->name = text("lora_name");
                    if (load) op->dir = text("lora_path");
                    std::lock_guard<std::mutex> lk(inbox.m);
                    if (inbox.closed) throw ApiError(503, "the server is shutting down");
                    const auto names = adapter_names(lim);
                    const auto it = std::find(names->begin(), names->end(), op->name);
                    if (load && (it != names->end() || op->name == name))
                        throw ApiError(400, "The lora adapter '" + op->name + "' has already been loaded.");
                    if (!load) {
                        if (it == names->end()) throw ApiError(404, "The lora adapter '" + op->name + "' cannot be found.");
                        op->index = it - names->begin();
                        std::vector<std::string> kept = *names;
                        kept[size_t(op->index)].clear();
                        std::atomic_store(&lim.adapters, std::make_shared<const std::vector<std::string>>(std::move(kept)));
                        std::vector<AdapterCard> cards = *std::atomic_load(&adapter_cards);
                        cards[size_t(op->index)] = AdapterCard{};
                        std::atomic_store(&adapter_cards, std::make_shared<const std::vector<AdapterCard>>(std::move(cards)));
                    }
                    inbox.adapter_ops.push_back(op);
                } catch (const json::exception& e) {
                    res.status = 400;
                    res.set_content(api_error(std::string("the request body is not valid JSON: ") + e.what(), 400).dump(),
                                    "application/json");
                    return;
                } catch (const ApiError& e) {
                    res.status = e.status;
                    res.set_content(api_error(e.what(), e.status).dump(), "application/json");
                    return;
                }
                inbox.cv.notify_one();
                std::unique_lock<std::mutex> lk(op->m);
                op->cv.wait(lk, [&] { return op->done; });
                res.status = op->status;
                if (op->status == 200) res.set_content(op->message, "text/plain");
                else res.set_content(api_error(op->message, op->status).dump(), "application/json");
            };
        };
        if (runtime_lora) {
            svr->Post("/v1/load_lora_adapter", adapter_route(true));
            svr->Post("/v1/unload_lora_adapter", adapter_route(false));
        }
        // The pooling routes: a request's inputs go to the engine loop as one EmbedJob. `needs`
        // names the flags the route runs under (a server of another kind answers 400 naming them).
        auto embedding_route = [&, mode](const char* what, const std::string& needs, std::function<json(const json&)> answer) {
            return [&, mode, what, needs, answer](const httplib::Request& req, httplib::Response& res) {
                if (*mode == 0 || needs.find(mode) == std::string::npos) {
                    res.status = 400;
                    res.set_content(api_error(std::string(*mode ? std::string("this server runs with ") + mode
                                                                : std::string("this server generates text")) +
                                                  ": start shardlm serve with " + needs + " (and a model for it) to serve " + what,
                                              400)
                                        .dump(),
                                    "application/json");
                    return;
                }
                answer_json(req, res, answer);
            };
        };
        svr->Post("/v1/embeddings", embedding_route("/v1/embeddings", "--embeddings", [&](const json& body) {
            const auto job = run_embedding(parse_embedding_request(body, *tok, lim, s->cfg.hidden, ecfg.default_prompt));
            return api_embedding_response(job->req, name, job->vectors);
        }));
        // vLLM's classify API (--rerank): each input's label probabilities.
        svr->Post("/classify", embedding_route("/classify", "--rerank", [&](const json& body) {
            const auto job = run_embedding(parse_embedding_request(body, *tok, lim, s->cfg.hidden, ""));
            std::vector<std::vector<float>> probs;
            for (const auto& logits : job->vectors) probs.push_back(class_probabilities(head, logits));
            return api_classify_response(job->req, "classify-" + std::to_string(counter++), int64_t(std::time(nullptr)), name,
                                         head.labels, probs);
        }));
        // vLLM's score and rerank APIs: on an embedding model, cosines of normalized embeddings; on
        // a classifier (--rerank), the cross-encoder's relevance of each pair.
        auto scores = [&](bool reranking) {
            return embedding_route(reranking ? "/rerank" : "/score", "--embeddings or --rerank", [&, reranking](const json& body) {
                if (rerank) {
                    try {
                        check_relevance(head);
                    } catch (const Error& e) {
                        throw ApiError(400, e.what());
                    }
                }
                const ScoreRequest sr =
                    parse_score_request(body, reranking, *tok, lim, query_prompt(ecfg), document_prompt(ecfg), rerank, rerank_template);
                EmbeddingRequest er;
                er.inputs = sr.inputs;
                er.normalize = 1;
                const auto job = run_embedding(std::move(er));
                std::vector<double> scores;
                if (rerank)
                    for (const auto& logits : job->vectors) scores.push_back(relevance(head, logits));
                else
                    scores = cosine_scores(sr, job->vectors);
                return api_score_response(sr, (reranking ? "rerank-" : "score-") + std::to_string(counter++),
                                          int64_t(std::time(nullptr)), name, scores);
            });
        };
        for (const char* path : {"/score", "/v1/score"}) svr->Post(path, scores(false));
        for (const char* path : {"/rerank", "/v1/rerank", "/v2/rerank"}) svr->Post(path, scores(true));
        // /v1/completions, /v1/chat/completions, and /v1/responses (responses: a chat request
        // in the Responses API's form, cli/responses_api.h).
        auto handler = [&](bool chat, bool responses = false) {
            return [&, chat, responses](const httplib::Request& req, httplib::Response& res) {
                auto refuse = [&](int status, const std::string& message) { send_error(res, status, message); };
                if (*mode)
                    return refuse(400, std::string("this server runs with ") + mode + ": it serves " +
                                           (embeddings ? "/v1/embeddings, /score and /rerank" : "/classify, /score and /rerank") +
                                           ", not " + req.path);
                json body;
                try {
                    check_body_depth(req.body);
                    body = json::parse(req.body);
                } catch (const json::exception& e) {
                    return refuse(400, std::string("the request body is not valid JSON: ") + e.what());
                } catch (const ApiError& e) {
                    return refuse(e.status, e.what());
                }
                auto job = std::make_shared<Job>();
                const json responses_body = responses ? body : json(nullptr);
                json conversation;  // responses: the input items with the stored conversation before them
                std::string own_id;  // the client's id for the request (X-Request-Id or request_id)
                // A response's id held for the job: "" where it is, else why not. Held first, then
                // looked up: a request that held the id before stored its response before letting go.
                auto hold_response_id = [&](const std::string& id) -> std::string {
                    job->id_hold = response_ids.hold(id);
                    if (!job->id_hold) return "a response with the id \"" + id + "\" is running";
                    if (!responses_store.get(id)) return "";
                    job->id_hold.reset();
                    return "a stored response already has the id \"" + id + "\"";
                };
                try {
                    own_id = api_request_id(req.get_header_value("X-Request-Id"), body);
                    if (responses && !own_id.empty())
                        if (const std::string taken = hold_response_id("resp_" + own_id); !taken.empty())
                            throw ApiError(400, taken);
                    if (responses) {
                        body = responses_continue(body, responses_store);
                        conversation = responses_input_items(body);
                        body = responses_chat_body(body);
                        if (body.value("stream", false) == true) body["stream_options"] = {{"include_usage", true}};
                    }
                    job->req = parse_api_request(body, chat, *tok, lim);
                } catch (const ApiError& e) {
                    return refuse(e.status, e.what());
                } catch (const json::exception& e) {  // a field of the wrong JSON type the checks did not name
                    return refuse(400, std::string("a field of the request has the wrong type: ") + e.what());
                }
                while (own_id.empty()) {  // (a client may have taken the number as its own id)
                    own_id = std::to_string(counter++);
                    if (responses && !hold_response_id("resp_" + own_id).empty()) own_id.clear();
                }
                job->id = (responses ? "resp_" : chat ? "chatcmpl-" : "cmpl-") + own_id;
                res.set_header("X-Request-Id", own_id);  // (vLLM's --enable-request-id-headers)
                // The reasoning's tokens for the Responses usage (its text encoded again).
                auto reasoning_tokens = [tk = tok.get()](const std::string& text) {
                    return text.empty() ? int64_t(0) : int64_t(tk->encode(text, {false}).size());
                };
                // The response object of the whole chat response (waited for, or in the background).
                auto as_response = [responses_body, reasoning_tokens](const json& chat_out, const std::string& id) {
                    const json& msg = chat_out["choices"][0]["message"];
                    const std::string reasoning =
                        msg.value("reasoning_content", json(nullptr)).is_string() ? msg["reasoning_content"].get<std::string>() : "";
                    return responses_object(chat_out, responses_body, id, reasoning_tokens(reasoning));
                };
                job->arrived = now_s();
                job->created = int64_t(std::time(nullptr));
                job->choices.resize(job->req.choices());
                // "background": answered at once with the response queued; the engine loop stores
                // the response when it ends (on_done), under its id in the store and the list of
                // running ones until then.
                const bool background = responses && responses_body.value("background", false) == true;
                json queued;
                if (background) {
                    queued = responses_queued(responses_body, job->id, job->created, job->req.model);
                    // With "stream": its events, made from now on by whichever reader comes.
                    if (job->req.stream) {
                        job->bg_stream = std::make_shared<StreamState>();
                        job->bg_stream->rs = std::make_shared<ResponsesStream>(job->id, job->created, job->req.model, responses_body);
                        job->events = std::make_shared<std::vector<std::string>>();
                    }
                    job->on_done = [store = &responses_store, running = &background_jobs, tk = tok.get(), conversation,
                                    as_response](Job& j) {
                        json out;
                        bool cancelled = false, aborted = false;
                        {
                            std::lock_guard<std::mutex> lk(j.m);
                            out = api_response(j.req, j.id, j.created, j.req.model, j.outs(), *tk);
                            if (j.bg_stream) log_events(*j.events, stream_events(j, *j.bg_stream, *tk));  // (what no reader made)
                            // (A cancel that came as it was ending leaves it as it ended.)
                            cancelled = j.cancelled && std::any_of(j.choices.begin(), j.choices.end(),
                                                                   [](const ChoiceState& cs) { return cs.out.finish == "abort"; });
                            aborted = j.aborted;
                        }
                        out = as_response(out, j.id);
                        if (cancelled) {
                            out["status"] = "cancelled";
                        } else if (aborted) {
                            out["status"] = "failed";
                            out["error"] = {{"code", "server_error"}, {"message", "the server shut down before the response was complete"}};
                        }
                        if (j.bg_stream) {  // its last events carry the object the store keeps
                            std::lock_guard<std::mutex> lk(j.m);
                            log_events(*j.events, j.bg_stream->rs->finish(out));
                        }
                        store->put(j.id, {out, responses_conversation(conversation, out), j.events});
                        running->erase(j.id);
                        std::lock_guard<std::mutex> lk(j.m);
                        j.stored = true;
                    };
                }
                if (job->req.beam) {
                    try {
                        res.set_content(beam_search(*job).dump(), "application/json");
                    } catch (const ApiError& e) {
                        refuse(e.status, e.what());
                    }
                    return;
                }
                {
                    std::lock_guard<std::mutex> lk(inbox.m);
                    if (inbox.closed) return refuse(503, "the server is shutting down");
                    if (adapter_gone(job->req)) return refuse(404, gone_message(job->req));
                    if (background) {  // (before the engine loop can see it: it may end at once)
                        responses_store.put(job->id, {queued, json(nullptr), nullptr});
                        background_jobs.put(job->id, job, queued);
                    }
                    inbox.jobs.push_back(job);
                }
                inbox.cv.notify_one();
                if (background && !job->req.stream) return res.set_content(queued.dump(), "application/json");
                if (background) {  // (its first events say "queued"; the stream goes on from there)
                    res.set_header("Cache-Control", "no-cache");
                    return res.set_chunked_content_provider("text/event-stream", background_stream(job, -1, *tok));
                }
                if (!job->req.stream) {
                    std::unique_lock<std::mutex> lk(job->m);
                    job->cv.wait(lk, [&] { return job->done(); });
                    if (job->aborted) return refuse(503, "the server is shutting down");
                    json out = api_response(job->req, job->id, job->created, job->req.model, job->outs(), *tok);
                    if (responses) {
                        out = as_response(out, job->id);
                        if (out["store"] != false) responses_store.put(job->id, {out, responses_conversation(conversation, out), nullptr});
                    }
                    job->id_hold.reset();  // (stored where it is kept: a client may take the id again once answered)
                    res.set_content(out.dump(), "application/json");
                    return;
                }
                const auto st = std::make_shared<StreamState>();
                if (responses) st->rs = std::make_shared<ResponsesStream>(job->id, job->created, job->req.model, responses_body);
                res.set_header("Cache-Control", "no-cache");
                res.set_chunked_content_provider(
                    "text/event-stream",
                    [job, model_name = job->req.model, tk = tok.get(), st, reasoning_tokens, conversation,
                     store = &responses_store](size_t, httplib::DataSink& sink) {
                        std::unique_lock<std::mutex> lk(job->m);
                        const ApiRequest& req = job->req;
                        job->cv.wait_for(lk, std::chrono::milliseconds(200), [&] { return job->aborted || stream_news(*job); });
                        if (!sink.is_writable()) {
                            job->gone = true;
                            return false;
                        }
                        std::string out = stream_events(*job, *st, *tk);
                        const std::shared_ptr<ResponsesStream>& rs = st->rs;
                        if (rs && job->done()) {
                            out += rs->end(job->aborted ? json(nullptr) : api_usage_chunk(req, job->id, job->created, model_name, job->outs())["usage"],
                                           reasoning_tokens(rs->reasoning()));
                            const json& obj = rs->final_object();
                            if (!obj.is_null() && obj["store"] != false) store->put(job->id, {obj, responses_conversation(conversation, obj), nullptr});
                        }
                        else if (job->done() && job->req.include_usage && !job->aborted)
                            out += sse(api_usage_chunk(job->req, job->id, job->created, model_name, job->outs()));
                        if (job->done() && !rs) out += "data: [DONE]\n\n";
                        // The id goes before the last events: the job itself lives on with this
                        // provider until the server is done with the connection's response.
                        if (job->done()) job->id_hold.reset();
                        if (!out.empty() && !sink.write(out.data(), out.size())) {
                            job->gone = true;
                            return false;
                        }
                        if (job->done()) sink.done();
                        return true;
                    },
                    [job](bool success) {
                        if (!success) job->gone = true;
                    });
            };
        };
        svr->Post("/v1/completions", handler(false));
        svr->Post("/v1/chat/completions", handler(true));
        svr->Post("/v1/responses", handler(true, true));
        // A stored response (OpenAI's retrieve and delete); a background one still running is
        // read with its status of the moment, and cannot be deleted before it ends. One made in
        // the background with "stream" is streamed again with ?stream=true: its events after
        // sequence number starting_after, then those to come while it runs.
        auto stored = [&](bool drop) {
            return [&, drop](const httplib::Request& req, httplib::Response& res) {
                const std::string id = req.matches[1];
                if (!drop && req.has_param("stream") && req.get_param_value("stream") == "true") {
                    int64_t after = -1;
                    if (req.has_param("starting_after")) {
                        const std::string v = req.get_param_value("starting_after");
                        char* end = nullptr;
                        after = std::strtoll(v.c_str(), &end, 10);
                        if (v.empty() || *end != '\0' || after < 0 || after > (int64_t(1) << 40))
                            return send_error(res, 400, "starting_after must be a sequence number (0 or more), not \"" + v + "\"");
                    }
                    const std::shared_ptr<Job> job = background_jobs.job(id);
                    const std::optional<ResponseStore::Entry> e = job ? std::nullopt : responses_store.get(id);
                    if (!job && !e) return send_error(res, 404, "no stored response \"" + id + "\"");
                    if (job ? !job->bg_stream : !e->events)
                        return send_error(res, 400, "the response \"" + id + "\" was not made with \"background\" and \"stream\": "
                                                    "only those can be streamed again");
                    res.set_header("Cache-Control", "no-cache");
                    return res.set_chunked_content_provider("text/event-stream",
                                                            job ? background_stream(job, after, *tok) : stored_stream(e->events, after));
                }
                if (const std::optional<json> running = background_jobs.object(id)) {
                    if (!drop) return res.set_content(running->dump(), "application/json");
                    return send_error(res, 400, "the response \"" + id + "\" is still running in the background: "
                                                "cancel it (POST /v1/responses/" + id + "/cancel) or wait for it first");
                }
                const std::optional<ResponseStore::Entry> e = drop ? std::nullopt : responses_store.get(id);
                if (drop ? !responses_store.erase(id) : !e) return send_error(res, 404, "no stored response \"" + id + "\"");
                res.set_content((drop ? json{{"id", id}, {"object", "response"}, {"deleted", true}} : e->object).dump(),
                                "application/json");
            };
        };
        svr->Get(R"(/v1/responses/([^/]+))", stored(false));
        svr->Delete(R"(/v1/responses/([^/]+))", stored(true));
        // OpenAI's cancel: a background response ends where it stands (status "cancelled", its
        // output so far); one that has ended is given as it is; a response made without
        // "background" cannot be cancelled.
        svr->Post(R"(/v1/responses/([^/]+)/cancel)", [&](const httplib::Request& req, httplib::Response& res) {
            const std::string id = req.matches[1];
            auto refuse = [&](int status, const std::string& message) { send_error(res, status, message); };
            if (const std::shared_ptr<Job> job = background_jobs.job(id)) {
                std::unique_lock<std::mutex> lk(job->m);
                job->cancelled = !job->done();
                job->gone = true;  // the engine loop ends it at its next step (or within 200 ms when idle)
                if (!job->cv.wait_for(lk, std::chrono::seconds(120), [&] { return job->stored; }))
                    return refuse(503, "the response \"" + id + "\" did not end within 120 s of its cancel");
            }
            const std::optional<ResponseStore::Entry> e = responses_store.get(id);
            if (!e) return refuse(404, "no stored response \"" + id + "\"");
            if (e->object.value("background", false) != true)
                return refuse(400, "the response \"" + id + "\" was not made in the background: only background responses can be cancelled");
            res.set_content(e->object.dump(), "application/json");
        });
        const int bound = port == 0 ? svr->bind_to_any_port(host) : (svr->bind_to_port(host, port) ? port : -1);
        if (bound < 0) fail("serve: cannot listen on ", host, ":", port);
        http = std::thread([&] { svr->listen_after_bind(); });
        std::cerr << "shardlm serve: listening on " << (ssl_cert.empty() ? "http" : "https") << "://" << host << ":"
                  << bound << " (model " << name
                  << (embeddings ? std::string(", embeddings, ") + pooling_name(ecfg.pooling) + " pooling"
                      : rerank   ? ", classifier of labels " + json(head.labels).dump()
                                 : std::string())
                  << ", " << batch << " slots of " << lim.ctx << " positions, "
                  << engine.device() << ", tp " << comm.size()
                  << (cache_ram > 0 ? cat(", --cache-ram: ", (size_t(cache_ram) << 20) / engine.kv_position_bytes(),
                                          " positions of ", engine.kv_position_bytes(), " bytes")
                                    : std::string())
                  << ", pid " << ::getpid() << (api_key.empty() ? "" : ", API key required") << ")" << std::endl;
        if (sampling_defaults.any() && !embeddings && !rerank)  // as vLLM says it
            std::cerr << "shardlm serve: sampling defaults from generation_config.json:"
                      << describe_generation_defaults(sampling_defaults) << " (--generation-config vllm: the API's own)" << std::endl;
    }

    // The engine loop, on every rank. SIGINT/SIGTERM (mpirun forwards them to every rank) end it
    // when rank 0 has seen one and told the others.
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    if (embeddings || rerank) {
        EmbedOptions eo;
        eo.pooling = ecfg.pooling;
        eo.normalize = ecfg.normalize;
        eo.chunk = chunk;
        Pooler pooler = rerank ? classify_pooler(engine, head, chunk) : embed_pooler(engine, eo);
        embedding_loop(comm, inbox, stats, pooler, rerank ? nullptr : &eo);
        if (root) {
            stop_http();
            std::cerr << "shardlm serve: stopped" << std::endl;
        }
        return 0;
    }
    BatcherOptions bo;
    bo.prefill_chunk = chunk;
    bo.reuse_prefix = !vm.count("no-prefix-cache");
    bo.host_cache_bytes = size_t(cache_ram) << 20;
    bo.speculate = speculate;
    bo.draft_p_min = draftf.p_min;
    bo.speculate_max_batch = speculate_max_batch;
    bo.speculate_max_tokens = speculate_max_tokens;
    bo.draft = ds ? ds->engine.get() : nullptr;
    bo.max_adapters = max_loras;
    JsonVocab json_vocab(json_token_bytes(*tok));
    bo.json_vocab = &json_vocab;
    // Every rank: the schemas of JSON-mode and json_schema requests, compiled once per text and
    // shared by the requests that send it again (so are JsonVocab's masks for them).
    auto spaced = [&](JsonSchema sc) {
        sc.max_space = json_whitespace;
        return std::make_shared<const JsonSchema>(std::move(sc));
    };
    const std::shared_ptr<const JsonSchema> json_mode = spaced(json_object_schema());
    std::map<std::string, std::shared_ptr<const JsonSchema>> schemas;
    auto schema_of = [&](const json& j) -> std::shared_ptr<const JsonSchema> {
        if (j["json_object"]) return json_mode;
        const std::string text = j["json_schema"], regex = j["guided_regex"], grammar = j["guided_grammar"];
        const std::vector<std::string> choices = j["guided_choice"];
        if (text.empty() && choices.empty() && regex.empty() && grammar.empty()) return nullptr;
        // (no schema text starts with a line break)
        const std::string key = !text.empty()      ? text
                                : !regex.empty()   ? "regex\n" + regex
                                : !grammar.empty() ? "grammar\n" + grammar
                                                   : "choice\n" + j["guided_choice"].dump();
        auto it = schemas.find(key);
        if (it != schemas.end()) return it->second;
        if (schemas.size() >= 64) schemas.clear();
        return schemas
            .emplace(key, spaced(!text.empty()      ? compile_json_schema(text, "response_format.json_schema.schema")
                                 : !regex.empty()   ? regex_schema(regex, "guided_regex")
                                 : !grammar.empty() ? compile_grammar(grammar, "guided_grammar")
                                                    : choice_schema(choices, "guided_choice")))
            .first->second;
    };
    Batcher batcher(engine, bo);
    std::vector<std::vector<int32_t>> written_tokens;  // every rank: the prefixes its file holds (--cache-save-every)
    if (!cache_file.empty()) {
        for (const SavedPrefix& p : cache.saved) written_tokens.push_back(p.tokens);
        batcher.restore_host(std::move(cache.saved));
        std::lock_guard<std::mutex> lk(stats.m);
        stats.host_bytes = batcher.host_bytes();  // /metrics before the first step
    }
    std::vector<size_t> live;                          // every rank: requests not yet released
    std::map<size_t, std::unique_ptr<StopMatcher>> texts;  // rank 0
    std::vector<std::pair<size_t, std::string>> to_end;    // rank 0: found after a step, sent with the next control
    std::map<size_t, double> first_token;                   // rank 0: when each request's first token came
    const TokenCallback on_token = [&](size_t id, int32_t t) {
        if (!root) return;
        if (first_token.find(id) == first_token.end()) first_token.emplace(id, now_s());
        const auto& [job, c] = jobs.at(id);
        job->started = true;  // (a background response is "in_progress" from its first token)
        if (job->req.beam_step) {  // its row's logprobs are all it is for, whatever it drew
            std::lock_guard<std::mutex> lk(job->m);
            job->choices[c].out.lps.push_back(batcher.result(id).logprobs.back());
            return;
        }
        if (job->req.echo && !job->req.chat && job->req.stream && !job->choices[c].prompt_scored) {  // the prompt was scored before its first token
            std::lock_guard<std::mutex> lk(job->m);
            job->choices[c].out.prompt_lps = batcher.result(id).prompt_logprobs;
            job->choices[c].prompt_scored = true;
        }
        if (job->req.return_token_ids) {
            std::lock_guard<std::mutex> lk(job->m);
            job->choices[c].out.token_ids.push_back(t);
        }
        if (is_eos_id(s->cfg, t)) return;
        if (job->req.continuous_usage) {  // the tokens so far, the end-of-sequence one included
            std::lock_guard<std::mutex> lk(job->m);
            job->choices[c].out.completion_tokens = int64_t(batcher.result(id).tokens.size());
        }
        const std::vector<int32_t>& fim = job->req.fim_stops;  // not text, as an end-of-sequence token
        if (std::find(fim.begin(), fim.end(), t) != fim.end()) return;
        StopMatcher& m = *texts.at(id);
        if (m.push(t)) to_end.emplace_back(id, "stop");
        {
            std::lock_guard<std::mutex> lk(job->m);
            ApiChoice& out = job->choices[c].out;
            out.text = m.text().substr(0, m.settled());
            if (job->req.logprobs >= 0) out.lps.push_back(batcher.result(id).logprobs.back());
        }
        job->cv.notify_all();
    };
    double last_write = now_s();  // rank 0: --cache-save-every
    int64_t ended_since_write = 0;
    std::vector<int64_t> unloading;  // adapters unloaded whose factors wait for their last sequence to end
    for (;;) {
        json ctl = {{"add", json::array()}, {"end", json::array()}, {"shutdown", false}, {"save", false},
                    {"adapters", json::array()}};
        std::vector<std::pair<std::shared_ptr<Job>, size_t>> added;  // rank 0: a request's choices in order
        std::vector<std::shared_ptr<AdapterOp>> ops;                  // rank 0: ctl["adapters"]' requests
        if (root) {
            std::unique_lock<std::mutex> lk(inbox.m);
            if (!batcher.busy() && to_end.empty())  // idle: wait for work (the other ranks wait in the broadcast)
                inbox.cv.wait_for(lk, std::chrono::milliseconds(200),
                                  [&] { return !inbox.jobs.empty() || !inbox.adapter_ops.empty() || g_signalled; });
            while (!inbox.jobs.empty()) {
                const std::shared_ptr<Job> job = inbox.jobs.front();
                inbox.jobs.pop_front();
                for (size_t c = 0; c < job->choices.size(); ++c) {
                    added.emplace_back(job, c);
                    ctl["add"].push_back(request_json(job->req, c));
                }
            }
            // (Two loads of one name in flight: the second is refused here, the first's name
            // being in lim.adapters or in this batch.)
            std::set<std::string> loading;
            for (; !inbox.adapter_ops.empty(); inbox.adapter_ops.pop_front()) {
                const std::shared_ptr<AdapterOp> op = inbox.adapter_ops.front();
                const auto names = adapter_names(lim);
                if (op->load && (!loading.insert(op->name).second ||
                                 std::find(names->begin(), names->end(), op->name) != names->end())) {
                    op->answer(400, "The lora adapter '" + op->name + "' has already been loaded.");
                    continue;
                }
                ops.push_back(op);
                ctl["adapters"].push_back({{"load", op->load}, {"name", op->name}, {"dir", op->dir}, {"index", op->index}});
            }
            if (g_signalled) {
                inbox.closed = true;
                ctl["shutdown"] = true;
            }
            lk.unlock();
            for (const auto& [id, jc] : jobs)
                if (jc.first->gone) to_end.emplace_back(id, "abort");
            for (const auto& [id, why] : to_end) ctl["end"].push_back({id, why});
            to_end.clear();
            if (cache_save_every > 0 && ended_since_write > 0 && now_s() - last_write >= cache_save_every) {
                ctl["save"] = true;
                ended_since_write = 0;
                last_write = now_s();
            }
        }
        broadcast_control(comm, ctl);
        for (size_t i = 0; i < ctl["add"].size(); ++i) {
            BatchRequest br = batch_request(ctl["add"][i]);
            br.json = schema_of(ctl["add"][i]);
            const size_t id = batcher.add(std::move(br));
            live.push_back(id);
            if (!root) continue;
            jobs[id] = added[i];
            const ApiRequest& req = added[i].first->req;
            texts[id] = std::make_unique<StopMatcher>(*tok, req.stop, text_decoding(req), req.include_stop_str);
        }
        for (const json& e : ctl["end"]) batcher.finish(e[0].get<size_t>(), e[1].get<std::string>());
        // Adapters loaded and unloaded while serving, in order, every rank alike. A load is kept
        // only where every rank made it (each names its own failure on its stderr; rank 0's
        // answer names its own, or the rank count that failed).
        for (size_t k = 0; k < ctl["adapters"].size(); ++k) {
            const json& a = ctl["adapters"][k];
            const std::string an = a["name"];
            if (!a["load"].get<bool>()) {
                unloading.push_back(a["index"].get<int64_t>());
                if (root) ops[k]->answer(200, "Success: LoRA adapter '" + an + "' removed successfully.");
                continue;
            }
            // The engine takes the adapter before the ranks agree (a GPU may have no room for it):
            // where any rank failed, every rank that took it goes back to the list before.
            std::string err;
            bool added = false;
            try {
                s->adapters.push_back(load_lora_weights(an, {a["dir"].get<std::string>(), 1.0f}, *s->ckpt, s->cfg,
                                                        s->weights, lora_factor_dtype(s->weights), max_lora_rank));
                added = true;
                engine.set_adapters(&s->adapters);
            } catch (const std::exception& e) {
                err = e.what();
                std::cerr << "shardlm serve: rank " << comm.rank() << ": loading LoRA adapter " << an << ": " << err << std::endl;
            }
            float ok = err.empty() ? 1.0f : 0.0f;
            comm.all_reduce_sum(&ok, 1);
            const int failed = comm.size() - int(ok + 0.5f);
            if (failed > 0 && added) {
                s->adapters.pop_back();
                engine.set_adapters(&s->adapters);
            }
            if (!root) continue;
            if (failed > 0) {
                ops[k]->answer(400, !err.empty() ? err : cat(failed, " of ", comm.size(), " ranks could not load it (their stderr names why)"));
                continue;
            }
            {
                std::lock_guard<std::mutex> lk(inbox.m);
                std::vector<std::string> names = *adapter_names(lim);
                names.push_back(an);
                std::atomic_store(&lim.adapters, std::make_shared<const std::vector<std::string>>(std::move(names)));
                std::vector<AdapterCard> cards = *std::atomic_load(&adapter_cards);
                cards.push_back({an, a["dir"].get<std::string>(), name});
                std::atomic_store(&adapter_cards, std::make_shared<const std::vector<AdapterCard>>(std::move(cards)));
            }
            ops[k]->answer(200, "Success: LoRA adapter '" + an + "' added successfully.");
        }
        // An unloaded adapter's factors go once no sequence runs or waits under it (the ranks'
        // Batchers hold the same sequences, so every rank frees it at the same step).
        for (auto it = unloading.begin(); it != unloading.end();) {
            if (batcher.uses_adapter(*it)) {
                ++it;
                continue;
            }
            s->adapters[size_t(*it)] = LoraWeights{};
            engine.set_adapters(&s->adapters);
            it = unloading.erase(it);
        }
        if (ctl["shutdown"]) break;
        if (ctl["save"]) {
            // Every rank at the same step: what the free slots hold joins the tier, the tier is
            // written and goes back in, its order of use kept. A failed write is reported and
            // serving goes on (every rank gets the same Error from save_prefix_cache).
            // Saves the same as the last write's (prefixes too short to keep, say) are not written.
            batcher.save_slots();
            std::vector<SavedPrefix> saved = batcher.take_host();
            std::vector<std::vector<int32_t>> tokens;
            for (const SavedPrefix& p : saved) tokens.push_back(p.tokens);
            if (tokens != written_tokens) {
                try {
                    save_prefix_cache(comm, cache, saved, true);
                    written_tokens = std::move(tokens);
                } catch (const Error& e) {
                    if (root) std::cerr << "shardlm serve: " << e.what() << " (serving goes on)" << std::endl;
                }
            }
            batcher.restore_host(std::move(saved));
        }
        batcher.step(on_token);
        if (root) {
            std::lock_guard<std::mutex> lk(stats.m);
            stats.running = batcher.running();
            stats.waiting = batcher.waiting();
            stats.steps = batcher.timings();
            stats.host_bytes = batcher.host_bytes();
            if (stats.lora) {
                auto names = [&](const std::vector<int64_t>& ids) {
                    std::vector<std::string> out;
                    for (const int64_t a : ids) out.push_back(s->adapters[size_t(a)].name);
                    return out;
                };
                stats.running_adapters = names(batcher.running_adapters());
                stats.waiting_adapters = names(batcher.waiting_adapters());
            }
        }
        // Ended requests: rank 0 answers them; every rank lets their results go.
        size_t kept = 0;
        for (const size_t id : live) {
            if (!batcher.ended(id)) {
                live[kept++] = id;
                continue;
            }
            if (root) {
                const SequenceResult& r = batcher.result(id);
                StopMatcher& m = *texts.at(id);
                // A stop string completed by the decoder's held-back rest still ends the text there.
                const std::string why = m.finish() ? "stop" : r.stop_reason;
                {
                    std::lock_guard<std::mutex> lk(stats.m);
                    stats.finished[why == "abort" ? "abort" : finish_reason(why)] += 1;
                    stats.prompt_tokens += int64_t(r.prompt.size());
                    stats.cached_tokens += r.cached_tokens;
                    stats.generated_tokens += int64_t(r.tokens.size());
                    const auto first = first_token.find(id);
                    if (first != first_token.end()) {
                        const double arrived = jobs.at(id).first->arrived, end = now_s();
                        stats.ttft.add(first->second - arrived);
                        if (r.tokens.size() > 1) stats.tpot.add((end - first->second) / double(r.tokens.size() - 1));
                        stats.e2e.add(end - arrived);
                        first_token.erase(first);
                    }
                }
                // An abort ends a background response too (cancelled, or its client's output kept).
                if (why != "abort" || jobs.at(id).first->on_done)
                    finish_choice(*jobs.at(id).first, jobs.at(id).second, m.text(), why == "abort" ? "abort" : finish_reason(why), r);
                ++ended_since_write;
                jobs.erase(id);
                texts.erase(id);
            }
            batcher.release(id);
        }
        live.resize(kept);
    }
    if (!cache_file.empty()) {  // every rank, its own file (requests still running are not saved)
        batcher.save_slots();
        save_prefix_cache(comm, cache, batcher.take_host(), !cache.used || batcher.timings().host_saves > 0);
    }
    if (root) {
        stop_http();
        std::cerr << "shardlm serve: stopped" << std::endl;
    }
    return 0;
}

}  // namespace shardlm
