// AVX2 + FMA + F16C inner loop; this file alone is compiled with -mavx2 -mfma -mf16c and is only
// called after a run-time CPU check.
#include <immintrin.h>

#include "kernels/cpu/dot_tile.h"

namespace shardlm {
namespace {

inline __m256 load8(const void* w, DType wt, int64_t i) {
    switch (wt) {
        case DType::F16:
            return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i)));
        case DType::BF16: {
            const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
            return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        }
        default:
            return _mm256_loadu_ps(static_cast<const float*>(w) + i);
    }
}

inline float load1(const void* w, DType wt, int64_t i) {
    switch (wt) {
        case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
        case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
        default: return static_cast<const float*>(w)[i];
    }
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

// NT is a compile-time tile height so the accumulators live in registers.
template <int NT>
void tile(const float* x, int64_t xs, const void* w, DType wt, int64_t cols, float* out) {
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= cols; i += 8) {
        const __m256 wv = load8(w, wt, i);
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(_mm256_loadu_ps(x + t * xs + i), wv, acc[t]);
    }
    for (int t = 0; t < NT; ++t) {
        float s = hsum(acc[t]);
        for (int64_t j = i; j < cols; ++j) s += x[t * xs + j] * load1(w, wt, j);
        out[t] = s;
    }
}

}  // namespace

void dot_tile_avx2(const float* x, int64_t xs, int nt, const void* w, DType wt, int64_t cols, float* out) {
    switch (nt) {
        case 1: tile<1>(x, xs, w, wt, cols, out); break;
        case 2: tile<2>(x, xs, w, wt, cols, out); break;
        case 3: tile<3>(x, xs, w, wt, cols, out); break;
        default: tile<4>(x, xs, w, wt, cols, out); break;
    }
}

}  // namespace shardlm
