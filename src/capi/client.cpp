// The client side of `tpdraft serve` in the C ABI: a ZeroMQ DEALER socket, requests encoded as
// docs/protocol.md says, a wait for the matching reply that never outlasts the timeout, taps
// through the client's shared-memory ring when the server maps it, and a socket monitor so that
// a server that goes away fails the call at once instead of at the timeout.
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <zmq.h>

#include "capi/caps.h"
#include "capi/last_error.h"
#include "core/bounds.h"
#include "serve/keys.h"
#include "serve/message.h"
#include "serve/protocol.h"
#include "serve/ring.h"
#include "tpdraft/tpdraft.h"

namespace serve = tpdraft::serve;

struct tpdraft_client {
  std::mutex mutex;
  std::string address;
  double timeout = 10;
  void* ctx = nullptr;
  void* sock = nullptr;
  void* monitor = nullptr;  // PAIR socket receiving the DEALER's disconnect events
  uint64_t next_id = 0;
  std::string broken;  // why the client is closed for good ("" while it works)
  serve::WireCaps caps;
  // The shared-memory ring (the client writes, the server reads), unlinked once both mapped it.
  char* ring = nullptr;
  size_t ring_bytes = 0;
  bool ring_on = false;
  uint32_t ring_seq = 0;     // the last request_seq this client set
  size_t ring_free = 0;      // where the current request may go in the ring (past its taps)
  size_t reply_room = 8192;  // the reply the current request may get
  std::string frame;                 // the request being built, reused
  std::vector<char> reply;           // the last reply
  tpdraft_step_times times{};
  bool connected_once = false;
  bool curve = false;  // the connection is encrypted for a server key
  bool handshake_done = false, handshake_failed = false;
};

namespace {

using Clock = std::chrono::steady_clock;
using serve::Message;
using tpdraft::capi::fail;
using tpdraft::capi::ok;

tpdraft_status status_of(uint32_t wire) {
  switch (wire) {
    case serve::kArgument:
    case serve::kMalformed: return TPDRAFT_ERROR_ARGUMENT;
    case serve::kInput: return TPDRAFT_ERROR_INPUT;
    case serve::kClosing: return TPDRAFT_ERROR_UNAVAILABLE;
    case serve::kBusy: return TPDRAFT_ERROR_BUSY;
    default: return TPDRAFT_ERROR_RUNTIME;
  }
}

// Reads the monitor's pending events; returns true when the connection to the server was lost
// after it had been made.
bool lost_connection(tpdraft_client* c) {
  bool lost = false;
  for (;;) {
    Message ev;
    if (zmq_msg_recv(&ev.msg, c->monitor, ZMQ_DONTWAIT) < 0) return lost;
    uint16_t event = 0;
    if (ev.size() >= 2) std::memcpy(&event, ev.data(), 2);
    if (zmq_msg_more(&ev.msg) != 0) {  // the endpoint frame
      Message addr;
      zmq_msg_recv(&addr.msg, c->monitor, 0);
    }
    if (event == ZMQ_EVENT_CONNECTED) c->connected_once = true;
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) c->handshake_done = true;
    if (event & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)) {
      c->handshake_failed = true;
      lost = true;
    }
    if (event == ZMQ_EVENT_DISCONNECTED && c->connected_once) lost = true;
  }
}

tpdraft_status break_client(tpdraft_client* c, const std::string& why) {
  c->broken = why;
  // Nothing more goes out: a late reply can no longer meet a later request.
  if (c->sock != nullptr) zmq_close(std::exchange(c->sock, nullptr));
  return fail(TPDRAFT_ERROR_UNAVAILABLE, why);
}

// Keeps the reply of `bytes` at `data` in c->reply; when it answers request `id`, its status, and
// on an error the server's message; nullopt when it answers an earlier request.
std::optional<tpdraft_status> take_reply(tpdraft_client* c, uint64_t id, const char* what, const char* data,
                                         size_t bytes) {
  c->reply.assign(data, data + bytes);
  serve::Reader r(c->reply.data(), c->reply.size());
  serve::Header h;
  try {
    h = r.header();
  } catch (const std::exception& e) {
    return break_client(c, fmt::format("{}: an unreadable reply from {}: {}", what, c->address, e.what()));
  }
  if (h.version != serve::kProtocolVersion)
    return break_client(c, fmt::format("{}: the server at {} speaks protocol version {}, this client {}", what,
                                       c->address, h.version, serve::kProtocolVersion));
  if (h.id != id) return std::nullopt;
  if (h.status == serve::kOk) return TPDRAFT_OK;
  std::string message;
  try {
    message = r.str("message", 1 << 20);
  } catch (const std::exception&) {
    message = "(no message)";
  }
  const tpdraft_status st = status_of(h.status);
  if (st == TPDRAFT_ERROR_UNAVAILABLE || st == TPDRAFT_ERROR_RUNTIME)
    return break_client(c, fmt::format("{}: the server at {}: {}", what, c->address, message));
  return fail(st, fmt::format("{}: {}", what, message));
}

tpdraft_status lost(tpdraft_client* c, const char* what) {
  if (c->handshake_failed && !c->handshake_done)  // never got through: a key that does not match
    return break_client(c, fmt::format("{}: the server at {} refused the connection's handshake: {}; this client is "
                                       "closed", what, c->address,
                                       c->curve ? "it does not hold the secret key of options.server_key (or takes "
                                                  "no CURVE keys)"
                                                : "it takes only clients given its CURVE key (options.server_key)"));
  return break_client(c, fmt::format("{}: the connection to {} was lost (the server ended); its sessions are gone: "
                                     "this client is closed", what, c->address));
}

tpdraft_status too_late(tpdraft_client* c, const char* what) {
  return break_client(c, fmt::format("{}: no reply from {} within {} s (the server is stopped, busy or gone, or the "
                                     "request was larger than it accepts, which it drops without a reply{}); this "
                                     "client is closed: open a new one", what, c->address, c->timeout,
                                     c->curve ? ", or the server does not hold the secret key of options.server_key"
                                              : ", or the server takes only clients given its CURVE key "
                                                "(options.server_key)"));
}

// A call on a client that a failure closed: named as this call, with the failure that closed it.
tpdraft_status closed(tpdraft_client* c, const char* what) {
  return fail(TPDRAFT_ERROR_UNAVAILABLE, fmt::format("{}: this client is closed after an earlier failure: {}", what,
                                                     c->broken));
}

// Starts `frame` with a request header.
serve::Writer begin(std::string* frame, uint16_t kind, uint32_t count = 0) {
  frame->clear();
  serve::Writer w(frame);
  serve::Header h;
  h.kind = kind;
  h.count = count;
  w.header(h);
  return w;
}

// The request through the ring: the frame placed at `at`, the reply area after it. The
// wait spins briefly (a small step is answered within tens of microseconds), then sleeps on the
// futex in slices, looking at the socket's events between them.
tpdraft_status exchange_ring(tpdraft_client* c, const char* what, uint64_t id, size_t at) {
  serve::RingControl* ctl = reinterpret_cast<serve::RingControl*>(c->ring);
  const size_t reply_at = (at + c->frame.size() + 63) / 64 * 64;
  std::memcpy(c->ring + at, c->frame.data(), c->frame.size());
  ctl->request_offset = at;
  ctl->request_bytes = c->frame.size();
  ctl->reply_offset = reply_at;
  ctl->reply_capacity = c->ring_bytes - reply_at;
  const uint32_t seq = ++c->ring_seq;
  serve::ring_store(&ctl->request_seq, seq);
  if (serve::ring_load(&ctl->server_sleeping) != 0) {
    std::string bell;
    begin(&bell, serve::kBell);
    if (zmq_send(c->sock, bell.data(), bell.size(), ZMQ_DONTWAIT) < 0)
      return break_client(c, fmt::format("{}: cannot send to {}: {}", what, c->address, zmq_strerror(zmq_errno())));
  }
  const auto started = Clock::now();
  const auto deadline = started + std::chrono::duration<double>(c->timeout);
  for (;;) {
    if (serve::ring_load(&ctl->reply_seq) == seq) break;
    const auto now = Clock::now();
    if (now - started < std::chrono::microseconds(200)) {
      sched_yield();  // on a machine with idle cores at once; on a busy one it lets the server run
      continue;
    }
    const double left = std::chrono::duration<double>(deadline - now).count();
    if (left <= 0) return too_late(c, what);
    zmq_pollitem_t mon{c->monitor, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&mon, 1, 0) > 0 && lost_connection(c) && serve::ring_load(&ctl->reply_seq) != seq)
      return lost(c, what);
    serve::ring_store(&ctl->client_sleeping, 1);
    const uint32_t now_seq = serve::ring_load(&ctl->reply_seq);
    if (now_seq != seq) serve::ring_wait(&ctl->reply_seq, now_seq, std::min(left, 0.05));
    serve::ring_store(&ctl->client_sleeping, 0);
  }
  const uint64_t bytes = ctl->reply_bytes;
  if (bytes > c->ring_bytes - reply_at)
    return break_client(c, fmt::format("{}: the server's reply of {} bytes passes the ring's end", what, bytes));
  const std::optional<tpdraft_status> st = take_reply(c, id, what, c->ring + reply_at, bytes);
  return st ? *st : break_client(c, fmt::format("{}: the ring's reply answers another request", what));
}

// Sends c->frame (its header's id set here) and waits for the reply with that id into c->reply,
// through the ring when it holds the request and its reply, else through the socket. On an
// error reply returns its status with the server's message.
tpdraft_status exchange(tpdraft_client* c, const char* what) {
  if (!c->broken.empty()) return closed(c, what);
  const uint64_t id = ++c->next_id;
  std::memcpy(&c->frame[16], &id, sizeof(id));
  const size_t at = std::max<size_t>(c->ring_free, serve::kRingControlBytes);
  const bool by_ring = c->ring_on && at < c->ring_bytes &&
                       c->frame.size() + c->reply_room + 64 <= c->ring_bytes - at;
  c->ring_free = 0;
  c->reply_room = 8192;
  if (by_ring) return exchange_ring(c, what, id, at);
  if (zmq_send(c->sock, c->frame.data(), c->frame.size(), ZMQ_DONTWAIT) < 0)
    return break_client(c, fmt::format("{}: cannot send to {}: {}", what, c->address, zmq_strerror(zmq_errno())));
  const auto deadline = Clock::now() + std::chrono::duration<double>(c->timeout);
  zmq_pollitem_t items[2] = {{c->sock, 0, ZMQ_POLLIN, 0}, {c->monitor, 0, ZMQ_POLLIN, 0}};
  bool lost = false;  // the connection went: one more look at the socket, then the call fails
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) return too_late(c, what);
    const long ms = lost ? 0 : static_cast<long>(left * 1000) + 1;
    if (zmq_poll(items, 2, ms) < 0) {
      if (zmq_errno() == EINTR) continue;
      return break_client(c, fmt::format("{}: waiting for {}: {}", what, c->address, zmq_strerror(zmq_errno())));
    }
    // A reply that came before the server went is still the answer: read the socket first.
    Message m;
    if (zmq_msg_recv(&m.msg, c->sock, ZMQ_DONTWAIT) < 0) {
      if (lost) return ::lost(c, what);
      if ((items[1].revents & ZMQ_POLLIN) && lost_connection(c)) lost = true;
      continue;
    }
    if (const std::optional<tpdraft_status> st = take_reply(c, id, what, m.data(), m.size())) return *st;
  }
}

// The reply's body after the header.
serve::Reader body(tpdraft_client* c) {
  serve::Reader r(c->reply.data(), c->reply.size());
  r.header();
  return r;
}

template <typename F>
tpdraft_status guarded(tpdraft_client* c, const char* what, F&& fn) noexcept {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return fail(TPDRAFT_ERROR_RUNTIME, std::string(what) + ": out of memory");
  } catch (const std::exception& e) {
    // A reply that does not read as the protocol says: the two ends no longer agree.
    return break_client(c, std::string(what) + ": " + e.what());
  }
}

// A request of `kind` under the client's lock, its body the session when one is given; `read`
// takes what an ok reply holds.
template <typename Read>
tpdraft_status request(tpdraft_client* c, const char* what, uint16_t kind,
                       std::optional<tpdraft_session> session, Read&& read) {
  std::lock_guard<std::mutex> lock(c->mutex);
  return guarded(c, what, [&]() -> tpdraft_status {
    serve::Writer w = begin(&c->frame, kind);
    if (session) w.put<int64_t>(*session);
    const tpdraft_status st = exchange(c, what);
    if (st != TPDRAFT_OK) return st;
    serve::Reader r = body(c);
    read(r);
    return ok();
  });
}

bool make_ring(tpdraft_client* c, int64_t bytes, std::string* name) {
  static std::atomic<uint64_t> counter{0};
  *name = fmt::format("{}{}-{}-{}", serve::kRingNamePrefix, getpid(), counter++,
                      std::chrono::steady_clock::now().time_since_epoch().count() % 1000000);
  const int fd = shm_open(name->c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return false;
  void* p = ftruncate(fd, bytes) == 0
                ? mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name->c_str());
    return false;
  }
  c->ring = static_cast<char*>(p);
  c->ring_bytes = static_cast<size_t>(bytes);
  return true;
}

void free_client(tpdraft_client* c) {
  if (c->sock != nullptr) zmq_close(c->sock);
  if (c->monitor != nullptr) zmq_close(c->monitor);
  if (c->ctx != nullptr) zmq_ctx_term(c->ctx);
  if (c->ring != nullptr) munmap(c->ring, c->ring_bytes);
  delete c;
}

// The entry's checks against the server's caps; the message names the entry.
std::string check_entry(const tpdraft_step_entry& e, size_t i, const serve::WireCaps& caps) {
  const std::string missing = tpdraft::capi::missing_buffer(e, i);
  if (!missing.empty()) return missing;
  if (e.dist_width < -1 || e.dist_width > caps.vocab)
    return fmt::format("entry {}: a distribution width must be 0, 1..{} or -1 (every token), "
                       "got {}", i, caps.vocab, e.dist_width);
  if (e.taps_on_device != 0) return fmt::format("entry {}: taps in device memory cannot be sent to a server", i);
  if (e.n_new < 0) return fmt::format("entry {}: n_new {} is negative", i, e.n_new);
  if (e.n_new > 0 && e.taps == nullptr) return fmt::format("entry {}: {} new rows but no taps", i, e.n_new);
  if (e.taps_dtype < 0 || e.taps_dtype > 2)
    return fmt::format("entry {}: taps_dtype {} is not TPDRAFT_F32, TPDRAFT_BF16 or TPDRAFT_F16", i, e.taps_dtype);
  if (e.n_new > caps.max_context)
    return fmt::format("entry {}: n_new {} is beyond the max context {}", i, e.n_new, caps.max_context);
  return "";
}

// The outputs of a step that failed: no drafts.
void no_drafts(tpdraft_step_entry* entries, size_t count, int64_t rows) {
  if (entries == nullptr) return;
  for (size_t i = 0; i < count; ++i) {
    if (entries[i].tokens != nullptr) std::fill_n(entries[i].tokens, rows, -1);
    if (entries[i].q != nullptr) std::fill_n(entries[i].q, rows, 0.0f);
  }
}

}  // namespace

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
  auto failed = [](tpdraft_status status, const std::string& why) {
    return fail(status, "tpdraft_client_open: " + why);
  };
  auto refused = [&](const std::string& why) { return failed(TPDRAFT_ERROR_ARGUMENT, why); };
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
  const std::string addr(address);
  const bool ipc = addr.rfind("ipc://", 0) == 0;
  if (!ipc && addr.rfind("tcp://", 0) != 0)
    return refused("address '" + addr + "' is not ipc://PATH or tcp://HOST:PORT");
  if (o.shared_memory == 1 && !ipc)
    return refused("shared memory needs an ipc:// address (the server on this machine), got " + addr);
  const bool want_ring = o.shared_memory == 1 || (o.shared_memory == -1 && ipc);
  if (want_ring && (o.ring_bytes < tpdraft::kMinRingBytes || o.ring_bytes > tpdraft::kMaxRingBytes))
    return refused(fmt::format("options.ring_bytes is {}, expected {}..{}", o.ring_bytes, tpdraft::kMinRingBytes, tpdraft::kMaxRingBytes));
  std::string server_key;
  if (o.server_key != nullptr) {
    try {
      server_key = serve::server_key_from(o.server_key, "options.server_key");
    } catch (const std::exception& e) {
      return refused(e.what());
    }
    if (!serve::curve_available()) return refused("options.server_key: this ZeroMQ was built without CURVE (libsodium)");
  }
  auto* c = new (std::nothrow) tpdraft_client();
  if (c == nullptr) return failed(TPDRAFT_ERROR_RUNTIME, "out of memory");
  c->address = addr;
  c->timeout = o.timeout_seconds;
  const tpdraft_status st = guarded(c, "tpdraft_client_open", [&]() -> tpdraft_status {
    c->ctx = zmq_ctx_new();
    if (c->ctx == nullptr) return failed(TPDRAFT_ERROR_RUNTIME, "cannot start ZeroMQ");
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (c->sock == nullptr) return failed(TPDRAFT_ERROR_RUNTIME, "cannot make a socket");
    const int linger = 0;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof(linger));
    const std::string mon = fmt::format("inproc://tpdraft-client-monitor-{}", static_cast<const void*>(c));
    const int events = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                       ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    if (zmq_socket_monitor(c->sock, mon.c_str(), events) != 0)
      return failed(TPDRAFT_ERROR_RUNTIME, "cannot monitor the socket");
    c->monitor = zmq_socket(c->ctx, ZMQ_PAIR);
    zmq_setsockopt(c->monitor, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_connect(c->monitor, mon.c_str()) != 0)
      return failed(TPDRAFT_ERROR_RUNTIME, "cannot read the socket's events");
    if (!server_key.empty()) {  // a throwaway key pair of this client's own for the handshake
      char pub[serve::kCurveKeyChars + 1] = {0}, sec[serve::kCurveKeyChars + 1] = {0};
      if (zmq_curve_keypair(pub, sec) != 0 ||
          zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, server_key.c_str(), serve::kCurveKeyChars) != 0 ||
          zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, pub, serve::kCurveKeyChars) != 0 ||
          zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, sec, serve::kCurveKeyChars) != 0)
        return failed(TPDRAFT_ERROR_RUNTIME, fmt::format("cannot set up CURVE: {}", zmq_strerror(zmq_errno())));
      c->curve = true;
    }
    if (zmq_connect(c->sock, address) != 0)
      return failed(TPDRAFT_ERROR_ARGUMENT, fmt::format("cannot connect to {}: {}", addr, zmq_strerror(zmq_errno())));
    std::string ring_name;
    if (want_ring && !make_ring(c, o.ring_bytes, &ring_name)) {
      if (o.shared_memory == 1)
        return failed(TPDRAFT_ERROR_RUNTIME, fmt::format("cannot make a shared-memory ring: {}", std::strerror(errno)));
      ring_name.clear();
    }
    serve::Writer w = begin(&c->frame, serve::kHello);
    w.str(ring_name);
    w.put<uint64_t>(ring_name.empty() ? 0 : c->ring_bytes);
    tpdraft_status hello = exchange(c, "tpdraft_client_open (HELLO)");
    // Both sides have mapped the ring (or the server said why not): its name is no longer needed.
    if (!ring_name.empty()) shm_unlink(ring_name.c_str());
    if (hello != TPDRAFT_OK) return hello;
    serve::Reader r = body(c);
    c->caps = serve::get_caps(r);
    r.get<double>("hello.idle_timeout");
    c->ring_on = r.get<uint32_t>("hello.ring_mapped") == 1 && c->ring != nullptr;
    const std::string note = r.str("hello.ring_note");
    if (o.shared_memory == 1 && !c->ring_on)
      return failed(TPDRAFT_ERROR_RUNTIME, "the server could not map the shared-memory ring: " + note);
    if (!c->ring_on && c->ring != nullptr) munmap(std::exchange(c->ring, nullptr), c->ring_bytes);
    return TPDRAFT_OK;
  });
  if (st != TPDRAFT_OK) {
    free_client(c);
    return st;
  }
  *out = c;
  return ok();
}

void tpdraft_client_close(tpdraft_client* c) {
  if (c == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (c->broken.empty()) {
      // Tell the server to close this client's sessions now rather than at its idle timeout; a
      // short wait, as a server that does not answer will reap them itself.
      c->timeout = std::min(c->timeout, 1.0);
      begin(&c->frame, serve::kBye);
      exchange(c, "tpdraft_client_close");
    }
  }
  free_client(c);
}

tpdraft_status tpdraft_client_caps_get(const tpdraft_client* c, tpdraft_caps* out) {
  if (c == nullptr || out == nullptr) return fail(TPDRAFT_ERROR_ARGUMENT, "tpdraft_client_caps_get: client or out is NULL");
  return tpdraft::capi::fill_caps("tpdraft_client_caps_get", c->caps, c->caps.backend, out);
}

int32_t tpdraft_client_shared_memory(const tpdraft_client* c) { return c != nullptr && c->ring_on ? 1 : 0; }

tpdraft_status tpdraft_client_session_open(tpdraft_client* c, tpdraft_session* out) {
  if (c == nullptr || out == nullptr) return fail(TPDRAFT_ERROR_ARGUMENT, "tpdraft_client_session_open: client or out is NULL");
  return request(c, "tpdraft_client_session_open", serve::kOpen, {},
                 [&](serve::Reader& r) { *out = r.get<int64_t>("open.session"); });
}

tpdraft_status tpdraft_client_session_close(tpdraft_client* c, tpdraft_session session) {
  if (c == nullptr) return fail(TPDRAFT_ERROR_ARGUMENT, "tpdraft_client_session_close: client is NULL");
  return request(c, "tpdraft_client_session_close", serve::kClose, session, [](serve::Reader&) {});
}

tpdraft_status tpdraft_client_session_length(tpdraft_client* c, tpdraft_session session, int64_t* out) {
  if (c == nullptr || out == nullptr)
    return fail(TPDRAFT_ERROR_ARGUMENT, "tpdraft_client_session_length: client or out is NULL");
  return request(c, "tpdraft_client_session_length", serve::kLength, session,
                 [&](serve::Reader& r) { *out = r.get<int64_t>("length"); });
}

tpdraft_status tpdraft_client_step(tpdraft_client* c, tpdraft_step_entry* entries, size_t count) {
  const auto started = Clock::now();
  if (c == nullptr) return fail(TPDRAFT_ERROR_ARGUMENT, "tpdraft_client_step: client is NULL");
  if (entries == nullptr && count > 0) return fail(TPDRAFT_ERROR_ARGUMENT, "tpdraft_client_step: entries is NULL");
  std::lock_guard<std::mutex> lock(c->mutex);
  const int64_t rows = c->caps.block - 1;
  size_t validated = 0;  // entries known to be the caller's, with their buffers: what a failure may write to
  const tpdraft_status st = guarded(c, "tpdraft_client_step", [&]() -> tpdraft_status {
    if (!c->broken.empty()) return closed(c, "tpdraft_client_step");
    if (count == 0 || count > static_cast<size_t>(c->caps.max_sessions))
      return fail(TPDRAFT_ERROR_ARGUMENT, fmt::format("tpdraft_client_step: a step takes 1 to {} entries (the "
                                                      "server's max sessions), got {}", c->caps.max_sessions, count));
    const int64_t width = c->caps.taps_width;
    const size_t n = static_cast<size_t>(rows);
    std::vector<serve::WireEntry> wire(count);
    std::vector<std::pair<const void*, size_t>> inline_taps;
    size_t ring_at = serve::kRingControlBytes, inline_at = 0;
    size_t reply = 64;
    for (size_t i = 0; i < count; ++i) {
      const tpdraft_step_entry& e = entries[i];
      const std::string bad = check_entry(e, i, c->caps);
      if (!bad.empty()) return fail(TPDRAFT_ERROR_ARGUMENT, "tpdraft_client_step: " + bad);
      validated = i + 1;
      serve::WireEntry& x = wire[i];
      serve::fields_to_wire(e, &x);
      x.taps_dtype = static_cast<uint32_t>(e.taps_dtype);
      const size_t w = e.dist_width < 0 ? static_cast<size_t>(c->caps.vocab) : static_cast<size_t>(e.dist_width);
      reply += n * 12 + (e.dist_width == 0 ? 0 : n * w * (e.dist_width > 0 ? 12 : 4) + n * 4);
      const size_t bytes = static_cast<size_t>(e.n_new) * static_cast<size_t>(width) * serve::dtype_bytes(x.taps_dtype);
      x.taps_bytes = bytes;
      if (bytes == 0) {
        x.taps_where = serve::kTapsNone;
      } else if (c->ring_on && bytes <= c->ring_bytes - ring_at) {
        x.taps_where = serve::kTapsRing;
        x.taps_offset = ring_at;
        std::memcpy(c->ring + ring_at, e.taps, bytes);
        ring_at = std::min(c->ring_bytes, (ring_at + bytes + 63) / 64 * 64);
      } else {
        x.taps_where = serve::kTapsInline;
        x.taps_offset = inline_at;
        inline_taps.emplace_back(e.taps, bytes);
        inline_at += (bytes + 7) / 8 * 8;
      }
    }
    serve::Writer w = begin(&c->frame, serve::kStep, static_cast<uint32_t>(count));
    for (const auto& x : wire) serve::put_entry(w, x);
    for (const auto& t : inline_taps) {
      w.bytes(t.first, t.second);
      static const char zeros[8] = {0};
      w.bytes(zeros, (8 - t.second % 8) % 8);
    }
    c->ring_free = (ring_at + 63) / 64 * 64;
    c->reply_room = std::max<size_t>(reply, 8192);
    const tpdraft_status sent = exchange(c, "tpdraft_client_step");
    if (sent != TPDRAFT_OK) return sent;
    serve::Reader r = body(c);
    const double settle = r.get<double>("step.settle_seconds");
    const double draft = r.get<double>("step.draft_seconds");
    r.get<double>("step.server_seconds");
    r.get<uint32_t>("step.batch_entries");
    r.get<uint32_t>("step.batch_requests");
    for (size_t i = 0; i < count; ++i) {
      tpdraft_step_entry& e = entries[i];
      std::memcpy(e.tokens, r.bytes(n * sizeof(int64_t), "step.tokens"), n * sizeof(int64_t));
      const char* q = r.bytes(n * sizeof(float), "step.q");
      if (e.q != nullptr) std::memcpy(e.q, q, n * sizeof(float));
      if (e.dist_width == 0) continue;
      const size_t width = e.dist_width < 0 ? static_cast<size_t>(c->caps.vocab) : static_cast<size_t>(e.dist_width);
      for (size_t row = 0; row < n; ++row) {
        if (e.dist_width > 0)
          std::memcpy(e.dist_ids + row * width, r.bytes(width * sizeof(int64_t), "step.dist_ids"), width * sizeof(int64_t));
        std::memcpy(e.dist_probs + row * width, r.bytes(width * sizeof(float), "step.dist_probs"), width * sizeof(float));
        if (e.dist_width > 0) {
          const float rest = r.get<float>("step.dist_rest");
          if (e.dist_rest != nullptr) e.dist_rest[row] = rest;
        }
      }
    }
    c->times = {settle, draft, std::chrono::duration<double>(Clock::now() - started).count()};
    return ok();
  });
  if (st != TPDRAFT_OK) no_drafts(entries, validated, rows);
  return st;
}

tpdraft_status tpdraft_client_last_step_times(tpdraft_client* c, tpdraft_step_times* out) {
  if (c == nullptr || out == nullptr)
    return fail(TPDRAFT_ERROR_ARGUMENT, "tpdraft_client_last_step_times: client or out is NULL");
  std::lock_guard<std::mutex> lock(c->mutex);
  *out = c->times;
  return ok();
}

tpdraft_status tpdraft_client_stats(tpdraft_client* c, tpdraft_server_stats* out) {
  if (c == nullptr || out == nullptr) return fail(TPDRAFT_ERROR_ARGUMENT, "tpdraft_client_stats: client or out is NULL");
  return request(c, "tpdraft_client_stats", serve::kStats, {},
                 [&](serve::Reader& r) { *out = serve::get_stats(r); });
}

tpdraft_status tpdraft_client_shutdown(tpdraft_client* c) {
  if (c == nullptr) return fail(TPDRAFT_ERROR_ARGUMENT, "tpdraft_client_shutdown: client is NULL");
  return request(c, "tpdraft_client_shutdown", serve::kShutdown, {}, [](serve::Reader&) {});
}

}  // extern "C"
