// The shardlm executable: subcommand dispatch, --version, and the one place errors are printed.
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "kernels/cpu/matmul.h"

#ifndef SHARDLM_VERSION
#define SHARDLM_VERSION "0.0.0"
#endif
#ifndef SHARDLM_GIT_COMMIT
#define SHARDLM_GIT_COMMIT "unknown"
#endif

namespace {

const char* kUsage =
    "usage: shardlm SUBCOMMAND [flags]   (shardlm SUBCOMMAND --help for its flags)\n"
    "\n"
    "subcommands:\n"
    "  generate     generate tokens from prompts\n"
    "  info         describe a checkpoint: shapes, parameters, bytes\n"
    "  bench        prefill/decode timings and achieved bandwidth\n"
    "  make-model   write a random-weight checkpoint of a built-in shape\n"
    "\n"
    "  --version    version, git commit and compiled-in backends\n";

std::string backends() {
    std::string b = std::string("cpu(") + shardlm::matmul_isa() + ")";
#ifdef SHARDLM_CUDA_ARCHS
    b += " cuda(" SHARDLM_CUDA_ARCHS ")";
#endif
    return b;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
        std::cout << kUsage;
        return args.empty() ? 2 : 0;
    }
    if (args[0] == "--version") {
        std::cout << "shardlm " << SHARDLM_VERSION << " (commit " << SHARDLM_GIT_COMMIT << ")\n"
                  << "backends: " << backends() << "\n";
        return 0;
    }
    const std::string cmd = args[0];
    args.erase(args.begin());
    try {
        if (cmd == "generate") return shardlm::cmd_generate(args);
        if (cmd == "info") return shardlm::cmd_info(args);
        if (cmd == "bench") return shardlm::cmd_bench(args);
        if (cmd == "make-model") return shardlm::cmd_make_model(args);
        std::cerr << "shardlm: error: unknown subcommand \"" << cmd << "\" (shardlm --help lists them)\n";
        return 2;
    } catch (const std::bad_alloc&) {
        std::cerr << "shardlm: error: out of memory\n";
    } catch (const std::exception& e) {
        std::string msg = e.what();
        for (char& ch : msg)
            if (ch == '\n') ch = ' ';  // one line, always
        std::cerr << "shardlm: error: " << msg << "\n";
    }
    return 1;
}
