// The flags and setup shared by the commands that pool each input into numbers instead of
// generating text: shardlm embed and shardlm classify.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/options.h"
#include "runtime/session.h"
#include "tokenizer/prompts.h"

namespace shardlm {

// --prompt TEXT (repeatable), --prompt-file F (a text per line), --prompt-ids "1,2;3"; and the
// step shape: --ctx (0: the longest input), --batch (0: every input, at most 16), --prefill-chunk.
struct PoolingFlags {
    std::vector<std::string> texts;
    std::string ids;
    int64_t ctx = 0, batch = 0, chunk = 256;
};
void add_pooling_options(po::options_description& d, PoolingFlags& f);
// Exactly one input source, and the step flags in range (throws Error naming the flags).
void check_pooling_flags(const po::variables_map& vm, const PoolingFlags& f);
// The text inputs, --prompt's or --prompt-file's lines (none for --prompt-ids), and the model's
// tokenizer for them (throws Error when the folder has none).
std::vector<TextPrompt> text_inputs(const po::variables_map& vm, const PoolingFlags& f);
Tokenizer input_tokenizer(const std::string& model);
// The session for these inputs: as many slots as --batch says, a context of the longest input
// unless --ctx, the precision and backend flags; the model may have no lm_head
// (LoadOptions::headless_ok).
SessionOptions pooling_session(const std::string& model, const PoolingFlags& f, const PrecisionFlags& prec,
                               const BackendFlags& backend, const std::vector<std::vector<int32_t>>& inputs);

}  // namespace shardlm
