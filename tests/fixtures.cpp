#include "fixtures.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "kernels/cpu/matmul.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "runtime/sampler.h"

namespace shardlm::test {

TempDir::TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/shardlm-test-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
}

TempDir::~TempDir() {
    const std::string cmd = "rm -rf '" + path_ + "'";
    if (std::system(cmd.c_str()) != 0) {}
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) had_ = true, old_ = v;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
}

ScopedEnv::~ScopedEnv() {
    if (had_) ::setenv(name_.c_str(), old_.c_str(), 1);
    else ::unsetenv(name_.c_str());
}

void write_file(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), std::streamsize(bytes.size()));
    if (!f) throw std::runtime_error("cannot write " + path);
}

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

LoraModule random_lora_module(const ModelConfig& c, const std::string& module, int64_t rank, uint64_t seed,
                              const std::string& dtype) {
    const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
    auto ends = [&](const char* s) {
        const std::string t(s);
        return module.size() >= t.size() && module.compare(module.size() - t.size(), t.size(), t) == 0;
    };
    int64_t out = 0, in = 0;  // the base matrix [out, in]
    if (ends("q_proj")) out = q, in = c.hidden;
    else if (ends("k_proj") || ends("v_proj")) out = kv, in = c.hidden;
    else if (ends("o_proj")) out = c.hidden, in = q;
    else if (ends("gate_proj") || ends("up_proj")) out = c.intermediate, in = c.hidden;
    else if (ends("down_proj")) out = c.hidden, in = c.intermediate;
    else if (ends("lm_head") || ends("embed_tokens")) out = c.vocab, in = c.hidden;
    else throw std::runtime_error("random_lora_module: unknown module " + module);
    LoraModule m;
    m.module = module;
    m.rank = rank;
    m.dtype = dtype;
    std::mt19937 rng{uint32_t(seed)};
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    auto value = [&] {
        const float v = u(rng);
        return dtype == "BF16" ? bf16_to_f32(f32_to_bf16(v)) : dtype == "F16" ? f16_to_f32(f32_to_f16(v)) : v;
    };
    // Linear: A [rank, in], B [out, rank]. Embedding [vocab, hidden]: A [rank, vocab], B [hidden, rank].
    const size_t na = size_t(rank * (m.embedding() ? out : in)), nb = size_t((m.embedding() ? in : out) * rank);
    for (size_t i = 0; i < na; ++i) m.a.push_back(value());
    for (size_t i = 0; i < nb; ++i) m.b.push_back(value());
    return m;
}

void write_lora_adapter(const std::string& dir, const std::string& adapter_config, const std::vector<LoraModule>& modules) {
    std::vector<TensorToWrite> ts;
    for (const LoraModule& m : modules) {
        const int64_t rows_b = int64_t(m.b.size()) / m.rank, cols_a = int64_t(m.a.size()) / m.rank;
        const std::string pre = "base_model.model." + m.module + (m.embedding() ? ".lora_embedding_" : ".lora_");
        const std::string suf = m.embedding() ? "" : ".weight";
        for (const auto& [name, shape, v] : {std::make_tuple(pre + "A" + suf, std::vector<int64_t>{m.rank, cols_a}, &m.a),
                                             std::make_tuple(pre + "B" + suf, std::vector<int64_t>{rows_b, m.rank}, &m.b)}) {
            const size_t es = m.dtype == "F32" ? 4 : 2;
            TensorToWrite t{name, m.dtype, shape, std::vector<uint8_t>(v->size() * es)};
            for (size_t i = 0; i < v->size(); ++i) {
                const float f = (*v)[i];
                const uint16_t h = m.dtype == "BF16" ? f32_to_bf16(f) : f32_to_f16(f);
                std::memcpy(&t.bytes[i * es], es == 4 ? static_cast<const void*>(&f) : static_cast<const void*>(&h), es);
            }
            ts.push_back(std::move(t));
        }
    }
    write_file(dir + "/adapter_config.json", adapter_config);
    write_safetensors(dir + "/adapter_model.safetensors", ts);
}

std::string thrown_error(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

std::vector<SequenceResult> batch_greedy(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                         const std::vector<int64_t>& adapters, int64_t max_new, int64_t prefill_chunk,
                                         int64_t max_adapters) {
    BatcherOptions bo;
    bo.prefill_chunk = prefill_chunk;
    bo.max_adapters = max_adapters;
    Batcher b(engine, bo);
    for (size_t i = 0; i < prompts.size(); ++i) {
        BatchRequest q;
        q.prompt = prompts[i];
        q.max_new_tokens = max_new;
        q.sampler.temperature = 0;
        q.keep_prompt_logits = true;
        q.adapter = adapters[i];
        b.add(q);
    }
    while (b.busy()) b.step();
    std::vector<SequenceResult> out;
    for (size_t i = 0; i < prompts.size(); ++i) out.push_back(b.result(i));
    return out;
}

GenerateResult run_greedy(const std::string& dir, const std::vector<std::vector<int32_t>>& prompts, int64_t max_new,
                          int64_t prefill_chunk, WeightFormat wf, KVFormat kv) {
    return run_greedy(dir, prompts, max_new, prefill_chunk, LoadOptions(wf), kv);
}

GenerateResult run_greedy(const std::string& dir, const std::vector<std::vector<int32_t>>& prompts, int64_t max_new,
                          int64_t prefill_chunk, const LoadOptions& lo, KVFormat kv) {
    SessionOptions so;
    so.model_dir = dir;
    so.load = lo;
    so.kv = kv;
    so.max_batch = int64_t(prompts.size());
    so.prefill_chunk = prefill_chunk;
    int64_t longest = 0;
    for (const auto& p : prompts) longest = std::max<int64_t>(longest, int64_t(p.size()));
    so.ctx = longest + max_new;
    SingleRank comm;
    auto s = open_session(so, comm);
    GenerateOptions go;
    go.max_new_tokens = max_new;
    go.prefill_chunk = prefill_chunk;
    go.sampler.temperature = 0.0f;
    go.keep_prompt_logits = true;
    return generate(*s->engine, prompts, go);
}

std::string batch_invariance_mismatch(const std::function<std::unique_ptr<Session>()>& open, int64_t vocab) {
    const std::vector<int32_t> a = make_prompt(9, vocab, 7), b = make_prompt(120, vocab, 8), c = make_prompt(4, vocab, 9);
    const int64_t V = vocab, steps = 5;
    const size_t row_bytes = size_t(V) * sizeof(float);
    // Alone.
    std::vector<std::vector<float>> alone;
    std::vector<int32_t> seq = a;
    {
        auto s = open();
        std::vector<float> lg(static_cast<size_t>(V));
        s->engine->forward({{0, a.data(), int64_t(a.size()), 0, true}}, lg.data());
        alone.push_back(lg);
        for (int64_t i = 0; i < steps; ++i) {
            seq.push_back(argmax(lg.data(), V));
            s->engine->forward({{0, &seq.back(), 1, int64_t(seq.size()) - 1, true}}, lg.data());
            alone.push_back(lg);
        }
    }
    // Shared: b whole beside a's first 4 tokens, then a's other 5 beside c, then decode steps with
    // a between c and b (their tokens whatever they are: the last of each, again and again).
    auto s = open();
    std::vector<float> lg(static_cast<size_t>(3 * V));
    s->engine->forward({{1, b.data(), int64_t(b.size()), 0, true}, {0, a.data(), 4, 0, false}}, lg.data());
    s->engine->forward({{0, a.data() + 4, 5, 4, true}, {2, c.data(), int64_t(c.size()), 0, true}}, lg.data());
    if (std::memcmp(lg.data(), alone[0].data(), row_bytes) != 0) return "prefill";
    for (int64_t i = 0; i < steps; ++i) {
        const int64_t pos = int64_t(a.size()) + i;
        s->engine->forward({{2, &c.back(), 1, int64_t(c.size()) + i, true},
                            {0, &seq[size_t(pos)], 1, pos, true},
                            {1, &b.back(), 1, int64_t(b.size()) + i, true}},
                           lg.data());
        if (std::memcmp(lg.data() + V, alone[size_t(i + 1)].data(), row_bytes) != 0) return "decode step " + std::to_string(i);
    }
    return "";
}

std::vector<int32_t> make_prompt(int64_t n, int64_t vocab, uint64_t seed) {
    std::vector<int32_t> p;
    uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < n; ++i) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p.push_back(int32_t(3 + (x >> 33) % uint64_t(vocab - 3)));
    }
    return p;
}

CommandResult run_command(const std::string& cmdline) {
    TempDir tmp;
    const std::string out = tmp.file("out"), err = tmp.file("err");
    const std::string full = cmdline + " >'" + out + "' 2>'" + err + "'";
    const int status = std::system(full.c_str());
    CommandResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_file(out);
    r.err = read_file(err);
    return r;
}

void expect_cli_error(const std::string& args, const std::string& needle) {
    const CommandResult r = run_command(std::string(SHARDLM_BIN) + " " + args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_EQ(r.err.rfind("shardlm: error: ", 0), 0u) << args << "\nstderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\nstderr: " << r.err;
    EXPECT_LT(r.exit_code, 128) << "crashed: " << args;
}

bool cpu_prefill_rounds() { return std::string(matmul_isa()) == "amx"; }

bool cpu_quantized_weights_round() { return std::string(matmul_isa()) != "scalar"; }

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    // Equal values (infinities of one sign included) differ by 0; a NaN on either side by infinity
    // (std::max would pass a NaN difference over, and a vector of NaNs would look exact).
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i] == b[i]) continue;
        const float d = std::fabs(a[i] - b[i]);
        m = std::isnan(d) ? INFINITY : std::max(m, d);
    }
    return m;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < a.size(); ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
    return ab / std::sqrt(aa * bb);
}

void write_without_model_prefix(const std::string& src, const std::string& dst) {
    write_file(dst + "/config.json", read_file(src + "/config.json"));
    auto strip = [](const std::string& n) { return n.rfind("model.", 0) == 0 ? n.substr(6) : n; };
    std::set<std::string> files{"model.safetensors"};
    const std::string index = src + "/model.safetensors.index.json";
    if (file_exists(index)) {
        nlohmann::json j = nlohmann::json::parse(read_file(index)), map = nlohmann::json::object();
        files.clear();
        for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
            if (it.key() == "lm_head.weight") continue;
            map[strip(it.key())] = it.value();
            files.insert(it.value().get<std::string>());
        }
        j["weight_map"] = map;
        write_file(dst + "/model.safetensors.index.json", j.dump(2));
    }
    for (const std::string& f : files) {
        std::vector<TensorToWrite> ts;
        const SafetensorsFile in(src + "/" + f);
        for (const auto& [name, t] : in.tensors())
            if (name != "lm_head.weight")
                ts.push_back({strip(name), t.dtype_str, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
        write_safetensors(dst + "/" + f, ts);
    }
}

void write_classifier(const std::string& src, const std::string& dst, const std::vector<std::string>& labels,
                      const std::vector<float>& score) {
    nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(read_file(src + "/config.json"));
    std::string arch = cfg["architectures"][0];
    arch = arch.substr(0, arch.find("ForCausalLM")) + "ForSequenceClassification";
    cfg["architectures"] = {arch};
    cfg["id2label"] = nlohmann::ordered_json::object();
    for (size_t i = 0; i < labels.size(); ++i) cfg["id2label"][std::to_string(i)] = labels[i];
    write_file(dst + "/config.json", cfg.dump(2));
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
        if (file_exists(src + "/" + f)) write_file(dst + "/" + f, read_file(src + "/" + f));
    std::vector<TensorToWrite> ts;
    const SafetensorsFile in(src + "/model.safetensors");
    for (const auto& [name, t] : in.tensors())
        if (name != "lm_head.weight") ts.push_back({name, t.dtype_str, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
    const int64_t hidden = cfg["hidden_size"];
    EXPECT_EQ(score.size(), labels.size() * size_t(hidden));
    const uint8_t* b = reinterpret_cast<const uint8_t*>(score.data());
    ts.push_back({"score.weight", "F32", {int64_t(labels.size()), hidden}, std::vector<uint8_t>(b, b + score.size() * 4)});
    write_safetensors(dst + "/model.safetensors", ts);
}

std::vector<float> checkpoint_rows(const std::string& dir, const std::string& name, const std::vector<int32_t>& rows) {
    const SafetensorsFile in(dir + "/model.safetensors");
    const auto& t = in.tensors().at(name);
    const int64_t cols = t.shape.at(1);
    std::vector<float> out;
    for (const int32_t r : rows)
        for (int64_t c = 0; c < cols; ++c) {
            const size_t i = size_t(r * cols + c);
            if (t.dtype_str == "F32") {
                float v;
                std::memcpy(&v, t.data + i * 4, 4);
                out.push_back(v);
            } else {
                uint16_t h;
                std::memcpy(&h, t.data + i * 2, 2);
                out.push_back(bf16_to_f32(h));
            }
        }
    return out;
}

}  // namespace shardlm::test
