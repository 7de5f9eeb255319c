#include "model/hf_quant.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/weights_view.h"

namespace shardlm {

namespace {

// Word i of a little-endian int32 tensor (the map gives no alignment guarantee).
inline uint32_t word(const uint8_t* p, int64_t i) {
    uint32_t w;
    std::memcpy(&w, p + 4 * i, 4);
    return w;
}

float scale_at(const PackedLinear& m, int64_t group, int64_t row) {
    const int64_t i = m.per_tensor                                  ? 0
                      : m.method == QuantMethod::CompressedTensors ? row * (m.cols / m.group) + group
                                                                   : group * m.rows + row;
    float s;
    values_to_f32(m.scale_dtype, m.scales + size_t(i) * dtype_size(m.scale_dtype), 1, &s);
    return s;
}

// The zero point of (group, row), with the checkpoint's offset added.
int zero_at(const PackedLinear& m, int64_t group, int64_t row) {
    if (m.method == QuantMethod::CompressedTensors) return m.zero_offset;
    if (m.method == QuantMethod::Awq)
        return int((word(m.qzeros, group * (m.rows / 8) + row / 8) >> (4 * kAwqPosition[row % 8])) & 15u);
    const int per = 32 / m.bits;
    const uint32_t mask = (1u << m.bits) - 1;
    return int((word(m.qzeros, group * (m.rows / per) + row / per) >> (m.bits * (row % per))) & mask) + m.zero_offset;
}

// Rows are unpacked in tiles: AWQ's eight rows of a column share a word and GPTQ's rows of a
// word-row lie side by side, so a tile reads runs of qweight block after block, and writes its
// rows a byte at a time. 16 rows: a Qwen3-1.7B-shaped AWQ checkpoint loaded in 1.0-1.1 s here
// (2 cores; 32 rows the same, 64 rows 2.3-3.0 s, 8 rows 1.3-1.8 s).
constexpr int64_t kTileRows = 16;

}  // namespace

PackedShapes packed_shapes(QuantMethod method, int bits, int64_t rows, int64_t cols, int64_t group) {
    const int64_t groups = cols / group;
    if (method == QuantMethod::Awq) return {{cols, rows / 8}, {groups, rows / 8}, {groups, rows}};
    if (method == QuantMethod::CompressedTensors) return {{rows, bits == 8 ? cols : cols / 8}, {0, 0}, {rows, groups}};
    const int64_t per = 32 / bits;
    return {{cols / per, rows}, {groups, rows / per}, {groups, rows}};
}

void unpack_int4(const PackedLinear& m, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, int64_t g,
                 uint8_t* codes, float* scales, float* mins) {
    SHARDLM_CHECK(m.bits == 4 && g > 0 && m.group % g == 0 && col0 % g == 0 && ncols % g == 0 && g % 32 == 0,
                  "unpack_int4: group ", g, " of a block at column ", col0, " (", ncols, " wide) of a layer grouped by ",
                  m.group);
    SHARDLM_CHECK(m.method != QuantMethod::Awq || (row0 % 8 == 0 && nrows % 8 == 0),
                  "unpack_int4: AWQ rows ", row0, " + ", nrows, " split a word of eight");
    const int64_t half = ncols / 2, vg = ncols / g;
    // Each output byte is written once: columns c and c + 16 of a 32-column block (weights_view.h).
    auto nib = [](uint32_t w, int at) { return (w >> (4 * at)) & 15u; };
#pragma omp parallel for schedule(static)
    for (int64_t t0 = 0; t0 < nrows; t0 += kTileRows) {
        const int64_t t1 = std::min(nrows, t0 + kTileRows);
        for (int64_t b = 0; b < ncols / 32; ++b) {
            const int64_t c = col0 + 32 * b;
            if (m.method == QuantMethod::Awq) {
                for (int i = 0; i < 16; ++i) {
                    const uint8_t* lo = m.qweight + 4 * (c + i) * (m.rows / 8);
                    const uint8_t* hi = m.qweight + 4 * (c + i + 16) * (m.rows / 8);
                    for (int64_t r = t0; r < t1; r += 8) {
                        const uint32_t wl = word(lo, (row0 + r) / 8), wh = word(hi, (row0 + r) / 8);
                        for (int k = 0; k < 8; ++k)
                            codes[(r + k) * half + 16 * b + i] =
                                uint8_t(nib(wl, kAwqPosition[k]) | nib(wh, kAwqPosition[k]) << 4);
                    }
                }
            } else {  // words c/8 .. c/8 + 3 of each row hold the block's columns 0-7, 8-15, 16-23, 24-31
                // GPTQ: word (i, R) at i * rows + R; compressed-tensors: at R * cols / 8 + i.
                const bool ct = m.method == QuantMethod::CompressedTensors;
                const int64_t step = ct ? 1 : m.rows;
                for (int64_t r = t0; r < t1; ++r) {
                    const int64_t R = row0 + r, at = ct ? R * (m.cols / 8) + c / 8 : (c / 8) * m.rows + R;
                    const uint32_t w0 = word(m.qweight, at), w1 = word(m.qweight, at + step),
                                   w2 = word(m.qweight, at + 2 * step), w3 = word(m.qweight, at + 3 * step);
                    uint8_t* out = codes + r * half + 16 * b;
                    for (int k = 0; k < 8; ++k) {
                        out[k] = uint8_t(nib(w0, k) | nib(w2, k) << 4);
                        out[8 + k] = uint8_t(nib(w1, k) | nib(w3, k) << 4);
                    }
                }
            }
        }
        for (int64_t r = t0; r < t1; ++r)
            for (int64_t k = 0; k < vg; ++k) {
                const int64_t src = (col0 + k * g) / m.group;
                const float s = scale_at(m, src, row0 + r);
                scales[r * vg + k] = s;
                mins[r * vg + k] = -float(zero_at(m, src, row0 + r)) * s;
            }
    }
}

void unpack_int8(const PackedLinear& m, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, int64_t g,
                 int8_t* q, float* scales, const std::string& name) {
    SHARDLM_CHECK(m.bits == 8 && m.method != QuantMethod::Awq && g > 0 && ncols % g == 0 && col0 % g == 0 &&
                      (g == ncols || m.group % g == 0),
                  "unpack_int8: group ", g, " of a block at column ", col0, " (", ncols, " wide)");
    const int64_t vg = ncols / g;
    if (m.method == QuantMethod::CompressedTensors) {  // int8 as it is: copy the block's rows
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < nrows; ++r) {
            std::memcpy(q + r * ncols, m.qweight + (row0 + r) * m.cols + col0, size_t(ncols));
            for (int64_t k = 0; k < vg; ++k) scales[r * vg + k] = scale_at(m, (col0 + k * g) / m.group, row0 + r);
        }
        return;
    }
    // The zero points first: a layer that is not symmetric is refused before anything is written.
    for (int64_t r = 0; r < nrows; ++r)
        for (int64_t src = col0 / m.group; src <= (col0 + ncols - 1) / m.group; ++src)
            if (zero_at(m, src, row0 + r) != 128)
                fail(name, ": zero point ", zero_at(m, src, row0 + r), " of row ", row0 + r, " and group ", src,
                     " is not 128 (asymmetric 8-bit GPTQ has no INT8 form here; quantize the float checkpoint with "
                     "shardlm quantize instead)");
#pragma omp parallel for schedule(static)
    for (int64_t t0 = 0; t0 < nrows; t0 += kTileRows) {
        const int64_t t1 = std::min(nrows, t0 + kTileRows);
        for (int64_t c = 0; c < ncols; ++c) {
            const int64_t sc = col0 + c;
            const uint8_t* line = m.qweight + 4 * (sc / 4) * m.rows;
            const int shift = 8 * int(sc % 4);
            for (int64_t r = t0; r < t1; ++r)
                q[r * ncols + c] = int8_t(int((word(line, row0 + r) >> shift) & 255u) - 128);
        }
        for (int64_t r = t0; r < t1; ++r)
            for (int64_t k = 0; k < vg; ++k) scales[r * vg + k] = scale_at(m, (col0 + k * g) / m.group, row0 + r);
    }
}

std::vector<int32_t> act_order(const uint8_t* g_idx, int64_t cols, int64_t group, const std::string& name) {
    const int64_t groups = cols / group;
    bool in_order = true;
    std::vector<int64_t> count(size_t(groups), 0);
    for (int64_t c = 0; c < cols; ++c) {
        const int64_t g = int64_t(int32_t(word(g_idx, c)));
        if (g < 0 || g >= groups) fail(name, ": column ", c, " is in group ", g, ", outside 0..", groups - 1);
        in_order = in_order && g == c / group;
        ++count[size_t(g)];
    }
    if (in_order) return {};
    for (int64_t g = 0; g < groups; ++g)
        if (count[size_t(g)] != group)
            fail(name, ": group ", g, " holds ", count[size_t(g)], " columns, not the group size ", group,
                 " (act-order with static groups of another size is not supported)");
    // A counting sort: each group's columns in their column order.
    std::vector<int64_t> next(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g) next[size_t(g)] = g * group;
    std::vector<int32_t> order(static_cast<size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) order[size_t(next[size_t(int32_t(word(g_idx, c)))]++)] = int32_t(c);
    return order;
}

std::vector<uint8_t> reorder_codes(const PackedLinear& m, const int32_t* order) {
    SHARDLM_CHECK(m.method != QuantMethod::Awq, "reorder_codes: AWQ has no act-order");
    const bool ct = m.method == QuantMethod::CompressedTensors;
    if (ct && m.bits == 8) {  // int8 [rows, cols]: a gather of each row
        std::vector<uint8_t> out(size_t(m.rows * m.cols));
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < m.rows; ++r)
            for (int64_t j = 0; j < m.cols; ++j) out[size_t(r * m.cols + j)] = m.qweight[r * m.cols + order[j]];
        return out;
    }
    const int bits = m.bits, per = 32 / bits;
    const uint32_t mask = (1u << bits) - 1;
    const int64_t words_per_row = m.cols / per;
    std::vector<uint8_t> out(size_t(m.rows * words_per_row) * 4);
    if (ct) {  // weight_packed [rows, cols / 8]: word (r, i) holds columns 8i + k of row r
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < m.rows; ++r)
            for (int64_t i = 0; i < words_per_row; ++i) {
                uint32_t w = 0;
                for (int k = 0; k < per; ++k) {
                    const int64_t c = order[i * per + k];
                    w |= ((word(m.qweight, r * words_per_row + c / per) >> (bits * (c % per))) & mask) << (bits * k);
                }
                std::memcpy(&out[size_t(r * words_per_row + i) * 4], &w, 4);
            }
        return out;
    }
    // GPTQ's qweight [cols / per, rows]: word (i, r) holds columns per*i + k of row r. Each new
    // word-row takes its columns from `per` source word-rows, read along the rows.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < words_per_row; ++i) {
        uint8_t* line = &out[size_t(i * m.rows) * 4];
        for (int k = 0; k < per; ++k) {
            const int64_t c = order[i * per + k];
            const uint8_t* src = m.qweight + 4 * (c / per) * m.rows;
            const int shift = bits * int(c % per);
            for (int64_t r = 0; r < m.rows; ++r) {
                uint32_t w = k == 0 ? 0 : word(line, r);
                w |= ((word(src, r) >> shift) & mask) << (bits * k);
                std::memcpy(line + 4 * r, &w, 4);
            }
        }
    }
    return out;
}

}  // namespace shardlm
