// Hugging Face's pre-quantized checkpoints (AutoAWQ's GEMM packing, AutoGPTQ/GPTQModel's 4 and 8
// bits, llm-compressor's compressed-tensors; act-order too) load into the engine's INT4/INT8
// layouts exactly. The tests make each layer's truth (codes, zero points, 16-bit scales, groups),
// pack it as the tools do (hf_quant_writer.h), and hold the loaded weights to the truth's
// W = (q - z) * s bit for bit, on one rank and on each of two; the whole model to an FP32
// checkpoint of those W within float rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "fixtures.h"
#include "hf_quant_writer.h"
#include "model/safetensors_writer.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

using Case = HfQuantCase;
using Truth = HfQuantTruth;

struct Out {
    std::vector<std::vector<float>> rows;
    std::vector<std::vector<int32_t>> tokens;
};

Out run(const std::string& dir, const LoadOptions& lo, const std::vector<std::vector<int32_t>>& prompts, int64_t chunk) {
    SessionOptions so;
    so.model_dir = dir;
    so.load = lo;
    so.kv = KVFormat::F32;
    so.max_batch = int64_t(prompts.size());
    so.ctx = 96;
    so.prefill_chunk = chunk;
    SingleRank comm;
    auto s = open_session(so, comm);
    GenerateOptions go;
    go.max_new_tokens = 6;
    go.prefill_chunk = chunk;
    go.sampler.temperature = 0;
    go.keep_prompt_logits = true;
    const GenerateResult r = generate(*s->engine, prompts, go);
    Out out;
    for (const auto& q : r.seqs) {
        out.rows.push_back(q.prompt_logits);
        out.tokens.push_back(q.tokens);
    }
    return out;
}

// Rewrites a checkpoint's tensors through `keep` (which may change one; false drops it).
void rewrite_tensors(const std::string& dir, const std::function<bool(TensorToWrite&)>& keep) {
    std::vector<TensorToWrite> ts;
    {
        SafetensorsFile f(dir + "/model.safetensors");
        for (const auto& [name, info] : f.tensors()) {
            if (name.rfind("__pad_", 0) == 0) continue;
            TensorToWrite t{name, info.dtype_str, info.shape, std::vector<uint8_t>(info.data, info.data + info.nbytes)};
            if (keep(t)) ts.push_back(std::move(t));
        }
    }
    write_safetensors(dir + "/model.safetensors", ts, true);
}

const std::vector<Case> kCases = {
    {"awq", 4, 32},          {"awq", 4, 64},           {"awq", 4, -1},          {"gptq", 4, 32, "gptq"},
    {"gptq", 4, 64, "gptq_v2"}, {"gptq", 4, -1, "gptq"}, {"gptq", 8, 32, "gptq"}, {"gptq", 8, -1, "gptq_v2"},
    {"ct", 4, 32},           {"ct", 4, -1},            {"ct", 4, -2},           {"ct", 8, -1, "", true},
    {"ct", 8, 32},           {"ct", 8, -2, "", true},
    // Act-order: each layer's columns sorted by group on load, the input read in that order.
    {"gptq", 4, 32, "gptq", false, true}, {"gptq", 8, 32, "gptq_v2", false, true}, {"ct", 4, 32, "", false, true},
    {"ct", 8, 32, "", true, true},
};

std::string want_format(const Case& cs) { return cs.bits == 4 ? "int4" : cs.acts ? "w8a8" : "int8"; }

}  // namespace

// Every element of every Linear layer, loaded on one rank and sliced for each of two, equals the
// truth's (q - z) * s exactly, in the layout the format maps to (INT4 for 4 bits, INT8 for 8). An
// act-order layer's columns are sorted by group, each rank's block of a row-parallel one taken
// from the sorted columns, and input_order names the column each came from; except down_proj's,
// which gate and up make in that order (LayerWeights::inter_rows: their rows, down's columns).
TEST(HfQuant, LayersUnpackExactlyOnEveryRank) {
    ModelConfig cfg = tiny_config(Arch::Qwen3);
    cfg.intermediate = 256;  // two ranks' halves of 128 columns hold whole groups of 64
    for (const Case& cs : kCases) {
        TempDir hf, ref;
        const auto truth = write_pair(cfg, cs, hf.path(), ref.path(), 11);
        const ModelConfig c = load_config(hf.path());
        EXPECT_EQ(c.quant.format, want_format(cs)) << cs.name();
        EXPECT_EQ(c.quant.act_order, cs.act_order) << cs.name();  // (what shardlm info says)
        EXPECT_EQ(c.quant.group_size, cs.group > 0 ? cs.group : cs.bits == 4 ? 64 : 0) << cs.name();
        const Checkpoint ck(hf.path());
        for (int tp : {1, 2})
            for (int rank = 0; rank < tp; ++rank) {
                const ModelWeights w = load_weights(ck, c, LoadOptions{}, plan_shard(c, rank, tp));
                EXPECT_EQ(weight_format_name(w.format), want_format(cs)) << cs.name();
                size_t checked = 0;
                for (const LayerWeights& L : w.layers) {
                    // Act-order: down_proj's block of its sorted columns, in order; distinct elements.
                    ASSERT_EQ(L.inter_rows.size(), cs.act_order ? size_t(L.down.w.cols) : size_t(0)) << cs.name();
                    std::vector<bool> made(size_t(c.intermediate), false);
                    for (int32_t e : L.inter_rows) made.at(size_t(e)) = true;
                    EXPECT_EQ(std::count(made.begin(), made.end(), true), int64_t(L.inter_rows.size())) << cs.name();
                    for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) {
                        const Truth& t = truth.at(l->name);
                        ASSERT_EQ(l->w.dtype, cs.bits == 4 ? DType::I4 : DType::I8) << l->name;
                        // Column-parallel layers keep every column and a block of rows; row-parallel
                        // ones every row and a block of columns.
                        const bool rows_split = l->w.cols == t.cols;
                        const int64_t r0 = rows_split ? rank * l->w.rows : 0, c0 = rows_split ? 0 : rank * l->w.cols;
                        ASSERT_EQ(rows_split ? l->w.rows * tp : l->w.cols * tp, rows_split ? t.rows : t.cols) << l->name;
                        // Act-order: the block's columns come from anywhere in the layer's input (down's
                        // input is made in its order instead).
                        const bool down = l == &L.down, made_in_order = l == &L.gate || l == &L.up;
                        const bool gathers = cs.act_order && !down;
                        ASSERT_EQ(l->input_order.size(), gathers ? size_t(l->w.cols) : size_t(0)) << cs.name() << " " << l->name;
                        EXPECT_EQ(l->input_width, gathers ? t.cols : 0) << l->name;
                        std::vector<int32_t> order = down ? L.inter_rows : l->input_order;
                        std::vector<bool> seen(size_t(t.cols), false);
                        for (int32_t c : order) seen.at(size_t(c)) = true;
                        EXPECT_EQ(std::count(seen.begin(), seen.end(), true), int64_t(order.size())) << l->name;
                        if (order.empty())
                            for (int64_t c = 0; c < l->w.cols; ++c) order.push_back(int32_t(c0 + c));
                        std::vector<float> row(size_t(l->w.cols));
                        for (int64_t r = 0; r < l->w.rows; ++r) {
                            weight_row_to_f32(l->w, r, row.data());
                            const int64_t tr = made_in_order && !L.inter_rows.empty() ? L.inter_rows[size_t(r)] : r0 + r;
                            for (int64_t col = 0; col < l->w.cols; ++col, ++checked)
                                ASSERT_EQ(row[size_t(col)], t.w(tr, order[size_t(col)]))
                                    << cs.name() << " tp " << tp << " rank " << rank << " " << l->name << " (" << r << ", "
                                    << col << ")";
                        }
                    }
                }
                EXPECT_GT(checked, size_t(0));
            }
    }
}

// The whole model on an AWQ or GPTQ checkpoint computes what FP32 computes on the truth's weights
// (the vocabulary matrix kept float on both sides): GEMM and GEMV chunks, tokens equal. Act-order
// layers read their input in their columns' order (one copy for q/k/v and one for gate/up, or
// one each where their orders differ).
TEST(HfQuant, ModelComputesWhatFp32ComputesOnTheUnpackedWeights) {
    for (Arch arch : {Arch::Llama, Arch::Qwen2, Arch::Qwen3})
        for (const Case& cs : {Case{"awq", 4, 32}, Case{"gptq", 4, -1, "gptq"}, Case{"gptq", 8, 32, "gptq"},
                               Case{"ct", 4, 32}, Case{"ct", 8, -2}, Case{"gptq", 4, 32, "gptq", false, true},
                               Case{"gptq", 4, 32, "gptq", false, true, true}, Case{"ct", 8, 32, "", false, true}}) {
            const ModelConfig cfg = tiny_config(arch);
            TempDir hf, ref;
            write_pair(cfg, cs, hf.path(), ref.path(), 21);
            std::vector<std::vector<int32_t>> prompts;
            for (int i = 0; i < 3; ++i) prompts.push_back(make_prompt(9 + 13 * i, cfg.vocab, uint64_t(40 + i)));
            const double tol = cpu_quantized_weights_round() ? 5e-4 : 2e-5;
            for (int64_t chunk : {16, 3}) {
                const Out q = run(hf.path(), {WeightFormat::Auto, 0, "lm_head|embed_tokens"}, prompts, chunk);
                const Out r = run(ref.path(), {WeightFormat::F32, 0, ""}, prompts, chunk);
                for (size_t i = 0; i < prompts.size(); ++i) {
                    float scale = 0;
                    for (float v : r.rows[i]) scale = std::max(scale, std::fabs(v));
                    EXPECT_LT(max_abs_diff(q.rows[i], r.rows[i]), tol * scale)
                        << arch_name(arch) << " " << cs.name() << " chunk " << chunk << " prompt " << i;
                    EXPECT_EQ(q.tokens[i], r.tokens[i]) << arch_name(arch) << " " << cs.name() << " chunk " << chunk;
                }
            }
            // By default the vocabulary matrix is INT8 (as --weights int4/int8 make it): close, not equal.
            const Out d = run(hf.path(), {}, prompts, 16);
            const Out r = run(ref.path(), {WeightFormat::F32, 0, ""}, prompts, 16);
            for (size_t i = 0; i < prompts.size(); ++i) {
                EXPECT_GT(cosine(d.rows[i], r.rows[i]), 0.999) << arch_name(arch) << " " << cs.name();
                EXPECT_NE(d.rows[i], r.rows[i]);
            }
        }
}

// LoRA adapters chosen per sequence (serve --lora-modules) over a Hub-quantized base (GPTQ and
// AWQ, whose layers are stored as packed qweight, not as the matrices' shapes): the factors are
// checked against the config's shapes, and each sequence computes what it computes over the FP32
// checkpoint of the unpacked weights with the same adapter (act-order too: the adapters read the
// input in its own order).
TEST(HfQuant, AdaptersPerSequenceOverAQuantizedBase) {
    const ModelConfig cfg = tiny_config(Arch::Qwen2);
    TempDir ad;
    std::vector<LoraModule> ms;
    uint64_t seed = 70;
    for (int64_t l = 0; l < cfg.n_layers; ++l)
        for (const char* lin : {"self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"})
            ms.push_back(random_lora_module(cfg, "model.layers." + std::to_string(l) + "." + lin, 4, seed++));
    write_lora_adapter(ad.path(), R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "bias": "none"})", ms);
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(12, cfg.vocab, 1), make_prompt(7, cfg.vocab, 2)};
    const std::vector<int64_t> which = {0, -1};
    for (const Case& cs : {Case{"gptq", 4, 32, "gptq"}, Case{"awq", 4, 32}, Case{"gptq", 4, 32, "gptq", false, true}}) {
        TempDir hf, ref;
        write_pair(cfg, cs, hf.path(), ref.path(), 23);
        auto greedy = [&](const std::string& dir, const LoadOptions& lo) {
            SessionOptions so;
            so.model_dir = dir;
            so.load = lo;
            so.adapters = {{"a", {ad.path(), 1.0f}}};
            so.ctx = 32;
            so.max_batch = 2;
            so.prefill_chunk = 16;
            SingleRank comm;
            auto s = open_session(so, comm);
            return batch_greedy(*s->engine, prompts, which, 5, 16);
        };
        const auto q = greedy(hf.path(), {WeightFormat::Auto, 0, "lm_head|embed_tokens"});
        const auto r = greedy(ref.path(), {WeightFormat::F32, 0, ""});
        const double tol = cpu_quantized_weights_round() ? 5e-4 : 2e-5;
        for (size_t i = 0; i < prompts.size(); ++i) {
            float scale = 0;
            for (float v : r[i].prompt_logits) scale = std::max(scale, std::fabs(v));
            EXPECT_LT(max_abs_diff(q[i].prompt_logits, r[i].prompt_logits), tol * scale) << cs.name() << " prompt " << i;
            EXPECT_EQ(q[i].tokens, r[i].tokens) << cs.name() << " prompt " << i;
        }
    }
}

// W4A8 over an AWQ checkpoint's weights (--weights w4a8): INT8 activations, within their noise of
// W4A16 on the same weights.
TEST(HfQuant, AwqRunsAsW4A8) {
    const ModelConfig cfg = tiny_config(Arch::Llama);
    // (And act-order GPTQ: its activations quantized per group of the reordered input.)
    for (const Case& cs : {Case{"awq", 4, 32}, Case{"gptq", 4, 32, "gptq", false, true}}) {
        TempDir hf, ref;
        write_pair(cfg, cs, hf.path(), ref.path(), 31);
        const std::vector<std::vector<int32_t>> prompts = {make_prompt(20, cfg.vocab, 3)};
        const Out a16 = run(hf.path(), {}, prompts, 16), a8 = run(hf.path(), {WeightFormat::W4A8, 0, ""}, prompts, 16);
        EXPECT_GT(cosine(a8.rows[0], a16.rows[0]), 0.999) << cs.name();
        EXPECT_NE(a8.rows[0], a16.rows[0]) << cs.name();
    }
}

// compressed-tensors' W8A8 (INT8 weights per channel, dynamic INT8 inputs per token) loads as
// --weights w8a8 by default: within the activations' rounding noise of the same weights as W8A16.
TEST(HfQuant, CompressedTensorsW8A8RunsWithInt8Activations) {
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    TempDir hf, ref;
    write_pair(cfg, {"ct", 8, -1, "", true}, hf.path(), ref.path(), 33);
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(20, cfg.vocab, 4)};
    const Out a8 = run(hf.path(), {}, prompts, 16), a16 = run(hf.path(), {WeightFormat::Int8, 0, ""}, prompts, 16);
    EXPECT_GT(cosine(a8.rows[0], a16.rows[0]), 0.999);
    EXPECT_NE(a8.rows[0], a16.rows[0]);
}

TEST(HfQuant, BadInput) {
    const ModelConfig cfg = tiny_config(Arch::Llama);
    const std::vector<std::vector<int32_t>> prompt = {{1, 2, 3}};
    auto refused = [&](const Case& cs, const std::function<void(nlohmann::json&)>& edit, const LoadOptions& lo = {},
                       const std::function<void(const std::string&)>& damage = {}) {
        TempDir hf, ref;
        write_pair(cfg, cs, hf.path(), ref.path(), 5, edit);
        if (damage) damage(hf.path());
        return thrown_error([&] { run(hf.path(), lo, prompt, 16); });
    };
    auto set = [](const char* key, nlohmann::json v) {
        return [key, v](nlohmann::json& c) { c["quantization_config"][key] = v; };
    };
    const Case awq{"awq", 4, 32}, gptq{"gptq", 4, 32, "gptq"}, gptq8{"gptq", 8, 32, "gptq"}, ct4{"ct", 4, 32},
        ct8{"ct", 8, -1, "", true};
    auto group0 = [](const char* part, const char* key, nlohmann::json v) {
        return [=](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"][part][key] = v; };
    };
    auto has = [](const std::string& e, const std::string& needle) {
        EXPECT_NE(e.find(needle), std::string::npos) << "got: " << e << "\nwanted: " << needle;
    };
    has(refused(ct8, set("format", "nvfp4-pack-quantized")), "format \"nvfp4-pack-quantized\" is not supported (compressed-tensors");
    has(refused(ct8, group0("weights", "symmetric", false)), "weights symmetric false: asymmetric weights are not supported");
    has(refused(ct8, group0("weights", "num_bits", 4)), "weights num_bits 4 is not supported with format int-quantized");
    has(refused(ct8, group0("weights", "strategy", "block")), "weights strategy \"block\" is not supported");
    // Act-order: a weight_g_idx whose groups are not all group_size columns (column 5 moved from
    // group 0 to 3), and one naming a group past the last.
    auto g_idx_of = [&](const char* name, int64_t cols, std::function<void(std::vector<uint32_t>&)> change) {
        return [=](const std::string& dir) {
            rewrite_tensors(dir, [&](TensorToWrite& t) {
                if (t.name != name) return true;
                std::vector<uint32_t> gi(static_cast<size_t>(cols));
                std::memcpy(gi.data(), t.bytes.data(), t.bytes.size());
                change(gi);
                t = words(name, {cols}, gi);
                return true;
            });
        };
    };
    const Case ct4_act{"ct", 4, 32, "", false, true}, gptq_act{"gptq", 4, 32, "gptq", false, true};
    const std::string moved = refused(ct4_act, {}, {},
                                      g_idx_of("model.layers.0.mlp.down_proj.weight_g_idx", 160,
                                               [](std::vector<uint32_t>& gi) { gi[5] = (gi[5] + 1) % 5; }));
    has(moved, "tensor model.layers.0.mlp.down_proj.weight_g_idx: group ");
    has(moved, " columns, not the group size 32 (act-order with static groups of another size is not supported)");
    has(refused(gptq_act, {}, {},
                g_idx_of("model.layers.1.mlp.up_proj.g_idx", 64, [](std::vector<uint32_t>& gi) { gi[40] = 2; })),
        "tensor model.layers.1.mlp.up_proj.g_idx: column 40 is in group 2, outside 0..1");
    has(refused(ct8, group0("input_activations", "dynamic", false)), "only dynamic symmetric INT8 per token is supported");
    has(refused(ct8, set("kv_cache_scheme", {{"num_bits", 8}, {"type", "float"}})), "kv_cache_scheme: a quantized KV cache scheme");
    has(refused(ct4, [](nlohmann::json& c) {
            c["quantization_config"]["config_groups"]["group_1"] = c["quantization_config"]["config_groups"]["group_0"];
            c["quantization_config"]["config_groups"]["group_1"]["weights"]["group_size"] = 64;
        }),
        "config_groups.group_1: config groups with different schemes are not supported");
    has(refused(ct8, {}, {},
                [&](const std::string& dir) {
                    rewrite_tensors(dir, [](TensorToWrite& t) {
                        if (t.name == "model.layers.1.mlp.down_proj.weight_zero_point") t.bytes[3] = 1;
                        return true;
                    });
                }),
        "tensor model.layers.1.mlp.down_proj.weight_zero_point is not zero: asymmetric");
    has(refused(ct4, {}, {},
                [&](const std::string& dir) {
                    rewrite_tensors(dir, [](TensorToWrite& t) {
                        if (t.name == "model.layers.0.mlp.up_proj.weight_shape") t.bytes[0] ^= 1;
                        return true;
                    });
                }),
        "tensor model.layers.0.mlp.up_proj.weight_shape is not [160, 64]");
    has(refused(awq, set("version", "gemv")), "quantization_config version \"gemv\" is not supported");
    has(refused(awq, set("bits", 3)), "quantization_config bits 3 is not supported (AWQ");
    has(refused(awq, set("zero_point", false)), "quantization_config zero_point false is not supported");
    has(refused(gptq, set("bits", 2)), "quantization_config bits 2 is not supported (GPTQ checkpoints load with bits 4 or 8)");
    has(refused(gptq, set("checkpoint_format", "marlin")), "checkpoint_format \"marlin\" is not supported");
    has(refused(gptq, set("dynamic", {{"-:.*down_proj.*", nlohmann::json::object()}})), "dynamic: per-module GPTQ overrides");
    has(refused(gptq, set("group_size", 48)), "group_size 48 does not divide a layer's input width");
    has(refused(gptq, set("group_size", 16)), "group_size 16: the INT4 layout takes groups of a multiple of 32");
    has(refused(gptq, set("group_size", 0)), "group_size 0 must be positive or -1");
    has(refused(awq, set("quant_method", "bitsandbytes")), "quant_method \"bitsandbytes\" is not supported (checkpoints quantized by shardlm quantize, AutoAWQ (awq)");
    // The config says one group a row, the tensors hold groups of 32: qzeros' shape gives it away.
    has(refused(awq, set("group_size", -1)), "tensor model.layers.0.self_attn.q_proj.qzeros has shape [2, 8], expected [1, 8]");
    has(refused(gptq, {}, {WeightFormat::F16, 0, ""}), "is pre-quantized (int4); use --weights auto, int4 or w4a8");
    has(refused(gptq8, {}, {WeightFormat::Int4, 0, ""}), "is pre-quantized (int8); use --weights auto, int8 or w8a8");
    has(refused(awq, {}, {WeightFormat::Auto, 0, "down_proj"}),
        "--keep-fp16 matches model.layers.0.mlp.down_proj.weight, which");
    // Asymmetric 8-bit: one zero point moved off 128.
    has(refused(gptq8, {}, {},
                [&](const std::string& dir) {
                    rewrite_tensors(dir, [](TensorToWrite& t) {
                        if (t.name == "model.layers.0.self_attn.o_proj.qzeros") t.bytes[1] ^= 1;  // row 1: 127 -> 126 stored
                        return true;
                    });
                }),
        "model.layers.0.self_attn.o_proj.qweight: zero point 127 of row 1 and group 0 is not 128");
    // A packed tensor of the wrong dtype, and one missing.
    has(refused(awq, {}, {},
                [&](const std::string& dir) {
                    rewrite_tensors(dir, [](TensorToWrite& t) {
                        if (t.name == "model.layers.1.self_attn.v_proj.qweight") t.dtype = "F32";
                        return true;
                    });
                }),
        "tensor model.layers.1.self_attn.v_proj.qweight has dtype F32 (expected i32)");
    has(refused(awq, {}, {},
                [&](const std::string& dir) {
                    rewrite_tensors(dir, [](TensorToWrite& t) { return t.name != "model.layers.0.mlp.gate_proj.qzeros"; });
                }),
        "model.layers.0.mlp.gate_proj.qzeros");
}

// FP8 ------------------------------------------------------------------------------------------

namespace {

// E4M3 from its definition: sign, 4 exponent bits with bias 7 (0: subnormal), 3 mantissa bits.
float e4m3_ref(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const float sign = (b & 0x80) ? -1.0f : 1.0f;
    return sign * (e == 0 ? std::ldexp(float(m) / 8.0f, -6) : std::ldexp(1.0f + float(m) / 8.0f, e - 7));
}

struct Fp8Case {
    std::string method;        // "fp8" (weight_scale_inv per block) or "ct" (compressed-tensors' weight_scale)
    int64_t br = 0, bc = 0;    // rows/columns a scale spans; 0: all (ct: channel is 1 x 0, tensor 0 x 0)
    std::string name() const { return method + "_" + std::to_string(br) + "x" + std::to_string(bc); }
};

nlohmann::json fp8_config(const Fp8Case& fc) {
    if (fc.method == "fp8")
        return {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                {"weight_block_size", {fc.br, fc.bc}}};
    nlohmann::json w = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"dynamic", false},
                        {"strategy", fc.br == 1 && fc.bc == 0 ? "channel" : fc.br == 0 ? "tensor" : "block"}};
    if (fc.br > 1) w["block_structure"] = {fc.br, fc.bc};
    return {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"},
            {"config_groups",
             {{"group_0",
               {{"targets", {"Linear"}}, {"weights", w},
                {"input_activations",
                 {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"dynamic", true}, {"strategy", "token"}}}}}}},
            {"ignore", {"lm_head"}}};
}

// `fp8`: the Linear weights as E4M3 codes (exponents up to 9: |code| <= 7.5) with their scales
// (f32 for quant_method fp8, bf16 for compressed-tensors); `ref`: FP32 with code * scale. The
// truth by weight name.
std::map<std::string, std::vector<float>> write_fp8_pair(const ModelConfig& cfg, const Fp8Case& fc, const std::string& fp8,
                                                         const std::string& ref, uint64_t seed) {
    TempDir src;
    write_synthetic_checkpoint(src.path(), cfg, {DType::BF16, 1, seed});
    std::mt19937 rng{uint32_t(seed)};
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(0.005f, 0.015f);
    std::map<std::string, std::vector<float>> truth;
    std::vector<TensorToWrite> a, b;
    SafetensorsFile f(src.path() + "/model.safetensors");
    for (const auto& [name, info] : f.tensors()) {
        if (name.rfind("__pad_", 0) == 0) continue;
        const bool linear = is_linear_weight(name);
        const TensorToWrite same{name, info.dtype_str, info.shape, std::vector<uint8_t>(info.data, info.data + info.nbytes)};
        if (!linear) {
            a.push_back(same);
            b.push_back(same);
            continue;
        }
        const int64_t rows = info.shape[0], cols = info.shape[1];
        const int64_t br = fc.br > 0 ? fc.br : rows, bc = fc.bc > 0 ? fc.bc : cols;
        const int64_t nrb = (rows + br - 1) / br, ncb = (cols + bc - 1) / bc;
        std::vector<float> s(size_t(nrb * ncb));
        for (float& v : s) v = fc.method == "ct" ? bf16_to_f32(f32_to_bf16(scale(rng))) : scale(rng);
        TensorToWrite codes{name, "F8_E4M3", {rows, cols}, std::vector<uint8_t>(size_t(rows * cols))};
        std::vector<float> w(size_t(rows * cols));
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
                uint8_t q;
                do q = uint8_t(byte(rng));
                while (((q >> 3) & 15) > 9);
                codes.bytes[size_t(r * cols + c)] = q;
                w[size_t(r * cols + c)] = e4m3_ref(q) * s[size_t((r / br) * ncb + c / bc)];
            }
        a.push_back(std::move(codes));
        const std::string sname = name + (fc.method == "fp8" ? "_scale_inv" : "_scale");
        const std::vector<int64_t> sshape =
            fc.br == 0 && fc.bc == 0 ? std::vector<int64_t>{1} : std::vector<int64_t>{nrb, ncb};
        if (fc.method == "ct") {
            a.push_back(sixteen(sname, sshape, s, true));
        } else {
            TensorToWrite st{sname, "F32", sshape, std::vector<uint8_t>(s.size() * 4)};
            std::memcpy(st.bytes.data(), s.data(), st.bytes.size());
            a.push_back(std::move(st));
        }
        TensorToWrite wt{name, "F32", {rows, cols}, std::vector<uint8_t>(w.size() * 4)};
        std::memcpy(wt.bytes.data(), w.data(), wt.bytes.size());
        b.push_back(std::move(wt));
        truth.emplace(name, std::move(w));
    }
    nlohmann::json config = nlohmann::json::parse(config_json(cfg));
    write_file(ref + "/config.json", config.dump(2));
    config["quantization_config"] = fp8_config(fc);
    write_file(fp8 + "/config.json", config.dump(2));
    write_safetensors(fp8 + "/model.safetensors", a, true);
    write_safetensors(ref + "/model.safetensors", b, true);
    return truth;
}

const std::vector<Fp8Case> kFp8Cases = {{"fp8", 128, 128}, {"fp8", 48, 32}, {"ct", 1, 0}, {"ct", 0, 0}, {"ct", 32, 48}};

}  // namespace

TEST(HfQuant, E4m3DecodesAsDefined) {
    for (int b = 0; b < 256; ++b) {
        const float v = e4m3_to_f32(uint8_t(b));
        if ((b & 0x7f) == 0x7f) EXPECT_TRUE(std::isnan(v)) << b;
        else EXPECT_EQ(v, e4m3_ref(uint8_t(b))) << b;
    }
    EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
    EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
    EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
    EXPECT_EQ(e4m3_to_f32(0xc0), -2.0f);
    EXPECT_EQ(std::signbit(e4m3_to_f32(0x80)), true);
}

// Every FP8 layer loads as its codes times their block's scale: exactly under --weights fp32,
// rounded once to bf16 under auto, on one rank and on each of two.
TEST(HfQuant, Fp8LayersLoadAsCodeTimesScale) {
    const ModelConfig cfg = tiny_config(Arch::Qwen3);
    for (const Fp8Case& fc : kFp8Cases) {
        TempDir fp8, ref;
        const auto truth = write_fp8_pair(cfg, fc, fp8.path(), ref.path(), 13);
        const ModelConfig c = load_config(fp8.path());
        ASSERT_TRUE(c.fp8.present) << fc.name();
        EXPECT_FALSE(c.quant.present);
        const Checkpoint ck(fp8.path());
        for (WeightFormat f : {WeightFormat::F32, WeightFormat::Auto})
            for (int tp : {1, 2})
                for (int rank = 0; rank < tp; ++rank) {
                    const ModelWeights w = load_weights(ck, c, LoadOptions{f, 0, ""}, plan_shard(c, rank, tp));
                    for (const LayerWeights& L : w.layers)
                        for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) {
                            const std::vector<float>& t = truth.at(l->name);
                            ASSERT_EQ(l->w.dtype, f == WeightFormat::F32 ? DType::F32 : DType::BF16) << l->name;
                            const int64_t cols = ck.get(l->name).shape[1];
                            const bool rows_split = l->w.cols == cols;
                            const int64_t r0 = rows_split ? rank * l->w.rows : 0, c0 = rows_split ? 0 : rank * l->w.cols;
                            std::vector<float> row(size_t(l->w.cols));
                            for (int64_t r = 0; r < l->w.rows; ++r) {
                                weight_row_to_f32(l->w, r, row.data());
                                for (int64_t k = 0; k < l->w.cols; ++k) {
                                    const float want = t[size_t((r0 + r) * cols + c0 + k)];
                                    ASSERT_EQ(row[size_t(k)], f == WeightFormat::F32 ? want : bf16_to_f32(f32_to_bf16(want)))
                                        << fc.name() << " tp " << tp << " rank " << rank << " " << l->name << " (" << r << ", " << k << ")";
                                }
                            }
                        }
                }
    }
}

// The whole model on an FP8 checkpoint under --weights fp32 is the FP32 checkpoint of its widened
// weights, bit for bit; quantized on load (int8), the two give the same INT8 model.
TEST(HfQuant, Fp8ModelIsItsWidenedWeights) {
    for (const Fp8Case& fc : {Fp8Case{"fp8", 48, 32}, Fp8Case{"ct", 1, 0}}) {
        const ModelConfig cfg = tiny_config(Arch::Qwen2);
        TempDir fp8, ref;
        write_fp8_pair(cfg, fc, fp8.path(), ref.path(), 23);
        const std::vector<std::vector<int32_t>> prompts = {make_prompt(17, cfg.vocab, 8), make_prompt(6, cfg.vocab, 9)};
        for (WeightFormat f : {WeightFormat::F32, WeightFormat::Int8}) {
            const Out a = run(fp8.path(), {f, 0, ""}, prompts, 16), b = run(ref.path(), {f, 0, ""}, prompts, 16);
            for (size_t i = 0; i < prompts.size(); ++i) {
                EXPECT_EQ(a.rows[i], b.rows[i]) << fc.name() << " " << weight_format_name(f) << " prompt " << i;
                EXPECT_EQ(a.tokens[i], b.tokens[i]);
            }
        }
        const Out bf = run(fp8.path(), {}, prompts, 16), r = run(ref.path(), {WeightFormat::F32, 0, ""}, prompts, 16);
        for (size_t i = 0; i < prompts.size(); ++i) EXPECT_GT(cosine(bf.rows[i], r.rows[i]), 0.9999) << fc.name();
    }
}

TEST(HfQuant, Fp8BadInput) {
    const ModelConfig cfg = tiny_config(Arch::Llama);
    auto refused = [&](const Fp8Case& fc, const std::function<void(nlohmann::json&)>& edit) {
        TempDir fp8, ref;
        write_fp8_pair(cfg, fc, fp8.path(), ref.path(), 7);
        nlohmann::json c = nlohmann::json::parse(read_file(fp8.path() + "/config.json"));
        edit(c);
        write_file(fp8.path() + "/config.json", c.dump());
        return thrown_error([&] { run(fp8.path(), {}, {{1, 2, 3}}, 16); });
    };
    auto has = [](const std::string& e, const std::string& needle) {
        EXPECT_NE(e.find(needle), std::string::npos) << "got: " << e << "\nwanted: " << needle;
    };
    const Fp8Case fp8{"fp8", 32, 32}, ct{"ct", 1, 0};
    auto set = [](const char* key, nlohmann::json v) { return [key, v](nlohmann::json& c) { c["quantization_config"][key] = v; }; };
    has(refused(fp8, set("fmt", "e5m2")), "quantization_config fmt \"e5m2\" is not supported (e4m3)");
    has(refused(fp8, set("activation_scheme", "static")), "activation_scheme \"static\" is not supported");
    has(refused(fp8, set("weight_block_size", nullptr)), "FP8 without weight_block_size (one scale per tensor) is not supported");
    has(refused(fp8, set("weight_block_size", {128})), "weight_block_size must be two positive integers, got [128]");
    has(refused(fp8, set("weight_block_size", {64, 32})),
        "tensor model.layers.0.self_attn.q_proj.weight_scale_inv has shape [2, 2], expected [1, 2]");
    has(refused(ct, [](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "group"; }),
        "weights strategy \"group\" is not supported (channel, block or tensor)");
    has(refused(ct, [](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"]["input_activations"]["dynamic"] = false; }),
        "input_activations: static activation scales are not supported");
    has(refused(ct, [](nlohmann::json& c) { c.erase("quantization_config"); }),
        "tensor model.layers.0.self_attn.q_proj.weight is FP8 (F8_E4M3) but");
}
