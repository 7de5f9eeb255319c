// The prefix cache on disk (generate --prompt-cache, serve --cache-file): the host tier's saved
// prefixes (runtime/batcher.h: SavedPrefix) in one file per rank, with a key that names what made
// them, so that a later run of the same model starts with them instead of prefilling them again
// (llama.cpp's --prompt-cache and its server's slot save/restore).
//
// Layout: the 8 bytes "SHLMKV01"; a little-endian u64 n and n bytes of JSON
// {"key": {...}, "prefixes": [tokens of each]}; then each prefix's int32 tokens followed by its
// keys and values (tokens x key's position_bytes), oldest use first. The file's size is exactly
// what the JSON says, so a cut-off write is found before anything is used.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "runtime/batcher.h"

namespace shardlm {

// What a cache's keys and values depend on, field by field ("model", "weights", "kv", "device",
// "rank", "ranks", "position_bytes", ...): a file is used only when every field is equal.
using PrefixFileKey = std::map<std::string, std::string>;

// Under tensor parallelism each rank keeps its own heads: `path` is rank 0's file, path.rank<r>
// rank r's.
std::string prefix_file_path(const std::string& path, int rank);

// Writes the saves atomically (a temporary file beside it, then a rename), so a reader never sees
// half a file; throws Error naming the file. key must hold "position_bytes", and each kv must be
// tokens x that many bytes.
void write_prefix_file(const std::string& path, const PrefixFileKey& key, const std::vector<SavedPrefix>& saved);

// Reads the saves of a file written with an equal key into `out` and returns true. No file:
// false, `why` empty. A prefix cache made with another key: false, `why` names the first field
// that differs ("kv is int8 there, fp32 here"). Anything else (not a prefix cache, cut off,
// sizes that disagree): throws Error naming the file.
bool read_prefix_file(const std::string& path, const PrefixFileKey& key, std::vector<SavedPrefix>& out, std::string& why);

}  // namespace shardlm
