#include "core/error.h"

namespace shardlm {

void check_failed(const char* what, const char* stmt, const char* file, int line,
                  const std::string& detail) {
    std::string msg = cat(what, " failed: ", stmt, " at ", file, ":", line);
    if (!detail.empty()) msg += cat(": ", detail);
    throw Error(msg);
}

}  // namespace shardlm
