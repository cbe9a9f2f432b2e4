// The communicator interface the drafter is written against: the collectives tensor
// parallelism needs, with byte and call counters. Implementations: single rank (here), and the
// in-process, MPI and NCCL ones. Buffers are of the backend the drafter runs on.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tpdraft::parallel {

// Per-operation counters: calls made and payload bytes this rank passed in (all-reduce: the
// buffer; all-gather: its own block; broadcast: the buffer, on the root and the receivers alike).
struct CommStats {
  uint64_t all_reduce_calls = 0, all_reduce_bytes = 0;  // f32 and bf16 together
  uint64_t all_gather_calls = 0, all_gather_bytes = 0;
  uint64_t broadcast_calls = 0, broadcast_bytes = 0;
  uint64_t barrier_calls = 0;
  double seconds = 0;  // wall time spent inside collectives
  uint64_t total_bytes() const { return all_reduce_bytes + all_gather_bytes + broadcast_bytes; }
  // The counts of `b` added (or taken away); seconds too.
  CommStats& operator+=(const CommStats& b);
  CommStats& operator-=(const CommStats& b);
};

inline CommStats& CommStats::operator+=(const CommStats& b) {
  all_reduce_calls += b.all_reduce_calls, all_reduce_bytes += b.all_reduce_bytes;
  all_gather_calls += b.all_gather_calls, all_gather_bytes += b.all_gather_bytes;
  broadcast_calls += b.broadcast_calls, broadcast_bytes += b.broadcast_bytes;
  barrier_calls += b.barrier_calls;
  seconds += b.seconds;
  return *this;
}

inline CommStats& CommStats::operator-=(const CommStats& b) {
  all_reduce_calls -= b.all_reduce_calls, all_reduce_bytes -= b.all_reduce_bytes;
  all_gather_calls -= b.all_gather_calls, all_gather_bytes -= b.all_gather_bytes;
  broadcast_calls -= b.broadcast_calls, broadcast_bytes -= b.broadcast_bytes;
  barrier_calls -= b.barrier_calls;
  seconds -= b.seconds;
  return *this;
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // In place: data[i] = sum over ranks of data[i].
  virtual void all_reduce_sum(float* data, size_t count) = 0;
  // In place on bf16 bits: the sum is formed in f32 and rounded to bf16 once at the end, so the
  // result does not depend on how many partial sums were rounded on the way; identical on all ranks.
  virtual void all_reduce_sum_bf16(uint16_t* data, size_t count) = 0;
  // recv holds size() blocks of `bytes` each, block r from rank r.
  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Tells the peers to give up (a failing rank calls this before exiting).
  virtual void abort(const std::string& reason) = 0;

  // Graph capture (kernels::Ops::begin_capture): whether all_reduce_sum on backend buffers may be
  // issued while the backend captures, becoming part of the graph (NCCL enqueues on the captured
  // stream; one rank has nothing to move). Otherwise the caller runs it between graph segments.
  virtual bool can_capture() const { return false; }
  // After replaying a graph that holds collectives: waits until they are done, with this
  // communicator's own error and hang detection; `what` names the graph in errors.
  virtual void wait_replayed(const std::string& what) { (void)what; }

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }
  // Counts collectives that ran inside a replayed graph (they pass no host call to count them).
  void count_replayed(const CommStats& captured) { stats_ += captured; }
  // Takes back the counts of collectives issued into a graph during its capture (they ran not then).
  void uncount_captured(const CommStats& captured) { stats_ -= captured; }

 protected:
  // Adds the wall time of one collective to stats_.seconds; a scope guard, so a collective that
  // throws is timed too.
  class Timed {
   public:
    explicit Timed(CommStats& stats) : stats_(stats), start_(std::chrono::steady_clock::now()) {}
    ~Timed() {
      stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    CommStats& stats_;
    std::chrono::steady_clock::time_point start_;
  };

  CommStats stats_;
};

// tp = 1: every collective is the identity (counted, nothing moves).
std::unique_ptr<Communicator> make_single_rank();

}  // namespace tpdraft::parallel
