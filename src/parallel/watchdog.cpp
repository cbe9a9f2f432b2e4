// The watchdog thread: a look at the communicator every tenth of the limit (at most a second).
#include "parallel/watchdog.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace tpdraft::parallel {

CollectiveWatchdog::CollectiveWatchdog(Communicator& comm, double seconds) : comm_(comm), limit_(seconds) {
  if (limit_ > 0) thread_ = std::thread([this] { watch(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void CollectiveWatchdog::watch() {
  const auto period = std::chrono::duration<double>(std::min(1.0, limit_ / 10));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stop_; })) {
    const char* op = nullptr;
    double waited = 0;
    if (!comm_.in_flight(&op, &waited) || waited < limit_) continue;
    const std::string reason =
        fmt::format("rank {}: {} has waited {:.1f} s for the other ranks (limit {} s, --comm-timeout): a rank is "
                    "stopped or gone; ending the job",
                    comm_.rank(), op, waited, limit_);
    comm_.abort(reason);  // every implementation reports the reason as it ends the waiting
    return;
  }
}

}  // namespace tpdraft::parallel
