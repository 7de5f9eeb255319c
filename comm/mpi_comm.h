// MPI on host buffers: the CPU backend's tensor parallelism and the bootstrap of NCCL.
#pragma once

#include <mpi.h>

#include "comm/communicator.h"
#include "core/error.h"

// Every MPI call is checked: errors return (MPI_ERRORS_RETURN) and become shardlm::Error.
#define MPI_CHECK(stmt)                                                                  \
    do {                                                                                 \
        const int mpi_rc_ = (stmt);                                                      \
        SHARDLM_CHECK_GEN("MPI", mpi_rc_ == MPI_SUCCESS, #stmt, ::shardlm::mpi_error_string(mpi_rc_)); \
    } while (0)

namespace shardlm {

std::string mpi_error_string(int rc);

class MpiComm final : public Communicator {
public:
    // Initialises MPI (if nobody has) and owns its finalisation.
    MpiComm(int* argc, char*** argv);
    ~MpiComm() override;
    MpiComm(const MpiComm&) = delete;
    MpiComm& operator=(const MpiComm&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    const char* backend() const override { return "mpi"; }
    // Rank within this node (MPI_COMM_TYPE_SHARED split): selects the GPU.
    int local_rank() const { return local_rank_; }
    int local_size() const { return local_size_; }  // ranks on this node

    using Communicator::all_reduce_sum;
    void all_reduce_sum(void* data, size_t n, DType dt) override;
    void all_gather(const void* in, size_t bytes, void* out) override;
    void broadcast(void* data, size_t bytes, int root) override;
    void broadcast_idle(void* data, size_t bytes, int root) override;
    void barrier() override;
    [[noreturn]] void abort(int code) override;

private:
    bool owns_init_ = false;
    int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

}  // namespace shardlm
