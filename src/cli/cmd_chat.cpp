// shardlm chat: a conversation in the model's chat template. Each line on stdin is a user turn;
// the reply is printed (streamed on a terminal) before the next line is read. The KV cache keeps
// the conversation between turns: a turn prefills only what follows the longest prefix its
// rendered tokens share with what the cache holds (the earlier turns, unless the template renders
// them differently now, as Qwen3's drops a reply's reasoning).
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <limits>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/prefix_cache_file.h"
#include "comm/communicator.h"
#include "comm/together.h"
#include "core/error.h"
#include "runtime/batcher.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "tokenizer/prompts.h"
#include "tokenizer/stop_strings.h"
#include "tokenizer/tokenizer.h"


namespace shardlm {

namespace {

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
}

}  // namespace

int cmd_chat(const Args& args, Communicator& comm) {
    po::options_description d("chat options");
    std::string model, prompt_cache, chat_template;
    DraftFlags draftf;
    BackendFlags backend;
    PrecisionFlags prec;
    SamplingFlags sampling;
    int64_t max_new = 512, ctx = 0, chunk = 256, speculate = 0, cache_ram = 1024;
    int threads = 0, tp = 0;
    d.add_options()
        ("help", "show this help")
        ("model", po::value(&model)->required(), "Hugging Face checkpoint folder with a chat template")
        ("system", po::value<std::string>(), "system message")
        ("no-thinking", "the template's enable_thinking false (Qwen3: each reply opens with an empty <think> block)")
        ("max-new-tokens", po::value(&max_new)->default_value(512), "most tokens per reply")
        ("ctx", po::value(&ctx)->default_value(0),
         "KV positions for the whole conversation (0: 4096, at most max_position_embeddings); the oldest turns "
         "are dropped when a new one would not fit")
        ("prefill-chunk", po::value(&chunk)->default_value(256), "prompt tokens per prefill step")
        ("speculate", po::value(&speculate)->default_value(0),
         "speculative decoding by prompt lookup: up to N proposed tokens verified per step, the same reply "
         "as without it (0: off)")
        ("prompt-cache", po::value(&prompt_cache),
         "keys and values kept in FILE across chats: a first turn that starts with a conversation saved there (its "
         "system prompt, or the same turns) loads it instead of prefilling it, and at the end the conversation is "
         "saved there (the least recent go beyond --cache-ram; under mpirun rank r keeps FILE.rank<r>; a file made "
         "with another model, weight or KV format, device or rank count is not used, and replaced)")
        ("cache-ram", po::value(&cache_ram)->default_value(1024),
         "MiB per rank that the conversations saved in --prompt-cache may take, the least recent going first")
        ("threads", po::value(&threads)->default_value(0), "CPU threads per rank (0: one per core)")
        ("tp", po::value(&tp)->default_value(0), "expected tensor-parallel size: must equal the mpirun rank count (0: any)")
        ("json", "print one JSON object per turn (text, tokens, reused cache positions, timings) instead of the text");
    JsonFlags json_flags;
    add_json_options(d, json_flags);
    add_sampling_options(d, sampling);
    add_chat_template_option(d, chat_template);
    add_precision_options(d, prec);
    add_draft_options(d, draftf);
    add_backend_options(d, backend);
    po::variables_map vm;
    const bool root = comm.rank() == 0;
    bool help = false;
    GenerateOptions go;
    // rank 0; every rank with --stop, --json-object or --json-schema (each decides where a reply
    // stops and what it may choose)
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<JsonVocab> json_vocab;
    std::optional<std::string> system;
    ChatKwargs kwargs;  // --no-thinking
    // Phase 1, no collectives inside: flags, and the tokenizer with its template.
    run_together(comm, [&] {
        help = !parse_args(args, d, vm, "usage: shardlm chat --model DIR [--system TEXT] [flags]  (one user turn per stdin line)",
                           root);
        if (help) return;
        SessionOptions check_flags;
        apply_backend(backend, check_flags);
        apply_precision(prec, check_flags);
        if (max_new < 1) fail("--max-new-tokens must be at least 1");
        if (chunk < 1) fail("--prefill-chunk must be at least 1");
        if (ctx < 0) fail("--ctx must be >= 0");
        check_tp_flag(tp, comm);
        set_threads(threads);
        apply_generation_defaults(sampling, vm, model, "chat", root);
        go.sampler = apply_sampling(sampling);
        go.max_new_tokens = max_new;
        go.prefill_chunk = chunk;
        if (speculate < 0 || speculate > kMaxSpeculate) fail("--speculate must be in [0, ", kMaxSpeculate, "]");
        go.speculate = speculate;
        check_draft_flags(draftf, vm);
        go.draft_p_min = draftf.p_min;
        if (vm.count("system")) system = vm["system"].as<std::string>();
        if (vm.count("prompt-cache")) check_prefix_cache_path(prompt_cache, "--prompt-cache", comm.rank());
        if (!vm["cache-ram"].defaulted()) {
            if (!vm.count("prompt-cache")) fail("--cache-ram sizes the conversations kept in --prompt-cache: it needs --prompt-cache");
            if (cache_ram < 1 || cache_ram > (int64_t(1) << 40)) fail("--cache-ram must be in [1, 2^40] MiB");
        }
        go.json = apply_json(json_flags);
        if (!root && sampling.stops.empty() && !go.json) return;
        if (!Tokenizer::exists(model)) fail("shardlm chat needs the model's tokenizer: ", model, "/tokenizer.json does not exist");
        tok = std::make_unique<Tokenizer>(Tokenizer::load(model, chat_template_override(chat_template)));
        if (!tok->has_chat_template())
            fail(model, "/tokenizer_config.json has no chat_template, and there is no chat_template.jinja: shardlm chat "
                        "needs one (give it with --chat-template; generate takes plain prompts)");
        // An unrecognised template, or a system message the template refuses, fails here, before
        // the weights load.
        tok->apply_chat_template(system, std::vector<ChatMessage>{{"user", "x"}});
        if (vm.count("no-thinking")) {
            if (!tok->chat_thinking_switch())
                fail("--no-thinking: this model's chat template has no enable_thinking switch (Qwen3's)");
            kwargs.enable_thinking = false;
        }
        if (go.json) json_vocab = std::make_unique<JsonVocab>(json_token_bytes(*tok));
        go.json_vocab = json_vocab.get();
    });
    if (help) return 0;
    const bool json_out = vm.count("json") > 0;

    SessionOptions so;
    so.model_dir = model;
    apply_precision(prec, so);
    apply_backend(backend, so);
    so.max_batch = 1;
    so.prefill_chunk = chunk;
    set_speculation_rows(so, speculate);
    std::unique_ptr<Session> s, ds;  // the model, and --draft-model's
    run_together(comm, [&] {
        maybe_inject_failure(comm, "load");
        const ModelConfig cfg = load_config(model);
        set_session_ctx(so, ctx, cfg, "shardlm chat");
        if (max_new >= so.ctx)
            fail("--max-new-tokens ", max_new, " leaves no room for a prompt in a context of ", so.ctx, " (--ctx)");
        check_context(cfg, so);
        check_logit_bias(go.sampler, cfg.vocab);
        so.max_penalties = max_penalties(go.sampler, so.ctx, cfg.vocab, false);
        if (!draftf.model.empty()) check_draft_model(draftf.model, so, speculate);
        s = open_session(so, comm);
        if (!draftf.model.empty()) {
            ds = open_draft_session(draftf.model, so, comm);
            go.draft = ds->engine.get();
        }
    });
    run_together(comm, [&] { check_same_request(comm, args, *s); });
    // --prompt-cache: conversations of earlier chats, the least recently saved first.
    PrefixCacheFile cache;
    if (!prompt_cache.empty()) cache = open_prefix_cache(comm, *s, so, prompt_cache, "--prompt-cache");
    std::vector<SavedPrefix>& saved = cache.saved;

    const int64_t ctx_used = s->engine->options().ctx;
    // A sliding-window ring (kv_capacity < ctx) overwrites old positions: its rows can be reused
    // only while nothing has wrapped.
    const int64_t capacity = kv_capacity(s->cfg, s->engine->options());
    const bool in_tty = root && ::isatty(STDIN_FILENO), stream = root && !json_out && ::isatty(STDOUT_FILENO);
    const uint64_t seed = go.sampler.seed;
    std::vector<ChatMessage> messages;   // rank 0
    std::vector<int32_t> cache_tokens;   // what the slot's cache holds, positions [0, size)
    for (uint64_t turn = 0;; ++turn) {
        // Rank 0 reads the turn and renders the conversation; the ids travel to every rank (no
        // prompt: the input has ended).
        std::vector<std::vector<int32_t>> turn_ids;
        int64_t dropped = 0;
        run_together(comm, [&] {
            if (!root) return;
            for (;;) {
                std::string line;
                do {
                    if (in_tty) std::cerr << "> " << std::flush;
                    if (!std::getline(std::cin, line)) return;
                    if (!line.empty() && line.back() == '\r') line.pop_back();
                } while (line.empty());
                const std::vector<ChatMessage> before = messages;
                messages.push_back({"user", line});
                std::vector<int32_t> ids;
                dropped = 0;
                for (;;) {
                    ids = tok->encode(tok->apply_chat_template(system, messages, {}, kwargs), EncodeOptions{false});
                    if (int64_t(ids.size()) + max_new <= ctx_used || messages.size() == 1) break;
                    messages.erase(messages.begin(), messages.begin() + 2);  // the oldest exchange
                    ++dropped;
                }
                if (int64_t(ids.size()) + max_new <= ctx_used) {
                    turn_ids.push_back(std::move(ids));
                    return;
                }
                const std::string why = cat("turn ", turn + 1, " alone takes ", ids.size(), " tokens; with --max-new-tokens ",
                                            max_new, " it needs more than the context of ", ctx_used, " (--ctx)");
                // Typed at a terminal: the conversation stays as it was and the user tries again.
                if (!in_tty) fail(why);
                std::cerr << "shardlm: " << why << "; not sent, the conversation is unchanged\n";
                messages = before;
            }
        });
        broadcast_prompts(comm, turn_ids);
        if (turn_ids.empty()) break;
        const std::vector<int32_t>& ids = turn_ids[0];
        size_t shared = common_prefix(ids, cache_tokens);
        // A saved conversation holding more of this one than the cache does is loaded into it
        // (every rank alike: the choice depends on tokens alone). Not into a sliding-window ring.
        int64_t loaded = 0;
        if (capacity >= ctx_used) {
            size_t best = shared, which = 0;
            for (size_t i = 0; i < saved.size(); ++i) {
                const size_t n = std::min(common_prefix(ids, saved[i].tokens), ids.size() - 1);
                if (n > best) {
                    best = n;
                    which = i;
                }
            }
            if (best > shared && int64_t(best) >= kMinHostPrefix) {
                s->engine->load_kv(0, int64_t(best), saved[which].kv.data(), int64_t(saved[which].tokens.size()));
                cache_tokens.assign(saved[which].tokens.begin(), saved[which].tokens.begin() + std::ptrdiff_t(best));
                loaded = int64_t(best - shared);
                shared = best;
            }
        }
        // (Speculation writes up to --speculate proposals past the tokens kept.)
        const bool wrapped = capacity < ctx_used && int64_t(cache_tokens.size()) + speculate > capacity;
        go.cached = {wrapped ? 0 : int64_t(std::min(shared, ids.size() - 1))};
        go.sampler.seed = seed + turn;  // each turn draws afresh, reproducibly

        std::unique_ptr<StopMatcher> text;
        if (tok) text = std::make_unique<StopMatcher>(*tok, sampling.stops);
        size_t printed = 0;
        TokenCallback on_token;
        if (text)
            on_token = [&](size_t, int32_t id) {
                if (is_eos_id(s->cfg, id)) return;
                text->push(id);
                if (stream) {
                    std::cout << text->text().substr(printed, text->settled() - printed) << std::flush;
                    printed = text->settled();
                }
            };
        StopCheck stop_check;
        if (!sampling.stops.empty()) stop_check = [&](size_t, int32_t) { return text->stopped(); };
        const GenerateResult r = generate(*s->engine, {ids}, go, on_token, stop_check);
        const SequenceResult& q = r.seqs[0];
        // The cache now holds the prompt and every reply token but the last (sampled, never run).
        cache_tokens = ids;
        cache_tokens.insert(cache_tokens.end(), q.tokens.begin(), q.tokens.end() - 1);
        if (!root) continue;
        // A stop string completed by the decoder's held-back rest still ends the text there.
        const std::string reason = text->finish() ? "stop" : q.stop_reason;
        messages.push_back({"assistant", text->text()});
        const auto& t = r.timings;
        if (json_out) {
            nlohmann::ordered_json j;
            j["turn"] = turn + 1;
            j["prompt_tokens"] = ids.size();
            j["reused_tokens"] = go.cached[0];
            j["loaded_tokens"] = loaded;  // of them, from --prompt-cache's file
            j["dropped_turns"] = dropped;
            j["tokens"] = q.tokens;
            j["text"] = text->text();
            j["stop_reason"] = reason;
            j["prefill_ms"] = t.prefill_ms;
            j["decode_ms_per_token"] = t.decode_steps ? t.decode_ms / double(t.decode_steps) : 0.0;
            std::cout << j.dump() << std::endl;
        } else {
            std::cout << (stream ? text->text().substr(printed) : text->text()) << std::endl;
            if (dropped > 0) std::cerr << "(dropped the " << dropped << " oldest exchanges to fit --ctx " << ctx_used << ")\n";
        }
    }
    if (!prompt_cache.empty()) {
        // The conversation joins the saves (replacing those it holds whole), the least recent
        // going beyond the budget; nothing new (or nothing worth a save): the files stay.
        const size_t budget = size_t(cache_ram) << 20, per = s->engine->kv_position_bytes();
        const bool wrapped = capacity < ctx_used && int64_t(cache_tokens.size()) + speculate > capacity;
        const int64_t n = int64_t(cache_tokens.size());
        bool changed = !cache.used;
        const bool held = std::any_of(saved.begin(), saved.end(), [&](const SavedPrefix& p) {
            return common_prefix(cache_tokens, p.tokens) == cache_tokens.size();
        });
        if (!wrapped && n >= kMinHostPrefix && size_t(n) * per <= budget && !held) {
            SavedPrefix cur;
            cur.tokens = cache_tokens;
            cur.kv.resize(size_t(n) * per);
            s->engine->save_kv(0, n, cur.kv.data());
            saved.erase(std::remove_if(saved.begin(), saved.end(),
                                       [&](const SavedPrefix& p) { return common_prefix(p.tokens, cur.tokens) == p.tokens.size(); }),
                        saved.end());
            saved.push_back(std::move(cur));
            changed = true;
        }
        // Also a file saved under a larger --cache-ram is cut down to this one.
        size_t bytes = 0;
        for (const SavedPrefix& p : saved) bytes += p.kv.size();
        while (bytes > budget) {
            bytes -= saved.front().kv.size();
            saved.erase(saved.begin());
            changed = true;
        }
        save_prefix_cache(comm, cache, saved, changed);
    }
    return 0;
}

}  // namespace shardlm
