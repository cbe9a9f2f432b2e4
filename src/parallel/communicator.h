// The communicator interface the drafter is written against: the collectives tensor
// parallelism needs, with byte and call counters. Implementations: single rank (here), and the
// in-process, MPI and NCCL ones. Buffers are of the backend the drafter runs on.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tpdraft::parallel {

// Per-operation counters: calls made and payload bytes this rank passed in (all-reduce: the
// buffer; all-gather: its own block; broadcast: the buffer, on the root and the receivers alike).
struct CommStats {
  uint64_t all_reduce_calls = 0, all_reduce_bytes = 0;
  uint64_t all_gather_calls = 0, all_gather_bytes = 0;
  uint64_t broadcast_calls = 0, broadcast_bytes = 0;
  uint64_t barrier_calls = 0;
  double seconds = 0;  // wall time spent inside collectives
  // How `seconds` was taken: "host" (around each call), or "events" where a device communicator
  // put the time between CUDA events around its all-reduces in place of their enqueue's.
  const char* timing = "host";
  uint64_t total_bytes() const { return all_reduce_bytes + all_gather_bytes + broadcast_bytes; }
  // The counts of `b` added (or taken away); seconds too.
  CommStats& operator+=(const CommStats& b) { return combine(b, [](auto& x, auto y) { x += y; }); }
  CommStats& operator-=(const CommStats& b) { return combine(b, [](auto& x, auto y) { x -= y; }); }
  // op(field, b's field) for every counter and the seconds: the one list both operators walk.
  template <typename Op>
  CommStats& combine(const CommStats& b, Op op) {
    op(all_reduce_calls, b.all_reduce_calls);
    op(all_reduce_bytes, b.all_reduce_bytes);
    op(all_gather_calls, b.all_gather_calls);
    op(all_gather_bytes, b.all_gather_bytes);
    op(broadcast_calls, b.broadcast_calls);
    op(broadcast_bytes, b.broadcast_bytes);
    op(barrier_calls, b.barrier_calls);
    op(seconds, b.seconds);
    return *this;
  }
};

class ForwardRecorder;

// The collectives are public, non-virtual: they count and time the call here, once for every
// implementation, and hand the work to the implementation's do_* function.
class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string name() const = 0;

  // In place: data[i] = sum over ranks of data[i].
  void all_reduce_sum(float* data, size_t count);
  // recv holds size() blocks of `bytes` each, block r from rank r.
  void all_gather(const void* send, void* recv, size_t bytes);
  void broadcast(void* data, size_t bytes, int root);
  void barrier();
  // Tells the peers to give up (a failing rank calls this before exiting).
  virtual void abort(const std::string& reason) = 0;

  // Graph capture (kernels::Ops::begin_capture): whether all_reduce_sum on backend buffers may be
  // issued while the backend captures, becoming part of the graph (NCCL enqueues on the captured
  // stream; one rank has nothing to move). Otherwise the caller runs it between graph segments.
  virtual bool can_capture() const { return false; }
  // How all-reduces of backend buffers travel, in words for `bench` ("" where nothing moves or
  // the name says it all).
  virtual std::string all_reduce_path() const { return {}; }
  // Waits until the collectives this rank has queued without waiting for them (those of a
  // replayed graph; NCCL's all-reduces of device buffers, which only enqueue) are done, with
  // this communicator's own error and hang detection; `what` names them in errors. Every other
  // collective returns done.
  virtual void wait_pending(const std::string& what) { (void)what; }

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

  // The collective in progress and how long it has run: false when none runs. Safe to call from
  // another thread (CollectiveWatchdog does).
  bool in_flight(const char** op, double* seconds) const;

 protected:
  explicit Communicator(int rank = 0, int size = 1) : rank_(rank), size_(size) {}
  virtual void do_all_reduce_sum(float* data, size_t count) = 0;
  virtual void do_all_gather(const void* send, void* recv, size_t bytes) = 0;
  virtual void do_broadcast(void* data, size_t bytes, int root) = 0;
  virtual void do_barrier() = 0;
  // The collectives that only queued work on a device stream took `host` seconds to queue; they
  // ran for `device` seconds there (read from events once done): the counters take the latter.
  void retime(double host, double device) { stats_.seconds += device - host, stats_.timing = "events"; }
  int rank_, size_;  // set once, as the implementation joins its group

 private:
  // Collectives captured into a graph run when it replays, not when they are issued: the class
  // that records forwards moves their counts accordingly.
  friend class ForwardRecorder;
  friend class Collective;
  CommStats stats_;
  std::atomic<const char*> busy_op_{nullptr};
  std::atomic<int64_t> busy_since_ns_{0};  // steady clock; meaningful while busy_op_ is set
};

// tp = 1: every collective is the identity (counted, nothing moves).
std::unique_ptr<Communicator> make_single_rank();

}  // namespace tpdraft::parallel
