// Text embeddings from a decoder model: each input's final hidden states (Engine::forward_hidden)
// pooled into one vector, as sentence-transformers does for the decoder embedding models
// (Qwen3-Embedding, gte-Qwen2, e5-mistral: the last token's state, L2-normalized). The model
// folder's sentence-transformers files say how to pool; shardlm embed and shardlm serve
// --embeddings run it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace shardlm {

// Last: the input's last token (what a causal model's state sums up); Mean: the average over its
// tokens; Cls: its first token (for a causal model that state sees the first token alone).
enum class Pooling { Last, Mean, Cls };
Pooling parse_pooling(const std::string& s);  // throws Error naming --pooling
const char* pooling_name(Pooling p);          // "last", "mean", "cls"

// What a sentence-transformers folder says (modules.json, its Pooling module's config.json,
// config_sentence_transformers.json). Without modules.json: last-token pooling, normalized.
struct EmbeddingConfig {
    Pooling pooling = Pooling::Last;
    bool normalize = true;
    std::map<std::string, std::string> prompts;  // named instruction prefixes ("query": "Instruct: ...")
    std::string default_prompt;                  // default_prompt_name's text ("": none)
    std::string pooling_source = "default";      // the file pooling came from, for messages
};
// The prefixes of sentence-transformers' encode_query and encode_document: the prompt named
// "query" (else the default one), and the one named "document", "passage" or "corpus" (else the
// default one).
std::string query_prompt(const EmbeddingConfig& ec);
std::string document_prompt(const EmbeddingConfig& ec);
// Throws Error naming the file for what this runtime cannot reproduce: a module other than the
// Transformer, one Pooling and an optional Normalize (e.g. Dense), a pooling mode other than
// last/mean/cls, include_prompt false, malformed JSON.
EmbeddingConfig load_embedding_config(const std::string& model_dir);

struct EmbedOptions {
    Pooling pooling = Pooling::Last;
    bool normalize = true;
    int64_t dimensions = 0;  // keep the first this many dimensions (Matryoshka), before normalizing; 0: all
    int64_t chunk = 256;     // most tokens of one input per step
};

// Checks every input before anything runs: not empty, within the engine's context (the error
// names the input by index), and dimensions within [0, hidden].
void check_embed_inputs(const ModelConfig& c, const EngineOptions& eo, const std::vector<std::vector<int32_t>>& inputs,
                        const EmbedOptions& opt);

// A pooled vector as handed out: its first `dimensions` (0: all), then L2-normalized when
// `normalize` (torch's F.normalize: over max(norm, 1e-12)).
void finish_embedding(std::vector<float>& v, int64_t dimensions, bool normalize);

// One step of pool_inputs: runs the chunks and writes the rows they want (SeqChunk::want_logits /
// all_logits, in order) into rows [n, width]: Engine::forward_hidden, or logits columns.
using PoolStep = std::function<void(const std::vector<SeqChunk>& chunks, float* rows)>;
// Pools inputs that arrive over time through the engine's slots (what pool_inputs and serve's
// embedding loop run): requests queue their inputs, a free slot takes the next input of the
// request next in turn (round robin, each request's inputs in order), and each step() runs one
// engine step over the slots' chunks (at most `chunk` tokens of an input, max_step_tokens in all;
// and with `logits`, max_logit_rows wanted rows) and returns the inputs it finished, pooled (not
// cut, not normalized). Deterministic: ranks that add the same inputs in the same order run the
// same steps (a collective under tensor parallelism). The inputs must have passed
// check_embed_inputs.
class Pooler {
public:
    // pad >= 0: each input ends at its last token that is not `pad` (its first token when all are):
    // for a causal model the state there is the same with or without what follows it.
    Pooler(Engine& engine, Pooling pooling, int64_t chunk, int64_t width, bool logits, PoolStep step,
           int32_t pad = -1);
    void add(int64_t request, std::vector<std::vector<int32_t>> inputs);
    bool idle() const;  // nothing queued or running
    struct Done {
        int64_t request = 0, index = 0;  // the request and its input's index in it
        std::vector<float> pooled;       // [width]
    };
    std::vector<Done> step();
    int64_t last_step_tokens() const { return last_tokens_; }

private:
    struct Slot {
        int64_t request = -1, index = 0, pos = 0;
        std::vector<int32_t> tokens;
        std::vector<double> acc;
    };
    struct Waiting {
        int64_t request = 0;
        std::deque<std::pair<int64_t, std::vector<int32_t>>> inputs;  // (index, tokens), in order
    };
    Engine& engine_;
    Pooling pooling_;
    int64_t chunk_, width_, row_cap_ = 0, last_tokens_ = 0;
    int32_t pad_;
    PoolStep step_;
    std::vector<Slot> slots_;
    std::deque<Waiting> waiting_;  // requests with inputs not yet in a slot, in turn
    std::vector<float> rows_;      // a step's rows, [row_cap, width]
};

// Runs an idle pooler over the inputs to the end: each input's pooled rows, [inputs][width] (the
// loop embed() and classify() run).
std::vector<std::vector<float>> pool_inputs(Pooler& pooler, const std::vector<std::vector<int32_t>>& inputs);
// An embedding pooler: the final hidden states (Engine::forward_hidden) pooled as `opt` says, [hidden]
// per input, not cut or normalized (finish_embedding does that).
Pooler embed_pooler(Engine& engine, const EmbedOptions& opt);

// The inputs' embeddings, [inputs][dimensions or hidden]. The engine's slots take an input each;
// their chunks share steps of at most max_step_tokens rows, and
// a slot takes the next input as soon as its own is done. A collective under tensor parallelism:
// every rank calls it with the same inputs and gets the same vectors.
std::vector<std::vector<float>> embed(Engine& engine, const std::vector<std::vector<int32_t>>& inputs,
                                      const EmbedOptions& opt);

}  // namespace shardlm
