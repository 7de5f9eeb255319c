// A kernel that reads a buffer once as fast as the memory system delivers it and does nothing
// else: the floor a decode GEMV could reach on the same bytes. bench/gemv_bench_cuda times a decode
// step's sequence of matrices read this way against the same sequence of GEMVs, which says how
// much of a step's distance from the bandwidth roofline the kernel boundaries themselves cost.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace shardlm {

// *sum += the wrapping sum of the buffer's 32-bit words (so that no load can be dropped, and a
// test can check every word was read). p 16-byte aligned, bytes a multiple of 16. Each thread
// issues its first loads before waiting on the kernel before it (PDL, launch.h), as the decode
// GEMV does with its first tile, and the rest after.
void stream_read_cuda(const void* p, size_t bytes, uint32_t* sum, cudaStream_t stream);

}  // namespace shardlm
