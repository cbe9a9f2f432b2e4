// The in-process communicator at N = 1, 2, 3, 4, 8 ranks: all-reduce, all-gather,
// broadcast and barrier on exactly representable inputs checked value by value, bit-identical
// results on random floats, exact counters, and the failure paths (abort, mismatched calls, a rank
// that fails or leaves) which must raise errors naming the ranks instead of hanging.
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/thread_comm.h"

namespace tpdraft::parallel {
namespace {

// Ends the process if a test is still running after `seconds`: a hung collective fails fast
// instead of holding the test runner until its timeout.
class Watchdog {
 public:
  explicit Watchdog(int seconds)
      : thread_([this, seconds] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) {
            std::fprintf(stderr, "test_collectives: a test is still running after %d s (hung collective)\n", seconds);
            std::_Exit(2);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// Runs fn(rank) on one thread per communicator; returns each rank's error message ("" if none).
std::vector<std::string> run_each(std::vector<std::unique_ptr<Communicator>>& comms,
                                  const std::function<void(Communicator&)>& fn) {
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

uint8_t pattern_byte(int rank, size_t j) { return static_cast<uint8_t>(rank * 37 + j * 11 + 5); }

class Collectives : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  Watchdog watchdog_{30};
};

TEST_P(Collectives, AllReduceF32ExactIntegers) {
  const int n = this->n();
  run_ranks(n, [n](Communicator& comm) {
    const int r = comm.rank();
    for (size_t count : {0, 1, 7, 1000, 4099}) {
      std::vector<float> x(count);
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((i % 2 ? -1.0 : 1.0) * (r * 1000.0 + i));
      comm.all_reduce_sum(x.data(), count);
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) {
        const double expect = (i % 2 ? -1.0 : 1.0) * (1000.0 * n * (n - 1) / 2 + double(n) * i);
        if (static_cast<double>(x[i]) != expect && bad++ == 0)
          ADD_FAILURE() << "rank " << r << " count " << count << " [" << i << "] = " << x[i] << ", expected " << expect;
      }
      EXPECT_EQ(bad, 0u) << "rank " << r << " count " << count;
    }
  });
}

TEST_P(Collectives, AllGatherDistinctBlocks) {
  const int n = this->n();
  run_ranks(n, [n](Communicator& comm) {
    const int r = comm.rank();
    for (size_t bytes : {0, 1, 3, 17, 4097}) {
      for (bool in_place : {false, true}) {
        std::vector<uint8_t> recv(bytes * n, 0xee), send(bytes);
        for (size_t j = 0; j < bytes; ++j) send[j] = pattern_byte(r, j);
        const void* src = send.data();
        if (in_place) {
          if (bytes > 0) std::memcpy(recv.data() + bytes * r, send.data(), bytes);  // memcpy wants non-null pointers
          src = recv.data() + bytes * r;
        }
        comm.all_gather(src, recv.data(), bytes);
        size_t bad = 0;
        for (int k = 0; k < n; ++k)
          for (size_t j = 0; j < bytes; ++j) bad += recv[k * bytes + j] != pattern_byte(k, j);
        EXPECT_EQ(bad, 0u) << "rank " << r << " bytes " << bytes << " in place " << in_place;
      }
    }
  });
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  const int n = this->n();
  run_ranks(n, [n](Communicator& comm) {
    const int r = comm.rank();
    for (size_t bytes : {0, 1, 13, 1000}) {
      for (int root = 0; root < n; ++root) {
        std::vector<uint8_t> data(bytes);
        for (size_t j = 0; j < bytes; ++j) data[j] = pattern_byte(r, j);
        comm.broadcast(data.data(), bytes, root);
        size_t bad = 0;
        for (size_t j = 0; j < bytes; ++j) bad += data[j] != pattern_byte(root, j);
        EXPECT_EQ(bad, 0u) << "rank " << r << " root " << root << " bytes " << bytes;
      }
    }
  });
}

// Nobody leaves a barrier before everyone has arrived: after it every rank sees all increments.
TEST_P(Collectives, BarrierSeparatesRounds) {
  const int n = this->n();
  std::atomic<int> arrivals{0};
  run_ranks(n, [n, &arrivals](Communicator& comm) {
    for (int round = 1; round <= 20; ++round) {
      arrivals.fetch_add(1);
      comm.barrier();
      EXPECT_EQ(arrivals.load(), n * round) << "rank " << comm.rank() << " round " << round;
      comm.barrier();  // keeps the next round's increments out of this round's check
    }
  });
}

TEST_P(Collectives, CountersAreExact) {
  const int n = this->n();
  run_ranks(n, [n](Communicator& comm) {
    std::vector<float> f(10);
    std::vector<uint8_t> block(5), gathered(5 * n), bytes(7);
    comm.all_reduce_sum(f.data(), f.size());
    comm.all_reduce_sum(f.data(), 3);
    comm.all_gather(block.data(), gathered.data(), block.size());
    comm.broadcast(bytes.data(), bytes.size(), n - 1);
    comm.broadcast(bytes.data(), 2, 0);
    for (int i = 0; i < 3; ++i) comm.barrier();
    const CommStats& s = comm.stats();
    EXPECT_EQ(s.all_reduce_calls, 2u);
    EXPECT_EQ(s.all_reduce_bytes, 10u * 4 + 3u * 4);
    EXPECT_EQ(s.all_gather_calls, 1u);
    EXPECT_EQ(s.all_gather_bytes, 5u);
    EXPECT_EQ(s.broadcast_calls, 2u);
    EXPECT_EQ(s.broadcast_bytes, 9u);
    EXPECT_EQ(s.barrier_calls, 3u);
    EXPECT_EQ(s.total_bytes(), 52u + 5u + 9u);
    EXPECT_GE(s.seconds, 0.0);
    EXPECT_EQ(comm.size(), n);
    EXPECT_EQ(comm.name(), "threads");
    comm.reset_stats();
    EXPECT_EQ(comm.stats().total_bytes(), 0u);
    EXPECT_EQ(comm.stats().all_reduce_calls, 0u);
  });
}

// Random non-integer inputs: every rank must hold the same bits, those of the sum taken in rank
// order 0..n-1.
TEST_P(Collectives, RandomSumsAreBitIdenticalInRankOrder) {
  const int n = this->n();
  const size_t count = 1001;
  std::vector<std::vector<float>> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    std::mt19937 gen(1234 + r);
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    for (size_t i = 0; i < count; ++i) in[r].push_back(dist(gen));
  }
  run_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    out[r] = in[r];
    comm.all_reduce_sum(out[r].data(), count);
  });
  for (size_t i = 0; i < count; ++i) {
    float sum = in[0][i];
    for (int k = 1; k < n; ++k) sum += in[k][i];
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(std::memcmp(&out[r][i], &sum, 4), 0) << "rank " << r << " [" << i << "] " << out[r][i] << " vs " << sum;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(1, 2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) { return "n" + std::to_string(info.param); });

TEST(ThreadComm, AbortWakesRanksWaitingInCollectives) {
  Watchdog watchdog(10);
  auto comms = make_thread_group(4);
  const auto errors = run_each(comms, [](Communicator& comm) {
    std::vector<float> x(8, 1.0f);
    std::vector<uint8_t> g(4 * 3);
    switch (comm.rank()) {
      case 0: comm.all_reduce_sum(x.data(), x.size()); break;
      case 1:
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the others start waiting
        comm.abort("disk full");
        break;
      case 2: comm.barrier(); break;
      default: comm.all_gather(g.data(), g.data(), 3); break;
    }
  });
  EXPECT_EQ(errors[1], "");
  for (int r : {0, 2, 3})
    EXPECT_EQ(errors[r], "rank " + std::to_string(r) + ": collective aborted by rank 1: disk full");
  // A rank entering a collective afterwards fails at once too, the aborting one included.
  for (int r = 0; r < 4; ++r) {
    try {
      comms[r]->barrier();
      ADD_FAILURE() << "rank " << r << ": barrier of an aborted group returned";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "rank " + std::to_string(r) + ": collective aborted by rank 1: disk full");
    }
  }
}

TEST(ThreadComm, MismatchedCallsThrowOnEveryRank) {
  Watchdog watchdog(10);
  auto comms = make_thread_group(3);
  auto errors = run_each(comms, [](Communicator& comm) {
    std::vector<float> x(5);
    comm.all_reduce_sum(x.data(), comm.rank() == 1 ? 5 : 4);
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(errors[r], "rank " + std::to_string(r) +
                             ": mismatched collectives: rank 0 called all_reduce_sum(f32, 4 elements), rank 1 called "
                             "all_reduce_sum(f32, 5 elements)");

  auto comms2 = make_thread_group(2);
  errors = run_each(comms2, [](Communicator& comm) {
    uint8_t b = 0;
    comm.broadcast(&b, 1, 7);
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(errors[r], "rank " + std::to_string(r) + ": broadcast root 7 is not a rank of a group of 2");
}

TEST(ThreadComm, RunRanksRethrowsTheFirstFailureWithItsRank) {
  Watchdog watchdog(10);
  try {
    run_ranks(4, [](Communicator& comm) {
      std::vector<float> x(16, 1.0f);
      comm.all_reduce_sum(x.data(), x.size());
      if (comm.rank() == 2) throw std::runtime_error("shard file missing");
      comm.all_reduce_sum(x.data(), x.size());  // the others wait here until the abort
    });
    FAIL() << "run_ranks returned";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank 2: shard file missing");
  }
  // An error that already names its rank is not prefixed twice.
  try {
    run_ranks(2, [](Communicator& comm) {
      TPDRAFT_CHECK(comm.rank() != 1, "rank {}: bad input", comm.rank());
    });
    FAIL() << "run_ranks returned";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank 1: bad input");
  }
}

TEST(ThreadComm, RankThatLeavesEarlyDoesNotHangThePeers) {
  Watchdog watchdog(10);
  try {
    run_ranks(3, [](Communicator& comm) {
      if (comm.rank() != 0) comm.barrier();
    });
    FAIL() << "run_ranks returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("collective cannot complete: rank 0 has left the group"), std::string::npos)
        << e.what();
  }
}

TEST(ThreadComm, GroupSizeMustBePositive) {
  EXPECT_THROW(make_thread_group(0), Error);
}

}  // namespace
}  // namespace tpdraft::parallel
