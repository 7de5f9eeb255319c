#include "runtime/cuda_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "comm/together.h"
#include "core/error.h"
#include "kernels/cpu/nucleus.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/argmax.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/kv_shift.h"
#include "kernels/cuda/lora.h"
#include "kernels/cuda/nucleus.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope_kv.h"
#include "kernels/cuda/penalty.h"
#include "kernels/cuda/topk.h"
#include "kernels/cuda/w4a8.h"
#include "kernels/cuda/w8a8.h"
#include "model/lora_weights.h"

namespace shardlm {

namespace {

size_t matrix_bytes(const WeightView& w) { return size_t(w.rows) * size_t(weight_row_bytes(w)); }
// INT8 and INT4 scales (and INT4 mins): one per row and group.
size_t scale_count(const WeightView& w) { return w.quantized() ? size_t(w.rows * w.n_groups()) : 0; }

// Whether Linear layers reading the same input can be one matrix of stacked rows: same element
// type, columns, INT8/INT4 groups and act-order column order, and biases on all or none.
bool fusable(std::initializer_list<const Linear*> ls) {
    const Linear& a = **ls.begin();
    for (const Linear* l : ls)
        if (l->w.dtype != a.w.dtype || l->w.cols != a.w.cols || l->bias.empty() != a.bias.empty() ||
            (a.w.quantized() && l->w.group_size != a.w.group_size) || l->input_order != a.input_order ||
            l->input_width != a.input_width)
            return false;
    return true;
}

// The view of the stacked matrix (shape and format only; the rows come from the parts on upload).
WeightView stacked(std::initializer_list<const Linear*> ls) {
    WeightView v = (*ls.begin())->w;
    v.rows = 0;
    for (const Linear* l : ls) v.rows += l->w.rows;
    return v;
}

double gib(size_t b) { return double(b) / (1024.0 * 1024.0 * 1024.0); }

// Host -> device copies through two pinned staging buffers, so reading the next piece from the
// memory map overlaps the previous piece's transfer. Prints progress on a terminal (rank 0).
class Uploader {
public:
    Uploader(cudaStream_t s, size_t total, bool progress) : s_(s), total_(total), progress_(progress) {
        for (auto& b : stage_) b = PinnedBuffer(kStage);
    }
    void copy(void* dst, const void* src, size_t bytes) {
        const char* from = static_cast<const char*>(src);
        char* to = static_cast<char*>(dst);
        while (bytes > 0) {
            const size_t n = std::min(bytes, kStage);
            CUDA_CHECK(cudaEventSynchronize(done_[cur_].get()));  // this stage's last copy is over
            std::memcpy(stage_[cur_].get(), from, n);
            CUDA_CHECK(cudaMemcpyAsync(to, stage_[cur_].get(), n, cudaMemcpyHostToDevice, s_));
            CUDA_CHECK(cudaEventRecord(done_[cur_].get(), s_));
            cur_ ^= 1;
            from += n;
            to += n;
            bytes -= n;
            sent_ += n;
            report(false);
        }
    }
    void finish() {
        CUDA_CHECK(cudaStreamSynchronize(s_));
        report(true);
    }

private:
    void report(bool last) {
        if (!progress_ || total_ == 0) return;
        const int pct = int(100.0 * double(sent_) / double(total_));
        if (pct == last_pct_ && !last) return;
        last_pct_ = pct;
        std::fprintf(stderr, "\ruploading weights %3d%% (%.2f / %.2f GiB)%s", pct, gib(sent_), gib(total_), last ? "\n" : "");
        std::fflush(stderr);
    }
    static constexpr size_t kStage = size_t(32) << 20;
    cudaStream_t s_;
    PinnedBuffer stage_[2];
    CudaEvent done_[2];
    int cur_ = 0;
    size_t total_ = 0, sent_ = 0;
    bool progress_ = false;
    int last_pct_ = -1;
};

// W8A8: the group of a projection's activation scales: per token, or per group when the weights
// have finer groups (as the CPU engine's quantize_input).
int64_t act_group(const DeviceMatrix& w) {
    return w.group_size > 0 && w.group_size < w.cols ? w.group_size : w.cols;
}

// Whether projection b takes the quantized input a's W8A8/W4A8 path made (same quantized dtype and
// grouping).
bool same_acts(const CudaLinear& b, const CudaLinear& a) {
    return (b.w.dtype == DType::I8 || b.w.dtype == DType::I4) && b.w.dtype == a.w.dtype &&
           act_group(b.w) == act_group(a.w);
}

// The step's tables at their offsets in one block: CudaStepBuffers::meta on the device, and its
// pinned staging copy the host fills (T = max_step_tokens, R = step_out_rows; take_step_buffers
// sizes the block).
struct StepTables {
    int32_t *ids, *pos, *slot;
    int32_t* adapter;  // each row's LoRA adapter slot (CudaEngine::seat_adapters), -1: none
    int32_t* logit_rows;
    AttnChunk* chunks;  // [max_batch]
};
StepTables step_tables(int32_t* meta, const EngineOptions& opt) {
    const int64_t T = opt.max_step_tokens;
    return {meta, meta + T, meta + 2 * T, meta + 3 * T, meta + 4 * T,
            reinterpret_cast<AttnChunk*>(meta + 4 * T + step_out_rows(opt))};
}

}  // namespace

uint32_t parse_ablation(const std::string& names, const std::string& flag) {
    static const std::pair<const char*, uint32_t> kClasses[] = {
        {"qkv", kAblateQkv}, {"attention", kAblateAttention}, {"o", kAblateO}, {"mlp", kAblateMlp}, {"lm_head", kAblateLmHead}};
    uint32_t mask = 0;
    for (size_t at = 0; at <= names.size();) {
        const size_t end = std::min(names.find('+', at), names.size());
        const std::string item = names.substr(at, end - at);
        uint32_t bit = 0;
        for (const auto& [name, b] : kClasses)
            if (item == name) bit = b;
        if (bit == 0)
            fail(flag, ": \"", item, "\" is not a kernel class (qkv, attention, o, mlp, lm_head, joined with '+')");
        mask |= bit;
        at = end + 1;
    }
    return mask;
}

CudaStepBuffers take_step_buffers(DeviceArena& a, const ModelConfig& c, const ShardPlan& p, const EngineOptions& opt,
                                  bool int8_acts, int64_t ordered_width) {
    SHARDLM_CHECK(opt.max_step_tokens > 0 && opt.max_logit_rows > 0 && opt.max_batch > 0);
    const int64_t hd = c.head_dim, q_dim = p.n_q_heads * hd, kv_dim = p.n_kv_heads * hd;
    auto floats = [&](size_t n) { return a.take_n<float>(n); };
    CudaStepBuffers b;
    const size_t T = size_t(opt.max_step_tokens), L = size_t(opt.max_logit_rows);
    b.x = floats(T * size_t(c.hidden));
    b.h = floats(T * size_t(c.hidden));
    b.q = floats(T * size_t(q_dim));
    b.k = floats(T * size_t(kv_dim));
    b.v = floats(T * size_t(kv_dim));
    b.attn = floats(T * size_t(q_dim));
    b.delta = floats(T * size_t(c.hidden));
    b.gate = floats(T * size_t(p.n_inter));
    b.up = floats(T * size_t(p.n_inter));
    b.qkv = floats(T * size_t(q_dim + 2 * kv_dim));
    b.gate_up = floats(T * size_t(2 * p.n_inter));
    const size_t R = size_t(step_out_rows(opt));
    b.last = floats(R * size_t(c.hidden));
    if (int8_acts) {  // W8A8/W4A8: a layer input quantized per token (and group): int8 values, f32 scales
        const size_t widest = size_t(std::max({c.hidden, q_dim, p.n_inter}));
        b.act_q = static_cast<int8_t*>(a.take(T * widest));
        b.act_scales = floats(T * widest);  // at most one scale per element
    }
    b.local = floats(L * size_t(std::max<int64_t>(p.n_vocab, 1)));
    if (p.tp > 1) {
        b.padded = floats(L * size_t(p.vocab_per_rank));
        b.gathered = floats(size_t(p.tp) * L * size_t(p.vocab_per_rank));
    }
    // Candidates of forward_top: [vals | ids] halves of [max_logit_rows, kMaxTopCandidates] each,
    // per rank, and the selection's scratch.
    const size_t top_bytes = 2 * L * size_t(kMaxTopCandidates) * sizeof(float);
    b.top = a.take(top_bytes);
    if (p.tp > 1) b.top_gathered = a.take(size_t(p.tp) * top_bytes);
    b.mass = static_cast<uint64_t*>(a.take(L * sizeof(uint64_t)));
    if (p.tp > 1) {
        b.mass_gathered = static_cast<uint64_t*>(a.take(size_t(p.tp) * L * sizeof(uint64_t)));
        b.row_max = floats(L);
    }
    if (ordered_width > 0) {
        // (A rank's act-order layer reads at most ordered_width columns; the parts of a split
        // row-parallel input add up to its whole width.)
        b.ordered = floats(T * size_t(ordered_width));
        if (p.tp > 1) b.order_parts = floats(T * size_t(ordered_width));
    }
    const size_t penalty_count = L * size_t(opt.max_penalties);
    if (penalty_count > 0) b.penalties = static_cast<PenaltyEntry*>(a.take(penalty_count * sizeof(PenaltyEntry)));
    b.topk_scratch = a.take(topk_scratch_bytes(int64_t(L), std::max<int64_t>(p.n_vocab, 1), kMaxTopCandidates));
    b.attn_scratch = a.take(attention_scratch_bytes(opt.max_batch, p.n_q_heads, hd, kv_capacity(c, opt)));
    b.meta_bytes = (4 * T + R) * sizeof(int32_t) + size_t(opt.max_batch) * sizeof(AttnChunk);  // StepTables
    b.meta = static_cast<int32_t*>(a.take(b.meta_bytes));
    return b;
}

CudaEngine::CudaEngine(const ModelConfig& cfg, const ModelWeights& w, Communicator& comm, cudaStream_t stream,
                       std::function<void()> wait, const EngineOptions& opt)
    : cfg_(cfg), plan_(w.plan), comm_(comm), opt_(opt), wait_(std::move(wait)) {
    SHARDLM_CHECK(opt.max_batch > 0 && opt.ctx > 0 && opt.max_step_tokens > 0);
    int8_acts_ = quantizes_acts(w.format);
    headless_ = w.headless;
    // (W8A8/W4A8 products quantize their input in the norm kernel; TP > 1 all-reduces each
    // product's output before it joins the residual stream: both keep the norm kernels.)
    // (Act-order layers read their input gathered into their own order, which the norm inside
    // the GEMV does not write.)
    fused_norm_ = !int8_acts_ && plan_.tp == 1 && widest_input_order(w) == 0 &&
                  (opt.fused_norm >= 0 ? opt.fused_norm == 1 : gemv_norm_fused_default());
    SHARDLM_CHECK(opt.kv == DType::F32 || opt.kv == DType::F16 || opt.kv == DType::BF16 || opt.kv == DType::I8);
    if (opt_.max_logit_rows <= 0) opt_.max_logit_rows = opt.max_batch;
    if (!stream) {
        own_stream_ = std::make_unique<CudaStream>();
        stream_ = own_stream_->get();
    } else {
        stream_ = stream;
    }
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    device_name_ = "cuda:" + std::to_string(dev) + " " + cuda_device_description(dev);
    SHARDLM_CHECK(opt.fused_rope >= -1 && opt.fused_rope <= 1, "CudaEngine: fused_rope ", opt.fused_rope,
                  " must be 0 or 1, or -1 for SHARDLM_FUSED_ROPE");
    fused_rope_ = opt.fused_rope >= 0 ? opt.fused_rope == 1 : decode_rope_fused();
    SHARDLM_CHECK(opt.fused_norm >= -1 && opt.fused_norm <= 1, "CudaEngine: fused_norm ", opt.fused_norm,
                  " must be 0 or 1, or -1 for SHARDLM_FUSED_NORM");
    // The tensor-core prefill attention checks this GPU's fragment layout once (mma_check.h): now,
    // before any step could be captured into a graph.
    prefill_tensor_cores();
    SHARDLM_CHECK(opt.gemm_staging >= -1 && opt.gemm_staging <= 1, "CudaEngine: gemm_staging ", opt.gemm_staging,
                  " must be 0 or 1, or -1 for SHARDLM_GEMM_STAGE");

    // Sizing pass, then the one allocation (with a clear error when it cannot fit).
    DeviceArena sizing;
    layout(sizing, w);
    const int64_t widest = std::max({cfg.hidden, plan_.n_q_heads * cfg.head_dim, plan_.n_inter});
    // cuBLAS prefill dequantizes INT8 and INT4 matrices into an F16 scratch, a block of whole rows
    // at a time: the largest stacked matrix (fused ones included), but at most 32 M elements. Staging
    // (EngineOptions::gemm_staging) adds a second one for the largest layer matrix that fits whole.
    // (Under W8A8 only lm_head takes that path: the layers' products are INT8 ones. W4A8's INT4
    // layers do: their prefill is an FP16 product of the dequantized activations and codes.)
    constexpr int64_t kMaxDequant = int64_t(32) << 20;
    int64_t largest = 0, stage_elems = 0;
    auto consider = [&](const WeightView& v, bool layer) {
        if (!v.quantized() || (int8_acts_ && layer && v.dtype == DType::I8)) return;
        largest = std::max(largest, std::max(v.cols, std::min<int64_t>(v.rows * v.cols, kMaxDequant)));
        if (layer && v.rows * v.cols <= kMaxDequant) stage_elems = std::max(stage_elems, v.rows * v.cols);
    };
    consider(w.lm_head, false);
    for (const LayerWeights& L : w.layers) {
        for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) consider(l->w, true);
        consider(stacked({&L.q, &L.k, &L.v}), true);
        consider(stacked({&L.gate, &L.up}), true);
    }
    staging_ = !int8_acts_ && stage_elems > 0 && (opt.gemm_staging >= 0 ? opt.gemm_staging == 1 : int8_gemm_staging());
    if (!staging_) stage_elems = 0;
    size_t free_b = 0, total_b = 0;
    device_memory_info(&free_b, &total_b);
    // W8A8 prefill keeps one dot group's INT32 products of the widest INT8 matrix (lm_head stays
    // W8A16, as on the CPU).
    int64_t int8_rows = 0;
    if (int8_acts_)
        for (const LayerWeights& L : w.layers)
            for (const WeightView& v : {stacked({&L.q, &L.k, &L.v}), stacked({&L.gate, &L.up}), L.q.w, L.k.w, L.v.w,
                                        L.o.w, L.gate.w, L.up.w, L.down.w})
                if (v.dtype == DType::I8) int8_rows = std::max(int8_rows, v.rows);
    const int64_t gemm_rows = std::max(opt.max_step_tokens, opt_.max_logit_rows);
    const size_t gemm_guess = size_t(opt.max_step_tokens * widest) * 2 + size_t(largest + stage_elems) * 2 +
                              (size_t(32) << 20) +
                              size_t(gemm_rows * int8_rows) * sizeof(int32_t);
    const size_t need = sizing.used() + gemm_guess;
    if (need > free_b)
        throw DeviceFitError(cat("the model does not fit on ", device_name_, " (rank ", comm.rank(), "): it needs ",
                                 gib(need), " GiB (weights ", gib(weight_bytes_), ", KV cache ", gib(kv_bytes_),
                                 ", workspace ", gib(ws_bytes_ + gemm_guess), ") and ", gib(free_b),
                                 " GiB are free; lower --ctx or --batch, use --weights int8 / --kv int8, or add ranks"),
                             device_name_, comm.rank(), need, free_b, weight_bytes_, kv_bytes_, ws_bytes_ + gemm_guess);
    arena_ = DeviceArena(sizing.used());
    weight_bytes_ = kv_bytes_ = ws_bytes_ = 0;
    layout(arena_, w);
    gemm_ = std::make_unique<CublasGemm>(stream_, gemm_rows, widest, largest, stage_elems);
    ws_bytes_ += gemm_->scratch_bytes();
    if (int8_rows > 0) {
        int8_gemm_ = std::make_unique<CublasInt8Gemm>(stream_, opt.max_step_tokens, int8_rows);
        ws_bytes_ += int8_gemm_->scratch_bytes();
    }
    meta_host_ = PinnedBuffer(b_.meta_bytes);
    const int64_t L = opt_.max_logit_rows;
    logits_host_ = PinnedBuffer(size_t(plan_.tp * L * plan_.vocab_per_rank) * sizeof(float));
    top_host_ = PinnedBuffer(size_t(plan_.tp) * 2 * size_t(L * kMaxTopCandidates) * sizeof(float));
    // forward_nucleus: the ranks' row masses [tp][L], then (TP > 1) the rows' maxima [L] floats.
    mass_host_ = PinnedBuffer(size_t(plan_.tp) * size_t(L) * sizeof(uint64_t) + size_t(L) * sizeof(float) * 2);
    if (opt_.max_penalties > 0) penalty_host_ = PinnedBuffer(size_t(L * opt_.max_penalties) * sizeof(PenaltyEntry));
    upload(w);
    for (const CudaLayer& layer : layers_) {
        for (const CudaLinear* l : {&layer.qkv, &layer.q, &layer.k, &layer.v, &layer.o, &layer.gate_up, &layer.gate,
                                    &layer.up, &layer.down})
            if (l->w.data) read_order_.push_back(&l->w);
    }
    if (lm_head_.data) read_order_.push_back(&lm_head_);
    for (size_t i = 0; i < read_order_.size(); ++i) read_pos_.emplace(read_order_[i]->data, i);
}

CudaEngine::~CudaEngine() {
    // Graphs and buffers free themselves; make sure nothing still runs on memory about to go.
    if (stream_) cudaStreamSynchronize(stream_);
}

void CudaEngine::layout(DeviceArena& a, const ModelWeights& w) {
    const ModelConfig& c = cfg_;
    const int64_t hd = c.head_dim;
    size_t mark = a.used();
    auto floats = [&](size_t n) { return a.take_n<float>(n); };
    auto matrix = [&](const WeightView& v) {
        DeviceMatrix m;
        m.dtype = v.dtype;
        m.rows = v.rows;
        m.cols = v.cols;
        m.group_size = v.quantized() ? v.group_size : 0;
        m.data = a.take(matrix_bytes(v));
        if (v.quantized()) m.scales = floats(scale_count(v));
        if (v.dtype == DType::I4) m.mins = floats(scale_count(v));
        return m;
    };
    auto order = [&](CudaLinear& d, const Linear& l) {
        if (l.input_order.empty()) return;
        d.order = a.take_n<int32_t>(l.input_order.size());
        d.order_width = l.input_width;
    };
    auto linear = [&](const Linear& l) {
        CudaLinear d;
        d.w = matrix(l.w);
        d.bias = l.bias.empty() ? nullptr : floats(l.bias.size());
        order(d, l);
        return d;
    };
    auto fused = [&](std::initializer_list<const Linear*> ls) {
        CudaLinear d;
        const WeightView v = stacked(ls);
        d.w = matrix(v);
        d.bias = (*ls.begin())->bias.empty() ? nullptr : floats(size_t(v.rows));
        order(d, **ls.begin());  // (fusable: one order for all)
        return d;
    };
    // Weights.
    embed_ = matrix(w.embed);
    lm_head_ = w.lm_head.data == w.embed.data ? embed_ : matrix(w.lm_head);  // tied: one copy
    final_norm_ = floats(w.final_norm.size());
    layers_.assign(w.layers.size(), CudaLayer{});
    for (size_t i = 0; i < w.layers.size(); ++i) {
        const LayerWeights& L = w.layers[i];
        CudaLayer& d = layers_[i];
        d.input_norm = floats(L.input_norm.size());
        d.post_attn_norm = floats(L.post_attn_norm.size());
        d.q_norm = L.q_norm.empty() ? nullptr : floats(L.q_norm.size());
        d.k_norm = L.k_norm.empty() ? nullptr : floats(L.k_norm.size());
        if (fusable({&L.q, &L.k, &L.v})) {
            d.qkv = fused({&L.q, &L.k, &L.v});
        } else {
            d.q = linear(L.q);
            d.k = linear(L.k);
            d.v = linear(L.v);
        }
        d.o = linear(L.o);
        if (fusable({&L.gate, &L.up})) {
            d.gate_up = fused({&L.gate, &L.up});
        } else {
            d.gate = linear(L.gate);
            d.up = linear(L.up);
        }
        d.down = linear(L.down);
    }
    inv_freq_ = floats(size_t(hd / 2));
    weight_bytes_ += a.used() - mark;

    // KV cache: per layer K and V [max_batch][n_kv_heads][ctx][row_stride], rows 128-byte aligned.
    mark = a.used();
    const size_t es = dtype_size(opt_.kv);
    const int64_t row_stride = int64_t(((size_t(hd) * es + 127) / 128) * 128 / es);
    const int64_t capacity = kv_capacity(cfg_, opt_);  // a ring for a sliding-window model
    const size_t rows = size_t(opt_.max_batch * plan_.n_kv_heads * capacity);
    kv_.assign(size_t(c.n_layers), DeviceKVLayer{});
    for (DeviceKVLayer& kv : kv_) {
        kv.dtype = opt_.kv;
        kv.n_slots = opt_.max_batch;
        kv.n_kv_heads = plan_.n_kv_heads;
        kv.capacity = capacity;
        kv.row_stride = row_stride;
        kv.k = a.take(rows * size_t(row_stride) * es);
        kv.v = a.take(rows * size_t(row_stride) * es);
        if (opt_.kv == DType::I8) {
            kv.k_scales = floats(rows);
            kv.v_scales = floats(rows);
        }
    }
    kv_bytes_ += a.used() - mark;

    // Workspace.
    mark = a.used();
    b_ = take_step_buffers(a, cfg_, plan_, opt_, int8_acts_, widest_input_order(w));
    ws_bytes_ += a.used() - mark;
}

void CudaEngine::upload(const ModelWeights& w) {
    const bool progress = comm_.rank() == 0 && isatty(2);
    Uploader up(stream_, weight_bytes_, progress);
    auto vec = [&](const float* dst, const std::vector<float>& src) {
        if (!src.empty()) up.copy(const_cast<float*>(dst), src.data(), src.size() * sizeof(float));
    };
    auto matrix = [&](const DeviceMatrix& d, const WeightView& v) {
        up.copy(const_cast<void*>(d.data), v.data, matrix_bytes(v));
        if (v.quantized()) up.copy(const_cast<float*>(d.scales), v.scales, scale_count(v) * sizeof(float));
        if (v.dtype == DType::I4) up.copy(const_cast<float*>(d.mins), v.mins, scale_count(v) * sizeof(float));
    };
    auto order = [&](const CudaLinear& d, const Linear& l) {
        if (d.order) up.copy(const_cast<int32_t*>(d.order), l.input_order.data(), l.input_order.size() * sizeof(int32_t));
    };
    auto linear = [&](const CudaLinear& d, const Linear& l) {
        matrix(d.w, l.w);
        if (d.bias) vec(d.bias, l.bias);
        order(d, l);
    };
    // The parts' rows one after the other; INT8/INT4 scales (and mins) and biases follow their rows.
    auto fused = [&](const CudaLinear& d, std::initializer_list<const Linear*> ls) {
        int64_t row = 0;
        for (const Linear* l : ls) {
            const WeightView& v = l->w;
            up.copy(static_cast<char*>(const_cast<void*>(d.w.data)) + size_t(row * weight_row_bytes(v)), v.data,
                    matrix_bytes(v));
            if (v.quantized())
                up.copy(const_cast<float*>(d.w.scales) + row * v.n_groups(), v.scales, scale_count(v) * sizeof(float));
            if (v.dtype == DType::I4)
                up.copy(const_cast<float*>(d.w.mins) + row * v.n_groups(), v.mins, scale_count(v) * sizeof(float));
            if (d.bias) up.copy(const_cast<float*>(d.bias) + row, l->bias.data(), l->bias.size() * sizeof(float));
            row += v.rows;
        }
        order(d, **ls.begin());
    };
    matrix(embed_, w.embed);
    if (lm_head_.data != embed_.data) matrix(lm_head_, w.lm_head);
    vec(final_norm_, w.final_norm);
    for (size_t i = 0; i < w.layers.size(); ++i) {
        const LayerWeights& L = w.layers[i];
        const CudaLayer& d = layers_[i];
        vec(d.input_norm, L.input_norm);
        vec(d.post_attn_norm, L.post_attn_norm);
        if (d.q_norm) vec(d.q_norm, L.q_norm);
        if (d.k_norm) vec(d.k_norm, L.k_norm);
        if (d.qkv.w.data) {
            fused(d.qkv, {&L.q, &L.k, &L.v});
        } else {
            linear(d.q, L.q);
            linear(d.k, L.k);
            linear(d.v, L.v);
        }
        linear(d.o, L.o);
        if (d.gate_up.w.data) {
            fused(d.gate_up, {&L.gate, &L.up});
        } else {
            linear(d.gate, L.gate);
            linear(d.up, L.up);
        }
        linear(d.down, L.down);
    }
    vec(inv_freq_, rope_inv_freq(rope_params(cfg_)));
    up.finish();
    // The decode GEMV's column order (kernels/cuda/interleave.h: its x loads coalesce) wherever
    // the shape allows; every kernel reading weights honours the flag. W8A8's INT8 GEMV reads x as
    // int8, already contiguous per lane, so its matrices keep the natural order; lm_head (and a
    // tied embedding) always goes through the W8A16 GEMV. W4A16's INT4 matrices are interleaved
    // where their groups hold whole 128-column blocks (AWQ's 128 do; 32 and 64 stay natural).
    if (!int8_acts_)
        for (CudaLayer& d : layers_)
            for (CudaLinear* l : {&d.qkv, &d.gate_up, &d.q, &d.k, &d.v, &d.o, &d.gate, &d.up, &d.down})
                if (l->w.data) gemv_interleave_cuda(l->w, stream_);
    const bool tied = lm_head_.data == embed_.data;
    gemv_interleave_cuda(lm_head_, stream_);
    if (tied) embed_.interleaved = lm_head_.interleaved;
    // The padding columns of the all-gather parts stay zero for the whole session.
    if (b_.padded)
        CUDA_CHECK(cudaMemsetAsync(b_.padded, 0, size_t(opt_.max_logit_rows * plan_.vocab_per_rank) * sizeof(float), stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaEngine::collective(std::function<void()> op) {
    if (recording_) recording_->cut(std::move(op));
    else op();
}

bool CudaEngine::norm_for(const CudaLinear& next, const float* delta, const float* w, int64_t T, bool sole) {
    const ModelConfig& c = cfg_;
    h_order_ = nullptr;
    // (An act-order projection quantizes its ordered input itself.)
    if (int8_product(next.w) && act_group(next.w) == c.hidden && !next.order) {
        add_rmsnorm_quantize_cuda(b_.x, delta, w, b_.h, T, c.hidden, c.rms_eps, b_.act_q, b_.act_scales, stream_);
        return true;
    }
    // An act-order projection that alone reads h_ takes the norm in its order: one kernel, not
    // two (not under LoRA, whose updates read h_ in its natural order).
    if (next.order && sole && !lora_step_ && next.order_width == c.hidden && next.w.cols == c.hidden) h_order_ = next.order;
    add_rmsnorm_cuda(b_.x, delta, w, b_.h, T, c.hidden, c.rms_eps, stream_, h_order_);
    return false;
}

HalfInput CudaEngine::shared_half_input(std::initializer_list<const CudaLinear*> ls, int64_t T) const {
    // (LoRA's update reads the products' f32 input: b_.h written.)
    if (T <= kGemvMaxTokens || ls.size() == 0 || lora_step_) return {};
    const HalfInput h = gemm_->input_for((*ls.begin())->w);
    for (const CudaLinear* l : ls) {
        const HalfInput o = gemm_->input_for(l->w);
        // (W8A8/W4A8 products take int8 activations, not this; act-order ones their gathered input.)
        if (!o.data || o.type != h.type || o.interleave_c != h.interleave_c || int8_product(l->w) || l->order)
            return {};
    }
    return h;
}

const float* CudaEngine::ordered_input(const CudaLinear& l, const float* x, int64_t T) {
    if (x == b_.h && h_order_) {  // the norm wrote it in its reader's order (norm_for)
        SHARDLM_CHECK(l.order == h_order_, "CudaEngine: a projection reads the norm written in another's order");
        return x;
    }
    if (!l.order) return x;
    const int64_t cols = l.w.cols, parts = l.order_width / cols;
    SHARDLM_CHECK(parts * cols == l.order_width && (parts == 1 || parts == plan_.tp), "CudaEngine: an act-order layer of ",
                  cols, " columns reads ", l.order_width, " elements over ", plan_.tp, " ranks");
    const float* src = x;
    if (parts > 1) {
        // A row-parallel layer split over ranks: its groups mix every rank's columns.
        float* all = b_.order_parts;
        collective([this, x, all, T, cols] { comm_.all_gather(x, size_t(T * cols) * sizeof(float), all); });
        src = all;
    }
    gather_columns_cuda(src, T, cols, parts, l.order, cols, b_.ordered, stream_);
    return b_.ordered;
}

void CudaEngine::linear(const CudaLinear& l, const float* x, int64_t T, float* y, bool int8_acts, bool acts_ready) {
    // x null: a cuBLAS product whose 16-bit input its producer wrote (shared_half_input).
    SHARDLM_CHECK(x || T > kGemvMaxTokens, "CudaEngine: a decode product without its input");
    if (int8_acts && int8_product(l.w)) {
        // W8A8/W4A8: the input quantized per token or group, then INT32 dot products.
        const int64_t cols = l.w.cols, g = act_group(l.w);
        if (!acts_ready) quantize_acts_cuda(x, T, cols, g, b_.act_q, b_.act_scales, stream_);
        const DeviceActs a{b_.act_q, b_.act_scales, T, cols, g};
        if (T > kGemvMaxTokens && l.w.dtype == DType::I4) {
            // W4A8 prefill on FP16 tensor cores (w4a8.h): the activations as quantized, dequantized.
            dequantize_acts_half_cuda(a, gemm_->input_for(l.w), stream_);
            gemm_->run(l.w, nullptr, T, l.bias, y);
        } else if (T > kGemvMaxTokens) {
            int8_gemm_->run(l.w, a, l.bias, y);
        } else if (l.w.dtype == DType::I4) {
            gemv_w4a8_cuda(l.w, a, l.bias, y, stream_);
        } else {
            gemv_w8a8_cuda(l.w, a, l.bias, y, stream_);
        }
        return;
    }
    // Decode: one pass over the weights for all token rows; prefill: cuBLAS tensor cores.
    if (T <= kGemvMaxTokens) {
        gemv_cuda(l.w, x, T, l.bias, y, stream_, gemv_default_grid());
        return;
    }
    if (staging_) {
        // The next layer matrix starts dequantizing now, beside this product (lm_head is left out:
        // a step's few logit rows take the GEMV).
        const auto it = read_pos_.find(l.w.data);
        if (it != read_pos_.end() && it->second + 1 < read_order_.size() && read_order_[it->second + 1] != &lm_head_)
            gemm_->stage(*read_order_[it->second + 1]);
    }
    gemm_->run(l.w, x, T, l.bias, y);
}

void CudaEngine::run_step(int64_t T, int64_t n_chunks, int64_t max_n, int64_t n_logits, bool head) {
    const ModelConfig& c = cfg_;
    const int64_t hd = c.head_dim, nh = plan_.n_q_heads, nkv = plan_.n_kv_heads;
    const StepTables tables = step_tables(b_.meta, opt_);
    const int32_t* ids = tables.ids;
    const int32_t* pos = tables.pos;
    const int32_t* slot = tables.slot;
    const int32_t* logit_rows = tables.logit_rows;
    const AttnChunk* chunks = tables.chunks;
    cudaStream_t s = stream_;
    const size_t act = size_t(T * c.hidden);
    // One-token decode steps at TP=1 with weight-only products: the norms run inside the next GEMV
    // and o_proj and down_proj add into the residual stream b_.x themselves (GemvFuse): no kernel
    // between two GEMVs. Only at one token: the H200 timed batch 1 faster and batch 4 slower
    // (2026-12-04, Qwen3-1.7B shape, ms/token fused vs norm kernels: FP16 batch 1 1.302 vs 1.357,
    // batch 4 1.839 vs 1.776; INT8 1.056 vs 1.084, 1.745 vs 1.682), where the per-token squares
    // and norm-weight products add to GEMVs that already spend most of their issue slots on FMAs.
    const bool fuse = norm_in_gemv(T) && !lora_step_;
    const GemvGrid grid = gemv_default_grid();

    // Prefill with staging: the first matrix starts dequantizing beside the embedding and the norm.
    if (staging_ && T > kGemvMaxTokens && !read_order_.empty() && read_order_[0] != &lm_head_)
        gemm_->stage(*read_order_[0]);
    // Vocab-parallel embedding: each rank fills the rows it holds, the all-reduce the rest.
    embedding_cuda(embed_, ids, T, plan_.vocab0, b_.x, s);
    if (plan_.tp > 1) collective([this, act] { comm_.all_reduce_sum(b_.x, act, DType::F32); });
    for (size_t l = 0; l < layers_.size(); ++l) {
        const CudaLayer& L = layers_[l];
        // The previous layer's MLP output joins the residual stream here, fused with the norm, which
        // writes the projections' 16-bit input itself where they run on cuBLAS.
        const float* d = l == 0 ? nullptr : b_.delta;
        bool qkv_half = false, qkv_ready = false;
        if (!fuse) {
            const HalfInput qkv_in =
                L.qkv.w.data ? shared_half_input({&L.qkv}, T) : shared_half_input({&L.q, &L.k, &L.v}, T);
            qkv_half = qkv_in.data && add_rmsnorm_half_cuda(b_.x, d, L.input_norm, T, c.hidden, c.rms_eps, qkv_in, s);
            qkv_ready = !qkv_half && norm_for(L.qkv.w.data ? L.qkv : L.q, d, L.input_norm, T, L.qkv.w.data != nullptr);
        }
        const float* qkv_x = qkv_half ? nullptr : b_.h;
        const GemvFuse in_norm{L.input_norm, c.rms_eps, false};
        auto qkv_proj = [&](const CudaLinear& lin, float* y, bool ready) {
            if (ablated(kAblateQkv)) return;
            if (fuse) gemv_cuda(lin.w, b_.x, T, lin.bias, y, in_norm, s, grid);
            else linear(lin, ordered_input(lin, qkv_x, T), T, y, true, ready);
        };
        RopeKVParams rp;
        if (L.qkv.w.data) {
            // One projection into [T, q | k | v]; RoPE reads the parts in place and writes q packed.
            const int64_t q_dim = nh * hd, kv_dim = nkv * hd;
            qkv_proj(L.qkv, b_.qkv, qkv_ready);
            if (!ablated(kAblateQkv)) {
                const int64_t w = q_dim + 2 * kv_dim;
                add_lora(int64_t(l), b_.h, T, c.hidden,
                         {{0, b_.qkv, q_dim, w}, {1, b_.qkv + q_dim, kv_dim, w}, {2, b_.qkv + q_dim + kv_dim, kv_dim, w}});
            }
            rp.q = b_.qkv;
            rp.k = b_.qkv + q_dim;
            rp.v = b_.qkv + q_dim + kv_dim;
            rp.row_stride = q_dim + 2 * kv_dim;
            rp.q_out = b_.q;
        } else {
            // q, k and v share one quantized input when they share its grouping (else each quantizes).
            qkv_proj(L.q, b_.q, qkv_ready);
            // (An act-order projection quantizes its gathered input itself.)
            qkv_proj(L.k, b_.k, qkv_ready && same_acts(L.k, L.q) && !L.k.order);
            qkv_proj(L.v, b_.v, qkv_ready && same_acts(L.v, L.q) && !L.v.order);
            if (!ablated(kAblateQkv)) {
                const int64_t q_dim = nh * hd, kv_dim = nkv * hd;
                add_lora(int64_t(l), b_.h, T, c.hidden,
                         {{0, b_.q, q_dim, q_dim}, {1, b_.k, kv_dim, kv_dim}, {2, b_.v, kv_dim, kv_dim}});
            }
            rp.q = b_.q;
            rp.k = b_.k;
            rp.v = b_.v;
        }
        rp.T = T;
        rp.n_heads = nh;
        rp.n_kv_heads = nkv;
        rp.head_dim = hd;
        rp.pos = pos;
        rp.slot = slot;
        rp.inv_freq = inv_freq_;
        rp.q_norm = L.q_norm;
        rp.k_norm = L.k_norm;
        rp.eps = c.rms_eps;
        rp.kv = kv_[l];
        // Decode may leave the prologue to the attention kernel (one launch less per layer).
        const bool fused_rope = max_n == 1 && opt_.attention != AttentionImpl::Naive && fused_rope_;
        if (!fused_rope && !ablated(kAblateAttention)) rope_kv_cuda(rp, s);
        AttentionCuda a;
        a.q = b_.q;
        a.out = b_.attn;
        a.chunks = chunks;
        a.n_chunks = n_chunks;
        a.max_chunk_n = max_n;
        a.n_heads = nh;
        a.n_kv_heads = nkv;
        a.head_dim = hd;
        a.scale = attention_scale(cfg_);
        a.window = layer_window(c, int64_t(l));
        a.kv = kv_[l];
        a.scratch = b_.attn_scratch;
        a.rope = fused_rope ? &rp : nullptr;
        if (!ablated(kAblateAttention))
            attention_cuda(a, opt_.attention == AttentionImpl::Naive ? AttentionKind::Naive : AttentionKind::Flash, s);
        if (fuse) {
            if (!ablated(kAblateO)) gemv_cuda(L.o.w, b_.attn, T, L.o.bias, b_.x, GemvFuse{nullptr, 0.0f, true}, s, grid);
            const GemvFuse post_norm{L.post_attn_norm, c.rms_eps, false};
            if (ablated(kAblateMlp)) continue;
            if (L.gate_up.w.data) {
                if (!gemv_swiglu_cuda(L.gate_up.w, b_.x, T, L.gate_up.bias, b_.gate, post_norm, s, grid)) {
                    gemv_cuda(L.gate_up.w, b_.x, T, L.gate_up.bias, b_.gate_up, post_norm, s, grid);
                    silu_mul_rows_cuda(b_.gate_up, T, plan_.n_inter, b_.gate, s);
                }
            } else {
                gemv_cuda(L.gate.w, b_.x, T, L.gate.bias, b_.gate, post_norm, s, grid);
                gemv_cuda(L.up.w, b_.x, T, L.up.bias, b_.up, post_norm, s, grid);
                silu_mul_cuda(b_.gate, b_.up, b_.gate, T * plan_.n_inter, s);
            }
            gemv_cuda(L.down.w, b_.gate, T, L.down.bias, b_.x, GemvFuse{nullptr, 0.0f, true}, s, grid);
            continue;
        }
        if (!ablated(kAblateO)) {
            linear(L.o, ordered_input(L.o, b_.attn, T), T, b_.delta);
            add_lora(int64_t(l), b_.attn, T, nh * hd, {{3, b_.delta, c.hidden, c.hidden}});
        }
        if (plan_.tp > 1) collective([this, act] { comm_.all_reduce_sum(b_.delta, act, DType::F32); });  // row-parallel o_proj
        const HalfInput mlp_in =
            L.gate_up.w.data ? shared_half_input({&L.gate_up}, T) : shared_half_input({&L.gate, &L.up}, T);
        const bool mlp_half =
            mlp_in.data && add_rmsnorm_half_cuda(b_.x, b_.delta, L.post_attn_norm, T, c.hidden, c.rms_eps, mlp_in, s);
        const float* mlp_x = mlp_half ? nullptr : b_.h;
        const bool mlp_ready = !mlp_half && norm_for(L.gate_up.w.data ? L.gate_up : L.gate, b_.delta, L.post_attn_norm, T,
                                                     L.gate_up.w.data != nullptr);
        if (L.gate_up.w.data && !ablated(kAblateMlp)) mlp_x = ordered_input(L.gate_up, mlp_x, T);
        if (ablated(kAblateMlp)) {
            if (plan_.tp > 1) collective([this, act] { comm_.all_reduce_sum(b_.delta, act, DType::F32); });
            continue;
        }
        bool down_ready = false;
        const float* down_x = b_.gate;
        if (L.gate_up.w.data) {
            // Decode: SwiGLU in the GEMV's epilogue (one kernel); else the projection, then SwiGLU.
            // (Not under LoRA: its update goes into gate and up before SwiGLU.)
            const bool fused = T <= kGemvMaxTokens && !int8_product(L.gate_up.w) && !lora_step_ &&
                               gemv_swiglu_cuda(L.gate_up.w, mlp_x, T, L.gate_up.bias, b_.gate, s);
            if (!fused) {
                linear(L.gate_up, mlp_x, T, b_.gate_up, true, mlp_ready);
                const int64_t inter = plan_.n_inter;
                add_lora(int64_t(l), b_.h, T, c.hidden,
                         {{4, b_.gate_up, inter, 2 * inter}, {5, b_.gate_up + inter, inter, 2 * inter}});
                // Under W8A8/W4A8 with per-token scales for down, SwiGLU quantizes its own output;
                // before a cuBLAS product it writes the product's 16-bit input.
                down_ready = int8_product(L.down.w) && act_group(L.down.w) == plan_.n_inter && !L.down.order;
                const HalfInput down_in = down_ready ? HalfInput{} : shared_half_input({&L.down}, T);
                if (down_ready) silu_mul_rows_quantize_cuda(b_.gate_up, T, plan_.n_inter, b_.gate, b_.act_q, b_.act_scales, s);
                else if (down_in.data && silu_mul_rows_half_cuda(b_.gate_up, T, plan_.n_inter, down_in, s)) down_x = nullptr;
                else silu_mul_rows_cuda(b_.gate_up, T, plan_.n_inter, b_.gate, s);
            }
        } else {
            // (Act-order: each gathers its own input, the two orders may differ.)
            linear(L.gate, ordered_input(L.gate, mlp_x, T), T, b_.gate, true, mlp_ready);
            linear(L.up, ordered_input(L.up, mlp_x, T), T, b_.up, true, mlp_ready && same_acts(L.up, L.gate) && !L.up.order);
            const int64_t inter = plan_.n_inter;
            add_lora(int64_t(l), b_.h, T, c.hidden, {{4, b_.gate, inter, inter}, {5, b_.up, inter, inter}});
            silu_mul_cuda(b_.gate, b_.up, b_.gate, T * plan_.n_inter, s);
        }
        linear(L.down, ordered_input(L.down, down_x, T), T, b_.delta, true, down_ready);
        add_lora(int64_t(l), b_.gate, T, plan_.n_inter, {{6, b_.delta, c.hidden, c.hidden}});
        if (plan_.tp > 1) collective([this, act] { comm_.all_reduce_sum(b_.delta, act, DType::F32); });  // row-parallel down_proj
    }
    // Final norm (with the last layer's residual) and lm_head on the wanted rows only.
    rmsnorm_rows_cuda(b_.x, layers_.empty() || fuse ? nullptr : b_.delta, logit_rows, n_logits, final_norm_, b_.last, c.hidden,
                      c.rms_eps, s);
    // (lm_head stays W8A16 under w8a8 and w4a8, as on the CPU.)
    if (head && plan_.n_vocab > 0 && !ablated(kAblateLmHead)) linear(CudaLinear{lm_head_, nullptr}, b_.last, n_logits, b_.local, false);
    // Under tensor parallelism each rank now holds its vocabulary slice's logits; forward() gathers
    // them, forward_top() only each slice's candidates.
}

int64_t CudaEngine::launch(const std::vector<SeqChunk>& chunks, bool head) {
    if (head && headless_) fail(headless_message());
    maybe_inject_failure(comm_, "forward");
    const StepShape shape = check_step(cfg_, opt_, chunks, /*hidden=*/!head);
    check_adapters(chunks, adapters_);
    seat_adapters(chunks);  // the step's adapters into device slots
    const int64_t T = shape.tokens, n = shape.logit_rows;
    if (T == 0) return 0;
    SHARDLM_CHECK(int64_t(chunks.size()) <= opt_.max_batch, "a step of ", chunks.size(),
                  " chunks exceeds the engine's ", opt_.max_batch, " slots");

    // The step's tables, in their pinned staging block.
    const StepTables tables = step_tables(meta_host_.as<int32_t>(), opt_);
    int32_t* ids = tables.ids;
    int32_t* pos = tables.pos;
    int32_t* slot = tables.slot;
    int32_t* adapter = tables.adapter;
    int32_t* logit_rows = tables.logit_rows;
    AttnChunk* table = tables.chunks;
    int64_t row = 0, r = 0, max_n = 0;
    lora_step_ = false;
    for (size_t i = 0; i < chunks.size(); ++i) {
        const SeqChunk& ch = chunks[i];
        table[i] = AttnChunk{int32_t(ch.slot), int32_t(ch.pos), int32_t(ch.n), int32_t(row)};
        for (int64_t j = 0; j < ch.n; ++j) {
            ids[row + j] = ch.tokens[j];
            pos[row + j] = int32_t(ch.pos + j);
            slot[row + j] = int32_t(ch.slot);
            adapter[row + j] = ch.adapter >= 0 ? int32_t(adapter_slot_[size_t(ch.adapter)]) : -1;  // its slot
        }
        lora_step_ = lora_step_ || ch.adapter >= 0;
        if (ch.all_logits)
            for (int64_t j = 0; j < ch.n; ++j) logit_rows[r++] = int32_t(row + j);
        else if (ch.want_logits)
            logit_rows[r++] = int32_t(row + ch.n - 1);
        row += ch.n;
        max_n = std::max(max_n, ch.n);
    }
    const int64_t B = int64_t(chunks.size());

    // The first step of a shape runs eagerly: it loads the kernels' modules and lets cuBLAS
    // initialise outside any capture. From the second on, the step is captured once and replayed.
    // Capture records, it does not run, so the tables are copied afterwards.
    const GraphKey key{T, B, max_n, n, head, lora_step_};
    auto it = graphs_.end();
    if (opt_.cuda_graphs && max_n <= kGraphMaxChunk && !eager_once_.insert(key).second) {
        it = graphs_.find(key);
        if (it == graphs_.end() && graphs_.size() < kMaxGraphs) {
            it = graphs_.emplace(key, std::make_unique<SegmentedGraph>()).first;
            SegmentedGraph& g = *it->second;
            recording_ = &g;
            try {
                g.begin(stream_);
                run_step(T, B, max_n, n, head);
                g.end();
            } catch (...) {
                g.abandon();
                recording_ = nullptr;
                graphs_.erase(it);
                throw;
            }
            recording_ = nullptr;
        }
    }
    if (it != graphs_.end()) {
        CUDA_CHECK(cudaMemcpyAsync(b_.meta, meta_host_.get(), b_.meta_bytes, cudaMemcpyHostToDevice, stream_));
        it->second->replay(stream_);
    } else {
        CUDA_CHECK(cudaMemcpyAsync(b_.meta, meta_host_.get(), b_.meta_bytes, cudaMemcpyHostToDevice, stream_));
        run_step(T, B, max_n, n, head);
    }
    // Token penalties on this rank's slice of the logits, eagerly after the step (never captured:
    // their count changes from step to step), before anything reads the rows.
    const std::vector<PenaltyEntry> pen = step_penalties(chunks);
    if (head && !pen.empty() && plan_.n_vocab > 0) {
        std::memcpy(penalty_host_.get(), pen.data(), pen.size() * sizeof(PenaltyEntry));
        CUDA_CHECK(cudaMemcpyAsync(b_.penalties, penalty_host_.get(), pen.size() * sizeof(PenaltyEntry),
                                   cudaMemcpyHostToDevice, stream_));
        apply_penalties_cuda(b_.local, plan_.n_vocab, int32_t(plan_.vocab0), b_.penalties, int64_t(pen.size()), stream_);
    }
    return n;
}

void CudaEngine::wait() {
    if (wait_) wait_();
    else CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaEngine::forward(const std::vector<SeqChunk>& chunks, float* logits) {
    const ModelConfig& c = cfg_;
    const int64_t n = launch(chunks);
    if (n == 0) return wait();
    const int tp = plan_.tp;
    const int64_t vpr = plan_.vocab_per_rank;
    float* host = logits_host_.as<float>();
    if (tp == 1) {
        CUDA_CHECK(cudaMemcpyAsync(host, b_.local, size_t(n * c.vocab) * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    } else {
        // Vocab-parallel lm_head: slices padded to vocab_per_rank so the all-gather parts are equal.
        if (plan_.n_vocab > 0)
            CUDA_CHECK(cudaMemcpy2DAsync(b_.padded, size_t(vpr) * sizeof(float), b_.local, size_t(plan_.n_vocab) * sizeof(float),
                                         size_t(plan_.n_vocab) * sizeof(float), size_t(n), cudaMemcpyDeviceToDevice, stream_));
        comm_.all_gather(b_.padded, size_t(n * vpr) * sizeof(float), b_.gathered);
        CUDA_CHECK(cudaMemcpyAsync(host, b_.gathered, size_t(tp * n * vpr) * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    wait();
    if (tp == 1) {
        std::memcpy(logits, host, size_t(n * c.vocab) * sizeof(float));
        return;
    }
    // [tp][n][vpr] -> [n][vocab]: rank r's slice holds vocabulary ids r*vpr ...
    for (int64_t i = 0; i < n; ++i)
        for (int rk = 0; rk < tp; ++rk) {
            const int64_t v0 = rk * vpr, nv = std::min(vpr, c.vocab - v0);
            if (nv <= 0) continue;
            const float* src = host + (int64_t(rk) * n + i) * vpr;
            std::copy(src, src + nv, logits + i * c.vocab + v0);
        }
}

void CudaEngine::forward_hidden(const std::vector<SeqChunk>& chunks, float* hidden) {
    const int64_t n = launch(chunks, /*head=*/false);
    // Every rank holds the whole normed rows: the all-reduces made the residual stream whole.
    if (n > 0)
        CUDA_CHECK(cudaMemcpyAsync(hidden, b_.last, size_t(n * cfg_.hidden) * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream_));
    wait();
}

// Eager, between steps (graphs hold positions as inputs, so none is re-captured), and waited for:
// a shift is rare (once per half a context) and its failure should name it.
void CudaEngine::set_ablation(uint32_t mask) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // no replay still runs on a graph about to go
    ablate_ = mask;
    graphs_.clear();
    eager_once_.clear();
}

namespace {

// The matrices an adapter may change, in the order of the slot table's middle index (add_lora's
// `which`).
constexpr LoraMatrix LoraLayer::*kLoraMatrices[] = {&LoraLayer::q,    &LoraLayer::k,  &LoraLayer::v,   &LoraLayer::o,
                                                    &LoraLayer::gate, &LoraLayer::up, &LoraLayer::down};
constexpr int64_t kLoraKinds = 7;

// An adapter's factors as one slot holds them: each matrix's A then Bt, at 256-byte offsets.
size_t padded_bytes(size_t n) { return (n + 255) / 256 * 256; }

size_t slot_layout_bytes(const LoraWeights& ad) {
    size_t bytes = 0;
    for (const LoraLayer& L : ad.layers)
        for (LoraMatrix LoraLayer::*which : kLoraMatrices) bytes += padded_bytes((L.*which).a.size()) + padded_bytes((L.*which).bt.size());
    return bytes;
}

}  // namespace

void CudaEngine::set_adapters(const std::vector<LoraWeights>* adapters) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // no step still reads the factors about to go
    graphs_.clear();  // their launches are sized by the largest rank, and read the slot table
    eager_once_.clear();
    auto reset = [this] {
        adapters_ = nullptr;
        lora_factors_.clear();
        lora_slots_ = DeviceBuffer();
        ws_bytes_ -= lora_t_.size();
        lora_t_ = DeviceBuffer();
        lora_targets_.assign(layers_.size() * kLoraKinds, false);
        lora_table_.clear();
        slot_adapter_.clear();
        adapter_slot_.clear();
        slot_used_.clear();
        lora_rank_ = 0;
        adapter_bytes_ = 0;
    };
    reset();
    if (!adapters || adapters->empty()) return;
    try {
        upload_adapters(*adapters);
    } catch (...) {
        reset();  // none rather than some: a step never reads a half-made table
        throw;
    }
}

void CudaEngine::upload_adapters(const std::vector<LoraWeights>& adapters) {
    adapters_ = &adapters;
    size_t biggest = 0;
    int64_t loaded = 0;
    for (const LoraWeights& ad : adapters) {
        if (ad.layers.empty()) continue;  // unloaded: its number stays, its chunks are refused
        SHARDLM_CHECK(ad.layers.size() == layers_.size(), "LoRA adapter ", ad.name, ": ", ad.layers.size(),
                      " layers for a model of ", layers_.size());
        ++loaded;
        lora_rank_ = std::max(lora_rank_, ad.max_rank);
        biggest = std::max(biggest, slot_layout_bytes(ad));
        for (size_t l = 0; l < ad.layers.size(); ++l)
            for (int64_t k = 0; k < kLoraKinds; ++k)
                if ((ad.layers[l].*kLoraMatrices[k]).rank > 0) {
                    lora_targets_[l * kLoraKinds + size_t(k)] = true;
                    lora_dtype_ = (ad.layers[l].*kLoraMatrices[k]).dtype;  // one type for all (lora_factor_dtype)
                }
    }
    if (loaded == 0) return;
    // One slot per loaded adapter, or EngineOptions::max_adapters of them, each as large as the
    // largest adapter.
    const int64_t slots = opt_.max_adapters > 0 ? std::min(opt_.max_adapters, loaded) : loaded;
    for (int64_t i = 0; i < slots; ++i) {
        try {
            lora_factors_.emplace_back(std::max<size_t>(biggest, 1));
        } catch (const Error& e) {
            fail("LoRA adapters on ", device_name_, " (rank ", comm_.rank(), "): slot ", i + 1, " of ", slots, " (",
                 biggest, " bytes, the largest adapter's factors", opt_.max_adapters > 0 ? "" : "; --max-loras keeps fewer",
                 "): ", e.what());
        }
    }
    adapter_bytes_ = size_t(slots) * biggest;
    lora_table_.assign(layers_.size() * kLoraKinds * size_t(slots), LoraSlot{});
    slot_adapter_.assign(size_t(slots), -1);
    adapter_slot_.assign(adapters.size(), -1);
    slot_used_.assign(size_t(slots), 0);
    const size_t table = lora_table_.size() * sizeof(LoraSlot);
    const size_t scratch = size_t(kLoraMaxParts * opt_.max_step_tokens * lora_rank_) * sizeof(float);
    try {
        lora_slots_ = DeviceBuffer(table);
        lora_t_ = DeviceBuffer(std::max<size_t>(scratch, sizeof(float)));
    } catch (const Error& e) {
        fail("LoRA adapters on ", device_name_, " (rank ", comm_.rank(), "): their table and scratch: ", e.what());
    }
    ws_bytes_ += lora_t_.size();
    // Every adapter has a slot: all of them now, in order. Else they come in as steps need them.
    if (slots == loaded) {
        int64_t slot = 0;
        for (size_t i = 0; i < adapters.size(); ++i)
            if (!adapters[i].layers.empty()) place_adapter(slot++, int64_t(i));
    }
    upload_slot_table();
}

void CudaEngine::upload_slot_table() {
    // (From pageable memory: staged before the call returns, so lora_table_ may change after.)
    CUDA_CHECK(cudaMemcpyAsync(lora_slots_.get(), lora_table_.data(), lora_table_.size() * sizeof(LoraSlot),
                               cudaMemcpyHostToDevice, stream_));
}

void CudaEngine::place_adapter(int64_t slot, int64_t adapter) {
    const LoraWeights& ad = (*adapters_)[size_t(adapter)];
    const int64_t slots = int64_t(slot_adapter_.size());
    if (slot_adapter_[size_t(slot)] >= 0) adapter_slot_[size_t(slot_adapter_[size_t(slot)])] = -1;
    // In stream order: the copies wait for the steps queued before, which may still read the slot.
    uint8_t* base = static_cast<uint8_t*>(lora_factors_[size_t(slot)].get());
    size_t at = 0;
    for (size_t l = 0; l < ad.layers.size(); ++l)
        for (int64_t k = 0; k < kLoraKinds; ++k) {
            const LoraMatrix& m = ad.layers[l].*kLoraMatrices[k];
            LoraSlot& e = lora_table_[(l * kLoraKinds + size_t(k)) * size_t(slots) + size_t(slot)];
            e = LoraSlot{};
            if (m.rank == 0) continue;
            e.a = base + at;
            CUDA_CHECK(cudaMemcpyAsync(base + at, m.a.data(), m.a.size(), cudaMemcpyHostToDevice, stream_));
            at += padded_bytes(m.a.size());
            e.bt = base + at;
            CUDA_CHECK(cudaMemcpyAsync(base + at, m.bt.data(), m.bt.size(), cudaMemcpyHostToDevice, stream_));
            at += padded_bytes(m.bt.size());
            e.rank = int32_t(m.rank);
        }
    slot_adapter_[size_t(slot)] = adapter;
    adapter_slot_[size_t(adapter)] = slot;
}

void CudaEngine::seat_adapters(const std::vector<SeqChunk>& chunks) {
    std::vector<int64_t> step;  // the step's adapters
    for (const SeqChunk& ch : chunks)
        if (ch.adapter >= 0 && std::find(step.begin(), step.end(), ch.adapter) == step.end()) step.push_back(ch.adapter);
    if (step.empty()) return;
    const int64_t slots = int64_t(slot_adapter_.size());
    if (int64_t(step.size()) > slots)
        fail("a step under ", step.size(), " LoRA adapters: ", device_name_, " holds ", slots,
             " at once (--max-loras; the batcher keeps to it)");
    ++lora_clock_;
    for (int64_t a : step)
        if (adapter_slot_[size_t(a)] >= 0) slot_used_[size_t(adapter_slot_[size_t(a)])] = lora_clock_;
    bool moved = false;
    for (int64_t a : step) {
        if (adapter_slot_[size_t(a)] >= 0) continue;
        // The least recently used slot: never one of this step's, whose marks are the clock's
        // newest (fewer than `slots` of them so far, as step <= slots).
        int64_t victim = 0;
        for (int64_t s = 1; s < slots; ++s)
            if (slot_used_[size_t(s)] < slot_used_[size_t(victim)]) victim = s;
        place_adapter(victim, a);
        slot_used_[size_t(victim)] = lora_clock_;
        ++lora_copies_;
        moved = true;
    }
    if (moved) upload_slot_table();
}

void CudaEngine::add_lora(int64_t layer, const float* x, int64_t T, int64_t in, std::initializer_list<LoraOut> outs) {
    if (!lora_step_) return;
    LoraParts parts;
    for (const LoraOut& o : outs) {
        const int64_t at = layer * kLoraKinds + o.which;
        if (!lora_targets_[size_t(at)]) continue;
        parts.p[parts.n++] =
            LoraPart{static_cast<const LoraSlot*>(lora_slots_.get()) + at * int64_t(slot_adapter_.size()), o.y, o.out, o.ldy};
    }
    if (parts.n == 0) return;
    lora_add_cuda(x, T, in, parts, step_tables(b_.meta, opt_).adapter, lora_dtype_, lora_rank_,
                  static_cast<float*>(lora_t_.get()), stream_);
}

std::string CudaEngine::gemv_kernels(int64_t tokens) const {
    return std::string(gemv_default_grid() == GemvGrid::Persistent ? "persistent" : "tiles") +
           (norm_in_gemv(tokens) ? "+norm" : "");
}

void CudaEngine::shift_kv(int64_t slot, int64_t keep, int64_t discard, int64_t len) {
    check_shift(cfg_, opt_, slot, keep, discard, len);
    for (const DeviceKVLayer& kv : kv_) kv_shift_cuda(kv, slot, keep, discard, len, cfg_.head_dim, inv_freq_, stream_);
    wait();
}

// Queued on the stream before the next step (which reads the rows); not waited for: a copy of a
// shared prefix happens at admissions, and two 2D copies per layer cost less than a sync.
void CudaEngine::copy_kv(int64_t src, int64_t dst, int64_t n) {
    check_copy(cfg_, opt_, src, dst, n);
    for (const DeviceKVLayer& kv : kv_) {
        // A slot's block is [n_kv_heads][capacity][row_stride]: positions [0, n) of every head are
        // n_kv_heads runs of n rows, one capacity of rows apart.
        const size_t row = size_t(kv.row_stride) * dtype_size(kv.dtype), pitch = size_t(kv.capacity) * row;
        const size_t slot_bytes = size_t(kv.n_kv_heads) * pitch;
        for (void* base : {kv.k, kv.v}) {
            uint8_t* b = static_cast<uint8_t*>(base);
            CUDA_CHECK(cudaMemcpy2DAsync(b + size_t(dst) * slot_bytes, pitch, b + size_t(src) * slot_bytes, pitch,
                                         size_t(n) * row, size_t(kv.n_kv_heads), cudaMemcpyDeviceToDevice, stream_));
        }
        if (kv.dtype != DType::I8) continue;
        const size_t spitch = size_t(kv.capacity) * sizeof(float), sslot = size_t(kv.n_kv_heads) * spitch;
        for (float* base : {kv.k_scales, kv.v_scales}) {
            uint8_t* b = reinterpret_cast<uint8_t*>(base);
            CUDA_CHECK(cudaMemcpy2DAsync(b + size_t(dst) * sslot, spitch, b + size_t(src) * sslot, spitch,
                                         size_t(n) * sizeof(float), size_t(kv.n_kv_heads), cudaMemcpyDeviceToDevice,
                                         stream_));
        }
    }
}

// The same rows as the CPU cache's (128-byte aligned, f32 scales for INT8): one formula for both.
size_t CudaEngine::kv_position_bytes() const {
    return shardlm::kv_position_bytes(kv_cache_shape(cfg_, plan_.n_kv_heads, opt_));
}

void CudaEngine::save_kv(int64_t slot, int64_t n, uint8_t* out) {
    check_kv_io(cfg_, opt_, slot, n, n);
    host_copy_kv(slot, n, out, n, true);
    wait();  // the caller reads `out` next
}

void CudaEngine::load_kv(int64_t slot, int64_t n, const uint8_t* in, int64_t saved) {
    check_kv_io(cfg_, opt_, slot, n, saved);
    host_copy_kv(slot, n, const_cast<uint8_t*>(in), saved, false);
    // Waited for too: the caller may free `in`, and a load is rare (a request whose prefix left
    // the slots), next to the prefill it saves.
    wait();
}

// The same 2D copies as copy_kv, one end in host memory: per layer, K then V, each its heads'
// rows, `stride` positions apart on the host (n of them move), then (INT8) their scales alike.
void CudaEngine::host_copy_kv(int64_t slot, int64_t n, uint8_t* host, int64_t stride, bool save) {
    // `heads` runs of `width` bytes, `pitch` apart at `dev` and `width / n * stride` on the host.
    auto move = [&](uint8_t* dev, size_t pitch, size_t width, int64_t heads) {
        const size_t hpitch = width / size_t(n) * size_t(stride);
        if (save)
            CUDA_CHECK(cudaMemcpy2DAsync(host, hpitch, dev, pitch, width, size_t(heads), cudaMemcpyDeviceToHost, stream_));
        else
            CUDA_CHECK(cudaMemcpy2DAsync(dev, pitch, host, hpitch, width, size_t(heads), cudaMemcpyHostToDevice, stream_));
        host += size_t(heads) * hpitch;
    };
    for (const DeviceKVLayer& kv : kv_) {
        const size_t row = size_t(kv.row_stride) * dtype_size(kv.dtype), pitch = size_t(kv.capacity) * row;
        const size_t spitch = size_t(kv.capacity) * sizeof(float);
        void* rows[2] = {kv.k, kv.v};
        float* scales[2] = {kv.k_scales, kv.v_scales};
        for (int i = 0; i < 2; ++i) {
            move(static_cast<uint8_t*>(rows[i]) + size_t(slot * kv.n_kv_heads) * pitch, pitch, size_t(n) * row,
                 kv.n_kv_heads);
            if (kv.dtype == DType::I8)
                move(reinterpret_cast<uint8_t*>(scales[i]) + size_t(slot * kv.n_kv_heads) * spitch, spitch,
                     size_t(n) * sizeof(float), kv.n_kv_heads);
        }
    }
}

static_assert(kTopKMax == kMaxTopCandidates, "the engine hands back what the GPU selection can select");

void CudaEngine::forward_top(const std::vector<SeqChunk>& chunks, int64_t k, float* vals, int32_t* ids) {
    top_candidates(chunks, k, vals, ids, nullptr, nullptr);
}

bool CudaEngine::forward_nucleus(const std::vector<SeqChunk>& chunks, int64_t k, float temperature, float* vals,
                                 int32_t* ids, uint64_t* mass) {
    if (cfg_.vocab > kNucleusMaxRow) return false;
    SHARDLM_CHECK(temperature > 0.0f, "forward_nucleus: temperature ", temperature);
    top_candidates(chunks, k, vals, ids, &temperature, mass);
    return true;
}

void CudaEngine::nucleus_row(int64_t row, float* logits) {
    SHARDLM_CHECK(row >= 0 && row < opt_.max_logit_rows, "nucleus_row: row ", row);
    // The step's logits stay in b_.local until the next step is launched (forward_nucleus waited).
    // Under tensor parallelism every rank asks for the same rows (their samplers see the same
    // candidates), so the row's slices are gathered as forward() gathers whole steps.
    const int64_t vpr = plan_.vocab_per_rank, nv = plan_.n_vocab;
    if (plan_.tp == 1) {
        CUDA_CHECK(cudaMemcpy(logits, b_.local + row * nv, size_t(nv) * sizeof(float), cudaMemcpyDeviceToHost));
        return;
    }
    if (nv > 0)
        CUDA_CHECK(cudaMemcpyAsync(b_.padded, b_.local + row * nv, size_t(nv) * sizeof(float), cudaMemcpyDeviceToDevice,
                                   stream_));
    comm_.all_gather(b_.padded, size_t(vpr) * sizeof(float), b_.gathered);
    float* host = logits_host_.as<float>();
    CUDA_CHECK(cudaMemcpyAsync(host, b_.gathered, size_t(plan_.tp * vpr) * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    wait();
    for (int rk = 0; rk < plan_.tp; ++rk) {
        const int64_t v0 = rk * vpr, n = std::min(vpr, cfg_.vocab - v0);
        if (n > 0) std::copy(host + rk * vpr, host + rk * vpr + n, logits + v0);
    }
}

void CudaEngine::top_candidates(const std::vector<SeqChunk>& chunks, int64_t k, float* vals, int32_t* ids,
                                const float* temperature, uint64_t* mass) {
    const ModelConfig& c = cfg_;
    SHARDLM_CHECK(k >= 1 && k <= std::min(c.vocab, kMaxTopCandidates), "forward_top: ", k, " candidates of ", c.vocab);
    const int64_t n = launch(chunks);
    if (n == 0) return wait();
    // Each rank ranks its own vocabulary slice: its first min(k, slice) candidates per row, packed
    // [n][kr] into the vals and ids halves of b_.top (ids already global). The global first k are
    // among the union of the slices' first k, so merging those gives exactly the full ranking's.
    const int tp = plan_.tp;
    auto slice = [&](int rk) { return std::clamp<int64_t>(c.vocab - rk * plan_.vocab_per_rank, 0, plan_.vocab_per_rank); };
    const int64_t kr = std::min(k, plan_.n_vocab);
    const size_t part = size_t(opt_.max_logit_rows * kMaxTopCandidates);  // elements of one half
    float* dv = reinterpret_cast<float*>(b_.top);
    int32_t* di = reinterpret_cast<int32_t*>(b_.top) + part;
    if (kr == 1)
        argmax_rows_cuda(b_.local, n, plan_.n_vocab, int32_t(plan_.vocab0), dv, di, stream_);
    else if (kr > 1)
        topk_rows_cuda(b_.local, n, plan_.n_vocab, kr, int32_t(plan_.vocab0), dv, di, b_.topk_scratch, stream_);
    const size_t part_bytes = 2 * part * sizeof(float);
    char* host = top_host_.as<char>();
    if (temperature && tp == 1) {  // each row's maximum is its first candidate
        nucleus_mass_rows_cuda(b_.local, n, c.vocab, dv, kr, *temperature, b_.mass, stream_);
        CUDA_CHECK(cudaMemcpyAsync(mass_host_.get(), b_.mass, size_t(n) * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                   stream_));
    }
    if (tp == 1) {  // just the rows asked for
        CUDA_CHECK(cudaMemcpyAsync(host, dv, size_t(n * kr) * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaMemcpyAsync(host + part * sizeof(float), di, size_t(n * kr) * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, stream_));
    } else {
        comm_.all_gather(b_.top, part_bytes, b_.top_gathered);
        CUDA_CHECK(cudaMemcpyAsync(host, b_.top_gathered, size_t(tp) * part_bytes, cudaMemcpyDeviceToHost, stream_));
    }
    wait();
    if (temperature && tp == 1) std::memcpy(mass, mass_host_.get(), size_t(n) * sizeof(uint64_t));
    std::vector<CandidateList> parts(static_cast<size_t>(tp));
    for (int64_t i = 0; i < n; ++i) {
        for (int rk = 0; rk < tp; ++rk) {
            const int64_t m = std::min(k, slice(rk));
            const char* base = host + size_t(rk) * part_bytes;
            parts[size_t(rk)] = {reinterpret_cast<const float*>(base) + i * m,
                                 reinterpret_cast<const int32_t*>(base) + part + i * m, m};
        }
        merge_candidates(parts, k, vals + i * k, ids + i * k);
    }
    if (temperature && tp > 1) {
        // Each rank weighs its slice against the row's maximum, the first merged candidate (the
        // same on every rank), and the ranks' integer sums are gathered and added: exact.
        float* maxes = mass_host_.as<float>() + size_t(tp * opt_.max_logit_rows) * 2;
        for (int64_t i = 0; i < n; ++i) maxes[i] = vals[i * k];
        CUDA_CHECK(cudaMemcpyAsync(b_.row_max, maxes, size_t(n) * sizeof(float), cudaMemcpyHostToDevice, stream_));
        if (plan_.n_vocab > 0)
            nucleus_mass_rows_cuda(b_.local, n, plan_.n_vocab, b_.row_max, 1, *temperature, b_.mass, stream_);
        else
            CUDA_CHECK(cudaMemsetAsync(b_.mass, 0, size_t(n) * sizeof(uint64_t), stream_));
        comm_.all_gather(b_.mass, size_t(n) * sizeof(uint64_t), b_.mass_gathered);
        uint64_t* h = mass_host_.as<uint64_t>();
        CUDA_CHECK(cudaMemcpyAsync(h, b_.mass_gathered, size_t(tp * n) * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                   stream_));
        wait();
        for (int64_t i = 0; i < n; ++i) {
            mass[i] = 0;
            for (int rk = 0; rk < tp; ++rk) mass[i] += h[rk * n + i];
        }
    }
}

}  // namespace shardlm
