// Thread pool implementation: a region is published under the mutex with a new generation; the
// caller and any worker that is running claim its chunks through one atomic counter.
#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <system_error>

#include "core/bounds.h"
#include "core/error.h"

namespace tpdraft {

namespace {

// How long a worker looks for the next region before it sleeps.
constexpr std::chrono::microseconds kSpin{50};

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = machine_cores();
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) {
    try {
      workers_.emplace_back([this, i] { worker_loop(i); });
    } catch (const std::system_error& e) {
      stop_and_join();
      TPDRAFT_FAIL("cannot start CPU worker thread {} of {}: {} (lower the thread count, or raise the process's "
                   "memory or thread limits)",
                   i + 1, threads, e.what());
    }
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

int ThreadPool::claim(uint32_t generation) {
  uint64_t v = next_.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(v >> 32) != generation) return -1;
    const int chunk = static_cast<int>(v & 0xffff), chunks = static_cast<int>((v >> 16) & 0xffff);
    if (chunk >= chunks) return -1;
    if (next_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) return chunk;
  }
}

void ThreadPool::run_chunk(int chunk, int worker) {
  const int64_t begin = chunk * chunk_;
  const int64_t end = std::min(n_, begin + chunk_);
  if (begin < end) (*job_)(begin, end, worker);
  unfinished_.fetch_sub(1, std::memory_order_acq_rel);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int chunks = static_cast<int>(std::min<int64_t>({size(), units, 0xffff}));
  if (chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  uint32_t generation;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    n_ = n;
    chunk_ = ((units + chunks - 1) / chunks) * grain;
    unfinished_.store(chunks, std::memory_order_relaxed);
    generation = generation_.load() + 1;
    next_.store(static_cast<uint64_t>(generation) << 32 | static_cast<uint64_t>(chunks) << 16, std::memory_order_release);
    generation_.store(generation, std::memory_order_release);
  }
  wake_.notify_all();
  // The workers hold &fn until their chunks are done: an exception from this thread's chunk
  // stops it claiming more and waits for theirs before it leaves, or fn would die under them.
  std::exception_ptr failure;
  try {
    for (int c = claim(generation); c >= 0; c = claim(generation)) run_chunk(c, 0);
  } catch (...) {
    failure = std::current_exception();
    unfinished_.fetch_sub(1, std::memory_order_acq_rel);  // run_chunk counts only the chunks that return
  }
  while (unfinished_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  if (failure) std::rethrow_exception(failure);
}

void ThreadPool::worker_loop(int index) {
  uint32_t seen = 0;
  for (;;) {
    // Spin a little: the next region usually follows within microseconds.
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (int spin = 0; generation_.load(std::memory_order_acquire) == seen; ++spin) {
      cpu_relax();
      if (spin % 64 == 63 && std::chrono::steady_clock::now() > until) break;
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    // The region's fields were written before its generation; a claim succeeds only while that
    // generation is current, and the caller waits for every claimed chunk before the next.
    for (int c = claim(seen); c >= 0; c = claim(seen)) run_chunk(c, index);
  }
}

}  // namespace tpdraft
