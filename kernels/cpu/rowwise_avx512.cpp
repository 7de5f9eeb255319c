// AVX-512 loops of rmsnorm and silu_mul (compiled with the AVX-512 flags only; called after a
// run-time CPU check, see rowwise.cpp). In prefill the scalar references took ~6% of a 512-token
// step: the f64 sum of squares is one dependent add per element, and std::exp one call per element.
//
// simd_avx512.h first: it silences GCC 12's false warnings inside <immintrin.h>, which must not be
// parsed before it.
#include "kernels/cpu/simd_avx512.h"

#include <cmath>
#include <cstdint>

namespace shardlm {
namespace {

// e^x in 16 lanes: 2^n * e^r with n = round(x / ln 2), r = x - n ln 2 (ln 2 split in two, so r is
// nearly exact), e^r by its Taylor series to r^7 (|r| <= ln 2 / 2: truncation < 2e-8 relative), and
// vscalefps for 2^n, which overflows to infinity and underflows through the subnormals to 0 as e^x
// does. NaN stays NaN.
inline __m512 exp16(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 e = _mm512_set1_ps(1.0f / 5040);
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 720));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 120));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 24));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 6));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(0.5f));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(e, n);
}

}  // namespace

void rmsnorm_avx512(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * dim;
        float* yr = y + r * dim;
        __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();  // f64, as rmsnorm_ref
        int64_t i = 0;
        for (; i + 16 <= dim; i += 16) {
            const __m512 v = _mm512_loadu_ps(xr + i);
            const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v)), hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
            s0 = _mm512_fmadd_pd(lo, lo, s0);
            s1 = _mm512_fmadd_pd(hi, hi, s1);
        }
        double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
        for (; i < dim; ++i) ss += double(xr[i]) * xr[i];
        const float inv = 1.0f / std::sqrt(float(ss / double(dim)) + eps);
        const __m512 iv = _mm512_set1_ps(inv);
        for (i = 0; i < dim; i += 16) {  // (x * inv) * w, the reference's two roundings
            const __mmask16 m = mask16(dim - i);
            const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), iv);
            _mm512_mask_storeu_ps(yr + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
        }
    }
}

void silu_mul_avx512(const float* gate, const float* up, float* y, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = mask16(n - i);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));  // e^-g
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
    }
}

}  // namespace shardlm
