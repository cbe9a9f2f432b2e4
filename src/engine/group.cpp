// Leading and following. Rank 0 posts each command and makes the engine call itself; for a step
// across processes it broadcasts the entries with every tap row inline, which each follower
// decodes and applies as rank 0 does, while threads of this process read them in place. A local
// group's rank threads build their engines, then follow, reporting each failure to rank 0.
#include "engine/group.h"

#include <algorithm>
#include <cstring>
#include <system_error>
#include <utility>

#include "core/bounds.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/thread_comm.h"

namespace tpdraft::engine {

int threads_per_rank(int threads, int ranks_here) {
  return threads > 0 ? threads : std::max(1, machine_cores() / std::max(1, ranks_here));
}

namespace {

// Runs fn; its failure is returned, once the group's communicator is aborted so that peers in a
// collective give up too.
std::exception_ptr attempt(parallel::Communicator& comm, const std::function<void()>& fn) {
  try {
    fn();
    return nullptr;
  } catch (...) {
    comm.abort(message_of(std::current_exception()));
    return std::current_exception();
  }
}

// A step as rank 0 broadcasts it: the count, the entries as they are, then each entry's tap rows
// padded to 8 bytes (the ranks run one build of the program, so the layout is theirs alone; a
// follower points the entries at its copy of the rows).
static_assert(sizeof(StepEntry) % 8 == 0, "entries keep the payload 8-byte aligned");

size_t taps_bytes(const StepEntry& e, int64_t taps_width) {
  return e.n_new > 0 ? static_cast<size_t>(e.n_new * taps_width) * dtype_size(e.taps.dtype) : 0;
}

void encode_step(const std::vector<StepEntry>& entries, int64_t taps_width, kernels::Ops& ops,
                 std::vector<uint64_t>* out) {
  out->assign(1 + entries.size() * sizeof(StepEntry) / 8, 0);
  (*out)[0] = entries.size();
  std::memcpy(static_cast<void*>(out->data() + 1), entries.data(), entries.size() * sizeof(StepEntry));
  for (const StepEntry& e : entries) {
    const size_t bytes = taps_bytes(e, taps_width), at = out->size();
    out->resize(at + (bytes + 7) / 8, 0);
    char* taps = reinterpret_cast<char*>(out->data() + at);
    if (bytes > 0 && e.taps.on_device) {
      ops.wait_for(e.taps.stream);
      ops.to_host(taps, e.taps.data, bytes);
    } else if (bytes > 0) {
      std::memcpy(taps, e.taps.data, bytes);
    }
  }
}

std::vector<StepEntry> decode_step(const std::vector<uint64_t>& payload, int64_t taps_width) {
  const uint64_t n = payload[0];
  TPDRAFT_CHECK(n <= (payload.size() - 1) * 8 / sizeof(StepEntry), "a step of {} entries in a payload of {} bytes", n,
                payload.size() * 8);
  std::vector<StepEntry> entries(n);
  std::memcpy(static_cast<void*>(entries.data()), payload.data() + 1, n * sizeof(StepEntry));
  const char* taps = reinterpret_cast<const char*>(payload.data() + 1 + n * sizeof(StepEntry) / 8);
  const char* end = reinterpret_cast<const char*>(payload.data() + payload.size());
  for (StepEntry& e : entries) {
    const size_t bytes = taps_bytes(e, taps_width);
    TPDRAFT_CHECK(static_cast<size_t>(end - taps) >= bytes, "a step's tap rows run past its payload");
    e.taps = {bytes > 0 ? taps : nullptr, e.taps.dtype, false, nullptr};
    taps += (bytes + 7) / 8 * 8;
  }
  return entries;
}

}  // namespace

int64_t LeaderGroup::open_session() {
  int64_t id = -1;
  lead({parallel::kOpOpen}, [&] { id = engine_.open_session(); });
  return id;
}

void LeaderGroup::close_session(int64_t id) {
  lead({parallel::kOpClose, id}, [&] { engine_.close_session(id); });
}

std::vector<model::DraftResult> LeaderGroup::apply(const std::vector<StepEntry>& entries, StepDump* dump) {
  // arg: 0 no dump, 1 the drafter's, 2 that and the context
  parallel::Command c{parallel::kOpStep, dump == nullptr ? 0 : dump->context ? 2 : 1};
  c.local = local_ != nullptr ? &entries : nullptr;
  if (channel_ != nullptr) {
    encode_step(entries, engine_.caps().taps_width, engine_.runtime().ops(), &payload_);
    c.bytes = static_cast<int64_t>(payload_.size() * 8);
  }
  std::vector<model::DraftResult> results;
  lead(c, [&] {
    if (c.bytes > 0) comm_.broadcast(payload_.data(), payload_.size() * 8, 0);
    if (hook_) hook_();
    results = engine_.apply(entries, dump);
  });
  return results;
}

void LeaderGroup::lead(const parallel::Command& c, const std::function<void()>& mine) {
  TPDRAFT_CHECK(broken_.empty(), "the drafter's ranks can no longer work together after an earlier failure: {}",
                broken_);
  if (channel_ != nullptr) channel_->post(c);
  if (local_ == nullptr) return mine();
  local_->post(c);
  const std::exception_ptr first = local_->settle(attempt(comm_, mine));
  if (first == nullptr) return;
  // A failed rank aborted the group's communicator, so no rank can rely on it any more.
  broken_ = message_of(first);
  std::rethrow_exception(first);
}

void LeaderGroup::close() {
  if (channel_ != nullptr && !std::exchange(closed_, true)) channel_->post({parallel::kOpStop});
}

void follow(Engine& engine, parallel::Communicator& comm, parallel::CommandChannel& channel, const StepHook& hook) {
  std::vector<uint64_t> payload;
  std::vector<StepEntry> received;
  for (;;) {
    const parallel::Command c = channel.wait();
    switch (c.op) {
      case parallel::kOpStop: return;
      case parallel::kOpOpen: engine.open_session(); break;
      case parallel::kOpClose: engine.close_session(c.arg); break;
      case parallel::kOpStep: {
        if (c.local == nullptr) {
          TPDRAFT_CHECK(c.bytes >= 8 && c.bytes % 8 == 0, "a step payload of {} bytes from rank 0", c.bytes);
          payload.assign(static_cast<size_t>(c.bytes / 8), 0);
          comm.broadcast(payload.data(), payload.size() * 8, 0);
          received = decode_step(payload, engine.caps().taps_width);
        }
        StepDump dump;
        dump.context = c.arg == 2;
        if (hook) hook();
        engine.apply(c.local != nullptr ? *static_cast<const std::vector<StepEntry>*>(c.local) : received,
                     c.arg != 0 ? &dump : nullptr);
        break;
      }
      default: TPDRAFT_FAIL("rank 0 sent an unknown command {}", c.op);
    }
  }
}

LocalGroup::LocalGroup(const model::ModelSource& source, const model::RuntimeOptions& options, int tp,
                       int64_t max_open_sessions)
    : mailbox_(std::max(tp, 1)) {
  TPDRAFT_CHECK(tp >= 1, "tensor-parallel size must be at least 1, got {}", tp);
  comms_ = tp == 1 ? std::vector<std::unique_ptr<parallel::Communicator>>{} : parallel::make_thread_group(tp);
  if (tp == 1) comms_.push_back(parallel::make_single_rank());
  engines_.resize(static_cast<size_t>(tp));
  const auto build = [&](int r) {
    engines_[static_cast<size_t>(r)] =
        std::make_unique<Engine>(source, *comms_[static_cast<size_t>(r)], options, max_open_sessions);
  };
  threads_.reserve(static_cast<size_t>(tp - 1));
  for (int r = 1; r < tp; ++r) {
    try {
      threads_.emplace_back([this, r, &build] { follower(r, build); });
    } catch (const std::system_error& e) {
      comms_[0]->abort("could not start all rank threads");  // the started ranks may wait in a collective
      close();  // joins the rank threads that did start
      TPDRAFT_FAIL("cannot start the thread of rank {} of {}: {} (lower tp, or raise the process's memory or thread "
                   "limits)",
                   r, tp, e.what());
    }
  }
  if (const std::exception_ptr error = mailbox_.settle(attempt(*comms_[0], [&] { build(0); }))) {
    close();
    std::rethrow_exception(error);
  }
  lead_.emplace(*engines_[0], *comms_[0], nullptr, StepHook{}, tp > 1 ? &mailbox_ : nullptr);
}

void LocalGroup::follower(int rank, const std::function<void(int)>& build) {
  log::set_thread_rank(rank, static_cast<int>(comms_.size()));
  parallel::Communicator& comm = *comms_[static_cast<size_t>(rank)];
  if (const std::exception_ptr error = attempt(comm, [&] { build(rank); })) {
    mailbox_.fail(rank, error);  // the group is never used
    return;
  }
  Engine& engine = *engines_[static_cast<size_t>(rank)];
  const auto channel = mailbox_.channel(rank);
  // Follows until the group closes; a failed command is reported, and the next one awaited.
  while (const std::exception_ptr error = attempt(comm, [&] { follow(engine, comm, *channel, {}); }))
    mailbox_.fail(rank, error);
}

void LocalGroup::close() {
  mailbox_.post({parallel::kOpStop});
  for (auto& t : threads_) t.join();
  threads_.clear();
}

}  // namespace tpdraft::engine
