// The in-process communicator: N ranks in one process, each driven from its own thread, sharing
// host buffers directly. Used by the multi-rank tests and to run several ranks on one machine
// without MPI. Results are bit-identical on every rank (sums are taken in rank order 0..N-1).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace tpdraft::parallel {

// n communicators of one group; element r is rank r and must be used from one thread at a time.
// A collective waits for all n ranks; abort() from any of them (or a rank that has left the
// group, see run_ranks) makes every waiting and later collective throw tpdraft::Error naming
// both ranks. Mismatched calls (different operations, sizes or roots) throw on every rank.
std::vector<std::unique_ptr<Communicator>> make_thread_group(int n);

// Runs fn on n threads, thread r with rank r of a fresh group, and joins them. When fn throws on
// a rank the group is aborted (so no peer hangs in a collective) and, after all threads have
// joined, the first failure is rethrown as tpdraft::Error("rank R: <what>").
void run_ranks(int n, const std::function<void(Communicator&)>& fn);

}  // namespace tpdraft::parallel
