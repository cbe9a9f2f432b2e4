// ThreadPool::parallel_for on its own: every index of [0, n) covered exactly once for many n,
// grain and pool sizes, chunk boundaries on multiples of grain, worker indices in range and tied
// to one thread, the inline single-chunk case, thousands of back-to-back regions, regions after
// the workers fell asleep (a lost wake-up shows as a worker that never joins), exceptions, and a
// pool whose threads cannot start.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <pthread.h>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/thread_pool.h"

namespace tpdraft {
namespace {

// One call of fn as parallel_for made it.
struct Chunk {
  int64_t begin = 0, end = 0;
  int worker = 0;
  std::thread::id thread;
};

// The chunks of one parallel_for over [0, n), ordered by begin.
std::vector<Chunk> record_chunks(ThreadPool& pool, int64_t n, int64_t grain) {
  std::mutex mu;
  std::vector<Chunk> chunks;
  pool.parallel_for(
      n,
      [&](int64_t begin, int64_t end, int worker) {
        std::lock_guard<std::mutex> lock(mu);
        chunks.push_back({begin, end, worker, std::this_thread::get_id()});
      },
      grain);
  std::sort(chunks.begin(), chunks.end(), [](const Chunk& a, const Chunk& b) { return a.begin < b.begin; });
  return chunks;
}

// Each index of [0, n) lies in exactly one chunk, and no chunk is empty.
void expect_exact_cover(const std::vector<Chunk>& chunks, int64_t n) {
  std::vector<int> hits(static_cast<size_t>(n), 0);
  for (const Chunk& c : chunks) {
    EXPECT_LT(c.begin, c.end) << "empty chunk at " << c.begin;
    ASSERT_GE(c.begin, 0);
    ASSERT_LE(c.end, n);
    for (int64_t i = c.begin; i < c.end; ++i) ++hits[static_cast<size_t>(i)];
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << "index " << i << " of " << n;
}

// Boundaries on multiples of grain (the end of the range excepted), worker indices in
// [0, size), at most min(size, ceil(n / grain)) chunks, the calling thread as worker 0.
void expect_chunk_shape(const std::vector<Chunk>& chunks, int64_t n, int64_t grain, int pool_size) {
  const int64_t units = (n + grain - 1) / grain;
  EXPECT_LE(static_cast<int64_t>(chunks.size()), std::min<int64_t>(pool_size, units));
  for (const Chunk& c : chunks) {
    EXPECT_EQ(c.begin % grain, 0) << "begin " << c.begin << " grain " << grain;
    EXPECT_TRUE(c.end % grain == 0 || c.end == n) << "end " << c.end << " grain " << grain << " n " << n;
    ASSERT_GE(c.worker, 0);
    ASSERT_LT(c.worker, pool_size);
    EXPECT_EQ(c.worker == 0, c.thread == std::this_thread::get_id()) << "worker " << c.worker;
  }
}

// The chunks of one region over [0, n) in which every chunk waits (up to a minute) until
// `threads` distinct threads have run one: the region shows that many threads joined it however
// slowly the scheduler brings them, and a worker that was never woken shows as a failure.
std::vector<Chunk> record_chunks_of(ThreadPool& pool, int64_t n, size_t threads) {
  std::mutex mu;
  std::condition_variable joined;
  std::vector<Chunk> chunks;
  std::vector<std::thread::id> ids;
  pool.parallel_for(n, [&](int64_t begin, int64_t end, int worker) {
    std::unique_lock<std::mutex> lock(mu);
    chunks.push_back({begin, end, worker, std::this_thread::get_id()});
    if (std::find(ids.begin(), ids.end(), std::this_thread::get_id()) == ids.end()) ids.push_back(std::this_thread::get_id());
    joined.notify_all();
    joined.wait_for(lock, std::chrono::minutes(1), [&] { return ids.size() >= threads; });
  });
  EXPECT_GE(ids.size(), threads) << "threads that ran a chunk of the region";
  std::sort(chunks.begin(), chunks.end(), [](const Chunk& a, const Chunk& b) { return a.begin < b.begin; });
  return chunks;
}

TEST(ThreadPool, SizeCountsTheCallingThread) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
  }
  ThreadPool automatic(0);
  EXPECT_GE(automatic.size(), 1);
}

TEST(ThreadPool, CoversEveryIndexOnceForManyShapes) {
  const int64_t sizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 64, 100, 257, 1000};
  const int64_t grains[] = {1, 2, 3, 4, 7, 16, 64, 1000, 5000};
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadPool pool(threads);
    for (int64_t n : sizes) {
      for (int64_t grain : grains) {
        SCOPED_TRACE(::testing::Message() << "pool " << threads << " n " << n << " grain " << grain);
        const std::vector<Chunk> chunks = record_chunks(pool, n, grain);
        if (n == 0) {
          EXPECT_TRUE(chunks.empty());
        }
        expect_exact_cover(chunks, n);
        expect_chunk_shape(chunks, n, grain, pool.size());
      }
    }
  }
}

TEST(ThreadPool, GrainBelowOneActsAsOne) {
  ThreadPool pool(3);
  for (int64_t grain : {0, -5}) {
    const std::vector<Chunk> chunks = record_chunks(pool, 10, grain);
    expect_exact_cover(chunks, 10);
    expect_chunk_shape(chunks, 10, 1, pool.size());
  }
}

// Every thread of the pool can take a chunk (the region waits for all four to show).
TEST(ThreadPool, SpreadsWorkOverEveryThread) {
  ThreadPool pool(4);
  const std::vector<Chunk> chunks = record_chunks_of(pool, 400, 4);
  expect_exact_cover(chunks, 400);
  expect_chunk_shape(chunks, 400, 1, pool.size());
  EXPECT_EQ(chunks.size(), 4u);
}

// A worker index names one thread for the pool's life (callers keep per-worker scratch).
TEST(ThreadPool, WorkerIndexAlwaysNamesTheSameThread) {
  ThreadPool pool(4);
  std::map<int, std::thread::id> owner;
  for (int call = 0; call < 100; ++call) {
    for (const Chunk& c : record_chunks(pool, 4 + call % 13, 1)) {
      auto it = owner.emplace(c.worker, c.thread).first;
      ASSERT_EQ(it->second, c.thread) << "worker " << c.worker << " moved threads at call " << call;
    }
  }
  EXPECT_EQ(owner.at(0), std::this_thread::get_id()) << "worker 0 is the calling thread";
}

TEST(ThreadPool, OneChunkRunsInlineOnTheCallingThread) {
  ThreadPool pool(4);
  struct Shape {
    int64_t n, grain;
  };
  for (Shape s : {Shape{1, 1}, Shape{5, 8}, Shape{64, 64}, Shape{3, 1000}}) {
    const std::vector<Chunk> chunks = record_chunks(pool, s.n, s.grain);
    ASSERT_EQ(chunks.size(), 1u) << "n " << s.n << " grain " << s.grain;
    EXPECT_EQ(chunks[0].begin, 0);
    EXPECT_EQ(chunks[0].end, s.n);
    EXPECT_EQ(chunks[0].worker, 0);
    EXPECT_EQ(chunks[0].thread, std::this_thread::get_id());
  }
}

TEST(ThreadPool, PoolOfOneRunsEverythingInline) {
  ThreadPool pool(1);
  for (int64_t n : {1, 2, 17, 1000}) {
    const std::vector<Chunk> chunks = record_chunks(pool, n, 1);
    ASSERT_EQ(chunks.size(), 1u);
    EXPECT_EQ(chunks[0].end - chunks[0].begin, n);
    EXPECT_EQ(chunks[0].thread, std::this_thread::get_id());
  }
}

// Sum of i over [0, n) by the pool, for many consecutive regions of varying shape: a region
// that returned before all its chunks ran shows as a wrong sum, a lost wake-up as a hang.
TEST(ThreadPool, ThousandsOfBackToBackRegions) {
  ThreadPool pool(3);
  for (int call = 0; call < 1500; ++call) {
    const int64_t n = 1 + call % 37;
    std::atomic<int64_t> sum{0};
    pool.parallel_for(n, [&](int64_t begin, int64_t end, int) {
      int64_t part = 0;
      for (int64_t i = begin; i < end; ++i) part += i;
      sum.fetch_add(part);
    });
    ASSERT_EQ(sum.load(), n * (n - 1) / 2) << "call " << call << " n " << n;
  }
}

// Pauses between regions long enough for the workers to stop spinning and sleep on the
// condition variable: each region must still wake them.
TEST(ThreadPool, WakesWorkersThatFellAsleep) {
  ThreadPool pool(3);
  for (int call = 0; call < 20; ++call) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const std::vector<Chunk> chunks = record_chunks_of(pool, 30, 3);
    expect_exact_cover(chunks, 30);
    ASSERT_EQ(chunks.size(), 3u) << "call " << call;
  }
}

TEST(ThreadPool, ExceptionFromAnInlineRegionReachesTheCaller) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(1, [](int64_t, int64_t, int) { throw std::runtime_error("inline"); }),
               std::runtime_error);
  expect_exact_cover(record_chunks(pool, 50, 1), 50);
}

// The calling thread's own chunk throws while the workers still run theirs: parallel_for must
// not return (and release fn) before they are done, and the pool must stay usable.
TEST(ThreadPool, ExceptionFromTheCallersChunkWaitsForTheWorkers) {
  ThreadPool pool(4);
  for (int attempt = 0; attempt < 5; ++attempt) {
    std::atomic<bool> thrown{false};
    std::atomic<int> finished{0};
    try {
      pool.parallel_for(4, [&](int64_t, int64_t, int worker) {
        if (worker == 0) {
          thrown.store(true);
          throw std::runtime_error("caller chunk");
        }
        while (!thrown.load()) std::this_thread::yield();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        finished.fetch_add(1);
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error&) {
      EXPECT_EQ(finished.load(), 3) << "parallel_for returned while workers still ran fn";
    }
    expect_exact_cover(record_chunks(pool, 40, 1), 40);
  }
}

// Threads that cannot start (here: a default stack larger than any mapping can be) make the
// constructor throw a tpdraft::Error naming the thread, after joining those that started; they
// once ended the process through std::terminate.
TEST(ThreadPool, AThreadThatCannotStartIsAnErrorNotTheEnd) {
  pthread_attr_t saved, huge;
  ASSERT_EQ(pthread_getattr_default_np(&saved), 0);
  ASSERT_EQ(pthread_attr_init(&huge), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&huge, size_t{1} << 46), 0);  // 64 TiB
  ASSERT_EQ(pthread_setattr_default_np(&huge), 0);
  std::string message;
  try {
    ThreadPool pool(4);
  } catch (const Error& e) {
    message = e.what();
  }
  pthread_setattr_default_np(&saved);
  pthread_attr_destroy(&huge);
  pthread_attr_destroy(&saved);
  EXPECT_NE(message.find("cannot start CPU worker thread 2 of 4"), std::string::npos) << message;
  ThreadPool after(3);  // the defaults restored, pools start again
  expect_exact_cover(record_chunks(after, 30, 1), 30);
}

// Not tested: fn throwing on a worker thread. The exception leaves the std::thread's function,
// which calls std::terminate; fn must not throw there.

}  // namespace
}  // namespace tpdraft
