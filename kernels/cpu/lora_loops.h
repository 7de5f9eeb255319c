// The loops of lora_add (kernels/cpu/lora.h) for the base ISA (lora.cpp), vectorised where the
// compiler can; lora_avx512.cpp spells the same loops out in AVX-512.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/lora.h"

namespace shardlm {
namespace {

// A factor as f32: F (float) as it is, BF16 (uint16_t) widened.
inline float widen(float v) { return v; }
inline float widen(uint16_t v) { return bf16_to_f32(v); }

template <typename F>
void lora_add_loops(const float* x, int64_t n, int64_t in, const F* a, const F* bt, int64_t rank, int64_t out, float* t,
                    float* y) {
    // Threads pay where the call reads more than a few hundred KB (decode reads A and Bt, 4 *
    // rank * (in + out) bytes, already past that for a 2048-wide model at rank 8).
    const bool par = n * rank * (in + out) >= (int64_t(1) << 16);
    const int64_t tiles = (out + kLoraTile - 1) / kLoraTile;
#pragma omp parallel if (par)
    {
        // x A^T: four of A's rows per task, so each x element loaded feeds four products (the
        // last task of a row takes what is left).
        const int64_t quads = (rank + 3) / 4;
#pragma omp for schedule(static)
        for (int64_t j = 0; j < n * quads; ++j) {
            const int64_t i = j / quads, k0 = j % quads * 4, kn = std::min<int64_t>(4, rank - k0);
            const float* xr = x + i * in;
            const F* a0 = a + k0 * in;
            const F* a1 = a + (k0 + std::min<int64_t>(1, kn - 1)) * in;
            const F* a2 = a + (k0 + std::min<int64_t>(2, kn - 1)) * in;
            const F* a3 = a + (k0 + std::min<int64_t>(3, kn - 1)) * in;
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int64_t c = 0; c < in; ++c) {
                s0 += xr[c] * widen(a0[c]);
                s1 += xr[c] * widen(a1[c]);
                s2 += xr[c] * widen(a2[c]);
                s3 += xr[c] * widen(a3[c]);
            }
            const float s[4] = {s0, s1, s2, s3};
            for (int64_t k = 0; k < kn; ++k) t[i * rank + k0 + k] = s[k];
        }
        // y += t Bt over Bt's column tiles (lora.h), each read as one stream: 16 of y's elements
        // at a time held in registers and summed over k in k's order, each loaded and stored once.
#pragma omp for schedule(static)
        for (int64_t b = 0; b < tiles; ++b) {
            const int64_t o0 = b * kLoraTile, w = std::min(kLoraTile, out - o0);
            const F* tile = bt + rank * o0;
            for (int64_t i = 0; i < n; ++i) {
                float* yr = y + i * out + o0;
                const float* tr = t + i * rank;
                int64_t o = 0;
                for (; o + 16 <= w; o += 16) {
                    float acc[16];
                    for (int l = 0; l < 16; ++l) acc[l] = yr[o + l];
                    for (int64_t k = 0; k < rank; ++k) {
                        const float tk = tr[k];
                        const F* br = tile + k * w + o;
                        for (int l = 0; l < 16; ++l) acc[l] += tk * widen(br[l]);
                    }
                    for (int l = 0; l < 16; ++l) yr[o + l] = acc[l];
                }
                for (; o < w; ++o) {
                    float acc = yr[o];
                    for (int64_t k = 0; k < rank; ++k) acc += tr[k] * widen(tile[k * w + o]);
                    yr[o] = acc;
                }
            }
        }
    }
}

}  // namespace
}  // namespace shardlm
