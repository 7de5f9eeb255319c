#include "model/lora_weights.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/lora.h"

namespace shardlm {

size_t LoraWeights::bytes() const {
    size_t n = 0;
    for (const LoraLayer& L : layers)
        for (const LoraMatrix* m : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down})
            n += m->a.size() + m->bt.size();
    return n;
}

DType lora_factor_dtype(const ModelWeights& w) {
    const bool f32 = w.format == WeightFormat::F32 ||
                     (w.format == WeightFormat::Auto && !w.layers.empty() && w.layers[0].q.w.dtype == DType::F32);
    return f32 ? DType::F32 : DType::BF16;
}

LoraWeights load_lora_weights(const std::string& name, const LoraAdapter& ad, const Checkpoint& base,
                              const ModelConfig& cfg, const ShardPlan& p, DType factors, int64_t max_rank) {
    SHARDLM_CHECK(factors == DType::F32 || factors == DType::BF16, "load_lora_weights: factors of ", dtype_name(factors));
    const LoraSet set({ad}, base, cfg);
    for (const std::string& t : set.targets())
        if (t.rfind("model.layers.", 0) != 0)
            fail(ad.dir, ": ", t.substr(0, t.size() - 7), ": an adapter on the embedding or lm_head is not switched per request; "
                 "merge it into the weights with --lora");
    LoraWeights w;
    w.name = name;
    w.dir = ad.dir;
    w.layers.resize(size_t(cfg.n_layers));
    const int64_t hd = cfg.head_dim;
    // A slice of the full delta: rows [r0, r0 + rows) of B and columns [c0, c0 + cols) of A.
    auto take = [&](const std::string& tensor, int64_t full_rows, int64_t full_cols, int64_t r0, int64_t rows,
                    int64_t c0, int64_t cols, LoraMatrix& m) {
        if (!set.find(tensor)) return;
        const LoraDelta d = set.delta(tensor, full_rows, full_cols);  // left: scaled B, right: A
        m.rank = d.rank;
        m.in = cols;
        m.out = rows;
        m.dtype = factors;
        std::vector<float> a(size_t(d.rank * cols)), bt(size_t(d.rank * rows));
        for (int64_t k = 0; k < d.rank; ++k) std::copy_n(d.right.begin() + k * full_cols + c0, cols, a.begin() + k * cols);
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t k = 0; k < d.rank; ++k) bt[size_t(lora_bt_index(k, r, d.rank, rows))] = d.left[size_t((r0 + r) * d.rank + k)];
        auto store = [&](const std::vector<float>& v, std::vector<uint8_t>& out) {
            out.resize(v.size() * dtype_size(factors));
            if (factors == DType::F32) std::memcpy(out.data(), v.data(), out.size());
            else
                for (size_t i = 0; i < v.size(); ++i) reinterpret_cast<uint16_t*>(out.data())[i] = f32_to_bf16(v[i]);
        };
        store(a, m.a);
        store(bt, m.bt);
        w.max_rank = std::max(w.max_rank, d.rank);
    };
    const int64_t q_all = cfg.n_heads * hd, kv_all = cfg.n_kv_heads * hd;
    const int64_t q0 = p.q_head0 * hd, nq = p.n_q_heads * hd, kv0 = p.kv_head0 * hd, nkv = p.n_kv_heads * hd;
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
        const std::string pre = "model.layers." + std::to_string(l) + ".";
        LoraLayer& L = w.layers[size_t(l)];
        take(pre + "self_attn.q_proj.weight", q_all, cfg.hidden, q0, nq, 0, cfg.hidden, L.q);
        take(pre + "self_attn.k_proj.weight", kv_all, cfg.hidden, kv0, nkv, 0, cfg.hidden, L.k);
        take(pre + "self_attn.v_proj.weight", kv_all, cfg.hidden, kv0, nkv, 0, cfg.hidden, L.v);
        take(pre + "self_attn.o_proj.weight", cfg.hidden, q_all, 0, cfg.hidden, q0, nq, L.o);
        take(pre + "mlp.gate_proj.weight", cfg.intermediate, cfg.hidden, p.inter0, p.n_inter, 0, cfg.hidden, L.gate);
        take(pre + "mlp.up_proj.weight", cfg.intermediate, cfg.hidden, p.inter0, p.n_inter, 0, cfg.hidden, L.up);
        take(pre + "mlp.down_proj.weight", cfg.hidden, cfg.intermediate, 0, cfg.hidden, p.inter0, p.n_inter, L.down);
    }
    if (max_rank > 0 && w.max_rank > max_rank)
        fail("LoRA adapter ", ad.dir, ": rank ", w.max_rank, " is greater than --max-lora-rank ", max_rank);
    return w;
}

}  // namespace shardlm
