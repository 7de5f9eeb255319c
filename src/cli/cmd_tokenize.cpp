// shardlm tokenize: text -> token ids with the model's tokenizer.json, one JSON array per input.
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

namespace {

void print_ids(const Tokenizer& tok, const std::vector<int32_t>& ids, bool json_out) {
    if (!json_out) {
        // The bare array is written by hand: for big inputs a JSON tree per line would cost as
        // much as the encoding.
        std::string line = "[";
        for (size_t i = 0; i < ids.size(); ++i) {
            if (i) line += ',';
            line += std::to_string(ids[i]);
        }
        line += "]\n";
        std::cout << line;
        return;
    }
    nlohmann::ordered_json j;
    j["ids"] = ids;
    nlohmann::json pieces = nlohmann::json::array();
    // Spellings as in tokenizer.json (GPT-2 byte characters for byte-level models): valid UTF-8.
    for (int32_t id : ids) pieces.push_back(tok.id_to_token(id));
    j["tokens"] = pieces;
    std::cout << j.dump() << "\n";
}

}  // namespace

int cmd_tokenize(const Args& args) {
    po::options_description d("tokenize options");
    std::string model, text;
    d.add_options()
        ("help", "show this help")
        ("model", po::value(&model)->required(), "model folder with tokenizer.json (+ tokenizer_config.json)")
        ("text", po::value(&text), "text to encode (else: every line of stdin, one output line each)")
        ("no-special", "no BOS/EOS from the post-processor (special-token strings in the text still count)")
        ("json", "print {\"ids\": [...], \"tokens\": [...]} per input instead of the bare id array");
    po::variables_map vm;
    if (!parse_args(args, d, vm, "usage: shardlm tokenize --model DIR [--text TEXT] [--no-special] [--json]")) return 0;
    const Tokenizer tok = Tokenizer::load(model);
    std::ios::sync_with_stdio(false);  // line-by-line stdin/stdout through C++ buffers only
    EncodeOptions opt;
    opt.add_special_tokens = vm.count("no-special") == 0;
    const bool json_out = vm.count("json") > 0;
    if (vm.count("text")) {
        try {
            print_ids(tok, tok.encode(text, opt), json_out);
        } catch (const Error& e) {
            fail("--text: ", e.what());
        }
        return 0;
    }
    std::string line;
    for (size_t n = 1; std::getline(std::cin, line); ++n) {
        try {
            print_ids(tok, tok.encode(line, opt), json_out);
        } catch (const Error& e) {
            fail("stdin line ", n, ": ", e.what());
        }
    }
    return 0;
}

}  // namespace shardlm
