// Read-only memory map of a whole file (RAII). Tensors point into the map; nothing is copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardlm {

class MappedFile {
public:
    explicit MappedFile(const std::string& path);  // throws Error naming the path
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

// Drops the whole pages of [p, p + n), part of a read-only file map, from this process's memory
// (MADV_DONTNEED): a later read faults them in again from the page cache. For maps copied out of.
void release_mapped_pages(const void* p, size_t n);

// Whole small file into a string (config.json and friends); throws Error naming the path.
std::string read_text_file(const std::string& path);
bool file_exists(const std::string& path);

// Why `path` cannot be written, found without creating or changing anything; "" when it can. A
// file (folder false): an existing one that is not a folder, with write permission, or a new one
// in a folder that lets files be created. A folder (folder true): an existing one that lets files be
// created in it, or a new one (mkdir, one level) in such a folder. The reason is strerror's
// ("No such file or directory", "Permission denied", "Is a directory", ...). For output flags
// checked before a long load or run: generate --dump-logits, quantize --out.
std::string unwritable_reason(const std::string& path, bool folder = false);

}  // namespace shardlm
