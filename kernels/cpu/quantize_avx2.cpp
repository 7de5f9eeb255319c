// AVX2 INT4 weight quantizer (quantize_rows_int4; compiled with the AVX2 flags only, called after a
// run-time CPU check): quantize_avx512.cpp's groups in 8 lanes. Also the F16C widening of F16
// values the loader and the quantizers read (values_to_f32).
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/quantize.h"

namespace shardlm {
namespace {

inline float hmin(__m256 v) {
    __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_min_ss(m, _mm_movehdup_ps(m)));
}
inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// quantize_group_int4 of x[0..g) (g a multiple of 32) packed into the I4 layout, the same
// operations lane by lane as the reference (see quantize_avx512.cpp).
Int4Group group_int4(const float* x, int64_t g, uint8_t* packed) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int64_t i = 0; i < g; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        lo = _mm256_min_ps(v, lo);  // v < lo ? v : lo: a NaN v keeps lo
        hi = _mm256_max_ps(v, hi);
    }
    const Int4Group p = int4_group_params(hmin(lo), hmax(hi));
    if (p.scale == 0.0f) {
        for (int64_t i = 0; i < g / 2; ++i) packed[i] = 0;
        return p;
    }
    const float magic = 12582912.0f;
    const __m256 s = _mm256_set1_ps(p.scale), zero = _mm256_set1_ps(float(p.zero)), m = _mm256_set1_ps(magic);
    auto codes8 = [&](const float* c) {  // 8 codes as int32 lanes
        __m256 v = _mm256_div_ps(_mm256_loadu_ps(c), s);
        v = _mm256_max_ps(_mm256_min_ps(v, _mm256_set1_ps(64.0f)), _mm256_set1_ps(-64.0f));
        __m256 q = _mm256_add_ps(_mm256_sub_ps(_mm256_add_ps(v, m), m), zero);
        q = _mm256_max_ps(_mm256_min_ps(q, _mm256_set1_ps(15.0f)), _mm256_setzero_ps());
        return _mm256_cvttps_epi32(q);
    };
    for (int64_t b = 0; b < g; b += 32) {  // byte i = code i | code (16 + i) << 4
        const __m256i d0 = _mm256_or_si256(codes8(x + b), _mm256_slli_epi32(codes8(x + b + 16), 4));
        const __m256i d1 = _mm256_or_si256(codes8(x + b + 8), _mm256_slli_epi32(codes8(x + b + 24), 4));
        // packus interleaves the 128-bit lanes: [d0 0-3, d1 0-3, d0 4-7, d1 4-7] -> in order.
        const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(d0, d1), 0xD8);
        const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(packed + b / 2), bytes);
    }
    return p;
}

}  // namespace

int64_t f16_to_f32_avx2(const uint8_t* p, int64_t n, float* out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i))));
    return i;
}

Int4Group quantize_group_int4_avx2(const float* x, int64_t g, uint8_t* packed) { return group_int4(x, g, packed); }

}  // namespace shardlm
