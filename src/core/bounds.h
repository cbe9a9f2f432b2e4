// The bounds of the size options a caller gives a drafter: the same for the program's options,
// the C ABI's tpdraft_options and tpdraft_client_options, and the Python keyword arguments, so
// that no size reaches an allocation or a product unchecked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>

namespace tpdraft {

constexpr int64_t kMaxStepEntries = 4096;           // max_sessions: entries in one step, sessions in one forward
constexpr int64_t kMaxOpenSessions = int64_t{1} << 20;  // max_open_sessions
constexpr int64_t kMaxContext = int64_t{1} << 31;   // max_context: positions one session holds
constexpr int kMaxInProcessRanks = 256;             // tp: ranks as threads of one process
constexpr int64_t kMinRingBytes = 8192;             // a client's shared-memory ring
constexpr int64_t kMaxRingBytes = int64_t{1} << 40;

// The values a step may carry: tap rows within ±2^30 (hidden states are far smaller; 2^30 times a
// checkpoint's weights stays inside f32 through fc and the norms), and a sampling temperature of
// 0 (greedy) or at least 1e-6 (1 / T must not overflow the logits' scale).
constexpr int kTapLog2Bound = 30;
constexpr double kMinTemperature = 1e-6;

// This machine's cores (at least 1), and the CPU threads one rank may be given: 8 per core.
inline int machine_cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }
inline int max_threads_per_rank() { return 8 * machine_cores(); }

}  // namespace tpdraft
