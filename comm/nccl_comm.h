// NCCL on device buffers: the data plane of tensor parallelism on GPUs. MPI stays the control
// plane (bootstrap, agreeing on errors, broadcasting requests); this class only moves activations.
// Every collective is enqueued on stream() and returns at once, so the engine can launch it
// between two CUDA Graph replays on the same stream; nothing here is ever captured in a graph.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/communicator.h"
#include "comm/mpi_comm.h"
#include "core/error.h"

#define NCCL_CHECK(stmt)                                                                   \
    do {                                                                                   \
        const ncclResult_t nccl_rc_ = (stmt);                                              \
        SHARDLM_CHECK_GEN("NCCL", nccl_rc_ == ncclSuccess, #stmt, ncclGetErrorString(nccl_rc_)); \
    } while (0)

namespace shardlm {

class NcclComm final : public Communicator {
public:
    // Selects the GPU of the node-local rank (local_rank % device count), creates a stream, and
    // joins the NCCL world: rank 0 makes the unique id and `mpi` broadcasts it.
    explicit NcclComm(MpiComm& mpi);
    ~NcclComm() override;
    NcclComm(const NcclComm&) = delete;
    NcclComm& operator=(const NcclComm&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    const char* backend() const override { return "nccl"; }
    int device() const { return device_; }
    cudaStream_t stream() const { return stream_; }

    // Device memory, ordered on stream().
    using Communicator::all_reduce_sum;
    void all_reduce_sum(void* data, size_t n, DType dt) override;
    void all_gather(const void* in, size_t bytes, void* out) override;
    void broadcast(void* data, size_t bytes, int root) override;
    // Waits for the stream, polling NCCL's asynchronous error state; a peer that died or a
    // stream that does not finish within timeout_ms aborts the communicator and throws.
    void synchronize(int timeout_ms = 60000);
    void barrier() override;
    [[noreturn]] void abort(int code) override;

private:
    MpiComm& mpi_;
    ncclComm_t comm_ = nullptr;
    cudaStream_t stream_ = nullptr;
    int rank_ = 0, size_ = 1, device_ = 0;
    bool aborted_ = false;
};

}  // namespace shardlm
