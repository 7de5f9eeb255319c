#include <cstdlib>
#include <cstring>

#include "comm/communicator.h"

namespace shardlm {

void SingleRank::all_gather(const float* in, size_t n, float* out) {
    if (in != out) std::memmove(out, in, n * sizeof(float));
}

void SingleRank::abort(int code) { std::_Exit(code); }

}  // namespace shardlm
