// Sequence classification with a decoder: the last token's final hidden state through a small
// head. Two kinds of head, as vLLM runs them:
//   - a *ForSequenceClassification checkpoint's score.weight [num_labels, hidden] (rerankers
//     such as Qwen3-Reranker's sequence-classification conversions, reward models);
//   - lm_head rows of a few tokens of a causal LM (vLLM's classifier_from_token): the original
//     Qwen3-Reranker answers "yes" or "no", and its relevance is softmax(no, yes)'s second.
// A cross-encoder scores a (query, document) pair as one input (Tokenizer::encode_pair).
// shardlm classify and shardlm serve --rerank run it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"
#include "runtime/embed.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

struct Classifier {
    std::vector<std::string> labels;  // one per output
    std::vector<float> weight;        // [labels, hidden]: score.weight; empty for a token head
    std::vector<int32_t> tokens;      // a token head: label i is the logit of token tokens[i]
    bool multi_label = false;         // probabilities: a sigmoid per label instead of a softmax
    // A score head reads the last token that is not this id (ModelConfig::pad_id), as transformers'
    // ...ForSequenceClassification picks its row (an input of pads only: its first token); -1: the last.
    int32_t pad = -1;
};

// The head of a sequence-classification model (ModelConfig::head Classifier, weights.score), or,
// with `tokens` ({name, id}) given, one of those tokens' logits for a causal LM. Throws Error naming
// --classifier-tokens for a token head on a model without lm_head, a token outside the vocabulary
// or a repeated one, and for a model that has no head and no tokens.
Classifier make_classifier(const ModelConfig& c, const ModelWeights& w,
                           const std::vector<std::pair<std::string, int32_t>>& tokens);
// What make_classifier refuses first, from the config alone (before any weights load): a model with
// no classification head and no --classifier-tokens. `origin` (e.g. "DIR/config.json") leads the
// message when given.
void check_classifier_config(const ModelConfig& c, bool have_tokens, const std::string& origin = "");

// A pooler of the head's raw logits at each input's last token, [labels] per input (runtime/embed.h:
// Pooler; serve --rerank runs it). `head` must outlive it.
Pooler classify_pooler(Engine& engine, const Classifier& head, int64_t chunk);

// Each input's raw logits [inputs][labels] at its last token, `chunk` tokens of an input per step
// through the engine's slots (runtime/embed.h: pool_inputs). Throws Error for an empty input, one
// longer than the context, or an id outside the vocabulary (naming the input by index). A
// collective under tensor parallelism: every rank calls it with the same inputs.
std::vector<std::vector<float>> classify(Engine& engine, const Classifier& head,
                                         const std::vector<std::vector<int32_t>>& inputs, int64_t chunk);

// transformers' text-classification pipeline: a sigmoid per label for one label or a
// multi-label model, else a softmax over the labels.
std::vector<float> class_probabilities(const Classifier& head, const std::vector<float>& logits);

// A cross-encoder's relevance of a pair in [0, 1]: sigmoid of a one-label head, the positive
// (second) label's softmax share of a two-label one ("yes" of (no, yes), LABEL_1). Heads of more
// labels have no one relevance: check_relevance refuses them.
void check_relevance(const Classifier& head);
float relevance(const Classifier& head, const std::vector<float>& logits);

// A cross-encoder's (query, document) pair as one input. Without a template: the tokenizer's pair
// template (Tokenizer::encode_pair; max_tokens > 0 cuts the document's end to fit). With a rerank
// template (llama.cpp's: a text in which {query} and {document} stand for the two, e.g.
// Qwen3-Reranker's instruction and chat framing): the text filled in and encoded whole, as vLLM
// encodes a formatted prompt; max_tokens does not apply to it (Error).
std::vector<int32_t> encode_scored_pair(const Tokenizer& tok, const std::string& rerank_template, const std::string& query,
                                        const std::string& document, int64_t max_tokens = 0);
// Throws Error naming `flag` unless the template holds {query} and {document} once each.
void check_rerank_template(const std::string& t, const std::string& flag);

}  // namespace shardlm
