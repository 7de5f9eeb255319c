// Element loads shared by the AVX2-level kernel files (matmul_avx2.cpp, attention_avx2.cpp,
// matmul_avx512.cpp). Include only from files compiled with at least -mavx2 -mfma -mf16c.
// Internal linkage on purpose: each file is built with its own -m flags, and one shared inline
// definition would let the linker keep an AVX-512 copy where only AVX2 may run.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/scratch.h"

namespace shardlm {
namespace {

// The per-thread packing scratch of the kernels (scratch.h).
inline uint8_t* scratch(size_t bytes) { return kernel_scratch(ScratchSlot::Panels, bytes); }

template <DType DT>
constexpr size_t elem_size() {
    return DT == DType::F32 ? 4 : DT == DType::I8 ? 1 : 2;
}

// Element i of a row of DT, as f32.
template <DType DT>
inline float load1(const void* p, int64_t i) {
    if constexpr (DT == DType::F32) return static_cast<const float*>(p)[i];
    else if constexpr (DT == DType::F16) return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    else if constexpr (DT == DType::BF16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    else return float(static_cast<const int8_t*>(p)[i]);
}

// 8 consecutive elements from element i of a row, as f32.
template <DType DT>
inline __m256 load8(const void* p, int64_t i) {
    if constexpr (DT == DType::F32) {
        return _mm256_loadu_ps(static_cast<const float*>(p) + i);
    } else if constexpr (DT == DType::F16) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
    } else if constexpr (DT == DType::BF16) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(p) + i));
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    }
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

}  // namespace
}  // namespace shardlm
