// What the in-process calls (capi.cpp) and the client's (client.cpp) share: the per-thread
// message tpdraft_last_error() returns, how a call ends with it (no exception crosses into the
// caller), and the checks of an entry's output buffers that both make before anything else.
#pragma once

#include <new>
#include <string>

#include "core/error.h"
#include "serve/client.h"
#include "tpdraft/tpdraft.h"

namespace tpdraft::capi {

void set_last_error(const std::string& message);

// The call fails with `status`, the message `why`.
inline tpdraft_status fail(tpdraft_status status, const std::string& why) {
  set_last_error(why);
  return status;
}

// The call is refused for its arguments.
inline tpdraft_status refuse(const std::string& why) { return fail(TPDRAFT_ERROR_ARGUMENT, why); }

// The call succeeded: no message.
inline tpdraft_status ok() {
  set_last_error("");
  return TPDRAFT_OK;
}

// Runs fn. A client's failure keeps its status and message (which names the call); another
// tpdraft::Error becomes `on_error`, anything else TPDRAFT_ERROR_RUNTIME, each message prefixed
// with the entry point `where`.
template <typename F>
tpdraft_status guarded(const char* where, tpdraft_status on_error, F&& fn) noexcept {
  try {
    fn();
    return ok();
  } catch (const serve::ClientError& e) {
    return fail(e.status, e.what());
  } catch (const Error& e) {
    return fail(on_error, std::string(where) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return fail(TPDRAFT_ERROR_RUNTIME, std::string(where) + ": out of memory");
  } catch (const std::exception& e) {
    return fail(TPDRAFT_ERROR_RUNTIME, std::string(where) + ": " + e.what());
  } catch (...) {
    return fail(TPDRAFT_ERROR_RUNTIME, std::string(where) + ": unknown failure");
  }
}

// Why entry `i` has no room for what it asks for ("" when it has): the message names the entry.
std::string missing_buffer(const tpdraft_step_entry& e, size_t i);

}  // namespace tpdraft::capi
