// The command channel between a served group's rank 0 and its other ranks, and the step
// payload rank 0 broadcasts: the entries in the wire format with every tap row inline.
#include "serve/group.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "serve/protocol.h"

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
  if (auto* m = dynamic_cast<parallel::MpiCommunicator*>(&group)) return std::make_unique<MpiChannel>(m->handle());
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
