// shardlm embed: the embedding of each input (runtime/embed.h), pooled as the model folder's
// sentence-transformers files say, printed one vector per line or as JSON.
#include <chrono>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "comm/together.h"
#include "core/error.h"
#include "runtime/embed.h"
#include "runtime/session.h"
#include "tokenizer/prompts.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

int cmd_embed(const Args& args, Communicator& comm) {
    po::options_description d("embed options");
    std::string model, prompt_ids, prompt_name, pooling;
    std::vector<std::string> texts;
    PrecisionFlags prec;
    BackendFlags backend;
    int64_t ctx = 0, batch = 0, chunk = 256, dimensions = 0;
    int threads = 0, tp = 0;
    d.add_options()
        ("help", "show this help")
        ("model", po::value(&model)->required(), "checkpoint folder (with sentence-transformers' modules.json, if any)")
        ("prompt", po::value(&texts), "an input text (repeatable; encoded with the model's tokenizer.json)")
        ("prompt-file", po::value<std::string>(), "file with one input text per line")
        ("prompt-ids", po::value(&prompt_ids), "token ids, e.g. \"1,2,3;4,5\" (';' separates inputs)")
        ("prompt-name", po::value(&prompt_name),
         "put config_sentence_transformers.json's prompt of this name before each text (e.g. \"query\"; default: its "
         "default_prompt_name, if any)")
        ("pooling", po::value(&pooling),
         "last, mean or cls (default: the folder's Pooling module, else last: the last token's state)")
        ("normalize", "L2-normalize each vector (default: when modules.json has a Normalize module, or has none)")
        ("no-normalize", "do not normalize")
        ("dimensions", po::value(&dimensions)->default_value(0), "keep the first N dimensions (Matryoshka models; 0: all)")
        ("ctx", po::value(&ctx)->default_value(0), "positions per input (0: the longest input)")
        ("batch", po::value(&batch)->default_value(0), "inputs run side by side (0: all, at most 16)")
        ("prefill-chunk", po::value(&chunk)->default_value(256), "tokens of one input per forward step")
        ("threads", po::value(&threads)->default_value(0), "CPU threads per rank (0: one per core)")
        ("tp", po::value(&tp)->default_value(0), "expected tensor-parallel size: must equal the mpirun rank count (0: any)")
        ("json", "print one JSON object: the vectors with their token counts and the time");
    add_precision_options(d, prec);
    add_backend_options(d, backend);
    po::variables_map vm;
    const bool root = comm.rank() == 0;
    bool help = false;
    std::vector<std::vector<int32_t>> inputs;
    EmbedOptions eo;
    run_together(comm, [&] {
        help = !parse_args(args, d, vm, "usage: shardlm embed --model DIR (--prompt TEXT... | --prompt-file F | --prompt-ids IDS) [flags]", root);
        if (help) return;
        const size_t sources = (texts.empty() ? 0 : 1) + vm.count("prompt-file") + vm.count("prompt-ids");
        if (sources == 0) fail("an input is required: --prompt TEXT, --prompt-file F or --prompt-ids IDS");
        if (sources > 1) fail("--prompt, --prompt-file and --prompt-ids exclude each other");
        if (vm.count("normalize") && vm.count("no-normalize")) fail("--normalize and --no-normalize exclude each other");
        if (batch < 0) fail("--batch must be >= 0");
        if (chunk < 1) fail("--prefill-chunk must be at least 1");
        if (ctx < 0) fail("--ctx must be >= 0");
        if (dimensions < 0) fail("--dimensions must be >= 0");
        SessionOptions check_flags;
        apply_precision(prec, check_flags);
        apply_backend(backend, check_flags);
        check_tp_flag(tp, comm);
        set_threads(threads);
        const EmbeddingConfig ec = load_embedding_config(model);
        eo.pooling = vm.count("pooling") ? parse_pooling(pooling) : ec.pooling;
        eo.normalize = vm.count("normalize") ? true : vm.count("no-normalize") ? false : ec.normalize;
        eo.dimensions = dimensions;
        eo.chunk = chunk;
        std::string prefix = ec.default_prompt;
        if (vm.count("prompt-name")) {
            if (vm.count("prompt-ids")) fail("--prompt-name applies to text inputs, not to --prompt-ids");
            auto it = ec.prompts.find(prompt_name);
            if (it == ec.prompts.end()) {
                std::string names;
                for (const auto& [n, t] : ec.prompts) names += (names.empty() ? "" : ", ") + n;
                fail("--prompt-name \"", prompt_name, "\": ", model, "/config_sentence_transformers.json has ",
                     names.empty() ? std::string("no prompts") : "the prompts " + names);
            }
            prefix = it->second;
        }
        if (!root) return;
        if (vm.count("prompt-ids")) {
            inputs = parse_prompt_ids(prompt_ids);
            return;
        }
        if (!Tokenizer::exists(model)) fail("text inputs need the model's tokenizer: ", model, "/tokenizer.json does not exist");
        const Tokenizer tok = Tokenizer::load(model);
        std::vector<TextPrompt> ps;
        if (vm.count("prompt-file")) ps = read_prompt_file(vm["prompt-file"].as<std::string>());
        else
            for (const std::string& t : texts) ps.push_back({t, "--prompt"});
        for (TextPrompt& p : ps) p.text = prefix + p.text;
        inputs = encode_prompts(tok, ps, ChatOptions{});
    });
    if (help) return 0;
    broadcast_prompts(comm, inputs);

    SessionOptions so;
    so.model_dir = model;
    apply_precision(prec, so);
    apply_backend(backend, so);
    so.load.headless_ok = true;  // an embedding checkpoint may have no lm_head
    so.max_batch = batch == 0 ? std::min<int64_t>(int64_t(inputs.size()), 16) : std::min(batch, int64_t(inputs.size()));
    so.prefill_chunk = chunk;
    // Mean pooling reads every token's state: a chunk's worth of rows per step.
    so.max_logit_rows = eo.pooling == Pooling::Mean ? std::max(so.max_batch, chunk) : so.max_batch;
    int64_t longest = 0;
    for (const auto& in : inputs) longest = std::max<int64_t>(longest, int64_t(in.size()));
    so.ctx = ctx > 0 ? ctx : std::max<int64_t>(longest, 1);
    if (ctx == 0) so.ctx_origin = "the longest input (" + std::to_string(longest) + " tokens)";
    std::unique_ptr<Session> s;
    run_together(comm, [&] {
        maybe_inject_failure(comm, "load");
        const ModelConfig cfg = load_config(model);
        check_context(cfg, so);
        if (dimensions > cfg.hidden) fail("--dimensions ", dimensions, " exceeds the model's hidden size ", cfg.hidden);
        check_embed_inputs(cfg, engine_options(so), inputs, eo);  // before the weights load
        s = open_session(so, comm);
    });
    run_together(comm, [&] { check_same_request(comm, args, *s); });
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::vector<float>> vecs;
    run_together(comm, [&] { vecs = embed(*s->engine, inputs, eo); });
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!root) return 0;
    int64_t tokens = 0;
    for (const auto& in : inputs) tokens += int64_t(in.size());
    if (vm.count("json")) {
        nlohmann::ordered_json j;
        j["pooling"] = pooling_name(eo.pooling);
        j["normalized"] = eo.normalize;
        j["dimensions"] = vecs.empty() ? 0 : vecs[0].size();
        j["tokens"] = tokens;
        j["load_ms"] = s->load_ms;
        j["embed_ms"] = ms;
        j["data"] = nlohmann::ordered_json::array();
        for (size_t i = 0; i < vecs.size(); ++i)
            j["data"].push_back({{"index", i}, {"tokens", inputs[i].size()}, {"embedding", vecs[i]}});
        std::cout << j.dump() << std::endl;
        return 0;
    }
    for (const std::vector<float>& v : vecs) {
        std::string line;
        char buf[32];
        for (size_t h = 0; h < v.size(); ++h) {
            std::snprintf(buf, sizeof buf, h ? " %.9g" : "%.9g", double(v[h]));
            line += buf;
        }
        std::cout << line << "\n";
    }
    std::cout.flush();
    std::fprintf(stderr, "shardlm embed: %zu inputs, %lld tokens, %s pooling%s, %.1f ms\n", vecs.size(), (long long)tokens,
                 pooling_name(eo.pooling), eo.normalize ? ", normalized" : "", ms);
    return 0;
}

}  // namespace shardlm
