// One run of tpdraft as a job (its processes: parallel/launch.h): the exit statuses, and how the
// ranks agree on a failure, so that an error every rank meets alike (arguments, a config or checkpoint, the shard
// plan) is printed once and ends the job cleanly, while a fault on one rank in the middle of a
// collective still ends every rank at once.
#pragma once

#include <functional>

#include "parallel/communicator.h"

namespace tpdraft::cli {

// The exit statuses of tpdraft.
enum ExitStatus : int {
  kExitOk = 0,
  kExitRuntime = 1,  // a fault while running: a rank, a device, a peer that is gone
  kExitUsage = 2,    // the command line (an unknown option, a missing or out-of-range value) or the environment
  kExitInput = 3,    // the input: a config, checkpoint or taps file, or a tp its geometry cannot take
};
// The paragraph `tpdraft --help` ends with.
const char* exit_status_help();

// A failure that has been reported already: every rank of the job ends with `status`.
struct JobFailure {
  int status;
};

// Under mpirun: every rank must have been started with rank 0's arguments (a different
// subcommand, --dump or --tp on one rank would hang it or split the ranks' tokens). Throws
// JobFailure(kExitUsage) on every rank after the first differing rank named the argument.
void check_same_arguments(int argc, char** argv);

// A command that runs no ranks of its own (init, info): its failures are input errors, reported
// once per job.
void run_alone(const std::function<void()>& command);

// Runs a step that every rank of `world` takes alike and that issues no collective. If it throws
// on any rank, one exchange tells every rank; the lowest failing rank logs its error and every
// rank throws JobFailure(status). `world` spans the whole job (every replica).
void agree_on(parallel::Communicator& world, int status, const std::function<void()>& step);

}  // namespace tpdraft::cli
