// shardlm quantize: writes a pre-quantized checkpoint (layout in model/quantize_checkpoint.h);
// with --calib, INT4 weights get AWQ's activation-aware channel scales first (runtime/awq.h).
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "model/quantize_checkpoint.h"
#include "runtime/awq.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

int cmd_quantize(const Args& args) {
    po::options_description d("quantize options");
    std::string model, out, weights, keep, calib;
    std::vector<std::string> lora;
    std::vector<float> lora_scale;
    int64_t group = 0, calib_tokens = 0;
    d.add_options()
        ("help", "show this help")
        ("model", po::value(&model)->required(), "source checkpoint folder (F32/F16/BF16)")
        ("out", po::value(&out)->required(), "output folder (new or empty)")
        ("weights", po::value(&weights)->default_value("int8"), "int8|w8a8|int4|w4a8")
        ("group-size", po::value(&group)->default_value(0), "scale per group of G inputs (0: per output channel for int8/w8a8, 128 for int4/w4a8)")
        ("keep-fp16", po::value(&keep), "keep Linear tensors whose HF name matches this regex unquantized")
        ("calib", po::value(&calib), "int4/w4a8: a text file to calibrate AWQ's activation-aware channel scales on")
        ("calib-tokens", po::value(&calib_tokens)->default_value(8192), "int4/w4a8: calibration tokens read from --calib")
        ("lora", po::value(&lora)->composing(),
         "DIR: merge this LoRA adapter (PEFT's folder) into the weights before quantizing (repeatable)")
        ("lora-scale", po::value(&lora_scale)->composing(), "S: the adapter's weight (default 1; one for all, or one per --lora)");
    po::variables_map vm;
    if (!parse_args(args, d, vm,
                    "usage: shardlm quantize --model DIR --out DIR [--weights int8|w8a8|int4|w4a8] [--group-size G] "
                    "[--calib FILE] [--lora DIR]"))
        return 0;
    LoadOptions lo;
    lo.format = parse_weight_format(weights);
    lo.group_size = group;
    lo.keep_fp16 = keep;
    lo.lora = lora_adapters(lora, lora_scale);
    check_quantize(model, out, lo);  // before the calibration below, and the load that writes
    if (!calib.empty()) {
        if (!is_int4(lo.format)) fail("--calib: AWQ channel scales are searched for --weights int4 or w4a8");
        if (calib_tokens < 1) fail("--calib-tokens must be at least 1");
        std::vector<int32_t> ids = Tokenizer::load(model).encode(read_text_file(calib));
        if (ids.size() < 2) fail(calib, ": fewer than 2 tokens to calibrate on");
        if (int64_t(ids.size()) > calib_tokens) ids.resize(size_t(calib_tokens));
        AwqOptions ao;
        ao.group_size = group > 0 ? group : kInt4DefaultGroup;
        ao.keep_fp16 = keep;
        ao.lora = lo.lora;  // the scales are searched on the merged model
        std::vector<AwqGroup> report;
        lo.scales = awq_scales(model, ids, ao, &report);
        double rtn = 0, awq = 0, cb = 0, ca = 0;
        size_t scaled = 0;
        for (const AwqGroup& g : report)
            rtn += g.loss_rtn, awq += g.loss, cb += g.clip_before, ca += g.clip_after, scaled += g.alpha > 0 ? 1 : 0;
        std::fprintf(stderr,
                     "awq: %zu calibration tokens; %zu of %zu groups scaled; output error of the layers' products %.1f%% "
                     "of round-to-nearest's, then clipping %.1f%% of that\n",
                     ids.size(), scaled, report.size(), rtn > 0 ? 100.0 * awq / rtn : 100.0, cb > 0 ? 100.0 * ca / cb : 100.0);
    }
    write_quantized_checkpoint(model, out, lo);
    std::cerr << "wrote " << weights << " checkpoint to " << out << "\n";
    return 0;
}

}  // namespace shardlm
