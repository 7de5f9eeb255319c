// attention_cached_flash: FlashAttention-style tiling of attention_cached on the CPU.
//
// Work item = (KV head kh, block of B queries). Its R = B x group rows (row r = query r / group,
// query head kh * group + r % group) are held as Q [R][d], prescaled by `scale`. The keys the
// block can see, 0 .. pos(last query), are walked in tiles of T = kKeyTile positions; each tile is
// dequantized once (INT8: times its per-row scale) into
//     Kt [d][T]  (transposed: a score row is a sum of broadcast q_c times contiguous key vectors)
//     V  [T][d]
// and serves every row of the block (all query heads of the GQA group, all B queries), so cache
// reads per query drop by B compared with attention_cached. Per row, online softmax over tiles:
//     S = Q Kt                                   [R][T]
//     m' = max(m, max_j S_j),  a = e^(m - m'),  P_j = e^(S_j - m')  (0 where j > pos(row))
//     l' = a l + sum_j P_j,    O' = a O + P V
// and out = O / l at the end. Buffers per thread: Q, O (R x d), Kt, V (T x d), S (R x T), about
// 130 KB at R = T = 64, d = 128: they stay in L2 while the cache streams past once per block.
//
// Decode-sized blocks (R < 8, e.g. one query's GQA group) gain nothing from a copied tile: they
// read the cache rows in place through attention_cached's loops, in tiles of 256 keys with the
// same online softmax, so decode costs what attention_cached costs.
// Variants: scalar (below), AVX2 (attention_flash_avx2.cpp: tile copy, softmax, 4 x 16 register
// blocks) and AVX-512 (attention_flash_avx512.cpp: the two products in 4 x 64 blocks).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_kernels.h"

namespace shardlm {

#if defined(SHARDLM_HAVE_AVX2)
// The tile steps with AVX2 + FMA + F16C, in attention_flash_avx2.cpp (the same contracts as the
// scalar steps below).
void flash_load_tile_avx2(const KvRows& k, const KvRows& v, int64_t j0, int64_t n, int64_t d, float* kt,
                          int64_t ldk, float* vt);
void flash_scores_avx2(const float* q, int64_t rows, int64_t d, const float* kt, int64_t ldk, int64_t n, float* s,
                       int64_t lds);
float flash_softmax_row_avx2(float* s, int64_t v0, int64_t v1, int64_t n, float& m, float& l);
void flash_values_avx2(const float* p, int64_t lds, int64_t rows, const float* vt, int64_t n, int64_t d,
                       const float* alpha, float* o);
#endif
#if defined(SHARDLM_HAVE_AVX512)
// The score and value steps with AVX-512, in attention_flash_avx512.cpp.
void flash_scores_avx512(const float* q, int64_t rows, int64_t d, const float* kt, int64_t ldk, int64_t n, float* s,
                         int64_t lds);
void flash_values_avx512(const float* p, int64_t lds, int64_t rows, const float* vt, int64_t n, int64_t d,
                         const float* alpha, float* o);
#endif

namespace {

constexpr int64_t kKeyTile = 64;      // T: keys per tile
constexpr int64_t kRowsPerBlock = 64;  // R: query rows (queries x group heads) per work item
constexpr int64_t kDirectRows = 8;     // fewer rows than this: no tile copy (decode)
constexpr int64_t kDirectTile = 256;   // keys per tile then

inline int64_t round8(int64_t n) { return (n + 7) / 8 * 8; }

inline float cache_value(const KvRows& kv, int64_t slot, int64_t c) {
    const int64_t off = slot * kv.row_stride + c;
    switch (kv.dtype) {
        case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(kv.base)[off]);
        case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(kv.base)[off]);
        case DType::I8: return float(static_cast<const int8_t*>(kv.base)[off]) * kv.scales[slot];
        default: return static_cast<const float*>(kv.base)[off];
    }
}

// Positions j0 .. j0 + n - 1 -> kt[c * ldk + j] (columns n .. round8(n) zeroed) and vt[j * d + c].
void load_tile_scalar(const KvRows& k, const KvRows& v, int64_t j0, int64_t n, int64_t d, float* kt, int64_t ldk,
                      float* vt) {
    for (int64_t j = 0; j < round8(n); ++j) {
        const int64_t slot = (j0 + j) % k.capacity;
        for (int64_t c = 0; c < d; ++c) kt[c * ldk + j] = j < n ? cache_value(k, slot, c) : 0.0f;
        if (j < n)
            for (int64_t c = 0; c < d; ++c) vt[j * d + c] = cache_value(v, slot, c);
    }
}

// s[r * lds + j] = q_r . K_j for r < rows, j < round8(n).
void scores_scalar(const float* q, int64_t rows, int64_t d, const float* kt, int64_t ldk, int64_t n, float* s,
                   int64_t lds) {
    const int64_t np = round8(n);
    for (int64_t r = 0; r < rows; ++r) {
        float* sr = s + r * lds;
        std::fill(sr, sr + np, 0.0f);
        for (int64_t c = 0; c < d; ++c) {
            const float x = q[r * d + c];
            for (int64_t j = 0; j < np; ++j) sr[j] += x * kt[c * ldk + j];
        }
    }
}

// One row's online-softmax step over a tile: the scores of the keys it sees, s[v0 .. v1), become
// e^(s - m'), the rest of s[0 .. round8(n)) zeros (keys masked causally or by the window); m and l
// are updated; returns a = e^(m - m'). A row that sees none of the tile keeps m and l (a = 1).
float softmax_row_scalar(float* s, int64_t v0, int64_t v1, int64_t n, float& m, float& l) {
    const int64_t np = round8(n);
    if (v0 >= v1) {
        std::fill(s, s + np, 0.0f);
        return 1.0f;
    }
    float mt = m;
    for (int64_t j = v0; j < v1; ++j) mt = std::max(mt, s[j]);
    const float alpha = std::exp(m - mt);  // m = -inf before the row's first keys: a = 0
    float sum = 0;
    for (int64_t j = v0; j < v1; ++j) sum += (s[j] = std::exp(s[j] - mt));
    std::fill(s, s + v0, 0.0f);
    std::fill(s + v1, s + np, 0.0f);
    l = l * alpha + sum;
    m = mt;
    return alpha;
}

// The keys of a tile at positions j0 .. j0 + n - 1 that the row of query position `pos` sees:
// [v0, v1) of the tile (empty when v0 >= v1).
inline void visible(int64_t pos, int64_t window, int64_t j0, int64_t n, int64_t& v0, int64_t& v1) {
    v0 = std::clamp<int64_t>(window_start(pos, window) - j0, 0, n);
    v1 = std::clamp<int64_t>(pos - j0 + 1, 0, n);
}

// o[r * d + c] = alpha[r] * o[r * d + c] + sum_{j < n} p[r * lds + j] * vt[j * d + c].
void values_scalar(const float* p, int64_t lds, int64_t rows, const float* vt, int64_t n, int64_t d,
                   const float* alpha, float* o) {
    for (int64_t r = 0; r < rows; ++r) {
        float* orow = o + r * d;
        for (int64_t c = 0; c < d; ++c) orow[c] *= alpha[r];
        for (int64_t j = 0; j < n; ++j) {
            const float w = p[r * lds + j];
            for (int64_t c = 0; c < d; ++c) orow[c] += w * vt[j * d + c];
        }
    }
}

#if defined(SHARDLM_HAVE_AVX2)
// Rows of position j0 .. j0 + n - 1 as a ring-free view: the part from slot j0 % capacity up to
// the ring's end (or n rows, whichever is shorter); `len` returns its length.
KvRows ring_segment(const KvRows& kv, int64_t j0, int64_t n, int64_t& len) {
    const int64_t slot = j0 % kv.capacity;
    len = std::min(n, kv.capacity - slot);
    KvRows seg = kv;
    seg.base = kv_row_ptr(kv, slot);
    if (kv.scales) seg.scales = kv.scales + slot;
    seg.capacity = len;
    return seg;
}

// A decode-sized block (rows < kDirectRows, e.g. one query's GQA group) over keys j0 .. j0 + n - 1:
// copying a tile out would buy no reuse, so scores and values come straight from the cache rows
// through attention_cached's loops (attention_kernels.h), with the same online-softmax update.
// s: [rows][kDirectTile] scores, tmp: [rows][d] P V of one ring segment.
void tile_direct_avx2(const float* q, int64_t rows, int64_t group, int64_t first, int64_t window, int64_t d,
                      const KvRows& K, const KvRows& V, int64_t j0, int64_t n, float* s, float* m, float* l, float* tmp,
                      float* o, bool avx512) {
    (void)avx512;
    int64_t len = 0;
    for (int64_t done = 0; done < n; done += len) {
        const KvRows seg = ring_segment(K, j0 + done, n - done, len);
#if defined(SHARDLM_HAVE_AVX512)
        if (avx512) attn_scores_avx512(q, rows, d, seg, len, 1.0f, s + done, kDirectTile);
        else
#endif
            attn_scores_avx2(q, rows, d, seg, len, 1.0f, s + done, kDirectTile);
    }
    float alpha[kDirectRows];
    for (int64_t r = 0; r < rows; ++r) {
        int64_t v0, v1;
        visible(first + r / group, window, j0, n, v0, v1);
        alpha[r] = flash_softmax_row_avx2(s + r * kDirectTile, v0, v1, n, m[r], l[r]);
    }
    for (int64_t done = 0; done < n; done += len) {
        const KvRows seg = ring_segment(V, j0 + done, n - done, len);
#if defined(SHARDLM_HAVE_AVX512)
        if (avx512) attn_values_avx512(s + done, rows, kDirectTile, seg, len, d, tmp);
        else
#endif
            attn_values_avx2(s + done, rows, kDirectTile, seg, len, d, tmp);
        for (int64_t r = 0; r < rows; ++r) {
            const float a = done == 0 ? alpha[r] : 1.0f;
            for (int64_t c = 0; c < d; ++c) o[r * d + c] = a * o[r * d + c] + tmp[r * d + c];
        }
    }
}
#endif

// Per-thread buffers, kept between calls (the engine calls once per sequence and layer; decode
// calls are short enough for a fresh allocation to show).
struct Scratch {
    std::vector<float> q, o, kt, vt, s, m, l, alpha;
    void reserve(int64_t rows, int64_t d) {
        const auto grow = [](std::vector<float>& v, int64_t n) {
            if (v.size() < size_t(n)) v.resize(size_t(n));
        };
        grow(q, rows * d);
        grow(o, rows * d);
        grow(kt, d * kKeyTile);
        grow(vt, kKeyTile * d);
        grow(s, std::max(rows * kKeyTile, kDirectRows * kDirectTile));
        grow(m, rows);
        grow(l, rows);
        grow(alpha, rows);
    }
};

// One work item: `rows` = nq x group rows of KV head K/V; the block's first query sits at `first`.
// q: [rows][d] prescaled; writes o [rows][d] = softmax(q K^T) V with the causal mask (and the
// sliding window's, window > 0: the tiles start at the first query's first key).
void attend_block(Scratch& t, int64_t rows, int64_t group, int64_t first, int64_t last, int64_t window, int64_t d,
                  const KvRows& K, const KvRows& V, CpuIsa isa) {
    const bool vec = isa != CpuIsa::Scalar;  // any vector variant implies AVX2
    float *q = t.q.data(), *o = t.o.data(), *kt = t.kt.data(), *vt = t.vt.data(), *s = t.s.data();
    float *m = t.m.data(), *l = t.l.data(), *alpha = t.alpha.data();
    std::fill(o, o + rows * d, 0.0f);
    std::fill(m, m + rows, -INFINITY);
    std::fill(l, l + rows, 0.0f);
    const int64_t start = window_start(first, window), end = last + 1;  // keys [start, end)
#if defined(SHARDLM_HAVE_AVX2)
    if (vec && rows < kDirectRows) {
        const int64_t n_keys = end - start;
        const int64_t tiles = (n_keys + kDirectTile - 1) / kDirectTile, tile = (n_keys + tiles - 1) / tiles;
        for (int64_t j0 = start; j0 < end; j0 += tile)
            tile_direct_avx2(q, rows, group, first, window, d, K, V, j0, std::min(tile, end - j0), s, m, l, kt, o,
                             cpu_isa_avx512(isa));
        return;
    }
#endif
    for (int64_t j0 = start; j0 < end; j0 += kKeyTile) {
        const int64_t n = std::min(kKeyTile, end - j0);
#if defined(SHARDLM_HAVE_AVX2)
        if (vec) {
            flash_load_tile_avx2(K, V, j0, n, d, kt, kKeyTile, vt);
#if defined(SHARDLM_HAVE_AVX512)
            if (cpu_isa_avx512(isa)) flash_scores_avx512(q, rows, d, kt, kKeyTile, n, s, kKeyTile);
            else
#endif
                flash_scores_avx2(q, rows, d, kt, kKeyTile, n, s, kKeyTile);
            for (int64_t r = 0; r < rows; ++r) {
                int64_t v0, v1;
                visible(first + r / group, window, j0, n, v0, v1);
                alpha[r] = flash_softmax_row_avx2(s + r * kKeyTile, v0, v1, n, m[r], l[r]);
            }
#if defined(SHARDLM_HAVE_AVX512)
            if (cpu_isa_avx512(isa)) flash_values_avx512(s, kKeyTile, rows, vt, n, d, alpha, o);
            else
#endif
                flash_values_avx2(s, kKeyTile, rows, vt, n, d, alpha, o);
            continue;
        }
#endif
        load_tile_scalar(K, V, j0, n, d, kt, kKeyTile, vt);
        scores_scalar(q, rows, d, kt, kKeyTile, n, s, kKeyTile);
        for (int64_t r = 0; r < rows; ++r) {
            int64_t v0, v1;
            visible(first + r / group, window, j0, n, v0, v1);
            alpha[r] = softmax_row_scalar(s + r * kKeyTile, v0, v1, n, m[r], l[r]);
        }
        values_scalar(s, kKeyTile, rows, vt, n, d, alpha, o);
    }
    (void)vec;
}

}  // namespace

void attention_cached_flash(const CachedAttention& a) {
    SHARDLM_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 && a.capacity > 0, "attention: bad head counts");
    SHARDLM_CHECK(a.kv_dtype != DType::I8 || (a.k_scales && a.v_scales), "attention: INT8 KV cache needs scales");
    const int64_t d = a.head_dim, group = a.n_heads / a.n_kv_heads;
    const int64_t block = std::max<int64_t>(1, kRowsPerBlock / group);  // queries per work item
    const int64_t n_blocks = (a.n_q + block - 1) / block, work = n_blocks * a.n_kv_heads;
    const CpuIsa isa = cpu_isa_resolve(a.isa);
#pragma omp parallel if (work > 1)
    {
        static thread_local Scratch t;
        t.reserve(block * group, d);
        // Later query blocks see more keys: hand them out first so the last items are the short ones.
#pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < work; ++w) {
            const int64_t b = n_blocks - 1 - w / a.n_kv_heads, kh = w % a.n_kv_heads;
            const int64_t i0 = b * block, nq = std::min(block, a.n_q - i0), rows = nq * group;
            const KvRows K = kv_rows(a, kh, false), V = kv_rows(a, kh, true);
            for (int64_t i = 0; i < nq; ++i) {  // the group's heads are adjacent: group * d floats
                const float* src = a.q + ((i0 + i) * a.n_heads + kh * group) * d;
                for (int64_t e = 0; e < group * d; ++e) t.q[size_t(i * group * d + e)] = src[e] * a.scale;
            }
            const int64_t first = a.q_pos0 + i0;  // position of the block's first query
            attend_block(t, rows, group, first, first + nq - 1, a.window, d, K, V, isa);
            for (int64_t r = 0; r < rows; ++r) {
                float* dst = a.out + ((i0 + r / group) * a.n_heads + kh * group + r % group) * d;
                const float inv = 1.0f / t.l[size_t(r)];  // l >= 1: every row sees at least itself
                for (int64_t c = 0; c < d; ++c) dst[c] = t.o[size_t(r * d + c)] * inv;
            }
        }
    }
}

}  // namespace shardlm
