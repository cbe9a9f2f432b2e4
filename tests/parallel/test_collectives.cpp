// The in-process communicator at N = 1, 2, 3, 4, 8 ranks: all-reduce, all-gather,
// broadcast and barrier on exactly representable inputs checked value by value, bit-identical
// results on random floats, exact counters, and the failure paths (abort, mismatched calls, a rank
// that fails or leaves) which must raise errors naming the ranks instead of hanging; and the
// in-process command channel, whose rank 0 waits for its followers.
#include <atomic>
#include <chrono>
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

#include "core/error.h"
#include "parallel/command.h"
#include "parallel/communicator.h"
#include "parallel/thread_comm.h"
#include "support/collective_checks.h"
#include "support/test_support.h"

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
  for (size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] { errors[r] = testing::error_of([&] { fn(*comms[r]); }); });
  for (auto& t : threads) t.join();
  return errors;
}

// Runs fn on n in-process ranks, which must fail: returns the error run_ranks raised.
std::string run_ranks_error(int n, const std::function<void(Communicator&)>& fn) {
  const std::string error = testing::error_of([&] { run_ranks(n, fn); });
  if (error.empty()) ADD_FAILURE() << "run_ranks returned";
  return error;
}

class Collectives : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  Watchdog watchdog_{30};
};

TEST_P(Collectives, AllReduceF32ExactIntegers) { run_ranks(n(), testing::check_all_reduce_exact); }
TEST_P(Collectives, AllGatherDistinctBlocks) { run_ranks(n(), testing::check_all_gather); }
TEST_P(Collectives, BroadcastFromEveryRoot) { run_ranks(n(), testing::check_broadcast); }

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
    testing::check_counters(comm, "threads");
    EXPECT_EQ(comm.size(), n);
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
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(testing::error_of([&] { comms[r]->barrier(); }),
              "rank " + std::to_string(r) + ": collective aborted by rank 1: disk full");
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
  const std::string error = run_ranks_error(4, [](Communicator& comm) {
    std::vector<float> x(16, 1.0f);
    comm.all_reduce_sum(x.data(), x.size());
    if (comm.rank() == 2) throw std::runtime_error("shard file missing");
    comm.all_reduce_sum(x.data(), x.size());  // the others wait here until the abort
  });
  EXPECT_EQ(error, "rank 2: shard file missing");
  // An error that already names its rank is not prefixed twice.
  const std::string named = run_ranks_error(2, [](Communicator& comm) {
    TPDRAFT_CHECK(comm.rank() != 1, "rank {}: bad input", comm.rank());
  });
  EXPECT_EQ(named, "rank 1: bad input");
}

TEST(ThreadComm, RankThatLeavesEarlyDoesNotHangThePeers) {
  Watchdog watchdog(10);
  const std::string error = run_ranks_error(3, [](Communicator& comm) {
    if (comm.rank() != 0) comm.barrier();
  });
  EXPECT_NE(error.find("collective cannot complete: rank 0 has left the group"), std::string::npos)
      << error;
}

TEST(ThreadComm, GroupSizeMustBePositive) {
  EXPECT_THROW(make_thread_group(0), Error);
}

// The in-process command channel: every follower gets every command in order, and settle returns
// only once each has finished the last one (its set-up first), with the first failure by rank.
TEST(Mailbox, SettleWaitsForEveryFollowerAndReturnsTheFirstFailureByRank) {
  Watchdog watchdog(10);
  Mailbox box(3);
  std::atomic<int> finished{0};
  std::vector<std::thread> followers;
  for (int r = 1; r < 3; ++r)
    followers.emplace_back([&, r] {
      const auto channel = box.channel(r);
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * r));  // a set-up, which settle waits for
      ++finished;
      for (int64_t expected = 1;; ++expected) {
        const Command c = channel->wait();
        if (c.op == kOpStop) return;
        EXPECT_EQ(c.bytes, expected);
        std::this_thread::sleep_for(std::chrono::milliseconds(10 * r));
        ++finished;
        const bool fails = (c.arg >> r & 1) != 0;  // arg: a bit per follower that fails the command
        if (fails) box.fail(r, std::make_exception_ptr(std::runtime_error("rank " + std::to_string(r))));
      }
    });
  auto message = [](const std::exception_ptr& e) { return e ? message_of(e) : std::string("none"); };
  EXPECT_EQ(message(box.settle(nullptr)), "none");
  EXPECT_EQ(finished, 2);
  box.post({kOpStep, 0b110, 1});
  EXPECT_EQ(message(box.settle(nullptr)), "rank 1");
  EXPECT_EQ(finished, 4);
  box.post({kOpStep, 0b100, 2});
  EXPECT_EQ(message(box.settle(nullptr)), "rank 2");
  box.post({kOpStep, 0b110, 3});
  EXPECT_EQ(message(box.settle(std::make_exception_ptr(std::runtime_error("rank 0")))), "rank 0");
  box.post({kOpStep, 0, 4});
  EXPECT_EQ(message(box.settle(nullptr)), "none");  // a failure is reported once
  EXPECT_EQ(finished, 10);
  box.post({kOpStop});
  for (auto& t : followers) t.join();
}

}  // namespace
}  // namespace tpdraft::parallel
