// The loops of lora_add_jobs (kernels/cpu/lora.h) for the base ISA (lora.cpp), vectorised where
// the compiler can; lora_avx512.cpp spells the same loops out in AVX-512.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/lora_jobs.h"

namespace shardlm {
namespace {

// A factor as f32: F (float) as it is, BF16 (uint16_t) widened.
inline float widen(float v) { return v; }
inline float widen(uint16_t v) { return bf16_to_f32(v); }

// t[i, k0..k0+3] = x[i] . A[k] for four of A's rows at once, so each x element loaded feeds four
// products (the last task of a row takes what is left).
template <typename F>
void lora_shrink_quad(const LoraJob& J, int64_t i, int64_t k0, float* t) {
    const F* a = static_cast<const F*>(J.a);
    const int64_t in = J.in, kn = std::min<int64_t>(4, J.rank - k0);
    const float* xr = J.x + i * in;
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
    for (int64_t k = 0; k < kn; ++k) t[i * J.rank + k0 + k] = s[k];
}

// y += t Bt over column tile b (lora.h), read as one stream: 16 of y's elements at a time held in
// registers and summed over k in k's order, each loaded and stored once.
template <typename F>
void lora_expand_tile(const LoraJob& J, int64_t b, const float* t) {
    const int64_t rank = J.rank, o0 = b * kLoraTile, w = std::min(kLoraTile, J.out - o0);
    const F* tile = static_cast<const F*>(J.bt) + rank * o0;
    for (int64_t i = 0; i < J.n; ++i) {
        float* yr = J.y + i * J.ldy + o0;
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

template <typename F>
void lora_add_jobs_loops(const LoraJob* jobs, const LoraTaskPlan& plan, float* t) {
    run_lora_tasks(
        jobs, plan, t, [](const LoraJob& J, int64_t i, int64_t k0, float* tj) { lora_shrink_quad<F>(J, i, k0, tj); },
        [](const LoraJob& J, int64_t b, const float* tj) { lora_expand_tile<F>(J, b, tj); });
}

}  // namespace
}  // namespace shardlm
