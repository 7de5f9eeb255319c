// shardlm embed: the embedding of each input (runtime/embed.h), pooled as the model folder's
// sentence-transformers files say, printed one vector per line or as JSON.
#include <chrono>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/pooling_flags.h"
#include "comm/together.h"
#include "core/error.h"
#include "runtime/embed.h"
#include "runtime/session.h"
#include "tokenizer/prompts.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

int cmd_embed(const Args& args, Communicator& comm) {
    po::options_description d("embed options");
    std::string model, prompt_name, pooling;
    PoolingFlags in;
    PrecisionFlags prec;
    BackendFlags backend;
    int64_t dimensions = 0;
    int threads = 0, tp = 0;
    d.add_options()
        ("help", "show this help")
        ("model", po::value(&model)->required(), "checkpoint folder (with sentence-transformers' modules.json, if any)")
        ("prompt-name", po::value(&prompt_name),
         "put config_sentence_transformers.json's prompt of this name before each text (e.g. \"query\"; default: its "
         "default_prompt_name, if any)")
        ("pooling", po::value(&pooling),
         "last, mean or cls (default: the folder's Pooling module, else last: the last token's state)")
        ("normalize", "L2-normalize each vector (default: when modules.json has a Normalize module, or has none)")
        ("no-normalize", "do not normalize")
        ("dimensions", po::value(&dimensions)->default_value(0), "keep the first N dimensions (Matryoshka models; 0: all)")
        ("threads", po::value(&threads)->default_value(0), "CPU threads per rank (0: one per core)")
        ("tp", po::value(&tp)->default_value(0), "expected tensor-parallel size: must equal the mpirun rank count (0: any)")
        ("json", "print one JSON object: the vectors with their token counts and the time");
    add_pooling_options(d, in);
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
        check_pooling_flags(vm, in);
        if (vm.count("normalize") && vm.count("no-normalize")) fail("--normalize and --no-normalize exclude each other");
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
        eo.chunk = in.chunk;
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
            inputs = parse_prompt_ids(in.ids);
            return;
        }
        std::vector<TextPrompt> ps = text_inputs(vm, in);
        for (TextPrompt& p : ps) p.text = prefix + p.text;
        inputs = encode_prompts(input_tokenizer(model), ps, ChatOptions{});
    });
    if (help) return 0;
    broadcast_prompts(comm, inputs);

    const SessionOptions so = pooling_session(model, in, prec, backend, inputs);
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
    for (const auto& ids : inputs) tokens += int64_t(ids.size());
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
