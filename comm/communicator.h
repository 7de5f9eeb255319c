// How the ranks of a tensor-parallel job talk. The engine calls these at the points the design
// names (all-reduce after the row-parallel o_proj and down_proj); it never knows which backend
// runs underneath. A single process is the degenerate world of one rank, with no MPI at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardlm {

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual const char* backend() const = 0;
    // In-place sum over all ranks of n floats.
    virtual void all_reduce_sum(float* data, size_t n) = 0;
    // Every rank contributes `n` floats; `out` receives size() * n floats in rank order.
    virtual void all_gather(const float* in, size_t n, float* out) = 0;
    // Copies `bytes` bytes from `root` to every rank.
    virtual void broadcast(void* data, size_t bytes, int root) = 0;
    virtual void barrier() = 0;
    // Ends the whole job from any rank with a non-zero code; used when this rank has failed.
    [[noreturn]] virtual void abort(int code) = 0;
};

// The world of one: every collective is the identity.
class SingleRank final : public Communicator {
public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    const char* backend() const override { return "single"; }
    void all_reduce_sum(float*, size_t) override {}
    void all_gather(const float* in, size_t n, float* out) override;
    void broadcast(void*, size_t, int) override {}
    void barrier() override {}
    [[noreturn]] void abort(int code) override;
};

}  // namespace shardlm
