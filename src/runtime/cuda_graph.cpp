#include "runtime/cuda_graph.h"

#include <cstdio>

#include "kernels/cuda/cuda_check.h"

namespace shardlm {

SegmentedGraph::~SegmentedGraph() {
    abandon();
    for (cudaGraphExec_t e : execs_)
        if (cudaGraphExecDestroy(e) != cudaSuccess) std::fprintf(stderr, "shardlm: warning: cudaGraphExecDestroy failed\n");
}

void SegmentedGraph::begin(cudaStream_t stream) {
    SHARDLM_CHECK(!capturing_ && execs_.empty(), "graph segments captured twice");
    stream_ = stream;
    // Thread-local mode: only this thread's unsafe calls (e.g. a stray synchronous copy) break the
    // capture, with an error at the call, instead of silently escaping into the graph.
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
}

void SegmentedGraph::close_segment() {
    cudaGraph_t g = nullptr;
    capturing_ = false;
    CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    CUDA_CHECK(e);
    execs_.push_back(exec);
    between_.emplace_back();
}

void SegmentedGraph::cut(std::function<void()> between) {
    SHARDLM_CHECK(capturing_, "graph cut outside a capture");
    close_segment();
    between_.back() = std::move(between);
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
}

void SegmentedGraph::end() {
    SHARDLM_CHECK(capturing_, "graph end outside a capture");
    close_segment();
}

void SegmentedGraph::abandon() noexcept {
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(stream_, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    cudaGetLastError();  // the capture's own error, if any, was reported where it happened
}

void SegmentedGraph::replay(cudaStream_t stream) const {
    for (size_t i = 0; i < execs_.size(); ++i) {
        CUDA_CHECK(cudaGraphLaunch(execs_[i], stream));
        if (between_[i]) between_[i]();
    }
}

}  // namespace shardlm
