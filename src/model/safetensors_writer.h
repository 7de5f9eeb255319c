// Writes a safetensors file (the format SafetensorsFile reads). Tensors are laid out back to back
// in the order added, as the format requires; the header is padded with spaces so the data starts
// on a 128-byte boundary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardlm {

struct TensorToWrite {
    std::string name;
    std::string dtype;  // "F32", "F16", "BF16", "I8", ...
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

// With align_tensors, every tensor starts on a 128-byte boundary: the gaps are filled by U8
// entries named "__pad_<n>" (the format wants tensors back to back), which readers ignore.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors, bool align_tensors = false);

}  // namespace shardlm
