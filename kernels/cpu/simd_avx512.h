// AVX-512 helpers shared by the kernel files built with the AVX-512 flags (matmul_avx512.cpp,
// matmul_amx.cpp). Internal linkage on purpose, as in simd_avx2.h: each file keeps its own copy,
// compiled with its own -m flags.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace shardlm {
namespace {

// Lane masks of the first len lanes.
inline __mmask16 mask16(int64_t len) { return len >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << len) - 1); }
inline __mmask64 mask64(int64_t len) { return len >= 64 ? ~__mmask64(0) : (__mmask64(1) << len) - 1; }

// In-place transpose of a 16x16 block of 32-bit values: r[i] lane j <-> r[j] lane i.
// Stages: 32-bit then 64-bit interleaves inside 128-bit lanes, then two 128-bit lane shuffles.
inline void transpose16(__m512 (&r)[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // u[4i + j], 128-bit lane c: rows 4i..4i+3 at column 4c + j
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int j = 0; j < 4; ++j) {
        const __m512 ab_lo = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x44), ab_hi = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xEE);
        const __m512 cd_lo = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x44), cd_hi = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xEE);
        r[0 + j] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0x88);
        r[4 + j] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0xDD);
        r[8 + j] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0xDD);
    }
}

}  // namespace
}  // namespace shardlm
