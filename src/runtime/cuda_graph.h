// CUDA Graph segments of one decode step. The work between two collectives is captured as one
// graph; the collective itself (an NCCL all-reduce or all-gather) is recorded as a host callback
// that launches it on the same stream between two replays, so no collective is ever inside a
// capture. With one rank there are no cuts and the whole step is a single graph.
//
//   capture:  begin(s) ... kernels ... cut(op1) ... kernels ... cut(op2) ... kernels ... end()
//   replay:   graph0, op1(), graph1, op2(), graph2        (all on stream s, nothing waits)
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <vector>

namespace shardlm {

class SegmentedGraph {
public:
    SegmentedGraph() = default;
    ~SegmentedGraph();
    SegmentedGraph(const SegmentedGraph&) = delete;
    SegmentedGraph& operator=(const SegmentedGraph&) = delete;

    void begin(cudaStream_t stream);
    // Ends the current segment; `between` runs after its replay (and before the next segment's).
    void cut(std::function<void()> between);
    void end();
    // Aborts a capture after an error so the stream is usable (or at least not left capturing).
    void abandon() noexcept;
    bool capturing() const { return capturing_; }
    bool ready() const { return !execs_.empty() && !capturing_; }
    size_t segments() const { return execs_.size(); }

    void replay(cudaStream_t stream) const;

private:
    void close_segment();
    cudaStream_t stream_ = nullptr;
    bool capturing_ = false;
    std::vector<cudaGraphExec_t> execs_;
    std::vector<std::function<void()>> between_;  // between_[i] runs after execs_[i]
};

}  // namespace shardlm
