// The program under mpirun, as a launcher runs it: an error every rank meets alike is printed
// once and the job ends with the documented status, no abort; ranks started with different
// arguments are refused naming the argument; a rank that stops leaves its peers waiting only
// until --comm-timeout ends the job.
#include <gtest/gtest.h>

#include <string>

#include "support/test_support.h"

namespace tpdraft {
namespace {

// TPDRAFT_MPIRUN: the launcher with its flags (-q keeps Open MPI's own notices out).
testing::CommandResult mpirun(int np, const std::string& args, const std::string& env = "") {
  return testing::run_command("timeout 120 " + std::string(TPDRAFT_MPIRUN) + " -np " + std::to_string(np) + " " + env +
                              " " + TPDRAFT_BIN + " " + args);
}

struct Checkpoint {
  testing::TempDir dir;
  std::string ck = dir.file("ck");
  Checkpoint() {
    const auto r = testing::run_command(std::string(TPDRAFT_BIN) + " init --config " +
                                        testing::source_path("configs/tiny-dflash2.json") + " --out " + ck + " --taps 9");
    EXPECT_EQ(r.status, 0) << r.out;
  }
  std::string draft(const std::string& extra = "") const {
    return "draft --drafter " + ck + "/drafter --target " + ck + "/target --taps " + ck + "/taps.safetensors --threads 1 " +
           extra;
  }
};

TEST(CliUnderMpi, UsageErrorsArePrintedOnceWithStatus2) {
  const auto r = mpirun(2, "info --drafter . --bogus-option");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(testing::count_of(r.out, "--bogus-option"), 1u) << r.out;
  EXPECT_EQ(r.out.find("MPI_ABORT"), std::string::npos) << r.out;
}

TEST(CliUnderMpi, InputErrorsArePrintedOnceWithStatus3) {
  Checkpoint c;
  for (const std::string& extra : {std::string("--anchor 100000"), std::string("--anchor 1 --tp 2 --dump /dev/null")}) {
    const auto r = mpirun(2, c.draft(extra));
    EXPECT_EQ(r.status, 3) << extra << "\n" << r.out;
    EXPECT_EQ(testing::count_of(r.out, "[error]"), 1u) << r.out;
    EXPECT_EQ(r.out.find("MPI_ABORT"), std::string::npos) << r.out;
  }
  // A fault on one rank while loading: that rank reports it, the others end cleanly.
  const auto r = mpirun(2, c.draft("--anchor 1"), "-x TPDRAFT_FAULT=1:load");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_EQ(testing::count_of(r.out, "rank 1: injected fault at 'load'"), 1u) << r.out;
}

TEST(CliUnderMpi, RanksWithDifferentArgumentsAreRefused) {
  Checkpoint c;
  // One launch of two programs, one rank each: the second's arguments follow the ':'.
  const auto r = mpirun(1, c.draft("--anchor 1") + " : -np 1 " + TPDRAFT_BIN + " " + c.draft("--anchor 2"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("is '2' here and '1' on rank 0"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\"tokens\""), std::string::npos) << "the ranks drafted anyway: " << r.out;
}

TEST(CliUnderMpi, AStoppedRankEndsTheJobAfterTheCommTimeout) {
  Checkpoint c;
  const auto r = mpirun(2, c.draft("--anchor 1 --comm-timeout 2"), "-x TPDRAFT_FAULT=1:draft:stop");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.status, 124) << "timeout ended the job, not the watchdog: " << r.out;
  EXPECT_NE(r.out.find("has waited"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--comm-timeout"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tpdraft
