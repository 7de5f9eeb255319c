// One error family for the whole runtime. Library code never exits: it throws shardlm::Error and
// the CLI prints it as a single "shardlm: error: ..." line with a non-zero exit code.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace shardlm {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Concatenates any streamable values into one string: cat("tensor ", name, " has ", n, " dims").
template <typename... Args>
std::string cat(Args&&... args) {
    std::ostringstream os;
    (os << ... << std::forward<Args>(args));
    return os.str();
}

// Input errors: a clear message for the user (file, tensor, flag named by the caller).
template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
    throw Error(cat(std::forward<Args>(args)...));
}

// Called by the check macros. The rank is added by whoever catches the error (the CLI knows it),
// so library code needs no global state.
[[noreturn]] void check_failed(const char* what, const char* stmt, const char* file, int line,
                               const std::string& detail);

}  // namespace shardlm

// Internal invariants: reports the failing statement and file:line. Never compiled out.
// The optional detail must begin with a string literal: SHARDLM_CHECK(n < cap, "n ", n, " > ", cap).
#define SHARDLM_CHECK_GEN(what, ok, stmt, detail) \
    do {                                                                                 \
        if (!(ok)) ::shardlm::check_failed(what, stmt, __FILE__, __LINE__, detail);      \
    } while (0)

#define SHARDLM_CHECK(cond, ...) \
    SHARDLM_CHECK_GEN("check", (cond), #cond, ::shardlm::cat("" __VA_ARGS__))
