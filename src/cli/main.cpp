// The shardlm executable: subcommand dispatch, --version, and the one place errors are printed.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "comm/communicator.h"
#include "comm/together.h"
#include "core/error.h"
#include "kernels/cpu/matmul.h"

#ifndef SHARDLM_VERSION
#define SHARDLM_VERSION "0.0.0"
#endif
#include "git_commit.h"  // SHARDLM_GIT_COMMIT, generated at build time

namespace {

const char* kUsage =
    "usage: shardlm SUBCOMMAND [flags]   (shardlm SUBCOMMAND --help for its flags)\n"
    "\n"
    "subcommands:\n"
    "  generate     generate tokens from prompts (under mpirun -np N: tensor parallel over N ranks)\n"
    "  chat         a conversation in the model's chat template, one user turn per stdin line\n"
    "  serve        an OpenAI-compatible HTTP server with continuous batching\n"
    "  info         describe a checkpoint: shapes, parameters, bytes (per rank with --tp N)\n"
    "  perplexity   teacher-forced perplexity of a token file; compare two precisions\n"
    "  embed        text embeddings (pooled final hidden states) of inputs\n"
    "  classify     class probabilities, or reranking scores with --query (sequence classifiers)\n"
    "  bench        prefill/decode timings and achieved bandwidth\n"
    "  quantize     write a pre-quantized INT8 checkpoint\n"
    "  make-model   write a random-weight checkpoint of a built-in shape\n"
    "  tokenize     text -> token ids with the model's tokenizer.json\n"
    "\n"
    "  --version    version, git commit and compiled-in backends\n";

std::string backends() {
    std::string b = std::string("cpu(") + shardlm::matmul_isa() + ")";
#ifdef SHARDLM_CUDA_ARCHS
    b += " cuda(" SHARDLM_CUDA_ARCHS ")";
#endif
#ifdef SHARDLM_HAVE_MPI
    b += " mpi";
#endif
    return b;
}

std::string one_line(std::string msg) {
    for (char& ch : msg)
        if (ch == '\n') ch = ' ';
    return msg;
}

int dispatch(const std::string& cmd, const std::vector<std::string>& args, shardlm::Communicator& comm) {
    if (cmd == "generate") return shardlm::cmd_generate(args, comm);
    if (cmd == "chat") return shardlm::cmd_chat(args, comm);
    if (cmd == "serve") return shardlm::cmd_serve(args, comm);
    if (cmd == "bench") return shardlm::cmd_bench(args, comm);
    if (cmd == "perplexity") return shardlm::cmd_perplexity(args, comm);
    if (cmd == "embed") return shardlm::cmd_embed(args, comm);
    if (cmd == "classify") return shardlm::cmd_classify(args, comm);
    // Every rank sees the same command line, so these errors are the same on every rank.
    using shardlm::AgreedError;
    using shardlm::cat;
    if (cmd != "info" && cmd != "make-model" && cmd != "quantize" && cmd != "tokenize")
        throw AgreedError(cat("unknown subcommand \"", cmd, "\" (shardlm --help lists them)"));
    if (comm.size() > 1) throw AgreedError(cat("\"", cmd, "\" runs on a single rank; start it without mpirun"));
    if (cmd == "info") return shardlm::cmd_info(args);
    if (cmd == "quantize") return shardlm::cmd_quantize(args);
    if (cmd == "tokenize") return shardlm::cmd_tokenize(args);
    return shardlm::cmd_make_model(args);
}

// The error line in one write: under mpirun a rank's stderr is forwarded in the pieces it was
// written in, and mpirun's MPI_ABORT banner landed between them (Cli.FailingRankEndsTheJob, 1 in ~12).
void print_error(const std::string& what) {
    const std::string line = "shardlm: error: " + what + "\n";
    std::cerr << line << std::flush;
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
    std::unique_ptr<shardlm::Communicator> comm;
    try {
        comm = shardlm::make_communicator(&argc, &argv);
    } catch (const std::exception& e) {
        print_error(one_line(e.what()));
        return 1;
    }
    const std::string cmd = args[0];
    args.erase(args.begin());
    try {
        return dispatch(cmd, args, *comm);
    } catch (const shardlm::AgreedError& e) {
        // Every rank holds this error; one line from rank 0, then all ranks exit normally.
        if (comm->rank() == 0) print_error(one_line(e.what()));
        return 1;
    } catch (const std::exception& e) {
        const std::string what = dynamic_cast<const std::bad_alloc*>(&e) ? "out of memory" : e.what();
        if (comm->size() == 1) {
            print_error(one_line(what));
            return 1;
        }
        // Only this rank failed, possibly while the others wait in a collective: end the job.
        print_error(shardlm::cat("rank ", comm->rank(), ": ", one_line(what)));
        comm->abort(1);
    }
}
