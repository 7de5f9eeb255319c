// How the ranks of a tensor-parallel job talk. The host backends (single rank, MPI) work on host
// memory and return when the data is there; the NCCL backend (comm/nccl_comm.h) works on device
// memory, ordered on its CUDA stream. The engine calls these at the points the design
// names (all-reduce after the row-parallel o_proj and down_proj, all-gather of vocab-parallel
// logits); it never knows which backend runs underneath. A single process is the degenerate world
// of one rank, with no MPI at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace shardlm {

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual const char* backend() const = 0;
    // In-place sum over all ranks of n elements of `dt` (f32, f16 or bf16).
    virtual void all_reduce_sum(void* data, size_t n, DType dt) = 0;
    void all_reduce_sum(float* data, size_t n) { all_reduce_sum(data, n, DType::F32); }
    // Every rank contributes `bytes` bytes; `out` receives size() * bytes bytes in rank order.
    virtual void all_gather(const void* in, size_t bytes, void* out) = 0;
    // Copies `bytes` bytes from `root` to every rank.
    virtual void broadcast(void* data, size_t bytes, int root) = 0;
    // A broadcast the other ranks may wait on for long (rank 0 waiting for a server's next request
    // or a chat's next line): they sleep between polls instead of spinning a core each, at the
    // cost of up to ~2 ms more latency once a wait has passed ~0.2 ms. Every rank must call this
    // one (a blocking and a non-blocking broadcast do not match).
    virtual void broadcast_idle(void* data, size_t bytes, int root) { broadcast(data, bytes, root); }
    virtual void barrier() = 0;
    // Ends the whole job from any rank with a non-zero code; for failures in the middle of
    // collectives, where the other ranks cannot be told any other way.
    [[noreturn]] virtual void abort(int code) = 0;
};

// The world of one: every collective is the identity.
class SingleRank final : public Communicator {
public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    const char* backend() const override { return "single"; }
    using Communicator::all_reduce_sum;
    void all_reduce_sum(void*, size_t, DType) override {}
    void all_gather(const void* in, size_t bytes, void* out) override;
    void broadcast(void*, size_t, int) override {}
    void barrier() override {}
    [[noreturn]] void abort(int code) override;
};

// The communicator this process should use: MPI when it was started by mpirun (and the build has
// MPI), otherwise a single rank. Initialises MPI when needed; the object finalises it.
std::unique_ptr<Communicator> make_communicator(int* argc, char*** argv);

// Whether the environment says this process is one of several started by mpirun/srun.
bool launched_by_mpi();

}  // namespace shardlm
