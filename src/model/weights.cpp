#include "model/weights.h"

#include <cstring>

#include "core/error.h"

namespace shardlm {

WeightFormat parse_weight_format(const std::string& s) {
    if (s == "auto") return WeightFormat::Auto;
    if (s == "fp32" || s == "f32") return WeightFormat::F32;
    if (s == "fp16" || s == "f16") return WeightFormat::F16;
    if (s == "bf16") return WeightFormat::BF16;
    fail("--weights: unknown format \"", s, "\" (supported: auto, fp32, fp16, bf16)");
}

const char* weight_format_name(WeightFormat f) {
    switch (f) {
        case WeightFormat::Auto: return "auto";
        case WeightFormat::F32: return "fp32";
        case WeightFormat::F16: return "fp16";
        case WeightFormat::BF16: return "bf16";
    }
    return "?";
}

namespace {

float element_f32(const TensorInfo& t, size_t i) {
    const uint8_t* p = t.data + i * dtype_size(t.dtype);
    switch (t.dtype) {
        case DType::F16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); }
        case DType::BF16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); }
        default: { float f; std::memcpy(&f, p, 4); return f; }
    }
}

class Loader {
public:
    Loader(const Checkpoint& ckpt, WeightFormat fmt, ModelWeights& out) : ckpt_(ckpt), fmt_(fmt), out_(out) {}

    const TensorInfo& tensor(const std::string& name, std::vector<int64_t> shape) {
        const TensorInfo& t = ckpt_.get(name);
        if (!t.dtype_known || !(t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16))
            fail(t.file, ": tensor ", name, " has dtype ", t.dtype_str, " (expected F32, F16 or BF16)");
        if (t.shape != shape) {
            TensorInfo want;
            want.shape = shape;
            fail(t.file, ": tensor ", name, " has shape ", t.shape_str(), ", expected ", want.shape_str());
        }
        return t;
    }

    std::vector<float> vector(const std::string& name, int64_t n) {
        const TensorInfo& t = tensor(name, {n});
        std::vector<float> v(static_cast<size_t>(n));
        for (size_t i = 0; i < v.size(); ++i) v[i] = element_f32(t, i);
        out_.bytes += v.size() * 4;
        return v;
    }

    WeightView matrix(const std::string& name, int64_t rows, int64_t cols) {
        const TensorInfo& t = tensor(name, {rows, cols});
        DType want = t.dtype;
        if (fmt_ == WeightFormat::F32) want = DType::F32;
        if (fmt_ == WeightFormat::F16) want = DType::F16;
        if (fmt_ == WeightFormat::BF16) want = DType::BF16;
        const size_t n = size_t(rows * cols);
        WeightView v{want, t.data, rows, cols};
        out_.bytes += n * dtype_size(want);
        const bool aligned = reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) == 0;
        if (want == t.dtype && aligned) return v;  // zero copy from the map
        Buffer b(n * dtype_size(want));
        if (want == t.dtype) {
            std::memcpy(b.data(), t.data, t.nbytes);  // only realigning
        } else {
            for (size_t i = 0; i < n; ++i) {
                const float f = element_f32(t, i);
                switch (want) {
                    case DType::F32: b.as<float>()[i] = f; break;
                    case DType::F16: b.as<uint16_t>()[i] = f32_to_f16(f); break;
                    default: b.as<uint16_t>()[i] = f32_to_bf16(f); break;
                }
            }
        }
        v.data = b.data();
        out_.owned.push_back(std::move(b));
        return v;
    }

    Linear linear(const std::string& prefix, int64_t out, int64_t in, bool bias) {
        Linear l;
        l.w = matrix(prefix + ".weight", out, in);
        if (bias) l.bias = vector(prefix + ".bias", out);
        return l;
    }

private:
    const Checkpoint& ckpt_;
    WeightFormat fmt_;
    ModelWeights& out_;
};

}  // namespace

ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& c, WeightFormat fmt) {
    ModelWeights w;
    Loader ld(ckpt, fmt, w);
    const int64_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
    w.embed = ld.matrix("model.embed_tokens.weight", c.vocab, c.hidden);
    for (int64_t i = 0; i < c.n_layers; ++i) {
        const std::string p = "model.layers." + std::to_string(i);
        LayerWeights L;
        L.input_norm = ld.vector(p + ".input_layernorm.weight", c.hidden);
        L.post_attn_norm = ld.vector(p + ".post_attention_layernorm.weight", c.hidden);
        L.q = ld.linear(p + ".self_attn.q_proj", q_dim, c.hidden, c.qkv_bias);
        L.k = ld.linear(p + ".self_attn.k_proj", kv_dim, c.hidden, c.qkv_bias);
        L.v = ld.linear(p + ".self_attn.v_proj", kv_dim, c.hidden, c.qkv_bias);
        L.o = ld.linear(p + ".self_attn.o_proj", c.hidden, q_dim, false);
        if (c.qk_norm) {
            L.q_norm = ld.vector(p + ".self_attn.q_norm.weight", c.head_dim);
            L.k_norm = ld.vector(p + ".self_attn.k_norm.weight", c.head_dim);
        }
        L.gate = ld.linear(p + ".mlp.gate_proj", c.intermediate, c.hidden, false);
        L.up = ld.linear(p + ".mlp.up_proj", c.intermediate, c.hidden, false);
        L.down = ld.linear(p + ".mlp.down_proj", c.hidden, c.intermediate, false);
        w.layers.push_back(std::move(L));
    }
    w.final_norm = ld.vector("model.norm.weight", c.hidden);
    // Some tied checkpoints still ship lm_head.weight; tying means the embedding is the truth.
    w.lm_head = c.tie_embeddings ? w.embed : ld.matrix("lm_head.weight", c.vocab, c.hidden);
    return w;
}

}  // namespace shardlm
