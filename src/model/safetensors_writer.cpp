#include "model/safetensors_writer.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/buffer.h"
#include "core/error.h"

namespace shardlm {

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors, bool align_tensors) {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    header["__metadata__"] = {{"format", "pt"}};
    uint64_t off = 0;
    std::vector<uint64_t> pads;  // padding bytes before each tensor
    for (const auto& t : tensors) {
        const uint64_t pad = align_tensors ? align_up(off) - off : 0;
        if (pad > 0) {
            header["__pad_" + std::to_string(pads.size())] = {{"dtype", "U8"}, {"shape", {pad}}, {"data_offsets", {off, off + pad}}};
            off += pad;
        }
        pads.push_back(pad);
        header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
        off += t.bytes.size();
    }
    std::string h = header.dump();
    h.resize(align_up(8 + h.size()) - 8, ' ');
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, ": cannot create");
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(h.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(h.data(), std::streamsize(h.size()));
    const std::vector<char> zeros(kAlign, 0);
    for (size_t i = 0; i < tensors.size(); ++i) {
        out.write(zeros.data(), std::streamsize(pads[i]));
        out.write(reinterpret_cast<const char*>(tensors[i].bytes.data()), std::streamsize(tensors[i].bytes.size()));
    }
    if (!out) fail(path, ": write failed");
}

}  // namespace shardlm
