// The job: the argument check across ranks and the agreement on failures that every rank meets
// alike.
#include "cli/job.h"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "parallel/launch.h"

namespace tpdraft::cli {

namespace {

// The parts of `joined`, each of which ends with a NUL (as check_same_arguments joins them).
std::vector<std::string> split_nul(const std::string& joined) {
  std::vector<std::string> parts;
  std::istringstream in(joined);
  for (std::string part; std::getline(in, part, '\0');) parts.push_back(part);
  return parts;
}
}  // namespace

const char* exit_status_help() {
  return "Exit status: 0 success; 1 a fault while running (a rank, a device, a peer that is gone); 2 a usage "
         "error (the command line, or a TPDRAFT_ environment variable); 3 an input error (a config, checkpoint or "
         "taps file, or a tensor-parallel size the geometry cannot take).";
}

void run_alone(const std::function<void()>& command) {
  agree_on(*parallel::world(), kExitInput, command);
}

void agree_on(parallel::Communicator& world, int status, const std::function<void()>& step) {
  std::string error;
  try {
    step();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int32_t failed = error.empty() ? 0 : 1;
  std::vector<int32_t> all(static_cast<size_t>(world.size()));
  world.all_gather(&failed, all.data(), sizeof(failed));
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == 0) continue;
    if (static_cast<int>(r) == world.rank()) TPDRAFT_LOG_ERROR("{}", error);
    throw JobFailure{status};
  }
}

void check_same_arguments(int argc, char** argv) {
  if (!parallel::multi_process()) return;
  auto world = parallel::world();
  std::string mine;
  for (int i = 1; i < argc; ++i) mine.append(argv[i]).push_back('\0');
  uint64_t size = mine.size();
  world->broadcast(&size, sizeof(size), 0);
  std::string first = world->rank() == 0 ? mine : std::string(size, '\0');
  world->broadcast(first.data(), first.size(), 0);
  agree_on(*world, kExitUsage, [&] {
    const std::vector<std::string> here = split_nul(mine), there = split_nul(first);
    for (size_t i = 0; i < std::max(here.size(), there.size()); ++i) {
      const std::string a = i < here.size() ? "'" + here[i] + "'" : "absent";
      const std::string b = i < there.size() ? "'" + there[i] + "'" : "absent";
      // Name the option whose value differs (or the option itself, or the command).
      std::string what = fmt::format("argument {}", i + 1);
      if (i == 0) {
        what += " (the command)";
      } else if (i < here.size() && i < there.size() && here[i - 1] == there[i - 1] &&
                 starts_with(here[i - 1], "--") && !starts_with(here[i], "--")) {
        what += fmt::format(" (the value of {})", here[i - 1]);
      }
      TPDRAFT_CHECK(a == b,
                    "rank {} was started with other arguments than rank 0: {} is {} here and {} on rank 0 "
                    "(every rank of a job needs the same command line)",
                    world->rank(), what, a, b);
    }
  });
}

}  // namespace tpdraft::cli
