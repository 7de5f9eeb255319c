#include <gtest/gtest.h>

#include "core/error.h"
#include "fixtures.h"
#include "model/checkpoint.h"
#include "model/safetensors_writer.h"
#include "model/synthetic.h"
#include "model/weights.h"

using namespace shardlm;
using shardlm::test::TempDir;

namespace {

// Rewrites a one-file checkpoint with `edit` applied to its tensor list.
template <typename F>
void rewrite(const std::string& dir, F edit) {
    std::vector<TensorToWrite> ts;
    {
        SafetensorsFile f(dir + "/model.safetensors");
        for (const auto& kv : f.tensors())
            ts.push_back({kv.first, kv.second.dtype_str, kv.second.shape,
                          std::vector<uint8_t>(kv.second.data, kv.second.data + kv.second.nbytes)});
    }
    edit(ts);
    write_safetensors(dir + "/model.safetensors", ts);
}

std::string load_error(const std::string& dir) {
    try {
        const ModelConfig c = load_config(dir);
        Checkpoint ck(dir);
        load_weights(ck, c, WeightFormat::Auto);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(Weights, LoadsEveryArchitectureZeroCopy) {
    for (Arch a : {Arch::Llama, Arch::Mistral, Arch::Qwen2, Arch::Qwen3}) {
        TempDir d;
        const ModelConfig c = tiny_config(a);
        write_synthetic_checkpoint(d.path(), c, {DType::BF16, 1, 3});
        Checkpoint ck(d.path());
        const ModelWeights w = load_weights(ck, load_config(d.path()), WeightFormat::Auto);
        EXPECT_TRUE(w.owned.empty()) << arch_name(a);  // bf16 kept as mapped
        EXPECT_EQ(w.layers.size(), size_t(c.n_layers));
        EXPECT_EQ(w.layers[0].q.bias.empty(), !c.qkv_bias);
        EXPECT_EQ(w.layers[0].q_norm.empty(), !c.qk_norm);
        EXPECT_EQ(w.lm_head.data == w.embed.data, c.tie_embeddings);
        EXPECT_EQ(w.embed.dtype, DType::BF16);
        const ModelWeights f = load_weights(ck, load_config(d.path()), WeightFormat::F32);
        EXPECT_EQ(f.embed.dtype, DType::F32);
        EXPECT_FALSE(f.owned.empty());
    }
}

TEST(Weights, BadTensorsAreNamed) {
    TempDir d;
    write_synthetic_checkpoint(d.path(), tiny_config(Arch::Llama), {DType::F16, 1, 3});
    EXPECT_EQ(load_error(d.path()), "");
    rewrite(d.path(), [](auto& ts) {
        for (size_t i = 0; i < ts.size(); ++i)
            if (ts[i].name == "model.layers.1.mlp.up_proj.weight") ts.erase(ts.begin() + long(i));
    });
    EXPECT_NE(load_error(d.path()).find("missing tensor model.layers.1.mlp.up_proj.weight"), std::string::npos)
        << load_error(d.path());

    write_synthetic_checkpoint(d.path(), tiny_config(Arch::Llama), {DType::F16, 1, 3});
    rewrite(d.path(), [](auto& ts) {
        for (auto& t : ts)
            if (t.name == "model.norm.weight") { t.shape = {t.shape[0] / 2}; t.bytes.resize(t.bytes.size() / 2); }
    });
    EXPECT_NE(load_error(d.path()).find("model.norm.weight has shape [32], expected [64]"), std::string::npos)
        << load_error(d.path());

    write_synthetic_checkpoint(d.path(), tiny_config(Arch::Llama), {DType::F16, 1, 3});
    rewrite(d.path(), [](auto& ts) {
        for (auto& t : ts)
            if (t.name == "model.layers.0.self_attn.k_proj.weight") t.dtype = "I16";
    });
    EXPECT_NE(load_error(d.path()).find("k_proj.weight has dtype I16"), std::string::npos) << load_error(d.path());
}

TEST(Weights, ShardedCheckpointHoldsTheSameTensors) {
    TempDir a, b;
    const ModelConfig c = tiny_config(Arch::Qwen2);
    write_synthetic_checkpoint(a.path(), c, {DType::F32, 1, 5});
    write_synthetic_checkpoint(b.path(), c, {DType::F32, 3, 5});
    Checkpoint ca(a.path()), cb(b.path());
    EXPECT_EQ(cb.file_count(), 3u);
    EXPECT_EQ(ca.total_bytes(), cb.total_bytes());
    const TensorInfo& x = ca.get("model.layers.1.mlp.down_proj.weight");
    const TensorInfo& y = cb.get("model.layers.1.mlp.down_proj.weight");
    ASSERT_EQ(x.nbytes, y.nbytes);
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0);
}
