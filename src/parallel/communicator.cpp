// Counting and timing of every collective, once for all communicators: the call is counted
// before it runs, marked in flight while it runs, and its wall time is added even when it throws.
#include "parallel/communicator.h"

#include <chrono>

namespace tpdraft::parallel {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

// One collective on the calling rank: marks it in flight for the watchdog and adds its wall
// time to the counters when it ends, by return or by exception.
class Collective {
 public:
  Collective(Communicator& comm, const char* op) : comm_(comm), start_(now_ns()) {
    comm_.busy_since_ns_.store(start_, std::memory_order_relaxed);
    comm_.busy_op_.store(op, std::memory_order_release);
  }
  ~Collective() {
    comm_.busy_op_.store(nullptr, std::memory_order_release);
    comm_.stats_.seconds += static_cast<double>(now_ns() - start_) * 1e-9;
  }
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

 private:
  Communicator& comm_;
  int64_t start_;
};

bool Communicator::in_flight(const char** op, double* seconds) const {
  const char* what = busy_op_.load(std::memory_order_acquire);
  if (what == nullptr) return false;
  *op = what;
  *seconds = static_cast<double>(now_ns() - busy_since_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return true;
}

void Communicator::all_reduce_sum(float* data, size_t count) {
  Collective c(*this, "all_reduce_sum");
  ++stats_.all_reduce_calls;
  stats_.all_reduce_bytes += count * sizeof(float);
  do_all_reduce_sum(data, count);
}

void Communicator::all_gather(const void* send, void* recv, size_t bytes) {
  Collective c(*this, "all_gather");
  ++stats_.all_gather_calls;
  stats_.all_gather_bytes += bytes;
  do_all_gather(send, recv, bytes);
}

void Communicator::broadcast(void* data, size_t bytes, int root) {
  Collective c(*this, "broadcast");
  ++stats_.broadcast_calls;
  stats_.broadcast_bytes += bytes;
  do_broadcast(data, bytes, root);
}

void Communicator::barrier() {
  Collective c(*this, "barrier");
  ++stats_.barrier_calls;
  do_barrier();
}

}  // namespace tpdraft::parallel
