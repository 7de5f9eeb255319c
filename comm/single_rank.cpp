#include <cstdlib>
#include <cstring>

#include "comm/communicator.h"

namespace shardlm {

void SingleRank::all_gather(const void* in, size_t bytes, void* out) {
    if (in != out) std::memmove(out, in, bytes);
}

void SingleRank::abort(int code) { std::_Exit(code); }

bool launched_by_mpi() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
        if (std::getenv(v)) return true;
    return false;
}

}  // namespace shardlm
