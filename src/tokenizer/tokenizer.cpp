#include "tokenizer/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace shardlm {

using json = nlohmann::json;


namespace {

std::string read_text_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot read ", path);
    std::ostringstream ss;
    ss << f.rdbuf();
    if (f.bad()) fail("cannot read ", path);
    return ss.str();
}

bool file_exists(const std::string& path) {
    struct stat st{};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

json parse_json(const std::string& text, const std::string& where) {
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        fail(where, ": malformed JSON: ", e.what());
    }
}

// A special token named in tokenizer_config.json: a string or {"content": ...}; null when unset.
std::optional<std::string> config_token(const json& cfg, const char* key) {
    if (!cfg.is_object() || !cfg.contains(key)) return std::nullopt;
    const json& v = cfg[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return std::nullopt;
}

// The ids a TemplateProcessing/RobertaProcessing/... post-processor puts around a single sequence,
// and its template for a pair (ids, with kPairA / kPairB where the sequences go).
void read_post_processor(const json& pp, const Tokenizer& tok, std::vector<int32_t>& prefix,
                         std::vector<int32_t>& suffix, std::vector<int32_t>& pair, const std::string& where) {
    if (pp.is_null()) return;
    if (!pp.is_object() || !pp.contains("type") || !pp["type"].is_string()) fail(where, ": post_processor without a \"type\"");
    const std::string type = pp["type"];
    if (type == "ByteLevel") return;  // offsets only
    if (type == "Sequence") {
        if (!pp.contains("processors") || !pp["processors"].is_array())
            fail(where, ": Sequence post_processor needs a \"processors\" array");
        for (const auto& p : pp["processors"]) read_post_processor(p, tok, prefix, suffix, pair, where);
        return;
    }
    if (type == "TemplateProcessing") {
        if (!pp.contains("single") || !pp["single"].is_array()) fail(where, ": TemplateProcessing needs a \"single\" array");
        const json& specials = pp.contains("special_tokens") ? pp["special_tokens"] : json::object();
        // One template's ids, kPairA / kPairB for its sequences.
        auto read_template = [&](const json& items) {
            std::vector<int32_t> out;
            for (const auto& item : items) {
                if (item.contains("Sequence")) {
                    const json& sq = item["Sequence"];
                    out.push_back(sq.is_object() && sq.value("id", std::string("A")) == "B" ? kPairB : kPairA);
                    continue;
                }
                if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id"))
                    fail(where, ": TemplateProcessing item is neither Sequence nor SpecialToken");
                const std::string name = item["SpecialToken"]["id"];
                if (specials.contains(name) && specials[name].contains("ids")) {
                    for (const auto& v : specials[name]["ids"]) out.push_back(v.get<int32_t>());
                } else {
                    const int32_t id = tok.token_to_id(name);
                    if (id < 0) fail(where, ": TemplateProcessing special token \"", name, "\" is not in the vocabulary");
                    out.push_back(id);
                }
            }
            return out;
        };
        const std::vector<int32_t> single = read_template(pp["single"]);
        const auto a = std::find(single.begin(), single.end(), kPairA);
        prefix.assign(single.begin(), a);
        suffix.assign(a == single.end() ? a : a + 1, single.end());
        if (pp.contains("pair") && pp["pair"].is_array() && !pp["pair"].empty()) pair = read_template(pp["pair"]);
        else pair = {kPairA, kPairB};
        return;
    }
    if (type == "RobertaProcessing" || type == "BertProcessing") {
        const int32_t cls = pp.at("cls").at(1).get<int32_t>(), sep = pp.at("sep").at(1).get<int32_t>();
        prefix = {cls};
        suffix = {sep};
        pair = type == "RobertaProcessing" ? std::vector<int32_t>{cls, kPairA, sep, sep, kPairB, sep}
                                           : std::vector<int32_t>{cls, kPairA, sep, kPairB, sep};
        return;
    }
    fail(where, ": unsupported post_processor type \"", type,
         "\" (supported: TemplateProcessing, ByteLevel, Sequence, RobertaProcessing, BertProcessing)");
}

}  // namespace

Tokenizer::Tokenizer() : impl_(new Impl) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

bool Tokenizer::exists(const std::string& dir) { return file_exists(dir + "/tokenizer.json"); }

Tokenizer Tokenizer::load(const std::string& dir, const std::optional<ChatTemplateFile>& chat_template) {
    const std::string path = dir + "/tokenizer.json";
    if (!file_exists(path)) fail("no tokenizer: ", path, " does not exist (text prompts need the model's tokenizer.json)");
    const std::string cfg_path = dir + "/tokenizer_config.json";
    const std::string cfg = file_exists(cfg_path) ? read_text_file(cfg_path) : std::string();
    const std::string jinja = dir + "/chat_template.jinja";
    std::optional<ChatTemplateFile> chat_file = chat_template;
    if (!chat_file && file_exists(jinja)) chat_file = ChatTemplateFile{read_text_file(jinja), jinja};
    return from_json_text(read_text_file(path), cfg, path, cfg_path, chat_file);
}

Tokenizer Tokenizer::from_json_text(const std::string& tokenizer_json, const std::string& config_json,
                                    const std::string& where, const std::string& config_where,
                                    const std::optional<ChatTemplateFile>& chat_file) {
    Tokenizer t;
    Impl& m = *t.impl_;
    m.where = where;
    m.config_where = config_where;
    BpeTables tables;
    const json j = parse_tokenizer_json(tokenizer_json, where, tables);
    const json cfg = config_json.empty() ? json::object() : parse_json(config_json, config_where);
    if (!j.is_object()) fail(where, ": top level is not a JSON object");
    if (!cfg.is_object()) fail(config_where, ": top level is not a JSON object");
    if (!j.contains("model")) fail(where, ": no \"model\"");

    m.normalizer = Normalizer::from_json(j.value("normalizer", json()), where);
    m.pre_tokenizer = PreTokenizer::from_json(j.value("pre_tokenizer", json()), where);
    m.model = BpeModel::from_json(j["model"], std::move(tables), m.pre_tokenizer.byte_level(), where);
    m.tokens = m.model->tokens();

    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
        if (!j["added_tokens"].is_array()) fail(where, ": \"added_tokens\" is not an array");
        for (const auto& a : j["added_tokens"]) {
            if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
                !a["content"].is_string())
                fail(where, ": an added token needs an integer \"id\" and a string \"content\"");
            AddedToken tok;
            tok.content = a["content"];
            const int64_t id = a["id"];
            if (id < 0 || id > (1 << 30)) fail(where, ": added token \"", tok.content, "\" has id ", id);
            tok.id = int32_t(id);
            tok.special = a.value("special", false);
            tok.single_word = a.value("single_word", false);
            tok.lstrip = a.value("lstrip", false);
            tok.rstrip = a.value("rstrip", false);
            // HF: an added token is normalized unless it says otherwise (special tokens usually do).
            tok.normalized = a.value("normalized", !tok.special);
            if (tok.content.empty()) fail(where, ": added token ", id, " has empty content");
            if (size_t(tok.id) >= m.tokens.size()) m.tokens.resize(size_t(tok.id) + 1);
            m.tokens[size_t(tok.id)] = tok.content;
            m.added_ids[tok.content] = tok.id;
            m.added.push_back(std::move(tok));
        }
    }
    m.raw_matcher = AddedTokenMatcher(m.added, false);
    m.normalized_matcher = AddedTokenMatcher(m.added, true);
    m.special.assign(m.tokens.size(), 0);
    for (const auto& a : m.added)
        if (a.special) m.special[size_t(a.id)] = 1;
    if (cfg.contains("additional_special_tokens") && cfg["additional_special_tokens"].is_array())
        for (const auto& s : cfg["additional_special_tokens"]) {
            const std::string name = s.is_string() ? s.get<std::string>() : s.value("content", std::string());
            const int32_t id = t.token_to_id(name);
            if (id >= 0) m.special[size_t(id)] = 1;
        }

    m.decoder = Decoder::from_json(j.value("decoder", json()), m.tokens, where);
    read_post_processor(j.value("post_processor", json()), t, m.prefix, m.suffix, m.pair, where);

    if (const auto b = config_token(cfg, "bos_token")) {
        m.bos_token = *b;
        m.bos = t.token_to_id(*b);
    }
    if (const auto e = config_token(cfg, "eos_token")) m.eos = t.token_to_id(*e);
    // add_bos_token / add_eos_token, when the config states them, decide BOS/EOS as transformers'
    // Llama-style fast tokenizers do (they rebuild the template from these flags).
    const bool has_bos_flag = cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean();
    const bool has_eos_flag = cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean();
    if (has_bos_flag || has_eos_flag) {
        const bool add_bos = has_bos_flag ? cfg["add_bos_token"].get<bool>()
                                          : std::find(m.prefix.begin(), m.prefix.end(), m.bos) != m.prefix.end();
        const bool add_eos = has_eos_flag ? cfg["add_eos_token"].get<bool>()
                                          : std::find(m.suffix.begin(), m.suffix.end(), m.eos) != m.suffix.end();
        m.prefix.clear();
        m.suffix.clear();
        if (add_bos && m.bos >= 0) m.prefix.push_back(m.bos);
        if (add_eos && m.eos >= 0) m.suffix.push_back(m.eos);
        // transformers' update_post_processor: the pair is each sequence in the single template.
        m.pair = m.prefix;
        m.pair.push_back(kPairA);
        m.pair.insert(m.pair.end(), m.suffix.begin(), m.suffix.end());
        m.pair.insert(m.pair.end(), m.prefix.begin(), m.prefix.end());
        m.pair.push_back(kPairB);
        m.pair.insert(m.pair.end(), m.suffix.begin(), m.suffix.end());
    }
    m.clean_up = cfg.value("clean_up_tokenization_spaces", false);

    if (cfg.contains("chat_template")) {
        const json& ct = cfg["chat_template"];
        if (ct.is_string()) {
            m.chat_source = ct.get<std::string>();
        } else if (ct.is_array()) {
            for (const auto& e : ct)
                if (e.is_object() && e.value("name", std::string()) == "default" && e.contains("template") &&
                    e["template"].is_string())
                    m.chat_source = e["template"].get<std::string>();
        }
    }
    std::string chat_where = config_where;
    if (chat_file) {
        m.chat_source = chat_file->text;
        chat_where = chat_file->where;
    }
    if (m.chat_source) {
        try {
            m.chat = recognise_chat_template(*m.chat_source, chat_where);
        } catch (const Error& e) {
            m.chat_error = e.what();
        }
    }
    for (int32_t id : m.prefix)
        if (id < 0 || id >= t.vocab_size()) fail(where, ": post_processor id ", id, " is outside the vocabulary");
    for (int32_t id : m.suffix)
        if (id < 0 || id >= t.vocab_size()) fail(where, ": post_processor id ", id, " is outside the vocabulary");
    for (int32_t id : m.pair)
        if (id != kPairA && id != kPairB && (id < 0 || id >= t.vocab_size()))
            fail(where, ": post_processor id ", id, " is outside the vocabulary");
    return t;
}

void Tokenizer::Impl::encode_section(std::string_view section, bool at_origin, std::vector<int32_t>& out,
                                     BpeModel::Scratch& scratch, bool prefix_space) const {
    pre_tokenizer.split(section, at_origin, [&](std::string_view w) { model->encode_word(w, out, scratch); }, prefix_space);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
    const Impl& m = *impl_;
    const size_t bad = utf8_invalid_offset(text);
    if (bad != std::string_view::npos) fail("text is not valid UTF-8 (bad byte 0x", std::hex, unsigned(static_cast<unsigned char>(text[bad])), std::dec, " at offset ", bad, ")");
    std::vector<int32_t> ids;
    if (opt.add_special_tokens) ids = m.prefix;
    BpeModel::Scratch scratch;
    for (const Segment& seg : m.raw_matcher.split(text)) {
        if (seg.token >= 0) {
            ids.push_back(m.added[size_t(seg.token)].id);
            continue;
        }
        const std::string_view section = text.substr(seg.begin, seg.end - seg.begin);
        const bool space = opt.prefix_space || seg.begin != 0;  // only the text's start goes without it
        const std::string normalized = m.normalizer.empty() ? std::string(section) : m.normalizer.normalize(section, space);
        if (m.normalized_matcher.empty()) {
            m.encode_section(normalized, seg.begin == 0, ids, scratch, space);
            continue;
        }
        for (const Segment& s2 : m.normalized_matcher.split(normalized)) {
            if (s2.token >= 0) ids.push_back(m.added[size_t(s2.token)].id);
            else m.encode_section(std::string_view(normalized).substr(s2.begin, s2.end - s2.begin),
                                  seg.begin == 0 && s2.begin == 0, ids, scratch, space || s2.begin != 0);
        }
    }
    if (opt.add_special_tokens) ids.insert(ids.end(), m.suffix.begin(), m.suffix.end());
    return ids;
}

std::vector<int32_t> Tokenizer::encode_pair(std::string_view a, std::string_view b, int64_t max_tokens) const {
    const std::vector<int32_t> ia = encode(a, {false});
    std::vector<int32_t> ib = encode(b, {false});
    if (max_tokens > 0) {
        // The template's own ids and a (every template here places each sequence once).
        const int64_t fixed = int64_t(std::count_if(impl_->pair.begin(), impl_->pair.end(), [](int32_t id) { return id >= 0; })) +
                              int64_t(ia.size());
        if (fixed + 1 > max_tokens)
            fail("the first text of the pair takes ", fixed, " tokens with the template's, leaving the second none of ",
                 max_tokens);
        if (fixed + int64_t(ib.size()) > max_tokens) ib.resize(size_t(max_tokens - fixed));
    }
    std::vector<int32_t> ids;
    for (const int32_t id : impl_->pair) {
        if (id == kPairA) ids.insert(ids.end(), ia.begin(), ia.end());
        else if (id == kPairB) ids.insert(ids.end(), ib.begin(), ib.end());
        else ids.push_back(id);
    }
    return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, const DecodeOptions& opt) const {
    const Impl& m = *impl_;
    std::string bytes;
    bool first = true;
    for (int32_t id : ids) {
        if (id < 0 || id >= vocab_size()) fail("token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
        if (opt.skip_special_tokens && m.special[size_t(id)]) continue;
        bytes += m.decoder.piece(id, first && !opt.continuation);
        first = false;
    }
    std::string text = utf8_lossy(bytes);
    // The whole-text Strip (SentencePiece's leading space), counted in characters.
    const char32_t sc = m.decoder.strip_char();
    std::string sc_utf8;
    append_utf8(sc_utf8, sc);
    size_t b = 0, e = text.size();
    const int strip_start = opt.continuation ? 0 : m.decoder.strip_start();
    for (int k = 0; k < strip_start && text.compare(b, sc_utf8.size(), sc_utf8) == 0 && b < e; ++k)
        b += sc_utf8.size();
    for (int k = 0; k < m.decoder.strip_stop() && e >= b + sc_utf8.size() &&
                    text.compare(e - sc_utf8.size(), sc_utf8.size(), sc_utf8) == 0; ++k)
        e -= sc_utf8.size();
    text = text.substr(b, e - b);
    if (opt.clean_up_spaces.value_or(m.clean_up)) text = clean_up_tokenization(text);
    return text;
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->tokens.size()); }

int32_t Tokenizer::token_to_id(std::string_view token) const {
    const auto it = impl_->added_ids.find(std::string(token));
    if (it != impl_->added_ids.end()) return it->second;
    return impl_->model->find(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
    if (id < 0 || id >= vocab_size()) fail("token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
    return impl_->tokens[size_t(id)];
}

std::string Tokenizer::token_bytes(int32_t id) const {
    if (id < 0 || id >= vocab_size()) fail("token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
    return impl_->decoder.piece(id, false);
}

bool Tokenizer::is_special(int32_t id) const {
    return id >= 0 && id < vocab_size() && impl_->special[size_t(id)];
}

int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }

bool Tokenizer::has_chat_template() const { return impl_->chat_source.has_value(); }

std::string Tokenizer::apply_chat_template(const std::optional<std::string>& system, const std::string& user) const {
    const Impl& m = *impl_;
    if (!m.chat_source)
        fail(m.config_where, ": no chat_template, nor a chat_template.jinja beside it (the model has no chat format; drop --chat)");
    if (!m.chat) fail(m.chat_error);
    return render_chat(*m.chat, system, user, m.bos_token);
}

std::string Tokenizer::apply_chat_template(const std::optional<std::string>& system,
                                           const std::vector<ChatMessage>& messages,
                                           const std::vector<nlohmann::ordered_json>& tools,
                                           const ChatKwargs& kwargs) const {
    const Impl& m = *impl_;
    if (!m.chat_source)
        fail(m.config_where, ": no chat_template, nor a chat_template.jinja beside it (the model has no chat format)");
    if (!m.chat) fail(m.chat_error);
    return render_conversation(*m.chat, system, messages, m.bos_token, m.eos >= 0 ? id_to_token(m.eos) : "", tools, kwargs);
}

ChatTools Tokenizer::chat_tools() const { return impl_->chat ? impl_->chat->tools : ChatTools::None; }
bool Tokenizer::chat_thinking_switch() const { return impl_->chat && impl_->chat->thinking_switch; }

std::string Tokenizer::chat_family() const {
    const Impl& m = *impl_;
    if (!m.chat_source) return "";
    if (!m.chat) fail(m.chat_error);
    return chat_family_name(m.chat->family);
}

}  // namespace shardlm
