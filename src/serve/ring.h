// The shared-memory ring of a client on the server's machine (docs/protocol.md, "The ring"): its
// first 4 KiB are a control block through which a request and its reply travel without the
// socket: the client writes the request frame into the ring and bumps request_seq; the server,
// which looks at its clients' rings between requests, writes the reply into the ring and sets
// reply_seq. Whoever is about to sleep says so first (server_sleeping, client_sleeping) and
// looks once more, so that the other side knows to wake it (a doorbell frame on the socket for
// the server, a futex wake for the client): no request or reply is ever missed.
#pragma once

#include <cstdint>

#include "core/futex.h"

namespace tpdraft::serve {

// Every client ring's POSIX shared-memory name starts with this; a server maps no other.
constexpr const char* kRingNamePrefix = "/tpdraft-ring-";

constexpr uint64_t kRingControlBytes = 4096;

struct RingControl {
  uint32_t request_seq;      // bumped by the client once a request frame is in place
  uint32_t reply_seq;        // set to request_seq by the server once the reply is in place
  uint32_t server_sleeping;  // 1 while the server may block on its socket: send a doorbell
  uint32_t client_sleeping;  // 1 while the client may block on reply_seq: wake it
  uint64_t request_offset, request_bytes;  // the request frame, within the ring
  uint64_t reply_offset, reply_capacity;   // where the reply may go
  uint64_t reply_bytes;                    // the reply's size
};
static_assert(sizeof(RingControl) <= kRingControlBytes, "the control block fits its page");

}  // namespace tpdraft::serve
