// `tpdraft serve`'s rank 0: requests from the clients (serve/transport.h: a ZeroMQ ROUTER socket
// that many clients share, and their shared-memory rings) decoded and checked, STEP requests that
// arrive while a forward runs batched into the next one, replies routed back, idle clients'
// sessions closed, SIGTERM honoured between forwards.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/group.h"

namespace tpdraft::serve {

struct ServerOptions {
  std::string listen;  // ipc://PATH or tcp://HOST:PORT (PORT may be *); empty: an ipc socket in $TMPDIR
  int replica = 0, replicas = 1;  // of several, replica g listens on PATH.g or PORT+g (serve/transport.h)
  double idle_timeout = 300;   // seconds a client may stay silent before its sessions are closed
  double spin_us = 2000;  // microseconds the server looks at the rings busily after a request
  // Microseconds queued STEPs may wait for the clients of the last forward to ask again, at most
  // (and never more than a tenth of that forward's time): lock-stepped engines then share
  // forwards instead of splitting into two halves that alternate. 0: run what is queued at once.
  double gather_us = 2000;
  int64_t max_client_sessions = 0;  // sessions one client may hold at once (0: max_open_sessions)
  // Bytes of request frames (inline taps) the queued STEPs may hold, over every client; one client
  // may hold a quarter (its first queued request excepted). An empty queue takes any request.
  uint64_t max_queued_bytes = uint64_t{256} << 20;
  std::string curve_secret_key;  // Z85; non-empty: CURVE on the socket (serve/keys.h)
};

// From now on SIGTERM and SIGINT stop the server after the forward in flight.
void install_stop_signals();

class Server {
 public:
  Server(engine::Group& group, const ServerOptions& options);
  ~Server();

  // Binds the socket; returns the address clients connect to (Transport::bind).
  std::string bind();
  // Serves until SIGTERM, a SHUTDOWN request or a failure of the group. Returns after a clean
  // stop; rethrows a failure of the group's work after replying to every waiting client.
  void run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpdraft::serve
