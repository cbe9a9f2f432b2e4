// A small persistent thread pool: parallel_for splits [0, n) into contiguous chunks, at most one
// per thread, and returns when all are done. Chunks are claimed, not assigned: the calling thread
// runs every chunk that no worker has taken yet, so a region never waits for a worker the
// scheduler has not run (a drafter beside a busy target engine shares its cores). Workers spin
// for a few tens of microseconds after a region, because a draft issues a few hundred short
// regions back to back, and then sleep so that an idle or crowded pool costs no core.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tpdraft {

class ThreadPool {
 public:
  // 0: hardware concurrency. Throws tpdraft::Error (having joined the workers it started) when a
  // worker thread cannot be started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // fn(begin, end, worker) over a partition of [0, n) into at most size() chunks, each a
  // multiple of `grain` long (except the last). `worker` names the thread (0: the caller), for
  // per-thread scratch; one thread may run several chunks of a region. Runs inline when there is
  // one chunk. An exception from the calling thread's chunk is rethrown once the chunks the
  // workers took are done; fn must not throw on a worker thread (that ends the process).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain = 1);

 private:
  void worker_loop(int index);
  // Claims the next chunk of region `generation`; -1 when none is left (or the region is over).
  int claim(uint32_t generation);
  void run_chunk(int chunk, int worker);
  void stop_and_join();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint32_t> generation_{0};
  // generation << 32 | chunks << 16 | next unclaimed chunk, in one word: a claim checks all three
  // at once, so a worker late for a region cannot claim from the next.
  std::atomic<uint64_t> next_{0};
  std::atomic<int> unfinished_{0};  // chunks of the current region not yet done
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
};

}  // namespace tpdraft
