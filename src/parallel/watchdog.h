// A watchdog over one communicator's collectives: when a collective has waited longer than a
// limit for its peers (a rank that was stopped, or that died without a trace), the waiting rank
// aborts the communicator naming the collective, so the job ends instead of hanging (MPI: the
// launcher stops every rank; in-process ranks: every waiting rank throws).
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

#include "parallel/communicator.h"

namespace tpdraft::parallel {

class CollectiveWatchdog {
 public:
  // seconds <= 0: no watchdog. The communicator must outlive the watchdog.
  CollectiveWatchdog(Communicator& comm, double seconds);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

 private:
  void watch();

  Communicator& comm_;
  const double limit_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tpdraft::parallel
