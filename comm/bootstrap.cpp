// Picks the communicator for this process.
#include "comm/communicator.h"
#include "core/error.h"

#ifdef SHARDLM_HAVE_MPI
#include "comm/mpi_comm.h"
#endif

namespace shardlm {

std::unique_ptr<Communicator> make_communicator(int* argc, char*** argv) {
#ifdef SHARDLM_HAVE_MPI
    if (launched_by_mpi()) return std::make_unique<MpiComm>(argc, argv);
#else
    (void)argc;
    (void)argv;
    if (launched_by_mpi())
        fail("started by mpirun but this build has no MPI support (rebuild with libopenmpi-dev installed)");
#endif
    return std::make_unique<SingleRank>();
}

}  // namespace shardlm
