// AMX kernels of the prefill GEMMs (Sapphire Rapids and later). This file alone is compiled with
// the AMX and AVX512-BF16 flags (plus the AVX-512 ones) and only called when cpu_isa.cpp found AMX
// usable. Two kernels, same blocking:
//  - INT8 (matmul_w8a8 / matmul_w4a8): one tdpbsud multiplies a 16 x 64 tile of signed bytes by a
//    64 x 16 one of unsigned bytes into a 16 x 16 INT32 tile: 16384 products, against vpdpbusd's 64.
//    The B tiles are the AVX-512 GEMM's weight panel as it is (pack_w8a8_panel_avx512: VNNI quads of
//    16 rows, u8 = w + 128 for I8, the 4-bit codes for I4), the A tiles 16 tokens of the activations
//    in tile order (W8A8Prep::qt). The epilogue repeats the AVX-512 kernel's arithmetic step for step
//    (its segments, its -128 * sum offset for I8, the same f32 multiply-adds in the same order), so
//    both variants give the same bits.
//  - BF16 (matmul with I8, I4 or BF16 weights): tdpbf16ps on weights exact in bf16 and activations
//    carried as two bf16 parts (see below), within 2^-16 of the f32 values.
// Eight tiles: C[2 token halves][2 row halves], two A, two B, so each 32-token x 32-row block does
// four tile products per step of columns.
//
// simd_avx512.h first: it silences GCC 12's false warnings inside <immintrin.h>, which must not be
// parsed before it.
#include "kernels/cpu/simd_avx512.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/simd_avx2.h"

namespace shardlm {
namespace {

constexpr int MR = 32;  // weight rows per panel (two B tiles)
constexpr int NT = 32;  // tokens per block (two A tiles)

// The tile register file's shape, loaded once per thread and call: all eight tiles 16 rows x 64 bytes.
struct alignas(64) TileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// ldtilecfg reads all 64 bytes of c, but GCC 12 does not count the intrinsic as a use of them:
// once inlined it may drop the stores of rows and colsb (seen in a build of gemv_rows_amx: palette 1,
// no rows, and the first tile instruction raised SIGILL). The empty asm makes all of c live first.
void load_tile_config(const TileConfig& c) {
    __asm__ volatile("" : : "m"(c) : "memory");
    _tile_loadconfig(&c);
}

void configure_tiles() {
    TileConfig c;
    for (int i = 0; i < 8; ++i) {
        c.colsb[i] = 64;
        c.rows[i] = 16;
    }
    load_tile_config(c);
}

// facc[t][0..32) += mins[0..32) * xs[t * xs_stride] for the n tokens: an I4 group's mins times each
// token's (dequantized) sum of activations over the group.
void add_mins(float* facc, int64_t n, const float* mins, const float* xs, int64_t xs_stride) {
    const __m512 mn0 = _mm512_load_ps(mins), mn1 = _mm512_load_ps(mins + 16);
    for (int64_t t = 0; t < n; ++t) {
        const __m512 x = _mm512_set1_ps(xs[t * xs_stride]);
        float* f = facc + t * 32;
        _mm512_store_ps(f, _mm512_fmadd_ps(mn0, x, _mm512_load_ps(f)));
        _mm512_store_ps(f + 16, _mm512_fmadd_ps(mn1, x, _mm512_load_ps(f + 16)));
    }
}

// y[t][rb + 0..nr) = facc[t][0..nr) + bias, for the n tokens (y rows ys apart).
void store_rows(const float* facc, int64_t n, int64_t nr, const float* bias, float* y, int64_t ys) {
    const __mmask16 m0 = mask16(nr), m1 = mask16(std::max<int64_t>(0, nr - 16));
    const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    const __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
        _mm512_mask_storeu_ps(y + t * ys, m0, _mm512_add_ps(_mm512_load_ps(facc + t * 32), b0));
        _mm512_mask_storeu_ps(y + t * ys + 16, m1, _mm512_add_ps(_mm512_load_ps(facc + t * 32 + 16), b1));
    }
}

// The four C tiles (tokens 0..15 / 16..31 x rows 0..15 / 16..31): zeroed, and stored to c[token][row].
inline void zero_c_tiles() {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

template <typename T>
inline void store_c_tiles(T (*c)[MR]) {
    _tile_stored(0, &c[0][0], MR * 4);
    _tile_stored(1, &c[0][16], MR * 4);
    _tile_stored(2, &c[16][0], MR * 4);
    _tile_stored(3, &c[16][16], MR * 4);
}

// The next panel's weight rows, brought into L2 a few 64-byte lines per tile step while this
// panel's products run: its pack (a first touch of those rows) would otherwise wait on DRAM with
// the tile unit idle, ~40% of a W8A8 prefill of 128 tokens.
struct PanelPrefetch {
    const uint8_t* base = nullptr;  // the next panel's first row; null: nothing to fetch
    int64_t row_bytes = 0, row_lines = 0, total = 0, per_step = 0, next = 0;

    PanelPrefetch(const WeightView& w, int64_t rb, int64_t r1, int64_t steps) {
        const int64_t nr = std::min<int64_t>(MR, r1 - rb);
        if (nr <= 0 || steps <= 0) return;
        row_bytes = weight_row_bytes(w);
        base = static_cast<const uint8_t*>(w.data) + rb * row_bytes;
        row_lines = (row_bytes + 63) / 64;
        total = nr * row_lines;
        per_step = (total + steps - 1) / steps;
    }
    void step() {
        for (int64_t i = 0; i < per_step && next < total; ++i, ++next)
            _mm_prefetch(reinterpret_cast<const char*>(base + next / row_lines * row_bytes + next % row_lines * 64),
                         _MM_HINT_T1);
    }
};

// The INT32 dot products of one segment, quads [q0, q1) of an internal group, for one 32-token
// block (xt: its activations in tile order, W8A8Prep::qt, at the group's first column) x the panel's
// 32 rows (pe: the group's first quad), stored to c[token][row].
void segment_tiles(const int8_t* xt, const uint8_t* pe, int64_t q0, int64_t q1, int32_t (*c)[MR], PanelPrefetch& pf) {
    zero_c_tiles();
    for (int64_t q = q0; q < q1; q += 16) {
        pf.step();
        const int8_t* x = xt + q / 16 * 2048;
        _tile_loadd(4, x, 64);
        _tile_loadd(5, x + 1024, 64);
        _tile_loadd(6, pe + q * 128, 128);
        _tile_loadd(7, pe + q * 128 + 64, 128);
        _tile_dpbsud(0, 4, 6);
        _tile_dpbsud(1, 4, 7);
        _tile_dpbsud(2, 5, 6);
        _tile_dpbsud(3, 5, 7);
    }
    store_c_tiles(c);
}

}  // namespace

// Loop order: per 32-row panel, per segment (at most 1024 columns: 32 KB of the panel, which stays in
// L1 while every token block streams its activations past it from L2), per 32-token block; the f32
// sums of all tokens x 32 rows (facc) wait in L2 between segments.
void int8_acts_rows_amx(const W8A8Prep& a, const WeightView& w, const float* bias, float* y, int64_t r0, int64_t r1) {
    if (!amx_tiles_usable(a) || !a.qt) {  // decode GEMV, or groups a tile row cannot step over
        if (a.i4) w4a8_rows_avx512(a, w, bias, y, r0, r1);
        else w8a8_rows_avx512(a, w, bias, y, r0, r1);
        return;
    }
    const int64_t n = a.n, steps = a.kp / 64;
    const size_t panel_bytes = size_t(a.kp) * MR, scale_bytes = size_t(a.ng * MR) * 8;
    uint8_t* mem = scratch(panel_bytes + scale_bytes + size_t(n) * MR * 4);
    uint8_t* panel = mem;
    float* wsc = reinterpret_cast<float*>(mem + panel_bytes);
    float* wmn = wsc + a.ng * MR;
    float* facc = reinterpret_cast<float*>(mem + panel_bytes + scale_bytes);
    const int64_t q_per = a.ge4 / 4, seg_q = a.seg_len / 4;
    alignas(64) int32_t c[NT][MR];
    configure_tiles();
    for (int64_t rb = r0; rb < r1; rb += MR) {
        const int64_t nr = std::min<int64_t>(MR, r1 - rb);
        pack_w8a8_panel_avx512(a, w, rb, nr, panel, wsc, wmn);
        PanelPrefetch pf(w, rb + MR, r1, steps * ((n + NT - 1) / NT));  // one step per 64 columns and token block
        std::memset(facc, 0, size_t(n) * MR * 4);
        for (int64_t e = 0; e < a.ng; ++e) {
            const uint8_t* pe = panel + e * q_per * 128;
            const __m512 sw0 = _mm512_load_ps(wsc + e * MR), sw1 = _mm512_load_ps(wsc + e * MR + 16);
            for (int64_t s = 0; s < a.segs; ++s) {
                const int64_t q0 = s * seg_q, q1 = std::min(q_per, q0 + seg_q);  // multiples of 16 quads
                for (int64_t t0 = 0; t0 < n; t0 += NT) {
                    segment_tiles(a.qt + ((t0 / NT) * steps + e * a.ge4 / 64) * 2048, pe, q0, q1, c, pf);
                    const int64_t nt = std::min<int64_t>(NT, n - t0);
                    for (int64_t t = 0; t < nt; ++t) {
                        // I8 panels hold w + 128: take 128 * (the segment's sum of activations) back off.
                        const int64_t i = (t0 + t) * a.ng + e;
                        const __m512i off = _mm512_set1_epi32(a.i4 ? 0 : -128 * a.seg_sums[i * a.segs + s]);
                        const __m512 sa = _mm512_set1_ps(a.scales[i]);
                        const __m512 c0 = _mm512_cvtepi32_ps(_mm512_add_epi32(off, _mm512_load_si512(c[t])));
                        const __m512 c1 = _mm512_cvtepi32_ps(_mm512_add_epi32(off, _mm512_load_si512(c[t] + 16)));
                        float* f = facc + (t0 + t) * MR;
                        _mm512_store_ps(f, _mm512_fmadd_ps(c0, _mm512_mul_ps(sw0, sa), _mm512_load_ps(f)));
                        _mm512_store_ps(f + 16, _mm512_fmadd_ps(c1, _mm512_mul_ps(sw1, sa), _mm512_load_ps(f + 16)));
                    }
                }
            }
            if (a.i4) add_mins(facc, n, wmn + e * MR, a.xs + e, a.ng);  // + min * (the group's sum of x)
        }
        store_rows(facc, n, nr, bias ? bias + rb : nullptr, y + rb, w.rows);
    }
    _tile_release();  // frees the tile state for the OS's context switches
}

// ---------------------------------------------------------------------------------------------
// BF16 (W8A16, W4A16 and BF16 weights). tdpbf16ps: a 16 x 32 bf16 A tile times a B tile of 16 rows of
// column pairs (row p: 16 outputs x the 2 values of columns 2p, 2p + 1) into 16 x 16 f32 C. The
// panel of 32 weight rows holds, per 32 columns (step s, 2 KB at s * 1024 uint16s), the B tile of
// rows 0..15 then that of rows 16..31, each [pair][16 rows][2 values]: a 16 x 16 transpose of 32-bit
// pairs. int8 weights and 4-bit codes are exact in bf16; their scales multiply the f32 sums per
// group, and I4's mins the group's sum of activations (the AVX-512 GEMV's decomposition too).

namespace {

// Each activation is carried as two bf16 parts, x ~ hi + lo: 16 significant bits, |x - (hi + lo)| <=
// 2^-16 |x| (a third part made it exact, but the tiles' time grows with the parts: 3 -> 2 took a
// 128-token int8 prefill of the 1.7B shape from 112-130 to 151-170 tokens/s in kernels_bench). That
// is 32 times finer than the fp16 activations of the CUDA engine's cuBLAS GEMMs and far below INT8's
// weight rounding; each part times the (exact) bf16 weights is an exact f32 product, summed in f32.

// Blocking, from what the tiles cost on a Xeon 6 (microbenchmarks of this loop, one core): a tile
// product takes 16 cycles; with the operands streaming from L2, each flush of the C tiles (store,
// zero) stalls the next loads for about as long as 90 products (a flush every 16 steps ran at ~50% of
// the products' peak, every 64 at ~70%), and activations streamed from L3 instead of L2 drop it to
// ~23%. Hence:
//  - a pass: the columns between two flushes, a whole scale group, or kBf16KBlock columns of a longer
//    one;
//  - a K block: the columns packed at once, whole passes up to kBf16KBlock;
//  - a row block: the panels packed at once, up to kBf16BBlockBytes of bf16 (L2), so the
//    activations of a 32-token block (32 x kBf16KBlock x 2 parts, 256 KB) are read from L3 once
//    per row block, not once per 32-row panel, and then serve every panel of it from L2.
constexpr int64_t kBf16KBlock = 2048;
constexpr int64_t kBf16BBlockBytes = int64_t(1) << 20;

int64_t bf16_pass(int64_t group) {
    if (group <= kBf16KBlock) return group;
    return group % kBf16KBlock == 0 ? kBf16KBlock : group;
}

// Columns [k0, k0 + kc) of rows [rb, rb + nr) of w (nr <= 32) as a bf16 panel, step s of the block
// (32 columns, 2 KB) at panel + s * 1024: the B tile of rows 0..15, then that of rows 16..31, each
// [pair][16 rows][2 values]; rows past nr zero. wsc[gl][32] (and for I4 wmn[gl][32]) hold the rows'
// scales (mins) of the block's groups, gl = 0 for the group of column k0.
void pack_bf16_panel(const WeightView& w, int64_t group, int64_t rb, int64_t nr, int64_t k0, int64_t kc,
                     uint16_t* panel, float* wsc, float* wmn) {
    const int64_t ng = w.cols / group, g0 = k0 / group, ngk = (k0 + kc - 1) / group - g0 + 1;
    const bool i8 = w.dtype == DType::I8, i4 = w.dtype == DType::I4;
    const size_t row_bytes = size_t(weight_row_bytes(w));
    const __m128i nib = _mm_set1_epi8(0x0F);
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    for (int h = 0; h < 2; ++h) {
        const int64_t vr = std::clamp<int64_t>(nr - 16 * h, 0, 16);
        for (int64_t s = 0; s < kc / 32; ++s) {
            const int64_t gs = k0 / 32 + s;  // the step's place in the whole row
            __m512 v[16];
            for (int i = 0; i < 16; ++i) {
                const uint8_t* row = base + size_t(rb + 16 * h + i) * row_bytes;
                if (i >= vr) {
                    v[i] = _mm512_setzero_ps();
                } else if (i4) {  // 16 bytes: columns 0..15 in the low nibbles, 16..31 in the high
                    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + gs * 16));
                    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, nib)));
                    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), nib)));
                    v[i] = _mm512_castsi512_ps((__m512i)_mm512_cvtne2ps_pbh(hi, lo));
                } else if (i8) {
                    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + gs * 32));
                    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(b)));
                    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1)));
                    v[i] = _mm512_castsi512_ps((__m512i)_mm512_cvtne2ps_pbh(hi, lo));
                } else {
                    v[i] = _mm512_loadu_ps(row + gs * 64);
                }
            }
            transpose16(v);  // v[p] = column pair p of the 16 rows
            uint16_t* dst = panel + s * 1024 + h * 512;
            for (int p = 0; p < 16; ++p) _mm512_store_ps(dst + p * 32, v[p]);
        }
        for (int64_t gl = 0; gl < ngk; ++gl)
            for (int i = 0; i < 16; ++i) {
                const int64_t wi = (rb + 16 * h + i) * ng + g0 + gl;
                wsc[gl * MR + 16 * h + i] = i >= vr ? 0.0f : w.scales ? w.scales[wi] : 1.0f;
                wmn[gl * MR + 16 * h + i] = i >= vr || !i4 ? 0.0f : w.mins[wi];
            }
    }
}

// Steps [s0, s1) for one 32-token block (xt: its first step) x the panel, stored to c[token][row].
void pass_tiles_bf16(const uint16_t* xt, const uint16_t* panel, int64_t s0, int64_t s1, float (*c)[MR]) {
    zero_c_tiles();
    for (int64_t s = s0; s < s1; ++s) {
        _tile_loadd(6, panel + s * 1024, 64);
        _tile_loadd(7, panel + s * 1024 + 512, 64);
        for (int part = 0; part < kAmxBf16Parts; ++part) {
            const uint16_t* a = xt + (s * kAmxBf16Parts + part) * 1024;
            _tile_loadd(4, a, 64);
            _tile_loadd(5, a + 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    store_c_tiles(c);
}

}  // namespace

namespace {

// x rounded to bf16 (the top 16 bits, to nearest even), as f32 again.
inline __m256i to_bf16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }
inline __m512 from_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

}  // namespace

void acts_to_bf16_tiles_amx(const float* x, int64_t cols, int64_t t0, int64_t t1, uint16_t* xt, int64_t group,
                            float* xsum) {
    const int64_t steps = cols / 32;
    for (int64_t t = t0; t < t1; ++t) {
        if (xsum)
            for (int64_t g = 0; g < cols / group; ++g) {
                __m512 acc = _mm512_setzero_ps();
                for (int64_t k = g * group; k < (g + 1) * group; k += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + t * cols + k));
                xsum[t * (cols / group) + g] = _mm512_reduce_add_ps(acc);
            }
        for (int64_t s = 0; s < steps; ++s) {
            uint16_t* dst = xt + (((t / NT) * steps + s) * kAmxBf16Parts * NT + t % NT) * 32;
            for (int half = 0; half < 2; ++half) {
                __m512 r = _mm512_loadu_ps(x + t * cols + s * 32 + 16 * half);
                for (int part = 0; part < kAmxBf16Parts; ++part) {  // x ~ hi + lo
                    const __m256i h = to_bf16(r);
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + part * NT * 32 + 16 * half), h);
                    r = _mm512_sub_ps(r, from_bf16(h));
                }
            }
        }
    }
}

// Loop order: K block -> row block (its panels packed) -> 32-token block -> panel -> passes. The f32
// sums of one token block x panel (facc) live in L1 across the K block's passes; between K blocks
// they wait in y (bias added at the last).
void matmul_rows_amx(const uint16_t* xt, const float* xsum, int64_t n, const WeightView& w, const float* bias,
                     float* y, int64_t r0, int64_t r1) {
    const int64_t steps = w.cols / 32, group = w.dtype == DType::BF16 ? w.cols : w.group_size;
    const int64_t ng = w.cols / group, pass = bf16_pass(group), pass_steps = pass / 32;
    const int64_t kb = std::max<int64_t>(1, kBf16KBlock / pass) * pass;  // whole passes
    // One token block reuses nothing across panels: pack one at a time, as the panel then stays in L1/L2.
    const int64_t rbl = n <= NT ? MR : std::clamp<int64_t>(kBf16BBlockBytes / (kb * 2) / MR * MR, MR, 8 * MR);
    const int64_t ngk_max = (kb + group - 1) / group + 1, panel_elems = kb * MR;
    const size_t panels_bytes = size_t(rbl / MR * panel_elems) * 2, scale_floats = size_t(rbl / MR * ngk_max * MR);
    uint8_t* mem = scratch(panels_bytes + scale_floats * 8);
    uint16_t* panels = reinterpret_cast<uint16_t*>(mem);
    float* wsc = reinterpret_cast<float*>(mem + panels_bytes);
    float* wmn = wsc + scale_floats;
    alignas(64) float c[NT][MR], facc[NT][MR];
    configure_tiles();
    for (int64_t k0 = 0; k0 < w.cols; k0 += kb) {
        const int64_t kc = std::min(kb, w.cols - k0), ksteps = kc / 32, g0 = k0 / group;
        const bool first = k0 == 0, last = k0 + kc == w.cols;
        for (int64_t b0 = r0; b0 < r1; b0 += rbl) {
            const int64_t b1 = std::min(r1, b0 + rbl), np = (b1 - b0 + MR - 1) / MR;
            for (int64_t p = 0; p < np; ++p)
                pack_bf16_panel(w, group, b0 + p * MR, std::min<int64_t>(MR, b1 - b0 - p * MR), k0, kc,
                                panels + p * panel_elems, wsc + p * ngk_max * MR, wmn + p * ngk_max * MR);
            for (int64_t t0 = 0; t0 < n; t0 += NT) {
                const int64_t nt = std::min<int64_t>(NT, n - t0);
                const uint16_t* xb = xt + ((t0 / NT) * steps + k0 / 32) * kAmxBf16Parts * 1024;
                for (int64_t p = 0; p < np; ++p) {
                    const int64_t rb = b0 + p * MR, nr = std::min<int64_t>(MR, b1 - rb);
                    const __mmask16 m0 = mask16(nr), m1 = mask16(std::max<int64_t>(0, nr - 16));
                    for (int64_t t = 0; t < nt; ++t) {  // the sums so far: 0, or the earlier K blocks' in y
                        const float* yt = y + (t0 + t) * w.rows + rb;
                        _mm512_store_ps(facc[t], first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, yt));
                        _mm512_store_ps(facc[t] + 16, first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, yt + 16));
                    }
                    const uint16_t* panel = panels + p * panel_elems;
                    for (int64_t s0 = 0; s0 < ksteps; s0 += pass_steps) {
                        const int64_t g = (k0 + s0 * 32) / group, gl = g - g0;
                        const float* sc = wsc + (p * ngk_max + gl) * MR;
                        const __m512 sw0 = _mm512_load_ps(sc), sw1 = _mm512_load_ps(sc + 16);
                        pass_tiles_bf16(xb, panel, s0, s0 + pass_steps, c);
                        for (int64_t t = 0; t < nt; ++t) {
                            _mm512_store_ps(facc[t], _mm512_fmadd_ps(_mm512_load_ps(c[t]), sw0, _mm512_load_ps(facc[t])));
                            _mm512_store_ps(facc[t] + 16,
                                            _mm512_fmadd_ps(_mm512_load_ps(c[t] + 16), sw1, _mm512_load_ps(facc[t] + 16)));
                        }
                        if (xsum && (k0 + (s0 + pass_steps) * 32) % group == 0)  // I4, the group's end: + min * sum(x)
                            add_mins(&facc[0][0], nt, wmn + (p * ngk_max + gl) * MR, xsum + t0 * ng + g, ng);
                    }
                    store_rows(&facc[0][0], nt, nr, last && bias ? bias + rb : nullptr, y + t0 * w.rows + rb, w.rows);
                }
            }
        }
    }
    _tile_release();
}

// ---------------------------------------------------------------------------------------------
// GEMV on tiles (I4 at 3-16 tokens, I8 at 5-16). Per 32-row panel and 64-column chunk each row
// becomes two A rows of 32 exact bf16 values, a[h][row]:
//  - I4: the row's 32 bytes of codes widen to 32 words; vpermw maps the low five bits of a word
//    through a table of bf16(i & 15), so the words give the low nibbles and the words >> 4 the high
//    ones (h = 0: the chunk's columns 0..15 and 32..47, h = 1: 16..31 and 48..63, the order
//    acts_to_gemv_tiles_amx gives x);
//  - I8: the row's 64 bytes, int8 -> f32 -> bf16 (h = 0: columns 0..31, h = 1: 32..63).
// Tiles: C 0/1 (rows 0..15 / 16..31 x np tokens), A 2/3, B 4/5 (the two parts of x). At a group's
// end the C tiles take the group's scale into f32 sums (and for I4 the min times the group's sum of x).

namespace {

// Column of x that A step s's element e multiplies (e < 32).
inline int64_t gemv_col(bool i4, int64_t s, int64_t e) {
    return i4 ? (s / 2) * 64 + (s % 2) * 16 + e + (e >= 16 ? 16 : 0) : s * 32 + e;
}

void configure_gemv_tiles(int64_t np) {
    TileConfig c;
    for (int i = 0; i < 6; ++i) {
        c.rows[i] = 16;
        c.colsb[i] = uint16_t(i == 2 || i == 3 ? 64 : 4 * np);
    }
    load_tile_config(c);
}

}  // namespace

void acts_to_gemv_tiles_amx(const float* x, int64_t n, const WeightView& w, uint16_t* xb, float* xsum) {
    const bool i4 = w.dtype == DType::I4;
    const int64_t np = amx_gemv_tokens(n), cols = w.cols, steps = cols / 32, group = w.group_size;
    // Per step: each token's 32 values (two runs of 16 columns) as 16 dwords of bf16 pairs, hi and lo
    // parts; a 16 x 16 dword transpose makes them the B tiles' rows (pair p: the np tokens' dwords).
    for (int64_t s = 0; s < steps; ++s) {
        const int64_t c0 = gemv_col(i4, s, 0), c1 = gemv_col(i4, s, 16);
        __m512 vh[16], vl[16];
        for (int64_t t = 0; t < 16; ++t) {
            if (t >= n) {
                vh[t] = vl[t] = _mm512_setzero_ps();
                continue;
            }
            const __m512 a = _mm512_loadu_ps(x + t * cols + c0), b = _mm512_loadu_ps(x + t * cols + c1);
            const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // x ~ hi + lo: a's 16 values, then b's
            const __m512 ah = from_bf16(_mm512_castsi512_si256(h)), bh = from_bf16(_mm512_extracti64x4_epi64(h, 1));
            vh[t] = _mm512_castsi512_ps(h);
            vl[t] = _mm512_castsi512_ps((__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, bh), _mm512_sub_ps(a, ah)));
        }
        transpose16(vh);  // vh[p] lane t: token t's pair p
        transpose16(vl);
        for (int p = 0; p < 16; ++p) {
            _mm512_mask_storeu_ps(xb + ((s * 2) * 16 + p) * np * 2, mask16(np), vh[p]);
            _mm512_mask_storeu_ps(xb + ((s * 2 + 1) * 16 + p) * np * 2, mask16(np), vl[p]);
        }
    }
    if (!i4) return;
    for (int64_t g = 0; g < cols / group; ++g)
        for (int64_t t = 0; t < np; ++t) {
            __m512 acc = _mm512_setzero_ps();
            if (t < n)
                for (int64_t k = g * group; k < (g + 1) * group; k += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + t * cols + k));
            xsum[g * np + t] = _mm512_reduce_add_ps(acc);
        }
}

void gemv_rows_amx(const uint16_t* xb, const float* xsum, int64_t n, const WeightView& w, const float* bias, float* y,
                   int64_t r0, int64_t r1) {
    const bool i4 = w.dtype == DType::I4;
    const int64_t np = amx_gemv_tokens(n), cols = w.cols, rb = weight_row_bytes(w), ng = cols / w.group_size;
    const int64_t chunks_per_group = w.group_size / 64, b_step = 2 * 16 * np * 2;  // uint16s of xb per step
    alignas(64) uint16_t a[2][MR][32];          // the chunk's two A steps
    alignas(64) float c[MR * 16], facc[MR * 16];  // [row][np]
    alignas(64) int32_t lut_words[16];
    for (int i = 0; i < 32; i += 2) {  // word i of the table: bf16(i & 15), packed two per dword
        const float lo = float(i & 15), hi = float((i + 1) & 15);
        uint32_t ul, uh;
        std::memcpy(&ul, &lo, 4);
        std::memcpy(&uh, &hi, 4);
        lut_words[i / 2] = int32_t((ul >> 16) | (uh & 0xFFFF0000u));
    }
    const __m512i lut = _mm512_load_si512(lut_words);
    // Lane l of facc's k-th vector in a 16-row half: row (16 k + l) / np, token l % np.
    __m512i row_of[16];
    alignas(64) int32_t idx[16];
    for (int64_t k = 0; k < np; ++k) {
        for (int l = 0; l < 16; ++l) idx[l] = int32_t((16 * k + l) / np);
        row_of[k] = _mm512_load_si512(idx);
    }
    for (int l = 0; l < 16; ++l) idx[l] = int32_t(l % np);
    const __m512i tok_of = _mm512_load_si512(idx);
    for (int l = 0; l < 16; ++l) idx[l] = int32_t(l * ng);
    const __m512i row_stride = _mm512_load_si512(idx);
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    configure_gemv_tiles(np);
    for (int64_t r = r0; r < r1; r += MR) {
        const int64_t nr = std::min<int64_t>(MR, r1 - r);
        PanelPrefetch pf(w, r + MR, r1, cols / 64);  // the next panel, into L2 while this one runs
        std::memset(facc, 0, sizeof(facc));
        if (nr < MR) std::memset(a, 0, sizeof(a));
        _tile_zero(0);
        _tile_zero(1);
        for (int64_t ch = 0; ch < cols / 64; ++ch) {
            pf.step();
            if (i4) {
                for (int64_t i = 0; i < nr; ++i) {
                    const __m512i wd = _mm512_cvtepu8_epi16(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + (r + i) * rb + ch * 32)));
                    _mm512_store_si512(a[0][i], _mm512_permutexvar_epi16(wd, lut));
                    _mm512_store_si512(a[1][i], _mm512_permutexvar_epi16(_mm512_srli_epi16(wd, 4), lut));
                }
            } else {
                for (int64_t i = 0; i < nr; ++i) {
                    const __m512i b = _mm512_loadu_si512(base + (r + i) * rb + ch * 64);
                    for (int h = 0; h < 2; ++h) {
                        const __m256i bh = h ? _mm512_extracti64x4_epi64(b, 1) : _mm512_castsi512_si256(b);
                        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(bh)));
                        const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(bh, 1)));
                        _mm512_store_si512(a[h][i], (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
                    }
                }
            }
            for (int h = 0; h < 2; ++h) {
                const uint16_t* b = xb + (ch * 2 + h) * b_step;
                _tile_loadd(2, a[h][0], 64);
                _tile_loadd(3, a[h][16], 64);
                _tile_loadd(4, b, 4 * np);
                _tile_loadd(5, b + b_step / 2, 4 * np);
                _tile_dpbf16ps(0, 2, 4);
                _tile_dpbf16ps(0, 2, 5);
                _tile_dpbf16ps(1, 3, 4);
                _tile_dpbf16ps(1, 3, 5);
            }
            if ((ch + 1) % chunks_per_group) continue;
            // The group's end: facc += scale * C (+ min * sum(x) for I4), per row and token.
            const int64_t g = ch / chunks_per_group;
            _tile_stored(0, c, 4 * np);
            _tile_stored(1, c + 16 * np, 4 * np);
            _tile_zero(0);
            _tile_zero(1);
            // I4: each token's sum of x over the group, its lanes repeating every np lanes as facc's do
            const __m512 xs = i4 ? _mm512_permutexvar_ps(tok_of, _mm512_maskz_loadu_ps(mask16(np), xsum + g * np))
                                 : _mm512_setzero_ps();
            for (int64_t half = 0; half < 2; ++half) {
                const int64_t row0 = r + 16 * half;
                const __mmask16 m = mask16(std::clamp<int64_t>(r1 - row0, 0, 16));
                const __m512 sc = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, row_stride, w.scales + row0 * ng + g, 4);
                const __m512 mn = i4 ? _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, row_stride, w.mins + row0 * ng + g, 4)
                                     : _mm512_setzero_ps();
                for (int64_t k = 0; k < np; ++k) {
                    float* f = facc + 16 * half * np + 16 * k;
                    const float* cc = c + 16 * half * np + 16 * k;
                    __m512 v = _mm512_fmadd_ps(_mm512_load_ps(cc), _mm512_permutexvar_ps(row_of[k], sc), _mm512_load_ps(f));
                    if (i4) v = _mm512_fmadd_ps(_mm512_permutexvar_ps(row_of[k], mn), xs, v);
                    _mm512_store_ps(f, v);
                }
            }
        }
        for (int64_t t = 0; t < n; ++t)
            for (int64_t i = 0; i < nr; ++i) y[t * w.rows + r + i] = facc[i * np + t] + (bias ? bias[r + i] : 0.0f);
    }
    _tile_release();
}

}  // namespace shardlm
