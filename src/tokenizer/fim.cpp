#include "tokenizer/fim.h"

#include "core/error.h"

namespace shardlm {
namespace {

struct FimFamily {
    const char* name;
    const char *prefix, *suffix, *middle;  // middle null: none (the prompt ends with the prefix)
    std::vector<const char*> stops;
    bool suffix_first = false, suffix_space = true;
};

const std::vector<FimFamily>& families() {
    static const std::vector<FimFamily> f = {
        {"qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
         {"<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|endoftext|>"}},
        {"starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", {"<fim_pad>", "<file_sep>", "<|endoftext|>"}},
        {"deepseek", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>",
         "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", {"<|EOT|>", "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>"}},
        {"codellama", "\xE2\x96\x81<PRE>", "\xE2\x96\x81<SUF>", "\xE2\x96\x81<MID>", {"\xE2\x96\x81<EOT>"}, false, false},
        {"mistral", "[PREFIX]", "[SUFFIX]", nullptr, {}, true, false},
    };
    return f;
}

}  // namespace

FimTokens fim_tokens(const Tokenizer& tok) {
    FimTokens out;
    for (const FimFamily& f : families()) {
        const int32_t p = tok.token_to_id(f.prefix), s = tok.token_to_id(f.suffix),
                      m = f.middle ? tok.token_to_id(f.middle) : -1;
        if (p < 0 || s < 0 || (f.middle && m < 0)) continue;
        out.family = f.name;
        out.prefix = p;
        out.suffix = s;
        out.middle = m;
        out.suffix_first = f.suffix_first;
        out.suffix_space = f.suffix_space;
        for (const char* t : f.stops)
            if (const int32_t id = tok.token_to_id(t); id >= 0) out.stops.push_back(id);
        break;
    }
    return out;
}

std::vector<int32_t> encode_fim(const Tokenizer& tok, const FimTokens& f, const std::string& prefix,
                                const std::string& suffix) {
    SHARDLM_CHECK(f.family, "encode_fim without FIM tokens");
    std::vector<int32_t> ids;
    const std::vector<int32_t> lead = tok.encode("");  // the post-processor's BOS, if it adds one
    if (!lead.empty() && lead[0] == tok.bos_id()) ids.push_back(lead[0]);
    auto append = [&](int32_t special, const std::string& text, bool space) {
        ids.push_back(special);
        EncodeOptions opt;
        opt.add_special_tokens = false;
        opt.prefix_space = space;
        const std::vector<int32_t> t = tok.encode(text, opt);
        ids.insert(ids.end(), t.begin(), t.end());
    };
    if (f.suffix_first) {
        append(f.suffix, suffix, f.suffix_space);
        append(f.prefix, prefix, true);
    } else {
        append(f.prefix, prefix, true);
        append(f.suffix, suffix, f.suffix_space);
    }
    if (f.middle >= 0) ids.push_back(f.middle);
    return ids;
}

const char* fim_families_known() {
    return "Qwen2.5-Coder's <|fim_prefix|>, StarCoder's and SmolLM's <fim_prefix>, DeepSeek-Coder's "
           "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>, Code Llama's \xE2\x96\x81<PRE>, Codestral's [PREFIX]";
}

}  // namespace shardlm
