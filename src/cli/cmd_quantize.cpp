// shardlm quantize: writes a pre-quantized checkpoint (layout in model/quantize_checkpoint.h).
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "model/quantize_checkpoint.h"

namespace shardlm {

int cmd_quantize(const Args& args) {
    po::options_description d("quantize options");
    std::string model, out, weights, keep;
    int64_t group = 0;
    d.add_options()
        ("help", "show this help")
        ("model", po::value(&model)->required(), "source checkpoint folder (F32/F16/BF16)")
        ("out", po::value(&out)->required(), "output folder (new or empty)")
        ("weights", po::value(&weights)->default_value("int8"), "int8|w8a8|int4")
        ("group-size", po::value(&group)->default_value(0), "scale per group of G inputs (0: per output channel for int8/w8a8, 128 for int4)")
        ("keep-fp16", po::value(&keep), "keep Linear tensors whose HF name matches this regex unquantized");
    po::variables_map vm;
    if (!parse_args(args, d, vm, "usage: shardlm quantize --model DIR --out DIR [--weights int8|w8a8|int4] [--group-size G]"))
        return 0;
    LoadOptions lo;
    lo.format = parse_weight_format(weights);
    lo.group_size = group;
    lo.keep_fp16 = keep;
    write_quantized_checkpoint(model, out, lo);
    std::cerr << "wrote " << weights << " checkpoint to " << out << "\n";
    return 0;
}

}  // namespace shardlm
