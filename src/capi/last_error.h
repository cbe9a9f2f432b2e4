// What the in-process calls (capi.cpp) and the client's (client.cpp) share: the per-thread
// message tpdraft_last_error() returns, how a call ends with it, and the checks of an entry's
// output buffers that both make before anything else.
#pragma once

#include <string>

#include "tpdraft/tpdraft.h"

namespace tpdraft::capi {

void set_last_error(const std::string& message);

// The call fails with `status`, the message `why`.
inline tpdraft_status fail(tpdraft_status status, const std::string& why) {
  set_last_error(why);
  return status;
}

// The call succeeded: no message.
inline tpdraft_status ok() {
  set_last_error("");
  return TPDRAFT_OK;
}

// Why entry `i` has no room for what it asks for ("" when it has): the message names the entry.
std::string missing_buffer(const tpdraft_step_entry& e, size_t i);

}  // namespace tpdraft::capi
