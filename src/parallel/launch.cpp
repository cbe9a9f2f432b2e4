// The job's processes through MPI when this build has it; without, the job is this process.
#include "parallel/launch.h"

#include "core/error.h"
#include "parallel/mpi_comm.h"

namespace tpdraft::parallel {

namespace {
bool g_mpi = false;
}  // namespace

bool multi_process() { return g_mpi; }

void launch(int* argc, char*** argv) {
#ifdef TPDRAFT_HAVE_MPI
  if (mpi_launched()) {
    mpi_init(argc, argv);
    g_mpi = true;
  }
#else
  (void)argc;
  (void)argv;
  TPDRAFT_CHECK(!mpi_launched(), "launched under mpirun, but this tpdraft was built without MPI");
#endif
}

void finish() {
#ifdef TPDRAFT_HAVE_MPI
  if (g_mpi) mpi_finalize();
#endif
}

void abort_job(const std::string& reason) {
#ifdef TPDRAFT_HAVE_MPI
  if (g_mpi) mpi_abort_job(reason);
#else
  (void)reason;
#endif
}

std::unique_ptr<Communicator> world() {
#ifdef TPDRAFT_HAVE_MPI
  if (g_mpi) return make_mpi(MPI_COMM_WORLD);
#endif
  return make_single_rank();
}

Replica split_replicas(int tp) {
  Replica r;
#ifdef TPDRAFT_HAVE_MPI
  if (g_mpi) {
    ReplicaGroup g = split_groups(tp);
    const NodeLocal local = node_local();
    MpiCommunicator* comm = g.comm.get();
    r.comm = std::move(g.comm);
    r.replica = g.replica;
    r.replicas = g.replicas;
    r.local_rank = local.rank;
    r.local_size = local.size;
    r.open_channel = [comm] { return mpi_command_channel(comm->handle()); };
    return r;
  }
#endif
  TPDRAFT_CHECK(tp == 1, "a replica of {} ranks needs an MPI launcher", tp);
  r.comm = make_single_rank();
  r.open_channel = [] { return std::unique_ptr<CommandChannel>(); };
  return r;
}

}  // namespace tpdraft::parallel
