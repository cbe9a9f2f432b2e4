// A small persistent thread pool: parallel_for splits [0, n) into contiguous chunks, one per
// worker, and returns when all are done. Workers spin briefly before sleeping, because a draft
// issues a few hundred short parallel regions and a cold wake-up costs tens of microseconds.
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
  explicit ThreadPool(int threads);  // 0: hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // fn(begin, end, worker) over a partition of [0, n) into at most size() chunks, each a
  // multiple of `grain` long (except the last). Runs inline when there is one chunk. An
  // exception from the calling thread's chunk is rethrown once the workers are done; fn must not
  // throw on a worker thread (that ends the process).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain = 1);

 private:
  void worker_loop(int index);
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
  int chunks_ = 0;
};

}  // namespace tpdraft
