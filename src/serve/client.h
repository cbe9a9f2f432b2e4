// The client of `tpdraft serve`: a ZeroMQ DEALER socket, requests encoded as docs/protocol.md
// says, a wait for the matching reply that never outlasts the timeout, taps through the client's
// shared-memory ring when the server maps it, and a socket monitor so that a server that goes
// away fails the call at once instead of at the timeout. It speaks for the C ABI's
// tpdraft_client_* calls: its messages name them, as an engine (or Python) sees them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/error.h"
#include "serve/protocol.h"
#include "tpdraft/tpdraft.h"

namespace tpdraft::serve {

// A failed call: the C ABI's status for it and the message.
class ClientError : public Error {
 public:
  ClientError(tpdraft_status status, const std::string& what) : Error(what), status(status) {}
  tpdraft_status status;
};

// Calls are serialised. A call fails with ClientError; a failure of the connection or of the
// protocol (TPDRAFT_ERROR_UNAVAILABLE) closes the client for good, and each later call then
// fails at once naming it.
class Client {
 public:
  // Checks the address against the C ABI's options, connects and says HELLO.
  Client(const std::string& address, const tpdraft_client_options& options);
  ~Client();

  // Tells the server to close this client's sessions now rather than at its idle timeout (a
  // short wait: a server that does not answer reaps them itself).
  void close();

  const WireCaps& caps() const;
  bool shared_memory() const;
  int64_t open_session();
  void close_session(int64_t session);
  int64_t session_length(int64_t session);
  // Why entry i cannot be sent ("" when it can): the caller's checks, run before anything is sent.
  using EntryCheck = std::function<std::string(const tpdraft_step_entry&, size_t)>;
  // One step; a step that fails leaves no drafts in the entries it checked.
  void step(tpdraft_step_entry* entries, size_t count, const EntryCheck& check);
  tpdraft_step_times last_times();
  WireStats stats();
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpdraft::serve
