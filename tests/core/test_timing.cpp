// The timing harness: warm-up runs are not timed, a figure is written in its one JSON shape, and
// the machine's load counts this process's CPU time (and the job's other ranks') as its own.
#include <gtest/gtest.h>

#include <ctime>
#include <vector>

#include "core/timing.h"

namespace tpdraft {
namespace {

TEST(Timing, WarmUpRunsAreNotTimed) {
  std::vector<int64_t> seen;
  const SampleSummary s = time_runs(2, 5, [&](int64_t i) { seen.push_back(i); });
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(s.count(), 5u);
  EXPECT_GE(s.min(), 0.0);
}

TEST(Timing, AFigureHasOneShape) {
  SampleSummary s;
  for (double x : {0.004, 0.001, 0.003, 0.002, 0.005}) s.add(x);
  nlohmann::json j;
  put_figure(j, "draft_ms", s, 1e3);
  EXPECT_EQ(j.size(), 6u);
  EXPECT_DOUBLE_EQ(j["draft_ms_median"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(j["draft_ms_min"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["draft_ms_max"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(j["draft_ms_p10"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["draft_ms_p90"].get<double>(), 5.0);
  EXPECT_EQ(j["draft_ms_runs"].get<int>(), 5);
}

TEST(Timing, OurOwnWorkIsNotOtherLoad) {
  MachineLoad load;
  volatile double x = 0;
  const std::clock_t c0 = std::clock();  // this process's CPU time, however busy the machine
  while (std::clock() - c0 < CLOCKS_PER_SEC / 10) x = x + 1;
  load.stop();
  EXPECT_GE(load.process_cpu(), 0.09);
  // Whatever else the machine ran, more CPU time of our own than the machine had leaves no other.
  load.add_own_cpu(1e6);
  EXPECT_EQ(load.other_cores(), 0.0);
  const nlohmann::json j = load.to_json();
  for (const char* key : {"idle", "not_idle_because", "other_cores", "steal_share", "wall_s", "run_cpu_s",
                          "loadavg_before", "loadavg_after"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["idle"].get<bool>(), load.reasons().empty());
  EXPECT_NE(load.describe().find(load.reasons().empty() ? "idle" : "NOT idle"), std::string::npos);
}

}  // namespace
}  // namespace tpdraft
