// Rank set-up for the CLI: in-process thread groups or MPI replica groups, and the job-wide
// abort that makes a failure on one rank end every rank.
#include "cli/ranks.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "parallel/mpi_comm.h"
#include "parallel/thread_comm.h"

namespace tpdraft::cli {

namespace {
bool g_mpi = false;

int cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }
}  // namespace

bool under_mpi() { return g_mpi; }

void init_launch(int* argc, char*** argv) {
#ifdef TPDRAFT_HAVE_MPI
  if (parallel::mpi_launched()) {
    parallel::mpi_init(argc, argv);
    g_mpi = true;
  }
#else
  (void)argc;
  (void)argv;
  TPDRAFT_CHECK(!parallel::mpi_launched(), "launched under mpirun, but this tpdraft was built without MPI");
#endif
}

void finish_launch() {
#ifdef TPDRAFT_HAVE_MPI
  if (g_mpi) parallel::mpi_finalize();
#endif
}

void abort_launch(const std::string& reason) {
#ifdef TPDRAFT_HAVE_MPI
  if (g_mpi) parallel::mpi_abort_job(reason);
#else
  (void)reason;
#endif
}

void fault_point(const RankContext& ctx, const char* stage) {
  const char* spec = std::getenv("TPDRAFT_FAULT");
  if (spec == nullptr) return;
  const std::string s(spec);
  const size_t colon = s.find(':');
  if (colon == std::string::npos) return;
  if (std::atoi(s.substr(0, colon).c_str()) == ctx.world_rank && s.substr(colon + 1) == stage)
    TPDRAFT_FAIL("rank {}: injected fault at '{}' (TPDRAFT_FAULT={})", ctx.world_rank, stage, s);
}

void add_rank_options(CLI::App* cmd, RankOptions* o) {
  cmd->add_option("--backend", o->backend, "Kernels: cpu, cuda, or auto (cuda when a GPU is present, else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--tp", o->tp, "Tensor-parallel ranks: in-process threads, or under mpirun the ranks per replica "
                                 "(default: all of them)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", o->threads, "CPU threads per rank (0: the cores shared among the ranks)")
      ->check(CLI::NonNegativeNumber);
}

model::RuntimeOptions runtime_options(const RankOptions& options, const RankContext& ctx) {
  model::RuntimeOptions r;
  r.backend = options.backend;
  r.threads = ctx.threads;
#ifdef TPDRAFT_HAVE_MPI
  if (under_mpi()) r.local_rank = parallel::node_local().rank;
#endif
  r.nccl = under_mpi();
  return r;
}

void run_ranks(const RankOptions& options, const std::function<void(const RankContext&)>& fn) {
  const int tp = options.tp, threads = options.threads;
  TPDRAFT_CHECK(tp >= 0, "--tp must be >= 0, got {}", tp);
#ifdef TPDRAFT_HAVE_MPI
  if (g_mpi) {
    int world = 1;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    const int group = tp == 0 ? world : tp;
    TPDRAFT_CHECK(group <= world, "--tp {} needs at least {} ranks, but mpirun started {}", group, group, world);
    parallel::ReplicaGroup g = parallel::split_groups(group);
    const parallel::NodeLocal local = parallel::node_local();
    int world_rank = 0;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    RankContext ctx{*g.comm, g.replica, g.replicas, threads > 0 ? threads : std::max(1, cores() / local.size), world_rank};
    fn(ctx);
    return;
  }
#endif
  const int n = std::max(tp, 1);
  if (n == 1) {
    auto comm = parallel::make_single_rank();
    fn(RankContext{*comm, 0, 1, threads > 0 ? threads : cores(), 0});
    return;
  }
  const int per_rank = threads > 0 ? threads : std::max(1, cores() / n);
  parallel::run_ranks(n, [&](parallel::Communicator& comm) {
    log::set_thread_rank(comm.rank(), comm.size());
    fn(RankContext{comm, 0, 1, per_rank, comm.rank()});
  });
}

}  // namespace tpdraft::cli
