#include "comm/together.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace shardlm {

void run_together(Communicator& comm, const std::function<void()>& phase) {
    std::string err;
    try {
        phase();
    } catch (const std::bad_alloc&) {
        err = "out of memory";
    } catch (const std::exception& e) {
        err = e.what();
    }
    if (comm.size() == 1) {
        if (!err.empty()) throw AgreedError(err);
        return;
    }
    const int32_t failed = err.empty() ? 0 : 1;
    std::vector<int32_t> all(size_t(comm.size()));
    comm.all_gather(&failed, sizeof failed, all.data());
    int first = -1;
    for (int r = 0; r < comm.size() && first < 0; ++r)
        if (all[size_t(r)]) first = r;
    if (first < 0) return;
    uint64_t len = comm.rank() == first ? err.size() : 0;
    comm.broadcast(&len, sizeof len, first);
    std::string msg(len, '\0');
    if (comm.rank() == first) msg = err;
    comm.broadcast(msg.data(), len, first);
    throw AgreedError(cat("rank ", first, ": ", msg));
}

int first_differing_rank(Communicator& comm, const std::string& value) {
    if (comm.size() == 1) return -1;
    // Compare fixed-size digests (FNV-1a 64) so ranks never need each other's string lengths.
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : value) h = (h ^ c) * 1099511628211ull;
    std::vector<uint64_t> all(size_t(comm.size()));
    comm.all_gather(&h, sizeof h, all.data());
    for (int r = 1; r < comm.size(); ++r)
        if (all[size_t(r)] != all[0]) return r;
    return -1;
}

void check_same_on_all_ranks(Communicator& comm, const std::string& value, const std::string& what) {
    const int r = first_differing_rank(comm, value);
    if (r >= 0) fail("ranks disagree on ", what, ": rank ", r, " differs from rank 0");
}

void maybe_inject_failure(const Communicator& comm, const char* phase) {
    const char* r = std::getenv("SHARDLM_FAIL_RANK");
    const char* p = std::getenv("SHARDLM_FAIL_PHASE");
    if (!r || !p || std::strcmp(p, phase) != 0 || std::atoi(r) != comm.rank()) return;
    fail("injected failure at phase ", phase, " (SHARDLM_FAIL_RANK/SHARDLM_FAIL_PHASE)");
}

}  // namespace shardlm
