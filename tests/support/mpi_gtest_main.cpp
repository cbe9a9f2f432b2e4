// main() for GoogleTest binaries run under mpirun: every rank runs every test, only rank 0 prints
// the usual report (other ranks print just their failures, tagged with the rank), and the exit
// code is non-zero on every rank when any rank failed. A fatal failure (a failed ASSERT_*, an
// exception out of a test) makes its rank leave the test early, while its peers would wait for it
// in the test's next collective until CTest's timeout: that rank ends the whole job at once
// (MPI_Abort), naming itself and the test.
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <mpi.h>

#include "parallel/mpi_comm.h"

namespace {

// A listener that knows its rank and the running test. The test's name is kept from OnTestStart:
// gtest holds its lock while reporting a result, so it cannot be asked then.
class RankListener : public ::testing::EmptyTestEventListener {
 public:
  explicit RankListener(int rank) : rank_(rank) {}
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }

 protected:
  int rank_;
  std::string test_;
};

// Reports a failed assertion on a rank whose normal printer is switched off.
class RankFailurePrinter : public RankListener {
 public:
  using RankListener::RankListener;
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED %s at %s:%d\n%s\n", rank_, test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
  }
};

// Ends the job on a fatal failure. Appended after the printers, so the failure is reported first.
class AbortOnFatalFailure : public RankListener {
 public:
  using RankListener::RankListener;
  void OnTestEnd(const ::testing::TestInfo&) override { test_.clear(); }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.fatally_failed()) return;
    std::fprintf(stderr, "[rank %d] fatal failure in %s: ending the job (MPI_Abort) so that no rank waits for this one\n",
                 rank_, test_.empty() ? "(outside a test)" : test_.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
};

}  // namespace

int main(int argc, char** argv) {
  tpdraft::parallel::mpi_init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  listeners.Append(new AbortOnFatalFailure(rank));
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;

  std::vector<int> per_rank(static_cast<size_t>(size));
  MPI_Gather(&failed, 1, MPI_INT, per_rank.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed) {
    std::fprintf(stderr, "tests failed on rank(s):");
    for (int r = 0; r < size; ++r)
      if (per_rank[static_cast<size_t>(r)]) std::fprintf(stderr, " %d", r);
    std::fprintf(stderr, "\n");
  }
  tpdraft::parallel::mpi_finalize();
  return any_failed ? 1 : 0;
}
