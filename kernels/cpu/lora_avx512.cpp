// lora_add_jobs with AVX-512 intrinsics (kernels/cpu/lora.cpp picks it at run time): the loops of
// lora_loops.h with the vectors and accumulators spelled out, as GCC at -O2 keeps them in memory.
#include "kernels/cpu/simd_avx512.h"  // first: <immintrin.h> under its GCC 12 warning fix

#include <algorithm>

#include "kernels/cpu/lora.h"
#include "kernels/cpu/lora_jobs.h"

namespace shardlm {

namespace {

// DT: the factors' type (F32 or BF16, widened to f32 as they are loaded: simd_avx512.h's load16).
template <DType DT>
const void* factor_row(const void* p, int64_t i) {
    return static_cast<const uint8_t*>(p) + size_t(i) * dtype_size(DT);
}

// x A^T: four of A's rows per task, one accumulator each.
template <DType DT>
void shrink_quad(const LoraJob& J, int64_t i, int64_t k0, float* t) {
    const int64_t in = J.in, kn = std::min<int64_t>(4, J.rank - k0);
    const __mmask16 in_tail = mask16(in % 16);
    const float* xr = J.x + i * in;
    const void* ak[4];
    for (int64_t k = 0; k < 4; ++k) ak[k] = factor_row<DT>(J.a, (k0 + std::min(k, kn - 1)) * in);
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t c = 0;
    for (; c + 16 <= in; c += 16) {
        const __m512 xv = _mm512_loadu_ps(xr + c);
        s0 = _mm512_fmadd_ps(xv, load16<DT>(ak[0], c), s0);
        s1 = _mm512_fmadd_ps(xv, load16<DT>(ak[1], c), s1);
        s2 = _mm512_fmadd_ps(xv, load16<DT>(ak[2], c), s2);
        s3 = _mm512_fmadd_ps(xv, load16<DT>(ak[3], c), s3);
    }
    if (in_tail) {
        const __m512 xv = _mm512_maskz_loadu_ps(in_tail, xr + c);
        s0 = _mm512_fmadd_ps(xv, load16m<DT>(ak[0], c, in_tail), s0);
        s1 = _mm512_fmadd_ps(xv, load16m<DT>(ak[1], c, in_tail), s1);
        s2 = _mm512_fmadd_ps(xv, load16m<DT>(ak[2], c, in_tail), s2);
        s3 = _mm512_fmadd_ps(xv, load16m<DT>(ak[3], c, in_tail), s3);
    }
    const float s[4] = {_mm512_reduce_add_ps(s0), _mm512_reduce_add_ps(s1), _mm512_reduce_add_ps(s2),
                        _mm512_reduce_add_ps(s3)};
    for (int64_t k = 0; k < kn; ++k) t[i * J.rank + k0 + k] = s[k];
}

// y += t Bt over Bt's column tile b (lora.h), read as one stream: a whole tile's 64 of y's
// elements in four registers (four FMA chains), summed over k in k's order; the last tile 16 at a
// time, masked.
template <DType DT>
void expand_tile(const LoraJob& J, int64_t b, const float* t) {
    const int64_t rank = J.rank, o0 = b * kLoraTile, w = std::min(kLoraTile, J.out - o0);
    const void* tile = factor_row<DT>(J.bt, rank * o0);
    for (int64_t i = 0; i < J.n; ++i) {
        float* yr = J.y + i * J.ldy + o0;
        const float* tr = t + i * rank;
        if (w == kLoraTile) {
            __m512 y0 = _mm512_loadu_ps(yr), y1 = _mm512_loadu_ps(yr + 16), y2 = _mm512_loadu_ps(yr + 32),
                   y3 = _mm512_loadu_ps(yr + 48);
            for (int64_t k = 0; k < rank; ++k) {
                const __m512 tk = _mm512_set1_ps(tr[k]);
                const int64_t bk = k * kLoraTile;
                y0 = _mm512_fmadd_ps(tk, load16<DT>(tile, bk), y0);
                y1 = _mm512_fmadd_ps(tk, load16<DT>(tile, bk + 16), y1);
                y2 = _mm512_fmadd_ps(tk, load16<DT>(tile, bk + 32), y2);
                y3 = _mm512_fmadd_ps(tk, load16<DT>(tile, bk + 48), y3);
            }
            _mm512_storeu_ps(yr, y0);
            _mm512_storeu_ps(yr + 16, y1);
            _mm512_storeu_ps(yr + 32, y2);
            _mm512_storeu_ps(yr + 48, y3);
            continue;
        }
        for (int64_t o = 0; o < w; o += 16) {
            const __mmask16 m = mask16(w - o);
            __m512 acc = _mm512_maskz_loadu_ps(m, yr + o);
            for (int64_t k = 0; k < rank; ++k)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(tr[k]), load16m<DT>(tile, k * w + o, m), acc);
            _mm512_mask_storeu_ps(yr + o, m, acc);
        }
    }
}

}  // namespace

void lora_add_jobs_avx512(const LoraJob* jobs, const LoraTaskPlan& plan, DType factors, float* t) {
    if (factors == DType::F32)
        run_lora_tasks(jobs, plan, t, shrink_quad<DType::F32>, expand_tile<DType::F32>);
    else
        run_lora_tasks(jobs, plan, t, shrink_quad<DType::BF16>, expand_tile<DType::BF16>);
}

}  // namespace shardlm
