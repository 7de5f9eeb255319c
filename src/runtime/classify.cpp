#include "runtime/classify.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "runtime/embed.h"

namespace shardlm {

namespace {

// The rows a last-token pooling step hands out: one per chunk that ends its input (the engine
// checks the step itself).
int64_t last_rows(const std::vector<SeqChunk>& chunks) {
    return int64_t(std::count_if(chunks.begin(), chunks.end(), [](const SeqChunk& ch) { return ch.want_logits; }));
}

}  // namespace

void check_classifier_config(const ModelConfig& c, bool have_tokens, const std::string& origin) {
    if (have_tokens || c.head == Head::Classifier) return;
    fail(origin.empty() ? "" : origin + ": ", c.architecture,
         " has no classification head: load a ...ForSequenceClassification checkpoint, or name the tokens whose logits "
         "are the labels with --classifier-tokens (e.g. no,yes for Qwen3-Reranker)");
}

Classifier make_classifier(const ModelConfig& c, const ModelWeights& w,
                           const std::vector<std::pair<std::string, int32_t>>& tokens) {
    Classifier h;
    if (!tokens.empty()) {
        if (w.headless)
            fail("--classifier-tokens: ", c.architecture, " has no lm_head to read token logits from",
                 c.head == Head::Classifier ? " (its own score head classifies: leave the flag out)" : "");
        for (const auto& [name, id] : tokens) {
            if (id < 0 || id >= c.vocab) fail("--classifier-tokens: \"", name, "\" is not a token of the vocabulary");
            if (std::find(h.tokens.begin(), h.tokens.end(), id) != h.tokens.end())
                fail("--classifier-tokens: \"", name, "\" is listed twice");
            h.labels.push_back(name);
            h.tokens.push_back(id);
        }
        return h;
    }
    check_classifier_config(c, false);
    SHARDLM_CHECK(w.score.size() == c.labels.size() * size_t(c.hidden), "make_classifier: score head of ", w.score.size(),
                  " values for ", c.labels.size(), " labels");
    h.labels = c.labels;
    h.weight = w.score;
    h.multi_label = c.multi_label;
    h.pad = c.pad_id >= 0 && c.pad_id < c.vocab ? int32_t(c.pad_id) : -1;
    return h;
}

Pooler classify_pooler(Engine& engine, const Classifier& head, int64_t chunk) {
    const ModelConfig& c = engine.config();
    const int64_t n_labels = int64_t(head.labels.size());
    if (!head.tokens.empty()) {
        // The logits of the labels' tokens: whole rows from the engine, cut down to those columns.
        return Pooler(engine, Pooling::Last, chunk, n_labels, /*logits=*/true,
                      [&engine, &head, &c, n_labels, logits = std::vector<float>()](const std::vector<SeqChunk>& chunks,
                                                                                    float* rows) mutable {
                          const int64_t n = last_rows(chunks);
                          logits.resize(size_t(n * c.vocab));
                          engine.forward(chunks, logits.data());
                          for (int64_t r = 0; r < n; ++r)
                              for (int64_t k = 0; k < n_labels; ++k)
                                  rows[r * n_labels + k] = logits[size_t(r * c.vocab + head.tokens[size_t(k)])];
                      });
    }
    // The score head on each last (non-pad) token's state, in f64 sums.
    return Pooler(engine, Pooling::Last, chunk, n_labels, /*logits=*/false,
                  [&engine, &head, &c, n_labels, hidden = std::vector<float>()](const std::vector<SeqChunk>& chunks,
                                                                                float* rows) mutable {
                      const int64_t n = last_rows(chunks);
                      hidden.resize(size_t(n * c.hidden));
                      engine.forward_hidden(chunks, hidden.data());
                      for (int64_t r = 0; r < n; ++r)
                          for (int64_t k = 0; k < n_labels; ++k) {
                              double acc = 0;
                              const float* wk = head.weight.data() + k * c.hidden;
                              const float* h = hidden.data() + r * c.hidden;
                              for (int64_t j = 0; j < c.hidden; ++j) acc += double(wk[j]) * h[j];
                              rows[r * n_labels + k] = float(acc);
                          }
                  },
                  head.pad);
}

std::vector<std::vector<float>> classify(Engine& engine, const Classifier& head,
                                         const std::vector<std::vector<int32_t>>& inputs, int64_t chunk) {
    EmbedOptions check;
    check.chunk = chunk;
    check_embed_inputs(engine.config(), engine.options(), inputs, check);
    Pooler pooler = classify_pooler(engine, head, chunk);
    return pool_inputs(pooler, inputs);
}

std::vector<float> class_probabilities(const Classifier& head, const std::vector<float>& logits) {
    std::vector<float> p(logits.size());
    if (head.multi_label || logits.size() == 1) {
        for (size_t i = 0; i < logits.size(); ++i) p[i] = float(1.0 / (1.0 + std::exp(-double(logits[i]))));
        return p;
    }
    const double mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (size_t i = 0; i < logits.size(); ++i) sum += std::exp(double(logits[i]) - mx);
    for (size_t i = 0; i < logits.size(); ++i) p[i] = float(std::exp(double(logits[i]) - mx) / sum);
    return p;
}

void check_relevance(const Classifier& head) {
    if (head.labels.size() > 2 || (head.multi_label && head.labels.size() != 1))
        fail("this classifier has ", head.labels.size(), head.multi_label ? " independent" : "",
             " labels: a relevance score needs one label (its sigmoid) or two (the second's softmax share)");
}

float relevance(const Classifier& head, const std::vector<float>& logits) {
    check_relevance(head);
    if (logits.size() == 1) return float(1.0 / (1.0 + std::exp(-double(logits[0]))));
    return float(1.0 / (1.0 + std::exp(double(logits[0]) - double(logits[1]))));  // softmax's second of two
}

void check_rerank_template(const std::string& t, const std::string& flag) {
    for (const char* field : {"{query}", "{document}"}) {
        const size_t at = t.find(field);
        if (at == std::string::npos || t.find(field, at + 1) != std::string::npos)
            fail(flag, ": the template must hold ", field, " once");
    }
}

std::vector<int32_t> encode_scored_pair(const Tokenizer& tok, const std::string& rerank_template, const std::string& query,
                                        const std::string& document, int64_t max_tokens) {
    if (rerank_template.empty()) return tok.encode_pair(query, document, max_tokens);
    if (max_tokens > 0) fail("truncation does not apply to a pair filled into a rerank template");
    // Each placeholder once (check_rerank_template), filled from the template's own positions so
    // that a query holding "{document}" is left as it is.
    const std::string& t = rerank_template;
    const size_t q = t.find("{query}"), d = t.find("{document}");
    SHARDLM_CHECK(q != std::string::npos && d != std::string::npos, "encode_scored_pair: unchecked template");
    const bool q_first = q < d;
    const size_t a = q_first ? q : d, a_len = q_first ? 7 : 10, b = q_first ? d : q, b_len = q_first ? 10 : 7;
    const std::string text = t.substr(0, a) + (q_first ? query : document) + t.substr(a + a_len, b - a - a_len) +
                             (q_first ? document : query) + t.substr(b + b_len);
    return tok.encode(text);
}

}  // namespace shardlm
