// Logging through spdlog: every line carries "rank r/w"; the level comes from TPDRAFT_LOG_LEVEL
// (trace, debug, info, warn, error, critical, off, any case; another name is an error, see
// check_environment); everything goes to stderr so stdout stays for results.
#pragma once

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

}  // namespace tpdraft::log

#define TPDRAFT_LOG_INFO(...) ::tpdraft::log::logger().info(__VA_ARGS__)
#define TPDRAFT_LOG_WARN(...) ::tpdraft::log::logger().warn(__VA_ARGS__)
#define TPDRAFT_LOG_ERROR(...) ::tpdraft::log::logger().error(__VA_ARGS__)
