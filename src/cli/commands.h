// The shardlm subcommands. Each takes the arguments after its name and returns the exit code;
// errors are thrown as shardlm::Error and printed by main. Errors that every rank agreed on
// (comm/together.h) are printed once, by rank 0.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"

namespace shardlm {

using Args = std::vector<std::string>;

// Under mpirun every rank runs the same subcommand with the same arguments; only rank 0 prints.
int cmd_generate(const Args& args, Communicator& comm);
int cmd_chat(const Args& args, Communicator& comm);
int cmd_serve(const Args& args, Communicator& comm);
int cmd_info(const Args& args);
int cmd_bench(const Args& args, Communicator& comm);
int cmd_make_model(const Args& args);
int cmd_quantize(const Args& args);
int cmd_perplexity(const Args& args, Communicator& comm);
int cmd_embed(const Args& args, Communicator& comm);
int cmd_classify(const Args& args, Communicator& comm);
// --classifier-tokens' list ("no,yes") as (token, id) pairs of the model's tokenizer (empty list:
// none); throws Error naming the flag for a token the vocabulary lacks or fewer than two.
std::vector<std::pair<std::string, int32_t>> classifier_tokens(const std::string& model, const std::string& list);
int cmd_tokenize(const Args& args);

}  // namespace shardlm
