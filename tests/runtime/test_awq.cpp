// AWQ channel scales (runtime/awq.h) and their folding into the weights as they load.
#include <gtest/gtest.h>

#include <cmath>

#include "comm/communicator.h"
#include "core/error.h"
#include "fixtures.h"
#include "model/quantize_checkpoint.h"
#include "model/safetensors_writer.h"
#include "runtime/awq.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

std::vector<std::vector<float>> last_logits(const std::string& dir, const LoadOptions& lo,
                                            const std::vector<std::vector<int32_t>>& prompts) {
    SessionOptions so;
    so.model_dir = dir;
    so.load = lo;
    so.kv = KVFormat::F32;
    so.max_batch = int64_t(prompts.size());
    so.ctx = 128;
    so.prefill_chunk = 32;
    SingleRank comm;
    auto s = open_session(so, comm);
    GenerateOptions go;
    go.max_new_tokens = 1;
    go.prefill_chunk = 32;
    go.sampler.temperature = 0;
    go.keep_prompt_logits = true;
    std::vector<std::vector<float>> rows;
    for (const auto& q : generate(*s->engine, prompts, go).seqs) rows.push_back(q.prompt_logits);
    return rows;
}

double mean_sq_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    double s = 0;
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i)
        for (size_t j = 0; j < a[i].size(); ++j, ++n) s += double(a[i][j] - b[i][j]) * (a[i][j] - b[i][j]);
    return s / double(n);
}

// A model with every query head on its own KV head (so o_proj is scaled too) and q/k/v biases.
ModelConfig mha_config() {
    ModelConfig c = tiny_config(Arch::Qwen2);
    c.n_kv_heads = c.n_heads;
    c.intermediate = 128;
    return c;
}

// Rewrites the norm weights of `dir` so that a few hidden channels come out of every RMSNorm
// `gain` times larger than the rest, the activation outliers of real LLMs (and the matching
// weight columns `gain` times smaller, so the model is about as before).
void add_salient_channels(const std::string& dir, const ModelConfig& c, float gain) {
    SafetensorsFile f(dir + "/model.safetensors");
    const int64_t salient[] = {3, 17, 40};
    std::vector<TensorToWrite> ts;
    for (const auto& kv : f.tensors()) {
        if (kv.first.rfind("__pad_", 0) == 0) continue;
        TensorToWrite t{kv.first, "F32", kv.second.shape, std::vector<uint8_t>(kv.second.nbytes)};
        std::memcpy(t.bytes.data(), kv.second.data, kv.second.nbytes);
        float* v = reinterpret_cast<float*>(t.bytes.data());
        const std::string& n = kv.first;
        const bool norm = n.find("layernorm.weight") != std::string::npos;
        const bool reads_hidden = n.find("q_proj.weight") != std::string::npos || n.find("k_proj.weight") != std::string::npos ||
                                  n.find("v_proj.weight") != std::string::npos || n.find("gate_proj.weight") != std::string::npos ||
                                  n.find("up_proj.weight") != std::string::npos;
        for (int64_t ch : salient) {
            if (norm) v[ch] *= gain;
            if (reads_hidden)
                for (int64_t r = 0; r < kv.second.shape[0]; ++r) v[r * c.hidden + ch] /= gain;
        }
        ts.push_back(std::move(t));
    }
    write_safetensors(dir + "/model.safetensors", ts, true);
}

}  // namespace

// Folding: norm weights, v/up rows and biases divided by what the next columns are multiplied
// by leave the float model's function unchanged (up to float rounding).
TEST(Awq, ChannelScalesLeaveTheFloatModelUnchanged) {
    const ModelConfig c = mha_config();
    TempDir d;
    write_synthetic_checkpoint(d.path(), c, {DType::F32, 1, 91});
    const std::vector<std::vector<int32_t>> prompts = {make_prompt(20, c.vocab, 1), make_prompt(45, c.vocab, 2)};
    LoadOptions lo{WeightFormat::F32, 0, ""};
    const auto ref = last_logits(d.path(), lo, prompts);
    const int64_t q_dim = c.n_heads * c.head_dim;
    auto scales = [](int64_t n, uint32_t seed) {
        std::vector<float> s(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) s[size_t(i)] = std::exp(0.8f * std::sin(float(i * 7 + seed)));  // 0.45 .. 2.2
        return s;
    };
    for (int64_t l = 0; l < c.n_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l);
        const auto s_qkv = scales(c.hidden, 1), s_mlp = scales(c.hidden, 2), s_down = scales(c.intermediate, 3),
                   s_o = scales(q_dim, 4);
        for (const char* m : {".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight"})
            lo.scales.in[p + m] = s_qkv;
        lo.scales.out[p + ".input_layernorm.weight"] = s_qkv;
        lo.scales.in[p + ".mlp.gate_proj.weight"] = lo.scales.in[p + ".mlp.up_proj.weight"] = s_mlp;
        lo.scales.out[p + ".post_attention_layernorm.weight"] = s_mlp;
        lo.scales.in[p + ".mlp.down_proj.weight"] = s_down;
        lo.scales.out[p + ".mlp.up_proj.weight"] = s_down;
        lo.scales.in[p + ".self_attn.o_proj.weight"] = s_o;
        lo.scales.out[p + ".self_attn.v_proj.weight"] = lo.scales.out[p + ".self_attn.v_proj.bias"] = s_o;
    }
    const auto got = last_logits(d.path(), lo, prompts);
    for (size_t i = 0; i < prompts.size(); ++i) {
        float scale = 0;
        for (float v : ref[i]) scale = std::max(scale, std::fabs(v));
        EXPECT_LT(max_abs_diff(got[i], ref[i]), 1e-5 * scale) << "prompt " << i;
    }
    // Dropping one side of a pair does change the model (the test can see a missing fold).
    lo.scales.out.erase("model.layers.1.self_attn.v_proj.bias");
    EXPECT_GT(max_abs_diff(last_logits(d.path(), lo, prompts)[0], ref[0]), 1e-3);
    // A scale vector of the wrong length is named.
    lo.scales.in["model.layers.0.mlp.down_proj.weight"].pop_back();
    try {
        last_logits(d.path(), lo, prompts);
        ADD_FAILURE() << "loaded with a short scale vector";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.down_proj.weight: 127 channel scales for its 128 columns"),
                  std::string::npos) << e.what();
    }
}

// On a model whose norms make a few channels large (as real LLMs do), the searched scales bring
// INT4 closer to FP32 than round-to-nearest, and the scaled model still computes the same in FP32.
TEST(Awq, BeatsRoundToNearestWhereChannelsAreSalient) {
    const ModelConfig c = mha_config();
    TempDir d;
    write_synthetic_checkpoint(d.path(), c, {DType::F32, 1, 92});
    add_salient_channels(d.path(), c, 20.0f);
    const std::vector<int32_t> calib = make_prompt(300, c.vocab, 7);
    AwqOptions ao;
    ao.group_size = 32;
    ao.ctx = 128;
    std::vector<AwqGroup> report;
    const ChannelScales cs = awq_scales(d.path(), calib, ao, &report);
    ASSERT_EQ(report.size(), size_t(4 * c.n_layers));  // qkv, gate_up, down and o in every layer
    for (const AwqGroup& g : report) {
        EXPECT_LE(g.loss, g.loss_rtn) << g.which << " layer " << g.layer;
        EXPECT_LE(g.clip_after, g.clip_before) << g.which << " layer " << g.layer;
    }
    EXPECT_FALSE(cs.in.empty());
    EXPECT_FALSE(cs.clip.empty());
    // Without the clipping search the scales alone already help; with it, more.
    ao.clip = false;
    const ChannelScales scales_only = awq_scales(d.path(), calib, ao);
    EXPECT_TRUE(scales_only.clip.empty());

    const std::vector<std::vector<int32_t>> prompts = {make_prompt(40, c.vocab, 11), make_prompt(64, c.vocab, 12),
                                                       make_prompt(25, c.vocab, 13)};
    const auto ref = last_logits(d.path(), {WeightFormat::F32, 0, ""}, prompts);
    LoadOptions f32{WeightFormat::F32, 0, ""};
    f32.scales = cs;
    const auto folded = last_logits(d.path(), f32, prompts);
    EXPECT_LT(mean_sq_diff(folded, ref), 1e-9);
    const auto rtn = last_logits(d.path(), {WeightFormat::Int4, 32, ""}, prompts);
    LoadOptions awq{WeightFormat::Int4, 32, ""};
    awq.scales = cs;
    const auto got = last_logits(d.path(), awq, prompts);
    LoadOptions awq_noclip{WeightFormat::Int4, 32, ""};
    awq_noclip.scales = scales_only;
    const double e_rtn = mean_sq_diff(rtn, ref), e_awq = mean_sq_diff(got, ref),
                 e_scales = mean_sq_diff(last_logits(d.path(), awq_noclip, prompts), ref);
    EXPECT_LT(e_scales, 0.5 * e_rtn) << "mean squared logit error: scales " << e_scales << ", round-to-nearest " << e_rtn;
    EXPECT_LT(e_awq, e_scales) << "mean squared logit error: scales and clipping " << e_awq << ", scales " << e_scales;
    // A clip vector of the wrong length is named.
    LoadOptions bad = awq;
    bad.scales.clip.begin()->second.pop_back();
    EXPECT_THROW(last_logits(d.path(), bad, prompts), Error);

    // Written by shardlm quantize (norms and v/up rows as loaded, F32), it loads back bit for bit.
    TempDir out;
    write_quantized_checkpoint(d.path(), out.path() + "/q", awq);
    EXPECT_EQ(last_logits(out.path() + "/q", {WeightFormat::Auto, 0, ""}, prompts), got);
    Checkpoint ck(out.path() + "/q");
    EXPECT_EQ(ck.get("model.layers.0.input_layernorm.weight").dtype_str, "F32");
}
