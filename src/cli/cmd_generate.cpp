// shardlm generate: prompts (text or ids) in, text and tokens out, JSON on request.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <limits>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/prefix_cache_file.h"
#include "comm/communicator.h"
#include "comm/together.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/mmap_file.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "tokenizer/fim.h"
#include "tokenizer/prompts.h"
#include "tokenizer/stop_strings.h"
#include "tokenizer/tokenizer.h"


namespace shardlm {

int cmd_generate(const Args& args, Communicator& comm) {
    po::options_description d("generate options");
    std::string model, prompt_ids, dump_logits, prompt_cache, suffix, chat_template;
    DraftFlags draftf;
    BackendFlags backend;
    PrecisionFlags prec;
    SamplingFlags sampling;
    const std::vector<std::string>& stops = sampling.stops;
    int64_t max_new = 64, ctx = 0, chunk = 256, sinks = 4, batch = 0, logprobs = -1, prompt_logprobs = -1, speculate = 0,
            min_new = 0, speculate_max_batch = 0, speculate_max_tokens = 8, cache_ram = 0;
    std::string overflow = "error";
    int threads = 0, tp = 0;
    d.add_options()
        ("help", "show this help")
        ("model", po::value(&model)->required(), "Hugging Face checkpoint folder (config.json + safetensors)")
        ("prompt", po::value<std::string>(), "prompt text (encoded with the model's tokenizer.json)")
        ("prompt-file", po::value<std::string>(), "file with one prompt per line (a batch)")
        ("chat", "wrap each text prompt in the model's chat template (chat_template.jinja or tokenizer_config.json)")
        ("system", po::value<std::string>(), "system message for --chat")
        ("no-thinking", "with --chat: the template's enable_thinking false (Qwen3: the reply opens with an empty "
                        "<think> block, so the model answers without reasoning first)")
        ("prompt-ids", po::value(&prompt_ids), "token ids, e.g. \"1,2,3;4,5\" (';' separates a batch)")
        ("suffix", po::value(&suffix),
         "fill in the middle: --prompt is the code before the gap, TEXT the code after it, and the model writes "
         "what goes between (a code model's FIM tokens: Qwen2.5-Coder, StarCoder, SmolLM, DeepSeek-Coder; the "
         "completions API's \"suffix\")")
        ("max-new-tokens", po::value(&max_new)->default_value(64), "tokens to generate per prompt")
        ("min-new-tokens", po::value(&min_new)->default_value(0),
         "the end-of-sequence tokens are banned until a sequence has this many (stop strings still apply)")
        ("ignore-eos", "an end-of-sequence token does not end a sequence (fixed-length benchmarks); it is left out of the text")
        ("batch", po::value(&batch)->default_value(0),
         "sequences run at once (KV-cache slots); further prompts wait and take the slot of one that "
         "ends (0: every prompt at once)")
        ("prefix-cache",
         "a prompt takes the free slot whose KV cache holds the longest start of it (left by a sequence "
         "that ended) and prefills only the rest: prompts that share a start, more of them than --batch")
        ("prompt-cache", po::value(&prompt_cache),
         "keys and values kept in FILE across runs (llama.cpp's --prompt-cache): a prompt that starts with a prefix "
         "an earlier run saved loads it instead of prefilling it, and every slot's prompt and tokens are saved there "
         "at the end (it implies --prefix-cache; under mpirun rank r keeps FILE.rank<r>; a file made with another model, "
         "weight or KV format, device or rank count is not used, and replaced)")
        ("cache-ram", po::value(&cache_ram),
         "MiB of host memory for saved prefixes per rank (the prefix cache's host tier, as serve --cache-ram; needs "
         "--prefix-cache or --prompt-cache; default with --prompt-cache: 1024, or half this rank's part of the free "
         "memory when that is less)")
        ("speculate", po::value(&speculate)->default_value(0),
         "speculative decoding by prompt lookup: each sequence verifies up to N tokens that followed an earlier "
         "occurrence of its last words, in one step: the same tokens (greedy or sampled with the same seed), "
         "fewer steps where the text repeats its context (0: off)")
        ("speculate-max-batch", po::value(&speculate_max_batch)->default_value(0),
         "--speculate only in steps with at most N decoding sequences (0: any; 1 suits a CPU, where verifying "
         "several sequences' proposals costs more than the steps it saves)")
        ("speculate-max-tokens", po::value(&speculate_max_tokens)->default_value(8),
         "--speculate: at most N tokens in a step that carries proposals, its decode tokens included, shared out "
         "among the decoding sequences: verifying costs little while a step fits the CUDA GEMVs' 8 token rows or a "
         "CPU's spare arithmetic (0: no limit but the step's)")
        ("ctx", po::value(&ctx)->default_value(0), "KV positions per sequence (0: longest prompt + max-new-tokens)")
        ("prefill-chunk", po::value(&chunk)->default_value(256), "prompt tokens per prefill step")
        ("context-overflow", po::value(&overflow)->default_value("error"),
         "a sequence that outgrows --ctx: error (refused up front), or slide (keep the first --sink-tokens "
         "positions, drop the older half of the rest, go on)")
        ("sink-tokens", po::value(&sinks)->default_value(4), "positions --context-overflow slide always keeps")
        ("threads", po::value(&threads)->default_value(0), "CPU threads per rank (0: one per core)")
        ("tp", po::value(&tp)->default_value(0), "expected tensor-parallel size: must equal the mpirun rank count (0: any)")
        ("json", "print one JSON object with results, timings and memory")
        ("logprobs", po::value(&logprobs),
         "with --json: each generated token's log-probability (log-softmax of its logits row, after any "
         "penalties, at temperature 1) and the N most probable tokens' (0: the token's only)")
        ("prompt-logprobs", po::value(&prompt_logprobs),
         "with --json: the same for every prompt token after the first (from the logits before it, without "
         "penalties); --max-new-tokens may then be 0, scoring the prompts alone")
        ("dump-logits", po::value(&dump_logits),
         "write the logits at each prompt's last position to FILE (after any token penalties)");
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
    std::vector<std::vector<int32_t>> prompts;
    std::unique_ptr<Tokenizer> tok;  // rank 0 for text prompts, every rank for --stop (loaded only when needed)
    std::unique_ptr<JsonVocab> json_vocab;  // --json-object, --json-schema
    GenerateOptions go;
    FimTokens fill;  // --suffix
    auto is_stop_id = [&](int32_t id) { return std::find(go.stop_ids.begin(), go.stop_ids.end(), id) != go.stop_ids.end(); };
    // Phase 1, no collectives inside: flags and the request (rank 0 reads it).
    run_together(comm, [&] {
        help = !parse_args(args, d, vm, "usage: shardlm generate --model DIR (--prompt TEXT | --prompt-file F | --prompt-ids IDS) [--chat [--system TEXT]] [flags]", root);
        if (help) return;
        const size_t sources = vm.count("prompt") + vm.count("prompt-file") + vm.count("prompt-ids");
        if (sources == 0) fail("a prompt is required: --prompt TEXT, --prompt-file F or --prompt-ids IDS");
        if (sources > 1) fail("--prompt, --prompt-file and --prompt-ids exclude each other");
        if (vm.count("prompt-ids") && (vm.count("chat") || vm.count("system")))
            fail("--chat/--system apply to text prompts (--prompt, --prompt-file), not to --prompt-ids");
        if (vm.count("system") && !vm.count("chat")) fail("--system needs --chat");
        if (vm.count("chat-template") && !vm.count("chat")) fail("--chat-template needs --chat");
        if (vm.count("no-thinking") && !vm.count("chat")) fail("--no-thinking needs --chat");
        SessionOptions check_flags;
        apply_backend(backend, check_flags);  // validates --device and --attention on every rank
        apply_precision(prec, check_flags);   // and --weights, --kv, --group-size, --keep-fp16
        if (max_new < (vm.count("prompt-logprobs") ? 0 : 1))
            fail("--max-new-tokens must be at least 1 (0 with --prompt-logprobs: the prompts are scored)");
        if (chunk < 1) fail("--prefill-chunk must be at least 1");
        if (batch < 0) fail("--batch must be >= 0");
        if (vm.count("logprobs") && !vm.count("json")) fail("--logprobs needs --json (they are reported there)");
        if (vm.count("logprobs") && logprobs < 0) fail("--logprobs must be >= 0");
        go.logprobs = vm.count("logprobs") ? logprobs : -1;
        if (vm.count("prompt-logprobs") && !vm.count("json")) fail("--prompt-logprobs needs --json (they are reported there)");
        if (vm.count("prompt-logprobs") && prompt_logprobs < 0) fail("--prompt-logprobs must be >= 0");
        go.prompt_logprobs = vm.count("prompt-logprobs") ? prompt_logprobs : -1;
        go.reuse_prefix = vm.count("prefix-cache") > 0 || vm.count("prompt-cache") > 0;
        if (vm.count("cache-ram")) {
            if (cache_ram < 0 || cache_ram > (int64_t(1) << 40)) fail("--cache-ram must be in [0, 2^40] MiB");
            if (!go.reuse_prefix) fail("--cache-ram is the prefix cache's host tier: it needs --prefix-cache or --prompt-cache");
            if (cache_ram == 0 && !prompt_cache.empty()) fail("--prompt-cache keeps its prefixes in the host tier: --cache-ram 0 leaves it none");
        }
        if (vm.count("prompt-cache")) check_prefix_cache_path(prompt_cache, "--prompt-cache", comm.rank());
        if (speculate < 0 || speculate > kMaxSpeculate) fail("--speculate must be in [0, ", kMaxSpeculate, "]");
        go.speculate = speculate;
        check_draft_flags(draftf, vm);
        go.draft_p_min = draftf.p_min;
        if (speculate_max_batch < 0) fail("--speculate-max-batch must be >= 0");
        if (speculate_max_tokens < 0) fail("--speculate-max-tokens must be >= 0");
        go.speculate_max_batch = speculate_max_batch;
        go.speculate_max_tokens = speculate_max_tokens;
        go.ignore_eos = vm.count("ignore-eos") > 0;
        go.min_new_tokens = min_new;
        if (ctx < 0) fail("--ctx must be >= 0");
        check_tp_flag(tp, comm);
        set_threads(threads);
        go.max_new_tokens = max_new;
        go.prefill_chunk = chunk;
        apply_generation_defaults(sampling, vm, model, "generate", root);
        go.sampler = apply_sampling(sampling);  // validates the sampling flags on every rank
        go.keep_prompt_logits = !dump_logits.empty();
        if (overflow != "error" && overflow != "slide")
            fail("--context-overflow: unknown value \"", overflow, "\" (supported: error, slide)");
        go.slide = overflow == "slide";
        go.sink_tokens = sinks;
        // Every rank decides where a sequence stops (and in JSON mode what it may choose), so
        // every rank reads the text.
        go.json = apply_json(json_flags);
        const bool json_mode = go.json != nullptr;
        const bool fim = vm.count("suffix") > 0;  // every rank stops at the FIM separators
        if (fim && !vm.count("prompt")) fail("--suffix fills in the middle after --prompt TEXT (the code before the gap): it needs --prompt");
        if (fim && vm.count("chat")) fail("--suffix and --chat exclude each other (a fill-in-the-middle prompt is no chat)");
        if ((!stops.empty() || json_mode || fim) && !Tokenizer::exists(model))
            fail(json_mode ? json_flag(json_flags) : fim ? "--suffix" : "--stop", " needs the model's tokenizer: ", model,
                 "/tokenizer.json does not exist");
        if (!stops.empty() || json_mode || fim) tok = std::make_unique<Tokenizer>(Tokenizer::load(model, chat_template_override(chat_template)));
        if (fim) {
            fill = fim_tokens(*tok);
            if (!fill.family)
                fail("--suffix (fill in the middle): ", model, "/tokenizer.json has no FIM tokens (", fim_families_known(), ")");
            go.stop_ids = fill.stops;
        }
        if (json_mode) json_vocab = std::make_unique<JsonVocab>(json_token_bytes(*tok));
        go.json_vocab = json_vocab.get();
        if (!root) return;
        if (!dump_logits.empty()) {  // before the load and the run, not after them
            const std::string why = unwritable_reason(dump_logits);
            if (!why.empty()) fail("--dump-logits: cannot write ", dump_logits, ": ", why);
        }
        if (vm.count("prompt-ids")) {
            prompts = parse_prompt_ids(prompt_ids);
            return;
        }
        // Text prompts: rank 0 tokenizes and the ids travel like --prompt-ids.
        if (!tok) tok = std::make_unique<Tokenizer>(Tokenizer::load(model, chat_template_override(chat_template)));
        const std::vector<TextPrompt> texts = vm.count("prompt")
            ? std::vector<TextPrompt>{{vm["prompt"].as<std::string>(), "--prompt"}}
            : read_prompt_file(vm["prompt-file"].as<std::string>());
        ChatOptions chat;
        chat.chat = vm.count("chat") > 0;
        if (vm.count("system")) chat.system = vm["system"].as<std::string>();
        if (vm.count("no-thinking")) {
            if (!tok->chat_thinking_switch())
                fail("--no-thinking: this model's chat template has no enable_thinking switch (Qwen3's)");
            chat.kwargs.enable_thinking = false;
        }
        prompts = fill.family ? std::vector<std::vector<int32_t>>{encode_fim(*tok, fill, texts[0].text, suffix)}
                              : encode_prompts(*tok, texts, chat);
    });
    if (help) return 0;
    const bool json_out = vm.count("json") > 0;
    broadcast_prompts(comm, prompts);

    SessionOptions so;
    so.model_dir = model;
    apply_precision(prec, so);
    apply_backend(backend, so);
    so.max_batch = batch == 0 ? int64_t(prompts.size()) : std::min(batch, int64_t(prompts.size()));
    so.prefill_chunk = chunk;
    if (go.prompt_logprobs >= 0) set_scoring_rows(so);
    set_speculation_rows(so, go.speculate);
    int64_t longest = 0;
    for (const auto& p : prompts) longest = std::max<int64_t>(longest, int64_t(p.size()));
    // --ctx 0: the longest prompt + --max-new-tokens (saturating: a huge --max-new-tokens must not wrap).
    const bool auto_ctx = ctx == 0;
    so.ctx = !auto_ctx ? ctx : max_new > std::numeric_limits<int64_t>::max() - longest ? std::numeric_limits<int64_t>::max()
                                                                                        : longest + max_new;
    if (auto_ctx) so.ctx_origin = "the longest prompt (" + std::to_string(longest) + " tokens) + --max-new-tokens " +
                                  std::to_string(max_new);
    go.ctx_origin = so.ctx_origin;
    std::unique_ptr<Session> s, ds;  // the model, and --draft-model's
    // Phase 2: every rank loads its shard.
    run_together(comm, [&] {
        maybe_inject_failure(comm, "load");
        // Everything the flags, prompts and config decide is checked before the weights load
        // (seconds on a real model), so a bad flag costs no load.
        const ModelConfig cfg = load_config(model);
        const int64_t max_pos = cfg.max_position;
        if (auto_ctx) {  // check_context would blame a --ctx that was never given
            if (max_pos > 0 && longest > max_pos)
                fail("the longest prompt has ", longest, " tokens, more than the model's max_position_embeddings ", max_pos);
            if (max_pos > 0 && so.ctx > max_pos)
                fail("the longest prompt (", longest, " tokens) with --max-new-tokens ", max_new,
                     " needs more than the model's max_position_embeddings ", max_pos,
                     " positions (lower --max-new-tokens, or set --ctx with --context-overflow slide)");
        }
        check_context(cfg, so);
        so.max_penalties = max_penalties(go.sampler, so.ctx, cfg.vocab, go.slide,
                                         go.min_new_tokens > 0 ? int64_t(cfg.eos_ids.size() + go.stop_ids.size()) : 0);
        check_generate(cfg, engine_options(so), prompts, go,
                       vm.count("prompt-ids") ? "--prompt-ids" : "tokenizer and model disagree");
        if (!draftf.model.empty()) check_draft_model(draftf.model, so, go.speculate);
        s = open_session(so, comm);
        if (!draftf.model.empty()) {
            ds = open_draft_session(draftf.model, so, comm);
            go.draft = ds->engine.get();
        }
        // The host tier fills up as prefixes leave the slots: a budget the memory left after
        // loading cannot back is refused, and the default stays within half of it.
        const HostMemory avail = host_memory_available();
        const size_t share = avail.bytes == SIZE_MAX ? SIZE_MAX : avail.bytes / size_t(s->engine->options().ranks_on_node);
        if (vm.count("cache-ram")) {
            if (share != SIZE_MAX && size_t(cache_ram) << 20 > share)
                fail("--cache-ram ", cache_ram, " MiB is more than this rank's part of the host memory left after loading: ",
                     share >> 20, " MiB (", avail.source, ")");
            go.host_cache_bytes = size_t(cache_ram) << 20;
        } else if (!prompt_cache.empty()) {
            go.host_cache_bytes = std::min(size_t(1024) << 20, share / 2);
        }
    });
    // Phase 3: the ranks must be running the same request on the same model with the same build.
    run_together(comm, [&] { check_same_request(comm, args, *s); });
    // --prompt-cache: what earlier runs saved joins the host tier, and the tier is saved after.
    PrefixCacheFile cache;
    if (!prompt_cache.empty()) {
        cache = open_prefix_cache(comm, *s, so, prompt_cache, "--prompt-cache");
        go.host_saves = &cache.saved;
    }

    // One text prompt, stdout a terminal, no --json: the text is printed as it forms, never a
    // broken character (the stopping EOS is not printed), nor what may yet be a stop string's start.
    const bool text_prompts = vm.count("prompt-ids") == 0;
    const bool stream = root && text_prompts && !json_out && prompts.size() == 1 && ::isatty(STDOUT_FILENO);
    // Each sequence's text as it forms, where it is streamed or checked for --stop strings.
    // A completion's text continues its prompt's (SentencePiece's leading space kept, as vLLM's
    // completions give it); a chat reply is a message of its own.
    DecodeOptions decode;
    decode.continuation = vm.count("chat") == 0;
    std::vector<StopMatcher> texts;
    if (stream || !stops.empty())
        for (size_t i = 0; i < prompts.size(); ++i) texts.emplace_back(*tok, stops, decode);
    size_t printed = 0;
    auto print_settled = [&] {
        const StopMatcher& m = texts[0];
        std::cout << m.text().substr(printed, m.settled() - printed) << std::flush;
        printed = m.settled();
    };
    TokenCallback on_token;
    StopCheck stop_check;
    if (!texts.empty()) {
        on_token = [&](size_t i, int32_t id) {
            if (is_eos_id(s->cfg, id) || is_stop_id(id)) return;
            texts[i].push(id);
            if (stream) print_settled();
        };
    }
    if (!stops.empty()) stop_check = [&](size_t i, int32_t) { return texts[i].stopped(); };
    const GenerateResult r = generate(*s->engine, prompts, go, on_token, stop_check);
    if (!prompt_cache.empty())  // (the saves are the same on every rank, and so is this choice)
        save_prefix_cache(comm, cache, cache.saved, !cache.used || r.timings.host_saves > 0);
    if (!root) return 0;
    // A stop string completed by the decoder's held-back rest still ends the text there.
    std::vector<std::string> stop_reasons;
    for (size_t i = 0; i < r.seqs.size(); ++i)
        stop_reasons.push_back(!texts.empty() && texts[i].finish() ? "stop" : r.seqs[i].stop_reason);
    // The generated text: the streamed/checked text where there is one, else decoded now.
    auto text_of = [&](size_t i) {
        if (!texts.empty()) return texts[i].text();
        std::vector<int32_t> ids = r.seqs[i].tokens;  // (--ignore-eos: end-of-sequence ids are not text)
        if (go.ignore_eos) ids.erase(std::remove_if(ids.begin(), ids.end(), [&](int32_t t) { return is_eos_id(s->cfg, t); }), ids.end());
        if (!ids.empty() && is_stop_id(ids.back())) ids.pop_back();  // a FIM separator is no text
        return generated_text(*tok, ids, r.seqs[i].stop_reason == "eos", decode);
    };
    // With --prompt-ids the text is given too when the folder has a tokenizer that loads; its
    // absence (or an unsupported one) leaves "text" null as before.
    if (!tok && Tokenizer::exists(model)) {
        try {
            tok = std::make_unique<Tokenizer>(Tokenizer::load(model, chat_template_override(chat_template)));
        } catch (const Error&) {
        }
    }

    if (!dump_logits.empty()) {
        std::ofstream f(dump_logits);
        if (!f) fail("--dump-logits: cannot write ", dump_logits);
        nlohmann::json arr = nlohmann::json::array();
        for (const auto& q : r.seqs) arr.push_back(q.prompt_logits);
        f << arr.dump() << "\n";
        if (!f) fail("--dump-logits: write to ", dump_logits, " failed");
    }
    const auto& t = r.timings;
    const double decode_per_tok = t.decode_steps ? t.decode_ms / double(t.decode_steps) : 0.0;
    int64_t generated = 0;
    for (const SequenceResult& q : r.seqs) generated += int64_t(q.tokens.size());
    const double generated_per_s = t.total_ms > 0 ? 1000.0 * double(generated) / t.total_ms : 0.0;
    auto summary = [&] {
        std::cerr << "prefill: " << t.prefill_tokens << " tokens in " << t.prefill_ms << " ms; decode: "
                  << decode_per_tok << " ms/token over " << t.decode_steps << " steps";
        if (t.context_shifts > 0) std::cerr << "; " << t.context_shifts << " context shifts";
        if (go.speculate > 0)
            std::cerr << "; speculation: " << t.accepted_tokens << " of " << t.draft_tokens << " proposed tokens accepted";
        if (ds) std::cerr << " (the draft model's steps " << t.draft_ms << " ms of it)";
        std::cerr << "; " << generated << " tokens generated in " << t.total_ms << " ms (" << generated_per_s
                  << " tokens/s)";
        std::cerr << "\n";
    };
    if (json_out) {
        nlohmann::ordered_json j;
        j["results"] = nlohmann::json::array();
        for (size_t i = 0; i < r.seqs.size(); ++i) {
            const SequenceResult& q = r.seqs[i];
            nlohmann::ordered_json e;
            e["prompt_tokens"] = q.prompt.size();
            e["cached_tokens"] = q.cached_tokens;  // of them, taken from the cache (--prefix-cache)
            e["tokens"] = q.tokens;
            // Generated tokens without the stopping EOS (and cut before a stop string); null when
            // there is no tokenizer.
            e["text"] = tok ? nlohmann::json(text_of(i)) : nlohmann::json();
            e["stop_reason"] = stop_reasons[i];
            auto entries = [](const std::vector<TokenLogprobs>& v, nlohmann::ordered_json lps) {
                auto entry = [](const Logprob& l) { return nlohmann::ordered_json{{"id", l.id}, {"logprob", l.logprob}}; };
                for (const TokenLogprobs& t : v) {
                    nlohmann::ordered_json x = entry(t.token);
                    x["top"] = nlohmann::json::array();
                    for (const Logprob& l : t.top) x["top"].push_back(entry(l));
                    lps.push_back(x);
                }
                return lps;
            };
            if (go.logprobs >= 0) e["logprobs"] = entries(q.logprobs, nlohmann::json::array());
            // The first prompt token has nothing before it: null.
            if (go.prompt_logprobs >= 0) e["prompt_logprobs"] = entries(q.prompt_logprobs, nlohmann::json::array({nullptr}));
            j["results"].push_back(e);
        }
        j["timings"] = {{"load_ms", s->load_ms},
                        {"prefill_ms", t.prefill_ms},
                        {"decode_ms_per_token", decode_per_tok},
                        {"prefill_tokens_per_s", t.prefill_ms > 0 ? 1000.0 * double(t.prefill_tokens) / t.prefill_ms : 0.0},
                        {"decode_tokens_per_s", t.decode_ms > 0 ? 1000.0 * double(t.decode_tokens) / t.decode_ms : 0.0},
                        {"total_ms", t.total_ms},
                        {"generated_tokens_per_s", generated_per_s},
                        {"decode_steps", t.decode_steps},
                        {"draft_tokens", t.draft_tokens},
                        {"accepted_tokens", t.accepted_tokens},
                        {"host_loads", t.host_loads},     // prefixes loaded from the host tier (--prompt-cache, --cache-ram)
                        {"host_tokens", t.host_tokens}};  // the prompt tokens those loads spared
        if (ds) j["timings"]["draft_ms"] = t.draft_ms;  // --draft-model's steps, within prefill_ms and decode_ms
        j["batch"] = so.max_batch;
        j["memory"] = {{"weights_bytes", s->engine->weight_bytes()},
                       {"kv_cache_bytes", s->engine->kv_bytes()},
                       {"workspace_bytes", s->engine->workspace_bytes()},
                       {"peak_bytes", peak_rss_bytes()}};
        j["tp"] = comm.size();
        j["device"] = s->engine->device().rfind("cuda", 0) == 0 ? "cuda" : "cpu";
        j["weights"] = weight_format_name(s->weights.format);
        j["kv"] = kv_name(s->engine->options().kv);
        std::cout << j.dump() << std::endl;
    } else if (text_prompts) {
        if (stream) {
            print_settled();
            std::cout << std::endl;
        } else {
            for (size_t i = 0; i < r.seqs.size(); ++i) {
                if (r.seqs.size() > 1) std::cout << "[" << i << "] ";
                std::cout << text_of(i) << "\n";
            }
        }
        for (size_t i = 0; i < r.seqs.size(); ++i)
            std::cerr << "[" << i << "] " << r.seqs[i].prompt.size() << " prompt tokens, " << r.seqs[i].tokens.size()
                      << " generated, stop: " << stop_reasons[i] << "\n";
        summary();
    } else {
        for (size_t i = 0; i < r.seqs.size(); ++i) {
            std::cout << "[" << i << "]";
            for (int32_t id : r.seqs[i].tokens) std::cout << ' ' << id;
            std::cout << "  (" << stop_reasons[i] << ")\n";
        }
        summary();
    }
    return 0;
}

}  // namespace shardlm
