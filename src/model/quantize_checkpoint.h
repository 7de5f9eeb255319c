// `shardlm quantize`: a pre-quantized copy of a checkpoint that loads without re-quantizing.
// Layout (see README "Pre-quantized checkpoints"): every quantized Linear tensor NAME becomes
//   NAME        I8  [out, in]
//   NAME_scale  F32 [out, in / group_size]   (one column when per output channel)
// with W = NAME * NAME_scale per group, or under int4 (the layers' matrices)
//   NAME        U8  [out, in / 2]            (packed as kernels/cpu/weights_view.h describes)
//   NAME_scale  F32 [out, in / group_size]
//   NAME_min    F32 [out, in / group_size]   (W = code * scale + min)
// and the int4 vocabulary matrix as INT8 with one scale per row. Every other tensor (norms,
// biases, an untied embedding, --keep-fp16 matches) is copied unchanged. config.json gains
//   "quantization_config": {"quant_method": "shardlm", "format": "int8"|"w8a8"|"int4"|"w4a8", "group_size": G,
//                           "keep_fp16": REGEX}
// and the loader takes a float Linear tensor only where REGEX matches it.
// Tensor data starts on 128-byte boundaries so every rank maps its slices without copies.
#pragma once

#include <string>

#include "model/weights.h"

namespace shardlm {

// The checks write_quantized_checkpoint makes before it loads anything (throws Error): a quantized
// --weights format, a float source, and an out_dir that holds no checkpoint (out_dir = src_dir
// included) and can be created or written into (core/mmap_file.h unwritable_reason; nothing is
// created). shardlm quantize runs them before an AWQ calibration (--calib) too.
void check_quantize(const std::string& src_dir, const std::string& out_dir, const LoadOptions& opt);

// Quantizes exactly as loading with `opt` does (the same code), then writes out_dir with about
// `shard_bytes` per safetensors file. Tokenizer and other side files are copied.
void write_quantized_checkpoint(const std::string& src_dir, const std::string& out_dir, const LoadOptions& opt,
                                size_t shard_bytes = size_t(2) << 30);

}  // namespace shardlm
