// Per-rank checks of a communicator's collectives on exactly representable inputs, value by
// value, run by every rank of a group: the in-process tests call them inside run_ranks, the MPI
// tests on MPI_COMM_WORLD. EXPECTs only, so that a failing rank still takes part in the
// collectives its peers wait in.
#pragma once

#include <string>

namespace tpdraft::parallel {
class Communicator;
}

namespace tpdraft::testing {

// all_reduce_sum of signed integers at several lengths, 0 included.
void check_all_reduce_exact(parallel::Communicator& comm);
// all_gather of a distinct byte pattern per rank, out of place and in place.
void check_all_gather(parallel::Communicator& comm);
// broadcast from every root at several lengths.
void check_broadcast(parallel::Communicator& comm);
// A fixed sequence of collectives, then every counter of stats() and the communicator's name.
void check_counters(parallel::Communicator& comm, const std::string& name);

}  // namespace tpdraft::testing
