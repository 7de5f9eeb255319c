// Activation-aware scaling for INT4 weights (AWQ, Lin et al. 2023), as `shardlm quantize --weights
// int4 --calib FILE` runs it.
//
// A few input channels of each Linear layer carry much larger activations than the rest; the
// weights that multiply them matter most, and group-wise 4-bit rounding treats them like any
// other. AWQ multiplies those columns by s > 1 before quantizing (finer relative steps for them)
// and divides the layer's input by s, folded into the op that produces it: the RMSNorm weight
// before q/k/v and before gate/up, the rows of up_proj before down_proj, and the rows of v_proj
// before o_proj when every query head has its own KV head (with GQA a v row feeds several o
// columns, which would need one shared scale; that group is left unscaled, as AWQ does).
//
// s = mean|x|^alpha per channel over calibration activations of the float model, normalised so
// that max(s) * min(s) = 1, with alpha from a grid chosen per group to minimise
// sum over the group's matrices of ||X W^T - X (Q(W diag(s)) diag(s)^-1)^T||^2 on the calibration
// rows X. alpha = 0 is s = 1, plain round-to-nearest, so the chosen scales never do worse on that
// loss than no scaling. Then AWQ's clipping search: per row and group of the scaled weights, the
// clamp (1 .. 0.55 of the group's max |w|) whose 4-bit error costs the least output error on the
// calibration inputs, exactly e^T G e with G the Gram matrix of all calibration inputs over the
// group's columns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/weights.h"

namespace shardlm {

struct AwqOptions {
    int64_t group_size = kInt4DefaultGroup;  // of the INT4 quantization the scales are searched for
    std::string keep_fp16;                   // groups with a matrix kept in 16 bits are not scaled
    int grid = 20;                           // alpha in {0, 1/grid, ..., (grid - 1)/grid}
    int64_t ctx = 256;                       // calibration tokens per forward window
    int64_t max_loss_rows = 512;             // calibration rows the scale search's loss is measured on
    bool clip = true;                        // also search the clipping (ChannelScales::clip)
    std::vector<LoraAdapter> lora;           // merged into the float model calibrated on (LoadOptions::lora)
};

// One scaled group of one layer: which, the alpha chosen and the loss with it and without scaling.
struct AwqGroup {
    int64_t layer = 0;
    std::string which;  // "qkv", "o", "gate_up", "down"
    float alpha = 0;
    double loss_rtn = 0, loss = 0;
    // The output error of the scaled weights before and after the clipping search (its own sum
    // over the groups of columns, so without the cross-group terms of `loss`).
    double clip_before = 0, clip_after = 0;
};

// Runs the float model of `model_dir` (CPU, FP32, one rank) over `calib` tokens and returns the
// scales to load it with (LoadOptions::scales). `report` (optional) gets one entry per group.
ChannelScales awq_scales(const std::string& model_dir, const std::vector<int32_t>& calib, const AwqOptions& opt,
                         std::vector<AwqGroup>* report = nullptr);

}  // namespace shardlm
