// How one invocation of tpdraft runs its ranks: a single rank; N in-process ranks (--tp N, one
// thread each, the in-process communicator); or, under mpirun, every process one rank, grouped
// into replicas of tp consecutive ranks (tensor parallelism inside a group, replicas across);
// and how a command drives its group once each rank has its engine.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/group.h"
#include "engine/runtime.h"
#include "parallel/command.h"
#include "parallel/communicator.h"

namespace tpdraft::cli {

// The options every command that runs ranks takes.
struct RankOptions {
  std::string backend = "auto";  // --backend cpu|cuda|auto
  int tp = 0;                    // --tp: in-process ranks, or MPI ranks per replica (0: all)
  int threads = 0;               // --threads: CPU threads per rank (0: the cores shared out)
  double comm_timeout = 0;       // --comm-timeout: seconds a collective may wait (0: forever)
  std::string quant;             // --quant q8|q4[+head]: quantize a float checkpoint while loading
  std::string token_map;         // --token-map FILE: restrict the head to a draft vocabulary
  std::string kv_dtype = "f32";  // --kv-dtype f32|bf16: the context cache's element type
};
void add_rank_options(CLI::App* cmd, RankOptions* options);
// What the options change in the model as it loads: the token map, then --quant.
void apply_load_options(model::ModelSource& source, const RankOptions& options);

struct RankContext {
  parallel::Communicator& comm;   // the tensor-parallel group
  parallel::Communicator& world;  // every rank of the job (for agree_on)
  int replica = 0;               // which group
  int replicas = 1;
  int threads = 1;               // CPU threads this rank may use
  int world_rank = 0;            // rank in the whole job (MPI world, or the in-process group)
  int local_rank = 0;            // index among the job's ranks on this machine (picks the GPU)
  int process_ranks = 1;         // ranks in this process (threads of one group)
  // Opens the command channel from the group's rank 0 to its other ranks (collective over the
  // group; null for a group of one).
  std::function<std::unique_ptr<parallel::CommandChannel>()> open_channel;
  bool leader() const { return replica == 0 && comm.rank() == 0; }  // prints results
};

// TPDRAFT_FAULT=R:STAGE makes world rank R fail at STAGE (load, settle, draft), and
// TPDRAFT_FAULT=R:STAGE:stop stops it there (SIGSTOP): testing aids for the failure paths, so
// that a test can break one rank alone.
void fault_point(const RankContext& ctx, const char* stage);

// The runtime options of this rank: the backend, its threads and its place on its machine (which
// picks its GPU); under mpirun NCCL carries device buffers.
model::RuntimeOptions runtime_options(const RankOptions& options, const RankContext& ctx);

// Drives this rank's tensor-parallel group (collective over it): fn runs on every rank, with a
// LeaderGroup over `engine` on the group's rank 0 and nullptr on the others, which then follow
// rank 0's commands until its group closes (when fn returns or throws there). Before its share of
// each step every rank passes the "settle" and "draft" fault points.
void drive_group(const RankContext& ctx, engine::Engine& engine, const std::function<void(engine::Group*)>& fn);

// Runs fn on every rank of this process. tp = 0: all MPI ranks form one group (1 without MPI).
// threads = 0: this machine's cores shared among the ranks placed on it (engine::threads_per_rank). A JobFailure thrown on
// every rank (agree_on) ends the call with that JobFailure.
void run_ranks(const RankOptions& options, const std::function<void(const RankContext&)>& fn);

}  // namespace tpdraft::cli
