// Words in memory shared between processes that one side sets and the other sleeps on: a
// sequentially consistent load and store, and a futex wait and wake (not private: the word may
// be mapped by several processes).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstdint>

namespace tpdraft {

inline uint32_t shared_load(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
inline void shared_store(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }

// Waits while *word == expected, at most `seconds`. Returns on a wake, a timeout or a spurious return.
inline void futex_wait(uint32_t* word, uint32_t expected, double seconds) {
  timespec t;
  t.tv_sec = static_cast<time_t>(seconds);
  t.tv_nsec = static_cast<long>((seconds - static_cast<double>(t.tv_sec)) * 1e9);
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &t, nullptr, 0);
}

inline void futex_wake(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

}  // namespace tpdraft
