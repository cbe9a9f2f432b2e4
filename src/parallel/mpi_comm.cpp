// The MPI communicator. MPI counts are ints, so all-reduces and broadcasts of more than 2^30
// elements move in chunks; an all-gather block that large is refused (the head gathers a few
// KiB per rank). Built only with TPDRAFT_HAVE_MPI, except for mpi_launched().
#include "parallel/mpi_comm.h"

#include <cstdlib>

namespace tpdraft::parallel {

bool mpi_launched() {
  // Open MPI's launcher, and the process-management interfaces of MPICH / Slurm / PMIx.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

}  // namespace tpdraft::parallel

#ifdef TPDRAFT_HAVE_MPI

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/bounds.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/launch.h"

namespace tpdraft::parallel {

namespace {

constexpr size_t kMaxChunk = size_t{1} << 30;  // elements per MPI call, well inside int

int world_rank() {
  int rank = -1;
  if (multi_process()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Whether the ranks on this machine fill its cores (set by mpi_init): then they wait for their
// collectives as wait_for() does.
bool g_crowded = false;

// MPI waits for a collective by polling, and holds the core while it does: the fastest wait while
// every rank has a core of its own. When the ranks share the cores, with each other or with other
// work (a server's clients, the target engine, another program), a rank that polls for a peer that
// is not running keeps the peer, or whatever else waits for that core, off it until the scheduler
// takes the core away, a time slice later: milliseconds, where the collective itself takes
// microseconds. Yielding between polls (Open MPI's mpi_yield_when_idle) is no cure: it hands the
// core to a busy process for a whole slice, and then the collective waits that long for the rank
// itself. So a crowded rank polls for a moment (a collective whose ranks all run ends within
// microseconds), then polls between short naps: asleep, it leaves the core to others, and the
// scheduler lets a task that slept back on sooner than one that yielded (bench/serve_mpi.py
// measures the three).
constexpr auto kPollBusy = std::chrono::microseconds(50);
constexpr auto kPollNap = std::chrono::microseconds(20);

// One collective call: the blocking one, or on a crowded machine its non-blocking twin (started
// by `start` into the request it is given) waited for by wait_for().
template <typename Blocking, typename Start>
void collective(const Blocking& blocking, const Start& start) {
  if (!g_crowded) {
    blocking();
    return;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  start(&req);
  wait_for(&req, kPollBusy, kPollNap);
}

}  // namespace

void wait_for(MPI_Request* req, std::chrono::microseconds busy, std::chrono::microseconds nap) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int done = 0;
    MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (std::chrono::steady_clock::now() - start > busy) std::this_thread::sleep_for(nap);
  }
}

void mpi_check(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  const char* base = std::strrchr(file, '/');
  TPDRAFT_FAIL("rank {}: {} failed at {}:{}: {} (MPI error {})", world_rank(), call, base ? base + 1 : file, line,
               std::string(text, static_cast<size_t>(length)), code);
}

void mpi_init(int* argc, char*** argv) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  }
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  log::set_rank(rank, size);
  g_crowded = node_local().size >= machine_cores();
}

void mpi_finalize() {
  if (multi_process()) MPI_Finalize();
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  try {
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
  } catch (...) {
    MPI_Comm_free(&comm_);
    throw;
  }
}

MpiCommunicator::~MpiCommunicator() {
  if (comm_ != MPI_COMM_NULL && multi_process()) MPI_Comm_free(&comm_);
}

void MpiCommunicator::do_all_reduce_sum(float* data, size_t count) {
  for (size_t done = 0; done < count; done += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, count - done));
    float* chunk = data + done;
    collective([&] { MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, chunk, n, MPI_FLOAT, MPI_SUM, comm_)); },
               [&](MPI_Request* q) { MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, chunk, n, MPI_FLOAT, MPI_SUM, comm_, q)); });
  }
}

void MpiCommunicator::do_all_gather(const void* send, void* recv, size_t bytes) {
  TPDRAFT_CHECK(bytes <= kMaxChunk, "rank {}: all_gather block of {} bytes is over the {}-byte limit of one MPI call",
                rank_, bytes, kMaxChunk);
  if (bytes == 0) return;
  // MPI forbids aliased buffers; a rank whose block already sits in place says so explicitly.
  const bool in_place = send == static_cast<const uint8_t*>(recv) + static_cast<size_t>(rank_) * bytes;
  const int n = static_cast<int>(bytes);
  const void* from = in_place ? MPI_IN_PLACE : send;
  collective([&] { MPI_CHECK(MPI_Allgather(from, n, MPI_BYTE, recv, n, MPI_BYTE, comm_)); },
             [&](MPI_Request* q) { MPI_CHECK(MPI_Iallgather(from, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, q)); });
}

void MpiCommunicator::do_broadcast(void* data, size_t bytes, int root) {
  TPDRAFT_CHECK(root >= 0 && root < size_, "rank {}: broadcast root {} is not a rank of a group of {}", rank_, root,
                size_);
  auto* bytes_ptr = static_cast<uint8_t*>(data);
  for (size_t done = 0; done < bytes; done += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, bytes - done));
    uint8_t* chunk = bytes_ptr + done;
    collective([&] { MPI_CHECK(MPI_Bcast(chunk, n, MPI_BYTE, root, comm_)); },
               [&](MPI_Request* q) { MPI_CHECK(MPI_Ibcast(chunk, n, MPI_BYTE, root, comm_, q)); });
  }
}

void MpiCommunicator::do_barrier() {
  collective([&] { MPI_CHECK(MPI_Barrier(comm_)); }, [&](MPI_Request* q) { MPI_CHECK(MPI_Ibarrier(comm_, q)); });
}

void MpiCommunicator::abort(const std::string& reason) { mpi_abort_job(reason); }

void mpi_abort_job(const std::string& reason) {
  TPDRAFT_LOG_ERROR("rank {}: aborting the job: {}", world_rank(), reason);
  log::logger().flush();
  std::fflush(stderr);
  if (multi_process()) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return; without MPI up there are no peers to stop
}

std::unique_ptr<Communicator> make_mpi(MPI_Comm comm) { return std::make_unique<MpiCommunicator>(comm); }

NodeLocal node_local(MPI_Comm comm) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_Comm shared = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared));
  NodeLocal local;
  MPI_Comm_rank(shared, &local.rank);
  MPI_Comm_size(shared, &local.size);
  MPI_Comm_free(&shared);
  return local;
}

}  // namespace tpdraft::parallel

#endif  // TPDRAFT_HAVE_MPI
