#include "kernels/cuda/mma_check.h"

#include "kernels/cuda/launch.h"
#include "kernels/cuda/mma.h"

namespace shardlm {
namespace {

// Two FP16 values of a row-major matrix (the one at column col in the low half).
__device__ __forceinline__ uint32_t pair_at(const uint16_t* m, int ld, int row, int col) {
    return uint32_t(m[row * ld + col]) | (uint32_t(m[row * ld + col + 1]) << 16);
}

__device__ __forceinline__ uint32_t col_pair_at(const uint16_t* m, int ld, int row, int col) {
    return uint32_t(m[row * ld + col]) | (uint32_t(m[(row + 1) * ld + col]) << 16);
}

// One warp: the fragments of mma.h's layout loaded from A and B, the product both ways, D stored
// by the same layout.
__global__ void mma_product_kernel(const uint16_t* a, const uint16_t* b, const float* c, float* d_mma,
                                   float* d_shuffle) {
    pdl_wait();
    pdl_launch_dependents();
    const int lane = int(threadIdx.x), g = lane >> 2, t = lane & 3;
    const uint32_t af[4] = {pair_at(a, 16, g, 2 * t), pair_at(a, 16, g + 8, 2 * t), pair_at(a, 16, g, 2 * t + 8),
                            pair_at(a, 16, g + 8, 2 * t + 8)};
    const uint32_t bf[2] = {col_pair_at(b, 8, 2 * t, g), col_pair_at(b, 8, 2 * t + 8, g)};
    float d1[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
    float d2[4] = {d1[0], d1[1], d1[2], d1[3]};
    mma_16816(d1, af, bf);
    mma_16816_shuffle(d2, af, bf);
    for (int e = 0; e < 4; ++e) {
        const int i = (g + (e >= 2 ? 8 : 0)) * 8 + 2 * t + (e & 1);
        d_mma[i] = d1[e];
        d_shuffle[i] = d2[e];
    }
}

}  // namespace

void mma_product_cuda(const uint16_t* a, const uint16_t* b, const float* c, float* d_mma, float* d_shuffle,
                      cudaStream_t stream) {
    launch_kernel("mma_product_kernel", mma_product_kernel, dim3(1), dim3(32), 0, stream, a, b, c, d_mma, d_shuffle);
}

}  // namespace shardlm
