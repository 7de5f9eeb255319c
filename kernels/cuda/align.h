// Pointer alignment, for the launchers' choice between a vector path (16-byte loads and stores,
// which fault on a misaligned address) and a scalar one.
#pragma once

#include <cstdint>

namespace shardlm {

inline bool is_aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace shardlm
