#include "cli/pooling_flags.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm {

void add_pooling_options(po::options_description& d, PoolingFlags& f) {
    d.add_options()
        ("prompt", po::value(&f.texts), "an input text (repeatable; encoded with the model's tokenizer.json)")
        ("prompt-file", po::value<std::string>(), "file with one input text per line")
        ("prompt-ids", po::value(&f.ids), "token ids, e.g. \"1,2,3;4,5\" (';' separates inputs)")
        ("ctx", po::value(&f.ctx)->default_value(0), "positions per input (0: the longest input)")
        ("batch", po::value(&f.batch)->default_value(0), "inputs run side by side (0: all, at most 16)")
        ("prefill-chunk", po::value(&f.chunk)->default_value(256), "tokens of one input per forward step");
}

void check_pooling_flags(const po::variables_map& vm, const PoolingFlags& f) {
    const size_t sources = (f.texts.empty() ? 0 : 1) + vm.count("prompt-file") + vm.count("prompt-ids");
    if (sources == 0) fail("an input is required: --prompt TEXT, --prompt-file F or --prompt-ids IDS");
    if (sources > 1) fail("--prompt, --prompt-file and --prompt-ids exclude each other");
    if (f.batch < 0) fail("--batch must be >= 0");
    if (f.chunk < 1) fail("--prefill-chunk must be at least 1");
    if (f.ctx < 0) fail("--ctx must be >= 0");
}

std::vector<TextPrompt> text_inputs(const po::variables_map& vm, const PoolingFlags& f) {
    if (vm.count("prompt-file")) return read_prompt_file(vm["prompt-file"].as<std::string>());
    std::vector<TextPrompt> ps;
    for (const std::string& t : f.texts) ps.push_back({t, "--prompt"});
    return ps;
}

Tokenizer input_tokenizer(const std::string& model) {
    if (!Tokenizer::exists(model)) fail("text inputs need the model's tokenizer: ", model, "/tokenizer.json does not exist");
    return Tokenizer::load(model);
}

SessionOptions pooling_session(const std::string& model, const PoolingFlags& f, const PrecisionFlags& prec,
                               const BackendFlags& backend, const std::vector<std::vector<int32_t>>& inputs) {
    SessionOptions so;
    so.model_dir = model;
    apply_precision(prec, so);
    apply_backend(backend, so);
    so.load.headless_ok = true;  // an embedding or classification checkpoint may have no lm_head
    const int64_t n = int64_t(inputs.size());
    so.max_batch = f.batch == 0 ? std::min<int64_t>(n, 16) : std::min(f.batch, n);
    so.prefill_chunk = f.chunk;
    int64_t longest = 0;
    for (const auto& in : inputs) longest = std::max<int64_t>(longest, int64_t(in.size()));
    so.ctx = f.ctx > 0 ? f.ctx : std::max<int64_t>(longest, 1);
    if (f.ctx == 0) so.ctx_origin = "the longest input (" + std::to_string(longest) + " tokens)";
    return so;
}

}  // namespace shardlm
