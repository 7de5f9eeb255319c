#include "model/lora_weights.h"

#include <algorithm>
#include <cstring>
#include <numeric>

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
                              const ModelConfig& cfg, const ModelWeights& weights, DType factors, int64_t max_rank) {
    SHARDLM_CHECK(factors == DType::F32 || factors == DType::BF16, "load_lora_weights: factors of ", dtype_name(factors));
    SHARDLM_CHECK(int64_t(weights.layers.size()) == cfg.n_layers, "load_lora_weights: ", weights.layers.size(),
                  " layers of weights for ", cfg.n_layers);
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
    // The rows of B and the columns of A of the full delta that this rank's matrix holds, in its order.
    auto take = [&](const std::string& tensor, int64_t full_rows, int64_t full_cols, const std::vector<int32_t>& rows,
                    const std::vector<int32_t>& cols, LoraMatrix& m) {
        if (!set.find(tensor)) return;
        const LoraDelta d = set.delta(tensor, full_rows, full_cols);  // left: scaled B, right: A
        const int64_t nr = int64_t(rows.size()), nc = int64_t(cols.size());
        m.rank = d.rank;
        m.in = nc;
        m.out = nr;
        m.dtype = factors;
        std::vector<float> a(size_t(d.rank * nc)), bt(size_t(d.rank * nr));
        for (int64_t k = 0; k < d.rank; ++k)
            for (int64_t c = 0; c < nc; ++c) a[size_t(k * nc + c)] = d.right[size_t(k * full_cols + cols[size_t(c)])];
        for (int64_t r = 0; r < nr; ++r)
            for (int64_t k = 0; k < d.rank; ++k)
                bt[size_t(lora_bt_index(k, r, d.rank, nr))] = d.left[size_t(rows[size_t(r)] * d.rank + k)];
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
    auto range = [](int64_t first, int64_t n) {
        std::vector<int32_t> v(static_cast<size_t>(n));
        std::iota(v.begin(), v.end(), int32_t(first));
        return v;
    };
    const ShardPlan& p = weights.plan;
    const int64_t q_all = cfg.n_heads * hd, kv_all = cfg.n_kv_heads * hd;
    const std::vector<int32_t> hidden = range(0, cfg.hidden), q = range(p.q_head0 * hd, p.n_q_heads * hd),
                               kv = range(p.kv_head0 * hd, p.n_kv_heads * hd), natural_inter = range(p.inter0, p.n_inter);
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
        const std::string pre = "model.layers." + std::to_string(l) + ".";
        LoraLayer& L = w.layers[size_t(l)];
        // An act-order down_proj's layer makes its intermediate in another order (LayerWeights::inter_rows).
        const std::vector<int32_t>& ir = weights.layers[size_t(l)].inter_rows;
        const std::vector<int32_t>& inter = ir.empty() ? natural_inter : ir;
        take(pre + "self_attn.q_proj.weight", q_all, cfg.hidden, q, hidden, L.q);
        take(pre + "self_attn.k_proj.weight", kv_all, cfg.hidden, kv, hidden, L.k);
        take(pre + "self_attn.v_proj.weight", kv_all, cfg.hidden, kv, hidden, L.v);
        take(pre + "self_attn.o_proj.weight", cfg.hidden, q_all, hidden, q, L.o);
        take(pre + "mlp.gate_proj.weight", cfg.intermediate, cfg.hidden, inter, hidden, L.gate);
        take(pre + "mlp.up_proj.weight", cfg.intermediate, cfg.hidden, inter, hidden, L.up);
        take(pre + "mlp.down_proj.weight", cfg.hidden, cfg.intermediate, hidden, inter, L.down);
    }
    if (max_rank > 0 && w.max_rank > max_rank)
        fail("LoRA adapter ", ad.dir, ": rank ", w.max_rank, " is greater than --max-lora-rank ", max_rank);
    return w;
}

}  // namespace shardlm
