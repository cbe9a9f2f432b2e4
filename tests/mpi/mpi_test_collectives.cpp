// The MPI communicator under mpirun (2 and 4 ranks): the exact-value collective checks of the
// in-process tests, results bit-identical across ranks on random floats, exact counters, the
// replica split (consecutive groups of tp ranks) and the node-local rank; how ranks that fill the
// machine wait; and the served group's command channel.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/bounds.h"
#include "parallel/launch.h"
#include "parallel/mpi_comm.h"
#include "support/collective_checks.h"
#include "support/test_support.h"

namespace tpdraft::parallel {
namespace {

// Assertions here are EXPECTs only: a rank that left a test early would leave its peers waiting
// in the next collective.
class MpiCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    r_ = comm_->rank();
    n_ = comm_->size();
  }
  std::unique_ptr<MpiCommunicator> comm_;
  int r_ = 0, n_ = 1;
};

TEST_F(MpiCollectives, AllReduceF32ExactIntegers) { testing::check_all_reduce_exact(*comm_); }
TEST_F(MpiCollectives, AllGatherDistinctBlocks) { testing::check_all_gather(*comm_); }
TEST_F(MpiCollectives, BroadcastFromEveryRoot) { testing::check_broadcast(*comm_); }

TEST_F(MpiCollectives, BroadcastRootOutOfRangeIsRefusedOnEveryRank) {
  uint8_t b = 0;
  EXPECT_EQ(testing::error_of([&] { comm_->broadcast(&b, 1, n_); }),
            "rank " + std::to_string(r_) + ": broadcast root " + std::to_string(n_) + " is not a rank of a group of " +
                std::to_string(n_));
}

TEST_F(MpiCollectives, CountersAreExact) { testing::check_counters(*comm_, "mpi"); }

// Random non-integer floats: every rank must end with the same bits (checked by gathering them),
// close to the float64 sum.
TEST_F(MpiCollectives, RandomSumsAreBitIdenticalAcrossRanks) {
  const size_t count = 1001;
  std::vector<std::vector<float>> in(n_);
  for (int k = 0; k < n_; ++k) {
    std::mt19937 gen(1234 + k);
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    for (size_t i = 0; i < count; ++i) in[k].push_back(dist(gen));
  }
  std::vector<float> x = in[r_];
  comm_->all_reduce_sum(x.data(), count);

  std::vector<float> all(count * n_);
  comm_->all_gather(x.data(), all.data(), count * sizeof(float));
  for (int k = 1; k < n_; ++k)
    EXPECT_EQ(std::memcmp(all.data(), all.data() + k * count, count * sizeof(float)), 0) << "rank " << k;
  for (size_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int k = 0; k < n_; ++k) sum += in[k][i];
    EXPECT_NEAR(x[i], sum, 1e-5) << "[" << i << "]";
  }
}

TEST_F(MpiCollectives, SplitGroupsOfTwoAreConsecutiveReplicas) {
  if (n_ % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  Replica g = split_replicas(2);
  EXPECT_EQ(g.replica, r_ / 2);
  EXPECT_EQ(g.replicas, n_ / 2);
  EXPECT_EQ(g.comm->size(), 2);
  EXPECT_EQ(g.comm->rank(), r_ % 2);
  // A sum inside the replica sees only its two world ranks: 2g + (2g + 1).
  float v = static_cast<float>(r_);
  g.comm->all_reduce_sum(&v, 1);
  EXPECT_EQ(v, static_cast<float>(4 * g.replica + 1)) << "rank " << r_;
  // The world communicator saw none of it.
  EXPECT_EQ(comm_->stats().all_reduce_calls, 0u);

  Replica whole = split_replicas(n_);
  EXPECT_EQ(whole.replicas, 1);
  EXPECT_EQ(whole.comm->rank(), r_);
  Replica single = split_replicas(1);
  EXPECT_EQ(single.replica, r_);
  EXPECT_EQ(single.comm->size(), 1);
}

TEST_F(MpiCollectives, SplitGroupsRefusesATpThatDoesNotDivideTheRanks) {
  const int tp = n_ + 1;
  testing::expect_error([&] { split_replicas(tp); },
                        {"tensor-parallel size " + std::to_string(tp) + " does not split the " + std::to_string(n_) +
                         " MPI ranks"});
}

TEST_F(MpiCollectives, NodeLocalRankIsAPlaceOnThisMachine) {
  const NodeLocal local = node_local();
  EXPECT_GE(local.rank, 0);
  EXPECT_LT(local.rank, local.size);
  EXPECT_LE(local.size, n_);
  // Ranks on one machine are numbered in world order; the node-local ranks on it are 0..size-1.
  std::vector<int> all(static_cast<size_t>(n_));
  comm_->all_gather(&local.rank, all.data(), sizeof(int));
  EXPECT_GE(std::count(all.begin(), all.end(), 0), 1);
  if (local.size == n_) {
    EXPECT_EQ(local.rank, r_);
  }
}

TEST(MpiEnvironment, LaunchedUnderMpirun) { EXPECT_TRUE(mpi_launched()); }

// Ranks that fill every core of the machine wait for a peer without holding a core: the peers of
// a rank that comes to a barrier 300 ms late spend a small part of that on the CPU (polling
// outright, they would spend all of it).
TEST_F(MpiCollectives, CrowdedRanksWaitForALatePeerWithoutHoldingACore) {
  if (node_local().size < machine_cores()) GTEST_SKIP() << "the ranks here leave cores to spare";
  auto cpu_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  comm_->barrier();
  if (r_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double before = cpu_seconds();
  comm_->barrier();
  const double spent = cpu_seconds() - before;
  if (r_ != 0) {
    EXPECT_LT(spent, 0.1) << "rank " << r_ << " spent " << spent << " s of CPU waiting 0.3 s";
  }
}

// The command channel of a served group: every follower gets rank 0's commands in order, through
// bursts longer than the channel holds (rank 0 waits for the slowest follower), and after
// sleeping through a quiet spell (rank 0 wakes it).
TEST_F(MpiCollectives, ServeCommandChannelDeliversEveryCommandInOrder) {
  auto channel = mpi_command_channel(comm_->handle());
  EXPECT_NE(channel, nullptr);
  if (channel == nullptr) return;  // on every rank alike
  constexpr int kBurst = 1000, kQuiet = 5;
  int wrong = 0;
  for (int i = 0; i < kBurst + kQuiet; ++i) {
    const bool quiet = i >= kBurst;  // the followers have long been asleep when these come
    if (r_ == 0) {
      if (quiet) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      channel->post({kOpStep, i, 8 * i});
    } else {
      // A slow follower now and then, so that rank 0 finds the channel full.
      if (!quiet && i % 97 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const Command c = channel->wait();
      wrong += c.op != kOpStep || c.arg != i || c.bytes != 8 * i;
    }
  }
  EXPECT_EQ(wrong, 0) << "rank " << r_;
  if (r_ == 0) {
    channel->post({kOpStop});
  } else {
    EXPECT_EQ(channel->wait().op, kOpStop);
  }
  comm_->barrier();  // no rank lets the channel go while a peer may still read it
}

}  // namespace
}  // namespace tpdraft::parallel
