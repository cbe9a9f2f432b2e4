#include "core/bounds.h"

#include <algorithm>
#include <thread>

namespace tpdraft {

int machine_cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

int max_threads_per_rank() { return 8 * machine_cores(); }

}  // namespace tpdraft
