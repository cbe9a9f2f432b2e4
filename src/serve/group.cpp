// The command channel between a served group's rank 0 and its other ranks, and the step
// payload rank 0 broadcasts: the entries in the wire format with every tap row inline.
#include "serve/group.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "serve/protocol.h"
#include "serve/ring.h"

#ifdef TPDRAFT_HAVE_MPI
#include "parallel/mpi_comm.h"
#endif

namespace tpdraft::serve {

void Mailbox::post(const Command& c) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t r = 1; r < queues_.size(); ++r) queues_[r].push_back(c);
  }
  cv_.notify_all();
}

Command Mailbox::wait(int rank) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto& q = queues_[static_cast<size_t>(rank)];
  cv_.wait(lock, [&] { return !q.empty(); });
  const Command c = q.front();
  q.pop_front();
  return c;
}

namespace {

class MailboxChannel final : public CommandChannel {
 public:
  MailboxChannel(Mailbox& box, int rank) : box_(box), rank_(rank) {}
  void post(const Command& c) override { box_.post(c); }
  Command wait() override { return box_.wait(rank_); }

 private:
  Mailbox& box_;
  int rank_;
};

#ifdef TPDRAFT_HAVE_MPI
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
    using Clock = std::chrono::steady_clock;
    Command c;
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(&c, sizeof(c), MPI_BYTE, 0, comm_, &req));
    // Busy while the group is busy (a step follows the last within microseconds); past 50 ms
    // of quiet, test every half millisecond so that an idle server costs no core.
    const auto since = Clock::now();
    for (;;) {
      int done = 0;
      MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return c;
      if (Clock::now() - since > std::chrono::milliseconds(50))
        std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
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
    int rank = 0, size = 1, local = 0;
    MPI_CHECK(MPI_Comm_rank(group, &rank));
    MPI_CHECK(MPI_Comm_size(group, &size));
    MPI_Comm node = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split_type(group, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    if (local != size) return nullptr;  // the same answer everywhere: every rank saw the whole group
    const size_t bytes = Layout::bytes(size);
    // Rank 0 makes the segment and names it; the others map it; all agree that every rank did
    // before rank 0 unlinks the name (the mappings keep the memory for as long as they last).
    char name[64] = {0};
    void* base = nullptr;
    if (rank == 0) {
      static std::atomic<uint64_t> counter{0};
      std::snprintf(name, sizeof(name), "/tpdraft-group-%d-%llu", static_cast<int>(getpid()),
                    static_cast<unsigned long long>(counter++));
      base = map_segment(name, bytes, true);
      if (base == nullptr) name[0] = '\0';
    }
    MPI_CHECK(MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, group));
    if (rank != 0 && name[0] != '\0') base = map_segment(name, bytes, false);
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
      while (static_cast<int32_t>(seq - kSlots - ring_load(layout().taken(r))) > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    layout().slots()[seq % kSlots] = c;
    ring_store(layout().posted(), seq);
    if (ring_load(layout().sleepers()) != 0) ring_wake(layout().posted());
  }

  Command wait() override {
    const uint32_t next = count_ + 1;
    uint32_t* posted = layout().posted();
    auto arrived = [&](uint32_t seen) { return static_cast<int32_t>(seen - next) >= 0; };
    while (!arrived(ring_load(posted))) {
      // Say so before sleeping, then look once more: rank 0 either sees the sleeper (and wakes
      // it) or posted before this look (which then sees the command).
      __atomic_add_fetch(layout().sleepers(), 1, __ATOMIC_SEQ_CST);
      const uint32_t seen = ring_load(posted);
      if (!arrived(seen)) ring_wait(posted, seen, 0.1);
      __atomic_sub_fetch(layout().sleepers(), 1, __ATOMIC_SEQ_CST);
    }
    const Command c = layout().slots()[next % kSlots];
    count_ = next;
    ring_store(layout().taken(rank_), next);
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

  // Makes (create) or opens the segment `name` of `bytes` and maps it; null when it cannot.
  static void* map_segment(const char* name, size_t bytes, bool create) {
    const int fd = create ? shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(name, O_RDWR | O_NOFOLLOW, 0);
    if (fd < 0) return nullptr;
    struct stat st {};
    const bool ok = create ? ftruncate(fd, static_cast<off_t>(bytes)) == 0
                           : fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= bytes;
    void* p = ok ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED) {
      if (create) shm_unlink(name);
      return nullptr;
    }
    return p;  // a new segment reads as zeros: nothing posted, taken or asleep
  }

  char* base_;
  size_t bytes_;
  int rank_, size_;
  uint32_t count_ = 0;  // rank 0: commands posted; a follower: commands taken
};
#endif

void encode_step(const std::vector<engine::StepEntry>& entries, int64_t taps_width, std::vector<uint64_t>* out) {
  std::string body;
  Writer w(&body);
  w.put<uint32_t>(static_cast<uint32_t>(entries.size()));
  w.put<uint32_t>(0);
  uint64_t offset = 0;
  std::vector<std::pair<const void*, size_t>> areas;
  for (const engine::StepEntry& e : entries) {
    WireEntry x;
    fields_to_wire(e, &x);
    x.taps_dtype = e.taps.dtype == DType::F32 ? 0 : e.taps.dtype == DType::BF16 ? 1 : 2;
    const size_t bytes = e.n_new > 0 ? static_cast<size_t>(e.n_new * taps_width) * dtype_bytes(x.taps_dtype) : 0;
    x.taps_where = bytes > 0 ? kTapsInline : kTapsNone;
    x.taps_offset = offset;
    x.taps_bytes = bytes;
    put_entry(w, x);
    if (bytes > 0) areas.emplace_back(e.taps.data, bytes);
    offset += (bytes + 7) / 8 * 8;
  }
  const size_t head = body.size();  // 8 + 104 n: a multiple of 8
  out->assign((head + offset) / 8, 0);
  std::memcpy(out->data(), body.data(), head);
  char* taps = reinterpret_cast<char*>(out->data()) + head;
  for (const auto& a : areas) {
    std::memcpy(taps, a.first, a.second);
    taps += (a.second + 7) / 8 * 8;
  }
}

std::vector<engine::StepEntry> decode_step(const std::vector<uint64_t>& payload) {
  Reader r(payload.data(), payload.size() * 8);
  const uint32_t n = r.get<uint32_t>("group.count");
  r.get<uint32_t>("group.pad");
  std::vector<WireEntry> wire;
  for (uint32_t i = 0; i < n; ++i) wire.push_back(get_entry(r));
  const char* taps = r.rest();
  std::vector<engine::StepEntry> entries;
  for (const WireEntry& x : wire) {
    engine::StepEntry e;
    fields_from_wire(x, &e);
    e.taps.dtype = wire_dtype(x.taps_dtype);
    e.taps.data = x.taps_where == kTapsInline ? taps + x.taps_offset : nullptr;
    entries.push_back(e);
  }
  return entries;
}

}  // namespace

std::unique_ptr<CommandChannel> mailbox_channel(Mailbox& box, int rank) {
  return std::make_unique<MailboxChannel>(box, rank);
}

std::unique_ptr<CommandChannel> mpi_channel(parallel::Communicator& group) {
#ifdef TPDRAFT_HAVE_MPI
  if (auto* m = dynamic_cast<parallel::MpiCommunicator*>(&group)) {
    if (auto shared = SharedChannel::open(m->handle())) return shared;
    return std::make_unique<MpiChannel>(m->handle());
  }
#else
  (void)group;
#endif
  return nullptr;
}

int64_t GroupLeader::open_session() {
  if (channel_ != nullptr) channel_->post({kOpOpen});
  return engine_.open_session();
}

void GroupLeader::close_session(int64_t id) {
  if (channel_ != nullptr) channel_->post({kOpClose, id});
  engine_.close_session(id);
}

std::vector<model::DraftResult> GroupLeader::apply(const std::vector<engine::StepEntry>& entries) {
  if (channel_ != nullptr) {
    encode_step(entries, engine_.caps().taps_width, &payload_);
    Command step;
    step.op = kOpStep;
    step.bytes = static_cast<int64_t>(payload_.size() * 8);
    channel_->post(step);
    comm_.broadcast(payload_.data(), payload_.size() * 8, 0);
  }
  if (hook_) hook_();
  return engine_.apply(entries);
}

void GroupLeader::stop() {
  if (stopped_) return;
  stopped_ = true;
  if (channel_ != nullptr) channel_->post({kOpStop});
}

void follow(engine::Engine& engine, parallel::Communicator& comm, CommandChannel& channel, const StepHook& hook) {
  std::vector<uint64_t> payload;
  for (;;) {
    const Command c = channel.wait();
    switch (c.op) {
      case kOpStop: return;
      case kOpOpen: engine.open_session(); break;
      case kOpClose: engine.close_session(c.arg); break;
      case kOpStep: {
        TPDRAFT_CHECK(c.bytes >= 8 && c.bytes % 8 == 0, "a step payload of {} bytes from rank 0", c.bytes);
        payload.assign(static_cast<size_t>(c.bytes / 8), 0);
        comm.broadcast(payload.data(), payload.size() * 8, 0);
        const auto entries = decode_step(payload);
        if (hook) hook();
        engine.apply(entries);
        break;
      }
      default: TPDRAFT_FAIL("rank 0 sent an unknown command {}", c.op);
    }
  }
}

}  // namespace tpdraft::serve
