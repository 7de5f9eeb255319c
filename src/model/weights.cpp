#include "model/weights.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/mmap_file.h"
#include "kernels/cpu/quantize.h"
#include "model/hf_quant.h"

namespace shardlm {

WeightFormat parse_weight_format(const std::string& s) {
    if (s == "auto") return WeightFormat::Auto;
    if (s == "fp32" || s == "f32") return WeightFormat::F32;
    if (s == "fp16" || s == "f16") return WeightFormat::F16;
    if (s == "bf16") return WeightFormat::BF16;
    if (s == "int8") return WeightFormat::Int8;
    if (s == "w8a8") return WeightFormat::W8A8;
    if (s == "int4") return WeightFormat::Int4;
    if (s == "w4a8") return WeightFormat::W4A8;
    fail("--weights: unknown format \"", s, "\" (supported: auto, fp32, fp16, bf16, int8, w8a8, int4, w4a8)");
}

const char* weight_format_name(WeightFormat f) {
    switch (f) {
        case WeightFormat::Auto: return "auto";
        case WeightFormat::F32: return "fp32";
        case WeightFormat::F16: return "fp16";
        case WeightFormat::BF16: return "bf16";
        case WeightFormat::Int8: return "int8";
        case WeightFormat::W8A8: return "w8a8";
        case WeightFormat::Int4: return "int4";
        case WeightFormat::W4A8: return "w4a8";
    }
    return "?";
}

void check_keep_fp16(const std::string& re, const std::string& what) {
    try {
        const std::regex compiled(re, std::regex::ECMAScript);
        (void)compiled;
    } catch (const std::regex_error& e) {
        fail(what, ": invalid regex \"", re, "\": ", e.what());
    }
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Tensor names in natural order: runs of digits compare as numbers, so model.layers.4 comes
// before model.layers.10 (plain string order puts "1" before "4"). Names equal that way (leading
// zeros) fall back to string order, which keeps the order total.
bool natural_less(const std::string& a, const std::string& b) {
    auto digit = [](char c) { return c >= '0' && c <= '9'; };
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        if (digit(a[i]) && digit(b[j])) {
            size_t ie = i, je = j;
            while (ie < a.size() && digit(a[ie])) ++ie;
            while (je < b.size() && digit(b[je])) ++je;
            size_t iz = i, jz = j;  // past the leading zeros: more digits left is the larger number
            while (iz + 1 < ie && a[iz] == '0') ++iz;
            while (jz + 1 < je && b[jz] == '0') ++jz;
            if (ie - iz != je - jz) return ie - iz < je - jz;
            const int c = a.compare(iz, ie - iz, b, jz, je - jz);
            if (c != 0) return c < 0;
            i = ie, j = je;
        } else {
            if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
            ++i, ++j;
        }
    }
    if (i < a.size() || j < b.size()) return j < b.size();  // a ran out first: a prefix of b
    return a < b;
}

// " (layer 5; num_hidden_layers is 4)" for a tensor of a layer the config does not have, else "".
std::string layer_hint(const std::string& name, int64_t n_layers) {
    const std::string prefix = "model.layers.";
    if (name.compare(0, prefix.size(), prefix) != 0) return "";
    const int64_t layer = std::atoll(name.c_str() + prefix.size());
    return layer < n_layers ? "" : cat(" (layer ", layer, "; num_hidden_layers is ", n_layers, ")");
}

float element_f32(const TensorInfo& t, size_t i) {
    const uint8_t* p = t.data + i * dtype_size(t.dtype);
    switch (t.dtype) {
        case DType::F16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); }
        case DType::BF16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); }
        default: { float f; std::memcpy(&f, p, 4); return f; }
    }
}

void store(DType dt, uint8_t* dst, int64_t i, float f) {
    switch (dt) {
        case DType::F32: reinterpret_cast<float*>(dst)[i] = f; break;
        case DType::F16: reinterpret_cast<uint16_t*>(dst)[i] = f32_to_f16(f); break;
        default: reinterpret_cast<uint16_t*>(dst)[i] = f32_to_bf16(f); break;
    }
}

// A block [row0, row0 + nrows) x [col0, col0 + ncols) of a matrix, in checkpoint coordinates.
struct Block {
    int64_t rows, cols;  // the full matrix
    int64_t row0 = 0, nrows = -1, col0 = 0, ncols = -1;
};

// Builds the views of one rank's weights. A planning Loader runs the same validations and sums
// the bytes the conversions would allocate (converted()), but allocates, reads and converts
// nothing: the views it hands out are placeholders, to be discarded.
class Loader {
public:
    Loader(const Checkpoint& ckpt, const ModelConfig& cfg, const LoadOptions& opt, ModelWeights& out, bool planning)
        : ckpt_(ckpt), cfg_(cfg), opt_(opt), out_(out), planning_(planning) {
        // A pre-quantized checkpoint's float Linear tensors are those its recorded regex kept; in
        // an AWQ or GPTQ checkpoint they are the ones stored float, and --keep-fp16 picks which of
        // those (the vocabulary matrix) stay float.
        const bool ours = cfg.quant.present && cfg.quant.method == QuantMethod::Shardlm;
        const std::string& keep = ours ? cfg.quant.keep_fp16 : opt.keep_fp16;
        if (!keep.empty()) {
            check_keep_fp16(keep, ours ? ckpt.dir() + "/config.json: quantization_config keep_fp16"
                                                    : std::string("--keep-fp16"));
            keep_ = std::regex(keep, std::regex::ECMAScript);
            has_keep_ = true;
        }
        if (!opt.lora.empty()) {
            if (cfg.quant.present)
                fail("--lora: adapters merge into float weights, and ", ckpt.dir(), " is pre-quantized (",
                     quant_method_name(cfg.quant.method), "); load its float checkpoint (--weights int8 etc. quantize "
                     "the merged weights)");
            lora_ = std::make_unique<LoraSet>(opt.lora, ckpt, cfg);
        }
        if (cfg.quant.present) {
            if (!opt.scales.empty()) fail(ckpt.dir(), ": channel scales (AWQ) apply to float checkpoints, not a pre-quantized one");
            const bool int4 = cfg.quant.format == "int4" || cfg.quant.format == "w4a8";
            if (opt.format != WeightFormat::Auto && (int4 ? !is_int4(opt.format) : !is_int8(opt.format)))
                fail(ckpt.dir(), ": the checkpoint is pre-quantized (", cfg.quant.format, "); use --weights auto",
                     int4 ? ", int4 or w4a8" : ", int8 or w8a8");
            if (opt.group_size != 0 && opt.group_size != cfg.quant.group_size)
                fail("--group-size ", opt.group_size, " differs from the pre-quantized checkpoint's ", cfg.quant.group_size);
            if (ours && !opt.keep_fp16.empty() && opt.keep_fp16 != cfg.quant.keep_fp16)
                fail("--keep-fp16 \"", opt.keep_fp16, "\" differs from the pre-quantized checkpoint's \"", cfg.quant.keep_fp16,
                     "\" (quantize the float checkpoint again to change it)");
            out.format = opt.format != WeightFormat::Auto ? opt.format
                         : cfg.quant.format == "w4a8"     ? WeightFormat::W4A8
                         : int4                           ? WeightFormat::Int4
                         : cfg.quant.format == "w8a8"     ? WeightFormat::W8A8
                                                          : WeightFormat::Int8;
            out.group_size = cfg.quant.group_size;
        } else {
            // --weights auto keeps a float checkpoint as stored: the quantization flags would do nothing.
            if (opt.format == WeightFormat::Auto && (opt.group_size != 0 || !opt.keep_fp16.empty()))
                fail(opt.group_size != 0 ? "--group-size" : "--keep-fp16", " needs quantized weights, but ", ckpt.dir(),
                     " holds float weights that --weights auto keeps as stored; add --weights int8, w8a8, int4 or w4a8");
            out.format = opt.format;
            out.group_size = is_int4(opt.format) && opt.group_size == 0 ? kInt4DefaultGroup : opt.group_size;
            if (opt.group_size < 0) fail("--group-size must be >= 0");
            const int64_t g = out.group_size;
            if (is_int4(opt.format) && g % 32 != 0)
                fail("--group-size ", g, ": ", weight_format_name(opt.format), " groups are a multiple of 32 columns");
            if (is_quantized(opt.format) && g > 0 &&
                (cfg.hidden % g != 0 || cfg.intermediate % g != 0 || (cfg.n_heads * cfg.head_dim) % g != 0))
                fail("--group-size ", g, " does not divide the input dimensions (hidden_size ", cfg.hidden,
                     ", intermediate_size ", cfg.intermediate, ", heads x head_dim ", cfg.n_heads * cfg.head_dim, ")");
        }
    }

    // Every tensor the model reads goes through here, so that check_all_read() can find the rest.
    const TensorInfo& get(const std::string& name) {
        read_.insert(name);
        return ckpt_.get(name);
    }

    // A checkpoint tensor the config leaves unread means the two do not describe the same model
    // (a config with fewer layers, or without the biases the checkpoint holds). Skipped on purpose:
    // rotary inv_freq buffers (older HF Llama checkpoints; recomputed from rope_theta) and, with
    // tied embeddings, an lm_head.weight (the embedding is the truth).
    // The one named is the first in natural order (natural_less): the lowest layer the config lacks.
    // A model loaded without lm_head (ModelWeights::headless): an untied causal LM whose
    // checkpoint has no lm_head.weight, loaded for embeddings (LoadOptions::headless_ok), or a
    // base or sequence-classification model (which build() lets load only then).
    bool headless() const {
        return cfg_.head != Head::CausalLM || (opt_.headless_ok && !ckpt_.find("lm_head.weight"));
    }
    bool headless_ok() const { return opt_.headless_ok; }
    const std::string& dir() const { return ckpt_.dir(); }

    void check_all_read() const {
        const std::string* first = nullptr;
        const TensorInfo* info = nullptr;
        for (const auto& [name, t] : ckpt_.tensors()) {
            if (read_.count(name) || ends_with(name, ".rotary_emb.inv_freq") || (cfg_.tie_embeddings && name == "lm_head.weight"))
                continue;
            if (!first || natural_less(name, *first)) first = &name, info = t;
        }
        if (first)
            fail(info->file, ": tensor ", info->name, " is not part of the model ", ckpt_.dir(), "/config.json describes",
                 layer_hint(*first, cfg_.n_layers), "; the checkpoint does not match its config");
    }

    // Every adapter factor found its base tensor in the model (LoraSet checked that the tensor is
    // in the checkpoint; this, that the model reads it as a matrix).
    void check_lora_merged() const {
        if (!lora_) return;
        for (const std::string& t : lora_->targets())
            if (!lora_merged_.count(t))
                fail("--lora ", lora_->find(t)->front().adapter, ": ", t, " is not a matrix the model reads; nothing merged");
    }

    const TensorInfo& tensor(const std::string& name, const std::vector<int64_t>& shape,
                             std::initializer_list<DType> dtypes = {DType::F32, DType::F16, DType::BF16}) {
        const TensorInfo& t = get(name);
        if (!t.dtype_known || std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) {
            std::string want;
            for (DType d : dtypes) want += std::string(want.empty() ? "" : ", ") + dtype_name(d);
            fail(t.file, ": tensor ", name, " has dtype ", t.dtype_str, " (expected ", want, ")");
        }
        if (t.shape != shape) {
            TensorInfo want;
            want.shape = shape;
            fail(t.file, ": tensor ", name, " has shape ", t.shape_str(), ", expected ", want.shape_str());
        }
        return t;
    }

    // LoadOptions::scales of a tensor [rows, cols] (a vector: rows = its length, cols = 1), and
    // an FP8 matrix's block scales (ModelConfig::fp8).
    struct Scaling {
        const float* in = nullptr;   // per column: multiply
        const float* out = nullptr;  // per row: divide
        const uint8_t* fp8 = nullptr;  // the scales of the FP8 codes, [ceil(rows / br), ceil(cols / bc)]
        DType fp8_dtype = DType::F32;
        int64_t br = 0, bc = 0;
        bool lora = false;                        // LoRA factors merge into it
        std::shared_ptr<const LoraDelta> delta;   // their f32 copies (not made when planning)
        bool any() const { return in || out || fp8 || lora; }
    };
    Scaling scaling(const std::string& name, int64_t rows, int64_t cols) {
        Scaling s;
        const TensorInfo& t = ckpt_.get(name);
        if (is_fp8(t)) {
            // Its scales: one per block of br x bc (0: the whole dimension), shaped
            // [ceil(rows / br), ceil(cols / bc)] ([rows, 1] per channel; [1] or [] per tensor).
            const Fp8Weights& f = cfg_.fp8;
            s.br = f.block_rows > 0 ? f.block_rows : rows;
            s.bc = f.block_cols > 0 ? f.block_cols : cols;
            const std::string sname = name + f.scale_suffix;
            std::vector<int64_t> shape{(rows + s.br - 1) / s.br, (cols + s.bc - 1) / s.bc};
            if (f.block_rows == 0 && f.block_cols == 0) shape = get(sname).shape.empty() ? std::vector<int64_t>{} : std::vector<int64_t>{1};
            const TensorInfo& st = tensor(sname, shape);
            s.fp8 = st.data;
            s.fp8_dtype = st.dtype;
        }
        auto find = [&](const std::map<std::string, std::vector<float>>& m, int64_t n, const char* what) -> const float* {
            auto it = m.find(name);
            if (it == m.end()) return nullptr;
            if (int64_t(it->second.size()) != n)
                fail(name, ": ", it->second.size(), " channel scales for its ", n, " ", what);
            return it->second.data();
        };
        s.in = find(opt_.scales.in, cols, "columns");
        s.out = find(opt_.scales.out, rows, "rows");
        if (lora_ && lora_->find(name)) {
            s.lora = true;
            lora_merged_.insert(name);
            if (!planning_) s.delta = std::make_shared<const LoraDelta>(lora_->delta(name, rows, cols));
        }
        return s;
    }
    // Element (r, c) of a [rows, cols] tensor (full coordinates) as f32, scaled.
    static float at(const TensorInfo& t, const Scaling& s, int64_t r, int64_t c, int64_t cols) {
        float v = element_f32(t, size_t(r * cols + c));
        if (s.in) v *= s.in[c];
        if (s.out) v /= s.out[r];
        return v;
    }

    // Columns [c0, c1) of row r of a [rows, cols] f32/f16/bf16 tensor as f32, scaled as `at` does,
    // into out[0..c1 - c0): one dtype switch per row, so the loops vectorise (the loader's
    // conversions run at memory speed, threaded over rows; it never throws).
    static void row_f32(const TensorInfo& t, const Scaling& s, int64_t r, int64_t c0, int64_t c1, int64_t cols,
                        float* out) {
        const size_t first = size_t(r * cols + c0), n = size_t(c1 - c0);
        if (s.fp8) {  // code * its block's scale, the scale read once per block, the codes through a table
            static const std::array<float, 256> table = [] {
                std::array<float, 256> v{};
                for (int i = 0; i < 256; ++i) v[size_t(i)] = e4m3_to_f32(uint8_t(i));
                return v;
            }();
            const int64_t ncb = (cols + s.bc - 1) / s.bc;
            const uint8_t* codes = t.data + size_t(r * cols);
            for (int64_t c = c0; c < c1;) {
                const int64_t end = std::min(c1, (c / s.bc + 1) * s.bc);
                float scale;
                values_to_f32(s.fp8_dtype, s.fp8 + size_t((r / s.br) * ncb + c / s.bc) * dtype_size(s.fp8_dtype), 1, &scale);
                for (; c < end; ++c) out[c - c0] = table[codes[c]] * scale;
            }
        } else {
            values_to_f32(t.dtype, t.data + first * dtype_size(t.dtype), int64_t(n), out);
        }
        if (s.delta) s.delta->add_row(r, c0, c1, out);  // the adapters' W + B A, before the channel scales
        if (s.in)
            for (size_t i = 0; i < n; ++i) out[i] *= s.in[c0 + int64_t(i)];
        if (s.out)
            for (size_t i = 0; i < n; ++i) out[i] /= s.out[r];
    }

    // Elements [begin, begin + n) of a vector of `full` elements, as f32.
    // A whole [rows, cols] float tensor as f32 (a classifier's score.weight).
    std::vector<float> f32_matrix(const std::string& name, int64_t rows, int64_t cols) {
        const TensorInfo& t = tensor(name, {rows, cols});
        const Scaling sc = scaling(name, rows, cols);
        std::vector<float> v(size_t(rows * cols));
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t k = 0; k < cols; ++k) v[size_t(r * cols + k)] = at(t, sc, r, k, cols);
        out_.bytes += v.size() * 4;
        return v;
    }

    std::vector<float> vector(const std::string& name, int64_t full, int64_t begin = 0, int64_t n = -1) {
        const TensorInfo& t = tensor(name, {full});
        const Scaling sc = scaling(name, full, 1);
        if (n < 0) n = full;
        std::vector<float> v(static_cast<size_t>(n));
        for (size_t i = 0; i < v.size(); ++i) v[i] = at(t, sc, begin + int64_t(i), 0, 1);
        out_.bytes += v.size() * 4;
        return v;
    }

    // A float matrix block in `want` (or the checkpoint's dtype when Auto). A block of whole rows
    // in the checkpoint's dtype is a view into the map (zero copy); anything else (a column slice
    // for row-parallel layers, a conversion) is copied, reading only the block's bytes.
    WeightView float_matrix(const std::string& name, Block b, DType want) {
        const TensorInfo& t = source(name, {b.rows, b.cols});
        const Scaling sc = scaling(name, b.rows, b.cols);
        const size_t es = element_size(t), n = size_t(b.nrows * b.ncols);
        const uint8_t* first = t.data + size_t(b.row0 * b.cols + b.col0) * es;
        WeightView v{want, first, b.nrows, b.ncols};
        out_.bytes += n * dtype_size(want);
        const bool same = want == t.dtype && !sc.any();
        if (same && reinterpret_cast<uintptr_t>(first) % es == 0 && b.ncols == b.cols && !opt_.copy_mapped) return v;
        // Weighed against host memory: conversions, and with --no-mmap every copy (a rank's column
        // slice as stored is not: see converted_weight_bytes).
        if (!same || opt_.copy_mapped) converted_ += n * dtype_size(want);
        if (planning_) return v;
        Buffer buf(n * dtype_size(want));
        const size_t ws = dtype_size(want);
#pragma omp parallel
        {
            std::vector<float> row(static_cast<size_t>(b.ncols));
#pragma omp for schedule(static)
            for (int64_t r = 0; r < b.nrows; ++r) {
                uint8_t* dst = buf.data() + size_t(r * b.ncols) * ws;
                if (same) {
                    std::memcpy(dst, first + size_t(r * b.cols) * es, size_t(b.ncols) * es);
                    continue;
                }
                row_f32(t, sc, b.row0 + r, b.col0, b.col0 + b.ncols, b.cols, row.data());
                if (want == DType::F32) {
                    std::memcpy(dst, row.data(), row.size() * 4);
                } else if (want == DType::BF16) {  // one loop per dtype: it vectorises
                    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
                    for (int64_t i = 0; i < b.ncols; ++i) d[i] = f32_to_bf16(row[size_t(i)]);
                } else {
                    for (int64_t i = 0; i < b.ncols; ++i) store(want, dst, i, row[size_t(i)]);
                }
            }
        }
        // The source rows' pages of the map, once converted or copied (as release_source does after
        // quantizing): a BF16 model with a LoRA on every Linear peaked at 6.1 GB for 3.4 GB of weights.
        if (!same || opt_.copy_mapped) release_source(t, b);
        v.data = buf.data();
        out_.owned.push_back(std::move(buf));
        return v;
    }

    // After quantizing a block, this process's pages of its source rows in the file map: they are
    // clean page cache, reclaimable anyway, but counted in the resident set (and by memory cgroups)
    // until released, which put the peak RSS of a BF16 1.7B model quantized to INT8 at ~5.2 GB for
    // 1.7 GB of weights. A later read (a tied embedding's rows) faults them back in.
    static void release_source(const TensorInfo& t, Block b) {
        const size_t es = element_size(t);
        release_mapped_pages(t.data + size_t(b.row0 * b.cols) * es, size_t(b.nrows * b.cols) * es);
    }

    // Symmetric INT8 of a block: scale = max|w| / 127 per row and group of group_size input
    // columns (the whole row when 0), q = round-to-nearest-even(w * 127 / max). Scales are taken
    // over the whole group even when the block holds part of a row (per-channel, row-parallel), so
    // every tensor-parallel size quantizes identically.
    WeightView quantize(const std::string& name, Block b, int64_t group) {
        const TensorInfo& t = source(name, {b.rows, b.cols});
        const int64_t g = group > 0 ? group : b.cols;
        if (g != b.cols && (b.col0 % g != 0 || b.ncols % g != 0)) fail(name, ": --group-size ", g, " does not align with the tensor-parallel split");
        const int64_t view_group = g == b.cols ? b.ncols : g;
        const int64_t groups = b.ncols / view_group;
        const Scaling scl = scaling(name, b.rows, b.cols);
        converted_ += size_t(b.nrows * b.ncols) + size_t(b.nrows * groups) * sizeof(float);
        if (planning_) return {DType::I8, nullptr, b.nrows, b.ncols};
        Buffer q(size_t(b.nrows * b.ncols)), sc(size_t(b.nrows * groups) * sizeof(float));
        // Only the columns this block needs (all of them when the scale spans the row). Rows go
        // through the vectorised quantizer of the activations (the same rounding bit for bit): a
        // slice of a per-channel row is quantized whole for its scale, then copied.
        const bool slice = g == b.cols && b.ncols < b.cols;
        const int64_t c0 = g == b.cols ? 0 : b.col0, c1 = g == b.cols ? b.cols : b.col0 + b.ncols;
#pragma omp parallel
        {
            std::vector<float> row(static_cast<size_t>(b.cols));
            std::vector<int8_t> whole(slice ? static_cast<size_t>(b.cols) : 0);
#pragma omp for schedule(static)
            for (int64_t r = 0; r < b.nrows; ++r) {
                row_f32(t, scl, b.row0 + r, c0, c1, b.cols, row.data() + c0);
                int8_t* dst = reinterpret_cast<int8_t*>(q.data()) + r * b.ncols;
                float* scale = sc.as<float>() + r * groups;
                if (slice) {
                    quantize_rows_int8(row.data(), 1, b.cols, b.cols, whole.data(), scale);
                    std::memcpy(dst, whole.data() + b.col0, size_t(b.ncols));
                } else {
                    quantize_rows_int8(row.data() + b.col0, 1, b.ncols, view_group, dst, scale);
                }
            }
        }
        release_source(t, b);
        return own_int8(std::move(q), std::move(sc), b.nrows, b.ncols, view_group);
    }

    // The weights keep the buffers of a quantized block; its view. INT8: codes and scales.
    WeightView own_int8(Buffer q, Buffer sc, int64_t rows, int64_t cols, int64_t group) {
        WeightView v{DType::I8, q.data(), rows, cols};
        v.scales = sc.as<float>();
        v.group_size = group;
        out_.bytes += q.size() + sc.size();
        out_.owned.push_back(std::move(q));
        out_.owned.push_back(std::move(sc));
        return v;
    }

    // INT4: packed codes, scales and mins.
    WeightView own_int4(Buffer q, Buffer sc, Buffer mn, int64_t rows, int64_t cols, int64_t group) {
        const WeightView v = int4_weight_view(q.data(), sc.as<float>(), mn.as<float>(), rows, cols, group);
        out_.bytes += q.size() + sc.size() + mn.size();
        out_.owned.push_back(std::move(q));
        out_.owned.push_back(std::move(sc));
        out_.owned.push_back(std::move(mn));
        return v;
    }

    // Asymmetric INT4 of a block (kernels/cpu/quantize.h), groups of out_.group_size input columns
    // (a multiple of 32). The block's columns are gathered as f32 and quantized by the threaded
    // kernel; a column slice (row-parallel) must start and end on group boundaries, so every
    // tensor-parallel size quantizes identically.
    WeightView quantize4(const std::string& name, Block b) {
        const TensorInfo& t = source(name, {b.rows, b.cols});
        const int64_t g = out_.group_size;
        if (b.col0 % g != 0 || b.ncols % g != 0)
            fail(name, ": --group-size ", g, " does not align with the tensor-parallel split (columns ", b.col0, "..",
                 b.col0 + b.ncols, ")");
        const Scaling scl = scaling(name, b.rows, b.cols);
        const int64_t groups = b.ncols / g, full_groups = b.cols / g;
        auto clip = opt_.scales.clip.find(name);
        if (clip != opt_.scales.clip.end() && int64_t(clip->second.size()) != b.rows * full_groups)
            fail(name, ": ", clip->second.size(), " clip ratios for its ", b.rows * full_groups, " groups");
        converted_ += size_t(b.nrows * b.ncols / 2) + 2 * size_t(b.nrows * groups) * sizeof(float);
        if (planning_) return {DType::U8, nullptr, b.nrows, b.ncols};
        if (g % 32 != 0) fail(name, ": --group-size ", g, " must be a multiple of 32 for int4");
        Buffer q(size_t(b.nrows * b.ncols / 2)), sc(size_t(b.nrows * groups) * sizeof(float)),
            mn(size_t(b.nrows * groups) * sizeof(float));
        // Row by row (a staging copy of the whole block in f32 cost a fresh allocation, and its
        // page faults, per matrix): widened, clipped (AWQ) and quantized by the vectorised rows.
#pragma omp parallel
        {
            std::vector<float> row(static_cast<size_t>(b.ncols));
#pragma omp for schedule(static)
            for (int64_t r = 0; r < b.nrows; ++r) {
                row_f32(t, scl, b.row0 + r, b.col0, b.col0 + b.ncols, b.cols, row.data());
                if (clip != opt_.scales.clip.end())
                    for (int64_t k = 0; k < groups; ++k) {
                        float* w = row.data() + k * g;
                        float amax = 0.0f;
                        for (int64_t i = 0; i < g; ++i) amax = std::max(amax, std::fabs(w[i]));
                        const float m = amax * clip->second[size_t((b.row0 + r) * full_groups + b.col0 / g + k)];
                        for (int64_t i = 0; i < g; ++i) w[i] = std::clamp(w[i], -m, m);
                    }
                quantize_rows_int4(row.data(), 1, b.ncols, g, q.data() + r * (b.ncols / 2), sc.as<float>() + r * groups,
                                   mn.as<float>() + r * groups);
            }
        }
        release_source(t, b);
        return own_int4(std::move(q), std::move(sc), std::move(mn), b.nrows, b.ncols, g);
    }

    // A block of a pre-quantized tensor: int8 `name` and f32 `name_scale` [rows, groups].
    WeightView prequantized(const std::string& name, Block b) {
        // Under int4 the INT8 tensor is the vocabulary matrix, one scale per row.
        const int64_t g = cfg_.quant.group_size > 0 && !is_int4(out_.format) ? cfg_.quant.group_size : b.cols;
        const int64_t groups = b.cols / g;
        const TensorInfo& t = tensor(name, {b.rows, b.cols}, {DType::I8});
        const TensorInfo& s = tensor(name + "_scale", {b.rows, groups}, {DType::F32});
        if (g != b.cols && (b.col0 % g != 0 || b.ncols % g != 0))
            fail(name, ": group size ", g, " does not align with the tensor-parallel split");
        const int64_t vg = g == b.cols ? b.ncols : g, vgroups = b.ncols / vg;
        WeightView v{DType::I8, t.data + size_t(b.row0 * b.cols + b.col0), b.nrows, b.ncols};
        v.group_size = vg;
        const float* sc = reinterpret_cast<const float*>(s.data) + b.row0 * groups + (g == b.cols ? 0 : b.col0 / g);
        const bool scales_contiguous = reinterpret_cast<uintptr_t>(s.data) % 4 == 0 && vgroups == groups;
        const bool copy = b.ncols != b.cols || opt_.copy_mapped;  // a column slice, or --no-mmap
        if (opt_.copy_mapped) converted_ += size_t(b.nrows * b.ncols);
        if (planning_) return v;
        if (copy) {  // this rank's int8 columns
            Buffer q(size_t(b.nrows * b.ncols));
            for (int64_t r = 0; r < b.nrows; ++r)
                std::memcpy(q.data() + r * b.ncols, t.data + size_t((b.row0 + r) * b.cols + b.col0), size_t(b.ncols));
            if (opt_.copy_mapped) release_mapped_pages(t.data + size_t(b.row0 * b.cols), size_t(b.nrows * b.cols));
            v.data = q.data();
            out_.owned.push_back(std::move(q));
        }
        if (scales_contiguous) {
            v.scales = sc;
        } else {
            Buffer c(size_t(b.nrows * vgroups) * sizeof(float));
            for (int64_t r = 0; r < b.nrows; ++r)
                std::memcpy(c.as<float>() + r * vgroups, reinterpret_cast<const uint8_t*>(sc) + size_t(r * groups) * 4,
                            size_t(vgroups) * 4);
            v.scales = c.as<float>();
            out_.owned.push_back(std::move(c));
        }
        out_.bytes += size_t(b.nrows * b.ncols) + size_t(b.nrows * vgroups) * 4;
        return v;
    }

    // Rows [row0, row0 + nrows) and groups [col0 / g, (col0 + ncols) / g) of an f32 [rows, groups]
    // tensor: a view into the map when that is all of each row, else a copy.
    const float* group_block(const TensorInfo& s, Block b, int64_t g) {
        const int64_t groups = b.cols / g, vgroups = b.ncols / g;
        const float* first = reinterpret_cast<const float*>(s.data) + b.row0 * groups + b.col0 / g;
        if (planning_ || (vgroups == groups && reinterpret_cast<uintptr_t>(s.data) % 4 == 0)) return first;
        Buffer c(size_t(b.nrows * vgroups) * sizeof(float));
        for (int64_t r = 0; r < b.nrows; ++r)
            std::memcpy(c.as<float>() + r * vgroups, reinterpret_cast<const uint8_t*>(first) + size_t(r * groups) * 4,
                        size_t(vgroups) * 4);
        const float* p = c.as<float>();
        out_.owned.push_back(std::move(c));
        return p;
    }

    // A block of a pre-quantized INT4 tensor: packed u8 `name` [rows, cols / 2] with f32 `name_scale`
    // and `name_min` [rows, cols / group_size] (layout in kernels/cpu/weights_view.h).
    WeightView prequantized4(const std::string& name, Block b) {
        const int64_t g = cfg_.quant.group_size, groups = b.cols / g;
        if (b.cols % g != 0) fail(name, ": group size ", g, " does not divide its ", b.cols, " columns");
        const TensorInfo& t = tensor(name, {b.rows, b.cols / 2}, {DType::U8});
        const TensorInfo& s = tensor(name + "_scale", {b.rows, groups}, {DType::F32});
        const TensorInfo& m = tensor(name + "_min", {b.rows, groups}, {DType::F32});
        if (b.col0 % g != 0 || b.ncols % g != 0)
            fail(name, ": group size ", g, " does not align with the tensor-parallel split (columns ", b.col0, "..",
                 b.col0 + b.ncols, ")");
        const int64_t rb = b.cols / 2, vb = b.ncols / 2;
        const uint8_t* data = t.data + b.row0 * rb + b.col0 / 2;
        const bool copy = vb != rb || opt_.copy_mapped;  // a column slice (whole 32-column blocks), or --no-mmap
        if (opt_.copy_mapped) converted_ += size_t(b.nrows * vb);
        if (copy && !planning_) {
            Buffer q(size_t(b.nrows * vb));
            for (int64_t r = 0; r < b.nrows; ++r) std::memcpy(q.data() + r * vb, data + r * rb, size_t(vb));
            if (opt_.copy_mapped) release_mapped_pages(t.data + b.row0 * rb, size_t(b.nrows * rb));
            data = q.data();
            out_.owned.push_back(std::move(q));
        }
        const WeightView v = int4_weight_view(data, group_block(s, b, g), group_block(m, b, g), b.nrows, b.ncols, g);
        out_.bytes += size_t(b.nrows * vb) + size_t(b.nrows * (b.ncols / g)) * 8;
        return v;
    }

    // Bytes of the buffers the conversions allocated (or, planning, would allocate) so far.
    size_t converted() const { return converted_; }

    bool kept(const std::string& name) const {
        return has_keep_ && std::regex_search(name, keep_);
    }

    // The dtype a float (not quantized) matrix is held in (FP8 as BF16: it holds code * scale
    // within half a bf16 step, and the kernels read no FP8).
    DType float_dtype(const TensorInfo& t, bool keep16) const {
        const DType stored = is_fp8(t) ? DType::BF16 : t.dtype;
        if (keep16) return stored == DType::F32 ? DType::BF16 : stored;
        switch (out_.format) {
            case WeightFormat::F32: return DType::F32;
            case WeightFormat::F16: return DType::F16;
            case WeightFormat::BF16: return DType::BF16;
            default: return stored;
        }
    }

    // An FP8 tensor (its dtype is none of DType's: the loader widens it row by row).
    static bool is_fp8(const TensorInfo& t) { return t.dtype_str == "F8_E4M3"; }
    static size_t element_size(const TensorInfo& t) { return is_fp8(t) ? 1 : dtype_size(t.dtype); }

    // A Linear matrix as a float source: F32/F16/BF16, or FP8 where the config says so.
    const TensorInfo& source(const std::string& name, const std::vector<int64_t>& shape) {
        const TensorInfo& t = get(name);
        if (!is_fp8(t)) return tensor(name, shape);
        if (!cfg_.fp8.present)
            fail(t.file, ": tensor ", name, " is FP8 (F8_E4M3) but ", ckpt_.dir(),
                 "/config.json has no FP8 quantization_config (quant_method fp8, or compressed-tensors float-quantized)");
        if (t.shape != shape) {
            TensorInfo want;
            want.shape = shape;
            fail(t.file, ": tensor ", name, " has shape ", t.shape_str(), ", expected ", want.shape_str());
        }
        return t;
    }

    // A Linear matrix of a pre-quantized checkpoint, stored as its quantization_config says: packed
    // INT4 (U8) for the layers under int4/w4a8, INT8 otherwise (with their scales), or float where
    // its keep_fp16 regex kept it (the vocabulary matrix also when the regex matches lm_head.weight,
    // as quantizing checks it). Float weights under an int8 claim are a broken checkpoint.
    WeightView stored_quantized(const std::string& name, Block b, bool vocab) {
        const TensorInfo& t = get(name);
        const bool four = is_int4(out_.format) && !vocab;
        const DType want = four ? DType::U8 : DType::I8;
        if (t.dtype_known && t.dtype == want) return four ? prequantized4(name, b) : prequantized(name, b);
        const bool is_float = t.dtype_known && (t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16);
        if (!is_float || !(kept(name) || (vocab && kept("lm_head.weight"))))
            fail(t.file, ": tensor ", name, " is stored as ", t.dtype_str, " but the quantization_config of ", ckpt_.dir(),
                 "/config.json says ", cfg_.quant.format, " (", four ? "U8" : "I8", ", or float where its keep_fp16 \"",
                 cfg_.quant.keep_fp16, "\" matches)");
        return float_matrix(name, b, float_dtype(tensor(name, {b.rows, b.cols}), true));
    }

    // A Linear matrix of an AWQ or GPTQ checkpoint: its packed qweight unpacked (model/hf_quant.h),
    // or, where the tool left it float (the embedding, lm_head, AutoAWQ's modules_to_not_convert),
    // the float tensor: the vocabulary matrix quantized to INT8 as a float checkpoint's would be,
    // unless --keep-fp16 matches it, any other layer kept 16-bit.
    WeightView hf_quantized(const std::string& name, Block b, bool vocab, std::vector<int32_t>* order) {
        const std::string prefix = ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : name;
        // Where the quantized codes are: AWQ's and GPTQ's qweight, compressed-tensors' 4-bit
        // weight_packed, or its 8-bit weight itself (I8 where the tool left others float).
        const QuantConfig& qc = cfg_.quant;
        const std::string codes = qc.method != QuantMethod::CompressedTensors ? prefix + ".qweight"
                                  : qc.bits == 4                              ? prefix + ".weight_packed"
                                                                              : name;
        const TensorInfo* packed = ckpt_.find(codes);
        if (packed && codes == name && !(packed->dtype_known && packed->dtype == DType::I8)) packed = nullptr;
        if (!packed) {
            const TensorInfo& t = tensor(name, {b.rows, b.cols});
            if (vocab && !kept(name) && !kept("lm_head.weight"))
                return is_int4(out_.format) ? quantize(name, b, 0) : quantize(name, b, out_.group_size);
            return float_matrix(name, b, float_dtype(t, true));
        }
        const char* method = quant_method_name(qc.method);
        if (vocab)
            fail(packed->file, ": tensor ", codes, ": a ", method,
                 "-quantized vocabulary matrix is not supported (only the layers' Linear matrices)");
        if (kept(name))
            fail("--keep-fp16 matches ", name, ", which ", ckpt_.dir(), " holds ", method, "-quantized (", codes,
                 "): only its float tensors can stay float");
        return qc.method == QuantMethod::CompressedTensors ? compressed(prefix, codes, b, order) : unpacked(prefix, b, order);
    }

    // A block of a compressed-tensors layer: `codes` (weight_packed, or the I8 weight) with
    // weight_scale, and where the tool wrote them weight_shape (must be the layer's), weight_zero_point
    // (must be all zero: symmetric) and weight_g_idx (act-order: the input columns' order into *order).
    WeightView compressed(const std::string& prefix, const std::string& codes, Block b, std::vector<int32_t>* order) {
        const QuantConfig& qc = cfg_.quant;
        const int64_t group = qc.packed_group > 0 ? qc.packed_group : b.cols;
        if (qc.bits == 4 && b.cols % 8 != 0)
            fail(get(codes).file, ": tensor ", codes, ": ", b.cols, " columns do not pack into words of 8 codes");
        const PackedShapes sh = packed_shapes(qc.method, qc.bits, b.rows, b.cols, group);
        PackedLinear m = packed_linear(b, group);
        m.qweight = tensor(codes, {sh.qweight[0], sh.qweight[1]}, {qc.bits == 4 ? DType::I32 : DType::I8}).data;
        const std::string scale = prefix + ".weight_scale";
        std::vector<int64_t> scale_shape{sh.scales[0], sh.scales[1]};
        if (qc.per_tensor) scale_shape = get(scale).shape.empty() ? std::vector<int64_t>{} : std::vector<int64_t>{1};
        const TensorInfo& sc = tensor(scale, scale_shape);
        m.scale_dtype = sc.dtype;
        m.scales = sc.data;
        if (const TensorInfo* ws = ckpt_.find(prefix + ".weight_shape")) {
            get(prefix + ".weight_shape");
            int64_t dims[2] = {-1, -1};
            if (ws->shape == std::vector<int64_t>{2} && (ws->dtype_str == "I64" || ws->dtype_str == "I32"))
                for (int i = 0; i < 2; ++i) {
                    if (ws->dtype_str == "I64") std::memcpy(&dims[i], ws->data + 8 * i, 8);
                    else {
                        int32_t v;
                        std::memcpy(&v, ws->data + 4 * i, 4);
                        dims[i] = v;
                    }
                }
            if (dims[0] != b.rows || dims[1] != b.cols)
                fail(ws->file, ": tensor ", prefix, ".weight_shape is not [", b.rows, ", ", b.cols, "] (I64 or I32)");
        }
        if (const TensorInfo* zp = ckpt_.find(prefix + ".weight_zero_point")) {
            get(prefix + ".weight_zero_point");
            for (size_t i = 0; i < zp->nbytes; ++i)
                if (zp->data[i] != 0)
                    fail(zp->file, ": tensor ", prefix, ".weight_zero_point is not zero: asymmetric compressed-tensors "
                         "weights are not supported");
        }
        return unpacked_block(m, codes, b, prefix + ".weight_g_idx", order);
    }

    // A block of an AWQ or GPTQ layer (prefix.qweight, .qzeros, .scales, GPTQ's .g_idx) in the
    // engine's INT4 layout, or INT8 for 8-bit GPTQ (act-order: the input columns' order into *order).
    WeightView unpacked(const std::string& prefix, Block b, std::vector<int32_t>* order) {
        const QuantConfig& qc = cfg_.quant;
        const int bits = qc.bits, per = 32 / bits;
        const int64_t group = qc.packed_group > 0 ? qc.packed_group : b.cols;
        const bool awq = qc.method == QuantMethod::Awq;
        const std::string qweight = prefix + ".qweight";
        if (b.rows % (awq ? 8 : per) != 0 || (!awq && b.cols % per != 0))
            fail(get(qweight).file, ": tensor ", qweight, ": a ", b.rows, " x ", b.cols, " layer does not pack into ",
                 awq ? "AWQ's" : "GPTQ's", " words of ", per, " codes");
        if (awq && b.row0 % 8 != 0)
            fail(qweight, ": the tensor-parallel split at row ", b.row0, " falls inside one of AWQ's words of 8 rows");
        const PackedShapes sh = packed_shapes(qc.method, bits, b.rows, b.cols, group);
        PackedLinear m = packed_linear(b, group);
        m.qweight = tensor(qweight, {sh.qweight[0], sh.qweight[1]}, {DType::I32}).data;
        m.qzeros = tensor(prefix + ".qzeros", {sh.qzeros[0], sh.qzeros[1]}, {DType::I32}).data;
        const TensorInfo& sc = tensor(prefix + ".scales", {sh.scales[0], sh.scales[1]});
        m.scale_dtype = sc.dtype;
        m.scales = sc.data;
        return unpacked_block(m, qweight, b, awq ? std::string() : prefix + ".g_idx", order);
    }

    // The fields of a packed layer [b.rows, b.cols] the quantization_config gives (its tensors
    // are the caller's to find).
    PackedLinear packed_linear(Block b, int64_t group) const {
        PackedLinear m;
        m.method = cfg_.quant.method;
        m.bits = cfg_.quant.bits;
        m.rows = b.rows;
        m.cols = b.cols;
        m.group = group;
        m.per_tensor = cfg_.quant.per_tensor;
        m.zero_offset = cfg_.quant.zero_offset;
        return m;
    }

    // Block b of the packed layer m (named by its codes tensor) in the INT4 layout, or INT8. Where
    // the checkpoint has the group index `g_idx` (GPTQ's g_idx, compressed-tensors' weight_g_idx)
    // and it is act-order's, the columns are sorted by group first (model/hf_quant.h act_order),
    // the block taken from the sorted layer, and the block's columns' order handed to *order for
    // the engine, which reads the input in it (the scales stay per group: exact).
    WeightView unpacked_block(PackedLinear m, const std::string& qweight, Block b, const std::string& g_idx,
                              std::vector<int32_t>* order) {
        const QuantConfig& qc = cfg_.quant;
        const int bits = m.bits;
        std::vector<uint8_t> reordered;
        if (!g_idx.empty() && ckpt_.find(g_idx)) {
            const TensorInfo& gi = tensor(g_idx, {m.cols}, {DType::I32});
            std::vector<int32_t> o = act_order(gi.data, m.cols, m.group, gi.file + ": tensor " + g_idx);
            if (!o.empty()) {
                SHARDLM_CHECK(order, "an act-order layer where none can be: ", qweight);
                if (!planning_) {
                    reordered = reorder_codes(m, o.data());
                    m.qweight = reordered.data();
                }
                order->assign(o.begin() + b.col0, o.begin() + b.col0 + b.ncols);
            }
        }
        // The engine's groups: the checkpoint's (INT4 repeats a per-channel scale over groups of
        // group_size; per-channel INT8 keeps one scale per row of the block).
        const int64_t g = bits == 4 ? out_.group_size : qc.packed_group > 0 ? qc.packed_group : b.ncols;
        if (b.col0 % g != 0 || b.ncols % g != 0)
            fail(qweight, ": group size ", g, " does not align with the tensor-parallel split (columns ", b.col0, "..",
                 b.col0 + b.ncols, ")");
        const size_t n = size_t(b.nrows * b.ncols), groups = size_t(b.nrows * (b.ncols / g));
        if (bits == 4) {
            converted_ += n / 2 + 2 * groups * sizeof(float);
            if (planning_) return {DType::U8, nullptr, b.nrows, b.ncols};
            Buffer q(n / 2), s(groups * sizeof(float)), mn(groups * sizeof(float));
            unpack_int4(m, b.row0, b.nrows, b.col0, b.ncols, g, q.data(), s.as<float>(), mn.as<float>());
            return own_int4(std::move(q), std::move(s), std::move(mn), b.nrows, b.ncols, g);
        }
        converted_ += n + groups * sizeof(float);
        if (planning_) return {DType::I8, nullptr, b.nrows, b.ncols};
        Buffer q(n), s(groups * sizeof(float));
        unpack_int8(m, b.row0, b.nrows, b.col0, b.ncols, g, reinterpret_cast<int8_t*>(q.data()), s.as<float>(), qweight);
        return own_int8(std::move(q), std::move(s), b.nrows, b.ncols, g);
    }

    // A Linear layer's matrix, in the format the options ask for. The vocabulary matrix (`vocab`)
    // is INT8 per output channel under int4 (see weights.h).
    // An act-order layer's input order goes to *order (see Linear::input_order).
    WeightView linear_matrix(const std::string& name, Block b, bool vocab = false, std::vector<int32_t>* order = nullptr) {
        if (b.nrows < 0) b.nrows = b.rows;
        if (b.ncols < 0) b.ncols = b.cols;
        if (cfg_.quant.present)
            return cfg_.quant.method == QuantMethod::Shardlm ? stored_quantized(name, b, vocab)
                                                             : hf_quantized(name, b, vocab, order);
        if (is_int4(out_.format) && !kept(name)) return vocab ? quantize(name, b, 0) : quantize4(name, b);
        if (is_int8(out_.format) && !kept(name)) return quantize(name, b, out_.group_size);
        return float_matrix(name, b, float_dtype(source(name, {b.rows, b.cols}), is_quantized(out_.format)));
    }

    // Column-parallel: output rows [row0, row0 + nrows) and their bias entries.
    Linear column_parallel(const std::string& prefix, int64_t out, int64_t in, bool bias, int64_t row0, int64_t nrows) {
        Linear l;
        l.name = prefix + ".weight";
        l.w = linear_matrix(l.name, {out, in, row0, nrows, 0, in}, false, &l.input_order);
        if (!l.input_order.empty()) l.input_width = in;
        if (bias) l.bias = vector(prefix + ".bias", out, row0, nrows);
        return l;
    }

    // Column-parallel without a bias, the output rows `rows` (indices into the whole output) in that
    // order: gate/up making the intermediate in an act-order down_proj's sorted order (build). The
    // whole matrix is converted and the rows copied out; its buffers go once they are.
    Linear column_parallel_rows(const std::string& prefix, int64_t out, int64_t in, const std::vector<int32_t>& rows) {
        Linear l;
        l.name = prefix + ".weight";
        const int64_t n = int64_t(rows.size());
        if (planning_) {  // what is kept: n rows as converted, every block of n rows alike
            const size_t before = converted_;
            l.w = linear_matrix(l.name, {out, in, 0, n, 0, in}, false, &l.input_order);
            converted_ = before + size_t(n) * row_bytes_with_scales(l.w);
        } else {
            const size_t owned = out_.owned.size(), bytes = out_.bytes;
            const WeightView whole = linear_matrix(l.name, {out, in, 0, out, 0, in}, false, &l.input_order);
            const size_t rb = size_t(weight_row_bytes(whole)), groups = size_t(whole.n_groups());
            const bool i4 = whole.dtype == DType::I4;
            Buffer q(size_t(n) * rb), sc(whole.quantized() ? size_t(n) * groups * sizeof(float) : 0),
                mn(i4 ? size_t(n) * groups * sizeof(float) : 0);
            for (int64_t r = 0; r < n; ++r) {
                const int64_t from = rows[size_t(r)];
                SHARDLM_CHECK(from >= 0 && from < out, "row ", from, " of ", out, " rows of ", l.name);
                std::memcpy(q.data() + size_t(r) * rb, static_cast<const uint8_t*>(whole.data) + size_t(from) * rb, rb);
                if (whole.quantized())
                    std::copy_n(whole.scales + size_t(from) * groups, groups, sc.as<float>() + size_t(r) * groups);
                if (i4) std::copy_n(whole.mins + size_t(from) * groups, groups, mn.as<float>() + size_t(r) * groups);
            }
            out_.owned.erase(out_.owned.begin() + std::ptrdiff_t(owned), out_.owned.end());
            out_.bytes = bytes;
            if (i4) {
                l.w = own_int4(std::move(q), std::move(sc), std::move(mn), n, in, whole.group_size);
            } else if (whole.dtype == DType::I8) {
                l.w = own_int8(std::move(q), std::move(sc), n, in, whole.group_size);
            } else {
                l.w = WeightView{whole.dtype, q.data(), n, in};
                out_.bytes += q.size();
                out_.owned.push_back(std::move(q));
            }
        }
        if (!l.input_order.empty()) l.input_width = in;
        return l;
    }

    // Bytes a row of w takes as converted, its scales (and INT4 mins) included.
    static size_t row_bytes_with_scales(const WeightView& w) {
        const size_t scales = w.quantized() ? size_t(w.n_groups()) * sizeof(float) * (w.dtype == DType::I4 ? 2 : 1) : 0;
        return size_t(weight_row_bytes(w)) + scales;
    }

    // Row-parallel: input columns [col0, col0 + ncols); the partial sums are all-reduced.
    Linear row_parallel(const std::string& prefix, int64_t out, int64_t in, int64_t col0, int64_t ncols) {
        Linear l;
        l.name = prefix + ".weight";
        l.w = linear_matrix(l.name, {out, in, 0, out, col0, ncols}, false, &l.input_order);
        if (!l.input_order.empty()) l.input_width = in;
        return l;
    }

private:
    const Checkpoint& ckpt_;
    const ModelConfig& cfg_;
    const LoadOptions& opt_;
    ModelWeights& out_;
    std::regex keep_;
    bool has_keep_ = false;
    std::set<std::string> read_;  // names of the tensors get() handed out
    std::unique_ptr<LoraSet> lora_;     // opt.lora opened, or null
    std::set<std::string> lora_merged_;  // base tensors whose rows the adapters' deltas were added to
    bool planning_ = false;
    size_t converted_ = 0;
};

// Every tensor of the model through `ld`, into w (whose plan is p).
void build(Loader& ld, const ModelConfig& c, const ShardPlan& p, ModelWeights& w) {
    const int64_t hd = c.head_dim, q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
    const int64_t q0 = p.q_head0 * hd, nq = p.n_q_heads * hd, kv0 = p.kv_head0 * hd, nkv = p.n_kv_heads * hd;
    if (c.head != Head::CausalLM && !ld.headless_ok())
        fail(ld.dir(), "/config.json: ", c.architecture,
             c.head == Head::Classifier ? " is a sequence-classification model (no lm_head); shardlm classify and serve --rerank run it"
                                        : " is a base model (no lm_head); shardlm embed and serve --embeddings run it");
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
        // An act-order down_proj reads its block of the intermediate in its columns' order (sorted
        // by group), which takes in the whole intermediate, every rank's part. Gate and up make
        // those elements instead, in that order (SwiGLU is elementwise): down then reads this
        // rank's own part as it lies, with no gather and, split over ranks, no all-gather.
        L.down = ld.row_parallel(pre + ".mlp.down_proj", c.hidden, c.intermediate, p.inter0, p.n_inter);
        if (!L.down.input_order.empty()) {
            L.inter_rows = std::move(L.down.input_order);
            L.down.input_order.clear();
            L.down.input_width = 0;
            L.gate = ld.column_parallel_rows(pre + ".mlp.gate_proj", c.intermediate, c.hidden, L.inter_rows);
            L.up = ld.column_parallel_rows(pre + ".mlp.up_proj", c.intermediate, c.hidden, L.inter_rows);
        } else {
            L.gate = ld.column_parallel(pre + ".mlp.gate_proj", c.intermediate, c.hidden, false, p.inter0, p.n_inter);
            L.up = ld.column_parallel(pre + ".mlp.up_proj", c.intermediate, c.hidden, false, p.inter0, p.n_inter);
        }
        w.layers.push_back(std::move(L));
    }
    w.final_norm = ld.vector("model.norm.weight", c.hidden);
    // lm_head is a Linear layer: quantized (INT8) in the quantized formats unless --keep-fp16 matches it. With
    // tied embeddings it is the embedding matrix (some tied checkpoints still ship an lm_head.weight;
    // tying means the embedding is the truth), and the lookup reads the same rows, dequantized.
    // An untied embedding is not a Linear layer and stays in its float format.
    const Block vocab_rows{c.vocab, c.hidden, p.vocab0, p.n_vocab, 0, c.hidden};
    if (c.tie_embeddings) {
        const std::string name = "model.embed_tokens.weight";
        const bool keep = ld.kept("lm_head.weight") || ld.kept(name);
        if (keep && !c.quant.present)
            w.lm_head = ld.float_matrix(name, vocab_rows, ld.float_dtype(ld.tensor(name, {c.vocab, c.hidden}), is_quantized(w.format)));
        else
            w.lm_head = ld.linear_matrix(name, vocab_rows, /*vocab=*/true);
        w.embed = w.lm_head;
        w.headless = c.head != Head::CausalLM;  // a tied classifier or base model: the embedding is no lm_head
    } else {
        const std::string name = "model.embed_tokens.weight";
        w.embed = ld.float_matrix(name, vocab_rows, ld.float_dtype(ld.tensor(name, {c.vocab, c.hidden}), false));
        if (ld.headless()) {
            w.lm_head = w.embed;
            w.headless = true;
        } else {
            w.lm_head = ld.linear_matrix("lm_head.weight", vocab_rows, /*vocab=*/true);
        }
    }
    // The classifier head is tiny ([num_labels, hidden]) and sensitive: f32, whole on every rank.
    if (c.head == Head::Classifier) w.score = ld.f32_matrix("score.weight", int64_t(c.labels.size()), c.hidden);
    ld.check_all_read();
    ld.check_lora_merged();
}

// The hint that ends the message of a load refused for memory (load_weights).
std::string memory_hint(const ModelConfig& c, const LoadOptions& opt) {
    if (opt.copy_mapped) {  // the copies may be all of it (a float or pre-quantized checkpoint as stored)
        LoadOptions mapped = opt;
        mapped.copy_mapped = false;
        return "drop --no-mmap (tensors as stored are then read through the file map), or " + memory_hint(c, mapped);
    }
    if (is_quantized(opt.format) && !c.quant.present)
        return "use a pre-quantized checkpoint (shardlm quantize writes one, where the memory is) or a machine with "
               "more memory";
    if (opt.format != WeightFormat::Auto)
        return "use --weights auto (the checkpoint's own dtype, mapped without a copy) or a machine with more memory";
    return "use a machine with more memory";
}

}  // namespace

size_t converted_weight_bytes(const Checkpoint& ckpt, const ModelConfig& c, const LoadOptions& opt, const ShardPlan& p) {
    ModelWeights w;
    w.plan = p;
    Loader ld(ckpt, c, opt, w, /*planning=*/true);
    build(ld, c, p, w);
    return ld.converted();
}

ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& c, const LoadOptions& opt, const ShardPlan& p) {
    // The converted buffers are written as they are allocated: under overcommit, more than the
    // machine can back would be granted and the OOM killer would end the load (core/host_memory.h).
    // Each rank of the node converts its slice at the same time: its part is available / ranks.
    SHARDLM_CHECK(opt.ranks_on_node >= 1, "load_weights: ", opt.ranks_on_node, " ranks on the node");
    const size_t need = converted_weight_bytes(ckpt, c, opt, p);
    if (need > 0) {
        const HostMemory avail = host_memory_available();
        const size_t part = avail.bytes == SIZE_MAX ? SIZE_MAX : avail.bytes / size_t(opt.ranks_on_node);
        if (need > part) {
            const std::string needs = cat("model ", ckpt.dir(), ": --weights ", weight_format_name(opt.format), " needs ",
                                          format_gib(need), " GiB (", need, " bytes) of host memory for the weights ",
                                          opt.copy_mapped ? "copied (--no-mmap) or converted on load" : "converted on load",
                                          p.tp > 1 ? " (this rank's share)" : "");
            fail(needs, can_back_only(avail, opt.ranks_on_node), "; ", memory_hint(c, opt));
        }
    }
    ModelWeights w;
    w.plan = p;
    Loader ld(ckpt, c, opt, w, /*planning=*/false);
    build(ld, c, p, w);
    return w;
}

int64_t widest_input_order(const ModelWeights& w) {
    int64_t widest = 0;
    for (const LayerWeights& L : w.layers)
        for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) widest = std::max(widest, l->input_width);
    return widest;
}

}  // namespace shardlm
