#include "model/safetensors.h"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm {

using nlohmann::json;

int64_t TensorInfo::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string TensorInfo::shape_str() const {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

size_t safetensors_dtype_size(const std::string& d) {
    if (d == "F64" || d == "I64" || d == "U64") return 8;
    if (d == "F32" || d == "I32" || d == "U32") return 4;
    if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
    if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
    return 0;
}

namespace {

bool to_dtype(const std::string& d, DType* out) {
    if (d == "F32") *out = DType::F32;
    else if (d == "F16") *out = DType::F16;
    else if (d == "BF16") *out = DType::BF16;
    else if (d == "I8") *out = DType::I8;
    else if (d == "I32") *out = DType::I32;
    else if (d == "U8") *out = DType::U8;
    else return false;
    return true;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : map_(path) {
    const uint8_t* base = map_.data();
    const size_t size = map_.size();
    if (size < 8) fail(path, ": truncated safetensors file (", size, " bytes, no header length)");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | base[i];  // little-endian
    if (hlen > size - 8) fail(path, ": header length ", hlen, " is larger than the file (", size, " bytes)");
    const size_t data_start = 8 + size_t(hlen);
    const size_t data_size = size - data_start;

    json header;
    try {
        header = json::parse(base + 8, base + data_start);
    } catch (const json::exception& e) {
        fail(path, ": malformed safetensors header: ", e.what());
    }
    if (!header.is_object()) fail(path, ": safetensors header is not a JSON object");

    struct Span { size_t begin, end; const std::string* name; };
    std::vector<Span> spans;
    for (auto it = header.begin(); it != header.end(); ++it) {
        if (it.key() == "__metadata__") continue;
        const std::string& name = it.key();
        const json& e = it.value();
        auto bad = [&](const std::string& why) { fail(path, ": tensor ", name, ": ", why); };
        if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
            bad("entry needs dtype, shape and data_offsets");
        if (!e["dtype"].is_string()) bad("dtype is not a string");
        TensorInfo t;
        t.name = name;
        t.file = path;
        t.dtype_str = e["dtype"].get<std::string>();
        const size_t esize = safetensors_dtype_size(t.dtype_str);
        if (esize == 0) bad("unknown dtype \"" + t.dtype_str + "\"");
        t.dtype_known = to_dtype(t.dtype_str, &t.dtype);
        if (!e["shape"].is_array()) bad("shape is not an array");
        uint64_t numel = 1;
        for (const auto& d : e["shape"]) {
            if (!d.is_number_unsigned()) bad("shape has a non-integer or negative dimension");
            const uint64_t v = d.get<uint64_t>();
            if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / v) bad("shape overflows");
            numel *= v;
            t.shape.push_back(int64_t(v));
        }
        const json& off = e["data_offsets"];
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
            bad("data_offsets must be two non-negative integers");
        const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
        if (b > en) bad("data_offsets begin > end");
        if (en > data_size)
            bad(cat("data_offsets [", b, ", ", en, "] run past the end of the data (", data_size,
                    " bytes): file truncated or header lying"));
        if (en - b != numel * esize)
            bad(cat("data_offsets cover ", en - b, " bytes but shape ", t.shape_str(), " of ", t.dtype_str,
                    " needs ", numel * esize));
        t.data = base + data_start + b;
        t.nbytes = size_t(en - b);
        spans.push_back({size_t(b), size_t(en), nullptr});
        auto ins = tensors_.emplace(name, std::move(t));
        spans.back().name = &ins.first->first;
    }
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < spans.size(); ++i) {
        if (spans[i].begin < spans[i - 1].end && spans[i].end > spans[i].begin)
            fail(path, ": tensors ", *spans[i - 1].name, " and ", *spans[i].name, " overlap in the data");
    }
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace shardlm
