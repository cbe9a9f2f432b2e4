// The job this process is part of: this one process, or one of the processes an MPI launcher
// (mpirun) started, one per rank. Its start and end, the job-wide abort, the world, its split
// into replicas of tp consecutive ranks, and each replica's command channel. Above src/parallel/
// nothing needs to know whether this build has MPI.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "parallel/command.h"
#include "parallel/communicator.h"

namespace tpdraft::parallel {

// Starts MPI when a launcher started this process (call first in main); throws when it did and
// this build has no MPI. finish() ends MPI if it was started.
void launch(int* argc, char*** argv);
void finish();
// True while MPI is up (between launch() and finish() under an MPI launcher): the job's ranks
// are processes.
bool multi_process();
// Ends every process of the job after an error on this one (no collective: no peer hangs);
// returns at once when the job is this process alone.
void abort_job(const std::string& reason);

// Every rank of the job: the MPI world, or this one process.
std::unique_ptr<Communicator> world();

// This process's replica under an MPI launcher: world ranks [g·tp, (g+1)·tp) form replica g.
struct Replica {
  std::unique_ptr<Communicator> comm;  // the replica's group; rank in it = world rank % tp
  int replica = 0, replicas = 1;
  int local_rank = 0, local_size = 1;  // this rank's place among the job's ranks on its machine
  // Opens the group's command channel (collective over the group; unset for a group of one process).
  std::function<std::unique_ptr<CommandChannel>()> open_channel;
};
// Throws when the world size is not a multiple of tp (or, without a launcher, tp is not 1).
Replica split_replicas(int tp);

}  // namespace tpdraft::parallel
