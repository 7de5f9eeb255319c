// The shardlm subcommands. Each takes the arguments after its name and returns the exit code;
// errors are thrown as shardlm::Error and printed by main.
#pragma once

#include <string>
#include <vector>

namespace shardlm {

using Args = std::vector<std::string>;

int cmd_generate(const Args& args);
int cmd_info(const Args& args);
int cmd_bench(const Args& args);
int cmd_make_model(const Args& args);

}  // namespace shardlm
