#include "kernels/cuda/mma_check.h"

#include <cstdio>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/cuda_check.h"
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

bool mma_layout_holds() {
    std::vector<float> a(16 * 16), b(16 * 8), c(16 * 8);
    uint32_t z = 12345;
    for (auto* m : {&a, &b, &c})
        for (auto& x : *m) {
            z = z * 1664525u + 1013904223u;
            x = float(int32_t(z >> 9) % 65 - 32) / 8.0f;  // -4 .. 4 in steps of 1/8
        }
    std::vector<uint16_t> ah(a.size()), bh(b.size());
    for (size_t i = 0; i < a.size(); ++i) ah[i] = f32_to_f16(a[i]);
    for (size_t i = 0; i < b.size(); ++i) bh[i] = f32_to_f16(b[i]);
    void* dev = nullptr;  // a | b | c | d_mma | d_shuffle
    const size_t bytes = (ah.size() + bh.size()) * 2 + (c.size() * 3) * 4;
    CUDA_CHECK(cudaMalloc(&dev, bytes));
    uint16_t* da = static_cast<uint16_t*>(dev);
    uint16_t* db = da + ah.size();
    float* dc = reinterpret_cast<float*>(db + bh.size());
    float* dm = dc + c.size();
    float* ds = dm + c.size();
    std::vector<float> got(c.size() * 2);
    cudaError_t e = cudaMemcpy(da, ah.data(), ah.size() * 2, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(db, bh.data(), bh.size() * 2, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(dc, c.data(), c.size() * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) {
        mma_product_cuda(da, db, dc, dm, ds, nullptr);
        e = cudaMemcpy(got.data(), dm, got.size() * 4, cudaMemcpyDeviceToHost);  // d_mma | d_shuffle
    }
    cudaFree(dev);
    CUDA_CHECK(e);
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) {
            float s = c[size_t(i * 8 + j)];
            for (int k = 0; k < 16; ++k) s += a[size_t(i * 16 + k)] * b[size_t(k * 8 + j)];  // exact
            if (got[size_t(i * 8 + j)] != s || got[size_t(128 + i * 8 + j)] != s) {
                std::fprintf(stderr,
                             "shardlm: warning: this GPU's tensor-core fragment layout differs from "
                             "kernels/cuda/mma.h (product element %d,%d); tensor-core attention prefill and GEMV "
                             "are off\n",
                             i, j);
                return false;
            }
        }
    return true;
}

}  // namespace shardlm
