// Shared test helpers: temporary folders, tiny checkpoints, running the engine and the binary.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/synthetic.h"
#include "runtime/generate.h"
#include "runtime/session.h"

namespace shardlm::test {

// A fresh folder under $TMPDIR, removed with its contents when the object goes away.
class TempDir {
public:
    TempDir();
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return path_; }
    std::string file(const std::string& name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

// Sets (or, with nullptr, unsets) an environment variable for the object's lifetime, then puts
// back what was there. Commands run_command starts inherit it.
class ScopedEnv {
public:
    ScopedEnv(const char* name, const char* value);
    ~ScopedEnv();
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
    std::string name_, old_;
    bool had_ = false;
};

void write_file(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);

// Greedy generation through a fresh session; returns the result with prompt logits kept.
GenerateResult run_greedy(const std::string& dir, const std::vector<std::vector<int32_t>>& prompts,
                          int64_t max_new, int64_t prefill_chunk = 256, WeightFormat wf = WeightFormat::Auto,
                          KVFormat kv = KVFormat::F32);
// The same with every load option (--lora, --keep-fp16, ...).
GenerateResult run_greedy(const std::string& dir, const std::vector<std::vector<int32_t>>& prompts, int64_t max_new,
                          int64_t prefill_chunk, const LoadOptions& lo, KVFormat kv = KVFormat::F32);

// Greedy requests through a Batcher on `engine`, all added at once: request i runs under LoRA
// adapter adapters[i] (BatchRequest::adapter, -1: none) for max_new tokens, its prompt logits kept;
// at most max_adapters adapters among the running sequences (BatcherOptions::max_adapters, 0: any).
std::vector<SequenceResult> batch_greedy(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                         const std::vector<int64_t>& adapters, int64_t max_new, int64_t prefill_chunk,
                                         int64_t max_adapters = 0);

// Batch invariance: a sequence's logits alone (its prompt in one chunk, then a token a step) and in
// steps shared with two others (its prompt cut into other chunks beside theirs, its decode tokens
// between theirs), through sessions that `open` makes (max_batch >= 3, ctx >= 32). The first row
// that differs in any bit ("prefill", "decode step N"), or "" when none does.
std::string batch_invariance_mismatch(const std::function<std::unique_ptr<Session>()>& open, int64_t vocab);

// Deterministic pseudo-random prompt of length n over [3, vocab).
std::vector<int32_t> make_prompt(int64_t n, int64_t vocab, uint64_t seed);

struct CommandResult {
    int exit_code = -1;
    std::string out, err;
};
// Runs a shell command line, capturing stdout and stderr.
CommandResult run_command(const std::string& cmdline);

// Runs the shardlm binary with `args` and expects the CLI's error contract: non-zero exit (not a
// crash), exactly one stderr line "shardlm: error: ..." containing `needle`. GoogleTest assertions.
void expect_cli_error(const std::string& args, const std::string& needle);

// Whether the CPU engine's prefill GEMMs round their activations: the AMX variant's BF16 tiles carry
// them within 2^-16 (kernels/cpu/matmul_kernels.h), where the other variants and the decode GEMVs
// sum in plain f32. Two runs of one model that take different kernels (a decode step against a
// recompute, a rank's shard against the whole matrix) then differ by that rounding, not only by the
// order of their sums, and the engine tests widen their bounds by the measured amount.
bool cpu_prefill_rounds();
// Whether the CPU engine's products of INT8 and INT4 weights round their activations: on every
// vectorised variant, INT8 from 3 tokens on, INT4 up to 16 (unless AMX tiles take them), to int16 on a
// per-token scale (kernels/cpu/matmul_kernels.h), so a rank's shard of a row-parallel matrix, with a
// scale of its own, rounds differently from the whole matrix.
bool cpu_quantized_weights_round();

// One module's LoRA factors as PEFT saves them.
struct LoraModule {
    std::string module;  // e.g. "model.layers.0.self_attn.q_proj", or "model.embed_tokens"
    int64_t rank = 0;
    // lora_A [rank, in] and lora_B [out, rank]; the embedding's lora_embedding_A [rank, vocab] and
    // lora_embedding_B [hidden, rank]. Values exact in `dtype`.
    std::vector<float> a, b;
    std::string dtype = "F32";  // F32, F16 or BF16
    bool embedding() const { return module == "model.embed_tokens"; }
};
// Random factors of `module` in `cfg`'s shapes (|values| < 0.1, rounded to dtype).
LoraModule random_lora_module(const ModelConfig& cfg, const std::string& module, int64_t rank, uint64_t seed,
                              const std::string& dtype = "F32");
// An adapter folder: dir/adapter_config.json (the text given) and dir/adapter_model.safetensors
// with each module's base_model.model.<module>.lora_A.weight / lora_B.weight (or lora_embedding_A/B).
void write_lora_adapter(const std::string& dir, const std::string& adapter_config, const std::vector<LoraModule>& modules);

// The message of the shardlm::Error `f` throws, or "" when it returns.
std::string thrown_error(const std::function<void()>& f);

// Largest |a - b| over two equally long vectors: infinity for different lengths or a NaN on
// either side, 0 for equal values (equal infinities too).
float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);
// Cosine similarity of two rows of logits (in double).
double cosine(const std::vector<float>& a, const std::vector<float>& b);

// A copy of checkpoint `src` as the base model class saves it (Qwen3Model, LlamaModel: e.g.
// Qwen3-Embedding): every tensor name without "model.", no lm_head.weight (for tied models), in
// the same files and index.
void write_without_model_prefix(const std::string& src, const std::string& dst);
// A sequence-classification copy of the one-file checkpoint in src, as transformers saves
// <Family>ForSequenceClassification: config.json's architectures and id2label of `labels`, every
// tensor but lm_head.weight, and score.weight [labels, hidden] F32 = `score`; the tokenizer files
// come along.
void write_classifier(const std::string& src, const std::string& dst, const std::vector<std::string>& labels,
                      const std::vector<float>& score);
// Rows `rows` of a one-file checkpoint's F32/BF16 matrix `name` as f32, one after the other.
std::vector<float> checkpoint_rows(const std::string& dir, const std::string& name, const std::vector<int32_t>& rows);

}  // namespace shardlm::test
