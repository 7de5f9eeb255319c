#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/quantize.h"

namespace shardlm {
namespace {

// The one definition of symmetric INT8 rounding (see quantize.h); every quantizer calls it so the
// threaded versions give bit-identical results.
void round_int8(const float* x, int64_t n, float amax, int8_t* q) {
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    // Clamp, then round to nearest even by adding and removing 1.5 * 2^23 (exact for |v| <= 2^22 in
    // the default rounding mode; unlike a libm call it vectorises). A NaN input clamps to 127.
    const float magic = 12582912.0f;
    for (int64_t i = 0; i < n; ++i) {
        float v = x[i] * inv;
        v = v < 127.0f ? v : 127.0f;
        v = v > -127.0f ? v : -127.0f;
        q[i] = int8_t(int32_t((v + magic) - magic));
    }
}

float quantize_group(const float* x, int64_t g, int8_t* q) {
    float amax = 0.0f;
    for (int64_t i = 0; i < g; ++i) amax = std::max(amax, std::fabs(x[i]));
    round_int8(x, g, amax, q);
    return amax / 127.0f;
}

void check_groups(int64_t cols, int64_t group_size) {
    SHARDLM_CHECK(group_size > 0 && cols % group_size == 0, "int8 group size ", group_size,
                  " must divide the row length ", cols);
}

// Rows [r0, r1) of src: each widened to f32, then quantized by `isa`'s rows (Scalar: the reference).
void quantize_weight_rows(const WeightView& src, int64_t group_size, int8_t* q, float* scales, int64_t r0,
                          int64_t r1, std::vector<float>& row, CpuIsa isa) {
    const int64_t cols = src.cols, ng = cols / group_size;
    row.resize(size_t(cols));
    for (int64_t r = r0; r < r1; ++r) {
        weight_row_to_f32(src, r, row.data());
        quantize_rows_int8(row.data(), 1, cols, group_size, q + r * cols, scales + r * ng, isa);
    }
}

void check_int4_groups(const WeightView& src, int64_t group_size) {
    SHARDLM_CHECK(src.dtype == DType::F32 || src.dtype == DType::F16 || src.dtype == DType::BF16,
                  "int4 quantization reads f32/f16/bf16 weights, not ", dtype_name(src.dtype));
    SHARDLM_CHECK(group_size > 0 && group_size % 32 == 0 && src.cols % group_size == 0, "int4 group size ",
                  group_size, " must be a multiple of 32 that divides the row length ", src.cols);
}

// quantize_group_int4 of x[0..g) (g a multiple of 32) packed into the I4 layout: the scalar
// variant of quantize_rows_int4.
Int4Group group_int4_packed(const float* x, int64_t g, uint8_t* packed) {
    thread_local std::vector<uint8_t> codes;
    codes.resize(size_t(g));
    const Int4Group p = quantize_group_int4(x, g, codes.data());
    pack_int4_row(codes.data(), g, packed);
    return p;
}

void quantize_int4_rows(const WeightView& src, int64_t group_size, uint8_t* q, float* scales, float* mins,
                        int64_t r0, int64_t r1, std::vector<float>& row, CpuIsa isa) {
    const int64_t cols = src.cols, ng = cols / group_size;
    row.resize(size_t(cols));
    for (int64_t r = r0; r < r1; ++r) {
        weight_row_to_f32(src, r, row.data());
        quantize_rows_int4(row.data(), 1, cols, group_size, q + r * (cols / 2), scales + r * ng, mins + r * ng, isa);
    }
}

}  // namespace

Int4Group int4_group_params(float lo, float hi) {
    Int4Group p;
    p.scale = (hi - lo) / 15.0f;
    if (!(p.scale > 0.0f)) {  // all zeros (or a range that is not finite)
        p.scale = p.scale > 0.0f ? p.scale : 0.0f;
        return p;
    }
    const float magic = 12582912.0f;  // round to nearest even, as quantize_group
    float z = -lo / p.scale;
    z = z < 15.0f ? z : 15.0f;
    p.zero = int(int32_t((z + magic) - magic));
    return p;
}

Int4Group quantize_group_int4(const float* x, int64_t g, uint8_t* q) {
    // The range always holds 0, so zero is exact and constant groups fit. Eight running minima
    // and maxima (lane-wise selects, which vectorise; a min reduction does not without fast-math),
    // folded at the end: the same values as one running pair.
    float lo8[8] = {}, hi8[8] = {};
    int64_t i = 0;
    for (; i + 8 <= g; i += 8)
        for (int j = 0; j < 8; ++j) {
            lo8[j] = x[i + j] < lo8[j] ? x[i + j] : lo8[j];
            hi8[j] = x[i + j] > hi8[j] ? x[i + j] : hi8[j];
        }
    float lo = 0.0f, hi = 0.0f;
    for (int j = 0; j < 8; ++j) {
        lo = lo8[j] < lo ? lo8[j] : lo;
        hi = hi8[j] > hi ? hi8[j] : hi;
    }
    for (; i < g; ++i) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    const Int4Group p = int4_group_params(lo, hi);
    if (p.scale == 0.0f) {
        for (int64_t k = 0; k < g; ++k) q[k] = 0;
        return p;
    }
    const float magic = 12582912.0f;  // round to nearest even, as quantize_group
    // rne(x / scale) + zero clamped to 0..15, all in f32 (small integers are exact there); locals,
    // not p's members, so that the stores through q (a char type, which may alias) do not force
    // reloads.
    const float scale = p.scale, zero = float(p.zero);
    for (int64_t k = 0; k < g; ++k) {
        float v = x[k] / scale;
        v = v < 64.0f ? v : 64.0f;
        v = v > -64.0f ? v : -64.0f;
        float c = ((v + magic) - magic) + zero;
        c = c < 15.0f ? c : 15.0f;
        c = c > 0.0f ? c : 0.0f;
        q[k] = uint8_t(int32_t(c));
    }
    return p;
}

void pack_int4_row(const uint8_t* codes, int64_t cols, uint8_t* packed) {
    SHARDLM_CHECK(cols % 32 == 0, "int4 rows are whole blocks of 32 columns, not ", cols);
    for (int64_t b = 0; b < cols / 32; ++b)
        for (int i = 0; i < 16; ++i)
            packed[b * 16 + i] = uint8_t((codes[b * 32 + i] & 15) | (codes[b * 32 + 16 + i] & 15) << 4);
}

void quantize_weights_int4_ref(const WeightView& src, int64_t group_size, uint8_t* q, float* scales, float* mins) {
    check_int4_groups(src, group_size);
    std::vector<float> row;
    quantize_int4_rows(src, group_size, q, scales, mins, 0, src.rows, row, CpuIsa::Scalar);
}

void quantize_weights_int4(const WeightView& src, int64_t group_size, uint8_t* q, float* scales, float* mins) {
    check_int4_groups(src, group_size);
    const int64_t block = 64, blocks = (src.rows + block - 1) / block;
#pragma omp parallel
    {
        std::vector<float> row;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; ++b)
            quantize_int4_rows(src, group_size, q, scales, mins, b * block, std::min(src.rows, (b + 1) * block), row,
                               CpuIsa::Auto);
    }
}

float quantize_row_int8(const float* x, int64_t d, int8_t* q) { return quantize_group(x, d, q); }

void quantize_weights_int8_ref(const WeightView& src, int64_t group_size, int8_t* q, float* scales) {
    SHARDLM_CHECK(src.dtype == DType::F32 || src.dtype == DType::F16 || src.dtype == DType::BF16,
                  "int8 quantization reads f32/f16/bf16 weights, not ", dtype_name(src.dtype));
    check_groups(src.cols, group_size);
    std::vector<float> row;
    quantize_weight_rows(src, group_size, q, scales, 0, src.rows, row, CpuIsa::Scalar);
}

void quantize_weights_int8(const WeightView& src, int64_t group_size, int8_t* q, float* scales) {
    SHARDLM_CHECK(src.dtype == DType::F32 || src.dtype == DType::F16 || src.dtype == DType::BF16,
                  "int8 quantization reads f32/f16/bf16 weights, not ", dtype_name(src.dtype));
    check_groups(src.cols, group_size);
    const int64_t block = 64;
    const int64_t blocks = (src.rows + block - 1) / block;
#pragma omp parallel
    {
        std::vector<float> row;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; ++b)
            quantize_weight_rows(src, group_size, q, scales, b * block, std::min(src.rows, (b + 1) * block), row,
                                 CpuIsa::Auto);
    }
}

void quantize_acts_int8_ref(const float* x, int64_t n, int64_t cols, int64_t group_size, int8_t* q, float* scales) {
    check_groups(cols, group_size);
    const int64_t ng = cols / group_size;
    for (int64_t t = 0; t < n; ++t)
        for (int64_t g = 0; g < ng; ++g)
            scales[t * ng + g] = quantize_group(x + t * cols + g * group_size, group_size, q + t * cols + g * group_size);
}

void quantize_rows_int8(const float* x, int64_t n, int64_t cols, int64_t group_size, int8_t* q, float* scales,
                        CpuIsa isa) {
    check_groups(cols, group_size);
    switch (cpu_isa_resolve(isa)) {
#if defined(SHARDLM_HAVE_AVX512)
        case CpuIsa::Amx:
        case CpuIsa::Avx512: return quantize_acts_avx512(x, 0, n, cols, group_size, q, scales);
#endif
#if defined(SHARDLM_HAVE_AVX2)
        case CpuIsa::Avx2: return quantize_acts_avx2(x, 0, n, cols, group_size, q, scales);
#endif
        default: return quantize_acts_int8_ref(x, n, cols, group_size, q, scales);
    }
}

void quantize_acts_int8(const float* x, int64_t n, int64_t cols, int64_t group_size, int8_t* q, float* scales,
                        CpuIsa isa) {
    check_groups(cols, group_size);
    const int64_t ng = cols / group_size;
#pragma omp parallel if (n * cols >= (int64_t(1) << 16))
    {
        const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t t0 = n * tid / nth, t1 = n * (tid + 1) / nth;
        quantize_rows_int8(x + t0 * cols, t1 - t0, cols, group_size, q + t0 * cols, scales + t0 * ng, isa);
    }
}

void quantize_rows_int4(const float* x, int64_t n, int64_t cols, int64_t group_size, uint8_t* q, float* scales,
                        float* mins, CpuIsa isa) {
    SHARDLM_CHECK(group_size > 0 && group_size % 32 == 0 && cols % group_size == 0, "int4 group size ", group_size,
                  " must be a multiple of 32 that divides the row length ", cols);
    Int4Group (*group_fn)(const float*, int64_t, uint8_t*) = group_int4_packed;
    switch (cpu_isa_resolve(isa)) {
#if defined(SHARDLM_HAVE_AVX512)
        case CpuIsa::Amx:
        case CpuIsa::Avx512: group_fn = quantize_group_int4_avx512; break;
#endif
#if defined(SHARDLM_HAVE_AVX2)
        case CpuIsa::Avx2: group_fn = quantize_group_int4_avx2; break;
#endif
        default: break;
    }
    const int64_t ng = cols / group_size;
    for (int64_t r = 0; r < n; ++r)
        for (int64_t g = 0; g < ng; ++g) {
            const Int4Group p = group_fn(x + r * cols + g * group_size, group_size, q + r * (cols / 2) + g * group_size / 2);
            scales[r * ng + g] = p.scale;
            mins[r * ng + g] = p.min();
        }
}

}  // namespace shardlm
