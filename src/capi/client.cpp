// The C ABI's client of `tpdraft serve` over serve::Client (serve/client.h): argument checks, the
// entries' buffers checked before anything is sent, and failures turned into a status and a
// per-thread message, so that no exception crosses into the caller.
#include <string>

#include "capi/caps.h"
#include "capi/last_error.h"
#include "serve/client.h"
#include "tpdraft/tpdraft.h"

struct tpdraft_client : tpdraft::serve::Client {
  using tpdraft::serve::Client::Client;
};

using tpdraft::capi::guarded;
using tpdraft::capi::ok;
using tpdraft::capi::refuse;

extern "C" {

void tpdraft_client_options_init(tpdraft_client_options* o) {
  if (o == nullptr) return;
  *o = tpdraft_client_options{};
  o->struct_size = sizeof(tpdraft_client_options);
  o->timeout_seconds = 10;
  o->shared_memory = -1;
  o->ring_bytes = int64_t{64} << 20;
}

tpdraft_status tpdraft_client_open(const char* address, const tpdraft_client_options* options, tpdraft_client** out) {
  auto refused = [](const std::string& why) { return refuse("tpdraft_client_open: " + why); };
  if (out == nullptr) return refused("out is NULL");
  *out = nullptr;
  if (address == nullptr) return refused("address is NULL");
  tpdraft_client_options defaults;
  tpdraft_client_options_init(&defaults);
  const tpdraft_client_options& o = options != nullptr ? *options : defaults;
  if (o.struct_size < sizeof(tpdraft_client_options))
    return refused("options.struct_size is too small: initialise the options with tpdraft_client_options_init");
  if (!(o.timeout_seconds > 0) || o.timeout_seconds > 1e6)
    return refused(
        fmt::format("options.timeout_seconds is {}, expected more than 0 (and at most 1e6)", o.timeout_seconds));
  if (o.shared_memory < -1 || o.shared_memory > 1)
    return refused(fmt::format("options.shared_memory is {}, expected -1, 0 or 1", o.shared_memory));
  return guarded("tpdraft_client_open", TPDRAFT_ERROR_RUNTIME, [&] { *out = new tpdraft_client(address, o); });
}

void tpdraft_client_close(tpdraft_client* c) {
  if (c == nullptr) return;
  guarded("tpdraft_client_close", TPDRAFT_ERROR_RUNTIME, [c] { c->close(); });
  delete c;
}

tpdraft_status tpdraft_client_caps_get(const tpdraft_client* c, tpdraft_caps* out) {
  if (c == nullptr || out == nullptr) return refuse("tpdraft_client_caps_get: client or out is NULL");
  return tpdraft::capi::fill_caps("tpdraft_client_caps_get", c->caps(), c->caps().backend, out);
}

int32_t tpdraft_client_shared_memory(const tpdraft_client* c) { return c != nullptr && c->shared_memory() ? 1 : 0; }

tpdraft_status tpdraft_client_session_open(tpdraft_client* c, tpdraft_session* out) {
  if (c == nullptr || out == nullptr) return refuse("tpdraft_client_session_open: client or out is NULL");
  return guarded("tpdraft_client_session_open", TPDRAFT_ERROR_RUNTIME, [&] { *out = c->open_session(); });
}

tpdraft_status tpdraft_client_session_close(tpdraft_client* c, tpdraft_session session) {
  if (c == nullptr) return refuse("tpdraft_client_session_close: client is NULL");
  return guarded("tpdraft_client_session_close", TPDRAFT_ERROR_RUNTIME, [&] { c->close_session(session); });
}

tpdraft_status tpdraft_client_session_length(tpdraft_client* c, tpdraft_session session, int64_t* out) {
  if (c == nullptr || out == nullptr) return refuse("tpdraft_client_session_length: client or out is NULL");
  return guarded("tpdraft_client_session_length", TPDRAFT_ERROR_RUNTIME, [&] { *out = c->session_length(session); });
}

tpdraft_status tpdraft_client_step(tpdraft_client* c, tpdraft_step_entry* entries, size_t count) {
  if (c == nullptr) return refuse("tpdraft_client_step: client is NULL");
  if (entries == nullptr && count > 0) return refuse("tpdraft_client_step: entries is NULL");
  return guarded("tpdraft_client_step", TPDRAFT_ERROR_RUNTIME,
                 [&] { c->step(entries, count, tpdraft::capi::missing_buffer); });
}

tpdraft_status tpdraft_client_last_step_times(tpdraft_client* c, tpdraft_step_times* out) {
  if (c == nullptr || out == nullptr) return refuse("tpdraft_client_last_step_times: client or out is NULL");
  *out = c->last_times();
  return ok();
}

tpdraft_status tpdraft_client_stats(tpdraft_client* c, tpdraft_server_stats* out) {
  if (c == nullptr || out == nullptr) return refuse("tpdraft_client_stats: client or out is NULL");
  return guarded("tpdraft_client_stats", TPDRAFT_ERROR_RUNTIME, [&] { *out = c->stats(); });
}

tpdraft_status tpdraft_client_shutdown(tpdraft_client* c) {
  if (c == nullptr) return refuse("tpdraft_client_shutdown: client is NULL");
  return guarded("tpdraft_client_shutdown", TPDRAFT_ERROR_RUNTIME, [&] { c->shutdown(); });
}

}  // extern "C"
