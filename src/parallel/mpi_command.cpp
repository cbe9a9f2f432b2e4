// The command channels of a group of MPI processes: a shared-memory segment when the group's
// ranks share one machine, else a non-blocking broadcast. Built only with TPDRAFT_HAVE_MPI.
#ifdef TPDRAFT_HAVE_MPI

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "core/files.h"
#include "core/futex.h"
#include "parallel/mpi_comm.h"

namespace tpdraft::parallel {

namespace {

// Across machines: a non-blocking broadcast on a duplicate of the group's communicator.
class MpiChannel final : public CommandChannel {
 public:
  explicit MpiChannel(MPI_Comm group) { MPI_CHECK(MPI_Comm_dup(group, &comm_)); }
  ~MpiChannel() override { MPI_Comm_free(&comm_); }
  void post(const Command& c) override {
    Command copy = c;
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(&copy, sizeof(copy), MPI_BYTE, 0, comm_, &req));
    MPI_CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE));
  }
  Command wait() override {
    Command c;
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(&c, sizeof(c), MPI_BYTE, 0, comm_, &req));
    // Busy while the group is busy (a step follows the last within microseconds); past 50 ms
    // of quiet, test every half millisecond so that an idle group costs no core.
    wait_for(&req, std::chrono::milliseconds(50), std::chrono::microseconds(500));
    return c;
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// On one machine: the commands pass through a small shared-memory segment, and a follower with
// nothing to do sleeps on a futex at once, as the in-process group's threads sleep on their
// condition variable. (A broadcast cannot be slept on: MPI only polls, so a waiting follower
// would either hold a core the client or rank 0 needs, or answer late from a timed sleep. Even a
// short spin before sleeping measured slower where the ranks share their cores with other work,
// and no faster where they do not.) Rank 0 writes each command into a slot of a small ring, then
// bumps `posted`, and wakes the followers that said they may sleep; each follower says which
// commands it has taken, so that rank 0 never reuses a slot one of them has yet to read.
class SharedChannel final : public CommandChannel {
 public:
  // Null when the group's ranks are not all on this machine, or the segment cannot be made here
  // (every rank of the group gets the same answer).
  static std::unique_ptr<CommandChannel> open(MPI_Comm group) {
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(group, &rank));
    MPI_CHECK(MPI_Comm_size(group, &size));
    if (node_local(group).size != size) return nullptr;  // the same answer everywhere: each saw the whole group
    const size_t bytes = Layout::bytes(size);
    // Rank 0 makes the segment and names it; the others map it; all agree that every rank did
    // before rank 0 unlinks the name (the mappings keep the memory for as long as they last).
    char name[64] = {0};
    void* base = nullptr;
    if (rank == 0) {
      static std::atomic<uint64_t> counter{0};
      std::snprintf(name, sizeof(name), "/tpdraft-group-%d-%llu", static_cast<int>(getpid()),
                    static_cast<unsigned long long>(counter++));
      base = map_shared_memory(name, bytes, true);  // reads as zeros: nothing posted, taken or asleep
      if (base == nullptr) name[0] = '\0';
    }
    MPI_CHECK(MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, group));
    if (rank != 0 && name[0] != '\0') base = map_shared_memory(name, bytes, false);
    int mapped = base != nullptr ? 1 : 0, everywhere = 0;
    MPI_CHECK(MPI_Allreduce(&mapped, &everywhere, 1, MPI_INT, MPI_MIN, group));
    if (rank == 0 && name[0] != '\0') shm_unlink(name);
    if (everywhere == 0) {
      if (base != nullptr) munmap(base, bytes);
      return nullptr;
    }
    return std::unique_ptr<CommandChannel>(new SharedChannel(static_cast<char*>(base), bytes, rank, size));
  }

  ~SharedChannel() override { munmap(base_, bytes_); }

  void post(const Command& c) override {
    const uint32_t seq = ++count_;
    // The slot of command seq last held command seq - kSlots: wait until every follower has
    // taken that one (only a burst of opens or closes while a follower lags gets this far; the
    // follower is then most likely off its core, so nap rather than poll).
    for (int r = 1; r < size_; ++r)
      while (static_cast<int32_t>(seq - kSlots - shared_load(layout().taken(r))) > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    layout().slots()[seq % kSlots] = c;
    shared_store(layout().posted(), seq);
    if (shared_load(layout().sleepers()) != 0) futex_wake(layout().posted());
  }

  Command wait() override {
    const uint32_t next = count_ + 1;
    uint32_t* posted = layout().posted();
    auto arrived = [&](uint32_t seen) { return static_cast<int32_t>(seen - next) >= 0; };
    while (!arrived(shared_load(posted))) {
      // Say so before sleeping, then look once more: rank 0 either sees the sleeper (and wakes
      // it) or posted before this look (which then sees the command).
      __atomic_add_fetch(layout().sleepers(), 1, __ATOMIC_SEQ_CST);
      const uint32_t seen = shared_load(posted);
      if (!arrived(seen)) futex_wait(posted, seen, 0.1);
      __atomic_sub_fetch(layout().sleepers(), 1, __ATOMIC_SEQ_CST);
    }
    const Command c = layout().slots()[next % kSlots];
    count_ = next;
    shared_store(layout().taken(rank_), next);
    return c;
  }

 private:
  static constexpr uint32_t kSlots = 64;
  static constexpr size_t kLine = 64;  // each word another rank writes on its own cache line

  // The segment: posted and sleepers, the slots, then a taken word per rank.
  struct Layout {
    char* base;
    static size_t bytes(int ranks) { return 2 * kLine + kSlots * sizeof(Command) + static_cast<size_t>(ranks) * kLine; }
    uint32_t* posted() const { return reinterpret_cast<uint32_t*>(base); }
    uint32_t* sleepers() const { return reinterpret_cast<uint32_t*>(base + kLine); }
    Command* slots() const { return reinterpret_cast<Command*>(base + 2 * kLine); }
    uint32_t* taken(int r) const {
      return reinterpret_cast<uint32_t*>(base + 2 * kLine + kSlots * sizeof(Command) + static_cast<size_t>(r) * kLine);
    }
  };

  SharedChannel(char* base, size_t bytes, int rank, int size) : base_(base), bytes_(bytes), rank_(rank), size_(size) {}
  Layout layout() const { return Layout{base_}; }

  char* base_;
  size_t bytes_;
  int rank_, size_;
  uint32_t count_ = 0;  // rank 0: commands posted; a follower: commands taken
};
}  // namespace

std::unique_ptr<CommandChannel> mpi_command_channel(MPI_Comm group) {
  if (auto shared = SharedChannel::open(group)) return shared;
  return std::make_unique<MpiChannel>(group);
}

}  // namespace tpdraft::parallel

#endif  // TPDRAFT_HAVE_MPI
