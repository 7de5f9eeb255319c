// Prefill matrix products through cuBLAS: y[T, rows] = x[T, cols] * W^T (+ bias), x and y f32.
// F32 weights run SGEMM in full FP32 (no TF32: results comparable with the CPU backend); F16/BF16
// weights convert x to the weights' type and run GemmEx with FP32 accumulation; I8 and I4 weights
// are dequantized into an F16 scratch matrix first (W8A16 and W4A16 prefill are compute-bound, so
// the extra pass over the weights is cheap next to the product). Bias is added by a small kernel
// after.
//
// Staging hides that pass: stage(w) dequantizes an INT8 or INT4 matrix on a side stream into a second
// scratch while the products before it run, and run(w) then only waits for it. The engine stages
// matrix i + 1 just before it runs matrix i, so each dequantization overlaps a product and the
// latency-bound kernels between (a prefill GEMM of a few hundred tokens leaves SMs idle).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/half_input.h"
#include "kernels/cuda/matrix.h"

struct cublasContext;

namespace shardlm {

class CublasGemm {
public:
    // Scratch for the largest product the engine will ask for: max_tokens rows of at most
    // max_cols inputs; I8/I4 weights are dequantized max_weight_elems elements (whole rows) at a time.
    // stage_elems > 0 adds the staging scratch (a side stream and a second buffer of that many
    // elements; stage() takes matrices of up to max_weight_elems elements).
    CublasGemm(cudaStream_t stream, int64_t max_tokens, int64_t max_cols, int64_t max_weight_elems,
               int64_t stage_elems = 0);
    ~CublasGemm();
    CublasGemm(const CublasGemm&) = delete;
    CublasGemm& operator=(const CublasGemm&) = delete;

    // x null: the input is already in input_for(w) (written by its producer, half_input.h) and the
    // conversion is skipped; only for weights that take a 16-bit input (not F32).
    void run(const DeviceMatrix& w, const float* x, int64_t T, const float* bias, float* y);
    // Where and in what form run(w, ...) takes its input as 16 bits: the scratch it converts x into,
    // the weights' 16-bit type (F16 for I8 and I4) and their column order; data null for F32 weights.
    HalfInput input_for(const DeviceMatrix& w) const;
    // Starts dequantizing INT8 or INT4 `w` for a later run(w) on the side stream, in a free scratch slot.
    // Returns whether it did (or had): false without staging scratch, for other dtypes, for a
    // matrix larger than a free slot, and while the stream is being captured (a graph replays
    // its products with their own dequantization). A staged matrix must be run before the next
    // capture on this stream; one that is never run only holds its slot until a run() needs it.
    bool stage(const DeviceMatrix& w);
    size_t scratch_bytes() const { return scratch_bytes_; }

private:
    // A dequantization scratch: slot 0 is w_half_ (also the unstaged path's), slot 1 the staging
    // buffer. owner: the staged matrix's data, until its run(); ready: recorded on the side stream
    // after its dequantization; done: on the main stream after the last product that read it, so
    // the side stream never overwrites a buffer still being read; graph: a captured product reads
    // slot 0 (replays are ordered only on the main stream).
    struct Slot {
        void* buf = nullptr;
        int64_t elems = 0;
        const void* owner = nullptr;
        cudaEvent_t ready = nullptr, done = nullptr;
        bool graph = false;
    };
    void release() noexcept;

    cudaStream_t stream_ = nullptr;
    cublasContext* handle_ = nullptr;
    void* x_half_ = nullptr;     // [max_tokens, max_cols] f16/bf16 copy of x
    void* w_half_ = nullptr;     // [max_weight_elems] f16 dequantized I8/I4 weights
    void* workspace_ = nullptr;  // cuBLAS workspace (set so products can be graph-captured)
    int64_t max_tokens_ = 0, max_cols_ = 0, max_weight_elems_ = 0;
    size_t scratch_bytes_ = 0;
    cudaStream_t side_ = nullptr;  // staging only
    Slot slots_[2];
};

}  // namespace shardlm
