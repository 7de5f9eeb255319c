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

    // Elements [begin, begin + n) of a vector of `full` elements, as f32.
    std::vector<float> vector(const std::string& name, int64_t full, int64_t begin = 0, int64_t n = -1) {
        const TensorInfo& t = tensor(name, {full});
        if (n < 0) n = full;
        std::vector<float> v(static_cast<size_t>(n));
        for (size_t i = 0; i < v.size(); ++i) v[i] = element_f32(t, size_t(begin) + i);
        out_.bytes += v.size() * 4;
        return v;
    }

    // The block [row0, row0 + nrows) x [col0, col0 + ncols) of a [rows, cols] matrix. A block of
    // whole rows in the target dtype is a view into the map (zero copy); anything else (a column
    // slice for row-parallel layers, a dtype conversion) is copied, reading only the block's bytes.
    WeightView matrix(const std::string& name, int64_t rows, int64_t cols, int64_t row0 = 0, int64_t nrows = -1,
                      int64_t col0 = 0, int64_t ncols = -1) {
        const TensorInfo& t = tensor(name, {rows, cols});
        if (nrows < 0) nrows = rows;
        if (ncols < 0) ncols = cols;
        DType want = t.dtype;
        if (fmt_ == WeightFormat::F32) want = DType::F32;
        if (fmt_ == WeightFormat::F16) want = DType::F16;
        if (fmt_ == WeightFormat::BF16) want = DType::BF16;
        const size_t es = dtype_size(t.dtype), n = size_t(nrows * ncols);
        const uint8_t* first = t.data + size_t(row0 * cols + col0) * es;
        WeightView v{want, first, nrows, ncols};
        out_.bytes += n * dtype_size(want);
        const bool aligned = reinterpret_cast<uintptr_t>(first) % es == 0;
        if (want == t.dtype && aligned && ncols == cols) return v;
        Buffer b(n * dtype_size(want));
        for (int64_t r = 0; r < nrows; ++r) {
            const uint8_t* src = first + size_t(r * cols) * es;
            uint8_t* dst = b.data() + size_t(r * ncols) * dtype_size(want);
            if (want == t.dtype) {
                std::memcpy(dst, src, size_t(ncols) * es);
                continue;
            }
            for (int64_t i = 0; i < ncols; ++i) {
                const float f = element_f32(t, size_t((row0 + r) * cols + col0 + i));
                switch (want) {
                    case DType::F32: reinterpret_cast<float*>(dst)[i] = f; break;
                    case DType::F16: reinterpret_cast<uint16_t*>(dst)[i] = f32_to_f16(f); break;
                    default: reinterpret_cast<uint16_t*>(dst)[i] = f32_to_bf16(f); break;
                }
            }
        }
        v.data = b.data();
        out_.owned.push_back(std::move(b));
        return v;
    }

    // Column-parallel: output rows [row0, row0 + nrows) and their bias entries.
    Linear column_parallel(const std::string& prefix, int64_t out, int64_t in, bool bias, int64_t row0, int64_t nrows) {
        Linear l;
        l.w = matrix(prefix + ".weight", out, in, row0, nrows);
        if (bias) l.bias = vector(prefix + ".bias", out, row0, nrows);
        return l;
    }

    // Row-parallel: input columns [col0, col0 + ncols); the partial sums are all-reduced.
    Linear row_parallel(const std::string& prefix, int64_t out, int64_t in, int64_t col0, int64_t ncols) {
        Linear l;
        l.w = matrix(prefix + ".weight", out, in, 0, out, col0, ncols);
        return l;
    }

private:
    const Checkpoint& ckpt_;
    WeightFormat fmt_;
    ModelWeights& out_;
};

}  // namespace

ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& c, WeightFormat fmt, const ShardPlan& p) {
    ModelWeights w;
    w.plan = p;
    Loader ld(ckpt, fmt, w);
    const int64_t hd = c.head_dim, q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
    const int64_t q0 = p.q_head0 * hd, nq = p.n_q_heads * hd, kv0 = p.kv_head0 * hd, nkv = p.n_kv_heads * hd;
    w.embed = ld.matrix("model.embed_tokens.weight", c.vocab, c.hidden, p.vocab0, p.n_vocab);
    for (int64_t i = 0; i < c.n_layers; ++i) {
        const std::string pre = "model.layers." + std::to_string(i);
        LayerWeights L;
        L.input_norm = ld.vector(pre + ".input_layernorm.weight", c.hidden);
        L.post_attn_norm = ld.vector(pre + ".post_attention_layernorm.weight", c.hidden);
        L.q = ld.column_parallel(pre + ".self_attn.q_proj", q_dim, c.hidden, c.qkv_bias, q0, nq);
        L.k = ld.column_parallel(pre + ".self_attn.k_proj", kv_dim, c.hidden, c.qkv_bias, kv0, nkv);
        L.v = ld.column_parallel(pre + ".self_attn.v_proj", kv_dim, c.hidden, c.qkv_bias, kv0, nkv);
        L.o = ld.row_parallel(pre + ".self_attn.o_proj", c.hidden, q_dim, q0, nq);
        if (c.qk_norm) {
            L.q_norm = ld.vector(pre + ".self_attn.q_norm.weight", hd);
            L.k_norm = ld.vector(pre + ".self_attn.k_norm.weight", hd);
        }
        L.gate = ld.column_parallel(pre + ".mlp.gate_proj", c.intermediate, c.hidden, false, p.inter0, p.n_inter);
        L.up = ld.column_parallel(pre + ".mlp.up_proj", c.intermediate, c.hidden, false, p.inter0, p.n_inter);
        L.down = ld.row_parallel(pre + ".mlp.down_proj", c.hidden, c.intermediate, p.inter0, p.n_inter);
        w.layers.push_back(std::move(L));
    }
    w.final_norm = ld.vector("model.norm.weight", c.hidden);
    // Some tied checkpoints still ship lm_head.weight; tying means the embedding is the truth.
    w.lm_head = c.tie_embeddings ? w.embed : ld.matrix("lm_head.weight", c.vocab, c.hidden, p.vocab0, p.n_vocab);
    return w;
}

}  // namespace shardlm
