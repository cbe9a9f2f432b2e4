// Counting and timing of every collective, once for all communicators: the call is counted
// before it runs and its wall time is added even when it throws.
#include "parallel/communicator.h"

#include <chrono>

namespace tpdraft::parallel {

namespace {

class Timed {
 public:
  explicit Timed(CommStats& stats) : stats_(stats), start_(std::chrono::steady_clock::now()) {}
  ~Timed() { stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  CommStats& stats_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

void Communicator::all_reduce_sum(float* data, size_t count) {
  Timed timed(stats_);
  ++stats_.all_reduce_calls;
  stats_.all_reduce_bytes += count * sizeof(float);
  do_all_reduce_sum(data, count);
}

void Communicator::all_gather(const void* send, void* recv, size_t bytes) {
  Timed timed(stats_);
  ++stats_.all_gather_calls;
  stats_.all_gather_bytes += bytes;
  do_all_gather(send, recv, bytes);
}

void Communicator::broadcast(void* data, size_t bytes, int root) {
  Timed timed(stats_);
  ++stats_.broadcast_calls;
  stats_.broadcast_bytes += bytes;
  do_broadcast(data, bytes, root);
}

void Communicator::barrier() {
  Timed timed(stats_);
  ++stats_.barrier_calls;
  do_barrier();
}

}  // namespace tpdraft::parallel
