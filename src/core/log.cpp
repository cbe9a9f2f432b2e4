// spdlog set-up for tpdraft: one stderr logger, a pattern with rank/world, level from the environment.
// The rank comes from the thread when one was set for it (in-process ranks), else from the process.
// An unknown level is reported by check_environment(), never by the logger itself: the logger
// must keep working to print that error.
#include "core/log.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <optional>
#include <string>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
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
std::atomic<spdlog::level::level_enum> g_default_level{spdlog::level::warn};

bool level_in_env() {
  const char* env = std::getenv(kLevelVariable);
  return env != nullptr && *env != '\0';
}

// The level TPDRAFT_LOG_LEVEL names, in any case (unset or empty: the default); none when it is
// set to no known level.
std::optional<spdlog::level::level_enum> level_from_env() {
  return level_in_env() ? parse_level(std::getenv(kLevelVariable)) : g_default_level.load();
}

thread_local bool t_in_callback = false;

// stderr, or a host's callback: formats each line once and hands it over under the sink's lock.
class HostSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  HostSink() : stderr_(std::make_shared<spdlog::sinks::stderr_color_sink_mt>()) {}
  bool set_callback(Callback callback, void* user) {
    if (t_in_callback) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    callback_ = callback;
    user_ = user;
    return true;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (callback_ == nullptr) return stderr_->log(msg);
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    while (line.size() > 0 && (line[line.size() - 1] == '\n' || line[line.size() - 1] == '\r'))
      line.resize(line.size() - 1);
    line.push_back('\0');
    t_in_callback = true;
    callback_(static_cast<int>(msg.level), line.data(), user_);
    t_in_callback = false;
  }
  void flush_() override { stderr_->flush(); }
  void set_formatter_(std::unique_ptr<spdlog::formatter> formatter) override {
    stderr_->set_formatter(formatter->clone());
    formatter_ = std::move(formatter);
  }

 private:
  std::shared_ptr<spdlog::sinks::stderr_color_sink_mt> stderr_;  // colours only where stderr is a terminal
  Callback callback_ = nullptr;
  void* user_ = nullptr;
};

const std::shared_ptr<HostSink>& host_sink() {
  static const std::shared_ptr<HostSink> sink = std::make_shared<HostSink>();
  return sink;
}

// The logger is kept out of spdlog's process-wide registry: a process that holds two copies of
// this code (a program beside libtpdraft.so) or registers a "tpdraft" logger of its own would
// otherwise fail to create it ("logger with name 'tpdraft' already exists").
std::shared_ptr<spdlog::logger> make_logger() {
  // The sink is a static of its own: a callback set before the first line counts too.
  auto l = std::make_shared<spdlog::logger>("tpdraft", host_sink());
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<RankFlag>('Q').set_pattern("[%H:%M:%S.%e] [rank %Q] [%^%l%$] %v");
  l->set_formatter(std::move(formatter));
  l->set_level(level_from_env().value_or(g_default_level.load()));  // check_environment() reports a bad one
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

std::optional<spdlog::level::level_enum> parse_level(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  // spdlog's from_str maps every unknown name to "off", which would hide errors too.
  const spdlog::level::level_enum level = spdlog::level::from_str(name);
  if (level == spdlog::level::off && name != "off") return std::nullopt;
  return level;
}

void set_default_level(spdlog::level::level_enum level) {
  g_default_level = level;
  if (!level_in_env()) logger().set_level(level);
}

void set_level(spdlog::level::level_enum level) { logger().set_level(level); }

bool set_callback(Callback callback, void* user) { return host_sink()->set_callback(callback, user); }

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
