// The job's processes through MPI when this build has it; without, the job is this process.
#include "parallel/launch.h"

#include "core/error.h"
#include "parallel/mpi_comm.h"

namespace tpdraft::parallel {

bool multi_process() {
#ifdef TPDRAFT_HAVE_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
#else
  return false;
#endif
}

void launch([[maybe_unused]] int* argc, [[maybe_unused]] char*** argv) {
#ifdef TPDRAFT_HAVE_MPI
  if (mpi_launched()) mpi_init(argc, argv);
#else
  TPDRAFT_CHECK(!mpi_launched(), "launched under mpirun, but this tpdraft was built without MPI");
#endif
}

void finish() {
#ifdef TPDRAFT_HAVE_MPI
  mpi_finalize();  // a no-op unless MPI is up
#endif
}

void abort_job([[maybe_unused]] const std::string& reason) {
#ifdef TPDRAFT_HAVE_MPI
  if (multi_process()) mpi_abort_job(reason);
#endif
}

std::unique_ptr<Communicator> world() {
#ifdef TPDRAFT_HAVE_MPI
  if (multi_process()) return make_mpi(MPI_COMM_WORLD);
#endif
  return make_single_rank();
}

Replica split_replicas(int tp) {
  Replica r;
#ifdef TPDRAFT_HAVE_MPI
  if (multi_process()) {
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    TPDRAFT_CHECK(tp >= 1 && size % tp == 0,
                  "rank {}: tensor-parallel size {} does not split the {} MPI ranks into whole replicas", rank, tp, size);
    MPI_Comm split = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank / tp, rank, &split));
    struct Free {
      MPI_Comm& c;
      ~Free() { MPI_Comm_free(&c); }
    } free_split{split};
    auto comm = std::make_unique<MpiCommunicator>(split);  // a duplicate: the split itself is freed on return
    const NodeLocal local = node_local();
    r.replica = rank / tp;
    r.replicas = size / tp;
    r.local_rank = local.rank;
    r.local_size = local.size;
    r.open_channel = [c = comm.get()] { return mpi_command_channel(c->handle()); };
    r.comm = std::move(comm);
    return r;
  }
#endif
  TPDRAFT_CHECK(tp == 1, "a replica of {} ranks needs an MPI launcher", tp);
  r.comm = make_single_rank();
  return r;
}

}  // namespace tpdraft::parallel
