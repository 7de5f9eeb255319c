#include "model/safetensors_writer.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/buffer.h"
#include "core/error.h"

namespace shardlm {

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    header["__metadata__"] = {{"format", "pt"}};
    uint64_t off = 0;
    for (const auto& t : tensors) {
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
    for (const auto& t : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
    if (!out) fail(path, ": write failed");
}

}  // namespace shardlm
