// The MPI communicator (host buffers): CPU ranks on one or many machines, and the bootstrap the
// NCCL communicator needs. Everything but mpi_launched() exists only in builds with MPI
// (TPDRAFT_HAVE_MPI, set by CMake when TPDRAFT_MPI is on and MPI is found).
#pragma once

#include "parallel/communicator.h"

namespace tpdraft::parallel {

// True when this process was started by an MPI launcher (mpirun / mpiexec / srun with PMI or
// PMIx), whether or not this build has MPI: lets the CLI refuse a launch it cannot honour.
bool mpi_launched();

}  // namespace tpdraft::parallel

#ifdef TPDRAFT_HAVE_MPI

#include <mpi.h>

#include <chrono>

#include "parallel/command.h"

// MPI_CHECK(call): evaluates the call once; on failure throws tpdraft::Error naming the call,
// file:line, the world rank and MPI's own description of the error.
#define MPI_CHECK(call) ::tpdraft::parallel::mpi_check((call), #call, __FILE__, __LINE__)

namespace tpdraft::parallel {

void mpi_check(int code, const char* call, const char* file, int line);
// Tests the request until it completes: busily for `busy`, then between naps of `nap`.
void wait_for(MPI_Request* req, std::chrono::microseconds busy, std::chrono::microseconds nap);

// Initialises MPI (funneled threading: collectives come from one thread) unless it already is,
// and tags the log with the world rank. mpi_finalize() is a no-op unless MPI is up.
void mpi_init(int* argc, char*** argv);
void mpi_finalize();
// Logs the reason with this rank and ends every rank of the job (no collective: safe to call
// from one failing rank while its peers wait).
[[noreturn]] void mpi_abort_job(const std::string& reason);

// Collectives over a duplicate of an MPI communicator (so its traffic cannot meet the caller's),
// with errors returned to MPI_CHECK instead of killing the job. Free it before mpi_finalize().
class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string name() const override { return "mpi"; }
  MPI_Comm handle() const { return comm_; }

  // Logs the reason with the rank, then MPI_Abort on MPI_COMM_WORLD: the launcher ends every rank.
  void abort(const std::string& reason) override;

 protected:
  void do_all_reduce_sum(float* data, size_t count) override;
  void do_all_gather(const void* send, void* recv, size_t bytes) override;
  void do_broadcast(void* data, size_t bytes, int root) override;
  void do_barrier() override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

std::unique_ptr<Communicator> make_mpi(MPI_Comm comm);

// This rank's place among the ranks of `comm` sharing its machine (in the world: its GPU index
// on that machine). Collective over `comm`.
struct NodeLocal {
  int rank = 0;
  int size = 1;
};
NodeLocal node_local(MPI_Comm comm = MPI_COMM_WORLD);

// The command channel of a group whose ranks are processes of this job: when they all share one
// machine, a shared-memory segment a waiting follower sleeps on (a futex); otherwise a
// non-blocking broadcast on a duplicate of the group, polled with a short sleep once the group
// has been idle for a while. Collective over the group.
std::unique_ptr<CommandChannel> mpi_command_channel(MPI_Comm group);

}  // namespace tpdraft::parallel

#endif  // TPDRAFT_HAVE_MPI
