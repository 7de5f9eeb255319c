#include "tiny_tokenizer.h"

#include "fixtures.h"
#include "tokenizer/bpe.h"

namespace shardlm::test {

using json = nlohmann::json;

json tiny_byte_level_tokenizer() {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(uint8_t(b))] = b;
    // Merges build " the", " hello", "in", "er", "ll" ...; each merged token gets the next id.
    const std::vector<std::pair<std::string, std::string>> merges = {
        {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"e", "r"}, {"l", "l"}, {"Ġ", "h"},
        {"Ġh", "e"}, {"Ġhe", "ll"}, {"Ġhell", "o"}, {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}, {"Ġwor", "l"},
        {"Ġworl", "d"}, {"Ġ", "Ġ"}, {"ĠĠ", "ĠĠ"}, {"Ċ", "Ċ"}, {"Ã", "©"}};
    int next = 256;
    json mj = json::array();
    for (const auto& [a, b] : merges) {
        if (!vocab.contains(a + b)) vocab[a + b] = next++;
        mj.push_back(json::array({a, b}));
    }
    const auto added = [](int id, const char* content) {
        return json{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                    {"normalized", false}, {"special", true}};
    };
    json t;
    t["version"] = "1.0";
    t["added_tokens"] = json::array({added(350, "<|endoftext|>"), added(351, "<|im_start|>"), added(352, "<|im_end|>")});
    t["normalizer"] = {{"type", "NFC"}};
    t["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern", {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}})}};
    t["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
    t["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
    t["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                  {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                  {"vocab", vocab}, {"merges", mj}};
    return t;
}

json tiny_byte_level_config() {
    return {{"add_bos_token", false},
            {"bos_token", nullptr},
            {"eos_token", "<|im_end|>"},
            {"clean_up_tokenization_spaces", false},
            {"chat_template",
             "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
             "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"}};
}

json tiny_sp_tokenizer() {
    json vocab = json::object();
    vocab["<unk>"] = 0;
    vocab["<s>"] = 1;
    vocab["</s>"] = 2;
    static const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) vocab[std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">"] = 3 + b;
    int next = 259;
    for (const char* c : {"\xE2\x96\x81", "a", "b", "c", "d", "e", "h", "l", "o", "w", "r", "!", "\xC3\xA9"})
        vocab[c] = next++;
    const std::vector<std::pair<std::string, std::string>> merges = {
        {"\xE2\x96\x81", "h"}, {"e", "l"}, {"\xE2\x96\x81h", "el"}, {"l", "o"}, {"\xE2\x96\x81hel", "lo"},
        {"\xE2\x96\x81", "w"}, {"o", "r"}, {"\xE2\x96\x81w", "or"}, {"a", "b"}, {"ab", "c"}};
    json mj = json::array();
    for (const auto& [a, b] : merges) {
        if (!vocab.contains(a + b)) vocab[a + b] = next++;
        mj.push_back(a + " " + b);  // the older "a b" spelling
    }
    const auto added = [](int id, const char* content) {
        return json{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                    {"normalized", false}, {"special", true}};
    };
    json t;
    t["version"] = "1.0";
    t["added_tokens"] = json::array({added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")});
    t["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                                                    {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}})}};
    t["pre_tokenizer"] = nullptr;
    t["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                   {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                           {"pair", json::array()},
                           {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
    t["decoder"] = {{"type", "Sequence"},
                    {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                              {{"type", "ByteFallback"}},
                                              {{"type", "Fuse"}},
                                              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
    t["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr}, {"fuse_unk", true}, {"byte_fallback", true},
                  {"vocab", vocab}, {"merges", mj}};
    return t;
}

json tiny_sp_config() {
    return {{"add_bos_token", true},
            {"add_eos_token", false},
            {"bos_token", "<s>"},
            {"eos_token", "</s>"},
            {"unk_token", "<unk>"},
            {"clean_up_tokenization_spaces", false},
            {"chat_template",
             "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
             "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif "
             "%}{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}{% set content = "
             "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
             "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
             "content.strip() + ' [/INST]' }}{% endif %}{% endfor %}"}};
}

json with_special_tokens(json tok, const std::vector<std::pair<int, std::string>>& added) {
    for (const auto& [id, content] : added)
        tok["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                       {"rstrip", false}, {"normalized", false}, {"special", true}});
    return tok;
}

void write_tokenizer_files(const std::string& dir, const json& tok, const json& cfg) {
    write_file(dir + "/tokenizer.json", tok.dump());
    write_file(dir + "/tokenizer_config.json", cfg.dump());
}

}  // namespace shardlm::test
