// How requests reach `tpdraft serve`'s rank 0 and replies leave it: a ZeroMQ ROUTER socket that
// every client shares (ipc:// or tcp://, CURVE keys, the process at the other end of an ipc://
// connection) and, for clients on this machine, each client's shared-memory ring (serve/ring.h).
// The serving part (server.cpp) sees whole request frames and answers them by their route.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/files.h"
#include "serve/message.h"
#include "serve/ring.h"

namespace tpdraft::serve {

// A file the server made (the address file, an ipc:// socket's file), removed when this goes,
// however the server ends (but a kill), while it is still the file made (another server may have
// made its own there since).
class OwnedFile {
 public:
  OwnedFile() = default;
  OwnedFile(const OwnedFile&) = delete;
  OwnedFile& operator=(const OwnedFile&) = delete;
  ~OwnedFile() {
    if (!path_.empty()) remove_if_same(path_, made_);
  }
  void own(const std::string& path) {
    path_ = path;
    made_ = file_identity(path);
  }

 private:
  std::string path_;
  FileIdentity made_;
};

// Where a request came from, so that its reply goes back the same way.
struct Route {
  std::string client;  // the ROUTER's routing id of the client
  bool ring = false;
  uint32_t seq = 0;  // the ring request's request_seq
  uint64_t reply_at = 0, reply_capacity = 0;  // the ring's reply area
};

// One request as it arrived: a frame of the socket, or a copy of a frame out of the client's ring.
struct Request {
  Route route;
  std::unique_ptr<Message> frame;
  std::vector<uint64_t> copy;  // 8-byte aligned
  size_t copy_bytes = 0;
  std::string malformed;  // why it cannot be read at all (it is refused as malformed)
  const char* data() const { return frame ? frame->data() : reinterpret_cast<const char*>(copy.data()); }
  size_t size() const { return frame ? frame->size() : copy_bytes; }
};

class Transport {
 public:
  using Handler = std::function<void(Request&)>;

  // `listen`: ipc://PATH or tcp://HOST:PORT, empty for an ipc socket in $TMPDIR named for this
  // process; replica g of several listens on PATH.g or a fixed PORT + g. `curve_secret_key`: Z85,
  // non-empty for CURVE.
  Transport(const std::string& listen, int replica, int replicas, std::string curve_secret_key);
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  ~Transport();

  // Binds, taking request frames of at most `max_request_bytes` (-1: any); returns the address
  // clients connect to (the port chosen for tcp://...:*, this machine's host name for a wildcard
  // host such as tcp://*:PORT).
  std::string bind(int64_t max_request_bytes);
  // Hands every request waiting on the socket to `on_request`.
  void drain(const Handler& on_request);
  // Hands every request waiting in a client's ring to `on_request`; returns whether there were any.
  bool poll_rings(const Handler& on_request);
  // Tells the rings' clients that the server may sleep on the socket (they ring its doorbell), or
  // that it looks at their rings again.
  void set_sleeping(bool sleeping);
  // Waits up to `ms` milliseconds (0: a look) for a frame on the socket or a signal.
  void wait(long ms);
  void send(const Route& to, const std::string& body);

  // HELLO: maps the ring a client named, replacing its old one; returns why not ("" when mapped).
  // `who` names the client in logs.
  std::string map_ring(const std::string& client, const std::string& who, const std::string& name, uint64_t bytes);
  // The bytes of a client's ring (0: it has none).
  uint64_t ring_bytes(const std::string& client) const;
  // Copies n bytes at `offset` of the client's ring (known to lie inside it) to `out`; false
  // when the ring faulted (the client shrank it), which unmaps it.
  bool ring_copy(const std::string& client, uint64_t offset, uint64_t n, void* out);
  // The process at the other end of the unix socket a request came through (0 when unknown: tcp,
  // a ring request, or a process outside this pid namespace).
  pid_t peer_process(const Request& r) const;
  // The client is gone: its ring is unmapped.
  void forget(const std::string& client);

 private:
  // A client's ring: its control block, then what the client placed there.
  struct Ring {
    std::string who;  // the client, for logs
    char* base = nullptr;
    size_t bytes = 0;
    uint32_t seen = 0;  // the last request_seq taken
    RingControl* control() const { return reinterpret_cast<RingControl*>(base); }
    // Whether n bytes at offset `at` lie inside the ring, past its control block.
    bool holds(uint64_t at, uint64_t n) const { return at >= kRingControlBytes && at <= bytes && n <= bytes - at; }
  };
  void ring_faulted(const std::string& client);

  std::string listen_, curve_secret_key_;
  void* ctx_ = nullptr;
  void* sock_ = nullptr;
  std::map<std::string, Ring> rings_;
  OwnedFile ipc_file_;  // libzmq leaves the file of a bound ipc:// endpoint behind
};

}  // namespace tpdraft::serve
