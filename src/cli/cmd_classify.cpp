// shardlm classify: each input's class probabilities from a sequence-classification model, or
// from a few tokens' logits of a causal LM (runtime/classify.h); with --query, each input is a
// document scored against the query by a cross-encoder (reranking).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/pooling_flags.h"
#include "comm/together.h"
#include "core/error.h"
#include "runtime/classify.h"
#include "runtime/embed.h"
#include "runtime/session.h"
#include "tokenizer/prompts.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

std::vector<std::pair<std::string, int32_t>> classifier_tokens(const std::string& model, const std::string& list) {
    if (list.empty()) return {};
    if (!Tokenizer::exists(model)) fail("--classifier-tokens needs the model's tokenizer: ", model, "/tokenizer.json does not exist");
    const Tokenizer tok = Tokenizer::load(model);
    std::vector<std::pair<std::string, int32_t>> out;
    std::stringstream ss(list);
    std::string name;
    while (std::getline(ss, name, ',')) {
        const int32_t id = tok.token_to_id(name);
        if (name.empty() || id < 0)
            fail("--classifier-tokens: \"", name, "\" is not a token of ", model, "/tokenizer.json (tokens as the vocabulary spells them, joined by ',')");
        out.emplace_back(name, id);
    }
    if (out.size() < 2 && !list.empty()) fail("--classifier-tokens \"", list, "\": name at least two tokens (e.g. no,yes)");
    return out;
}

int cmd_classify(const Args& args, Communicator& comm) {
    po::options_description d("classify options");
    std::string model, query, token_list, rerank_template;
    PoolingFlags in;
    PrecisionFlags prec;
    BackendFlags backend;
    int threads = 0, tp = 0;
    d.add_options()
        ("help", "show this help")
        ("model", po::value(&model)->required(), "checkpoint folder (a ...ForSequenceClassification model, or a causal LM with --classifier-tokens)")
        ("query", po::value(&query),
         "score each text input as a document for this query: the pair (query, text) through the tokenizer's pair "
         "template, one relevance in [0, 1] each (a cross-encoder reranker)")
        ("rerank-template", po::value(&rerank_template),
         "--query: fill the pair into this text, where {query} and {document} stand for the two (llama.cpp's rerank "
         "template; e.g. Qwen3-Reranker's instruction and chat framing), instead of the tokenizer's pair template")
        ("classifier-tokens", po::value(&token_list),
         "the labels are these tokens' logits at the last position of a causal LM, e.g. no,yes (Qwen3-Reranker; vLLM's "
         "classifier_from_token)")
        ("threads", po::value(&threads)->default_value(0), "CPU threads per rank (0: one per core)")
        ("tp", po::value(&tp)->default_value(0), "expected tensor-parallel size: must equal the mpirun rank count (0: any)")
        ("json", "print one JSON object: each input's label, probabilities and logits (and score with --query)");
    add_pooling_options(d, in);
    add_precision_options(d, prec);
    add_backend_options(d, backend);
    po::variables_map vm;
    const bool root = comm.rank() == 0;
    bool help = false;
    std::vector<std::vector<int32_t>> inputs;
    std::vector<std::pair<std::string, int32_t>> tokens;
    run_together(comm, [&] {
        help = !parse_args(args, d, vm, "usage: shardlm classify --model DIR (--prompt TEXT... | --prompt-file F | --prompt-ids IDS) [--query Q] [flags]", root);
        if (help) return;
        check_pooling_flags(vm, in);
        if (vm.count("query") && vm.count("prompt-ids")) fail("--query pairs with text inputs, not with --prompt-ids");
        if (vm.count("rerank-template")) {
            if (!vm.count("query")) fail("--rerank-template applies to --query");
            check_rerank_template(rerank_template, "--rerank-template");
        }
        SessionOptions check_flags;
        apply_precision(prec, check_flags);
        apply_backend(backend, check_flags);
        check_tp_flag(tp, comm);
        set_threads(threads);
        tokens = classifier_tokens(model, token_list);  // every rank: the head's columns
        if (!root) return;
        if (vm.count("prompt-ids")) {
            inputs = parse_prompt_ids(in.ids);
            return;
        }
        const Tokenizer tok = input_tokenizer(model);
        const std::vector<TextPrompt> ps = text_inputs(vm, in);
        if (!vm.count("query")) {
            inputs = encode_prompts(tok, ps, ChatOptions{});
            return;
        }
        for (const TextPrompt& p : ps) {
            try {
                inputs.push_back(encode_scored_pair(tok, rerank_template, query, p.text));
            } catch (const Error& e) {
                fail(p.origin, " with --query: ", e.what());
            }
        }
    });
    if (help) return 0;
    broadcast_prompts(comm, inputs);

    const SessionOptions so = pooling_session(model, in, prec, backend, inputs);
    std::unique_ptr<Session> s;
    Classifier head;
    run_together(comm, [&] {
        maybe_inject_failure(comm, "load");
        const ModelConfig cfg = load_config(model);
        check_classifier_config(cfg, !tokens.empty(), model + "/config.json");  // before the weights load
        check_context(cfg, so);
        EmbedOptions check;
        check.chunk = in.chunk;
        check_embed_inputs(cfg, engine_options(so), inputs, check);  // before the weights load
        s = open_session(so, comm);
        head = make_classifier(s->cfg, s->weights, tokens);
        if (vm.count("query")) check_relevance(head);
    });
    run_together(comm, [&] { check_same_request(comm, args, *s); });
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::vector<float>> logits;
    run_together(comm, [&] { logits = classify(*s->engine, head, inputs, in.chunk); });
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!root) return 0;
    int64_t n_tokens = 0;
    for (const auto& ids : inputs) n_tokens += int64_t(ids.size());
    nlohmann::ordered_json j;
    j["labels"] = head.labels;
    j["tokens"] = n_tokens;
    j["load_ms"] = s->load_ms;
    j["classify_ms"] = ms;
    j["data"] = nlohmann::ordered_json::array();
    for (size_t i = 0; i < logits.size(); ++i) {
        const std::vector<float> p = class_probabilities(head, logits[i]);
        const size_t best = size_t(std::max_element(p.begin(), p.end()) - p.begin());
        nlohmann::ordered_json e{{"index", i}, {"tokens", inputs[i].size()}, {"label", head.labels[best]}, {"probs", p},
                                 {"logits", logits[i]}};
        if (vm.count("query")) e["score"] = relevance(head, logits[i]);
        if (vm.count("json")) {
            j["data"].push_back(e);
            continue;
        }
        // Plain: the score (with --query), else the label with its probability, then every label's.
        char buf[64];
        std::string line;
        if (vm.count("query")) {
            std::snprintf(buf, sizeof buf, "%.6f", double(e["score"].get<float>()));
            line = buf;
        } else {
            line = head.labels[best];
            for (size_t k = 0; k < p.size(); ++k) {
                std::snprintf(buf, sizeof buf, " %.6f", double(p[k]));
                line += buf;
            }
        }
        std::cout << line << "\n";
    }
    if (vm.count("json")) std::cout << j.dump() << std::endl;
    std::cout.flush();
    if (!vm.count("json"))
        std::fprintf(stderr, "shardlm classify: %zu inputs, %lld tokens, labels %s, %.1f ms\n", logits.size(), (long long)n_tokens,
                     nlohmann::json(head.labels).dump().c_str(), ms);
    return 0;
}

}  // namespace shardlm
