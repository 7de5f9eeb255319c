#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/mmap_file.h"
#include "kernels/cpu/quantize.h"
#include "fixtures.h"
#include "model/checkpoint.h"
#include "model/quantize_checkpoint.h"
#include "model/safetensors_writer.h"
#include "model/synthetic.h"
#include "model/shard.h"
#include "model/weights.h"

using namespace shardlm;
using shardlm::test::read_file;
using shardlm::test::ScopedEnv;
using shardlm::test::TempDir;
using shardlm::test::write_without_model_prefix;
using shardlm::test::write_file;

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
        load_weights(ck, c, LoadOptions{}, plan_shard(c, 0, 1));
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
        const ModelWeights w = load_weights(ck, c, LoadOptions{}, plan_shard(c, 0, 1));
        EXPECT_TRUE(w.owned.empty()) << arch_name(a);  // bf16 kept as mapped
        EXPECT_EQ(w.layers.size(), size_t(c.n_layers));
        EXPECT_EQ(w.layers[0].q.bias.empty(), !c.qkv_bias);
        EXPECT_EQ(w.layers[0].q_norm.empty(), !c.qk_norm);
        EXPECT_EQ(w.lm_head.data == w.embed.data, c.tie_embeddings);
        EXPECT_EQ(w.embed.dtype, DType::BF16);
        const ModelWeights f = load_weights(ck, c, LoadOptions{WeightFormat::F32, 0, ""}, plan_shard(c, 0, 1));
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

// A config.json with fewer layers than its checkpoint loaded the first layers and dropped the rest
// without a word; a tensor the config leaves unread is now an error naming it and its file.
TEST(Weights, TensorsTheConfigDoesNotDescribeAreRefused) {
    TempDir d;
    write_synthetic_checkpoint(d.path(), tiny_config(Arch::Llama), {DType::F16, 1, 3});
    const std::string cfg = read_file(d.file("config.json"));
    std::string one = cfg;
    one.replace(one.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": 1");
    write_file(d.file("config.json"), one);
    EXPECT_NE(load_error(d.path()).find(d.file("model.safetensors") + ": tensor model.layers.1.input_layernorm.weight "
                                        "is not part of the model " + d.file("config.json") +
                                        " describes (layer 1; num_hidden_layers is 1)"),
              std::string::npos)
        << load_error(d.path());
    write_file(d.file("config.json"), cfg);
    EXPECT_EQ(load_error(d.path()), "");
    // A bias the config (Llama, attention_bias false) has no use for.
    rewrite(d.path(), [](auto& ts) { ts.push_back({"model.layers.0.self_attn.q_proj.bias", "F16", {64}, std::vector<uint8_t>(128)}); });
    EXPECT_NE(load_error(d.path()).find("tensor model.layers.0.self_attn.q_proj.bias is not part of the model"), std::string::npos)
        << load_error(d.path());
}

// The unread tensor named was the first in plain string order: a 12-layer checkpoint under a
// 4-layer config blamed model.layers.10 ("1" < "4"). Names are now taken in natural order (digit
// runs as numbers), so the error names the lowest layer the config lacks.
TEST(Weights, TheUnreadTensorNamedIsTheLowestLayer) {
    TempDir d;
    ModelConfig c = tiny_config(Arch::Llama);
    c.n_layers = 12;
    write_synthetic_checkpoint(d.path(), c, {DType::F16, 1, 3});
    std::string cfg = read_file(d.file("config.json"));
    const std::string twelve = "\"num_hidden_layers\": 12";
    cfg.replace(cfg.find(twelve), twelve.size(), "\"num_hidden_layers\": 4");
    write_file(d.file("config.json"), cfg);
    const std::string err = load_error(d.path());
    EXPECT_NE(err.find(d.file("model.safetensors") + ": tensor model.layers.4.input_layernorm.weight is not part of the "
                       "model " + d.file("config.json") + " describes (layer 4; num_hidden_layers is 4)"),
              std::string::npos)
        << err;
    // Within a number's run, more digits is later whatever they are; leading zeros do not count.
    rewrite(d.path(), [](auto& ts) {
        for (auto& t : ts)
            if (t.name.rfind("model.layers.4.", 0) == 0 || t.name.rfind("model.layers.5.", 0) == 0 ||
                t.name.rfind("model.layers.6.", 0) == 0)
                t.name.insert(std::string("model.layers.").size(), "00");
    });
    EXPECT_NE(load_error(d.path()).find("tensor model.layers.004.input_layernorm.weight is not part of the model"),
              std::string::npos)
        << load_error(d.path());
}

// What real HF checkpoints carry beside the model and the loader skips on purpose: the rotary
// inv_freq buffers of older Llama conversions, and a tied model's copy of its embedding as lm_head.
TEST(Weights, RotaryBuffersAndATiedLmHeadStillLoad) {
    TempDir d;
    ASSERT_TRUE(tiny_config(Arch::Qwen2).tie_embeddings);
    write_synthetic_checkpoint(d.path(), tiny_config(Arch::Qwen2), {DType::BF16, 1, 3});
    rewrite(d.path(), [](auto& ts) {
        for (const char* l : {"0", "1"})
            ts.push_back({std::string("model.layers.") + l + ".self_attn.rotary_emb.inv_freq", "F32", {8}, std::vector<uint8_t>(32)});
        for (const auto& t : std::vector<TensorToWrite>(ts))
            if (t.name == "model.embed_tokens.weight") ts.push_back({"lm_head.weight", t.dtype, t.shape, t.bytes});
    });
    EXPECT_EQ(load_error(d.path()), "");
    EXPECT_NE(Checkpoint(d.path()).find("lm_head.weight"), nullptr);
}

// A quantization_config claiming int8 over float tensors loaded them as float (and reported int8
// weights). The stored dtype must be the claimed one, or float where the recorded keep_fp16 kept it.
TEST(Weights, StoredDtypeMustMatchTheQuantizationConfig) {
    TempDir src, q;
    write_synthetic_checkpoint(src.path(), tiny_config(Arch::Llama), {DType::F16, 1, 3});
    std::string cfg = read_file(src.file("config.json"));
    const std::string claim = R"({"quant_method": "shardlm", "format": "int8", "group_size": 0})";
    write_file(src.file("config.json"), cfg.substr(0, cfg.rfind('}')) + ", \"quantization_config\": " + claim + "}");
    EXPECT_NE(load_error(src.path()).find(src.file("model.safetensors") + ": tensor model.layers.0.self_attn.q_proj.weight "
                                          "is stored as F16 but the quantization_config of " + src.file("config.json") +
                                          " says int8"),
              std::string::npos)
        << load_error(src.path());
    write_file(src.file("config.json"), cfg);

    // A real pre-quantized checkpoint with layer 1 kept in 16 bits loads; its record edited away,
    // the kept tensors are refused; relabelled int4, its INT8 layers are.
    const std::string out = q.file("int8");
    write_quantized_checkpoint(src.path(), out, LoadOptions{WeightFormat::Int8, 0, "layers\\.1\\."});
    EXPECT_EQ(load_error(out), "");
    cfg = read_file(out + "/config.json");
    const std::string keep = R"("keep_fp16": "layers\\.1\\.")";
    ASSERT_NE(cfg.find(keep), std::string::npos) << cfg;
    write_file(out + "/config.json", std::string(cfg).replace(cfg.find(keep), keep.size(), R"("keep_fp16": "")"));
    EXPECT_NE(load_error(out).find("tensor model.layers.1.self_attn.q_proj.weight is stored as F16"), std::string::npos)
        << load_error(out);
    write_file(out + "/config.json", std::string(cfg).replace(cfg.find("\"int8\""), 6, "\"int4\"").replace(
                                         cfg.find("\"group_size\": 0"), 15, "\"group_size\": 32"));
    EXPECT_NE(load_error(out).find("tensor model.layers.0.self_attn.q_proj.weight is stored as I8 but the "
                                   "quantization_config of " + out + "/config.json says int4 (U8"),
              std::string::npos)
        << load_error(out);
}

// Weights converted on load (--weights int8 from a bf16 checkpoint here) go to host buffers that
// are written as they are allocated: under overcommit more than the machine can back was granted
// and the OOM killer ended the load without a word. Their total on this rank is now weighed first
// against the memory the machine can back (SHARDLM_HOST_MEM_AVAILABLE standing in for it) and
// refused in one line naming the model folder, --weights and both figures.
TEST(Weights, ConvertedWeightsBeyondWhatTheMachineCanBackAreRefused) {
    TempDir d;
    const ModelConfig c = tiny_config(Arch::Qwen2);
    write_synthetic_checkpoint(d.path(), c, {DType::BF16, 1, 3});
    Checkpoint ck(d.path());
    const LoadOptions int8{WeightFormat::Int8, 0, ""};
    // What the load allocates: its owned buffers, all of them conversions on one rank.
    size_t owned = 0;
    {
        ScopedEnv unlimited(kHostMemEnv, nullptr);
        const ModelWeights w = load_weights(ck, c, int8, plan_shard(c, 0, 1));
        for (const Buffer& b : w.owned) owned += b.size();
    }
    ASSERT_GT(owned, size_t(0));
    EXPECT_EQ(converted_weight_bytes(ck, c, int8, plan_shard(c, 0, 1)), owned);
    auto error_of = [&](const LoadOptions& lo, size_t avail) -> std::string {
        ScopedEnv env(kHostMemEnv, std::to_string(avail).c_str());
        try {
            load_weights(ck, c, lo, plan_shard(c, 0, 1));
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    const std::string hint = "; use a pre-quantized checkpoint (shardlm quantize writes one, where the memory is) or a "
                             "machine with more memory";
    EXPECT_EQ(error_of(int8, owned - 1),
              "model " + d.path() + ": --weights int8 needs 0.000 GiB (" + std::to_string(owned) +
                  " bytes) of host memory for the weights converted on load but the machine can back only 0.000 GiB (" +
                  std::to_string(owned - 1) + " bytes, SHARDLM_HOST_MEM_AVAILABLE)" + hint);
    EXPECT_EQ(error_of(int8, owned), "");
    // Each rank of the node converts at the same time: a rank weighs its bytes against its part.
    LoadOptions two = int8;
    two.ranks_on_node = 2;
    EXPECT_EQ(error_of(two, 2 * owned - 1),
              "model " + d.path() + ": --weights int8 needs 0.000 GiB (" + std::to_string(owned) +
                  " bytes) of host memory for the weights converted on load but the machine can back only 0.000 GiB (" +
                  std::to_string(owned - 1) + " bytes) per rank: 0.000 GiB (" + std::to_string(2 * owned - 1) +
                  " bytes, SHARDLM_HOST_MEM_AVAILABLE) shared by 2 ranks on this node" + hint);
    EXPECT_EQ(error_of(two, 2 * owned), "");
    // A dtype conversion is weighed too; the checkpoint used as stored is mapped and costs nothing.
    const LoadOptions f32{WeightFormat::F32, 0, ""};
    const size_t widened = converted_weight_bytes(ck, c, f32, plan_shard(c, 0, 1));
    EXPECT_GT(widened, owned);
    EXPECT_NE(error_of(f32, widened - 1).find("--weights fp32 needs 0.000 GiB (" + std::to_string(widened) +
                                              " bytes) of host memory"),
              std::string::npos);
    EXPECT_NE(error_of(f32, widened - 1).find("; use --weights auto (the checkpoint's own dtype"), std::string::npos);
    EXPECT_EQ(converted_weight_bytes(ck, c, LoadOptions{}, plan_shard(c, 0, 1)), size_t(0));
    EXPECT_EQ(error_of(LoadOptions{}, 0), "");
    // INT4 (and its INT8 vocabulary matrix): the bytes it holds.
    const LoadOptions int4{WeightFormat::Int4, 32, ""};
    size_t owned4 = 0;
    {
        ScopedEnv unlimited(kHostMemEnv, nullptr);
        for (const Buffer& b : load_weights(ck, c, int4, plan_shard(c, 0, 1)).owned) owned4 += b.size();
    }
    EXPECT_EQ(converted_weight_bytes(ck, c, int4, plan_shard(c, 0, 1)), owned4);
    EXPECT_NE(error_of(int4, owned4 - 1).find("--weights int4 needs"), std::string::npos);
    EXPECT_EQ(error_of(int4, owned4), "");
}

// Under TP a rank's row-parallel columns in the stored dtype are copies, not conversions: not
// weighed (a float checkpoint under --weights auto is refused only for its KV cache). A
// pre-quantized checkpoint used as stored converts nothing either.
TEST(Weights, OnlyConversionsAreWeighed) {
    TempDir d, q;
    const ModelConfig c = tiny_config(Arch::Llama);
    write_synthetic_checkpoint(d.path(), c, {DType::F32, 1, 3});
    Checkpoint ck(d.path());
    EXPECT_FALSE(load_weights(ck, c, LoadOptions{}, plan_shard(c, 0, 2)).owned.empty());
    EXPECT_EQ(converted_weight_bytes(ck, c, LoadOptions{}, plan_shard(c, 0, 2)), size_t(0));
    const std::string out = q.file("int8");
    write_quantized_checkpoint(d.path(), out, LoadOptions{WeightFormat::Int8, 0, ""});
    const ModelConfig qc = load_config(out);
    Checkpoint qk(out);
    EXPECT_EQ(converted_weight_bytes(qk, qc, LoadOptions{}, plan_shard(qc, 0, 1)), size_t(0));
    ScopedEnv none(kHostMemEnv, "0");
    EXPECT_NO_THROW(load_weights(qk, qc, LoadOptions{}, plan_shard(qc, 0, 1)));
}

// --no-mmap (copy_mapped): the tensors kept as stored become owned copies with the same bytes, for
// a float checkpoint and a pre-quantized one, whole or as a TP rank's slice; the copies are weighed
// against host memory, and a refusal names --no-mmap.
TEST(Weights, CopyMappedHoldsTheSameBytesInOwnedBuffers) {
    TempDir d, q;
    const ModelConfig c = tiny_config(Arch::Qwen3);
    write_synthetic_checkpoint(d.path(), c, {DType::BF16, 2, 3});
    const std::string out = q.file("int8");
    write_quantized_checkpoint(d.path(), out, LoadOptions{WeightFormat::Int8, 0, ""});
    const std::string int4_out = q.file("int4");
    write_quantized_checkpoint(d.path(), int4_out, LoadOptions{WeightFormat::Int4, 32, ""});
    for (const std::string& dir : {d.path(), out, int4_out}) {
        const ModelConfig cc = load_config(dir);
        Checkpoint ck(dir);
        for (int tp : {1, 2}) {
            if (tp == 2 && dir == int4_out) continue;  // the tiny model's 160 MLP columns / 2: not whole groups of 32
            const ShardPlan p = plan_shard(cc, tp - 1, tp);
            LoadOptions copy;
            copy.copy_mapped = true;
            const ModelWeights m = load_weights(ck, cc, LoadOptions{}, p), o = load_weights(ck, cc, copy, p);
            auto owned_by = [](const ModelWeights& w, const void* data) {
                for (const Buffer& b : w.owned)
                    if (data >= static_cast<const void*>(b.data()) && data < static_cast<const void*>(b.data() + b.size()))
                        return true;
                return false;
            };
            size_t owned = 0;
            for (const Buffer& b : o.owned) owned += b.size();
            EXPECT_GT(converted_weight_bytes(ck, cc, copy, p), converted_weight_bytes(ck, cc, LoadOptions{}, p)) << dir;
            EXPECT_LE(converted_weight_bytes(ck, cc, copy, p), owned) << dir;
            for (size_t l = 0; l < m.layers.size(); ++l) {
                const LayerWeights &a = m.layers[l], &b = o.layers[l];
                for (auto [x, y] : {std::pair{&a.q.w, &b.q.w}, {&a.o.w, &b.o.w}, {&a.down.w, &b.down.w}}) {
                    ASSERT_EQ(x->dtype, y->dtype);
                    EXPECT_TRUE(owned_by(o, y->data)) << dir << " tp=" << tp << " layer " << l;
                    const size_t bytes = weight_row_bytes(*x) * size_t(x->rows);
                    EXPECT_EQ(std::memcmp(x->data, y->data, bytes), 0) << dir << " tp=" << tp << " layer " << l;
                }
            }
            EXPECT_TRUE(owned_by(o, o.lm_head.data)) << dir;
        }
        LoadOptions copy;
        copy.copy_mapped = true;
        ScopedEnv none(kHostMemEnv, "0");
        try {
            load_weights(ck, cc, copy, plan_shard(cc, 0, 1));
            ADD_FAILURE() << dir << ": --no-mmap with no memory to copy into loaded";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("drop --no-mmap"), std::string::npos) << e.what();
        }
    }
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

// Checkpoints saved from the base model class (Qwen/Qwen3-Embedding-0.6B as Qwen3Model) lack the
// "model." prefix; one file or sharded, they hold the same tensors under the prefixed names and
// run exactly as the causal-LM checkpoint they were copied from.
TEST(Weights, CheckpointsWithoutTheModelPrefixLoadTheSame) {
    TempDir one, sharded, one_bare, sharded_bare;
    const ModelConfig c = tiny_config(Arch::Qwen3);
    ASSERT_TRUE(c.tie_embeddings);
    write_synthetic_checkpoint(one.path(), c, {DType::BF16, 1, 7});
    write_synthetic_checkpoint(sharded.path(), c, {DType::BF16, 3, 7});
    write_without_model_prefix(one.path(), one_bare.path());
    write_without_model_prefix(sharded.path(), sharded_bare.path());
    // A tied lm_head.weight in the source: the copy drops it, as the base class has none.
    rewrite(one.path(), [](auto& ts) {
        for (const auto& t : std::vector<TensorToWrite>(ts))
            if (t.name == "model.embed_tokens.weight") ts.push_back({"lm_head.weight", t.dtype, t.shape, t.bytes});
    });

    const Checkpoint ref(one.path());
    EXPECT_FALSE(ref.prefixed());
    for (const std::string& dir : {one_bare.path(), sharded_bare.path()}) {
        const Checkpoint ck(dir);
        EXPECT_TRUE(ck.prefixed()) << dir;
        EXPECT_EQ(ck.find("embed_tokens.weight"), nullptr) << dir;
        EXPECT_EQ(ck.tensors().size() + 1, ref.tensors().size()) << dir;  // all but lm_head.weight
        for (const auto& [name, t] : ck.tensors()) {
            const TensorInfo* r = ref.find(name);
            ASSERT_NE(r, nullptr) << dir << ": " << name;
            ASSERT_EQ(t->nbytes, r->nbytes) << name;
            EXPECT_EQ(std::memcmp(t->data, r->data, t->nbytes), 0) << dir << ": " << name;
        }
    }
    EXPECT_EQ(Checkpoint(sharded_bare.path()).file_count(), 3u);

    const std::vector<std::vector<int32_t>> prompts = {test::make_prompt(9, c.vocab, 1)};
    const GenerateResult want = test::run_greedy(one.path(), prompts, 4);
    for (const std::string& dir : {one_bare.path(), sharded_bare.path()}) {
        const GenerateResult got = test::run_greedy(dir, prompts, 4);
        EXPECT_EQ(got.seqs[0].tokens, want.seqs[0].tokens) << dir;
        EXPECT_EQ(got.seqs[0].prompt_logits, want.seqs[0].prompt_logits) << dir;
    }
    // quantize writes it as a causal-LM checkpoint: the prefixed names, the tensors the original's
    // quantization writes, byte for byte.
    TempDir q;
    write_quantized_checkpoint(one.path(), q.file("from_prefixed"), LoadOptions{WeightFormat::Int8, 0, ""});
    write_quantized_checkpoint(sharded_bare.path(), q.file("from_bare"), LoadOptions{WeightFormat::Int8, 0, ""});
    const Checkpoint qa(q.file("from_prefixed")), qb(q.file("from_bare"));
    EXPECT_FALSE(qb.prefixed());
    ASSERT_EQ(qa.tensors().size(), qb.tensors().size());
    for (const auto& [name, t] : qa.tensors()) {
        const TensorInfo* r = qb.find(name);
        ASSERT_NE(r, nullptr) << name;
        ASSERT_EQ(t->nbytes, r->nbytes) << name;
        EXPECT_EQ(std::memcmp(t->data, r->data, t->nbytes), 0) << name;
    }
}

// A missing tensor is named as the files would name it: without the prefix where they lack it,
// with it where they have it, and with it where the names follow neither layout.
TEST(Weights, MissingTensorsAreNamedInTheFilesLayout) {
    TempDir src, bare, neither;
    write_synthetic_checkpoint(src.path(), tiny_config(Arch::Qwen3), {DType::F32, 1, 3});
    write_without_model_prefix(src.path(), bare.path());
    write_without_model_prefix(src.path(), neither.path());
    rewrite(bare.path(), [](auto& ts) {
        ts.erase(std::remove_if(ts.begin(), ts.end(), [](const TensorToWrite& t) { return t.name == "norm.weight"; }), ts.end());
    });
    EXPECT_NE(load_error(bare.path()).find(": missing tensor norm.weight (model.norm.weight; this checkpoint's tensor "
                                           "names lack the \"model.\" prefix)"),
              std::string::npos)
        << load_error(bare.path());
    rewrite(neither.path(), [](auto& ts) {
        for (auto& t : ts)
            if (t.name == "embed_tokens.weight") t.name = "wte.weight";
    });
    EXPECT_FALSE(Checkpoint(neither.path()).prefixed());
    EXPECT_NE(load_error(neither.path()).find(": missing tensor model."), std::string::npos) << load_error(neither.path());
    EXPECT_EQ(test::thrown_error([&] { Checkpoint(neither.path()).get("model.norm.weight"); }),
              neither.path() + ": missing tensor model.norm.weight");
    // A tensor the config does not describe is named as the file names it too.
    TempDir extra;
    write_without_model_prefix(src.path(), extra.path());
    rewrite(extra.path(), [](auto& ts) { ts.push_back({"layers.7.mlp.extra.weight", "F32", {2}, std::vector<uint8_t>(8, 0)}); });
    EXPECT_NE(load_error(extra.path()).find(": tensor layers.7.mlp.extra.weight is not part of the model"), std::string::npos)
        << load_error(extra.path());
}

// Quantize-on-load (the loader's own vectorised row path) against the reference quantizers run on
// the whole f32 matrices, bit for bit, at TP = 1 and on each rank of TP = 2: rows of a
// column-parallel matrix (q_proj), columns of a row-parallel one (down_proj, whose per-channel INT8
// scale spans the whole row on every rank).
TEST(Weights, QuantizedOnLoadEqualsTheReferenceQuantizers) {
    TempDir d;
    ModelConfig c = tiny_config(Arch::Qwen2);
    c.intermediate = 256;  // a TP = 2 slice of down_proj is 128 columns: whole INT4 groups
    write_synthetic_checkpoint(d.path(), c, {DType::BF16, 1, 9});
    Checkpoint ck(d.path());
    const ModelWeights f = load_weights(ck, c, LoadOptions{WeightFormat::F32}, plan_shard(c, 0, 1));
    struct Case {
        WeightFormat fmt;
        int64_t group;
        int max_tp;  // INT4 groups of 64 do not divide o_proj's 32-column TP = 2 slice
    };
    for (const Case k : {Case{WeightFormat::Int8, 0, 2}, Case{WeightFormat::Int8, 32, 2}, Case{WeightFormat::Int4, 32, 2},
                         Case{WeightFormat::Int4, 64, 1}}) {
        const bool four = is_int4(k.fmt);
        // The reference of one full matrix: codes (one byte per value for INT8, packed for INT4),
        // scales and mins per group.
        struct Ref {
            std::vector<uint8_t> q;
            std::vector<float> s, m;
            int64_t g = 0;
        };
        auto reference = [&](const WeightView& w) {
            Ref r;
            r.g = k.group > 0 ? k.group : w.cols;
            r.q.resize(size_t(w.rows * w.cols / (four ? 2 : 1)));
            r.s.resize(size_t(w.rows * (w.cols / r.g)));
            r.m.resize(r.s.size());
            if (four) {
                quantize_weights_int4_ref(w, r.g, r.q.data(), r.s.data(), r.m.data());
            } else {
                quantize_weights_int8_ref(w, r.g, reinterpret_cast<int8_t*>(r.q.data()), r.s.data());
            }
            return r;
        };
        const Ref rq = reference(f.layers[1].q.w), rd = reference(f.layers[1].down.w);
        for (int tp = 1; tp <= k.max_tp; ++tp)
            for (int rank = 0; rank < tp; ++rank) {
                SCOPED_TRACE(std::string(weight_format_name(k.fmt)) + " group " + std::to_string(k.group) + " rank " +
                             std::to_string(rank) + " of " + std::to_string(tp));
                const ModelWeights w = load_weights(ck, c, LoadOptions{k.fmt, k.group}, plan_shard(c, rank, tp));
                const WeightView& q = w.layers[1].q.w;
                const WeightView& dn = w.layers[1].down.w;
                const int64_t bq = four ? q.cols / 2 : q.cols;  // bytes per row
                const uint8_t* qd = static_cast<const uint8_t*>(q.data);
                const int64_t qg = q.cols / q.group_size;
                for (int64_t r = 0; r < q.rows; ++r) {  // rows rank * q.rows ..
                    const int64_t fr = rank * q.rows + r;
                    ASSERT_EQ(0, std::memcmp(qd + r * bq, rq.q.data() + fr * bq, size_t(bq))) << "q row " << r;
                    for (int64_t e = 0; e < qg; ++e) {
                        ASSERT_EQ(q.scales[r * qg + e], rq.s[size_t(fr * qg + e)]);
                        if (four) {
                            ASSERT_EQ(q.mins[r * qg + e], rq.m[size_t(fr * qg + e)]);
                        }
                    }
                }
                const int64_t full_cols = c.intermediate, col0 = rank * dn.cols;
                const int64_t bd = four ? dn.cols / 2 : dn.cols, bfull = four ? full_cols / 2 : full_cols;
                const int64_t b0 = four ? col0 / 2 : col0;
                const uint8_t* dd = static_cast<const uint8_t*>(dn.data);
                const int64_t dg = dn.cols / dn.group_size, fg = full_cols / rd.g;
                for (int64_t r = 0; r < dn.rows; ++r) {
                    ASSERT_EQ(0, std::memcmp(dd + r * bd, rd.q.data() + r * bfull + b0, size_t(bd))) << "down row " << r;
                    for (int64_t e = 0; e < dg; ++e) {
                        // per channel: the one scale of the whole row; grouped: this slice's groups
                        const int64_t fe = rd.g == full_cols ? 0 : col0 / rd.g + e;
                        ASSERT_EQ(dn.scales[r * dg + e], rd.s[size_t(r * fg + fe)]);
                        if (four) {
                            ASSERT_EQ(dn.mins[r * dg + e], rd.m[size_t(r * fg + fe)]);
                        }
                    }
                }
            }
    }
}

TEST(Shard, PlansSplitAndReplicatedKvHeads) {
    ModelConfig c = tiny_config(Arch::Llama);  // 4 heads, 2 KV heads, intermediate 160
    ShardPlan p = plan_shard(c, 1, 2);
    EXPECT_EQ(p.q_head0, 2);
    EXPECT_EQ(p.n_q_heads, 2);
    EXPECT_EQ(p.kv_head0, 1);  // split: 2 % 2 == 0
    EXPECT_EQ(p.n_kv_heads, 1);
    EXPECT_EQ(p.inter0, 80);
    p = plan_shard(c, 3, 4);  // replicated: 4 % 2 == 0, ranks 2 and 3 share KV head 1
    EXPECT_EQ(p.q_head0, 3);
    EXPECT_EQ(p.kv_head0, 1);
    EXPECT_EQ(p.n_kv_heads, 1);
    EXPECT_EQ(p.vocab_per_rank, 96);
    EXPECT_EQ(p.vocab0 + p.n_vocab, c.vocab);
    c.vocab = 385;  // uneven vocabulary: the last rank holds fewer rows
    p = plan_shard(c, 3, 4);
    EXPECT_EQ(p.vocab_per_rank, 97);
    EXPECT_EQ(p.n_vocab, 385 - 3 * 97);
    EXPECT_THROW(plan_shard(c, 0, 3), Error);  // 3 divides neither 4 heads nor 2 KV heads
    c.n_heads = 6;
    c.n_kv_heads = 6;
    c.intermediate = 160;
    try {
        plan_shard(c, 0, 3);  // heads fine, intermediate 160 % 3 != 0
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("intermediate_size"), std::string::npos) << e.what();
    }
}

TEST(Shard, SlicesReassembleTheFullMatrices) {
    TempDir d;
    const ModelConfig c = tiny_config(Arch::Qwen2);
    write_synthetic_checkpoint(d.path(), c, {DType::F32, 1, 8});
    Checkpoint ck(d.path());
    const ModelWeights full = load_weights(ck, c, LoadOptions{}, plan_shard(c, 0, 1));
    size_t bytes = 0;
    for (int r = 0; r < 2; ++r) {
        const ModelWeights w = load_weights(ck, c, LoadOptions{}, plan_shard(c, r, 2));
        bytes += w.bytes;
        const auto& L = w.layers[1];
        const auto& F = full.layers[1];
        const float* fq = static_cast<const float*>(F.q.w.data);
        const float* q = static_cast<const float*>(L.q.w.data);
        // q rows: this rank's heads
        for (int64_t i = 0; i < L.q.w.rows * c.hidden; ++i)
            ASSERT_EQ(q[i], fq[r * L.q.w.rows * c.hidden + i]);
        EXPECT_EQ(L.q.bias[0], F.q.bias[size_t(r * L.q.w.rows)]);
        // down columns: this rank's intermediate slice, every output row
        const float* fd = static_cast<const float*>(F.down.w.data);
        const float* dn = static_cast<const float*>(L.down.w.data);
        for (int64_t row = 0; row < c.hidden; ++row)
            for (int64_t j = 0; j < L.down.w.cols; ++j)
                ASSERT_EQ(dn[row * L.down.w.cols + j], fd[row * c.intermediate + r * L.down.w.cols + j]);
    }
    // Each rank holds its slice; only the replicated norms are counted twice.
    const size_t norms = size_t(c.n_layers * 2 * c.hidden + c.hidden) * 4;
    EXPECT_EQ(bytes, full.bytes + norms);
    EXPECT_EQ(shard_parameter_count(c, plan_shard(c, 0, 1)), parameter_count(c));
    EXPECT_EQ(size_t(shard_parameter_count(c, plan_shard(c, 0, 2)) + shard_parameter_count(c, plan_shard(c, 1, 2))) * 4,
              bytes);
}
