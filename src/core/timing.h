// The benchmarks' one timing harness (`tpdraft bench`, bench/*.cpp; bench/timing.py is its Python
// twin): warm-up runs then timed ones, a timed figure as its median and spread in one JSON shape
// (NAME_median, NAME_min, NAME_max, NAME_p10, NAME_p90, NAME_runs), and the machine's load around
// a measurement (other processes' CPU time and stolen time from /proc/stat, the load average), so
// that every report says when the machine was not idle: other work only adds time.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/summary.h"

namespace tpdraft {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// `warmup` untimed runs of f, then `repeat` timed ones (f gets the run's index, warm-up included);
// the seconds of the timed runs.
SampleSummary time_runs(int64_t warmup, int64_t repeat, const std::function<void(int64_t)>& f);

// Writes a timed figure (seconds, shown in units of 1/scale: 1e3 for ms, 1e6 for us) as
// NAME_median, NAME_min, NAME_max, NAME_p10, NAME_p90 and NAME_runs.
void put_figure(nlohmann::json& j, const std::string& name, const SampleSummary& s, double scale);

// When other work makes a machine not idle: other processes kept more than this many cores busy
// on average, or the hypervisor stole more than this share of the CPU time (bench/timing.py's
// limits, which the scaling reports judge records by).
constexpr double kOtherCoresLimit = 0.25;
constexpr double kStealLimit = 0.02;
// The shortest window the load is judged over: /proc/stat counts in ticks of 10 ms per core, so
// stop() waits out the rest of it after a shorter measurement (while we wait, what runs is other work).
constexpr double kMinLoadWindow = 0.2;

// The machine's load from construction to stop(): what ran besides this process (and the job's
// other ranks on this machine, which the caller adds with add_own_cpu).
class MachineLoad {
 public:
  MachineLoad();
  void stop();
  // This process's CPU seconds since construction (stop() first).
  double process_cpu() const { return cpu1_ - cpu0_; }
  // CPU seconds of other processes of the same job (ranks on this machine), not other work.
  void add_own_cpu(double seconds) { extra_cpu_ += seconds; }

  double other_cores() const;
  // The 1-minute load average when the window opened (before the measured work began).
  double loadavg_before() const { return before_.loadavg[0]; }
  double steal_share() const;
  // Why the machine was not idle; empty when it was.
  std::vector<std::string> reasons() const;
  // "idle (...)" or "NOT idle: why (...)", for a report's text.
  std::string describe() const;
  // {idle, not_idle_because, other_cores, steal_share, wall_s, run_cpu_s, loadavg_before, loadavg_after}
  nlohmann::json to_json() const;

 private:
  struct Snapshot {
    double t = 0;
    uint64_t busy = 0, steal = 0, total = 0;  // clock ticks of the aggregate cpu line
    std::array<double, 3> loadavg{};
  };
  static Snapshot snapshot();

  Snapshot before_, after_;
  double cpu0_ = 0, cpu1_ = 0, extra_cpu_ = 0;
};

}  // namespace tpdraft
