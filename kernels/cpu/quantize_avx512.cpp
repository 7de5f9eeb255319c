// AVX-512 INT4 weight quantizer (quantize_rows_int4; compiled with the AVX-512 flags only, called
// after a run-time CPU check). The loader quantizes every Linear matrix of a float checkpoint with
// it under --weights int4; the scalar groups took ~3 s of CPU time for a 1.7B model.
//
// simd_avx512.h first: it silences GCC 12's false warnings inside <immintrin.h>, which must not be
// parsed before it.
#include "kernels/cpu/simd_avx512.h"

#include <cstdint>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/quantize.h"

namespace shardlm {
namespace {

// quantize_group_int4 of x[0..g) (g a multiple of 32), packed straight into the I4 layout: the
// same operations lane by lane (min / max whose NaN operand loses, a true division, the same
// add-and-subtract rounding, the same clamps), so the same codes, scale and zero bit for bit.
Int4Group group_int4(const float* x, int64_t g, uint8_t* packed) {
    __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
    for (int64_t i = 0; i < g; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        lo = _mm512_min_ps(v, lo);  // v < lo ? v : lo: a NaN v keeps lo, as the reference's select
        hi = _mm512_max_ps(v, hi);
    }
    const Int4Group p = int4_group_params(_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi));
    if (p.scale == 0.0f) {
        for (int64_t i = 0; i < g / 2; ++i) packed[i] = 0;
        return p;
    }
    const float magic = 12582912.0f;
    const __m512 s = _mm512_set1_ps(p.scale), zero = _mm512_set1_ps(float(p.zero)), m = _mm512_set1_ps(magic);
    auto codes16 = [&](const float* c) {  // 16 codes as int32 lanes
        __m512 v = _mm512_div_ps(_mm512_loadu_ps(c), s);
        v = _mm512_max_ps(_mm512_min_ps(v, _mm512_set1_ps(64.0f)), _mm512_set1_ps(-64.0f));
        __m512 q = _mm512_add_ps(_mm512_sub_ps(_mm512_add_ps(v, m), m), zero);
        q = _mm512_max_ps(_mm512_min_ps(q, _mm512_set1_ps(15.0f)), _mm512_setzero_ps());
        return _mm512_cvttps_epi32(q);
    };
    for (int64_t b = 0; b < g; b += 32) {  // a 32-column block: byte i = code i | code (16 + i) << 4
        const __m512i c = _mm512_or_si512(codes16(x + b), _mm512_slli_epi32(codes16(x + b + 16), 4));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(packed + b / 2), _mm512_cvtepi32_epi8(c));
    }
    return p;
}

}  // namespace

Int4Group quantize_group_int4_avx512(const float* x, int64_t g, uint8_t* packed) { return group_int4(x, g, packed); }

}  // namespace shardlm
