// Probe of support/mpi_gtest_main.cpp: TPDRAFT_PROBE_FAIL=R:fatal makes rank R fail an ASSERT
// (it leaves the test while its peers wait in the next collective), R:expect an EXPECT (it goes
// on). Either way the job must end non-zero and soon: a fatal failure through MPI_Abort, naming
// the rank and the test; a non-fatal one at the end, naming the rank. Registered in
// tests/CMakeLists.txt through expect_failure.sh, which checks the exit status and the message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "parallel/mpi_comm.h"

namespace tpdraft {
namespace {

struct ProbeFailure {
  int rank = -1;
  bool fatal = false;
};

ProbeFailure probe_failure() {
  ProbeFailure p;
  const char* spec = std::getenv("TPDRAFT_PROBE_FAIL");
  if (spec == nullptr) return p;
  const std::string s = spec;
  const size_t colon = s.find(':');
  p.rank = std::atoi(s.substr(0, colon).c_str());
  p.fatal = colon != std::string::npos && s.substr(colon + 1) == "fatal";
  return p;
}

TEST(FailFast, OneRankFailsWhileThePeersWait) {
  auto world = parallel::make_mpi(MPI_COMM_WORLD);
  const ProbeFailure p = probe_failure();
  world->barrier();
  if (world->rank() == p.rank) {
    if (p.fatal) {
      ASSERT_TRUE(false) << "rank " << p.rank << " fails on purpose (ASSERT)";
    } else {
      EXPECT_TRUE(false) << "rank " << p.rank << " fails on purpose (EXPECT)";
    }
  }
  std::vector<float> x(64, 1.0f);
  world->all_reduce_sum(x.data(), x.size());  // a rank that left the test never comes here
  EXPECT_EQ(x[0], static_cast<float>(world->size()));
}

TEST(FailFast, NextTest) {
  auto world = parallel::make_mpi(MPI_COMM_WORLD);
  world->barrier();
}

}  // namespace
}  // namespace tpdraft
