// The client of `tpdraft serve` (serve/client.h).
#include "serve/client.h"

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
#include <utility>
#include <vector>

#include <zmq.h>

#include "core/bounds.h"
#include "core/files.h"
#include "serve/keys.h"
#include "serve/message.h"
#include "serve/ring.h"

namespace tpdraft::serve {

namespace {

using Clock = std::chrono::steady_clock;

tpdraft_status status_of(uint32_t wire) {
  switch (wire) {
    case kArgument:
    case kMalformed: return TPDRAFT_ERROR_ARGUMENT;
    case kClosing: return TPDRAFT_ERROR_UNAVAILABLE;
    case kBusy: return TPDRAFT_ERROR_BUSY;
    default: return TPDRAFT_ERROR_RUNTIME;
  }
}

// Why entry i cannot be sent to a server of these caps ("" when it can); the message names the entry.
std::string entry_problem(const tpdraft_step_entry& e, size_t i, const WireCaps& caps) {
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

// Starts `frame` with a request header.
Writer begin(std::string* frame, uint16_t kind, uint32_t count = 0) {
  frame->clear();
  Writer w(frame);
  Header h;
  h.kind = kind;
  h.count = count;
  w.header(h);
  return w;
}

}  // namespace

struct Client::Impl {
  std::mutex mutex;
  std::string address;
  double timeout = 10;
  void* ctx = nullptr;
  void* sock = nullptr;
  void* monitor = nullptr;  // PAIR socket receiving the DEALER's disconnect events
  uint64_t next_id = 0;
  std::string broken;  // why the client is closed for good ("" while it works)
  WireCaps caps;
  // The shared-memory ring (the client writes, the server reads), unlinked once both mapped it.
  char* ring = nullptr;
  size_t ring_bytes = 0;
  bool ring_on = false;
  uint32_t ring_seq = 0;     // the last request_seq this client set
  size_t ring_free = 0;      // where the current request may go in the ring (past its taps)
  size_t reply_room = 8192;  // the reply the current request may get
  std::string frame;         // the request being built, reused
  std::vector<char> reply;   // the last reply
  tpdraft_step_times times{};
  bool connected_once = false;
  bool curve = false;  // the connection is encrypted for a server key
  bool handshake_done = false, handshake_failed = false;

  ~Impl() {
    if (sock != nullptr) zmq_close(sock);
    if (monitor != nullptr) zmq_close(monitor);
    if (ctx != nullptr) zmq_ctx_term(ctx);
    if (ring != nullptr) munmap(ring, ring_bytes);
  }

  // Reads the monitor's pending events; returns true when the connection to the server was lost
  // after it had been made.
  bool lost_connection() {
    bool lost = false;
    for (;;) {
      Message ev;
      if (zmq_msg_recv(&ev.msg, monitor, ZMQ_DONTWAIT) < 0) return lost;
      uint16_t event = 0;
      if (ev.size() >= 2) std::memcpy(&event, ev.data(), 2);
      if (zmq_msg_more(&ev.msg) != 0) {  // the endpoint frame
        Message addr;
        zmq_msg_recv(&addr.msg, monitor, 0);
      }
      if (event == ZMQ_EVENT_CONNECTED) connected_once = true;
      if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) handshake_done = true;
      if (event & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                   ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)) {
        handshake_failed = true;
        lost = true;
      }
      if (event == ZMQ_EVENT_DISCONNECTED && connected_once) lost = true;
    }
  }

  [[noreturn]] void break_client(const std::string& why) {
    broken = why;
    // Nothing more goes out: a late reply can no longer meet a later request.
    if (sock != nullptr) zmq_close(std::exchange(sock, nullptr));
    throw ClientError(TPDRAFT_ERROR_UNAVAILABLE, why);
  }

  // Keeps the reply of `bytes` at `data`; returns whether it answers request `id` (an ok reply;
  // an error reply throws with its status and the server's message), false when it answers an
  // earlier request.
  bool take_reply(uint64_t id, const char* what, const char* data, size_t bytes) {
    reply.assign(data, data + bytes);
    Reader r(reply.data(), reply.size());
    Header h;
    try {
      h = r.header();
    } catch (const std::exception& e) {
      break_client(fmt::format("{}: an unreadable reply from {}: {}", what, address, e.what()));
    }
    if (h.version != kProtocolVersion)
      break_client(fmt::format("{}: the server at {} speaks protocol version {}, this client {}", what, address,
                               h.version, kProtocolVersion));
    if (h.id != id) return false;
    if (h.status == kOk) return true;
    std::string message;
    try {
      message = r.str("message", 1 << 20);
    } catch (const std::exception&) {
      message = "(no message)";
    }
    const tpdraft_status st = status_of(h.status);
    if (st == TPDRAFT_ERROR_UNAVAILABLE || st == TPDRAFT_ERROR_RUNTIME)
      break_client(fmt::format("{}: the server at {}: {}", what, address, message));
    throw ClientError(st, fmt::format("{}: {}", what, message));
  }

  [[noreturn]] void lost(const char* what) {
    if (handshake_failed && !handshake_done)  // never got through: a key that does not match
      break_client(fmt::format("{}: the server at {} refused the connection's handshake: {}; this client is closed",
                               what, address,
                               curve ? "it does not hold the secret key of options.server_key (or takes no CURVE keys)"
                                     : "it takes only clients given its CURVE key (options.server_key)"));
    break_client(fmt::format("{}: the connection to {} was lost (the server ended); its sessions are gone: this "
                             "client is closed", what, address));
  }

  [[noreturn]] void too_late(const char* what) {
    break_client(fmt::format("{}: no reply from {} within {} s (the server is stopped, busy or gone, or the request "
                             "was larger than it accepts, which it drops without a reply{}); this client is closed: "
                             "open a new one", what, address, timeout,
                             curve ? ", or the server does not hold the secret key of options.server_key"
                                   : ", or the server takes only clients given its CURVE key (options.server_key)"));
  }

  // A call on a client that a failure closed: named as this call, with the failure that closed it.
  void check_open(const char* what) const {
    if (!broken.empty())
      throw ClientError(TPDRAFT_ERROR_UNAVAILABLE,
                        fmt::format("{}: this client is closed after an earlier failure: {}", what, broken));
  }

  // The request through the ring: the frame placed at `at`, the reply area after it. The
  // wait spins briefly (a small step is answered within tens of microseconds), then sleeps on the
  // futex in slices, looking at the socket's events between them.
  void exchange_ring(const char* what, uint64_t id, size_t at) {
    RingControl* ctl = reinterpret_cast<RingControl*>(ring);
    const size_t reply_at = (at + frame.size() + 63) / 64 * 64;
    std::memcpy(ring + at, frame.data(), frame.size());
    ctl->request_offset = at;
    ctl->request_bytes = frame.size();
    ctl->reply_offset = reply_at;
    ctl->reply_capacity = ring_bytes - reply_at;
    const uint32_t seq = ++ring_seq;
    shared_store(&ctl->request_seq, seq);
    if (shared_load(&ctl->server_sleeping) != 0) {
      std::string bell;
      begin(&bell, kBell);
      if (zmq_send(sock, bell.data(), bell.size(), ZMQ_DONTWAIT) < 0)
        break_client(fmt::format("{}: cannot send to {}: {}", what, address, zmq_strerror(zmq_errno())));
    }
    const auto started = Clock::now();
    const auto deadline = started + std::chrono::duration<double>(timeout);
    for (;;) {
      if (shared_load(&ctl->reply_seq) == seq) break;
      const auto now = Clock::now();
      if (now - started < std::chrono::microseconds(200)) {
        sched_yield();  // on a machine with idle cores at once; on a busy one it lets the server run
        continue;
      }
      const double left = std::chrono::duration<double>(deadline - now).count();
      if (left <= 0) too_late(what);
      zmq_pollitem_t mon{monitor, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&mon, 1, 0) > 0 && lost_connection() && shared_load(&ctl->reply_seq) != seq) lost(what);
      shared_store(&ctl->client_sleeping, 1);
      const uint32_t now_seq = shared_load(&ctl->reply_seq);
      if (now_seq != seq) futex_wait(&ctl->reply_seq, now_seq, std::min(left, 0.05));
      shared_store(&ctl->client_sleeping, 0);
    }
    const uint64_t bytes = ctl->reply_bytes;
    if (bytes > ring_bytes - reply_at)
      break_client(fmt::format("{}: the server's reply of {} bytes passes the ring's end", what, bytes));
    if (!take_reply(id, what, ring + reply_at, bytes))
      break_client(fmt::format("{}: the ring's reply answers another request", what));
  }

  // Sends `frame` (its header's id set here) and waits for the ok reply with that id into `reply`,
  // through the ring when it holds the request and its reply, else through the socket; returns
  // a reader of the reply's body.
  Reader exchange(const char* what) {
    check_open(what);
    const uint64_t id = ++next_id;
    std::memcpy(&frame[16], &id, sizeof(id));
    const size_t at = std::max<size_t>(ring_free, kRingControlBytes);
    const bool by_ring = ring_on && at < ring_bytes && frame.size() + reply_room + 64 <= ring_bytes - at;
    ring_free = 0;
    reply_room = 8192;
    by_ring ? exchange_ring(what, id, at) : exchange_socket(what, id);
    Reader r(reply.data(), reply.size());
    r.header();
    return r;
  }

  void exchange_socket(const char* what, uint64_t id) {
    if (zmq_send(sock, frame.data(), frame.size(), ZMQ_DONTWAIT) < 0)
      break_client(fmt::format("{}: cannot send to {}: {}", what, address, zmq_strerror(zmq_errno())));
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout);
    zmq_pollitem_t items[2] = {{sock, 0, ZMQ_POLLIN, 0}, {monitor, 0, ZMQ_POLLIN, 0}};
    bool gone = false;  // the connection went: one more look at the socket, then the call fails
    for (;;) {
      const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
      if (left <= 0) too_late(what);
      const long ms = gone ? 0 : static_cast<long>(left * 1000) + 1;
      if (zmq_poll(items, 2, ms) < 0) {
        if (zmq_errno() == EINTR) continue;
        break_client(fmt::format("{}: waiting for {}: {}", what, address, zmq_strerror(zmq_errno())));
      }
      // A reply that came before the server went is still the answer: read the socket first.
      Message m;
      if (zmq_msg_recv(&m.msg, sock, ZMQ_DONTWAIT) < 0) {
        if (gone) lost(what);
        if ((items[1].revents & ZMQ_POLLIN) && lost_connection()) gone = true;
        continue;
      }
      if (take_reply(id, what, m.data(), m.size())) return;
    }
  }

  // Runs fn under the client's lock. A reply that does not read as the protocol says (the two
  // ends no longer agree) closes the client.
  template <typename F>
  auto guarded(const char* what, F&& fn) {
    std::lock_guard<std::mutex> lock(mutex);
    try {
      return fn();
    } catch (const ClientError&) {
      throw;
    } catch (const std::bad_alloc&) {
      throw ClientError(TPDRAFT_ERROR_RUNTIME, std::string(what) + ": out of memory");
    } catch (const std::exception& e) {
      break_client(std::string(what) + ": " + e.what());
    }
  }

  // A request of `kind` under the client's lock, its body the session when one is given; `read`
  // takes what an ok reply holds.
  template <typename Read>
  auto request(const char* what, uint16_t kind, std::optional<int64_t> session, Read&& read) {
    return guarded(what, [&] {
      Writer w = begin(&frame, kind);
      if (session) w.put<int64_t>(*session);
      Reader r = exchange(what);
      return read(r);
    });
  }

  void open(const std::string& addr, const tpdraft_client_options& o);
};

void Client::Impl::open(const std::string& addr, const tpdraft_client_options& o) {
  auto failed = [](tpdraft_status status, const std::string& why) {
    throw ClientError(status, "tpdraft_client_open: " + why);
  };
  auto refused = [&](const std::string& why) { failed(TPDRAFT_ERROR_ARGUMENT, why); };
  const bool ipc = addr.rfind("ipc://", 0) == 0;
  if (!ipc && addr.rfind("tcp://", 0) != 0) refused("address '" + addr + "' is not ipc://PATH or tcp://HOST:PORT");
  if (o.shared_memory == 1 && !ipc)
    refused("shared memory needs an ipc:// address (the server on this machine), got " + addr);
  const bool want_ring = o.shared_memory == 1 || (o.shared_memory == -1 && ipc);
  if (want_ring && (o.ring_bytes < kMinRingBytes || o.ring_bytes > kMaxRingBytes))
    refused(fmt::format("options.ring_bytes is {}, expected {}..{}", o.ring_bytes, kMinRingBytes, kMaxRingBytes));
  std::string server_key;
  if (o.server_key != nullptr) {
    try {
      server_key = server_key_from(o.server_key, "options.server_key");
    } catch (const std::exception& e) {
      refused(e.what());
    }
    if (!curve_available()) refused("options.server_key: this ZeroMQ was built without CURVE (libsodium)");
  }
  address = addr;
  timeout = o.timeout_seconds;
  guarded("tpdraft_client_open", [&] {
    ctx = zmq_ctx_new();
    if (ctx == nullptr) failed(TPDRAFT_ERROR_RUNTIME, "cannot start ZeroMQ");
    sock = zmq_socket(ctx, ZMQ_DEALER);
    if (sock == nullptr) failed(TPDRAFT_ERROR_RUNTIME, "cannot make a socket");
    const int linger = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
    const std::string mon = fmt::format("inproc://tpdraft-client-monitor-{}", static_cast<const void*>(this));
    const int events = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                       ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    if (zmq_socket_monitor(sock, mon.c_str(), events) != 0) failed(TPDRAFT_ERROR_RUNTIME, "cannot monitor the socket");
    monitor = zmq_socket(ctx, ZMQ_PAIR);
    zmq_setsockopt(monitor, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_connect(monitor, mon.c_str()) != 0) failed(TPDRAFT_ERROR_RUNTIME, "cannot read the socket's events");
    if (!server_key.empty()) {  // a throwaway key pair of this client's own for the handshake
      char pub[kCurveKeyChars + 1] = {0}, sec[kCurveKeyChars + 1] = {0};
      if (zmq_curve_keypair(pub, sec) != 0 ||
          zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_key.c_str(), kCurveKeyChars) != 0 ||
          zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, kCurveKeyChars) != 0 ||
          zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, kCurveKeyChars) != 0)
        failed(TPDRAFT_ERROR_RUNTIME, fmt::format("cannot set up CURVE: {}", zmq_strerror(zmq_errno())));
      curve = true;
    }
    if (zmq_connect(sock, addr.c_str()) != 0)
      failed(TPDRAFT_ERROR_ARGUMENT, fmt::format("cannot connect to {}: {}", addr, zmq_strerror(zmq_errno())));
    std::string ring_name;
    if (want_ring) {
      static std::atomic<uint64_t> counter{0};
      ring_name = fmt::format("{}{}-{}-{}", kRingNamePrefix, getpid(), counter++,
                              Clock::now().time_since_epoch().count() % 1000000);
      ring_bytes = static_cast<size_t>(o.ring_bytes);
      ring = static_cast<char*>(map_shared_memory(ring_name.c_str(), ring_bytes, true));
    }
    if (want_ring && ring == nullptr) {
      if (o.shared_memory == 1)
        failed(TPDRAFT_ERROR_RUNTIME, fmt::format("cannot make a shared-memory ring: {}", std::strerror(errno)));
      ring_name.clear();
    }
    // Once HELLO is answered both sides have mapped the ring (or the server said why not): its
    // name is no longer needed, however the call ends.
    struct Unlink {
      const std::string& name;
      ~Unlink() { if (!name.empty()) shm_unlink(name.c_str()); }
    } unlink_ring{ring_name};
    Writer w = begin(&frame, kHello);
    w.str(ring_name);
    w.put<uint64_t>(ring_name.empty() ? 0 : ring_bytes);
    Reader r = exchange("tpdraft_client_open (HELLO)");
    caps = get_caps(r);
    r.get<double>("hello.idle_timeout");
    ring_on = r.get<uint32_t>("hello.ring_mapped") == 1 && ring != nullptr;
    const std::string note = r.str("hello.ring_note");
    if (o.shared_memory == 1 && !ring_on)
      failed(TPDRAFT_ERROR_RUNTIME, "the server could not map the shared-memory ring: " + note);
    if (!ring_on && ring != nullptr) munmap(std::exchange(ring, nullptr), ring_bytes);
  });
}

Client::Client(const std::string& address, const tpdraft_client_options& options) : impl_(std::make_unique<Impl>()) {
  impl_->open(address, options);
}

Client::~Client() = default;

void Client::close() {
  Impl& c = *impl_;
  std::lock_guard<std::mutex> lock(c.mutex);
  if (!c.broken.empty()) return;
  c.timeout = std::min(c.timeout, 1.0);
  begin(&c.frame, kBye);
  c.exchange("tpdraft_client_close");
}

const WireCaps& Client::caps() const { return impl_->caps; }

bool Client::shared_memory() const { return impl_->ring_on; }

int64_t Client::open_session() {
  return impl_->request("tpdraft_client_session_open", kOpen, {},
                        [](Reader& r) { return r.get<int64_t>("open.session"); });
}

void Client::close_session(int64_t session) {
  impl_->request("tpdraft_client_session_close", kClose, session, [](Reader&) {});
}

int64_t Client::session_length(int64_t session) {
  return impl_->request("tpdraft_client_session_length", kLength, session,
                        [](Reader& r) { return r.get<int64_t>("length"); });
}

WireStats Client::stats() {
  return impl_->request("tpdraft_client_stats", kStats, {}, [](Reader& r) { return get_stats(r); });
}

void Client::shutdown() {
  impl_->request("tpdraft_client_shutdown", kShutdown, {}, [](Reader&) {});
}

tpdraft_step_times Client::last_times() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->times;
}

void Client::step(tpdraft_step_entry* entries, size_t count, const EntryCheck& check) {
  const auto started = Clock::now();
  Impl& c = *impl_;
  const char* what = "tpdraft_client_step";
  const int64_t rows = c.caps.block - 1;
  size_t validated = 0;  // entries known to be the caller's, with their buffers: what a failure may write to
  try {
    c.guarded(what, [&] {
      c.check_open(what);
      if (count == 0 || count > static_cast<size_t>(c.caps.max_sessions))
        throw ClientError(TPDRAFT_ERROR_ARGUMENT, fmt::format("tpdraft_client_step: a step takes 1 to {} entries (the "
                                                              "server's max sessions), got {}", c.caps.max_sessions,
                                                              count));
      const int64_t width = c.caps.taps_width;
      const size_t n = static_cast<size_t>(rows);
      Writer out = begin(&c.frame, kStep, static_cast<uint32_t>(count));
      std::vector<std::pair<const void*, size_t>> inline_taps;
      size_t ring_at = kRingControlBytes, inline_at = 0;
      size_t reply = 64;
      for (size_t i = 0; i < count; ++i) {
        const tpdraft_step_entry& e = entries[i];
        std::string bad = check(e, i);
        if (bad.empty()) bad = entry_problem(e, i, c.caps);
        if (!bad.empty()) throw ClientError(TPDRAFT_ERROR_ARGUMENT, "tpdraft_client_step: " + bad);
        validated = i + 1;
        WireEntry x{e.session, e.keep, e.p0, e.n_new, e.anchor, e.dist_width, e.sampling.top_k,
                    e.sampling.temperature, e.sampling.top_p, e.sampling.seed, static_cast<uint32_t>(e.taps_dtype)};
        const size_t w = e.dist_width < 0 ? static_cast<size_t>(c.caps.vocab) : static_cast<size_t>(e.dist_width);
        reply += n * 12 + (e.dist_width == 0 ? 0 : n * w * (e.dist_width > 0 ? 12 : 4) + n * 4);
        const size_t bytes = static_cast<size_t>(e.n_new) * static_cast<size_t>(width) * dtype_bytes(x.taps_dtype);
        x.taps_bytes = bytes;
        if (bytes > 0 && c.ring_on && bytes <= c.ring_bytes - ring_at) {
          x.taps_where = kTapsRing;
          x.taps_offset = ring_at;
          std::memcpy(c.ring + ring_at, e.taps, bytes);
          ring_at = std::min(c.ring_bytes, (ring_at + bytes + 63) / 64 * 64);
        } else if (bytes > 0) {
          x.taps_where = kTapsInline;
          x.taps_offset = inline_at;
          inline_taps.emplace_back(e.taps, bytes);
          inline_at += (bytes + 7) / 8 * 8;
        }
        put_entry(out, x);
      }
      for (const auto& t : inline_taps) {
        out.bytes(t.first, t.second);
        static const char zeros[8] = {0};
        out.bytes(zeros, (8 - t.second % 8) % 8);
      }
      c.ring_free = (ring_at + 63) / 64 * 64;
      c.reply_room = std::max<size_t>(reply, 8192);
      Reader r = c.exchange(what);
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
        const size_t width = e.dist_width < 0 ? static_cast<size_t>(c.caps.vocab) : static_cast<size_t>(e.dist_width);
        for (size_t row = 0; row < n; ++row) {
          if (e.dist_width > 0)
            std::memcpy(e.dist_ids + row * width, r.bytes(width * sizeof(int64_t), "step.dist_ids"),
                        width * sizeof(int64_t));
          std::memcpy(e.dist_probs + row * width, r.bytes(width * sizeof(float), "step.dist_probs"),
                      width * sizeof(float));
          if (e.dist_width > 0) {
            const float rest = r.get<float>("step.dist_rest");
            if (e.dist_rest != nullptr) e.dist_rest[row] = rest;
          }
        }
      }
      c.times = {settle, draft, std::chrono::duration<double>(Clock::now() - started).count()};
    });
  } catch (...) {
    // The outputs of a step that failed: no drafts.
    for (size_t i = 0; i < validated; ++i) {
      if (entries[i].tokens != nullptr) std::fill_n(entries[i].tokens, rows, -1);
      if (entries[i].q != nullptr) std::fill_n(entries[i].q, rows, 0.0f);
    }
    throw;
  }
}

}  // namespace tpdraft::serve
