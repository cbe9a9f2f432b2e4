// How one invocation of tpdraft runs its ranks: a single rank; N in-process ranks (--tp N, one
// thread each, the in-process communicator); or, under mpirun, every process one rank, grouped
// into replicas of tp consecutive ranks (tensor parallelism inside a group, replicas across).
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "model/runtime.h"
#include "parallel/communicator.h"

namespace tpdraft::cli {

// The options every command that runs ranks takes.
struct RankOptions {
  std::string backend = "auto";  // --backend cpu|cuda|auto
  int tp = 0;                    // --tp: in-process ranks, or MPI ranks per replica (0: all)
  int threads = 0;               // --threads: CPU threads per rank (0: the cores shared out)
};
void add_rank_options(CLI::App* cmd, RankOptions* options);

struct RankContext {
  parallel::Communicator& comm;  // the tensor-parallel group
  int replica = 0;               // which group
  int replicas = 1;
  int threads = 1;               // CPU threads this rank may use
  int world_rank = 0;            // rank in the whole job (MPI world, or the in-process group)
  bool leader() const { return replica == 0 && comm.rank() == 0; }  // prints results
};

// Starts MPI when the process was launched by mpirun (call first in main).
void init_launch(int* argc, char*** argv);
void finish_launch();
// Makes every rank of the job give up after an error on this one (no peer hangs).
void abort_launch(const std::string& reason);
bool under_mpi();

// TPDRAFT_FAULT=R:STAGE makes world rank R fail at STAGE (load, settle, draft): a testing aid
// for the failure path, so that a test can break one rank alone.
void fault_point(const RankContext& ctx, const char* stage);

// The runtime options of this rank: the backend, its threads and its place on its machine (which
// picks its GPU); under mpirun NCCL carries device buffers.
model::RuntimeOptions runtime_options(const RankOptions& options, const RankContext& ctx);

// Runs fn on every rank of this process. tp = 0: all MPI ranks form one group (1 without MPI).
// threads = 0: this machine's cores shared among the ranks placed on it.
void run_ranks(const RankOptions& options, const std::function<void(const RankContext&)>& fn);

}  // namespace tpdraft::cli
