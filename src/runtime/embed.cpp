#include "runtime/embed.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"

namespace shardlm {

namespace {

using json = nlohmann::json;

json read_json(const std::string& path) {
    try {
        return json::parse(read_text_file(path));
    } catch (const json::exception& e) {
        fail(path, ": malformed JSON: ", e.what());
    }
}

bool flag(const json& j, const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); }

// The Pooling module's config.json: exactly one mode this runtime pools with.
Pooling read_pooling(const std::string& path) {
    const json j = read_json(path);
    if (!j.is_object()) fail(path, ": not a JSON object");
    std::vector<std::pair<const char*, Pooling>> on;
    for (const auto& [key, p] : {std::pair<const char*, Pooling>{"pooling_mode_lasttoken", Pooling::Last},
                                 {"pooling_mode_mean_tokens", Pooling::Mean},
                                 {"pooling_mode_cls_token", Pooling::Cls}})
        if (flag(j, key)) on.emplace_back(key, p);
    for (const char* key : {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens"})
        if (flag(j, key)) fail(path, ": ", key, " is not supported (pooling: lasttoken, mean_tokens or cls_token)");
    if (on.size() != 1)
        fail(path, on.empty() ? ": no pooling mode is set" : ": several pooling modes are set (their concatenation is not supported)",
             " (one of pooling_mode_lasttoken, pooling_mode_mean_tokens, pooling_mode_cls_token)");
    // include_prompt false leaves the instruction's tokens out of the pool: only the last token's
    // state is the same either way.
    if (j.contains("include_prompt") && j["include_prompt"] == false && on[0].second != Pooling::Last)
        fail(path, ": include_prompt false is supported with pooling_mode_lasttoken only");
    return on[0].second;
}

}  // namespace

Pooling parse_pooling(const std::string& s) {
    if (s == "last") return Pooling::Last;
    if (s == "mean") return Pooling::Mean;
    if (s == "cls") return Pooling::Cls;
    fail("--pooling \"", s, "\" is not one of last, mean, cls");
}

const char* pooling_name(Pooling p) { return p == Pooling::Last ? "last" : p == Pooling::Mean ? "mean" : "cls"; }

EmbeddingConfig load_embedding_config(const std::string& dir) {
    EmbeddingConfig ec;
    const std::string modules_path = dir + "/modules.json";
    if (file_exists(modules_path)) {
        const json mods = read_json(modules_path);
        if (!mods.is_array()) fail(modules_path, ": not a JSON array of modules");
        bool pooled = false;
        ec.normalize = false;  // only a Normalize module normalizes
        for (const json& m : mods) {
            const std::string type = m.is_object() && m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "";
            const std::string path = m.is_object() && m.contains("path") && m["path"].is_string() ? m["path"].get<std::string>() : "";
            const std::string kind = type.substr(type.find_last_of('.') + 1);
            if (kind == "Transformer") {
                if (!path.empty())
                    fail(modules_path, ": the Transformer module lives in the subfolder \"", path,
                         "\"; shardlm reads the model from the folder itself");
            } else if (kind == "Pooling") {
                if (pooled) fail(modules_path, ": more than one Pooling module");
                ec.pooling = read_pooling(dir + "/" + (path.empty() ? "." : path) + "/config.json");
                ec.pooling_source = (path.empty() ? "" : path + "/") + "config.json";
                pooled = true;
            } else if (kind == "Normalize") {
                ec.normalize = true;
            } else {
                fail(modules_path, ": module \"", type.empty() ? m.dump() : type,
                     "\" is not supported (Transformer, Pooling and Normalize are)");
            }
        }
        if (!pooled) fail(modules_path, ": no Pooling module");
    }
    const std::string st_path = dir + "/config_sentence_transformers.json";
    if (file_exists(st_path)) {
        const json j = read_json(st_path);
        if (j.contains("prompts") && j["prompts"].is_object())
            for (const auto& [name, text] : j["prompts"].items()) {
                if (!text.is_string()) fail(st_path, ": prompt \"", name, "\" is not a string");
                ec.prompts[name] = text.get<std::string>();
            }
        if (j.contains("default_prompt_name") && j["default_prompt_name"].is_string()) {
            const std::string name = j["default_prompt_name"];
            auto it = ec.prompts.find(name);
            if (it == ec.prompts.end()) fail(st_path, ": default_prompt_name \"", name, "\" is not among its prompts");
            ec.default_prompt = it->second;
        }
    }
    return ec;
}

std::string query_prompt(const EmbeddingConfig& ec) {
    const auto it = ec.prompts.find("query");
    return it != ec.prompts.end() ? it->second : ec.default_prompt;
}

std::string document_prompt(const EmbeddingConfig& ec) {
    for (const char* name : {"document", "passage", "corpus"}) {
        const auto it = ec.prompts.find(name);
        if (it != ec.prompts.end()) return it->second;
    }
    return ec.default_prompt;
}

void check_embed_inputs(const ModelConfig& c, const EngineOptions& eo, const std::vector<std::vector<int32_t>>& inputs,
                        const EmbedOptions& opt) {
    if (opt.dimensions < 0 || opt.dimensions > c.hidden)
        fail("dimensions ", opt.dimensions, " is not within [1, ", c.hidden, "] (the model's hidden size)");
    if (opt.chunk < 1) fail("the prefill chunk must be at least 1");
    for (size_t i = 0; i < inputs.size(); ++i) {
        const std::vector<int32_t>& in = inputs[i];
        if (in.empty()) fail("input ", i, " has no tokens");
        if (int64_t(in.size()) > eo.ctx)
            fail("input ", i, " has ", in.size(), " tokens, more than the context of ", eo.ctx, " positions (--ctx)");
        for (const int32_t t : in)
            if (t < 0 || t >= c.vocab) fail("input ", i, ": token id ", t, " is outside the vocabulary [0, ", c.vocab, ")");
    }
}

void finish_embedding(std::vector<float>& v, int64_t dimensions, bool normalize) {
    if (dimensions > 0 && size_t(dimensions) < v.size()) v.resize(size_t(dimensions));
    if (!normalize) return;
    double sq = 0;
    for (const float x : v) sq += double(x) * x;
    const double scale = 1.0 / std::max(std::sqrt(sq), 1e-12);
    for (float& x : v) x = float(x * scale);
}

Pooler::Pooler(Engine& engine, Pooling pooling, int64_t chunk, int64_t width, bool logits, PoolStep step, int32_t pad)
    : engine_(engine), pooling_(pooling), chunk_(chunk), width_(width), pad_(pad), step_(std::move(step)) {
    const EngineOptions& eo = engine.options();
    SHARDLM_CHECK(chunk >= 1 && width >= 1, "Pooler: chunk ", chunk, ", width ", width);
    // A hidden step may hand out a row per token; a logits step max_logit_rows.
    row_cap_ = !logits ? eo.max_step_tokens : eo.max_logit_rows > 0 ? eo.max_logit_rows : eo.max_batch;
    slots_.resize(size_t(eo.max_batch));
    rows_.resize(size_t(row_cap_ * width));
}

void Pooler::add(int64_t request, std::vector<std::vector<int32_t>> inputs) {
    if (inputs.empty()) return;
    Waiting w;
    w.request = request;
    for (size_t i = 0; i < inputs.size(); ++i) {
        std::vector<int32_t>& in = inputs[i];
        if (pad_ >= 0) {
            size_t end = in.size();
            while (end > 1 && in[end - 1] == pad_) --end;
            in.resize(end);
        }
        w.inputs.emplace_back(int64_t(i), std::move(in));
    }
    waiting_.push_back(std::move(w));
}

bool Pooler::idle() const {
    if (!waiting_.empty()) return false;
    for (const Slot& s : slots_)
        if (s.request >= 0) return false;
    return true;
}

std::vector<Pooler::Done> Pooler::step() {
    const EngineOptions& eo = engine_.options();
    const bool mean = pooling_ == Pooling::Mean;
    // The tokens an input runs: a causal model's first state sees only the first token.
    auto end_of = [&](const Slot& s) { return pooling_ == Pooling::Cls ? int64_t(1) : int64_t(s.tokens.size()); };
    // Free slots take the next input of the request next in turn, so that a later request's
    // inputs do not wait behind all of an earlier one's.
    for (Slot& s : slots_) {
        if (s.request >= 0 || waiting_.empty()) continue;
        Waiting w = std::move(waiting_.front());
        waiting_.pop_front();
        s = Slot{};
        s.request = w.request;
        s.index = w.inputs.front().first;
        s.tokens = std::move(w.inputs.front().second);
        s.acc.assign(size_t(width_), 0.0);
        w.inputs.pop_front();
        if (!w.inputs.empty()) waiting_.push_back(std::move(w));
    }
    std::vector<SeqChunk> chunks;
    std::vector<size_t> owner;  // each chunk's slot
    int64_t tokens = 0, n_rows = 0;
    for (size_t k = 0; k < slots_.size(); ++k) {
        const Slot& s = slots_[k];
        if (s.request < 0) continue;
        const int64_t end = end_of(s);
        int64_t n = std::min({end - s.pos, chunk_, eo.max_step_tokens - tokens});
        if (mean) n = std::min(n, row_cap_ - n_rows);
        else if (n_rows == row_cap_) n = std::min(n, end - s.pos - 1);  // no row left for its last token
        if (n <= 0) continue;
        SeqChunk ch;
        ch.slot = int64_t(k);
        ch.tokens = s.tokens.data() + s.pos;
        ch.n = n;
        ch.pos = s.pos;
        ch.all_logits = mean;
        ch.want_logits = !mean && s.pos + n == end;
        n_rows += mean ? n : ch.want_logits ? 1 : 0;
        tokens += n;
        chunks.push_back(ch);
        owner.push_back(k);
    }
    last_tokens_ = tokens;
    std::vector<Done> done;
    if (chunks.empty()) return done;
    step_(chunks, rows_.data());
    int64_t r = 0;
    for (size_t k = 0; k < chunks.size(); ++k) {
        Slot& s = slots_[owner[k]];
        const int64_t chunk_rows = mean ? chunks[k].n : chunks[k].want_logits ? 1 : 0;
        for (int64_t j = 0; j < chunk_rows; ++j, ++r)
            for (int64_t h = 0; h < width_; ++h) s.acc[size_t(h)] += double(rows_[size_t(r * width_ + h)]);
        s.pos += chunks[k].n;
        if (s.pos < end_of(s)) continue;
        const double count = mean ? double(s.pos) : 1.0;
        Done d{s.request, s.index, std::vector<float>(size_t(width_))};
        for (int64_t h = 0; h < width_; ++h) d.pooled[size_t(h)] = float(s.acc[size_t(h)] / count);
        done.push_back(std::move(d));
        s = Slot{};
    }
    return done;
}

std::vector<std::vector<float>> pool_inputs(Pooler& pooler, const std::vector<std::vector<int32_t>>& inputs) {
    SHARDLM_CHECK(pooler.idle(), "pool_inputs: the pooler is busy");
    pooler.add(0, inputs);
    std::vector<std::vector<float>> out(inputs.size());
    while (!pooler.idle())
        for (Pooler::Done& d : pooler.step()) out[size_t(d.index)] = std::move(d.pooled);
    return out;
}

Pooler embed_pooler(Engine& engine, const EmbedOptions& opt) {
    return Pooler(engine, opt.pooling, opt.chunk, engine.config().hidden, /*logits=*/false,
                  [&engine](const std::vector<SeqChunk>& chunks, float* rows) { engine.forward_hidden(chunks, rows); });
}

std::vector<std::vector<float>> embed(Engine& engine, const std::vector<std::vector<int32_t>>& inputs,
                                      const EmbedOptions& opt) {
    check_embed_inputs(engine.config(), engine.options(), inputs, opt);
    Pooler pooler = embed_pooler(engine, opt);
    std::vector<std::vector<float>> out = pool_inputs(pooler, inputs);
    for (std::vector<float>& v : out) finish_embedding(v, opt.dimensions, opt.normalize);
    return out;
}

}  // namespace shardlm
