// spdlog set-up for tpdraft: one stderr logger, a pattern with rank/world, level from the environment.
// The rank comes from the thread when one was set for it (in-process ranks), else from the process.
// An unknown level is reported by check_environment(), never by the logger itself: the logger
// must keep working to print that error.
#include "core/log.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <optional>
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

// The level TPDRAFT_LOG_LEVEL names, in any case; none when it is set to no known level.
// spdlog's from_str maps every unknown name to "off", which would hide errors too.
std::optional<spdlog::level::level_enum> level_from_env() {
  const char* env = std::getenv(kLevelVariable);
  if (env == nullptr || *env == '\0') return spdlog::level::info;  // unset or empty: the default
  std::string name(env);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  const spdlog::level::level_enum level = spdlog::level::from_str(name);
  if (level == spdlog::level::off && name != "off") return std::nullopt;
  return level;
}

// The logger is kept out of spdlog's process-wide registry: a process that holds two copies of
// this code (a program beside libtpdraft.so) or registers a "tpdraft" logger of its own would
// otherwise fail to create it ("logger with name 'tpdraft' already exists").
std::shared_ptr<spdlog::logger> make_logger() {
  auto l = std::make_shared<spdlog::logger>("tpdraft", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<RankFlag>('Q').set_pattern("[%H:%M:%S.%e] [rank %Q] [%^%l%$] %v");
  l->set_formatter(std::move(formatter));
  l->set_level(level_from_env().value_or(spdlog::level::info));  // check_environment() reports a bad one
  return l;
}
}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

void check_environment() {
  TPDRAFT_CHECK(level_from_env().has_value(),
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
