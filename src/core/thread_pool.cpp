// Thread pool implementation: generation counter + spin-then-sleep workers.
#include "core/thread_pool.h"

#include <algorithm>
#include <exception>

namespace tpdraft {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int chunks = static_cast<int>(std::min<int64_t>(size(), units));
  if (chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  const int64_t chunk = ((units + chunks - 1) / chunks) * grain;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    n_ = n;
    chunk_ = chunk;
    chunks_ = chunks;
    pending_.store(chunks - 1);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  // The workers hold &fn until they are done: an exception from this thread's chunk waits for
  // them before it leaves, or fn would die under them and the next region inherit their count.
  std::exception_ptr failure;
  try {
    fn(0, std::min(n, chunk), 0);
  } catch (...) {
    failure = std::current_exception();
  }
  while (pending_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  if (failure) std::rethrow_exception(failure);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little: the next region usually follows within microseconds.
    for (int spin = 0; spin < 20000 && generation_.load(std::memory_order_acquire) == seen; ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
    }
    if (stop_.load()) return;
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n, chunk;
    int chunks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      seen = generation_.load();
      job = job_;
      n = n_;
      chunk = chunk_;
      chunks = chunks_;
    }
    if (index < chunks) {
      const int64_t begin = index * chunk;
      const int64_t end = std::min(n, begin + chunk);
      if (begin < end) (*job)(begin, end, index);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
}

}  // namespace tpdraft
