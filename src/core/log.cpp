// spdlog set-up for tpdraft: one stderr logger, a pattern with rank/world, level from the environment.
#include "core/log.h"

#include <cstdlib>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace tpdraft::log {

namespace {
int g_rank = 0;
int g_world = 1;

void apply_pattern(spdlog::logger& l) {
  l.set_pattern("[%H:%M:%S.%e] [rank " + std::to_string(g_rank) + "/" + std::to_string(g_world) + "] [%^%l%$] %v");
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto l = spdlog::stderr_color_mt("tpdraft");
  apply_pattern(*l);
  spdlog::level::level_enum level = spdlog::level::info;
  if (const char* env = std::getenv("TPDRAFT_LOG_LEVEL")) level = spdlog::level::from_str(env);
  l->set_level(level);
  return l;
}
}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

void set_rank(int rank, int world) {
  g_rank = rank;
  g_world = world;
  apply_pattern(logger());
}

int rank() { return g_rank; }

}  // namespace tpdraft::log
