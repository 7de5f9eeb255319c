#include "runtime/awq.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "comm/communicator.h"
#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"
#include "runtime/cpu_engine.h"
#include "runtime/session.h"

namespace shardlm {
namespace {

using Input = CpuEngine::LinearInput;

// Calibration statistics of one group input: every row's |x| summed per channel, the Gram
// matrices x^T x of every group of `group` columns over all rows (for the clipping search), and
// the first max_rows rows kept for the scale search's loss.
struct Acts {
    std::vector<double> abs_sum;
    std::vector<double> gram;  // [cols / group][group * group]
    int64_t rows = 0, cols = 0, max_rows = 0, group = 0;
    std::vector<float> kept;  // [kept_rows, cols]

    void add(const float* x, int64_t T, int64_t c) {
        if (abs_sum.empty()) {
            abs_sum.assign(size_t(c), 0.0), cols = c;
            if (c % group == 0) gram.assign(size_t(c * group), 0.0);
        }
        for (int64_t t = 0; t < T; ++t) {
            const float* r = x + t * c;
            for (int64_t i = 0; i < c; ++i) abs_sum[size_t(i)] += std::fabs(r[i]);
            if (int64_t(kept.size()) / c < max_rows) kept.insert(kept.end(), r, r + c);
        }
        if (!gram.empty()) {
#pragma omp parallel for schedule(static)
            for (int64_t k = 0; k < c / group; ++k) {
                double* G = gram.data() + k * group * group;
                for (int64_t t = 0; t < T; ++t) {
                    const float* r = x + t * c + k * group;
                    for (int64_t i = 0; i < group; ++i)
                        for (int64_t j = 0; j < group; ++j) G[i * group + j] += double(r[i]) * r[j];
                }
            }
        }
        rows += T;
    }
    int64_t kept_rows() const { return cols ? int64_t(kept.size()) / cols : 0; }
};

// sum over the rows of X of ||X (W - Q(W diag(s)) diag(s)^-1)^T||^2 for one matrix.
double scaled_loss(const WeightView& w, const std::vector<float>& s, int64_t group, const Acts& a,
                   std::vector<float>& scratch) {
    const int64_t rows = w.rows, cols = w.cols;
    std::vector<float>& ws = scratch;
    ws.resize(size_t(rows * cols));
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
        weight_row_to_f32(w, r, row.data());
        for (int64_t c = 0; c < cols; ++c) ws[size_t(r * cols + c)] = row[size_t(c)] * s[size_t(c)];
    }
    const int64_t ng = cols / group;
    std::vector<uint8_t> q(size_t(rows * cols / 2));
    std::vector<float> sc(size_t(rows * ng)), mn(sc.size());
    quantize_weights_int4(WeightView{DType::F32, ws.data(), rows, cols}, group, q.data(), sc.data(), mn.data());
    // ws := W - dequant / s (the error the layer's output sees), row by row.
    const WeightView wq = int4_weight_view(q.data(), sc.data(), mn.data(), rows, cols, group);
    std::vector<float> orig(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
        weight_row_to_f32(wq, r, row.data());
        weight_row_to_f32(w, r, orig.data());
        for (int64_t c = 0; c < cols; ++c) ws[size_t(r * cols + c)] = orig[size_t(c)] - row[size_t(c)] / s[size_t(c)];
    }
    const int64_t T = a.kept_rows();
    std::vector<float> y(size_t(T * rows));
    matmul(a.kept.data(), T, WeightView{DType::F32, ws.data(), rows, cols}, nullptr, y.data());
    double loss = 0;
    for (float v : y) loss += double(v) * v;
    return loss;
}

// AWQ's clipping search for one matrix, on its columns scaled by s: per row and group, the
// fraction of the group's max |w| to clamp to (1, 0.95, .. 0.55) whose INT4 error e (against the
// unclipped weights) has the least e^T G e, G the group's Gram matrix of the scaled calibration
// inputs (= the squared output error over those rows). Returns the ratios [rows * groups] and
// adds the loss before and after to *before, *after.
std::vector<float> search_clip(const WeightView& w, const std::vector<float>& s, int64_t group,
                               const std::vector<std::vector<float>>& gram, double* before, double* after) {
    const int64_t rows = w.rows, cols = w.cols, ng = cols / group;
    std::vector<float> ratios(size_t(rows * ng), 1.0f);
    double b = 0, a = 0;
#pragma omp parallel reduction(+ : b, a)
    {
        std::vector<float> row(static_cast<size_t>(cols)), wc(static_cast<size_t>(group)), e(static_cast<size_t>(group));
        std::vector<uint8_t> q(static_cast<size_t>(group));
#pragma omp for schedule(dynamic, 16)
        for (int64_t r = 0; r < rows; ++r) {
            weight_row_to_f32(w, r, row.data());
            for (int64_t c = 0; c < cols; ++c) row[size_t(c)] *= s[size_t(c)];
            for (int64_t k = 0; k < ng; ++k) {
                const float* x = row.data() + k * group;
                const std::vector<float>& G = gram[size_t(k)];
                float amax = 0.0f;
                for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[i]));
                double best = -1;
                for (int step = 0; step < 10; ++step) {
                    const float ratio = 1.0f - 0.05f * float(step), m = amax * ratio;
                    for (int64_t i = 0; i < group; ++i) wc[size_t(i)] = std::clamp(x[i], -m, m);
                    const Int4Group p = quantize_group_int4(wc.data(), group, q.data());
                    for (int64_t i = 0; i < group; ++i) e[size_t(i)] = x[i] - (float(q[size_t(i)]) * p.scale + p.min());
                    double loss = 0;
                    for (int64_t i = 0; i < group; ++i) {
                        float gi = 0;  // 128-term sums: float is plenty, and vectorises
                        const float* Gi = G.data() + i * group;
                        for (int64_t j = 0; j < group; ++j) gi += Gi[j] * e[size_t(j)];
                        loss += gi * e[size_t(i)];
                    }
                    if (step == 0) b += loss;
                    if (best < 0 || loss < best) best = loss, ratios[size_t(r * ng + k)] = ratio;
                }
                a += best;
            }
        }
    }
    *before += b;
    *after += a;
    return ratios;
}

// The Gram matrices of the calibration inputs divided by s: G_ij / (s_i s_j), per column group.
std::vector<std::vector<float>> group_grams(const Acts& a, const std::vector<float>& s, int64_t group) {
    const int64_t ng = a.cols / group;
    std::vector<std::vector<float>> grams(size_t(ng), std::vector<float>(size_t(group * group)));
    for (int64_t k = 0; k < ng; ++k)
        for (int64_t i = 0; i < group; ++i)
            for (int64_t j = 0; j < group; ++j)
                grams[size_t(k)][size_t(i * group + j)] =
                    float(a.gram[size_t((k * group + i) * group + j)] / (double(s[size_t(k * group + i)]) * s[size_t(k * group + j)]));
    return grams;
}

}  // namespace

ChannelScales awq_scales(const std::string& model_dir, const std::vector<int32_t>& calib, const AwqOptions& opt,
                         std::vector<AwqGroup>* report) {
    if (calib.empty()) fail("--calib: no calibration tokens");
    if (opt.grid < 1) fail("AWQ grid must be at least 1");
    if (!opt.keep_fp16.empty()) check_keep_fp16(opt.keep_fp16);  // matched below, after the load and the forward pass
    SessionOptions so;
    so.model_dir = model_dir;
    so.load.format = WeightFormat::F32;
    so.load.lora = opt.lora;
    so.kv = KVFormat::F32;
    so.device = Device::Cpu;
    SingleRank comm;
    const ModelConfig probe_cfg = load_config(model_dir);
    so.ctx = std::min<int64_t>(opt.ctx, probe_cfg.max_position > 0 ? probe_cfg.max_position : opt.ctx);
    so.prefill_chunk = so.ctx;
    so.max_logit_rows = 1;
    for (int32_t id : calib)  // before the load
        if (id < 0 || id >= probe_cfg.vocab) fail("--calib: token id ", id, " outside the vocabulary [0, ", probe_cfg.vocab, ")");
    auto s = open_session(so, comm);
    const ModelConfig& c = s->cfg;
    auto* eng = dynamic_cast<CpuEngine*>(s->engine.get());
    SHARDLM_CHECK(eng, "AWQ calibration runs on the CPU engine");

    // The float model over the calibration text, window by window, recording every group input.
    std::vector<std::vector<Acts>> acts(size_t(c.n_layers), std::vector<Acts>(4));
    for (auto& l : acts)
        for (auto& a : l) a.max_rows = opt.max_loss_rows, a.group = opt.group_size;
    // o_proj is scaled only when every query head has its own KV head (see awq.h): otherwise its
    // input is not recorded at all.
    const bool mha = c.n_heads == c.n_kv_heads;
    eng->set_probe([&](int64_t layer, Input which, const float* x, int64_t T, int64_t cols) {
        if (which == Input::O && !mha) return;
        acts[size_t(layer)][size_t(which)].add(x, T, cols);
    });
    std::vector<float> logits(size_t(c.vocab));
    for (size_t w0 = 0; w0 < calib.size(); w0 += size_t(so.ctx)) {
        SeqChunk ch;
        ch.tokens = calib.data() + w0;
        ch.n = std::min<int64_t>(so.ctx, int64_t(calib.size() - w0));
        ch.pos = 0;
        eng->forward({ch}, logits.data());
    }
    eng->set_probe(nullptr);

    std::regex keep;
    if (!opt.keep_fp16.empty()) keep = std::regex(opt.keep_fp16, std::regex::ECMAScript);
    auto kept = [&](const Linear& l) { return !opt.keep_fp16.empty() && std::regex_search(l.name, keep); };

    ChannelScales out;
    std::vector<float> scratch;
    for (int64_t li = 0; li < c.n_layers; ++li) {
        const LayerWeights& L = s->weights.layers[size_t(li)];
        const std::string pre = "model.layers." + std::to_string(li);
        struct Group {
            const char* which;
            Input input;
            std::vector<const Linear*> mats;
            const Linear* prev;        // the Linear whose output rows take 1/s (or null)
            std::string prev_norm;     // else the norm weight that does
        };
        std::vector<Group> groups = {
            {"qkv", Input::Qkv, {&L.q, &L.k, &L.v}, nullptr, pre + ".input_layernorm.weight"},
            {"gate_up", Input::GateUp, {&L.gate, &L.up}, nullptr, pre + ".post_attention_layernorm.weight"},
            {"down", Input::Down, {&L.down}, &L.up, ""},
        };
        if (mha) groups.push_back({"o", Input::O, {&L.o}, &L.v, ""});
        for (const Group& g : groups) {
            bool skip = g.prev && kept(*g.prev);
            for (const Linear* m : g.mats) skip = skip || kept(*m);
            const Acts& a = acts[size_t(li)][size_t(g.input)];
            const int64_t cols = g.mats[0]->w.cols;
            if (skip || a.rows == 0 || cols % opt.group_size != 0) continue;
            std::vector<float> mean(static_cast<size_t>(cols));
            for (int64_t i = 0; i < cols; ++i) mean[size_t(i)] = float(a.abs_sum[size_t(i)] / double(a.rows));
            AwqGroup best{li, g.which, 0.0f, 0.0, 0.0};
            std::vector<float> best_s(size_t(cols), 1.0f), sv(static_cast<size_t>(cols));
            for (int k = 0; k < opt.grid; ++k) {
                const float alpha = float(k) / float(opt.grid);
                float lo = INFINITY, hi = 0;
                for (int64_t i = 0; i < cols; ++i) {
                    sv[size_t(i)] = k == 0 ? 1.0f : std::max(std::pow(mean[size_t(i)], alpha), 1e-4f);
                    lo = std::min(lo, sv[size_t(i)]);
                    hi = std::max(hi, sv[size_t(i)]);
                }
                const float norm = std::sqrt(lo * hi);
                if (k > 0)
                    for (float& v : sv) v /= norm;
                double loss = 0;
                for (const Linear* m : g.mats) loss += scaled_loss(m->w, sv, opt.group_size, a, scratch);
                if (k == 0) best.loss_rtn = best.loss = loss;
                if (loss < best.loss) best.loss = loss, best.alpha = alpha, best_s = sv;
            }
            if (opt.clip) {
                const auto grams = group_grams(a, best_s, opt.group_size);
                for (const Linear* m : g.mats) {
                    std::vector<float> r = search_clip(m->w, best_s, opt.group_size, grams, &best.clip_before, &best.clip_after);
                    if (std::any_of(r.begin(), r.end(), [](float v) { return v < 1.0f; })) out.clip[m->name] = std::move(r);
                }
            }
            if (report) report->push_back(best);
            if (best.alpha == 0.0f) continue;  // no scaling beat round-to-nearest
            for (const Linear* m : g.mats) out.in[m->name] = best_s;
            if (g.prev) {
                out.out[g.prev->name] = best_s;
                if (!g.prev->bias.empty()) out.out[g.prev->name.substr(0, g.prev->name.size() - 7) + ".bias"] = best_s;
            } else {
                out.out[g.prev_norm] = best_s;
            }
        }
    }
    return out;
}

}  // namespace shardlm
