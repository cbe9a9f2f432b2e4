// spdlog set-up for tpdraft: one stderr logger, a pattern with rank/world, level from the environment.
// The rank comes from the thread when one was set for it (in-process ranks), else from the process.
// An unknown level is reported by check_environment(), never by the logger itself: the logger
// must keep working to print that error.
#include "core/log.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/error.h"

namespace tpdraft::log {

namespace {
int g_rank = 0;
int g_world = 1;
thread_local int t_rank = -1;
thread_local int t_world = 0;

// "%Q" in the pattern: "rank/world" of the calling thread.
class RankFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&, spdlog::memory_buf_t& dest) override {
    const std::string s = std::to_string(rank()) + "/" + std::to_string(t_rank >= 0 ? t_world : g_world);
    dest.append(s.data(), s.data() + s.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<RankFlag>(); }
};

constexpr const char* kLevelVariable = "TPDRAFT_LOG_LEVEL";

// The level TPDRAFT_LOG_LEVEL names, in any case; false when it is set to no known level.
// spdlog's from_str maps every unknown name to "off", which would hide errors too.
bool level_from_env(spdlog::level::level_enum* out) {
  const char* env = std::getenv(kLevelVariable);
  if (env == nullptr || *env == '\0') return true;  // unset or empty: the default
  std::string name(env);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  const spdlog::level::level_enum level = spdlog::level::from_str(name);
  if (level == spdlog::level::off && name != "off") return false;
  *out = level;
  return true;
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto l = spdlog::stderr_color_mt("tpdraft");
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<RankFlag>('Q').set_pattern("[%H:%M:%S.%e] [rank %Q] [%^%l%$] %v");
  l->set_formatter(std::move(formatter));
  spdlog::level::level_enum level = spdlog::level::info;
  if (!level_from_env(&level)) level = spdlog::level::info;  // check_environment() reports it
  l->set_level(level);
  return l;
}
}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

void check_environment() {
  spdlog::level::level_enum level = spdlog::level::info;
  TPDRAFT_CHECK(level_from_env(&level),
                "{}='{}' names no log level; expected one of trace, debug, info, warn, error, critical, off (any case)",
                kLevelVariable, std::getenv(kLevelVariable));
}

void set_rank(int rank, int world) {
  g_rank = rank;
  g_world = world;
}

void set_thread_rank(int rank, int world) {
  t_rank = rank;
  t_world = world;
}

int rank() { return t_rank >= 0 ? t_rank : g_rank; }

}  // namespace tpdraft::log
