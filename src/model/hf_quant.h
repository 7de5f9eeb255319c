// Hugging Face's pre-quantized Linear layers, AutoAWQ's GEMM packing and AutoGPTQ/GPTQModel's,
// unpacked into the engine's INT4 and INT8 layouts (kernels/cpu/weights_view.h) exactly. Both
// tools store W[r, c] = (q - z) * s: an integer code q, and per output row r and group of input
// columns an integer zero point z and a 16-bit scale s. INT4's q * scale + min holds that with
// min = -z * s (exact in f32: s has at most 11 significant bits, z at most 16), and INT8's q * scale
// with the code q - 128 when z is 128 (symmetric 8-bit GPTQ; another zero point is refused).
//
// AWQ (4 bits): qweight i32 [in, out / 8]; word (c, j) holds rows 8j .. 8j + 7 of column c, row
//   8j + i at bits 4 * kAwqPosition[i] (AutoAWQ interleaves the eight for its GEMM kernel); qzeros
//   i32 [in / group, out / 8] the same way; scales [in / group, out].
// GPTQ (b = 4 or 8 bits, p = 32 / b codes a word): qweight i32 [in / p, out]; word (i, r) holds
//   columns p*i .. p*i + p - 1 of row r, column p*i + k at bits b*k; qzeros i32 [groups, out / p],
//   word (g, j) holding rows p*j + k at bits b*k, each stored as z - zero_offset (AutoGPTQ's
//   format subtracts 1); scales [groups, out]; g_idx i32 [in], the group of each column: c / group,
//   or under act-order (desc_act) an order of the tool's own (see act_order).
// compressed-tensors (llm-compressor; symmetric only): 4 bits ("pack-quantized") as weight_packed
//   i32 [out, in / 8], word (r, i) holding columns 8i + k of row r at bits 4k, each the signed
//   value plus 8 (so z = 8); 8 bits ("int-quantized") as weight i8 [out, in], z = 0; weight_scale
//   [out, in / group] (one column per channel, or a single value for the whole tensor).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace shardlm {

// Where AWQ's word keeps row 8j + i: its nibble kAwqPosition[i] (bits 4 * that).
constexpr int kAwqPosition[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// One packed Linear layer [rows = out, cols = in] as the checkpoint holds it.
struct PackedLinear {
    QuantMethod method = QuantMethod::Awq;
    int bits = 4;
    int64_t rows = 0, cols = 0;
    int64_t group = 0;  // input columns per scale (cols: one per output channel)
    bool per_tensor = false;  // compressed-tensors' strategy "tensor": one scale
    int zero_offset = 0;
    const uint8_t* qweight = nullptr;  // little-endian int32 words (compressed-tensors' 8 bits: int8), any alignment
    const uint8_t* qzeros = nullptr;   // AWQ and GPTQ only
    DType scale_dtype = DType::F16;    // F16, BF16 or F32
    const uint8_t* scales = nullptr;
};

// The shapes the checkpoint's tensors must have for a layer [rows, cols] ({rows, cols} order of
// the tensor, as safetensors lists it; compressed-tensors has no qzeros).
struct PackedShapes {
    int64_t qweight[2], qzeros[2], scales[2];
};
PackedShapes packed_shapes(QuantMethod method, int bits, int64_t rows, int64_t cols, int64_t group);

// Rows [row0, row0 + nrows) and columns [col0, col0 + ncols) into the INT4 layout with groups of
// `g` columns (g divides m.group; col0 and ncols are multiples of g): codes [nrows, ncols / 2],
// scales and mins [nrows, ncols / g]. Threaded over rows.
void unpack_int4(const PackedLinear& m, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, int64_t g,
                 uint8_t* codes, float* scales, float* mins);

// The same block of an 8-bit GPTQ or compressed-tensors layer into INT8 with groups of g columns (m.group, or ncols for
// one scale per row): q [nrows, ncols], scales [nrows, ncols / g]. Throws Error naming `name`
// when a zero point of the block is not 128 (asymmetric 8-bit has no INT8 form here).
void unpack_int8(const PackedLinear& m, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, int64_t g,
                 int8_t* q, float* scales, const std::string& name);

// Act-order (GPTQ's desc_act, compressed-tensors' actorder "group"): the tool quantized the input
// columns in an order of its own (the Hessian's diagonal, largest first), and g_idx (i32 [cols])
// gives each column's group, `group` columns to a group. Returns the columns sorted by group
// (stably): order[j] is the input column that goes to position j, so that the reordered layer's
// columns run in groups of `group` as the unpackers want, and reading its input x[order[j]] gives
// the layer's product. Empty when g_idx is c / group already. Throws Error naming `name` when a
// group index is out of range or a group does not hold exactly `group` columns.
std::vector<int32_t> act_order(const uint8_t* g_idx, int64_t cols, int64_t group, const std::string& name);

// m's codes (qweight; compressed-tensors' weight_packed, or its I8 weight) with the input columns
// moved into `order` (act_order's), packed as m packs them: point m.qweight at the result, and
// the scales and zero points, already one per group, read as they are. Threaded.
std::vector<uint8_t> reorder_codes(const PackedLinear& m, const int32_t* order);

}  // namespace shardlm
