// Safetensors reader over a memory map. Layout of a file:
//   u64 little-endian N | N bytes of JSON header | data bytes
// header: {"name": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, "__metadata__": {...}}
// Offsets are relative to the start of the data. Every entry is validated against the file so
// that a lying header can never make us read outside the map.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mmap_file.h"

namespace shardlm {

struct TensorInfo {
    std::string name;
    std::string file;           // path of the safetensors file it lives in
    std::string dtype_str;      // as written, e.g. "BF16"
    bool dtype_known = false;   // dtype maps to a DType below
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    const uint8_t* data = nullptr;  // points into the map
    size_t nbytes = 0;

    int64_t numel() const;
    std::string shape_str() const;  // "[2048, 1024]"
};

class SafetensorsFile {
public:
    explicit SafetensorsFile(const std::string& path);  // maps and validates; throws Error

    const std::string& path() const { return map_.path(); }
    const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find(const std::string& name) const;

private:
    MappedFile map_;
    std::map<std::string, TensorInfo> tensors_;
};

// Element size in bytes of a safetensors dtype string, 0 if unknown.
size_t safetensors_dtype_size(const std::string& dtype);

}  // namespace shardlm
