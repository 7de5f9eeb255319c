// The prefix cache on disk for the commands (generate --prompt-cache, serve --cache-file): what
// this session's keys and values depend on, and the load and save every rank makes of its own
// file (runtime/prefix_file.h).
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/prefix_file.h"
#include "runtime/session.h"

namespace shardlm {

// The key of this rank's keys and values: the checkpoint (a digest of its config, tensor names,
// shapes and a sample of each tensor's bytes: a fine-tune of the same model differs), the weight
// format, group size, --keep-fp16 and --lora flags, the KV format, the device kind, the rank and
// ranks, and the bytes per position.
PrefixFileKey prefix_file_key(const Session& s, const SessionOptions& so, const Communicator& comm);

// A command's prefix cache file: the path given (rank 0's), the flag that gave it (for messages:
// "--prompt-cache"), this session's key, the saves read, and whether the file was used.
struct PrefixCacheFile {
    std::string path, flag;
    PrefixFileKey key;
    std::vector<SavedPrefix> saved;
    bool used = false;
};

// Before the weights load: throws Error naming the flag unless this rank's file can be written.
void check_prefix_cache_path(const std::string& path, const std::string& flag, int rank);

// Every rank reads its file (a damaged one ends every rank, naming it). Unless each rank found one
// made with its key and all of them hold the same prefixes (the host tier's choices depend on its
// tokens, and every rank must make the same), all start empty (used false); rank 0 says on
// stderr what it loaded or why not.
PrefixCacheFile open_prefix_cache(Communicator& comm, const Session& s, const SessionOptions& so, const std::string& path,
                                  const std::string& flag);

// Every rank writes its file; a failure on any rank ends every rank, naming the file. `changed`
// false (the file was used, and the run saved nothing new): the files stay as they are.
void save_prefix_cache(Communicator& comm, const PrefixCacheFile& f, const std::vector<SavedPrefix>& saved, bool changed);

// Positions and bytes of saves, for the lines above ("3 prefixes, 812 positions (48.0 MB)").
std::string describe_saves(const std::vector<SavedPrefix>& saved);

}  // namespace shardlm
