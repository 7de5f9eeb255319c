// Command-line helpers shared by the subcommands.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/json_schema.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

namespace po = boost::program_options;

// Parses `args` against `desc`; throws Error with the flag named for unknown or bad options.
// Returns false when --help was given (usage printed when `print` is set).
bool parse_args(const std::vector<std::string>& args, const po::options_description& desc,
                po::variables_map& vm, const std::string& usage, bool print = true);

// "1,2,3;4,5" -> {{1,2,3},{4,5}}; throws Error naming --prompt-ids on malformed input.
std::vector<std::vector<int32_t>> parse_prompt_ids(const std::string& s);

// --seed, read as text: boost reads "-1" into a uint64_t as 2^64 - 1 without a word. Throws Error
// naming --seed unless `s` is a decimal integer in [0, 2^64 - 1].
uint64_t parse_seed(const std::string& s);

// The precision flags shared by generate, bench and perplexity.
struct PrecisionFlags {
    std::string weights = "auto", kv = "auto", keep_fp16;
    int64_t group_size = 0;
    std::vector<std::string> lora;  // --lora DIR, repeatable
    std::vector<float> lora_scale;  // --lora-scale S: none, one for all, or one per --lora
};
void add_precision_options(po::options_description& d, PrecisionFlags& f);
// Into the session's options (throws Error naming the flag on a bad value).
void apply_precision(const PrecisionFlags& f, SessionOptions& so);

// --lora DIR (repeatable) with --lora-scale S: no scale (1 each), one scale for every adapter, or one
// per adapter in the order given; throws Error naming --lora-scale otherwise, or for a scale that
// is not finite. Shared by the commands with precision flags and by quantize.
std::vector<LoraAdapter> lora_adapters(const std::vector<std::string>& dirs, const std::vector<float>& scales);

// Where and how the engine runs, shared by generate, bench and perplexity.
struct BackendFlags {
    std::string device = "auto", attention = "flash";
    bool no_cuda_graph = false, no_mmap = false, batch_invariant = false;
};
void add_backend_options(po::options_description& d, BackendFlags& f);
void apply_backend(const BackendFlags& f, SessionOptions& so);  // throws Error naming the flag

// --generation-config VALUE (serve, generate and chat; vLLM's flag): "auto" reads MODEL_DIR's
// generation_config.json where there is one, "vllm" none (the built-in defaults), a folder its
// generation_config.json, which must exist. Throws Error naming the flag or the file and key.
GenerationDefaults load_generation_defaults(const std::string& value, const std::string& model_dir);
// " temperature 0.6, top_p 0.95, ..." for the defaults that are set.
std::string describe_generation_defaults(const GenerationDefaults& d);

// Sampling, token penalties and stop strings, shared by generate and chat.
struct SamplingFlags {
    float temperature = 0.8f, top_p = 0.95f, min_p = 0.0f;
    int64_t top_k = 40;
    std::string generation_config = "auto";  // --generation-config (apply_generation_defaults)
    std::string seed = "0";
    float repetition = 1.0f, presence = 0.0f, frequency = 0.0f;
    int64_t penalty_last_n = 64;
    std::vector<std::string> stops;
    std::vector<std::string> logit_bias;  // ID=BIAS each
};
void add_sampling_options(po::options_description& d, SamplingFlags& f);
// The model's sampling defaults (--generation-config, load_generation_defaults) into the flags the
// command line left at their built-in defaults, as vLLM's LLM.generate takes them: temperature,
// top-k (-1 or 0: all), top-p, min-p and repetition-penalty. With `say`, names those it set on
// stderr as "shardlm COMMAND: ...".
void apply_generation_defaults(SamplingFlags& f, const po::variables_map& vm, const std::string& model_dir,
                               const std::string& command, bool say);
// Into the sampler's options (throws Error naming the flag on a bad value, --stop's included).
SamplerOptions apply_sampling(const SamplingFlags& f);

// Rank 0's prompts to every rank (a collective): [count, len_0, ids_0..., len_1, ids_1...] as
// int32. No prompts is a message too (shardlm chat: the input has ended).
void broadcast_prompts(Communicator& comm, std::vector<std::vector<int32_t>>& prompts);

// --tp N: 0, or the number of ranks mpirun started (throws Error naming the flag).
void check_tp_flag(int tp, const Communicator& comm);
// --ctx for the commands that hold a conversation or serve requests (chat, serve): the flag, or
// 4096 positions (at most max_position_embeddings), with ctx_origin naming `command`'s default.
void set_session_ctx(SessionOptions& so, int64_t ctx, const ModelConfig& cfg, const std::string& command);
// Logits rows per step for scoring prompts (prompt logprobs, echo): one per slot and up to 64 a
// step for a scored prompt's tokens (64 vocabulary rows of workspace, ~39 MB for Qwen3's).
// so.max_batch and so.prefill_chunk set first.
void set_scoring_rows(SessionOptions& so);
// --speculate N: logits rows for every slot's N proposed tokens and its own (within a step's
// tokens, --prefill-chunk). so.max_batch and so.prefill_chunk set first.
void set_speculation_rows(SessionOptions& so, int64_t n);

// --chat-template (serve, chat, generate; vLLM's serve flag): a template file, or the template
// itself (text with "{{" or "{%" in it), in place of the model's; empty: the model's. Throws
// Error naming the flag for a value that is neither.
void add_chat_template_option(po::options_description& d, std::string& value);
std::optional<Tokenizer::ChatTemplateFile> chat_template_override(const std::string& value);

// JSON mode's vocabulary (runtime/json_mode.h): what each token adds to the text, special tokens
// nothing (never chosen).
std::vector<std::string> json_token_bytes(const Tokenizer& tok);
// --json-object, --json-schema FILE, --regex PATTERN, --grammar TEXT and --grammar-file FILE
// (generate, chat): the JSON schema, the pattern of raw text (vLLM's guided_regex) or the GBNF
// grammar each sequence is held to.
struct JsonFlags {
    bool object = false;
    std::string schema_file;
    std::string regex;
    std::string grammar, grammar_file;  // --grammar TEXT, --grammar-file FILE (runtime/grammar.h)
    int whitespace = JsonSchema::kDefaultSpace;  // --json-whitespace (JsonSchema::max_space)
};
// --json-whitespace's check (generate, chat, serve): throws Error naming the flag.
void check_json_whitespace(int n);
void add_json_options(po::options_description& d, JsonFlags& f);
// The schema the flags ask for (JSON mode's for --json-object), null for neither; throws Error
// naming the flag or the schema's fault. Every rank calls it (each masks its rows alike).
std::shared_ptr<const JsonSchema> apply_json(const JsonFlags& f);
// The flag in use, for messages ("--json-object", "--regex", "--grammar", ...); "" for none.
std::string json_flag(const JsonFlags& f);
// --speculate's bounds.
constexpr int64_t kMaxSpeculate = 16;

// --draft-model DIR (speculative decoding with a draft model, runtime/draft_model.h): the checks
// made before any weights load (throws Error naming the flag or file): --speculate N > 0, a
// checkpoint there, and the same vocabulary as the target so.model_dir (each id the same token in
// both tokenizer.json where both have one; else vocabulary sizes within 128, as llama.cpp allows).
void check_draft_model(const std::string& draft, const SessionOptions& so, int64_t speculate);
// --draft-model DIR and --draft-p-min P for generate, chat and serve.
struct DraftFlags {
    std::string model;
    float p_min = 0.75f;
};
void add_draft_options(po::options_description& d, DraftFlags& f);
// Throws Error naming --draft-p-min outside [0, 1], or given without --draft-model.
void check_draft_flags(const DraftFlags& f, const po::variables_map& vm);
// The draft's session: so's slots, context, device, backend, --weights and --kv (its own
// --keep-fp16/--group-size only under a quantizing --weights; no --lora), one logits row per slot.
std::unique_ptr<Session> open_draft_session(const std::string& draft, const SessionOptions& so, Communicator& comm);

// Throws unless every rank runs the same command line on the same model with the same build: a
// collective (check_same_on_all_ranks), called inside run_together after the session is open.
void check_same_request(Communicator& comm, const std::vector<std::string>& args, const Session& s);

// Sets the CPU thread count (0 keeps the default: one per core).
void set_threads(int threads);

// Peak resident memory of this process in bytes.
size_t peak_rss_bytes();

}  // namespace shardlm
