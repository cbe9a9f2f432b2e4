// Logging through spdlog: every line carries "rank r/w"; the level comes from TPDRAFT_LOG_LEVEL
// (trace, debug, info, warn, error, critical, off, any case; another name is an error, see
// check_environment), else from the default the program sets (the library: warn, so that a host
// sees only what needs it; the tpdraft program: info). Lines go to stderr, so stdout stays for
// results, or to a callback a host installs (set_callback).
#pragma once

#include <optional>
#include <string>

#include <spdlog/spdlog.h>

namespace tpdraft::log {

// Sets the rank shown in every line; call again when the communicator is known.
void set_rank(int rank, int world);
// The same for the calling thread only (in-process ranks, one thread each).
void set_thread_rank(int rank, int world);
int rank();
spdlog::logger& logger();
// Throws tpdraft::Error when TPDRAFT_LOG_LEVEL is set to no known level (the logger then uses
// info). Programs call it first thing, so that a typo is an error and not silence.
void check_environment();
// The level used while TPDRAFT_LOG_LEVEL is unset or empty (warn until a program says otherwise).
void set_default_level(spdlog::level::level_enum level);
void set_level(spdlog::level::level_enum level);
// The level a name means (the names of TPDRAFT_LOG_LEVEL, any case); none for another name.
std::optional<spdlog::level::level_enum> parse_level(std::string name);
// Each line (no newline; the pattern's fields included) goes to callback(level, line, user)
// instead of stderr; nullptr: back to stderr. Lines of several threads reach it one at a time.
// False, and nothing changes, when called from inside the callback (it would wait on itself).
using Callback = void (*)(int level, const char* line, void* user);
bool set_callback(Callback callback, void* user);

}  // namespace tpdraft::log

#define TPDRAFT_LOG_INFO(...) ::tpdraft::log::logger().info(__VA_ARGS__)
#define TPDRAFT_LOG_WARN(...) ::tpdraft::log::logger().warn(__VA_ARGS__)
#define TPDRAFT_LOG_ERROR(...) ::tpdraft::log::logger().error(__VA_ARGS__)
