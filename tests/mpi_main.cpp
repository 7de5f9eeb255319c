// main() of the multi-rank test binaries, run as `mpirun -np N test_x`: MPI comes up before the
// tests and goes down after them; only rank 0 prints GoogleTest's report.
#include <gtest/gtest.h>

#include "comm/mpi_comm.h"
#include "mpi_world.h"

namespace shardlm::test {
namespace {
MpiComm* g_world = nullptr;  // test-only: the one world of this process
}
MpiComm& world() { return *g_world; }
}  // namespace shardlm::test

int main(int argc, char** argv) {
    shardlm::MpiComm comm(&argc, &argv);
    shardlm::test::g_world = &comm;
    ::testing::InitGoogleTest(&argc, argv);
    if (comm.rank() != 0) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
    }
    const int rc = RUN_ALL_TESTS();
    // A failure on any rank fails the job.
    float failed = rc != 0 ? 1.0f : 0.0f;
    comm.all_reduce_sum(&failed, 1);
    return failed > 0 ? 1 : 0;
}
