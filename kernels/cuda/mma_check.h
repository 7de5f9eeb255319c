// The check of the tensor-core fragment layout that kernels/cuda/mma.h states and the attention
// kernels rely on: one warp multiplies plain row-major matrices through those fragments, once by
// the instruction (mma_16816: mma.sync on sm_80 and later) and once by its shuffle form. A test
// compares both with a plain product (tests/kernels/test_mma_cuda.cpp), so a layout that the
// hardware does not share fails there, one product at a time, before any attention result does.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm {

// a: 16 x 16 FP16 bits, row-major; b: 16 x 8 FP16 bits, row-major; c: 16 x 8 floats added to the
// products. d_mma and d_shuffle receive A B + C (16 x 8 floats, row-major). Device pointers.
void mma_product_cuda(const uint16_t* a, const uint16_t* b, const float* c, float* d_mma, float* d_shuffle,
                      cudaStream_t stream);

// The same product run once on the current device with exactly representable values (multiples of
// 1/8, every partial sum exact in FP32), both forms compared with the plain product on the host:
// whether this GPU's tensor cores use mma.h's fragment layout. The kernels that rely on it (the
// prefill attention and the tensor-core GEMV) are switched off where it fails, with a warning,
// rather than computing garbage on hardware the layout was never run on. Synchronous: call it
// outside stream capture (prefill_tensor_cores() calls it once per process).
bool mma_layout_holds();

}  // namespace shardlm
