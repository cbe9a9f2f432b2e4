// The load counters come from /proc (Linux); where they cannot be read the load reads as zero.
#include "core/timing.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tpdraft {

SampleSummary time_runs(int64_t warmup, int64_t repeat, const std::function<void(int64_t)>& f) {
  SampleSummary s;
  for (int64_t i = 0; i < warmup + repeat; ++i) {
    const auto t0 = Clock::now();
    f(i);
    if (i >= warmup) s.add(seconds_since(t0));
  }
  return s;
}

void put_figure(nlohmann::json& j, const std::string& name, const SampleSummary& s, double scale) {
  j[name + "_median"] = s.median() * scale;
  j[name + "_min"] = s.min() * scale;
  j[name + "_max"] = s.max() * scale;
  j[name + "_p10"] = s.quantile(0.1) * scale;
  j[name + "_p90"] = s.quantile(0.9) * scale;
  j[name + "_runs"] = s.count();
}

namespace {

double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

}  // namespace

// Busy counts user, nice, system, irq and softirq (guest time is inside user); the total adds
// idle, iowait and steal.
MachineLoad::Snapshot MachineLoad::snapshot() {
  Snapshot s;
  s.t = now();
  std::ifstream stat("/proc/stat");
  std::string cpu;
  uint64_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  stat >> cpu;
  for (uint64_t& x : v) stat >> x;
  const uint64_t user = v[0], nice = v[1], system = v[2], idle = v[3], iowait = v[4], irq = v[5], softirq = v[6];
  s.busy = user + nice + system + irq + softirq;
  s.steal = v[7];
  s.total = s.busy + idle + iowait + s.steal;
  std::ifstream load("/proc/loadavg");
  for (double& x : s.loadavg) load >> x;
  return s;
}

MachineLoad::MachineLoad() : before_(snapshot()), cpu0_(process_cpu_seconds()) { after_ = before_, cpu1_ = cpu0_; }

void MachineLoad::stop() {
  const double rest = kMinLoadWindow - (now() - before_.t);
  if (rest > 0) std::this_thread::sleep_for(std::chrono::duration<double>(rest));
  after_ = snapshot();
  cpu1_ = process_cpu_seconds();
}

double MachineLoad::other_cores() const {
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double busy = static_cast<double>(after_.busy - before_.busy) / ticks;
  const double wall = std::max(after_.t - before_.t, 1e-9);
  return std::max(0.0, busy - process_cpu() - extra_cpu_) / wall;
}

double MachineLoad::steal_share() const {
  const uint64_t total = after_.total - before_.total;
  return total ? static_cast<double>(after_.steal - before_.steal) / static_cast<double>(total) : 0.0;
}

std::vector<std::string> MachineLoad::reasons() const {
  std::vector<std::string> out;
  if (other_cores() > kOtherCoresLimit) out.push_back(fmt::format("other processes kept {:.2f} cores busy", other_cores()));
  if (steal_share() > kStealLimit) out.push_back(fmt::format("{:.0f}% of the CPU time stolen", 100 * steal_share()));
  return out;
}

std::string MachineLoad::describe() const {
  const std::vector<std::string> why = reasons();
  if (why.empty())
    return fmt::format("idle (other processes {:.2f} cores, load average {:.2f})", other_cores(), after_.loadavg[0]);
  return fmt::format("NOT idle: {} (load average {:.2f}; other work only adds time)", fmt::join(why, ", "),
                     after_.loadavg[0]);
}

nlohmann::json MachineLoad::to_json() const {
  return {{"idle", reasons().empty()},
          {"not_idle_because", reasons()},
          {"other_cores", other_cores()},
          {"steal_share", steal_share()},
          {"wall_s", after_.t - before_.t},
          {"run_cpu_s", process_cpu() + extra_cpu_},
          {"loadavg_before", before_.loadavg},
          {"loadavg_after", after_.loadavg}};
}

}  // namespace tpdraft
