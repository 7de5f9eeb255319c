#include "runtime/cpu_engine.h"

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <stdexcept>

#include "comm/together.h"
#include "core/error.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gather.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"

namespace shardlm {

namespace {

// The row-wise and element-wise steps of a layer, threaded over rows when there are enough of them
// (prefill): each row is computed as on one thread, so the bits do not depend on the threads.
// Decode-sized steps stay on one thread, where a fork/join would cost more than the work.
constexpr int64_t kParallelMinElems = int64_t(1) << 15;

void rmsnorm_rows(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= kParallelMinElems)
    for (int64_t r = 0; r < rows; ++r) rmsnorm(x + r * dim, w, y + r * dim, 1, dim, eps);
}

void silu_mul_rows(const float* gate, const float* up, float* y, int64_t rows, int64_t dim) {
#pragma omp parallel for schedule(static) if (rows * dim >= kParallelMinElems)
    for (int64_t r = 0; r < rows; ++r) silu_mul(gate + r * dim, up + r * dim, y + r * dim, dim);
}

void add_into(float* x, const float* o, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
    for (int64_t i = 0; i < n; ++i) x[i] += o[i];
}

}  // namespace

CpuEngine::CpuEngine(const ModelConfig& cfg, const ModelWeights& w, Communicator& comm, const EngineOptions& opt)
    : cfg_(cfg), w_(w), comm_(comm), opt_(opt), kv_(kv_cache_shape(cfg, w.plan.n_kv_heads, opt), opt.ranks_on_node) {
    SHARDLM_CHECK(opt.max_batch > 0 && opt.ctx > 0 && opt.max_step_tokens > 0);
    inv_freq_ = rope_inv_freq(rope_params(cfg));

    // The step workspace: T rows per buffer (and max_logit_rows rows of hidden states and logits).
    // A refused allocation becomes WorkspaceAllocError with the bytes of the buffer that failed, so
    // open_session can name the flags behind T; sizes are checked so a product cannot wrap.
    const size_t T = size_t(opt.max_step_tokens);
    size_t asking = 0;  // the allocation in progress
    auto bytes = [&](size_t rows, int64_t width, size_t elem) {
        const size_t row = size_t(width) * elem;
        asking = row > 0 && rows > SIZE_MAX / row ? SIZE_MAX : rows * row;
        if (asking == SIZE_MAX) throw std::bad_alloc();
        return asking;
    };
    auto alloc = [&](Buffer& b, size_t rows, int64_t width) {
        b = Buffer(bytes(rows, width, sizeof(float)));
        ws_bytes_ += b.size();
    };
    auto alloc_vec = [&](auto& v, size_t rows, int64_t width) {
        v.resize(bytes(rows, width, sizeof(v[0])) / sizeof(v[0]));
        ws_bytes_ += v.size() * sizeof(v[0]);
    };
    const ShardPlan& p = w.plan;
    const int64_t q_dim = p.n_q_heads * cfg.head_dim, kv_dim = p.n_kv_heads * cfg.head_dim;
    const int64_t ordered = widest_input_order(w);  // act-order inputs (0: none)
    if (opt_.max_logit_rows <= 0) opt_.max_logit_rows = opt.max_batch;
    const size_t L = size_t(opt_.max_logit_rows);
    try {
        alloc(x_, T, cfg.hidden);
        alloc(h_, T, cfg.hidden);
        alloc(q_, T, q_dim);
        alloc(k_, T, kv_dim);
        alloc(v_, T, kv_dim);
        alloc(attn_, T, q_dim);
        alloc(o_, T, cfg.hidden);
        alloc(gate_, T, p.n_inter);
        alloc(up_, T, p.n_inter);
        alloc(last_, L, cfg.hidden);
        alloc_vec(local_logits_, L, p.vocab_per_rank);
        alloc_vec(gathered_, L * size_t(p.tp), p.vocab_per_rank);
        alloc_vec(tok_pos_, T, 1);
        if (ordered > 0) {
            alloc(ordered_, T, ordered);
            if (p.tp > 1) alloc(order_parts_, T, ordered);
        }
        if (quantizes_acts(w.format)) {
            const int64_t widest = std::max({cfg.hidden, q_dim, p.n_inter, ordered});
            alloc_vec(act_q_, T, widest);
            alloc_vec(act_scales_, T, widest);  // at most one scale per element
        }
    } catch (const std::bad_alloc&) {  // std::vector's length_error for sizes past max_size() too
        throw WorkspaceAllocError(opt.max_step_tokens, asking);
    } catch (const std::length_error&) {
        throw WorkspaceAllocError(opt.max_step_tokens, asking);
    }
    SHARDLM_CHECK(ws_bytes_ == cpu_workspace_bytes(cfg, p, opt_, quantizes_acts(w.format), ordered),
                  "CpuEngine: the workspace (", ws_bytes_, " bytes) is not what cpu_workspace_bytes plans");
}

size_t cpu_workspace_bytes(const ModelConfig& c, const ShardPlan& p, const EngineOptions& opt, bool int8_acts,
                           int64_t ordered_width) {
    const size_t T = size_t(opt.max_step_tokens), L = size_t(opt.max_logit_rows > 0 ? opt.max_logit_rows : opt.max_batch);
    const size_t q_dim = size_t(p.n_q_heads * c.head_dim), kv_dim = size_t(p.n_kv_heads * c.head_dim);
    const size_t hidden = size_t(c.hidden), inter = size_t(p.n_inter), vpr = size_t(p.vocab_per_rank);
    // x h o, q attn, k v, gate up: f32 rows of the step; positions; last hidden rows and logits.
    size_t b = T * (3 * hidden + 2 * q_dim + 2 * kv_dim + 2 * inter) * sizeof(float) + T * sizeof(int64_t);
    b += L * hidden * sizeof(float) + L * vpr * (1 + size_t(p.tp)) * sizeof(float);
    const size_t ordered = size_t(ordered_width);
    b += T * ordered * (p.tp > 1 ? 2 : 1) * sizeof(float);
    if (int8_acts)
        b += T * size_t(std::max({c.hidden, p.n_q_heads * c.head_dim, p.n_inter, ordered_width})) * (1 + sizeof(float));
    return b;
}

void CpuEngine::shift_kv(int64_t slot, int64_t keep, int64_t discard, int64_t len) {
    check_shift(cfg_, opt_, slot, keep, discard, len);
    kv_.shift(slot, keep, discard, len, inv_freq_.data());
}

void CpuEngine::copy_kv(int64_t src, int64_t dst, int64_t n) {
    check_copy(cfg_, opt_, src, dst, n);
    kv_.copy_prefix(src, dst, n);
}

void CpuEngine::save_kv(int64_t slot, int64_t n, uint8_t* out) {
    check_kv_io(cfg_, opt_, slot, n, n);
    kv_.save_prefix(slot, n, out);
}

void CpuEngine::load_kv(int64_t slot, int64_t n, const uint8_t* in, int64_t saved) {
    check_kv_io(cfg_, opt_, slot, n, saved);
    kv_.load_prefix(slot, n, in, saved);
}

std::string CpuEngine::device() const { return std::string("cpu(") + matmul_isa() + ")"; }

void CpuEngine::set_adapters(const std::vector<LoraWeights>* adapters) {
    adapters_ = adapters && !adapters->empty() ? adapters : nullptr;
    int64_t rank = 0;
    adapter_bytes_ = 0;
    if (adapters_)
        for (const LoraWeights& a : *adapters_) {
            rank = std::max(rank, a.max_rank);
            adapter_bytes_ += a.bytes();
        }
    const size_t T = size_t(opt_.max_step_tokens);
    ws_bytes_ -= lora_t_.size() * sizeof(float);  // (called again as adapters are loaded and unloaded)
    try {
        lora_t_.assign(adapters_ ? 3 * T * size_t(rank) : 0, 0.0f);  // up to 3 products of one input (q/k/v)
    } catch (const std::bad_alloc&) {
        throw WorkspaceAllocError(opt_.max_step_tokens, T * size_t(rank) * sizeof(float));
    }
    ws_bytes_ += lora_t_.size() * sizeof(float);
}

void CpuEngine::add_lora(int64_t layer, const float* x, std::initializer_list<std::pair<LoraMatrix LoraLayer::*, float*>> ys) {
    lora_jobs_.clear();
    DType dt = DType::F32;
    for (const LoraRun& r : lora_runs_)
        for (const auto& [which, y] : ys) {
            const LoraMatrix& m = (*adapters_)[size_t(r.adapter)].layers[size_t(layer)].*which;
            if (m.rank == 0) continue;
            dt = m.dtype;  // one type for every adapter over these weights (lora_factor_dtype)
            lora_jobs_.push_back(LoraJob{x + r.row0 * m.in, r.n, m.in, m.a.data(), m.bt.data(), m.rank, m.out,
                                         y + r.row0 * m.out, m.out});
        }
    if (!lora_jobs_.empty()) lora_add_jobs(lora_jobs_.data(), int64_t(lora_jobs_.size()), dt, lora_t_.data());
}

void CpuEngine::row_parallel_sum(float* o, size_t n) {
    const int tp = comm_.size();
    if (!opt_.batch_invariant || tp <= 2) return comm_.all_reduce_sum(o, n);
    rank_parts_.resize(n * size_t(tp));
    comm_.all_gather(o, n * sizeof(float), rank_parts_.data());
    std::copy(rank_parts_.begin(), rank_parts_.begin() + ptrdiff_t(n), o);
    for (int r = 1; r < tp; ++r) {
        const float* part = rank_parts_.data() + size_t(r) * n;
        for (size_t i = 0; i < n; ++i) o[i] += part[i];
    }
}

const QuantizedActs* CpuEngine::quantize_input(const float* x, int64_t T, int64_t cols, int64_t group) {
    if (!quantizes_acts(w_.format)) return nullptr;
    // Per token, or per group when the weights have finer groups (the kernel needs one group
    // size to divide the other; W4A8's weights always have groups, so its activations do too).
    const int64_t g = group > 0 && group < cols ? group : cols;
    quantize_acts_int8(x, T, cols, g, act_q_.data(), act_scales_.data());
    acts_ = QuantizedActs{act_q_.data(), act_scales_.data(), T, cols, g};
    return &acts_;
}

void CpuEngine::linears(std::initializer_list<std::pair<const Linear*, float*>> ls, const float* x, int64_t T,
                        int64_t cols) {
    // Act-order layers read x in their order: one reordered copy for the layers that share one
    // (GPTQ orders a layer's columns by its input's statistics: q/k/v alike, gate/up alike). Each
    // distinct order once, at its first layer; other models have one, the empty one.
    for (auto it = ls.begin(); it != ls.end(); ++it) {
        const std::vector<int32_t>& order = it->first->input_order;
        if (std::any_of(ls.begin(), it, [&](const auto& l) { return l.first->input_order == order; })) continue;
        same_input_.clear();
        std::copy_if(it, ls.end(), std::back_inserter(same_input_),
                     [&](const auto& l) { return l.first->input_order == order; });
        if (order.empty()) products(same_input_, x, T, cols);
        else products(same_input_, reorder_input(x, T, cols, *it->first), T, int64_t(order.size()));
    }
}

const float* CpuEngine::reorder_input(const float* x, int64_t T, int64_t cols, const Linear& l) {
    const std::vector<int32_t>& order = l.input_order;
    const int64_t width = int64_t(order.size());
    const float* src = x;
    const int64_t parts = l.input_width / cols;  // every rank's [T, cols] part, in rank order
    SHARDLM_CHECK(parts * cols == l.input_width && (parts == 1 || parts == comm_.size()), "reorder_input: ", l.name,
                  " reads ", l.input_width, " elements, ", comm_.size(), " ranks hold ", cols, " each");
    if (parts > 1) {  // a row-parallel layer split over ranks
        comm_.all_gather(x, size_t(T * cols) * sizeof(float), order_parts_.data());
        src = order_parts_.as<float>();
    }
    float* out = ordered_.as<float>();
    gather_columns(src, T, cols, parts, order.data(), width, out);
    return out;
}

void CpuEngine::products(const std::vector<std::pair<const Linear*, float*>>& ls, const float* x, int64_t T,
                         int64_t cols) {
    // Products of INT8 activations (qx) for the I8/I4 layers, of float ones for 16-bit layers kept
    // by --keep-fp16; matmul_*_multi runs one call per layer where the weights differ in kind.
    const QuantizedActs* qx = quantize_input(x, T, cols, ls.front().first->w.group_size);
    std::vector<MatmulOut> int8_outs, float_outs;
    for (const auto& [l, y] : ls)
        (qx && (l->w.dtype == DType::I8 || l->w.dtype == DType::I4) ? int8_outs : float_outs)
            .push_back(MatmulOut{&l->w, l->bias_ptr(), y});
    const bool inv = opt_.batch_invariant;
    if (!int8_outs.empty()) matmul_int8_acts_multi(*qx, int8_outs.data(), int(int8_outs.size()), CpuIsa::Auto, inv);
    if (!float_outs.empty()) matmul_multi(x, T, float_outs.data(), int(float_outs.size()), CpuIsa::Auto, inv);
}

void CpuEngine::attention_block(const LayerWeights& L, int64_t layer, const std::vector<SeqChunk>& chunks,
                             int64_t T) {
    const ModelConfig& c = cfg_;
    const ShardPlan& p = w_.plan;
    const int64_t hd = c.head_dim, nh = p.n_q_heads, nkv = p.n_kv_heads, q_dim = nh * hd, kv_dim = nkv * hd;
    float* h = h_.as<float>();
    float* q = q_.as<float>();
    float* k = k_.as<float>();
    float* v = v_.as<float>();

    rmsnorm_rows(x_.as<float>(), L.input_norm.data(), h, T, c.hidden, c.rms_eps);
    if (probe_) probe_(layer, LinearInput::Qkv, h, T, c.hidden);
    linears({{&L.q, q}, {&L.k, k}, {&L.v, v}}, h, T, c.hidden);
    add_lora(layer, h, {{&LoraLayer::q, q}, {&LoraLayer::k, k}, {&LoraLayer::v, v}});
    if (c.qk_norm) {  // Qwen3: per-head RMSNorm of q and k, before RoPE
        rmsnorm_rows(q, L.q_norm.data(), q, T * nh, hd, c.rms_eps);
        rmsnorm_rows(k, L.k_norm.data(), k, T * nkv, hd, c.rms_eps);
    }
#pragma omp parallel for schedule(static) if (T * (q_dim + kv_dim) >= kParallelMinElems)
    for (int64_t t = 0; t < T; ++t) {
        rope_ref(q + t * q_dim, nh, hd, tok_pos_[size_t(t)], inv_freq_.data());
        rope_ref(k + t * kv_dim, nkv, hd, tok_pos_[size_t(t)], inv_freq_.data());
    }
    // Keys and values go into the cache first; attention then reads only the cache, so a chunk
    // sees its own tokens and everything cached before it through one path.
    int64_t row = 0;
    for (const SeqChunk& ch : chunks) {
        for (int64_t i = 0; i < ch.n; ++i)
            kv_.write(layer, ch.slot, ch.pos + i, k + (row + i) * kv_dim, v + (row + i) * kv_dim);
        CachedAttention a;
        a.q = q + row * q_dim;
        a.out = attn_.as<float>() + row * q_dim;
        a.n_q = ch.n;
        // Local head counts: with split KV heads the group size is unchanged; with replicated ones
        // this rank holds one KV head that all its query heads read.
        a.n_heads = nh;
        a.n_kv_heads = nkv;
        a.head_dim = hd;
        a.q_pos0 = ch.pos;
        a.window = layer_window(c, layer);
        a.k = kv_.k(layer, ch.slot);
        a.v = kv_.v(layer, ch.slot);
        a.kv_dtype = kv_.shape().dtype;
        a.capacity = kv_.shape().capacity;
        a.row_stride = kv_.row_stride();
        a.scale = attention_scale(cfg_);
        a.k_scales = kv_.k_scales(layer, ch.slot);
        a.v_scales = kv_.v_scales(layer, ch.slot);
        // Flash: tiles of keys reused by a block of queries, which pays in prefill; a one-token
        // decode chunk has no block to reuse them, and the per-query kernel is faster there.
        // Batch-invariant: the per-query kernel for every chunk, whose each query's work is the
        // same however many queries the chunk holds.
        if (opt_.attention == AttentionImpl::Flash && ch.n > 1 && !opt_.batch_invariant) attention_cached_flash(a);
        else attention_cached(a);
        row += ch.n;
    }
    float* o = o_.as<float>();
    if (probe_) probe_(layer, LinearInput::O, attn_.as<float>(), T, q_dim);
    linears({{&L.o, o}}, attn_.as<float>(), T, q_dim);
    add_lora(layer, attn_.as<float>(), {{&LoraLayer::o, o}});
    row_parallel_sum(o, size_t(T * c.hidden));  // row-parallel o_proj
    add_into(x_.as<float>(), o, T * c.hidden);
}

void CpuEngine::mlp_block(const LayerWeights& L, int64_t layer, int64_t T) {
    const ModelConfig& c = cfg_;
    float* h = h_.as<float>();
    rmsnorm_rows(x_.as<float>(), L.post_attn_norm.data(), h, T, c.hidden, c.rms_eps);
    if (probe_) probe_(layer, LinearInput::GateUp, h, T, c.hidden);
    float* g = gate_.as<float>();
    float* u = up_.as<float>();
    linears({{&L.gate, g}, {&L.up, u}}, h, T, c.hidden);
    add_lora(layer, h, {{&LoraLayer::gate, g}, {&LoraLayer::up, u}});
    silu_mul_rows(g, u, g, T, w_.plan.n_inter);
    if (probe_) probe_(layer, LinearInput::Down, g, T, w_.plan.n_inter);
    float* o = o_.as<float>();
    linears({{&L.down, o}}, g, T, w_.plan.n_inter);
    add_lora(layer, g, {{&LoraLayer::down, o}});
    row_parallel_sum(o, size_t(T * c.hidden));  // row-parallel down_proj
    add_into(x_.as<float>(), o, T * c.hidden);
}

int64_t CpuEngine::final_rows(const std::vector<SeqChunk>& chunks, float* out, bool hidden) {
    maybe_inject_failure(comm_, "forward");
    const ModelConfig& c = cfg_;
    const StepShape shape = check_step(c, opt_, chunks, hidden);
    const int64_t T = shape.tokens;
    check_adapters(chunks, adapters_);

    // Vocab-parallel embedding: each rank fills the rows of the ids it holds, zeros elsewhere,
    // and the all-reduce assembles the full rows.
    const ShardPlan& p = w_.plan;
    int64_t row = 0;
    float* x = x_.as<float>();
    for (const SeqChunk& ch : chunks) {
        for (int64_t i = 0; i < ch.n; ++i) {
            const int32_t local = ch.tokens[i] - int32_t(p.vocab0);
            float* xr = x + (row + i) * c.hidden;
            if (local >= 0 && local < p.n_vocab) embedding_ref(w_.embed, &local, 1, xr);
            else std::fill(xr, xr + c.hidden, 0.0f);
            tok_pos_[size_t(row + i)] = ch.pos + i;
        }
        row += ch.n;
    }
    if (p.tp > 1) comm_.all_reduce_sum(x, size_t(T * c.hidden));
    // The step's rows under each adapter, as runs of consecutive chunks of one adapter.
    lora_runs_.clear();
    row = 0;
    for (const SeqChunk& ch : chunks) {
        if (ch.adapter >= 0) {
            if (!lora_runs_.empty() && lora_runs_.back().adapter == ch.adapter &&
                lora_runs_.back().row0 + lora_runs_.back().n == row)
                lora_runs_.back().n += ch.n;
            else
                lora_runs_.push_back({ch.adapter, row, ch.n});
        }
        row += ch.n;
    }
    for (int64_t l = 0; l < c.n_layers; ++l) {
        attention_block(w_.layers[size_t(l)], l, chunks, T);
        mlp_block(w_.layers[size_t(l)], l, T);
    }
    // The final norm only on the rows whose output is wanted.
    int64_t n = 0;
    row = 0;
    for (const SeqChunk& ch : chunks) {
        row += ch.n;
        const int64_t rows = ch.all_logits ? ch.n : ch.want_logits ? 1 : 0;
        rmsnorm(x_.as<float>() + (row - rows) * c.hidden, w_.final_norm.data(), out + n * c.hidden, rows, c.hidden,
                c.rms_eps);
        n += rows;
    }
    return n;
}

void CpuEngine::forward_hidden(const std::vector<SeqChunk>& chunks, float* hidden) { final_rows(chunks, hidden, true); }

void CpuEngine::forward(const std::vector<SeqChunk>& chunks, float* logits) {
    if (w_.headless) fail(headless_message());
    const ModelConfig& c = cfg_;
    const ShardPlan& p = w_.plan;
    float* last = last_.as<float>();
    const int64_t n = final_rows(chunks, last, false);
    if (n == 0) return;
    // Token penalties on the whole rows, the same on every rank (every rank holds them).
    const std::vector<PenaltyEntry> penalties = step_penalties(chunks);
    if (p.tp == 1) {
        matmul(last, n, w_.lm_head, nullptr, logits, CpuIsa::Auto, opt_.batch_invariant);
        apply_penalties_ref(logits, c.vocab, 0, penalties.data(), int64_t(penalties.size()));
        return;
    }
    // Vocab-parallel lm_head: every rank computes its vocabulary slice, padded to vocab_per_rank
    // so the all-gather has equal parts, then the slices are laid side by side per row.
    const int64_t vpr = p.vocab_per_rank;
    float* local = local_logits_.data();
    if (p.n_vocab > 0) {
        float* tmp = gathered_.data();  // scratch until the gather below
        matmul(last, n, w_.lm_head, nullptr, tmp, CpuIsa::Auto, opt_.batch_invariant);
        for (int64_t i = 0; i < n; ++i) {
            std::copy(tmp + i * p.n_vocab, tmp + (i + 1) * p.n_vocab, local + i * vpr);
            std::fill(local + i * vpr + p.n_vocab, local + (i + 1) * vpr, 0.0f);
        }
    } else {
        std::fill(local, local + n * vpr, 0.0f);
    }
    comm_.all_gather(local, size_t(n * vpr) * sizeof(float), gathered_.data());
    for (int64_t i = 0; i < n; ++i)
        for (int r = 0; r < p.tp; ++r) {
            const int64_t v0 = r * vpr, nv = std::min(vpr, c.vocab - v0);
            if (nv <= 0) continue;
            const float* src = gathered_.data() + (int64_t(r) * n + i) * vpr;
            std::copy(src, src + nv, logits + i * c.vocab + v0);
        }
    apply_penalties_ref(logits, c.vocab, 0, penalties.data(), int64_t(penalties.size()));
}

}  // namespace shardlm
