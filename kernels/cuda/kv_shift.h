// The KV cache's context shift on the GPU (--context-overflow slide), kernels/cpu/kv_shift.h's
// operation on one layer's device cache (kv_layout.h): in `slot`, positions [keep + discard, len)
// move to [keep, len - discard), the keys turned back by `discard` positions (rotate-half RoPE by
// -discard, INT8 keys requantized), the values moved as they are. Device pointers; runs on `stream`
// between steps (never inside a captured graph).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kv_layout.h"

namespace shardlm {

void kv_shift_cuda(const DeviceKVLayer& kv, int64_t slot, int64_t keep, int64_t discard, int64_t len, int64_t head_dim,
                   const float* inv_freq, cudaStream_t stream);

}  // namespace shardlm
