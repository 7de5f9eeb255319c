// matmul / matmul_w8a8: argument checks, the threading over output rows, the scalar variant and the
// choice of vectorised variant. The vectorised inner loops live in matmul_avx2.cpp/matmul_avx512.cpp.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"

namespace shardlm {
namespace {

// Threads take contiguous ranges of 32-row blocks (the panel height of the GEMM kernels); tiny
// problems stay on one thread, where a fork/join would cost more than the work.
// Memory-bound decode (n <= kGemvMaxN) instead hands out ~8 chunks per thread dynamically: a thread
// slowed by anything else on its core (another process, an interrupt) no longer holds up the whole
// step, at the price of one prefetch restart per chunk.
constexpr int64_t kRowAlign = 32;
constexpr int64_t kParallelMinMacs = int64_t(1) << 15;

// The rows of the outputs' weights as one run of blocks, weight i's after weight i - 1's (each
// starting a block, so every weight's pieces start where one call of its own would start them);
// fn(i, r0, r1) for each piece of weight i a thread takes.
template <class F>
void for_row_ranges(const MatmulOut* outs, int count, int64_t n, F fn) {
    std::vector<int64_t> first(size_t(count) + 1, 0);  // each weight's first block
    int64_t macs = 0;
    for (int i = 0; i < count; ++i) {
        first[size_t(i) + 1] = first[size_t(i)] + (outs[i].w->rows + kRowAlign - 1) / kRowAlign;
        macs += n * outs[i].w->rows * outs[i].w->cols;
    }
    const int64_t blocks = first.back();
    auto run = [&](int64_t b0, int64_t b1) {
        for (int i = 0; i < count; ++i) {
            const int64_t lo = std::max(b0, first[size_t(i)]), hi = std::min(b1, first[size_t(i) + 1]);
            if (lo < hi)
                fn(i, (lo - first[size_t(i)]) * kRowAlign, std::min(outs[i].w->rows, (hi - first[size_t(i)]) * kRowAlign));
        }
    };
#pragma omp parallel if (macs >= kParallelMinMacs)
    {
        const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
        if (n <= kGemvMaxN && nth > 1) {
            const int64_t per = std::max<int64_t>(1, blocks / (nth * 8)), chunks = (blocks + per - 1) / per;
#pragma omp for schedule(dynamic, 1) nowait
            for (int64_t c = 0; c < chunks; ++c) run(c * per, std::min(blocks, (c + 1) * per));
        } else {
            const int64_t b0 = blocks * tid / nth, b1 = blocks * (tid + 1) / nth;
            if (b0 < b1) run(b0, b1);
        }
    }
}

// Whether the outputs' weights can share one product: the same dtype, row length and group size.
bool one_family(const MatmulOut* outs, int count) {
    for (int i = 1; i < count; ++i) {
        const WeightView &a = *outs[0].w, &b = *outs[i].w;
        if (a.dtype != b.dtype || a.cols != b.cols || a.group_size != b.group_size) return false;
    }
    return true;
}

// y = bias (or 0) for weights with no columns.
void bias_only(int64_t n, const MatmulOut& o) {
    for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < o.w->rows; ++r) o.y[t * o.w->rows + r] = o.bias ? o.bias[r] : 0.0f;
}

// Scalar variant: one dequantized weight row at a time, f32 accumulation.
void matmul_rows_scalar(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, int64_t r0,
                        int64_t r1) {
    std::vector<float> row(size_t(w.cols));
    for (int64_t r = r0; r < r1; ++r) {
        weight_row_to_f32(w, r, row.data());
        for (int64_t t = 0; t < n; ++t) {
            const float* xt = x + t * w.cols;
            float acc = 0.0f;
            for (int64_t i = 0; i < w.cols; ++i) acc += xt[i] * row[size_t(i)];
            y[t * w.rows + r] = acc + (bias ? bias[r] : 0.0f);
        }
    }
}

void w8a8_rows_scalar(const QuantizedActs& a, const WeightView& w, const float* bias, float* y, int64_t r0,
                      int64_t r1) {
    const int64_t cols = w.cols, ga = a.group_size, gw = w.group_size, g = std::min(ga, gw);
    const int8_t* wq = static_cast<const int8_t*>(w.data);
    for (int64_t r = r0; r < r1; ++r) {
        const int8_t* wr = wq + r * cols;
        for (int64_t t = 0; t < a.n; ++t) {
            const int8_t* xt = a.q + t * cols;
            float acc = 0.0f;
            for (int64_t k0 = 0; k0 < cols; k0 += g) {
                int64_t dot = 0;
                for (int64_t k = k0; k < k0 + g; ++k) dot += int32_t(xt[k]) * int32_t(wr[k]);
                acc += float(dot) * (a.scales[t * (cols / ga) + k0 / ga] * w.scales[r * (cols / gw) + k0 / gw]);
            }
            y[t * w.rows + r] = acc + (bias ? bias[r] : 0.0f);
        }
    }
}

// W4A8 scalar: per internal group, a_scale * (w_scale * dot + w_min * sum of the activations).
void w4a8_rows_scalar(const QuantizedActs& a, const WeightView& w, const float* bias, float* y, int64_t r0,
                      int64_t r1) {
    const int64_t cols = w.cols, ga = a.group_size, gw = w.group_size, g = std::min(ga, gw);
    const uint8_t* wq = static_cast<const uint8_t*>(w.data);
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* wr = wq + r * (cols / 2);
        for (int64_t t = 0; t < a.n; ++t) {
            const int8_t* xt = a.q + t * cols;
            float acc = 0.0f;
            for (int64_t k0 = 0; k0 < cols; k0 += g) {
                int32_t dot = 0, sum = 0;
                for (int64_t k = k0; k < k0 + g; ++k) {
                    dot += int32_t(xt[k]) * ((wr[int4_byte(k)] >> int4_shift(k)) & 15);
                    sum += xt[k];
                }
                const int64_t wi = r * (cols / gw) + k0 / gw;
                acc += a.scales[t * (cols / ga) + k0 / ga] * (float(dot) * w.scales[wi] + float(sum) * w.mins[wi]);
            }
            y[t * w.rows + r] = acc + (bias ? bias[r] : 0.0f);
        }
    }
}

void check_w4a8(const QuantizedActs& a, const WeightView& w) {
    check_weight_view(w);
    SHARDLM_CHECK(w.dtype == DType::I4, "matmul_w4a8 needs I4 weights, got ", dtype_name(w.dtype));
    SHARDLM_CHECK(a.cols == w.cols, "matmul_w4a8: activations have ", a.cols, " columns, weights ", w.cols);
    SHARDLM_CHECK(a.group_size > 0 && a.cols % a.group_size == 0 &&
                      (a.group_size % w.group_size == 0 || w.group_size % a.group_size == 0) &&
                      std::min(a.group_size, w.group_size) % 32 == 0,
                  "matmul_w4a8: activation group ", a.group_size, " and weight group ", w.group_size,
                  " must divide one another and the row length, the smaller a multiple of 32");
    SHARDLM_CHECK(a.n == 0 || (a.q && a.scales), "matmul_w4a8: activations not set");
}

void check_w8a8(const QuantizedActs& a, const WeightView& w) {
    check_weight_view(w);
    SHARDLM_CHECK(w.dtype == DType::I8, "matmul_w8a8 needs I8 weights, got ", dtype_name(w.dtype));
    SHARDLM_CHECK(a.cols == w.cols, "matmul_w8a8: activations have ", a.cols, " columns, weights ", w.cols);
    SHARDLM_CHECK(a.group_size > 0 && a.cols % a.group_size == 0 &&
                      (a.group_size % w.group_size == 0 || w.group_size % a.group_size == 0),
                  "matmul_w8a8: activation group ", a.group_size, " and weight group ", w.group_size,
                  " must divide one another and the row length");
    SHARDLM_CHECK(a.n == 0 || (a.q && a.scales), "matmul_w8a8: activations not set");
}

// Builds the W8A8Prep view (see matmul_kernels.h) into `store`.
struct PrepStore {
    std::vector<int8_t> q, xi4, qt;
    std::vector<int16_t> q16;
    std::vector<float> scales, xs;
    std::vector<int32_t> sums;
};

// W4A8's extra views: xs (act scale * group sum of q) and, for the GEMV, xi4 (matmul_kernels.h).
void prepare_i4(const QuantizedActs& a, W8A8Prep& p, PrepStore& st) {
    p.i4 = true;
    st.xs.resize(size_t(p.n * p.ng));
    for (int64_t i = 0; i < p.n * p.ng; ++i) {
        int32_t sum = 0;
        for (int64_t s = 0; s < p.segs; ++s) sum += p.seg_sums[i * p.segs + s];
        st.xs[size_t(i)] = p.scales[i] * float(sum);
    }
    p.xs = st.xs.data();
    if (p.n > kInt8ActsGemvMaxN) return;
    st.xi4.resize(size_t(p.n * p.cols));
    for (int64_t t = 0; t < p.n; ++t)
        for (int64_t c0 = 0; c0 < p.cols; c0 += 128) {
            const int64_t nb = std::min<int64_t>(4, (p.cols - c0) / 32);
            const int8_t* src = a.q + t * p.cols + c0;
            int8_t* dst = st.xi4.data() + t * p.cols + c0;
            for (int64_t b = 0; b < nb; ++b) {
                std::copy(src + 32 * b, src + 32 * b + 16, dst + 16 * b);
                std::copy(src + 32 * b + 16, src + 32 * b + 32, dst + 16 * (nb + b));
            }
        }
    p.xi4 = st.xi4.data();
}

// The AMX GEMM's activations in tile order (W8A8Prep::qt): a copy of 64-byte pieces.
void prepare_amx(W8A8Prep& p, PrepStore& st) {
    const int64_t blocks = (p.n + 31) / 32, steps = p.kp / 64;
    st.qt.assign(size_t(blocks * steps * 32 * 64), 0);
#pragma omp parallel for schedule(static) if (p.n * p.kp >= (int64_t(1) << 16))
    for (int64_t t = 0; t < p.n; ++t)
        for (int64_t s = 0; s < steps; ++s)
            std::copy(p.q + t * p.kp + s * 64, p.q + t * p.kp + s * 64 + 64,
                      st.qt.data() + (((t / 32) * steps + s) * 32 + t % 32) * 64);
    p.qt = st.qt.data();
}

W8A8Prep prepare(const QuantizedActs& a, const WeightView& w, PrepStore& st) {
    W8A8Prep p;
    p.n = a.n;
    p.cols = a.cols;
    p.gw = w.group_size;
    p.ge = std::min(a.group_size, w.group_size);
    p.ge4 = (p.ge + 3) / 4 * 4;
    p.ng = a.cols / p.ge;
    p.kp = p.ng * p.ge4;
    p.seg_len = std::min<int64_t>(p.ge4, 1024);
    p.segs = (p.ge4 + p.seg_len - 1) / p.seg_len;
    const int64_t n = a.n, cols = a.cols, ga = a.group_size;
    if (p.ge4 != p.ge) st.q.assign(size_t(n * p.kp), 0);
    st.scales.resize(size_t(n * p.ng));
    st.sums.resize(size_t(n * p.ng * p.segs));
#pragma omp parallel for schedule(static) if (n * cols >= (int64_t(1) << 16))
    for (int64_t t = 0; t < n; ++t) {
        const int8_t* src = a.q + t * cols;
        int8_t* dst = p.ge4 != p.ge ? st.q.data() + t * p.kp : nullptr;
        for (int64_t e = 0; e < p.ng; ++e) {
            const int8_t* ge_src = src + e * p.ge;
            if (dst) std::copy(ge_src, ge_src + p.ge, dst + e * p.ge4);
            st.scales[size_t(t * p.ng + e)] = a.scales[t * (cols / ga) + e * p.ge / ga];
            for (int64_t s = 0; s < p.segs; ++s) {
                const int64_t k0 = s * p.seg_len, k1 = std::min(p.ge, k0 + p.seg_len);
                int32_t sum = 0;
                for (int64_t k = k0; k < k1; ++k) sum += ge_src[k];
                st.sums[size_t((t * p.ng + e) * p.segs + s)] = sum;
            }
        }
    }
    p.q = p.ge4 != p.ge ? st.q.data() : a.q;
    p.scales = st.scales.data();
    p.seg_sums = st.sums.data();
    return p;
}

// matmul_w8a8 / matmul_w4a8 once their arguments are checked: the threading and the variant,
// by the weights' dtype (I8 or I4, the same for all outputs).
void int8_acts_product(const QuantizedActs& a, const MatmulOut* outs, int count, CpuIsa isa) {
    if (a.n <= 0) return;
    const WeightView& w0 = *outs[0].w;
    if (w0.cols == 0) {
        for (int i = 0; i < count; ++i) bias_only(a.n, outs[i]);
        return;
    }
    const bool i4 = w0.dtype == DType::I4;
    const CpuIsa chosen = cpu_isa_resolve(isa);
    if (chosen == CpuIsa::Scalar) {
        for_row_ranges(outs, count, a.n, [&](int i, int64_t r0, int64_t r1) {
            if (i4) w4a8_rows_scalar(a, *outs[i].w, outs[i].bias, outs[i].y, r0, r1);
            else w8a8_rows_scalar(a, *outs[i].w, outs[i].bias, outs[i].y, r0, r1);
        });
        return;
    }
    PrepStore store;
    W8A8Prep p = prepare(a, w0, store);  // depends on the weights through their group size only
    if (i4) prepare_i4(a, p, store);
    if (chosen == CpuIsa::Amx && amx_tiles_usable(p)) prepare_amx(p, store);
    if (chosen == CpuIsa::Avx2 && avx2_w8a8_gemm_usable(p)) {  // W8A8Prep::q16
        store.q16.resize(size_t(p.n * p.kp));
        int16_t* q16 = store.q16.data();
#pragma omp parallel for schedule(static) if (p.n * p.kp >= (int64_t(1) << 16))
        for (int64_t i = 0; i < p.n * p.kp; ++i) q16[i] = p.q[i];
        p.q16 = q16;
    }
    using Rows = void (*)(const W8A8Prep&, const WeightView&, const float*, float*, int64_t, int64_t);
    Rows rows = nullptr;
    switch (chosen) {
#if defined(SHARDLM_HAVE_AVX512)
        case CpuIsa::Avx512: rows = i4 ? w4a8_rows_avx512 : w8a8_rows_avx512; break;
#endif
#if defined(SHARDLM_HAVE_AMX)
        case CpuIsa::Amx: rows = int8_acts_rows_amx; break;
#endif
#if defined(SHARDLM_HAVE_AVX2)
        case CpuIsa::Avx2: rows = i4 ? w4a8_rows_avx2 : w8a8_rows_avx2; break;
#endif
        default: break;
    }
    SHARDLM_CHECK(rows, "matmul: no ", cpu_isa_name(chosen), " kernel in this build");
    for_row_ranges(outs, count, a.n,
                   [&](int i, int64_t r0, int64_t r1) { rows(p, *outs[i].w, outs[i].bias, outs[i].y, r0, r1); });
}

// Batch-invariant products (matmul's `batch_invariant`). Every kernel here computes each token's
// sums on their own (its own accumulators, the same walk along k, whatever the row tile), so a
// token's outputs depend on the other tokens of a call only through the kernel chosen by their
// number: GEMV or GEMM, f32 or INT16 activations, AVX-512 or AMX tiles. These paths choose by the
// weights alone: the GEMVs over blocks of at most kGemvMaxN tokens, each block over a chunk of
// rows that the block before left in L2; INT8 and INT4 weights always on INT16 activations (the
// GEMV of i16_rows takes any n); W8A8 as usual (below); never the AMX tiles. Prefill pays for it
// (the GEMMs' register blocking is gone); decode runs the kernels it would run anyway, except
// INT8 at 1-2 tokens on INT16 activations (memory-bound either way).
constexpr int64_t kInvariantChunkBytes = int64_t(256) << 10;

// fn(t0, nb, ra, rb) for every block [t0, t0 + nb) of n tokens (nb <= kGemvMaxN) over every chunk
// [ra, rb) of the rows [r0, r1); chunks of a multiple of 4 rows, so tiles keep their place.
template <class F>
void token_blocks(const WeightView& w, int64_t n, int64_t r0, int64_t r1, F fn) {
    const int64_t chunk = std::max<int64_t>(4, kInvariantChunkBytes / std::max<int64_t>(1, weight_row_bytes(w)) / 4 * 4);
    for (int64_t ra = r0; ra < r1; ra += chunk)
        for (int64_t t0 = 0; t0 < n; t0 += kGemvMaxN) fn(t0, std::min(kGemvMaxN, n - t0), ra, std::min(r1, ra + chunk));
}

// The variant a batch-invariant product runs: the resolved one, AVX-512 for AMX.
CpuIsa invariant_isa(CpuIsa isa) {
    const CpuIsa v = cpu_isa_resolve(isa);
    return v == CpuIsa::Amx ? CpuIsa::Avx512 : v;
}

void invariant_int8_product(const QuantizedActs& a, const MatmulOut* outs, int count, CpuIsa isa) {
    const WeightView& w0 = *outs[0].w;
    const CpuIsa v = invariant_isa(isa);
    // The scalar kernels take a token at a time. W8A8's GEMVs and GEMMs (AVX2's INT16 GEMM too) all
    // sum each internal group exactly in INT32, scale it and add the groups in the same order, so
    // their usual dispatch is invariant as it is (MatmulBatchInvariant.Int8Activations checks it).
    // W4A8's GEMV and GEMM differ in their mins' share: its GEMV over token blocks.
    if (a.n <= 0 || w0.cols == 0 || v == CpuIsa::Scalar || w0.dtype != DType::I4) return int8_acts_product(a, outs, count, v);
    using Rows = void (*)(const W8A8Prep&, const WeightView&, const float*, float*, int64_t, int64_t);
    Rows rows = nullptr;
#if defined(SHARDLM_HAVE_AVX512)
    if (v == CpuIsa::Avx512) rows = w4a8_rows_avx512;
#endif
#if defined(SHARDLM_HAVE_AVX2)
    if (v == CpuIsa::Avx2) rows = w4a8_rows_avx2;
#endif
    SHARDLM_CHECK(rows, "matmul: no ", cpu_isa_name(v), " kernel in this build");
    // Each block's activations prepared as a call of its own tokens would prepare them.
    const int64_t blocks = (a.n + kGemvMaxN - 1) / kGemvMaxN, ga = a.group_size > 0 ? a.group_size : a.cols;
    std::vector<PrepStore> stores(static_cast<size_t>(blocks));
    std::vector<W8A8Prep> preps(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t t0 = b * kGemvMaxN;
        QuantizedActs ab = a;
        ab.q = a.q + t0 * a.cols;
        ab.scales = a.scales + t0 * (a.cols / ga);
        ab.n = std::min(kGemvMaxN, a.n - t0);
        preps[size_t(b)] = prepare(ab, w0, stores[size_t(b)]);
        prepare_i4(ab, preps[size_t(b)], stores[size_t(b)]);
    }
    for_row_ranges(outs, count, a.n, [&](int i, int64_t r0, int64_t r1) {
        const WeightView& w = *outs[i].w;
        token_blocks(w, a.n, r0, r1, [&](int64_t t0, int64_t, int64_t ra, int64_t rb) {
            rows(preps[size_t(t0 / kGemvMaxN)], w, outs[i].bias, outs[i].y + t0 * w.rows, ra, rb);
        });
    });
}

// The INT16-activation product (i16_acts_rounded) of one variant: x rounded by `to_i16`, once for
// all outputs (threaded when large), then `rows` over each output's rows.
using ActsToI16 = void (*)(const float*, int64_t, int64_t, int16_t*, float*, int64_t, float*);
using I16Rows = void (*)(const I16Acts&, const WeightView&, const float*, float*, int64_t, int64_t);
[[maybe_unused]] void i16_product(const float* x, int64_t n, const MatmulOut* outs, int count, ActsToI16 to_i16,
                                  I16Rows rows) {
    const WeightView& w = *outs[0].w;
    thread_local std::vector<int16_t> q;  // kept: no allocation per call of a decode step
    thread_local std::vector<float> scales, xsum;
    const int64_t kp = i16_acts_stride(w.cols), ng = w.dtype == DType::I4 ? w.cols / w.group_size : 0;
    q.resize(size_t(n * kp));
    scales.resize(size_t(n));
    xsum.resize(size_t(n * ng));
    int16_t* qd = q.data();
    float *sd = scales.data(), *xs = ng ? xsum.data() : nullptr;
#pragma omp parallel if (n * w.cols >= (int64_t(1) << 16))
    {
        const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t t0 = n * tid / nth, t1 = n * (tid + 1) / nth;
        to_i16(x + t0 * w.cols, t1 - t0, w.cols, qd + t0 * kp, sd + t0, w.group_size, xs ? xs + t0 * ng : nullptr);
    }
    const I16Acts a{qd, sd, xs, n, w.cols, kp};
    for_row_ranges(outs, count, n, [&](int i, int64_t r0, int64_t r1) {
        rows(a, *outs[i].w, outs[i].bias, outs[i].y, r0, r1);
    });
}

void invariant_float_product(const float* x, int64_t n, const MatmulOut* outs, int count, CpuIsa isa) {
    const WeightView& w = *outs[0].w;
    const CpuIsa v = invariant_isa(isa);
    // INT16 activations wherever this variant has them for these weights (i16_gemv_usable's shape
    // test: the GEMV takes any number of tokens).
    const bool i16 = v != CpuIsa::Scalar && i16_gemv_usable(kI16MinN, w);
    using Rows = void (*)(const float*, int64_t, const WeightView&, const float*, float*, int64_t, int64_t);
    Rows rows = matmul_rows_scalar;
#if defined(SHARDLM_HAVE_AVX512)
    if (v == CpuIsa::Avx512) {
        if (i16) return i16_product(x, n, outs, count, acts_to_i16_avx512, i16_gemv_rows_avx512);
        rows = matmul_rows_avx512;
    }
#endif
#if defined(SHARDLM_HAVE_AVX2)
    if (v == CpuIsa::Avx2) {
        if (i16) return i16_product(x, n, outs, count, acts_to_i16_avx2, i16_gemv_rows_avx2);
        rows = matmul_rows_avx2;
    }
#endif
    for_row_ranges(outs, count, n, [&](int i, int64_t r0, int64_t r1) {
        const WeightView& wi = *outs[i].w;
        token_blocks(wi, n, r0, r1, [&](int64_t t0, int64_t nb, int64_t ra, int64_t rb) {
            rows(x + t0 * wi.cols, nb, wi, outs[i].bias, outs[i].y + t0 * wi.rows, ra, rb);
        });
    });
}

// matmul once its arguments are checked, for outputs of one family (one_family).
void float_acts_product(const float* x, int64_t n, const MatmulOut* outs, int count, CpuIsa isa, bool invariant) {
    if (n <= 0) return;
    const WeightView& w = *outs[0].w;  // dtype, cols and group size: the same for all outputs
    if (w.cols == 0) {
        for (int i = 0; i < count; ++i) bias_only(n, outs[i]);
        return;
    }
    if (invariant) return invariant_float_product(x, n, outs, count, isa);
    switch (cpu_isa_resolve(isa)) {
#if defined(SHARDLM_HAVE_AMX)
        case CpuIsa::Amx:
            if (amx_gemv_usable(n, w)) {
                const int64_t np = amx_gemv_tokens(n);
                std::vector<uint16_t> xb(size_t(w.cols / 32 * kAmxBf16Parts * 16 * np * 2));  // [step][part][pair][token][2]
                std::vector<float> xsum(w.dtype == DType::I4 ? size_t(w.cols / w.group_size * np) : 0);
                acts_to_gemv_tiles_amx(x, n, w, xb.data(), xsum.data());
                for_row_ranges(outs, count, n, [&](int i, int64_t r0, int64_t r1) {
                    gemv_rows_amx(xb.data(), xsum.data(), n, *outs[i].w, outs[i].bias, outs[i].y, r0, r1);
                });
                return;
            }
            if (amx_bf16_usable(n, w)) {
                // Kept between calls (a fresh buffer of up to tens of MB faults its pages in again on
                // every call), 64-byte aligned so that no 64-byte tile row straddles two cache lines.
                thread_local Buffer xt_buf;
                const int64_t steps = w.cols / 32, n32 = (n + 31) / 32 * 32;
                const size_t xt_bytes = size_t(n32 * w.cols * kAmxBf16Parts) * 2;
                if (xt_buf.size() < xt_bytes) xt_buf = Buffer(xt_bytes);
                uint16_t* xt = xt_buf.as<uint16_t>();
                for (int64_t t = n; t < n32; ++t)  // the last token block's rows past n
                    for (int64_t sp = 0; sp < steps * kAmxBf16Parts; ++sp)
                        std::memset(xt + (((t / 32) * steps * kAmxBf16Parts + sp) * 32 + t % 32) * 32, 0, 64);
                std::vector<float> xsum;  // I4: the mins multiply each group's sum of activations
                if (w.dtype == DType::I4) xsum.resize(size_t(n * (w.cols / w.group_size)));
#pragma omp parallel if (n * w.cols >= (int64_t(1) << 16))
                {
                    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
                    acts_to_bf16_tiles_amx(x, w.cols, n * tid / nth, n * (tid + 1) / nth, xt, w.group_size,
                                           xsum.empty() ? nullptr : xsum.data());
                }
                const float* xs = xsum.empty() ? nullptr : xsum.data();
                for_row_ranges(outs, count, n, [&](int i, int64_t r0, int64_t r1) {
                    matmul_rows_amx(xt, xs, n, *outs[i].w, outs[i].bias, outs[i].y, r0, r1);
                });
                return;
            }
            [[fallthrough]];  // decode and other weights: the AVX-512 kernels
#endif
#if defined(SHARDLM_HAVE_AVX512)
        case CpuIsa::Avx512:
            if (i16_acts_rounded(CpuIsa::Avx512, n, w))
                return i16_product(x, n, outs, count, acts_to_i16_avx512, i16_rows_avx512);
            for_row_ranges(outs, count, n, [&](int i, int64_t r0, int64_t r1) {
                matmul_rows_avx512(x, n, *outs[i].w, outs[i].bias, outs[i].y, r0, r1);
            });
            return;
#endif
#if defined(SHARDLM_HAVE_AVX2)
        case CpuIsa::Avx2:
            if (i16_acts_rounded(CpuIsa::Avx2, n, w))
                return i16_product(x, n, outs, count, acts_to_i16_avx2, i16_rows_avx2);
            for_row_ranges(outs, count, n, [&](int i, int64_t r0, int64_t r1) {
                matmul_rows_avx2(x, n, *outs[i].w, outs[i].bias, outs[i].y, r0, r1);
            });
            return;
#endif
        default:
            for_row_ranges(outs, count, n, [&](int i, int64_t r0, int64_t r1) {
                matmul_rows_scalar(x, n, *outs[i].w, outs[i].bias, outs[i].y, r0, r1);
            });
            return;
    }
}

}  // namespace

const char* matmul_isa() { return cpu_isa_name(cpu_isa_resolve(CpuIsa::Auto)); }

void matmul(const float* x, int64_t n, const WeightView& w, const float* bias, float* y) {
    matmul(x, n, w, bias, y, CpuIsa::Auto);
}

void matmul(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, CpuIsa isa, bool batch_invariant) {
    check_weight_view(w);
    const MatmulOut o{&w, bias, y};
    float_acts_product(x, n, &o, 1, isa, batch_invariant);
}

void matmul_multi(const float* x, int64_t n, const MatmulOut* outs, int count, CpuIsa isa, bool batch_invariant) {
    for (int i = 0; i < count; ++i) check_weight_view(*outs[i].w);
    if (count <= 0) return;
    if (one_family(outs, count)) return float_acts_product(x, n, outs, count, isa, batch_invariant);
    for (int i = 0; i < count; ++i) float_acts_product(x, n, &outs[i], 1, isa, batch_invariant);
}

void matmul_w8a8(const QuantizedActs& a, const WeightView& w, const float* bias, float* y, CpuIsa isa) {
    check_w8a8(a, w);
    const MatmulOut o{&w, bias, y};
    int8_acts_product(a, &o, 1, isa);
}

void matmul_w4a8(const QuantizedActs& a, const WeightView& w, const float* bias, float* y, CpuIsa isa) {
    check_w4a8(a, w);
    const MatmulOut o{&w, bias, y};
    int8_acts_product(a, &o, 1, isa);
}

void matmul_int8_acts_multi(const QuantizedActs& a, const MatmulOut* outs, int count, CpuIsa isa, bool batch_invariant) {
    for (int i = 0; i < count; ++i) {
        if (outs[i].w->dtype == DType::I4) check_w4a8(a, *outs[i].w);
        else check_w8a8(a, *outs[i].w);
    }
    if (count <= 0) return;
    const auto product = batch_invariant ? invariant_int8_product : int8_acts_product;
    if (one_family(outs, count)) return product(a, outs, count, isa);
    for (int i = 0; i < count; ++i) product(a, &outs[i], 1, isa);
}

}  // namespace shardlm
