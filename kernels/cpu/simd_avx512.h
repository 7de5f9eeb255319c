// AVX-512 helpers shared by the kernel files built with the AVX-512 flags (matmul_avx512.cpp,
// matmul_amx.cpp, attention_flash_avx512.cpp, rowwise_avx512.cpp, lora_avx512.cpp). Internal linkage on purpose, as
// in simd_avx2.h: each file keeps its own copy, compiled with its own -m flags.
#pragma once

// GCC 12 flags the _mm512_undefined_*() placeholders inside its own intrinsics (GCC bug 105593).
// The including files put this header first, so <immintrin.h> is parsed after these lines.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace shardlm {
namespace {

// Lane masks of the first len lanes.
inline __mmask16 mask16(int64_t len) { return len >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << len) - 1); }
inline __mmask64 mask64(int64_t len) { return len >= 64 ? ~__mmask64(0) : (__mmask64(1) << len) - 1; }

// 16 consecutive values from element i of a row of DT (weights, KV-cache rows), as f32 (the masked
// form reads only `m` lanes).
template <DType DT>
inline __m512 load16(const void* p, int64_t i) {
    if constexpr (DT == DType::F32) {
        return _mm512_loadu_ps(static_cast<const float*>(p) + i);
    } else if constexpr (DT == DType::F16) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i)));
    } else if constexpr (DT == DType::BF16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(p) + i));
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    }
}

template <DType DT>
inline __m512 load16m(const void* p, int64_t i, __mmask16 m) {
    if constexpr (DT == DType::F32) {
        return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
    } else if constexpr (DT == DType::F16) {
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
    } else if constexpr (DT == DType::BF16) {
        const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
        const __m128i b = _mm_maskz_loadu_epi8(m, static_cast<const int8_t*>(p) + i);
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    }
}

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
