#include "cli/options.h"

#include <algorithm>
#include <cmath>
#include <sys/resource.h>

#include <iostream>
#include <limits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "comm/together.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "model/synthetic.h"
#include "runtime/grammar.h"
#include "tokenizer/tokenizer.h"

#include "git_commit.h"  // SHARDLM_GIT_COMMIT, generated at build time

namespace shardlm {

bool parse_args(const std::vector<std::string>& args, const po::options_description& desc,
                po::variables_map& vm, const std::string& usage, bool print) {
    try {
        const po::parsed_options parsed = po::command_line_parser(args).options(desc).run();
        // A word that belongs to no flag (e.g. `--prompt hello world` unquoted) would otherwise be
        // dropped without a word.
        for (const auto& o : parsed.options)
            if (o.position_key >= 0 && !o.value.empty())
                fail("unexpected argument \"", o.value.front(), "\" (every value follows its --flag; quote values with spaces)");
        po::store(parsed, vm);
        if (vm.count("help")) {
            if (print) std::cout << usage << "\n\n" << desc << "\n";
            return false;
        }
        po::notify(vm);
    } catch (const po::error& e) {
        fail(e.what());
    }
    return true;
}

std::vector<std::vector<int32_t>> parse_prompt_ids(const std::string& s) {
    std::vector<std::vector<int32_t>> out(1);
    size_t i = 0;
    while (i <= s.size()) {
        if (i == s.size() || s[i] == ';') {
            if (out.back().empty()) fail("--prompt-ids: prompt ", out.size() - 1, " is empty");
            if (i == s.size()) break;
            out.emplace_back();
            ++i;
            continue;
        }
        if (s[i] == ',' || s[i] == ' ') { ++i; continue; }
        size_t j = i;
        while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
        if (j == i || j - i > 9) fail("--prompt-ids: expected a token id at \"", s.substr(i, 12), "\"");
        out.back().push_back(int32_t(std::stol(s.substr(i, j - i))));
        i = j;
    }
    return out;
}

uint64_t parse_seed(const std::string& s) {
    const uint64_t max = std::numeric_limits<uint64_t>::max();
    if (s.empty()) fail("--seed: expected an integer in [0, ", max, "], got \"\"");
    uint64_t v = 0;
    for (char ch : s) {
        const uint64_t d = uint64_t(ch - '0');
        if (ch < '0' || ch > '9' || v > (max - d) / 10) fail("--seed: expected an integer in [0, ", max, "], got \"", s, "\"");
        v = v * 10 + d;
    }
    return v;
}

void add_precision_options(po::options_description& d, PrecisionFlags& f) {
    d.add_options()
        ("weights", po::value(&f.weights)->default_value("auto"),
         "auto|fp32|fp16|bf16|int8|w8a8|int4|w4a8 (auto: as stored; int8: INT8 weights; w8a8: also INT8 activations; "
         "int4: AWQ-style 4-bit layer weights, INT8 lm_head; w4a8: int4 with INT8 activations)")
        ("kv", po::value(&f.kv)->default_value("auto"), "KV cache auto|fp32|fp16|bf16|int8 (auto: fp32)")
        ("group-size", po::value(&f.group_size)->default_value(0), "quantization scale per group of G inputs (0: per output channel for int8/w8a8, 128 for int4/w4a8)")
        ("keep-fp16", po::value(&f.keep_fp16), "int8/w8a8/int4/w4a8: keep Linear tensors whose HF name matches this regex in FP16/BF16")
        ("lora", po::value(&f.lora)->composing(),
         "DIR: merge this LoRA adapter (PEFT's folder: adapter_config.json, adapter_model.safetensors) into the float "
         "weights as they load, before any quantization (repeatable: the adapters add up)")
        ("lora-scale", po::value(&f.lora_scale)->composing(),
         "S: the adapter's weight, W + S * (alpha / r) * B A (default 1; one value for every --lora, or one per --lora in order)");
}

std::vector<LoraAdapter> lora_adapters(const std::vector<std::string>& dirs, const std::vector<float>& scales) {
    if (!scales.empty() && dirs.empty()) fail("--lora-scale needs a --lora adapter");
    if (scales.size() > 1 && scales.size() != dirs.size())
        fail("--lora-scale: ", scales.size(), " scales for ", dirs.size(), " --lora adapters (give one for all, or one each)");
    std::vector<LoraAdapter> out;
    for (size_t i = 0; i < dirs.size(); ++i) {
        const float s = scales.empty() ? 1.0f : scales.size() == 1 ? scales[0] : scales[i];
        if (!std::isfinite(s)) fail("--lora-scale: ", s, " is not a finite number");
        out.push_back({dirs[i], s});
    }
    return out;
}

void apply_precision(const PrecisionFlags& f, SessionOptions& so) {
    so.load.format = parse_weight_format(f.weights);
    so.load.group_size = f.group_size;
    so.load.keep_fp16 = f.keep_fp16;
    so.load.lora = lora_adapters(f.lora, f.lora_scale);
    so.kv = parse_kv_format(f.kv);
    if (f.group_size < 0) fail("--group-size must be >= 0");
    if ((f.group_size > 0 || !f.keep_fp16.empty()) && !is_quantized(so.load.format) && so.load.format != WeightFormat::Auto)
        fail("--group-size and --keep-fp16 apply to --weights int8, w8a8, int4 or w4a8");
}

void add_backend_options(po::options_description& d, BackendFlags& f) {
    d.add_options()
        ("device", po::value(&f.device)->default_value("auto"), "auto|cpu|cuda (auto: CUDA when every rank of the node has a GPU)")
        ("attention", po::value(&f.attention)->default_value("flash"),
         "flash|naive (flash: tiled kernel with online softmax, split-KV decode on the GPU; naive: plain passes)")
        ("no-cuda-graph", po::bool_switch(&f.no_cuda_graph), "CUDA: run decode and verify steps eagerly instead of replaying captured graphs")
        ("batch-invariant", po::bool_switch(&f.batch_invariant),
         "CPU: each sequence's logits the same bits whatever other sequences share its steps and however its prompt "
         "is cut into chunks (one kernel per weight format for every batch size; slower prefill)")
        ("no-mmap", po::bool_switch(&f.no_mmap),
         "CPU: copy the weights kept as stored into memory (huge pages) instead of reading them through the file map: "
         "faster decode, slower start");
}

void apply_backend(const BackendFlags& f, SessionOptions& so) {
    so.device = parse_device(f.device);
    so.attention = parse_attention(f.attention);
    so.cuda_graphs = !f.no_cuda_graph;
    so.batch_invariant = f.batch_invariant;
    so.load.copy_mapped = f.no_mmap;
}

void add_sampling_options(po::options_description& d, SamplingFlags& f) {
    d.add_options()
        ("temperature", po::value(&f.temperature)->default_value(0.8f, "0.8"), "0 is greedy")
        ("top-k", po::value(&f.top_k)->default_value(40), "keep the k most likely tokens (0: all)")
        ("top-p", po::value(&f.top_p)->default_value(0.95f, "0.95"), "nucleus sampling mass (1: off)")
        ("min-p", po::value(&f.min_p)->default_value(0.0f, "0"),
         "after top-p, drop tokens less than min-p times as probable as the most probable (0: off)")
        ("repetition-penalty", po::value(&f.repetition)->default_value(1.0f, "1"),
         "divide the positive logits of recent tokens by this, multiply the negative ones (1: off)")
        ("presence-penalty", po::value(&f.presence)->default_value(0.0f, "0"),
         "subtract this from the logit of every recent token (0: off)")
        ("frequency-penalty", po::value(&f.frequency)->default_value(0.0f, "0"),
         "subtract this times its count from the logit of every recent token (0: off)")
        ("penalty-last-n", po::value(&f.penalty_last_n)->default_value(64),
         "recent tokens = the last N of prompt and output (-1: the whole context, 0: penalties off)")
        ("logit-bias", po::value(&f.logit_bias)->composing(),
         "ID=BIAS: add BIAS (-100 .. 100) to token ID's logit before sampling, with the penalties (repeatable; "
         "-100 all but bans the token, 100 all but forces it)")
        ("seed", po::value(&f.seed)->default_value("0"), "sampling seed, 0 .. 2^64-1")
        ("generation-config", po::value(&f.generation_config)->default_value("auto"),
         "auto: the model's generation_config.json sets temperature, top-k, top-p, min-p and repetition-penalty "
         "where these flags are not given (vLLM's default); vllm: the defaults above; a folder: its generation_config.json")
        ("stop", po::value(&f.stops)->composing(),
         "stop a sequence once its text contains STR (repeatable); the text ends before it");
}

GenerationDefaults load_generation_defaults(const std::string& value, const std::string& model_dir) {
    if (value == "vllm") return {};
    const std::string file = (value == "auto" ? model_dir : value) + "/generation_config.json";
    if (file_exists(file)) return parse_generation_defaults(read_text_file(file), file);
    if (value != "auto") fail("--generation-config ", value, ": ", file, " does not exist (auto, vllm or a folder)");
    return {};
}

std::string describe_generation_defaults(const GenerationDefaults& d) {
    std::string out;
    auto add = [&](const char* key, const std::string& v) { out += cat(out.empty() ? " " : ", ", key, " ", v); };
    if (d.temperature) add("temperature", cat(*d.temperature));
    if (d.top_p) add("top_p", cat(*d.top_p));
    if (d.top_k) add("top_k", cat(*d.top_k));
    if (d.min_p) add("min_p", cat(*d.min_p));
    if (d.repetition_penalty) add("repetition_penalty", cat(*d.repetition_penalty));
    return out;
}

void apply_generation_defaults(SamplingFlags& f, const po::variables_map& vm, const std::string& model_dir,
                               const std::string& command, bool say) {
    const GenerationDefaults d = load_generation_defaults(f.generation_config, model_dir);
    GenerationDefaults used;
    auto left = [&](const char* flag) { return vm.count(flag) == 0 || vm[flag].defaulted(); };
    if (d.temperature && left("temperature")) f.temperature = float(*(used.temperature = d.temperature));
    if (d.top_k && left("top-k")) f.top_k = std::max<int64_t>(*(used.top_k = d.top_k), 0);
    if (d.top_p && left("top-p")) f.top_p = float(*(used.top_p = d.top_p));
    if (d.min_p && left("min-p")) f.min_p = float(*(used.min_p = d.min_p));
    if (d.repetition_penalty && left("repetition-penalty")) f.repetition = float(*(used.repetition_penalty = d.repetition_penalty));
    if (say && used.any())
        std::cerr << "shardlm " << command << ": sampling defaults from generation_config.json:"
                  << describe_generation_defaults(used) << " (flags override them; --generation-config vllm: the built-in ones)"
                  << std::endl;
}

SamplerOptions apply_sampling(const SamplingFlags& f) {
    SamplerOptions o;
    o.temperature = f.temperature;
    o.top_k = f.top_k;
    o.top_p = f.top_p;
    o.min_p = f.min_p;
    o.seed = parse_seed(f.seed);
    o.repetition_penalty = f.repetition;
    o.presence_penalty = f.presence;
    o.frequency_penalty = f.frequency;
    o.penalty_last_n = f.penalty_last_n;
    for (const std::string& b : f.logit_bias) {
        // ID=BIAS: a token id, a number (the vocabulary's bound is checked with the model).
        const size_t eq = b.find('=');
        size_t used = 0;
        int64_t id = -1;
        float bias = 0;
        bool ok = eq != std::string::npos && eq > 0 && eq + 1 < b.size() &&
                  b.find_first_not_of("0123456789") == eq && eq <= 10;
        try {
            if (ok) id = std::stoll(b.substr(0, eq));
            if (ok) bias = std::stof(b.substr(eq + 1), &used);
        } catch (const std::exception&) {
            ok = false;
        }
        if (!ok || used != b.size() - eq - 1 || id > std::numeric_limits<int32_t>::max())
            fail("--logit-bias: expected ID=BIAS (a token id and a number in [-100, 100]), got \"", b, "\"");
        o.logit_bias.emplace_back(int32_t(id), bias);
    }
    Sampler check(o, 0);  // validates the values
    (void)check;
    for (const std::string& st : f.stops)
        if (st.empty()) fail("--stop: a stop string must not be empty");
    return o;
}

void set_scoring_rows(SessionOptions& so) {
    so.max_logit_rows = std::max<int64_t>(so.max_batch, std::min<int64_t>(so.prefill_chunk, 64));
}

void set_speculation_rows(SessionOptions& so, int64_t n) {
    if (n <= 0) return;
    so.max_logit_rows = std::max({so.max_logit_rows, so.max_batch, std::min<int64_t>(so.max_batch * (n + 1), so.prefill_chunk)});
}

void add_draft_options(po::options_description& d, DraftFlags& f) {
    d.add_options()
        ("draft-model", po::value(&f.model),
         "DIR: --speculate's proposals from this smaller model of the same vocabulary, run greedily N tokens ahead "
         "(instead of prompt lookup); loaded with the same --weights, --kv and device")
        ("draft-p-min", po::value(&f.p_min)->default_value(0.75f, "0.75"),
         "--draft-model: a proposal ends before a token the draft gives less than this probability (0: always N)");
}

void check_draft_flags(const DraftFlags& f, const po::variables_map& vm) {
    if (!(f.p_min >= 0.0f && f.p_min <= 1.0f)) fail("--draft-p-min must be in [0, 1]");
    if (!vm["draft-p-min"].defaulted() && f.model.empty()) fail("--draft-p-min needs --draft-model");
}

namespace {
// The draft's KV cache holds the target's context: within its max_position_embeddings.
void check_draft_context(const std::string& draft, const ModelConfig& dc, const SessionOptions& so) {
    SessionOptions ds = so;
    ds.model_dir = draft;
    try {
        check_context(dc, ds);
    } catch (const Error& e) {
        fail("--draft-model ", draft, ": ", e.what());
    }
}
}  // namespace

void check_draft_model(const std::string& draft, const SessionOptions& so, int64_t speculate) {
    if (speculate <= 0) fail("--draft-model needs --speculate N (the tokens it proposes per step)");
    const ModelConfig dc = load_config(draft), tc = load_config(so.model_dir);
    if (Tokenizer::exists(draft) && Tokenizer::exists(so.model_dir)) {
        // The same file (a family's sizes usually ship one) needs no comparison id by id.
        if (read_text_file(draft + "/tokenizer.json") == read_text_file(so.model_dir + "/tokenizer.json"))
            return check_draft_context(draft, dc, so);
        const Tokenizer dt = Tokenizer::load(draft), tt = Tokenizer::load(so.model_dir);
        const int32_t n = std::min(dt.vocab_size(), tt.vocab_size());
        for (int32_t id = 0; id < n; ++id)
            if (dt.id_to_token(id) != tt.id_to_token(id))
                fail("--draft-model ", draft, ": token ", id, " is \"", dt.id_to_token(id), "\" there and \"", tt.id_to_token(id),
                     "\" in ", so.model_dir, ": the draft needs the target's vocabulary");
    } else if (std::abs(dc.vocab - tc.vocab) > 128) {
        fail("--draft-model ", draft, ": vocab_size ", dc.vocab, " against the target's ", tc.vocab,
             " (more than 128 apart: not the same vocabulary)");
    }
    check_draft_context(draft, dc, so);
}

std::unique_ptr<Session> open_draft_session(const std::string& draft, const SessionOptions& so, Communicator& comm) {
    SessionOptions ds = so;
    ds.model_dir = draft;
    const bool quantizing = is_quantized(so.load.format);
    ds.load = LoadOptions(so.load.format, quantizing ? so.load.group_size : 0, quantizing ? so.load.keep_fp16 : "");
    ds.load.copy_mapped = so.load.copy_mapped;
    ds.max_logit_rows = 0;  // one row per slot: a draft step's chunks each end in one
    ds.max_penalties = 0;   // greedy, unpenalised proposals
    return open_session(ds, comm);
}

void broadcast_prompts(Communicator& comm, std::vector<std::vector<int32_t>>& prompts) {
    if (comm.size() == 1) return;
    std::vector<int32_t> flat;
    if (comm.rank() == 0) {
        flat.push_back(int32_t(prompts.size()));
        for (const auto& p : prompts) {
            flat.push_back(int32_t(p.size()));
            flat.insert(flat.end(), p.begin(), p.end());
        }
    }
    uint64_t n = flat.size();
    comm.broadcast_idle(&n, sizeof n, 0);  // rank 0 may be reading a chat's next line
    flat.resize(n);
    comm.broadcast(flat.data(), n * sizeof(int32_t), 0);
    if (comm.rank() == 0) return;
    prompts.assign(size_t(flat[0]), {});
    size_t at = 1;
    for (auto& p : prompts) {
        const size_t len = size_t(flat[at++]);
        p.assign(flat.begin() + long(at), flat.begin() + long(at + len));
        at += len;
    }
}

void set_session_ctx(SessionOptions& so, int64_t ctx, const ModelConfig& cfg, const std::string& command) {
    so.ctx = ctx > 0 ? ctx : cfg.max_position > 0 ? std::min<int64_t>(4096, cfg.max_position) : 4096;
    if (ctx == 0) so.ctx_origin = command + "'s default of " + std::to_string(so.ctx) + " positions";
}

void check_tp_flag(int tp, const Communicator& comm) {
    if (tp < 0 || (tp > 0 && tp != comm.size()))
        fail("--tp ", tp, " differs from the ", comm.size(), " ranks started (mpirun -np ", comm.size(), ")");
}

void check_same_request(Communicator& comm, const std::vector<std::string>& args, const Session& s) {
    std::string who = SHARDLM_GIT_COMMIT;  // what "the same build" means across ranks
    for (const auto& a : args) who += '\0' + a;
    who += '\0' + config_json(s.cfg) + std::to_string(s.ckpt->total_bytes());
    check_same_on_all_ranks(comm, who, "flags, model or build");
}

void set_threads(int threads) {
    // Far more threads than any machine has cores only thrashes, and tens of thousands of them
    // crash the OpenMP runtime when it cannot create them.
    constexpr int kMaxThreads = 1024;
    if (threads < 0 || threads > kMaxThreads) fail("--threads ", threads, " must be in [0, ", kMaxThreads, "]");
#ifdef _OPENMP
    if (threads > 0) omp_set_num_threads(threads);
#endif
}

size_t peak_rss_bytes() {
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    return size_t(ru.ru_maxrss) * 1024;  // Linux reports kilobytes
}

void add_chat_template_option(po::options_description& d, std::string& value) {
    d.add_options()("chat-template", po::value(&value),
                    "chat template FILE (or the template's text) in place of the model's (chat_template.jinja, "
                    "tokenizer_config.json)");
}

std::optional<Tokenizer::ChatTemplateFile> chat_template_override(const std::string& value) {
    if (value.empty()) return std::nullopt;
    if (file_exists(value)) return Tokenizer::ChatTemplateFile{read_text_file(value), value};
    if (value.find("{{") != std::string::npos || value.find("{%") != std::string::npos)
        return Tokenizer::ChatTemplateFile{value, "the --chat-template text"};
    fail("--chat-template ", value, ": no such file, and not a template's text (no {{ or {% in it)");
}

std::vector<std::string> json_token_bytes(const Tokenizer& tok) {
    std::vector<std::string> out(size_t(tok.vocab_size()));
    for (int32_t id = 0; id < tok.vocab_size(); ++id)
        if (!tok.is_special(id)) out[size_t(id)] = tok.token_bytes(id);
    return out;
}

void add_json_options(po::options_description& d, JsonFlags& f) {
    d.add_options()
        ("json-object", po::bool_switch(&f.object),
         "JSON mode: each token keeps the text the start of one JSON object, and a sequence ends (\"stop\") "
         "when it closes (OpenAI's response_format json_object)")
        ("json-schema", po::value(&f.schema_file),
         "structured output: each token keeps the text the start of one value of the JSON schema in FILE, and a "
         "sequence ends (\"stop\") when it is complete (OpenAI's response_format json_schema; README lists the keywords)")
        ("regex", po::value(&f.regex),
         "each token keeps the text the start of a match of the regular expression PATTERN (the whole text, raw; "
         "vLLM's guided_regex): a sequence may end (its end-of-sequence token) wherever the match is complete, and "
         "ends where nothing can follow")
        ("grammar", po::value(&f.grammar),
         "each token keeps the text the start of one of the GBNF grammar TEXT's (llama.cpp's format; its rule "
         "root is the whole text): a sequence may end (its end-of-sequence token) wherever root is complete, and "
         "ends where nothing can follow")
        ("grammar-file", po::value(&f.grammar_file), "--grammar with the grammar in FILE")
        ("json-whitespace", po::value(&f.whitespace)->default_value(JsonSchema::kDefaultSpace),
         "with --json-object/--json-schema: most whitespace bytes in a row between the JSON's parts, one line "
         "break among them (0: compact JSON, for models that would spend tokens on it)");
}

void check_json_whitespace(int n) {
    if (n < 0 || n > JsonSchema::kMaxSpace) fail("--json-whitespace must be in [0, ", JsonSchema::kMaxSpace, "]");
}

namespace {
// The constraint flags given, by name.
std::vector<std::string> json_sources(const JsonFlags& f) {
    std::vector<std::string> out;
    if (!f.regex.empty()) out.push_back("--regex");
    if (f.object) out.push_back("--json-object");
    if (!f.schema_file.empty()) out.push_back("--json-schema");
    if (!f.grammar.empty()) out.push_back("--grammar");
    if (!f.grammar_file.empty()) out.push_back("--grammar-file");
    return out;
}

std::string file_text(const std::string& flag, const std::string& path) {
    try {
        return read_text_file(path);
    } catch (const Error& e) {
        fail(flag, ": ", e.what());
    }
}
}  // namespace

std::shared_ptr<const JsonSchema> apply_json(const JsonFlags& f) {
    const std::vector<std::string> given = json_sources(f);
    if (given.size() > 1) fail(given[0], " and ", given[1], " exclude each other");
    check_json_whitespace(f.whitespace);
    if (given.empty()) return nullptr;
    JsonSchema s;
    if (!f.regex.empty()) s = regex_schema(f.regex, "--regex");
    else if (f.object) s = json_object_schema();
    else if (!f.grammar.empty()) s = compile_grammar(f.grammar, "--grammar");
    else if (!f.grammar_file.empty()) s = compile_grammar(file_text("--grammar-file", f.grammar_file), "--grammar-file " + f.grammar_file);
    else s = compile_json_schema(file_text("--json-schema", f.schema_file), "--json-schema " + f.schema_file);
    s.max_space = f.whitespace;
    return std::make_shared<const JsonSchema>(std::move(s));
}

std::string json_flag(const JsonFlags& f) {
    const std::vector<std::string> given = json_sources(f);
    return given.empty() ? "" : given[0];
}

}  // namespace shardlm
