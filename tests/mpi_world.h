// The MPI world of a multi-rank test binary (see mpi_main.cpp).
#pragma once

#include "comm/mpi_comm.h"

namespace shardlm::test {
MpiComm& world();
}
