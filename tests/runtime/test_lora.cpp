// LoRA adapters (PEFT's folders) merge into the base model's weights as they load: each matrix
// the adapters touch equals W + sum of scale * B A (the embedding's (B A)^T), computed here in
// double from the files' values, on one rank and on each of two; the model on base + adapters
// equals an FP32 checkpoint of the merged weights; quantized loads quantize the merged weights;
// `shardlm quantize` writes them; and what a merge cannot express is refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/error.h"
#include "fixtures.h"
#include "model/quantize_checkpoint.h"
#include "model/safetensors_writer.h"
#include "runtime/batcher.h"
#include "runtime/recording_engine.h"
#include "runtime/session.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

using json = nlohmann::json;

// One adapter as a test writes it: its config, its modules and the scale each module's B A gets
// (alpha / r, or / sqrt(r), times the --lora-scale), worked out here by hand from the config.
struct TestAdapter {
    json config;
    std::vector<LoraModule> modules;
    std::map<std::string, double> scale;  // by module
    float user_scale = 1.0f;
};

const char* const kLinears[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

json lora_config(int64_t r, double alpha) {
    return {{"peft_type", "LORA"}, {"r", r}, {"lora_alpha", alpha}, {"bias", "none"}, {"use_rslora", false},
            {"use_dora", false}, {"fan_in_fan_out", false}, {"modules_to_save", nullptr}, {"task_type", "CAUSAL_LM"},
            {"target_modules", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}},
            {"rank_pattern", json::object()}, {"alpha_pattern", json::object()}};
}

// Adapter 1: r 4, alpha 8 (scale 2) on every Linear of every layer, with rank_pattern giving
// down_proj rank 2 (scale 4) and alpha_pattern layer 1's q_proj alpha 3 (scale 0.75); on an untied
// model also lm_head and the embedding. Factors in BF16 and F16.
// Adapter 2: rslora, r 4, alpha 2 (scale 1) on layer 0's q_proj and v_proj, --lora-scale 0.5.
std::vector<TestAdapter> two_adapters(const ModelConfig& c) {
    std::vector<TestAdapter> out(2);
    TestAdapter& a = out[0];
    a.config = lora_config(4, 8);
    a.config["rank_pattern"] = {{"down_proj", 2}};
    a.config["alpha_pattern"] = {{"layers.1.self_attn.q_proj", 3}};
    uint64_t seed = 100;
    for (int64_t l = 0; l < c.n_layers; ++l)
        for (const char* lin : kLinears) {
            const std::string m = "model.layers." + std::to_string(l) + "." + lin;
            const bool down = std::string(lin) == "mlp.down_proj";
            a.modules.push_back(random_lora_module(c, m, down ? 2 : 4, seed++, l == 0 ? "BF16" : "F16"));
            a.scale[m] = down ? 4.0 : (l == 1 && std::string(lin) == "self_attn.q_proj") ? 0.75 : 2.0;
        }
    if (!c.tie_embeddings)
        for (const char* m : {"lm_head", "model.embed_tokens"}) {
            a.modules.push_back(random_lora_module(c, m, 4, seed++, "BF16"));
            a.scale[m] = 2.0;
        }
    TestAdapter& b = out[1];
    b.config = lora_config(4, 2);
    b.config["use_rslora"] = true;
    b.user_scale = 0.5f;
    for (const char* m : {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"}) {
        b.modules.push_back(random_lora_module(c, m, 4, seed++, "F32"));
        b.scale[m] = 0.5 * 2.0 / 2.0;
    }
    return out;
}

// The adapters written under `root` (root/0, root/1, ...), as LoadOptions::lora names them.
std::vector<LoraAdapter> write_adapters(const std::string& root, const std::vector<TestAdapter>& ads) {
    std::vector<LoraAdapter> out;
    for (size_t i = 0; i < ads.size(); ++i) {
        const std::string dir = root + "/" + std::to_string(i);
        if (std::system(("mkdir -p '" + dir + "'").c_str()) != 0) throw std::runtime_error("mkdir " + dir);
        write_lora_adapter(dir, ads[i].config.dump(2), ads[i].modules);
        out.push_back({dir, ads[i].user_scale});
    }
    return out;
}

// Every tensor of the F32 checkpoint in `base` with the adapters merged in double, rounded once to f32.
std::map<std::string, std::vector<float>> merged_weights(const std::string& base, const std::vector<TestAdapter>& ads) {
    std::map<std::string, std::vector<float>> out;
    SafetensorsFile f(base + "/model.safetensors");
    for (const auto& [name, t] : f.tensors()) {
        if (name.rfind("__pad_", 0) == 0) continue;
        std::vector<double> w(size_t(t.numel()));
        for (size_t i = 0; i < w.size(); ++i) {
            float v;
            std::memcpy(&v, t.data + 4 * i, 4);
            w[i] = v;
        }
        const std::string module = name.substr(0, name.size() - 7);
        for (const TestAdapter& ad : ads) {
            if (t.shape.size() != 2) break;
            for (const LoraModule& m : ad.modules) {
                if (m.module != module) continue;
                const int64_t rows = t.shape[0], cols = t.shape[1], r = m.rank;
                const double s = ad.scale.at(module);
                for (int64_t i = 0; i < rows; ++i)
                    for (int64_t j = 0; j < cols; ++j) {
                        double d = 0;
                        for (int64_t k = 0; k < r; ++k)
                            d += m.embedding() ? double(m.b[size_t(j * r + k)]) * m.a[size_t(k * rows + i)]
                                               : double(m.b[size_t(i * r + k)]) * m.a[size_t(k * cols + j)];
                        w[size_t(i * cols + j)] += s * d;
                    }
            }
        }
        std::vector<float> v(w.begin(), w.end());
        out[name] = std::move(v);
    }
    return out;
}

// An FP32 checkpoint of the merged weights (config copied).
void write_merged(const std::string& base, const std::string& dir, const std::vector<TestAdapter>& ads) {
    std::vector<TensorToWrite> ts;
    for (const auto& [name, v] : merged_weights(base, ads)) {
        const SafetensorsFile f(base + "/model.safetensors");
        TensorToWrite t{name, "F32", f.find(name)->shape, std::vector<uint8_t>(v.size() * 4)};
        std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
        ts.push_back(std::move(t));
    }
    write_file(dir + "/config.json", read_file(base + "/config.json"));
    write_safetensors(dir + "/model.safetensors", ts, true);
}

// Each matrix of `w` (one rank's slices) with the full tensor's name and the offset of its block.
struct Slice {
    std::string name;
    const WeightView* w;
    int64_t r0, c0;
};
std::vector<Slice> slices(const ModelWeights& w, const ModelConfig& c) {
    std::vector<Slice> out;
    const ShardPlan& p = w.plan;
    for (size_t l = 0; l < w.layers.size(); ++l) {
        const LayerWeights& L = w.layers[l];
        const int64_t hd = c.head_dim;
        out.push_back({L.q.name, &L.q.w, p.q_head0 * hd, 0});
        out.push_back({L.k.name, &L.k.w, p.kv_head0 * hd, 0});
        out.push_back({L.v.name, &L.v.w, p.kv_head0 * hd, 0});
        out.push_back({L.o.name, &L.o.w, 0, p.q_head0 * hd});
        out.push_back({L.gate.name, &L.gate.w, p.inter0, 0});
        out.push_back({L.up.name, &L.up.w, p.inter0, 0});
        out.push_back({L.down.name, &L.down.w, 0, p.inter0});
    }
    out.push_back({"model.embed_tokens.weight", &w.embed, p.vocab0, 0});
    if (!c.tie_embeddings) out.push_back({"lm_head.weight", &w.lm_head, p.vocab0, 0});
    return out;
}

std::vector<float> row_of(const WeightView& v, int64_t r) {
    std::vector<float> row(size_t(v.cols));
    weight_row_to_f32(v, r, row.data());
    return row;
}

}  // namespace

// Every element of every matrix an adapter touches, loaded on one rank and on each of two, equals
// W + sum of scale * B A within f32 rounding of the sum (the loader adds rank products in f32);
// rank_pattern, alpha_pattern, rslora and --lora-scale each set their module's scale, and the
// embedding takes (B A)^T. The plan counts the merged matrices as converted bytes.
TEST(Lora, MergesIntoEveryMatrixOnEveryRank) {
    for (Arch arch : {Arch::Llama, Arch::Qwen2}) {
        const ModelConfig c = tiny_config(arch);
        TempDir base, root;
        write_synthetic_checkpoint(base.path(), c, {DType::F32, 1, 7});
        const auto ads = two_adapters(c);
        LoadOptions lo;
        lo.lora = write_adapters(root.path(), ads);
        const auto want = merged_weights(base.path(), ads);
        const Checkpoint ck(base.path());
        size_t touched = 0;
        for (const auto& [name, v] : want)
            for (const TestAdapter& ad : ads)
                if (ad.scale.count(name.substr(0, name.size() - 7))) {
                    touched += v.size() * 4;
                    break;
                }
        EXPECT_EQ(converted_weight_bytes(ck, c, lo, plan_shard(c, 0, 1)), touched) << arch_name(c.arch);
        EXPECT_EQ(converted_weight_bytes(ck, c, LoadOptions{}, plan_shard(c, 0, 1)), 0u);
        for (int tp : {1, 2})
            for (int rank = 0; rank < tp; ++rank) {
                const ModelWeights w = load_weights(ck, c, lo, plan_shard(c, rank, tp));
                size_t checked = 0;
                for (const Slice& s : slices(w, c)) {
                    const std::vector<float>& full = want.at(s.name);
                    ASSERT_EQ(s.w->dtype, DType::F32) << s.name;
                    const int64_t full_cols = int64_t(ck.get(s.name).shape[1]);
                    for (int64_t r = 0; r < s.w->rows; ++r) {
                        const std::vector<float> row = row_of(*s.w, r);
                        for (int64_t j = 0; j < s.w->cols; ++j, ++checked) {
                            const float e = full[size_t((s.r0 + r) * full_cols + s.c0 + j)];
                            ASSERT_NEAR(row[size_t(j)], e, 2e-7f + 2e-7f * std::fabs(e))
                                << arch_name(c.arch) << " tp " << tp << " rank " << rank << " " << s.name << " (" << r << ", " << j << ")";
                        }
                    }
                }
                EXPECT_GT(checked, 0u);
            }
    }
}

// The model on base + adapters computes what an FP32 checkpoint of the merged weights computes:
// prompt logits within float rounding (the merged weights differ in their last bits), the same
// greedy tokens. Llama (untied: the embedding and lm_head adapters too) and Qwen2 (biases, tied).
TEST(Lora, ModelEqualsTheMergedCheckpoint) {
    for (Arch arch : {Arch::Llama, Arch::Qwen2}) {
        const ModelConfig c = tiny_config(arch);
        TempDir base, root, merged;
        write_synthetic_checkpoint(base.path(), c, {DType::F32, 1, 9});
        const auto ads = two_adapters(c);
        LoadOptions lo;
        lo.lora = write_adapters(root.path(), ads);
        write_merged(base.path(), merged.path(), ads);
        const std::vector<std::vector<int32_t>> prompts = {make_prompt(13, c.vocab, 1), make_prompt(5, c.vocab, 2)};
        auto greedy = [&](const std::string& dir, const LoadOptions& o) { return run_greedy(dir, prompts, 6, 8, o); };
        const GenerateResult a = greedy(base.path(), lo), b = greedy(merged.path(), LoadOptions{}),
                             plain = greedy(base.path(), LoadOptions{});
        for (size_t i = 0; i < prompts.size(); ++i) {
            EXPECT_LT(max_abs_diff(a.seqs[i].prompt_logits, b.seqs[i].prompt_logits), 1e-3f) << arch_name(c.arch) << " " << i;
            EXPECT_EQ(a.seqs[i].tokens, b.seqs[i].tokens) << arch_name(c.arch) << " " << i;
            // The adapters change the model: far more than the rounding above.
            EXPECT_GT(max_abs_diff(a.seqs[i].prompt_logits, plain.seqs[i].prompt_logits), 0.05f) << arch_name(c.arch);
        }
    }
}

// INT8 and INT4 loads quantize the merged weights: each dequantized element is within one
// quantization step of the same format's load of the merged FP32 checkpoint (the two quantize
// inputs that differ in their last bits, so a code may differ by one).
TEST(Lora, QuantizedLoadsQuantizeTheMergedWeights) {
    const ModelConfig c = tiny_config(Arch::Llama);
    TempDir base, root, merged;
    write_synthetic_checkpoint(base.path(), c, {DType::F32, 1, 5});
    const auto ads = two_adapters(c);
    const std::vector<LoraAdapter> adapters = write_adapters(root.path(), ads);
    write_merged(base.path(), merged.path(), ads);
    const Checkpoint ck_base(base.path()), ck_merged(merged.path());
    for (WeightFormat f : {WeightFormat::Int8, WeightFormat::Int4}) {
        LoadOptions lo(f, f == WeightFormat::Int4 ? 32 : 0);
        const ModelWeights want = load_weights(ck_merged, c, lo, plan_shard(c, 0, 1));
        lo.lora = adapters;
        const ModelWeights got = load_weights(ck_base, c, lo, plan_shard(c, 0, 1));
        const auto ws = slices(want, c), gs = slices(got, c);
        ASSERT_EQ(ws.size(), gs.size());
        for (size_t m = 0; m < ws.size(); ++m) {
            const WeightView& a = *gs[m].w;
            const WeightView& b = *ws[m].w;
            ASSERT_EQ(a.dtype, b.dtype) << gs[m].name;
            for (int64_t r = 0; r < a.rows; ++r) {
                const std::vector<float> ra = row_of(a, r), rb = row_of(b, r);
                for (int64_t j = 0; j < a.cols; ++j) {
                    float step = 0;  // the larger of the two groups' steps (a float matrix: exact)
                    if (a.quantized()) {
                        const size_t g = size_t(r * a.n_groups() + j / a.group_size);
                        step = std::max(a.scales[g], b.scales[g]);
                    }
                    ASSERT_LE(std::fabs(ra[size_t(j)] - rb[size_t(j)]), 1.001f * step + 1e-6f)
                        << weight_format_name(f) << " " << gs[m].name << " (" << r << ", " << j << ")";
                }
            }
        }
    }
}

// shardlm quantize --lora writes the merged model: its pre-quantized checkpoint loads as base +
// adapters loads under the same format, bit for bit, the matrices it keeps float (--keep-fp16, an
// untied embedding) merged too.
TEST(Lora, QuantizeWritesTheMergedModel) {
    const ModelConfig c = tiny_config(Arch::Llama);
    TempDir base, root, out;
    write_synthetic_checkpoint(base.path(), c, {DType::BF16, 1, 3});
    LoadOptions lo(WeightFormat::Int8, 0, "q_proj");
    lo.lora = write_adapters(root.path(), two_adapters(c));
    write_quantized_checkpoint(base.path(), out.path() + "/q", lo);
    const Checkpoint ck_base(base.path()), ck_q(out.path() + "/q");
    const ModelConfig cq = load_config(out.path() + "/q");
    const ModelWeights want = load_weights(ck_base, c, lo, plan_shard(c, 0, 1));
    const ModelWeights got = load_weights(ck_q, cq, LoadOptions{}, plan_shard(c, 0, 1));
    const auto ws = slices(want, c), gs = slices(got, c);
    ASSERT_EQ(ws.size(), gs.size());
    size_t kept = 0;
    for (size_t m = 0; m < ws.size(); ++m) {
        ASSERT_EQ(gs[m].w->dtype, ws[m].w->dtype) << gs[m].name;
        kept += gs[m].w->quantized() ? 0 : 1;
        for (int64_t r = 0; r < ws[m].w->rows; ++r) ASSERT_EQ(row_of(*gs[m].w, r), row_of(*ws[m].w, r)) << gs[m].name << " row " << r;
    }
    EXPECT_EQ(kept, size_t(c.n_layers) + 1);  // the q_proj matrices and the embedding
}

// What a merge cannot express, and adapters that do not fit the base model, are refused with the
// file, tensor or key at fault.
TEST(Lora, BadAdaptersAreRefused) {
    const ModelConfig c = tiny_config(Arch::Llama);
    TempDir base, tied;
    write_synthetic_checkpoint(base.path(), c, {DType::BF16, 1, 3});
    write_synthetic_checkpoint(tied.path(), tiny_config(Arch::Qwen3), {DType::BF16, 1, 3});
    const std::string q0 = "model.layers.0.self_attn.q_proj";
    struct Bad {
        std::string what;
        std::function<void(json&, std::vector<LoraModule>&)> edit;
        std::string needle;
        std::string model = "";  // another base
    };
    const std::vector<Bad> cases = {
        {"ia3", [](json& j, auto&) { j["peft_type"] = "IA3"; }, "peft_type \"IA3\" is not supported"},
        {"no type", [](json& j, auto&) { j.erase("peft_type"); }, "no \"peft_type\""},
        {"r", [](json& j, auto&) { j["r"] = 0; }, "\"r\" must be a positive integer"},
        {"dora", [](json& j, auto&) { j["use_dora"] = true; }, "DoRA adapters (use_dora) are not supported"},
        {"fan", [](json& j, auto&) { j["fan_in_fan_out"] = true; }, "fan_in_fan_out"},
        {"bias", [](json& j, auto&) { j["bias"] = "all"; }, "bias \"all\": adapters that train the base model's biases"},
        {"save", [](json& j, auto&) { j["modules_to_save"] = {"lm_head"}; }, "\"modules_to_save\" [\"lm_head\"]"},
        {"regex", [](json& j, auto&) { j["rank_pattern"] = {{"q_proj(", 4}}; }, "rank_pattern key \"q_proj(\" is not a valid regex"},
        {"rank", [](json& j, auto&) { j["r"] = 8; }, "expected [8, 64] (rank 8 from"},
        {"pattern rank", [](json& j, auto&) { j["rank_pattern"] = {{"q_proj", 2}}; }, "expected [2, 64] (rank 2 from"},
        {"shape", [&](json&, auto& ms) { ms[0] = random_lora_module(tiny_config(Arch::Qwen3), q0, 4, 1); },
         "lora_B.weight has shape [128, 4], expected [64, 4]"},
        {"layer", [&](json&, auto& ms) { ms[0].module = "model.layers.7.self_attn.q_proj"; }, "has no model.layers.7.self_attn.q_proj.weight"},
        {"module", [&](json&, auto& ms) { ms[0].module = "model.layers.0.input_layernorm"; }, "is not a module this loader merges into"},
        {"tied", [&](json&, auto& ms) { ms = {random_lora_module(tiny_config(Arch::Qwen3), "lm_head", 4, 2)}; },
         "ties its embedding and lm_head", tied.path()},
    };
    for (const Bad& b : cases) {
        TempDir ad;
        json cfg = lora_config(4, 8);
        std::vector<LoraModule> ms = {random_lora_module(c, q0, 4, 1)};
        b.edit(cfg, ms);
        write_lora_adapter(ad.path(), cfg.dump(), ms);
        const std::string model = b.model.empty() ? base.path() : b.model;
        const ModelConfig mc = load_config(model);
        const Checkpoint ck(model);
        LoadOptions lo;
        lo.lora = {{ad.path(), 1.0f}};
        const std::string e = thrown_error([&] { load_weights(ck, mc, lo, plan_shard(mc, 0, 1)); });
        EXPECT_NE(e.find(b.needle), std::string::npos) << b.what << ": " << e;
    }
    // Tensors: an unknown one (DoRA's magnitude), A without B, an integer dtype; the files.
    auto tensor_case = [&](const std::function<void(std::vector<TensorToWrite>&)>& edit, const std::string& needle) {
        TempDir ad;
        write_lora_adapter(ad.path(), lora_config(4, 8).dump(), {random_lora_module(c, q0, 4, 1)});
        std::vector<TensorToWrite> ts;
        {
            SafetensorsFile f(ad.file("adapter_model.safetensors"));
            for (const auto& [name, t] : f.tensors())
                ts.push_back({name, t.dtype_str, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
        }
        edit(ts);
        write_safetensors(ad.file("adapter_model.safetensors"), ts);
        const Checkpoint ck(base.path());
        LoadOptions lo;
        lo.lora = {{ad.path(), 1.0f}};
        const std::string e = thrown_error([&] { load_weights(ck, c, lo, plan_shard(c, 0, 1)); });
        EXPECT_NE(e.find(needle), std::string::npos) << needle << ": " << e;
    };
    tensor_case([&](auto& ts) { ts.push_back({"base_model.model." + q0 + ".lora_magnitude_vector", "F32", {64}, std::vector<uint8_t>(256)}); },
                "lora_magnitude_vector is not a LoRA factor this loader merges (a DoRA magnitude)");
    tensor_case([&](auto& ts) { ts.pop_back(); }, q0 + " has lora_A but no lora_B");
    tensor_case([&](auto& ts) { ts[0].dtype = "I8", ts[0].bytes.resize(ts[0].bytes.size() / 4); }, "has dtype I8 (expected F32, F16 or BF16)");
    {
        TempDir ad;
        const Checkpoint ck(base.path());
        LoadOptions lo;
        lo.lora = {{ad.path(), 1.0f}};
        EXPECT_NE(thrown_error([&] { load_weights(ck, c, lo, plan_shard(c, 0, 1)); }).find("no adapter_config.json"), std::string::npos);
        write_file(ad.file("adapter_config.json"), lora_config(4, 8).dump());
        write_file(ad.file("adapter_model.bin"), "pickle");
        EXPECT_NE(thrown_error([&] { load_weights(ck, c, lo, plan_shard(c, 0, 1)); }).find("adapter_model.bin (a PyTorch pickle) is not read"),
                  std::string::npos);
        // A pre-quantized base has no float weights to merge into.
        TempDir q;
        write_quantized_checkpoint(base.path(), q.path() + "/q", LoadOptions(WeightFormat::Int8));
        const Checkpoint ckq(q.path() + "/q");
        const ModelConfig cq = load_config(q.path() + "/q");
        write_lora_adapter(ad.path(), lora_config(4, 8).dump(), {random_lora_module(c, q0, 4, 1)});
        EXPECT_NE(thrown_error([&] { load_weights(ckq, cq, lo, plan_shard(c, 0, 1)); }).find("is pre-quantized (shardlm)"), std::string::npos);
    }
}

namespace {

// two_adapters' modules on the layers only (what an adapter chosen per request may target).
std::vector<TestAdapter> layer_adapters(const ModelConfig& c) {
    std::vector<TestAdapter> ads = two_adapters(c);
    for (TestAdapter& a : ads) {
        std::vector<LoraModule> kept;
        for (LoraModule& m : a.modules)
            if (m.module.rfind("model.layers.", 0) == 0) kept.push_back(std::move(m));
        a.modules = std::move(kept);
    }
    return ads;
}

// Greedy requests through a Batcher on a session with these options, all at once.
std::vector<SequenceResult> session_greedy(SessionOptions so, const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<int64_t>& adapters) {
    SingleRank comm;
    so.ctx = 64;
    so.max_batch = int64_t(prompts.size());
    so.prefill_chunk = 16;
    auto s = open_session(so, comm);
    return batch_greedy(*s->engine, prompts, adapters, 6, 16);
}

// An FP32 checkpoint of c's shape in `base` (weights of `seed`) and layer_adapters' two in `root`,
// opened as adapters "a" and "b" with `slots` slots of 64 positions and steps of `chunk` tokens.
std::unique_ptr<Session> two_adapter_session(const ModelConfig& c, const TempDir& base, const TempDir& root, uint64_t seed,
                                             int64_t slots, int64_t chunk, Communicator& comm) {
    write_synthetic_checkpoint(base.path(), c, {DType::F32, 1, seed});
    const std::vector<LoraAdapter> dirs = write_adapters(root.path(), layer_adapters(c));
    SessionOptions so;
    so.model_dir = base.path();
    so.adapters = {{"a", dirs[0]}, {"b", dirs[1]}};
    so.ctx = 64;
    so.max_batch = slots;
    so.prefill_chunk = chunk;
    return open_session(so, comm);
}

}  // namespace

// Adapters chosen per sequence (serve --lora-modules): in one batch, sequences under adapter 0,
// adapter 1 and none, in chunks that share steps (prefill chunks of 16 beside decode tokens),
// each compute what the model with that adapter merged computes (prompt logits within float
// rounding, the same greedy tokens), and the adapters change the model. Llama (GQA), Qwen2
// (biases), Qwen3 (q/k norms); FP32 weights, and INT8 weights (adapters in f32 on the quantized
// base: within INT8's own bounds of the merged INT8 model, which quantizes merged weights).
TEST(Lora, AdaptersPerSequenceEqualTheirMergedModels) {
    for (Arch arch : {Arch::Llama, Arch::Qwen2, Arch::Qwen3}) {
        const ModelConfig c = tiny_config(arch);
        TempDir base, root;
        write_synthetic_checkpoint(base.path(), c, {DType::F32, 1, 11});
        const auto ads = layer_adapters(c);
        const std::vector<LoraAdapter> dirs = write_adapters(root.path(), ads);
        const std::vector<std::vector<int32_t>> prompts = {make_prompt(21, c.vocab, 1), make_prompt(7, c.vocab, 2),
                                                           make_prompt(21, c.vocab, 1), make_prompt(12, c.vocab, 3),
                                                           make_prompt(9, c.vocab, 4)};
        const std::vector<int64_t> which = {0, 1, -1, 0, 1};
        for (WeightFormat wf : {WeightFormat::Auto, WeightFormat::Int8}) {
            SessionOptions so;
            so.model_dir = base.path();
            so.load = LoadOptions(wf);
            so.adapters = {{"a", dirs[0]}, {"b", dirs[1]}};
            const std::vector<SequenceResult> mixed = session_greedy(so, prompts, which);
            so.adapters.clear();
            std::vector<std::vector<SequenceResult>> merged(3);  // base, a, b
            merged[0] = session_greedy(so, prompts, std::vector<int64_t>(prompts.size(), -1));
            for (size_t a = 0; a < 2; ++a) {
                so.load.lora = {dirs[a]};
                merged[a + 1] = session_greedy(so, prompts, std::vector<int64_t>(prompts.size(), -1));
            }
            const std::string what = std::string(arch_name(c.arch)) + (wf == WeightFormat::Int8 ? " int8" : " f32");
            for (size_t i = 0; i < prompts.size(); ++i) {
                const SequenceResult& want = merged[size_t(which[i] + 1)][i];
                float scale = 0;
                for (float v : want.prompt_logits) scale = std::max(scale, std::fabs(v));
                // INT8: the merged model quantizes W + BA, this one W and adds BA in f32.
                const float tol = wf == WeightFormat::Int8 ? 0.05f * scale : 1e-3f;
                EXPECT_LT(max_abs_diff(mixed[i].prompt_logits, want.prompt_logits), tol) << what << " prompt " << i;
                if (wf != WeightFormat::Int8) {
                    EXPECT_EQ(mixed[i].tokens, want.tokens) << what << " prompt " << i;
                }
                if (which[i] >= 0) {
                    EXPECT_GT(max_abs_diff(mixed[i].prompt_logits, merged[0][i].prompt_logits), 0.05f) << what << " prompt " << i;
                }
            }
        }
    }
}

// The prefix cache keeps adapters apart: the same prompt under another adapter (or none) shares
// no keys and values, under the same adapter it does, and the tokens are those of runs without
// reuse.
TEST(Lora, PrefixCacheKeepsAdaptersApart) {
    const ModelConfig c = tiny_config(Arch::Qwen3);
    TempDir base, root;
    SingleRank comm;
    auto s = two_adapter_session(c, base, root, 13, 1, 16, comm);
    auto run = [&](bool reuse) {
        BatcherOptions bo;
        bo.prefill_chunk = 16;
        bo.reuse_prefix = reuse;
        Batcher b(*s->engine, bo);
        const std::vector<int32_t> p = make_prompt(30, c.vocab, 5);
        std::vector<SequenceResult> out;
        for (int64_t adapter : {0, 1, 1, -1, 0}) {
            BatchRequest q;
            q.prompt = p;
            q.max_new_tokens = 4;
            q.sampler.temperature = 0;
            q.adapter = adapter;
            const size_t id = b.add(q);
            while (b.busy()) b.step();
            out.push_back(b.result(id));
        }
        return out;
    };
    const std::vector<SequenceResult> fresh = run(false), reused = run(true);
    // One slot: only b after b finds its keys (the prompt but its last token, which runs for its logits).
    const std::vector<int64_t> cached = {0, 0, 29, 0, 0};
    for (size_t i = 0; i < cached.size(); ++i) {
        EXPECT_EQ(reused[i].cached_tokens, cached[i]) << "request " << i;
        EXPECT_EQ(reused[i].tokens, fresh[i].tokens) << "request " << i;
    }
}

// BatcherOptions::max_adapters (serve --max-loras 1): no step runs two adapters; the base model's
// requests are admitted past a request that waits for its adapter's turn, and once one waits, later
// adapter requests wait behind it (none overtakes it under an adapter already running). The
// sequences' tokens are those of the same requests without the limit, where steps do mix adapters.
TEST(Lora, MaxAdaptersBoundsTheAdaptersOfAStep) {
    const ModelConfig c = tiny_config(Arch::Qwen3);
    TempDir base, root;
    SingleRank comm;
    auto s = two_adapter_session(c, base, root, 17, 4, 64, comm);
    const std::vector<int64_t> adapters = {0, 1, -1, 0, 1, -1};
    struct Run {
        std::vector<SequenceResult> out;
        std::vector<int64_t> first, last;  // the step of each request's first and last token
        size_t most = 0;                   // the most adapters in one step
        std::vector<int64_t> running, waiting;  // after the first step
    };
    auto run = [&](int64_t max_adapters) {
        test::RecordingEngine e(*s->engine);
        BatcherOptions bo;
        bo.prefill_chunk = 64;
        bo.max_adapters = max_adapters;
        Batcher b(e, bo);
        for (size_t i = 0; i < adapters.size(); ++i) {
            BatchRequest q;
            q.prompt = make_prompt(8 + int64_t(i), c.vocab, 40 + i);
            q.max_new_tokens = 5;
            q.ignore_eos = true;
            q.sampler.temperature = 0;
            q.adapter = adapters[i];
            b.add(q);
        }
        Run r;
        r.first.assign(adapters.size(), -1);
        r.last.assign(adapters.size(), -1);
        for (int64_t step = 0; b.busy(); ++step) {
            b.step([&](size_t id, int32_t) {
                if (r.first[id] < 0) r.first[id] = step;
                r.last[id] = step;
            });
            if (step == 0) {
                r.running = b.running_adapters();
                r.waiting = b.waiting_adapters();
            }
        }
        for (const auto& step : e.steps) {
            std::vector<int64_t> in_step;
            for (const auto& ch : step)
                if (ch.adapter >= 0 && std::find(in_step.begin(), in_step.end(), ch.adapter) == in_step.end())
                    in_step.push_back(ch.adapter);
            r.most = std::max(r.most, in_step.size());
        }
        for (size_t i = 0; i < adapters.size(); ++i) r.out.push_back(b.result(i));
        return r;
    };
    const Run free = run(0), one = run(1);
    EXPECT_EQ(free.most, 2u);  // the limit has something to bound
    EXPECT_EQ(one.most, 1u);
    // The first step: a's first request and both base-model requests; b and the second a wait.
    EXPECT_EQ(one.first[0], 0);
    EXPECT_EQ(one.first[2], 0);
    EXPECT_EQ(one.first[5], 0);
    EXPECT_EQ(one.running, std::vector<int64_t>({0}));
    EXPECT_EQ(one.waiting, std::vector<int64_t>({0, 1}));
    // Then one adapter at a time, in the order the requests came.
    EXPECT_GT(one.first[1], one.last[0]);
    EXPECT_GT(one.first[3], one.last[1]);
    EXPECT_GT(one.first[4], one.last[3]);
    for (size_t i = 0; i < adapters.size(); ++i) {
        EXPECT_EQ(one.out[i].tokens, free.out[i].tokens) << "request " << i;
        EXPECT_EQ(one.out[i].tokens.size(), 5u) << "request " << i;
    }
}

// Adapters chosen per request are refused where they cannot run: on the embedding or lm_head
// (merged only), and an adapter number the engine does not hold.
TEST(Lora, PerSequenceAdaptersRefuseWhatTheyCannotRun) {
    const ModelConfig c = tiny_config(Arch::Llama);  // untied
    TempDir base, ad;
    write_synthetic_checkpoint(base.path(), c, {DType::F32, 1, 3});
    write_lora_adapter(ad.path(), lora_config(4, 8).dump(), {random_lora_module(c, "lm_head", 4, 1)});
    SessionOptions so;
    so.model_dir = base.path();
    so.ctx = 16;
    so.adapters = {{"head", {ad.path(), 1.0f}}};
    SingleRank comm;
    EXPECT_NE(thrown_error([&] { open_session(so, comm); }).find("lm_head: an adapter on the embedding or lm_head is not switched per request"),
              std::string::npos);
    // Above --max-lora-rank (a rank-4 adapter on the layers): refused, naming the folder and both
    // ranks; at the limit it loads.
    TempDir layer;
    write_lora_adapter(layer.path(), lora_config(4, 8).dump(),
                       {random_lora_module(c, "model.layers.0.self_attn.q_proj", 4, 1)});
    so.adapters = {{"layer", {layer.path(), 1.0f}}};
    so.max_lora_rank = 3;
    EXPECT_NE(thrown_error([&] { open_session(so, comm); }).find("LoRA adapter " + layer.path() + ": rank 4 is greater than --max-lora-rank 3"),
              std::string::npos);
    so.max_lora_rank = 4;
    {
        // The factors are f32 over FP32 weights, BF16 (half the bytes) over any other.
        auto f32 = open_session(so, comm);
        EXPECT_EQ(f32->adapters.at(0).max_rank, 4);
        EXPECT_EQ(f32->adapters[0].layers[0].q.dtype, DType::F32);
        so.load = LoadOptions(WeightFormat::Int8);
        auto i8 = open_session(so, comm);
        EXPECT_EQ(i8->adapters.at(0).layers[0].q.dtype, DType::BF16);
        EXPECT_EQ(i8->adapters[0].bytes() * 2, f32->adapters[0].bytes());
        EXPECT_GT(i8->adapters[0].bytes(), 0u);
        so.load = LoadOptions();
    }
    so.max_lora_rank = 0;
    so.adapters.clear();
    auto s = open_session(so, comm);
    const std::vector<int32_t> p = {5, 6};
    SeqChunk ch;
    ch.tokens = p.data();
    ch.n = 2;
    ch.want_logits = true;
    ch.adapter = 0;
    std::vector<float> logits(size_t(c.vocab));
    EXPECT_NE(thrown_error([&] { s->engine->forward({ch}, logits.data()); }).find("LoRA adapter 0 of 0 this engine holds"),
              std::string::npos);
}

// A pre-quantized base (shardlm quantize: INT4 packs two columns a byte, so the stored tensors
// are not the matrices' shapes) takes adapters per sequence as the same format quantized on load
// does: the factors are checked against the config's shapes, and the tokens and logits are the same.
TEST(Lora, PerSequenceAdaptersOnAPreQuantizedBase) {
    const ModelConfig c = tiny_config(Arch::Qwen3);
    TempDir base, root, q;
    write_synthetic_checkpoint(base.path(), c, {DType::F32, 1, 17});
    const std::vector<LoraAdapter> dirs = write_adapters(root.path(), layer_adapters(c));
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(14, c.vocab, 1), make_prompt(9, c.vocab, 2)};
    for (WeightFormat wf : {WeightFormat::Int8, WeightFormat::Int4}) {
        const std::string dir = q.path() + (wf == WeightFormat::Int4 ? "/int4" : "/int8");
        const LoadOptions lo(wf, wf == WeightFormat::Int4 ? 32 : 0);
        write_quantized_checkpoint(base.path(), dir, lo);
        SessionOptions so;
        so.adapters = {{"a", dirs[0]}, {"b", dirs[1]}};
        so.model_dir = dir;
        const std::vector<SequenceResult> pre = session_greedy(so, prompts, {0, 1});
        so.model_dir = base.path();
        so.load = lo;
        const std::vector<SequenceResult> on_load = session_greedy(so, prompts, {0, 1});
        for (size_t i = 0; i < prompts.size(); ++i) {
            EXPECT_EQ(pre[i].tokens, on_load[i].tokens) << i;
            EXPECT_EQ(pre[i].prompt_logits, on_load[i].prompt_logits) << i;
        }
    }
}
