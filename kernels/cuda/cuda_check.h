// CUDA_CHECK: the CUDA member of the one error family (core/error.h). Never compiled out.
// SHARDLM_DEBUG_SYNC=1 makes every launcher synchronise so an asynchronous fault is reported
// at the kernel that caused it.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define CUDA_CHECK(stmt)                                                                    \
    do {                                                                                    \
        const cudaError_t err_ = (stmt);                                                    \
        SHARDLM_CHECK_GEN("CUDA", err_ == cudaSuccess, #stmt, cudaGetErrorString(err_));   \
    } while (0)

namespace shardlm {

// After a launch: checks the launch itself and, under SHARDLM_DEBUG_SYNC=1, waits for the stream.
void cuda_after_launch(cudaStream_t stream, const char* kernel);

}  // namespace shardlm
