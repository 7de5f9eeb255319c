// The loops of lora_add (kernels/cpu/lora.h) for the base ISA (lora.cpp), vectorised where the
// compiler can; lora_avx512.cpp spells the same loops out in AVX-512.
#pragma once

#include <algorithm>
#include <cstdint>

namespace shardlm {
namespace {

void lora_add_loops(const float* x, int64_t n, int64_t in, const float* a, const float* bt, int64_t rank, int64_t out,
                    float* t, float* y) {
    // Threads pay where the call reads more than a few hundred KB (decode reads A and Bt, 4 *
    // rank * (in + out) bytes, already past that for a 2048-wide model at rank 8).
    const bool par = n * rank * (in + out) >= (int64_t(1) << 16);
    constexpr int64_t kBlock = 512;  // y's columns per task: a block of Bt's rows stays in L1/L2
    const int64_t blocks = (out + kBlock - 1) / kBlock;
#pragma omp parallel if (par)
    {
        // x A^T: four of A's rows per task, so each x element loaded feeds four products (the
        // last task of a row takes what is left).
        const int64_t quads = (rank + 3) / 4;
#pragma omp for schedule(static)
        for (int64_t j = 0; j < n * quads; ++j) {
            const int64_t i = j / quads, k0 = j % quads * 4, kn = std::min<int64_t>(4, rank - k0);
            const float* xr = x + i * in;
            const float* a0 = a + k0 * in;
            const float* a1 = a + (k0 + std::min<int64_t>(1, kn - 1)) * in;
            const float* a2 = a + (k0 + std::min<int64_t>(2, kn - 1)) * in;
            const float* a3 = a + (k0 + std::min<int64_t>(3, kn - 1)) * in;
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int64_t c = 0; c < in; ++c) {
                s0 += xr[c] * a0[c];
                s1 += xr[c] * a1[c];
                s2 += xr[c] * a2[c];
                s3 += xr[c] * a3[c];
            }
            const float s[4] = {s0, s1, s2, s3};
            for (int64_t k = 0; k < kn; ++k) t[i * rank + k0 + k] = s[k];
        }
        // y += t Bt: 16 of y's elements at a time held in registers and summed over k in k's
        // order, each loaded and stored once.
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; ++b) {
            const int64_t o0 = b * kBlock, len = std::min(kBlock, out - o0);
            for (int64_t i = 0; i < n; ++i) {
                float* yr = y + i * out + o0;
                const float* tr = t + i * rank;
                int64_t o = 0;
                for (; o + 16 <= len; o += 16) {
                    float acc[16];
                    for (int l = 0; l < 16; ++l) acc[l] = yr[o + l];
                    for (int64_t k = 0; k < rank; ++k) {
                        const float tk = tr[k];
                        const float* br = bt + k * out + o0 + o;
                        for (int l = 0; l < 16; ++l) acc[l] += tk * br[l];
                    }
                    for (int l = 0; l < 16; ++l) yr[o + l] = acc[l];
                }
                for (; o < len; ++o) {
                    float acc = yr[o];
                    for (int64_t k = 0; k < rank; ++k) acc += tr[k] * bt[k * out + o0 + o];
                    yr[o] = acc;
                }
            }
        }
    }
}

}  // namespace
}  // namespace shardlm
