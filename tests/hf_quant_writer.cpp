#include "hf_quant_writer.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "core/dtype.h"
#include "fixtures.h"
#include "model/safetensors.h"

namespace shardlm::test {

TensorToWrite words(const std::string& name, std::vector<int64_t> shape, const std::vector<uint32_t>& w) {
    TensorToWrite t{name, "I32", std::move(shape), std::vector<uint8_t>(w.size() * 4)};
    std::memcpy(t.bytes.data(), w.data(), t.bytes.size());
    return t;
}

TensorToWrite sixteen(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v, bool bf16) {
    TensorToWrite t{name, bf16 ? "BF16" : "F16", std::move(shape), std::vector<uint8_t>(v.size() * 2)};
    for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t h = bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
        std::memcpy(&t.bytes[2 * i], &h, 2);
    }
    return t;
}

namespace {

// `by_group`: the columns in the order the tool quantized them (act-order; else column order).
HfQuantTruth make_truth(int64_t rows, int64_t cols, const HfQuantCase& cs, const std::vector<int64_t>& by_group,
                        std::mt19937& rng) {
    HfQuantTruth t;
    t.rows = rows;
    t.cols = cols;
    t.group = cs.group < 0 ? cols : cs.group;
    const bool ct = cs.method == "ct";
    const uint32_t top = (1u << cs.bits) - 1;
    std::uniform_int_distribution<uint32_t> code(0, top);
    // AutoGPTQ's format stores z - 1, which cannot hold z = 0; symmetric 8-bit is z = 128.
    std::uniform_int_distribution<uint32_t> zero(cs.method == "gptq" && cs.format == "gptq" ? 1 : 0, top);
    // Weights of the synthetic model's size (|w| up to ~0.1): steps of 0.03 .. 0.12 of 2^-bits.
    const float step = 1.0f / float(1u << cs.bits);
    std::uniform_real_distribution<float> scale(0.03f * step, 0.12f * step);
    for (int64_t i = 0; i < rows * cols; ++i) t.q.push_back(code(rng));
    t.g_idx.resize(size_t(cols));
    for (int64_t j = 0; j < cols; ++j) t.g_idx[size_t(by_group[size_t(j)])] = uint32_t(j / t.group);
    for (int64_t i = 0; i < (cols / t.group) * rows; ++i) {
        // compressed-tensors is symmetric: its 4-bit codes are the value plus 8.
        t.z.push_back(cs.bits == 8 ? 128u : ct ? 8u : zero(rng));
        const float v = scale(rng);
        t.s.push_back(i > 0 && cs.group == -2 ? t.s[0] : ct ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16(v)));
    }
    return t;
}

// compressed-tensors' tensors: the codes in rows (4 bits: words of 8 along a row, the signed
// value plus 8 at bits 4k; 8 bits: int8 itself), weight_scale [rows, groups] in bf16 (one value
// for strategy tensor), weight_shape, and the zero points llm-compressor saves (all zero).
std::vector<TensorToWrite> pack_ct(const std::string& prefix, const HfQuantTruth& t, const HfQuantCase& cs) {
    const int64_t groups = t.cols / t.group;
    std::vector<TensorToWrite> out;
    if (cs.bits == 4) {
        std::vector<uint32_t> qw(size_t(t.rows * t.cols / 8));
        for (int64_t r = 0; r < t.rows; ++r)
            for (int64_t c = 0; c < t.cols; ++c) qw[size_t(r * t.cols / 8 + c / 8)] |= t.q[size_t(r * t.cols + c)] << (4 * (c % 8));
        out.push_back(words(prefix + ".weight_packed", {t.rows, t.cols / 8}, qw));
        TensorToWrite shape{prefix + ".weight_shape", "I64", {2}, std::vector<uint8_t>(16)};
        const int64_t dims[2] = {t.rows, t.cols};
        std::memcpy(shape.bytes.data(), dims, 16);
        out.push_back(std::move(shape));
    } else {
        TensorToWrite w{prefix + ".weight", "I8", {t.rows, t.cols}, std::vector<uint8_t>(size_t(t.rows * t.cols))};
        for (size_t i = 0; i < w.bytes.size(); ++i) w.bytes[i] = uint8_t(int8_t(int(t.q[i]) - 128));
        out.push_back(std::move(w));
        out.push_back({prefix + ".weight_zero_point", "I8", {t.rows, groups}, std::vector<uint8_t>(size_t(t.rows * groups))});
    }
    if (cs.group == -2) {
        out.push_back(sixteen(prefix + ".weight_scale", {1}, {t.s[0]}, true));
    } else {
        std::vector<float> s(size_t(t.rows * groups));
        for (int64_t r = 0; r < t.rows; ++r)
            for (int64_t k = 0; k < groups; ++k) s[size_t(r * groups + k)] = t.s[size_t(k * t.rows + r)];
        out.push_back(sixteen(prefix + ".weight_scale", {t.rows, groups}, s, true));
    }
    if (cs.act_order) out.push_back(words(prefix + ".weight_g_idx", {t.cols}, t.g_idx));
    return out;
}

// The tensors the tool writes for `prefix` (q_proj etc., without ".weight").
std::vector<TensorToWrite> pack(const std::string& prefix, const HfQuantTruth& t, const HfQuantCase& cs) {
    if (cs.method == "ct") return pack_ct(prefix, t, cs);
    const int64_t groups = t.cols / t.group;
    std::vector<TensorToWrite> out;
    if (cs.method == "awq") {
        const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // AutoAWQ: bits 4i hold output order[i] of the eight
        std::vector<uint32_t> qw(size_t(t.cols * t.rows / 8)), qz(size_t(groups * t.rows / 8));
        for (int64_t c = 0; c < t.cols; ++c)
            for (int64_t j = 0; j < t.rows / 8; ++j)
                for (int i = 0; i < 8; ++i) qw[size_t(c * (t.rows / 8) + j)] |= t.q[size_t((8 * j + order[i]) * t.cols + c)] << (4 * i);
        for (int64_t k = 0; k < groups; ++k)
            for (int64_t j = 0; j < t.rows / 8; ++j)
                for (int i = 0; i < 8; ++i) qz[size_t(k * (t.rows / 8) + j)] |= t.z[size_t(k * t.rows + 8 * j + order[i])] << (4 * i);
        out.push_back(words(prefix + ".qweight", {t.cols, t.rows / 8}, qw));
        out.push_back(words(prefix + ".qzeros", {groups, t.rows / 8}, qz));
    } else {
        const int per = 32 / cs.bits;
        const uint32_t off = cs.format == "gptq" ? 1 : 0, mask = (1u << cs.bits) - 1;
        std::vector<uint32_t> qw(size_t(t.cols / per * t.rows)), qz(size_t(groups * t.rows / per)), gi;
        for (int64_t i = 0; i < t.cols / per; ++i)
            for (int64_t r = 0; r < t.rows; ++r)
                for (int k = 0; k < per; ++k) qw[size_t(i * t.rows + r)] |= t.q[size_t(r * t.cols + i * per + k)] << (cs.bits * k);
        for (int64_t g = 0; g < groups; ++g)
            for (int64_t j = 0; j < t.rows / per; ++j)
                for (int k = 0; k < per; ++k)
                    qz[size_t(g * t.rows / per + j)] |= ((t.z[size_t(g * t.rows + j * per + k)] - off) & mask) << (cs.bits * k);
        gi = t.g_idx;
        out.push_back(words(prefix + ".qweight", {t.cols / per, t.rows}, qw));
        out.push_back(words(prefix + ".qzeros", {groups, t.rows / per}, qz));
        out.push_back(words(prefix + ".g_idx", {t.cols}, gi));
    }
    out.push_back(sixteen(prefix + ".scales", {groups, t.rows}, t.s, false));
    return out;
}

nlohmann::json quant_config(const HfQuantCase& cs) {
    if (cs.method == "ct") {
        nlohmann::json weights = {{"num_bits", cs.bits}, {"type", "int"}, {"symmetric", true}, {"dynamic", false},
                                  {"strategy", cs.group > 0 ? "group" : cs.group == -1 ? "channel" : "tensor"},
                                  {"group_size", cs.group > 0 ? nlohmann::json(cs.group) : nlohmann::json()},
                                  {"actorder", cs.act_order ? nlohmann::json("group") : cs.bits == 4 ? nlohmann::json("static") : nlohmann::json()},
                                  {"observer", "minmax"}};
        nlohmann::json input = cs.acts ? nlohmann::json{{"num_bits", 8}, {"type", "int"}, {"symmetric", true},
                                                        {"dynamic", true}, {"strategy", "token"}}
                                       : nlohmann::json();
        return {{"quant_method", "compressed-tensors"},
                {"format", cs.bits == 4 ? "pack-quantized" : "int-quantized"},
                {"quantization_status", "compressed"},
                {"config_groups",
                 {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", input},
                               {"output_activations", nullptr}}}}},
                {"ignore", {"lm_head"}},
                {"kv_cache_scheme", nullptr},
                {"sparsity_config", nlohmann::json::object()}};
    }
    if (cs.method == "awq")
        return {{"quant_method", "awq"}, {"bits", 4}, {"group_size", cs.group}, {"zero_point", true},
                {"version", "gemm"}, {"modules_to_not_convert", nullptr}};
    return {{"quant_method", "gptq"}, {"bits", cs.bits}, {"group_size", cs.group}, {"desc_act", cs.act_order},
            {"sym", true}, {"checkpoint_format", cs.format}};
}

const char* const kLinears[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

}  // namespace

bool is_linear_weight(const std::string& name) {
    for (const char* l : kLinears)
        if (name.find(std::string(l) + ".weight") != std::string::npos) return true;
    return false;
}

std::map<std::string, HfQuantTruth> write_pair(const ModelConfig& cfg, const HfQuantCase& cs, const std::string& hf,
                                        const std::string& ref, uint64_t seed,
                                        const std::function<void(nlohmann::json&)>& edit) {
    TempDir src;
    write_synthetic_checkpoint(src.path(), cfg, {DType::F16, 1, seed});
    std::mt19937 rng{uint32_t(seed)};
    std::map<std::string, HfQuantTruth> truth;
    std::map<std::string, std::vector<int64_t>> orders;  // by_group of each input
    std::vector<TensorToWrite> a, b;
    SafetensorsFile f(src.path() + "/model.safetensors");
    for (const auto& [name, info] : f.tensors()) {
        if (name.rfind("__pad_", 0) == 0) continue;
        const bool linear = is_linear_weight(name);
        if (!linear) {
            const TensorToWrite t{name, info.dtype_str, info.shape, std::vector<uint8_t>(info.data, info.data + info.nbytes)};
            a.push_back(t);
            b.push_back(t);
            continue;
        }
        // The order the tool quantized the columns in: one per input (q/k/v, gate/up) unless apart.
        std::string input = name;
        for (const char* part : {"q_proj", "k_proj", "v_proj"})
            if (!cs.orders_apart && input.find(part) != std::string::npos) input.replace(input.find(part), 6, "qkv");
        for (const char* part : {"gate_proj", "up_proj"})
            if (!cs.orders_apart && input.find(part) != std::string::npos) input.replace(input.find(part), std::strlen(part), "gate_up");
        std::vector<int64_t>& by_group = orders[input];
        if (by_group.empty()) {
            for (int64_t c = 0; c < info.shape[1]; ++c) by_group.push_back(c);
            if (cs.act_order) std::shuffle(by_group.begin(), by_group.end(), rng);
        }
        const HfQuantTruth t = make_truth(info.shape[0], info.shape[1], cs, by_group, rng);
        for (TensorToWrite& p : pack(name.substr(0, name.size() - 7), t, cs)) a.push_back(std::move(p));
        TensorToWrite w{name, "F32", info.shape, std::vector<uint8_t>(size_t(t.rows * t.cols) * 4)};
        for (int64_t r = 0; r < t.rows; ++r)
            for (int64_t c = 0; c < t.cols; ++c) {
                const float v = t.w(r, c);
                std::memcpy(&w.bytes[size_t(r * t.cols + c) * 4], &v, 4);
            }
        b.push_back(std::move(w));
        truth.emplace(name, t);
    }
    nlohmann::json config = nlohmann::json::parse(config_json(cfg));
    write_file(ref + "/config.json", config.dump(2));
    config["quantization_config"] = quant_config(cs);
    if (edit) edit(config);
    write_file(hf + "/config.json", config.dump(2));
    write_safetensors(hf + "/model.safetensors", a, true);
    write_safetensors(ref + "/model.safetensors", b, true);
    return truth;
}

}  // namespace shardlm::test
