// Failing together. A phase that every rank runs (parse, load, check) is wrapped in run_together:
// if it throws on any rank, every rank throws the same Error naming the lowest failing rank, so
// the job ends with one clear message and no rank is left waiting in a collective.
// Failures inside the lock-step forward pass cannot be agreed on this way (the other ranks are
// blocked in an all-reduce); those end the job with Communicator::abort.
#pragma once

#include <functional>
#include <string>

#include "comm/communicator.h"
#include "core/error.h"

namespace shardlm {

// An error every rank holds (thrown by run_together); printed once, by rank 0.
struct AgreedError : Error {
    using Error::Error;
};

void run_together(Communicator& comm, const std::function<void()>& phase);

// Throws unless every rank passes the same `value` (e.g. a hash of model, flags and build);
// `what` names it in the error.
void check_same_on_all_ranks(Communicator& comm, const std::string& value, const std::string& what);
// The lowest rank whose `value` differs from rank 0's, or -1 when all ranks pass the same
// (a collective: every rank calls it).
int first_differing_rank(Communicator& comm, const std::string& value);

// Test hook: SHARDLM_FAIL_RANK=r and SHARDLM_FAIL_PHASE=p make rank r throw at phase p
// ("load", "generate", ...). Does nothing unless both are set and match.
void maybe_inject_failure(const Communicator& comm, const char* phase);

}  // namespace shardlm
