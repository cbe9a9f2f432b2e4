// Failure probe for the MPI communicator: rank 1 fails while the other ranks wait in an
// all-reduce that can never complete. The job must end non-zero (every rank stopped by the
// launcher) with rank 1's reason on stderr; tests/mpi/expect_failure.sh checks both.
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "parallel/mpi_comm.h"

int main(int argc, char** argv) {
  using namespace tpdraft::parallel;
  mpi_init(&argc, &argv);
  auto comm = make_mpi(MPI_COMM_WORLD);
  try {
    std::vector<float> x(1024, 1.0f);
    comm->all_reduce_sum(x.data(), x.size());  // everyone joins the first one
    if (comm->rank() == 1) TPDRAFT_FAIL("probe failure: rank {} cannot continue", comm->rank());
    comm->all_reduce_sum(x.data(), x.size());  // the others wait here for rank 1
  } catch (const std::exception& e) {
    comm->abort(e.what());
  }
  comm.reset();
  mpi_finalize();
  return 0;  // reached only when nothing failed: the test then fails
}
