// The two kinds of group. A local group's rank threads each wait for the next job, run it with
// their rank, and report; the caller runs rank 0 itself and then waits for the others. A led
// group's rank 0 posts each command, and for a step broadcasts the entries with every tap row
// inline, which each follower decodes and applies as rank 0 does.
#include "engine/group.h"

#include <algorithm>
#include <cstring>
#include <system_error>

#include "core/bounds.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/thread_comm.h"

namespace tpdraft::engine {

int threads_per_rank(int threads, int ranks_here) {
  return threads > 0 ? threads : std::max(1, machine_cores() / std::max(1, ranks_here));
}

LocalGroup::LocalGroup(const model::ModelSource& source, const model::RuntimeOptions& options, int tp,
                       int64_t max_open_sessions) {
  TPDRAFT_CHECK(tp >= 1, "tensor-parallel size must be at least 1, got {}", tp);
  comms_ = tp == 1 ? std::vector<std::unique_ptr<parallel::Communicator>>{} : parallel::make_thread_group(tp);
  if (tp == 1) comms_.push_back(parallel::make_single_rank());
  engines_.resize(static_cast<size_t>(tp));
  errors_.resize(static_cast<size_t>(tp));
  threads_.reserve(static_cast<size_t>(tp - 1));
  for (int r = 1; r < tp; ++r) {
    try {
      threads_.emplace_back([this, r] { worker(r); });
    } catch (const std::system_error& e) {
      close();  // joins the rank threads that did start
      TPDRAFT_FAIL("cannot start the thread of rank {} of {}: {} (lower tp, or raise the process's memory or thread "
                   "limits)",
                   r, tp, e.what());
    }
  }
  try {
    run([&](int r) {
      engines_[static_cast<size_t>(r)] =
          std::make_unique<Engine>(source, *comms_[static_cast<size_t>(r)], options, max_open_sessions);
    });
  } catch (...) {
    close();
    throw;
  }
}

LocalGroup::~LocalGroup() {
  close();
  // Engines go before the communicators they use, each on any thread: no collective runs now.
  engines_.clear();
}

void LocalGroup::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void LocalGroup::worker(int rank) {
  log::set_thread_rank(rank, static_cast<int>(errors_.size()));
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    std::exception_ptr error;
    try {
      (*job)(rank);
    } catch (...) {
      error = std::current_exception();
      comms_[static_cast<size_t>(rank)]->abort(message_of(error));  // peers in a collective give up too
    }
    std::lock_guard<std::mutex> lock(mutex_);
    errors_[static_cast<size_t>(rank)] = error;
    if (--pending_ == 0) done_.notify_all();
  }
}

void LocalGroup::run(const std::function<void(int)>& job) {
  TPDRAFT_CHECK(broken_.empty(), "the drafter's ranks can no longer work together after an earlier failure: {}",
                broken_);
  if (threads_.empty()) {  // one rank: the caller's thread is the group
    job(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &job;
    pending_ = static_cast<int>(threads_.size());
    ++generation_;
    for (auto& e : errors_) e = nullptr;
  }
  wake_.notify_all();
  try {
    job(0);
  } catch (...) {
    errors_[0] = std::current_exception();
    comms_[0]->abort(message_of(errors_[0]));
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
  }
  const auto first = std::find_if(errors_.begin(), errors_.end(), [](const auto& e) { return e != nullptr; });
  if (first == errors_.end()) return;
  // A failed rank aborted the group's communicator, so no rank can rely on it any more.
  broken_ = message_of(*first);
  std::rethrow_exception(*first);
}

void LocalGroup::on_all(const std::function<void(Engine&)>& fn) {
  run([&](int r) { fn(*engines_[static_cast<size_t>(r)]); });
}

int64_t LocalGroup::open_session() {
  int64_t id = -1;
  on_all([&](Engine& e) {
    const int64_t mine = e.open_session();
    if (&e == &leader()) id = mine;
  });
  return id;
}

void LocalGroup::close_session(int64_t id) {
  on_all([&](Engine& e) { e.close_session(id); });
}

std::vector<model::DraftResult> LocalGroup::apply(const std::vector<StepEntry>& entries, StepDump* dump) {
  std::vector<model::DraftResult> results;
  on_all([&](Engine& e) {
    StepDump own;
    own.context = dump != nullptr && dump->context;
    const bool lead = &e == &leader();
    auto mine = e.apply(entries, dump == nullptr ? nullptr : lead ? dump : &own);
    if (lead) results = std::move(mine);
  });
  return results;
}

namespace {

// A step as rank 0 broadcasts it: the count, the entries as they are, then each entry's tap rows
// padded to 8 bytes (the ranks run one build of the program, so the layout is theirs alone; a
// follower points the entries at its copy of the rows).
static_assert(sizeof(StepEntry) % 8 == 0, "entries keep the payload 8-byte aligned");

size_t taps_bytes(const StepEntry& e, int64_t taps_width) {
  return e.n_new > 0 ? static_cast<size_t>(e.n_new * taps_width) * dtype_size(e.taps.dtype) : 0;
}

void encode_step(const std::vector<StepEntry>& entries, int64_t taps_width, kernels::Ops& ops,
                 std::vector<uint64_t>* out) {
  size_t words = 1 + entries.size() * sizeof(StepEntry) / 8;
  for (const StepEntry& e : entries) words += (taps_bytes(e, taps_width) + 7) / 8;
  out->assign(words, 0);
  (*out)[0] = entries.size();
  std::memcpy(static_cast<void*>(out->data() + 1), entries.data(), entries.size() * sizeof(StepEntry));
  char* taps = reinterpret_cast<char*>(out->data() + 1 + entries.size() * sizeof(StepEntry) / 8);
  for (const StepEntry& e : entries) {
    const size_t bytes = taps_bytes(e, taps_width);
    if (bytes > 0 && e.taps.on_device) {
      ops.wait_for(e.taps.stream);
      ops.to_host(taps, e.taps.data, bytes);
    } else if (bytes > 0) {
      std::memcpy(taps, e.taps.data, bytes);
    }
    taps += (bytes + 7) / 8 * 8;
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
  if (channel_ != nullptr) channel_->post({parallel::kOpOpen});
  return engine_.open_session();
}

void LeaderGroup::close_session(int64_t id) {
  if (channel_ != nullptr) channel_->post({parallel::kOpClose, id});
  engine_.close_session(id);
}

std::vector<model::DraftResult> LeaderGroup::apply(const std::vector<StepEntry>& entries, StepDump* dump) {
  if (channel_ != nullptr) {
    encode_step(entries, engine_.caps().taps_width, engine_.runtime().ops(), &payload_);
    // arg: 0 no dump, 1 the drafter's, 2 that and the context
    channel_->post({parallel::kOpStep, dump == nullptr ? 0 : dump->context ? 2 : 1,
                    static_cast<int64_t>(payload_.size() * 8)});
    comm_.broadcast(payload_.data(), payload_.size() * 8, 0);
  }
  if (hook_) hook_();
  return engine_.apply(entries, dump);
}

void LeaderGroup::close() {
  if (closed_) return;
  closed_ = true;
  if (channel_ != nullptr) channel_->post({parallel::kOpStop});
}

void follow(Engine& engine, parallel::Communicator& comm, parallel::CommandChannel& channel, const StepHook& hook) {
  std::vector<uint64_t> payload;
  for (;;) {
    const parallel::Command c = channel.wait();
    switch (c.op) {
      case parallel::kOpStop: return;
      case parallel::kOpOpen: engine.open_session(); break;
      case parallel::kOpClose: engine.close_session(c.arg); break;
      case parallel::kOpStep: {
        TPDRAFT_CHECK(c.bytes >= 8 && c.bytes % 8 == 0, "a step payload of {} bytes from rank 0", c.bytes);
        payload.assign(static_cast<size_t>(c.bytes / 8), 0);
        comm.broadcast(payload.data(), payload.size() * 8, 0);
        const auto entries = decode_step(payload, engine.caps().taps_width);
        StepDump dump;
        dump.context = c.arg == 2;
        if (hook) hook();
        engine.apply(entries, c.arg != 0 ? &dump : nullptr);
        break;
      }
      default: TPDRAFT_FAIL("rank 0 sent an unknown command {}", c.op);
    }
  }
}

}  // namespace tpdraft::engine
