// The rank threads of a local group: each waits for the next job, runs it with its rank, and
// reports; the caller runs rank 0 itself and then waits for the others.
#include "engine/local_group.h"

#include <system_error>

#include "core/error.h"
#include "core/log.h"
#include "parallel/thread_comm.h"

namespace tpdraft::engine {

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
      stop_workers();  // joins the rank threads that did start
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
    stop_workers();
    throw;
  }
}

LocalGroup::~LocalGroup() {
  stop_workers();
  // Engines go before the communicators they use, each on any thread: no collective runs now.
  engines_.clear();
}

void LocalGroup::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
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
  std::exception_ptr first;
  for (const auto& e : errors_)
    if (e && !first) first = e;
  if (!first) return;
  // A failed rank aborted the group's communicator, so no rank can rely on it any more.
  broken_ = message_of(first);
  std::rethrow_exception(first);
}

void LocalGroup::on_all(const std::function<void(Engine&)>& fn) {
  run([&](int r) { fn(*engines_[static_cast<size_t>(r)]); });
}

}  // namespace tpdraft::engine
