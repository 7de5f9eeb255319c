// shardlm perplexity: teacher-forced NLL of a token file in windows of --ctx, and with
// --compare-weights/--compare-kv the distance of this precision from a reference precision.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "comm/together.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/perplexity.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

namespace {

// Token ids separated by whitespace or commas.
std::vector<int32_t> read_ids_file(const std::string& path) {
    std::string text = read_text_file(path);
    for (char& ch : text)
        if (ch == ',') ch = ' ';
    std::istringstream in(text);
    std::vector<int32_t> ids;
    std::string tok;
    while (in >> tok) {
        if (tok.size() > 9 || tok.find_first_not_of("0123456789") != std::string::npos)
            fail(path, ": \"", tok.substr(0, 16), "\" is not a token id");
        ids.push_back(int32_t(std::stol(tok)));
    }
    return ids;
}

}  // namespace

int cmd_perplexity(const Args& args, Communicator& comm) {
    po::options_description d("perplexity options");
    std::string model, ids_file, text_file, cmp_weights, cmp_kv;
    PrecisionFlags prec;
    BackendFlags backend;
    int64_t ctx = 512, chunk = 64;
    int threads = 0;
    d.add_options()
        ("help", "show this help")
        ("model", po::value(&model)->required(), "checkpoint folder")
        ("text-file", po::value(&text_file), "UTF-8 text, encoded with the model's tokenizer.json")
        ("ids-file", po::value(&ids_file), "token ids separated by spaces, commas or newlines")
        ("ctx", po::value(&ctx)->default_value(512), "tokens per window")
        ("prefill-chunk", po::value(&chunk)->default_value(64), "tokens per forward step")
        ("compare-weights", po::value(&cmp_weights), "reference weights precision to compare against")
        ("compare-kv", po::value(&cmp_kv), "reference KV precision to compare against")
        ("per-layer", "with an INT8 --weights: quantize one layer at a time and report each one's distance "
                      "from the reference (per-layer sensitivity, to choose --keep-fp16)")
        ("threads", po::value(&threads)->default_value(0), "CPU threads per rank (0: one per core)")
        ("json", "print one JSON object");
    add_precision_options(d, prec);
    add_backend_options(d, backend);
    po::variables_map vm;
    const bool root = comm.rank() == 0;
    bool help = false;
    std::vector<int32_t> tokens;
    run_together(comm, [&] {
        help = !parse_args(args, d, vm, "usage: shardlm perplexity --model DIR (--text-file F | --ids-file F) [--ctx N]", root);
        if (help) return;
        if (vm.count("ids-file") == vm.count("text-file")) fail("give one of --text-file or --ids-file");
        check_perplexity_options({ctx, chunk});
        SessionOptions check_flags;  // the precision and backend flags, on every rank, before any load
        apply_precision(prec, check_flags);
        apply_backend(backend, check_flags);
        set_threads(threads);
        if (vm.count("per-layer")) {  // before the loader's "--weights auto, int8 or w8a8" for the fp32 reference
            const ModelConfig c = load_config(model);
            if (c.quant.present)
                fail("--per-layer quantizes one layer at a time from float weights and needs a float checkpoint; ", model,
                     " is pre-quantized (", c.quant.format, ")");
        }
        if (root && !ids_file.empty()) tokens = read_ids_file(ids_file);
        // The reference precisions are checked here, under their own flag names, before any load.
        auto as_flag = [](const char* flag, const char* shared, const auto& parse) {
            try {
                parse();
            } catch (const Error& e) {
                const std::string m = e.what();
                fail(m.rfind(shared, 0) == 0 ? flag + m.substr(std::string(shared).size()) : m);
            }
        };
        if (vm.count("compare-weights")) {
            as_flag("--compare-weights", "--weights", [&] { parse_weight_format(cmp_weights); });
            // The reference loads the same folder: before the loader's "use --weights ..." for it.
            const WeightFormat f = parse_weight_format(cmp_weights);
            const ModelConfig c = load_config(model);
            const bool int4 = c.quant.format == "int4" || c.quant.format == "w4a8";
            if (c.quant.present && !is_quantized(f) && f != WeightFormat::Auto)
                fail("--compare-weights ", cmp_weights, " needs float weights for the reference run; ", model,
                     " is pre-quantized (", c.quant.format, "): compare on the float checkpoint it was quantized from");
            if (c.quant.present && is_quantized(f) && (int4 ? !is_int4(f) : !is_int8(f)))
                fail("--compare-weights ", cmp_weights, ": ", model, " is pre-quantized (", c.quant.format,
                     ") and loads only as auto, ", int4 ? "int4 or w4a8" : "int8 or w8a8");
        }
        if (vm.count("compare-kv")) as_flag("--compare-kv", "--kv", [&] { parse_kv_format(cmp_kv); });
        if (root && !text_file.empty()) {
            const Tokenizer tok = Tokenizer::load(model);
            const std::string text = read_text_file(text_file);
            try {
                tokens = tok.encode(text);
            } catch (const Error& e) {
                fail(text_file, ": ", e.what());  // e.g. invalid UTF-8, which the encoder reports without the file
            }
        }
    });
    if (help) return 0;
    uint64_t n = tokens.size();
    comm.broadcast(&n, sizeof n, 0);
    tokens.resize(n);
    comm.broadcast(tokens.data(), n * sizeof(int32_t), 0);
    const bool per_layer = vm.count("per-layer") > 0;
    const bool compare = per_layer || vm.count("compare-weights") || vm.count("compare-kv");
    if (per_layer && !is_quantized(parse_weight_format(prec.weights)))
        throw AgreedError("--per-layer needs --weights int8, w8a8, int4 or w4a8");

    // A comparison's reference in a float format (or auto) runs without the quantization flags.
    auto options = [&](const std::string& w, const std::string& k, bool reference) {
        SessionOptions so;
        so.model_dir = model;
        PrecisionFlags f = prec;
        f.weights = w;
        f.kv = k;
        if (reference && !is_quantized(parse_weight_format(w))) f.keep_fp16.clear(), f.group_size = 0;
        apply_precision(f, so);
        apply_backend(backend, so);
        so.ctx = ctx;
        so.prefill_chunk = chunk;
        so.max_logit_rows = chunk;
        return so;
    };
    PerplexityOptions po;
    po.ctx = ctx;
    po.chunk = chunk;
    std::unique_ptr<Session> s, ref;
    run_together(comm, [&] {
        // The tokens are checked against config.json before the weights load (seconds on a real
        // model), so a bad token file costs no load.
        check_perplexity(load_config(model), tokens, po, ids_file.empty() ? text_file : ids_file);
        s = open_session(options(prec.weights, prec.kv, false), comm);
        if (compare) ref = open_session(options(vm.count("compare-weights") ? cmp_weights : per_layer ? "fp32" : prec.weights,
                                                vm.count("compare-kv") ? cmp_kv : prec.kv, true), comm);
    });
    if (per_layer) {
        // Layer by layer: everything but one layer's Linear tensors kept unquantized (a negative
        // lookahead over the HF names), the rest of the flags as given.
        struct Row { std::string what; LogitComparison c; };
        std::vector<Row> rows;
        std::vector<std::string> targets;
        for (int64_t l = 0; l < ref->cfg.n_layers; ++l) targets.push_back("model\\.layers\\." + std::to_string(l) + "\\.");
        targets.push_back("lm_head\\.|model\\.embed_tokens\\.");  // tied: the embedding is lm_head
        for (size_t i = 0; i < targets.size(); ++i) {
            std::unique_ptr<Session> one;
            run_together(comm, [&] {
                SessionOptions so = options(prec.weights, prec.kv, false);
                so.load.keep_fp16 = "^(?!" + targets[i] + ")" + (prec.keep_fp16.empty() ? "" : "|" + prec.keep_fp16);
                one = open_session(so, comm);
            });
            rows.push_back({i + 1 < targets.size() ? "layer " + std::to_string(i) : "lm_head",
                            compare_logits(*ref->engine, *one->engine, tokens, po)});
        }
        if (!root) return 0;
        if (vm.count("json")) {
            nlohmann::ordered_json j = nlohmann::ordered_json::array();
            for (const Row& r : rows)
                j.push_back({{"quantized", r.what}, {"mean_kl", r.c.mean_kl()}, {"top1_agreement", r.c.top1()},
                             {"max_abs_logit_error", r.c.max_abs_err}, {"perplexity", r.c.cand.perplexity()}});
            std::cout << j.dump() << std::endl;
        } else {
            std::printf("| quantized alone | mean KL | top-1 agreement | max logit error | perplexity |\n|---|---:|---:|---:|---:|\n");
            for (const Row& r : rows)
                std::printf("| %s | %.3e | %.4f | %.4f | %.4f |\n", r.what.c_str(), r.c.mean_kl(), r.c.top1(),
                            r.c.max_abs_err, r.c.cand.perplexity());
            std::printf("reference (%s weights, %s kv) perplexity %.4f\n", (vm.count("compare-weights") ? cmp_weights : std::string("fp32")).c_str(),
                        (vm.count("compare-kv") ? cmp_kv : prec.kv).c_str(), rows.empty() ? 0.0 : rows[0].c.ref.perplexity());
        }
        return 0;
    }
    LogitComparison c;
    if (compare) c = compare_logits(*ref->engine, *s->engine, tokens, po);
    else c.cand = perplexity(*s->engine, tokens, po);
    if (!root) return 0;
    const PerplexityResult& r = c.cand;
    const double tps = r.ms > 0 ? 1000.0 * double(r.scored) / r.ms : 0.0;
    if (vm.count("json")) {
        nlohmann::ordered_json j;
        j["tokens"] = tokens.size();
        j["scored"] = r.scored;
        j["ctx"] = ctx;
        j["nll"] = r.nll_sum / double(r.scored);
        j["perplexity"] = r.perplexity();
        j["tokens_per_s"] = tps;
        j["weights"] = prec.weights;
        j["kv"] = prec.kv;
        j["tp"] = comm.size();
        if (compare) {
            j["reference"] = {{"weights", vm.count("compare-weights") ? cmp_weights : prec.weights},
                              {"kv", vm.count("compare-kv") ? cmp_kv : prec.kv},
                              {"perplexity", c.ref.perplexity()}};
            j["mean_kl"] = c.mean_kl();
            j["top1_agreement"] = c.top1();
            j["max_abs_logit_error"] = c.max_abs_err;
        }
        std::cout << j.dump() << std::endl;
    } else {
        std::printf("perplexity %.4f (nll %.5f) over %lld scored tokens, ctx %lld, %.1f tokens/s\n", r.perplexity(),
                    r.nll_sum / double(r.scored), (long long)r.scored, (long long)ctx, tps);
        if (compare)
            std::printf("reference perplexity %.4f; mean KL %.3e, top-1 agreement %.4f, max |logit error| %.4f\n",
                        c.ref.perplexity(), c.mean_kl(), c.top1(), c.max_abs_err);
    }
    return 0;
}

}  // namespace shardlm
