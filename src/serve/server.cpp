// The serving loop of a group's rank 0. One thread: it drains every request that has arrived,
// answers the cheap ones at once, queues the STEPs, and runs the queued STEPs as one forward
// (whole requests in arrival order, up to max_sessions entries). Requests that arrive while a
// forward runs wait in ZeroMQ's queue and make up the next forward.
#include "serve/server.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <new>
#include <set>

#include <zmq.h>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "core/strings.h"
#include "serve/message.h"
#include "serve/keys.h"
#include "serve/protocol.h"
#include "serve/ring.h"

namespace tpdraft::serve {

std::atomic<bool> g_stop_requested{false};

namespace {

extern "C" void on_stop_signal(int) { g_stop_requested = true; }

// A client can shrink its ring under the server (ftruncate on its own descriptor): a read or write
// past the segment's new end is then a SIGBUS. Every access to a ring goes through the fault-free
// copies below, on the serving thread: the fault jumps back out of the copy, which fails, and the
// server unmaps that ring. (The drafter never reads a ring: taps there are copied out first.)
// volatile, and fenced in each copy: the handler reads it, so its stores must not be dropped or
// moved across the access they guard (an optimiser sees no reader of them otherwise).
thread_local sigjmp_buf* volatile t_ring_guard = nullptr;

extern "C" void on_ring_fault(int sig) {
  if (t_ring_guard != nullptr) siglongjmp(*t_ring_guard, 1);
  std::signal(sig, SIG_DFL);  // a fault of anything else: what it always was
  std::raise(sig);
}

void install_ring_fault_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_ring_fault;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);
}

// Runs `access` (a copy or an atomic: nothing that needs unwinding) with the guard set; false
// when it faulted.
template <typename Access>
bool fault_free(Access&& access) {
  sigjmp_buf env;
  if (sigsetjmp(env, 1) != 0) {
    t_ring_guard = nullptr;
    return false;
  }
  t_ring_guard = &env;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  access();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_ring_guard = nullptr;
  return true;
}

bool fault_free_copy(void* dst, const void* src, size_t n) {
  return n == 0 || fault_free([&] { std::memcpy(dst, src, n); });
}
bool fault_free_load(const uint32_t* word, uint32_t* out) {
  return fault_free([&] { *out = ring_load(word); });
}
bool fault_free_store(uint32_t* word, uint32_t value) {
  return fault_free([&] { ring_store(word, value); });
}

// Whether a process accepts connections on the unix socket at `path` (a live server's), as
// against a stale socket file or nothing.
bool ipc_listener_at(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;  // ZeroMQ refuses such a path itself
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool live = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return live;
}

// The process at the other end of the unix socket a message came through (0 when unknown: tcp,
// or a process outside this pid namespace).
pid_t ipc_peer(zmq_msg_t* msg) {
  const int fd = zmq_msg_get(msg, ZMQ_SRCFD);
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return 0;
  return cred.pid > 0 ? cred.pid : 0;
}

// Whether process `pid` has ended: gone, or a zombie its parent has not reaped yet.
bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');  // the state follows the command name, which may hold spaces
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

// The address clients are given for the one ZeroMQ bound: a wildcard host (tcp://*, 0.0.0.0,
// [::]) names no machine a client could reach, least of all the right one when the replicas of a
// job listen on several machines, so this machine's name stands in for it.
std::string published_endpoint(const std::string& bound) {
  for (const char* any : {"tcp://0.0.0.0:", "tcp://[::]:"}) {
    if (!starts_with(bound, any)) continue;
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return bound;
    return "tcp://" + std::string(host) + bound.substr(std::strlen(any) - 1);
  }
  return bound;
}

// Whether the address is this host's loopback (or a unix socket): no other machine reaches it.
bool local_only(const std::string& listen) {
  if (!starts_with(listen, "tcp://")) return true;
  const std::string host = listen.substr(6, listen.rfind(':') - 6);
  return starts_with(host, "127.") || host == "localhost" || host == "[::1]" || host == "::1";
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A client's shared-memory ring: its control block, then what the client placed there.
struct Ring {
  char* base = nullptr;
  size_t bytes = 0;
  uint32_t seen = 0;  // the last request_seq taken
  RingControl* control() const { return reinterpret_cast<RingControl*>(base); }
  // Whether n bytes at offset `at` lie inside the ring, past its control block.
  bool holds(uint64_t at, uint64_t n) const { return at >= kRingControlBytes && at <= bytes && n <= bytes - at; }
  void unmap() {
    if (base != nullptr) munmap(base, bytes);
    base = nullptr;
    bytes = 0;
  }
};

// Where a request came from, so its reply goes back the same way.
struct Route {
  bool ring = false;
  uint32_t seq = 0;        // the ring request's request_seq
  uint64_t reply_at = 0;   // the ring's reply area
  uint64_t reply_capacity = 0;
};

struct Client {
  std::string name;  // "client N", for logs and messages
  std::set<int64_t> sessions;
  Clock::time_point last;
  Ring ring;
  int pending = 0;               // STEP requests queued
  int64_t queued_entries = 0;    // their entries
  uint64_t queued_bytes = 0;     // and the bytes of their frames the queue holds
  pid_t pid = 0;                 // over ipc://, the client's process (0: unknown)
};

struct Pending {
  std::string rid;
  Header header;
  // Kept alive while the entries read their taps from it: the frame, or for a request that came
  // through the client's ring the copy taken from there.
  std::unique_ptr<Message> frame;
  std::vector<uint64_t> ring_request;
  Route route;
  std::vector<engine::StepEntry> entries;
  std::vector<std::vector<uint64_t>> staged;  // inline taps copied to aligned memory when misaligned
  uint64_t bytes = 0;                         // the frame's size (0 for a request in the ring)
  Clock::time_point arrived;
};

struct Refusal {  // a request refused for its arguments or a limit (kArgument)
  std::string message;
};

struct Busy {  // a STEP not taken because the queue is full (kBusy): the client may ask again
  std::string message;
};

}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a wait in zmq_poll returns at once
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

struct Server::Impl {
  engine::Group& group;
  engine::Engine& engine;
  ServerOptions options;
  void* ctx = nullptr;
  void* sock = nullptr;
  std::map<std::string, Client> clients;
  std::deque<Pending> pending;
  uint64_t next_client = 1;
  bool shutdown = false;
  WireStats stats{};
  Clock::time_point started = Clock::now();
  std::string reply_buf;
  std::set<std::string> last_batch;  // the clients the last forward answered
  double last_forward_seconds = 0;
  std::string ipc_path;  // the socket file this server made, removed when it closes (if still its own)
  FileIdentity ipc_file;
  Route route;           // the route of the request being answered now
  Clock::time_point last_request = Clock::now();
  Clock::time_point last_peer_check = Clock::now();
  std::vector<uint64_t> ring_request;  // the ring request being answered now, copied out of the ring
  int64_t queued_entries = 0;  // over every client
  uint64_t queued_bytes = 0;

  Impl(engine::Group& g, const ServerOptions& o) : group(g), engine(g.leader()), options(o) {}

  ~Impl() {
    for (auto& c : clients) c.second.ring.unmap();
    if (sock != nullptr) zmq_close(sock);
    if (ctx != nullptr) zmq_ctx_term(ctx);
    // libzmq leaves the file of a bound ipc:// endpoint behind.
    if (!ipc_path.empty()) remove_if_same(ipc_path, ipc_file);
  }

  const engine::Caps& caps() const { return engine.caps(); }

  void send_to(const std::string& rid, const Route& via, const std::string& body) {
    if (via.ring) {
      auto it = clients.find(rid);
      if (it == clients.end() || it->second.ring.base == nullptr) return;
      if (body.size() > via.reply_capacity) {
        // An error reply instead, its message cut to fit (a reply area holds 64 bytes at least).
        std::string why = fmt::format("the reply of {} bytes does not fit the ring's reply area of {}", body.size(),
                                      via.reply_capacity);
        why.resize(std::min<size_t>(why.size(), via.reply_capacity - kHeaderBytes - 4));
        Reader r(body.data(), body.size());
        send_to(rid, via, error_reply(r.header(), kArgument, why));
        return;
      }
      Client& c = it->second;
      RingControl* ctl = c.ring.control();
      const uint64_t bytes = body.size();
      uint32_t sleeping = 0;
      if (!fault_free_copy(c.ring.base + via.reply_at, body.data(), body.size()) ||
          !fault_free_copy(&ctl->reply_bytes, &bytes, sizeof(bytes)) || !fault_free_store(&ctl->reply_seq, via.seq) ||
          !fault_free_load(&ctl->client_sleeping, &sleeping)) {
        ring_faulted(c);
        return;
      }
      if (sleeping != 0) ring_wake(&ctl->reply_seq);  // a futex on a page that is gone fails, it does not fault
      return;
    }
    // A client that has gone is dropped by the ROUTER socket: nothing to do about it here.
    if (zmq_send(sock, rid.data(), rid.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return;
    zmq_send(sock, body.data(), body.size(), ZMQ_DONTWAIT);
  }

  // A ring access faulted: the client shrank or removed its ring. It is unmapped; the client's
  // requests through the socket are still answered.
  void ring_faulted(Client& c) {
    TPDRAFT_LOG_WARN("{}: its shared-memory ring faulted (shrunk or removed by the client): unmapped", c.name);
    c.ring.unmap();
  }

  void refuse(const std::string& rid, const Header& h, uint32_t status, const std::string& message) {
    ++stats.errors;
    auto it = clients.find(rid);
    const std::string who = it != clients.end() ? it->second.name : "a client";
    TPDRAFT_LOG_WARN("{}: {} refused: {}", who, kind_name(h.kind), message);
    send_to(rid, route, error_reply(h, status, message));
  }

  // An ok reply to `request`: the header, then what `body` writes.
  void reply(const std::string& rid, const Header& request, const std::function<void(Writer&)>& body = {}) {
    std::string out;
    Writer w(&out);
    w.header(reply_header(request));
    if (body) body(w);
    send_to(rid, route, out);
  }

  static void expect_end(const Reader& r, const char* kind) {
    if (r.left() != 0) throw ProtocolError(fmt::format("{} bytes past the end of the {} request", r.left(), kind));
  }

  void close_client(const std::string& rid, const char* why) {
    auto it = clients.find(rid);
    if (it == clients.end()) return;
    Client& c = it->second;
    for (int64_t s : c.sessions) group.close_session(s);
    c.ring.unmap();
    TPDRAFT_LOG_INFO("{} {}: closed its {} session(s)", c.name, why, c.sessions.size());
    clients.erase(it);
  }

  // ---- requests -------------------------------------------------------------------------------

  void on_hello(const std::string& rid, Client& c, const Header& h, Reader& r) {
    const std::string ring_name = r.str("hello.ring_name", 255);
    const uint64_t ring_bytes = r.get<uint64_t>("hello.ring_bytes");
    expect_end(r, "HELLO");
    c.ring.unmap();
    // A ring is shared memory of this host: only a client over ipc:// can have made it.
    const bool ipc = starts_with(options.listen, "ipc://");
    const std::string note = ring_name.empty() ? ""
                             : !ipc ? "a shared-memory ring serves clients over ipc:// only; this server listens on " +
                                          options.listen
                                    : map_ring(ring_name, ring_bytes, &c.ring);
    if (!note.empty()) TPDRAFT_LOG_WARN("{}: no shared-memory ring: {}", c.name, note);
    const engine::Caps& k = caps();
    const WireCaps wc{k.architecture, engine.runtime().ops().name(), k.block, k.tp, k.taps_width, k.hidden, k.vocab,
                      k.draft_vocab, k.mask_token, k.max_sessions, options.max_open_sessions, k.max_context,
                      k.target_layers};
    reply(rid, h, [&](Writer& w) {
      put_caps(w, wc);
      w.put<double>(options.idle_timeout);
      w.put<uint32_t>(c.ring.base != nullptr ? 1 : 0);
      w.str(note);
    });
  }

  // Maps a client's ring; returns why not ("" when mapped). Only a segment a client of this
  // server could have made is mapped: a tpdraft ring name, owned by this server's user, readable
  // and writable by that user alone (as clients make them), never any other memory named to it.
  static std::string map_ring(const std::string& name, uint64_t bytes, Ring* ring) {
    if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos)
      return fmt::format("ring name '{}' is not a POSIX shared-memory name (/NAME)", name);
    if (!starts_with(name, kRingNamePrefix))
      return fmt::format("ring name '{}' does not start with {}: not a tpdraft client's ring", name, kRingNamePrefix);
    const int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW, 0);
    if (fd < 0) return fmt::format("cannot open shared memory {}: {}", name, std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 0077) != 0) {
      close(fd);
      return fmt::format("shared memory {} is not this server user's alone (owner {}, mode {:o}); a client's ring is "
                         "made by the same user with mode 600", name, st.st_uid, st.st_mode & 0777);
    }
    const bool sized = bytes > kRingControlBytes && static_cast<uint64_t>(st.st_size) >= bytes;
    if (!sized) {
      close(fd);
      return fmt::format("shared memory {} holds {} bytes, the client named {}", name, st.st_size, bytes);
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return fmt::format("cannot map shared memory {}: {}", name, std::strerror(errno));
    ring->base = static_cast<char*>(p);
    ring->bytes = bytes;
    if (!fault_free_load(&ring->control()->request_seq, &ring->seen) ||
        !fault_free_store(&ring->control()->server_sleeping, 0)) {
      ring->unmap();
      return fmt::format("shared memory {} faulted as it was mapped (it was shrunk)", name);
    }
    return "";
  }

  int64_t session_arg(Reader& r, const Client& c, const char* kind) {
    const int64_t s = r.get<int64_t>("session");
    expect_end(r, kind);
    if (!c.sessions.count(s)) throw Refusal{fmt::format("session {} is not open for {}", s, c.name)};
    return s;
  }

  // Refuses a STEP of `entries` entries and `bytes` frame bytes that would take the queue past
  // its bounds: per client, two full forwards' entries (or two per session it holds) and a
  // quarter of --max-queued-bytes (its first queued request excepted, however large); in all, two
  // forwards' entries per open session allowed and --max-queued-bytes. An empty queue takes any
  // valid request, so none waits forever; an engine that keeps one STEP in flight per client
  // meets a bound only when the server is overloaded, and then may ask again.
  void check_queue_room(const Client& c, int64_t entries, uint64_t bytes) const {
    if (pending.empty()) return;
    const int64_t S = caps().max_sessions;
    const int64_t client_entries = 2 * std::max<int64_t>(S, static_cast<int64_t>(c.sessions.size()));
    const int64_t all_entries = 2 * std::max<int64_t>(S, options.max_open_sessions);
    const uint64_t client_bytes = options.max_queued_bytes / 4, all_bytes = options.max_queued_bytes;
    auto busy = [&](const std::string& what) {
      return Busy{fmt::format("the server's queue is full ({}); the step was not taken: ask again once an earlier "
                              "reply has come",
                              what)};
    };
    if (c.queued_entries + entries > client_entries)
      throw busy(fmt::format("{} holds {} queued entries, at most {} per client", c.name, c.queued_entries,
                             client_entries));
    if (queued_entries + entries > all_entries)
      throw busy(fmt::format("{} entries queued, at most {}", queued_entries, all_entries));
    if (c.pending > 0 && c.queued_bytes + bytes > client_bytes)
      throw busy(fmt::format("{} holds {} bytes of queued requests, at most {} per client (--max-queued-bytes / 4)",
                             c.name, c.queued_bytes, client_bytes));
    if (queued_bytes + bytes > all_bytes)
      throw busy(fmt::format("{} bytes of requests queued, at most {} (--max-queued-bytes)", queued_bytes, all_bytes));
  }

  void on_step(const std::string& rid, Client& c, const Header& h, Reader& r, std::unique_ptr<Message> frame) {
    const int64_t S = caps().max_sessions;
    if (h.count == 0 || h.count > S)
      throw Refusal{fmt::format("a step takes 1 to {} entries (--max-sessions), got {}", S, h.count)};
    const uint64_t frame_bytes = frame ? frame->size() : ring_request.size() * 8;
    uint64_t copied_bytes = 0;  // taps copied out of the ring
    check_queue_room(c, h.count, frame_bytes);
    std::vector<WireEntry> wire;
    for (uint32_t i = 0; i < h.count; ++i) wire.push_back(get_entry(r));
    const char* area = r.rest();
    const uint64_t area_bytes = r.left();
    Pending p;
    p.rid = rid;
    p.header = h;
    p.route = route;
    p.arrived = Clock::now();
    const int64_t width = caps().taps_width, max_context = caps().max_context;
    for (size_t i = 0; i < wire.size(); ++i) {
      const WireEntry& x = wire[i];
      auto bad = [&](const std::string& what) { return Refusal{fmt::format("entry {}: {}", i, what)}; };
      if (!c.sessions.count(x.session)) throw bad(fmt::format("session {} is not open for {}", x.session, c.name));
      const size_t db = dtype_bytes(x.taps_dtype);
      if (db == 0) throw bad(fmt::format("taps_dtype {} is not 0 (f32), 1 (bf16) or 2 (f16)", x.taps_dtype));
      if (x.n_new < 0 || x.n_new > max_context)
        throw bad(fmt::format("n_new {} outside 0..{} (the max context)", x.n_new, max_context));
      const uint64_t need = static_cast<uint64_t>(x.n_new) * static_cast<uint64_t>(width) * db;
      engine::StepEntry e;
      fields_from_wire(x, &e);
      e.taps.dtype = wire_dtype(x.taps_dtype);
      if (x.taps_where > kTapsRing)
        throw bad(fmt::format("taps_where {} is not 0 (none), 1 (inline) or 2 (ring)", x.taps_where));
      if (x.taps_where == kTapsNone) {
        if (x.n_new != 0) throw bad(fmt::format("{} new rows but no taps", x.n_new));
      } else {
        if (x.taps_bytes != need)
          throw bad(fmt::format("taps_bytes {} but {} rows of {} values take {}", x.taps_bytes, x.n_new, width, need));
        const bool in_ring = x.taps_where == kTapsRing;
        if (in_ring && c.ring.base == nullptr)
          throw bad("taps in the shared-memory ring, but this client's HELLO mapped none");
        const char* base = in_ring ? c.ring.base : area;
        const uint64_t size = in_ring ? c.ring.bytes : area_bytes;
        if (x.taps_offset > size || need > size - x.taps_offset)
          throw bad(fmt::format("taps at offset {} ({} bytes) pass the end of the {} ({} bytes)", x.taps_offset, need,
                                in_ring ? "ring" : "frame's taps area", size));
        const char* at = base + x.taps_offset;
        if (in_ring) {  // copied out: the client may change or shrink its ring while the step waits
          if (x.taps_offset < kRingControlBytes)
            throw bad(fmt::format("taps at offset {} lie in the ring's control block (its first {} bytes)",
                                  x.taps_offset, kRingControlBytes));
          copied_bytes += need;  // held by the queue as a frame's bytes are
          check_queue_room(c, h.count, frame_bytes + copied_bytes);
          p.staged.emplace_back((need + 7) / 8);
          if (!fault_free_copy(p.staged.back().data(), at, need)) {
            ring_faulted(c);
            throw bad("the shared-memory ring faulted while its taps were read (it was shrunk or removed)");
          }
          at = reinterpret_cast<const char*>(p.staged.back().data());
        } else if (reinterpret_cast<uintptr_t>(at) % db != 0) {  // read f32/f16 rows from aligned memory only
          p.staged.emplace_back((need + 7) / 8);
          std::memcpy(p.staged.back().data(), at, need);
          at = reinterpret_cast<const char*>(p.staged.back().data());
        }
        e.taps.data = need > 0 ? at : nullptr;
      }
      p.entries.push_back(e);
    }
    p.frame = std::move(frame);
    if (!p.frame) p.ring_request = std::move(ring_request);
    p.bytes = frame_bytes + copied_bytes;
    ++c.pending;
    c.queued_entries += static_cast<int64_t>(p.entries.size());
    c.queued_bytes += p.bytes;
    queued_entries += static_cast<int64_t>(p.entries.size());
    queued_bytes += p.bytes;
    pending.push_back(std::move(p));
  }

  // A request frame: from the socket (`frame` holds it), or in the client's ring (data, size).
  void on_request(const std::string& rid, std::unique_ptr<Message> frame, const char* data = nullptr, size_t size = 0) {
    if (frame) {
      data = frame->data();
      size = frame->size();
    }
    last_request = Clock::now();
    const auto [it, fresh] = clients.try_emplace(rid);
    Client& c = it->second;
    if (fresh) {
      c.name = fmt::format("client {}", next_client++);
      if (frame && starts_with(options.listen, "ipc://")) c.pid = ipc_peer(&frame->msg);
      TPDRAFT_LOG_INFO("{} connected{}", c.name, c.pid > 0 ? fmt::format(" (process {})", c.pid) : "");
    }
    c.last = Clock::now();
    Reader r(data, size);
    Header h;
    try {
      h = r.header();
      if (h.version != kProtocolVersion)
        throw ProtocolError(fmt::format("protocol version {}; this server speaks version {}", h.version,
                                        kProtocolVersion));
      if (h.status != 0 || (h.kind & kReply) != 0)
        throw ProtocolError(fmt::format("a request must have status 0 and a request kind, got kind {:#x} status {}",
                                        h.kind, h.status));
      if (h.kind != kStep && h.count != 0)
        throw ProtocolError(fmt::format("header.count is {}; only STEP takes a count", h.count));
      switch (h.kind) {
        case kHello:
          // It may replace the ring this request came through: only through the socket.
          if (route.ring) throw ProtocolError("HELLO must come through the socket, not the ring");
          // Nor while queued STEPs of this client read taps (or came) through its ring.
          if (c.pending > 0)
            throw Refusal{fmt::format("HELLO while {} STEP request(s) of {} are in flight; wait for their replies",
                                      c.pending, c.name)};
          on_hello(rid, c, h, r);
          break;
        case kOpen: {
          expect_end(r, "OPEN");
          const int64_t open = engine.open_sessions();
          if (open >= options.max_open_sessions)
            throw Refusal{fmt::format("all {} sessions allowed (--max-open-sessions) are open", open)};
          const int64_t mine = static_cast<int64_t>(c.sessions.size());
          if (options.max_client_sessions > 0 && mine >= options.max_client_sessions)
            throw Refusal{fmt::format("{} holds {} sessions, as many as one client may (--max-client-sessions)", c.name,
                                      mine)};
          const int64_t s = group.open_session();
          c.sessions.insert(s);
          reply(rid, h, [&](Writer& w) { w.put<int64_t>(s); });
          break;
        }
        case kClose: {
          const int64_t s = session_arg(r, c, "CLOSE");
          group.close_session(s);
          c.sessions.erase(s);
          reply(rid, h);
          break;
        }
        case kLength: {
          const int64_t s = session_arg(r, c, "LENGTH");
          reply(rid, h, [&](Writer& w) { w.put<int64_t>(engine.session_length(s)); });
          break;
        }
        case kStep: on_step(rid, c, h, r, std::move(frame)); break;
        case kStats: {
          expect_end(r, "STATS");
          stats.clients = clients.size();
          stats.open_sessions = static_cast<uint64_t>(engine.open_sessions());
          stats.uptime_seconds = seconds_since(started);
          reply(rid, h, [&](Writer& w) { put_stats(w, stats); });
          break;
        }
        case kShutdown:
          expect_end(r, "SHUTDOWN");
          TPDRAFT_LOG_INFO("{} asked the server to shut down", c.name);
          shutdown = true;
          reply(rid, h);
          break;
        case kBell:  // poll_rings() finds the request
          expect_end(r, "BELL");
          break;
        case kBye:
          expect_end(r, "BYE");
          reply(rid, h);
          if (c.pending == 0) close_client(rid, "said goodbye");
          break;
        default: throw ProtocolError(fmt::format("unknown request kind {}", h.kind));
      }
    } catch (const ProtocolError& e) {
      refuse(rid, h, kMalformed, fmt::format("malformed {} request: {}", kind_name(h.kind), e.what()));
    } catch (const Refusal& e) {
      refuse(rid, h, kArgument, e.message);
    } catch (const Busy& e) {
      refuse(rid, h, kBusy, e.message);
    } catch (const std::bad_alloc&) {
      refuse(rid, h, kArgument, fmt::format("out of memory for the {} request", kind_name(h.kind)));
    }
  }

  // Receives every frame waiting now.
  void drain() {
    for (;;) {
      Message id;
      if (zmq_msg_recv(&id.msg, sock, ZMQ_DONTWAIT) < 0) return;
      const std::string rid(id.data(), id.size());
      std::unique_ptr<Message> frame;
      bool more = true;
      int parts = 0;
      // A request is one frame; more frames than that are read and refused.
      while (more) {
        auto f = std::make_unique<Message>();
        if (zmq_msg_recv(&f->msg, sock, 0) < 0) break;
        more = zmq_msg_more(&f->msg) != 0;
        if (++parts == 1) frame = std::move(f);
      }
      route = Route{};
      if (parts != 1) {
        refuse(rid, Header{}, kMalformed, fmt::format("a request is one frame, got {}", parts));
        continue;
      }
      on_request(rid, std::move(frame));
    }
  }

  // ---- the batched forward --------------------------------------------------------------------

  // Whether the queued STEPs should run now. The clients the last forward answered ask again
  // soon: wait until each of them has (or is gone), or the queue holds a full forward, or the
  // first queued request has waited the gather time (options.gather_seconds, at most a tenth of
  // the last forward); the wait is never longer, so no session loses a forward to it.
  bool ready_to_run() const {
    if (pending.empty()) return false;
    size_t entries = 0;
    for (const Pending& p : pending) entries += p.entries.size();
    if (entries >= static_cast<size_t>(caps().max_sessions)) return true;
    const bool all_back = std::all_of(last_batch.begin(), last_batch.end(), [&](const std::string& rid) {
      const auto it = clients.find(rid);  // each client keeps the count of its queued STEPs
      return it == clients.end() || it->second.pending > 0;
    });
    if (all_back) return true;
    return seconds_since(pending.front().arrived) >= std::min(options.gather_seconds, 0.1 * last_forward_seconds);
  }

  void run_batch() {
    const size_t S = static_cast<size_t>(caps().max_sessions);
    std::vector<engine::StepEntry> all;
    std::set<int64_t> used;
    std::vector<Pending> batch;
    std::deque<Pending> rest;
    auto in_use = [&used](const engine::StepEntry& e) { return used.count(e.session) > 0; };
    bool full = false;
    for (Pending& p : pending) {
      full = full || all.size() + p.entries.size() > S;  // it goes first in the next forward
      // A second step of the same sessions waits for the next forward too.
      const bool clash = std::any_of(p.entries.begin(), p.entries.end(), in_use);
      if (full || clash) {
        rest.push_back(std::move(p));
        continue;
      }
      dequeued(p);
      try {
        engine.check(p.entries);
      } catch (const Error& e) {
        route = p.route;
        refuse(p.rid, p.header, kArgument, e.what());
        continue;
      }
      for (const auto& e : p.entries) {
        used.insert(e.session);
        all.push_back(e);
      }
      batch.push_back(std::move(p));
    }
    pending = std::move(rest);
    if (batch.empty()) return;
    std::vector<model::DraftResult> results;
    const Clock::time_point forward_start = Clock::now();
    try {
      results = group.apply(all);
    } catch (const std::exception& e) {
      const std::string why = fmt::format("the drafter failed in a forward; the server is ending: {}", e.what());
      for (const Pending& p : batch) send_to(p.rid, p.route, error_reply(p.header, kRuntime, why));
      throw;
    }
    last_forward_seconds = seconds_since(forward_start);
    last_batch.clear();
    for (const Pending& p : batch) last_batch.insert(p.rid);
    ++stats.forwards;
    stats.steps += batch.size();
    stats.entries += all.size();
    stats.max_batch = std::max<uint64_t>(stats.max_batch, all.size());
    const engine::StepTimes& t = engine.last_times();
    size_t k = 0;
    const int64_t rows = caps().block - 1;
    for (const Pending& p : batch) {
      reply_buf.clear();
      Writer w(&reply_buf);
      w.header(reply_header(p.header, kOk, static_cast<uint32_t>(p.entries.size())));
      w.put<double>(t.settle);
      w.put<double>(t.draft);
      w.put<double>(seconds_since(p.arrived));
      w.put<uint32_t>(static_cast<uint32_t>(all.size()));
      w.put<uint32_t>(static_cast<uint32_t>(batch.size()));
      for (const auto& e : p.entries) {
        const model::DraftResult& res = results[k++];
        w.bytes(res.tokens.data(), static_cast<size_t>(rows) * sizeof(int64_t));
        w.bytes(res.probs.data(), static_cast<size_t>(rows) * sizeof(float));
        if (e.dist_width == 0) continue;
        const size_t width = e.dist_width < 0 ? static_cast<size_t>(caps().vocab) : static_cast<size_t>(e.dist_width);
        for (int64_t row = 0; row < rows; ++row) {
          const model::RowDistribution& d = res.dists[static_cast<size_t>(row)];
          if (e.dist_width > 0) w.bytes(d.ids.data(), width * sizeof(int64_t));
          w.bytes(d.probs.data(), width * sizeof(float));
          if (e.dist_width > 0) w.put<float>(d.rest);
        }
      }
      send_to(p.rid, p.route, reply_buf);
    }
  }

  // A queued request leaves the queue (to run, or refused).
  void dequeued(const Pending& p) {
    queued_entries -= static_cast<int64_t>(p.entries.size());
    queued_bytes -= p.bytes;
    auto it = clients.find(p.rid);
    if (it == clients.end()) return;
    --it->second.pending;
    it->second.queued_entries -= static_cast<int64_t>(p.entries.size());
    it->second.queued_bytes -= p.bytes;
  }

  // Closes the sessions of clients gone: over ipc:// at once when the client's process has
  // ended (looked at a few times a second), otherwise after --idle-timeout of silence.
  void reap_idle() {
    std::vector<std::pair<std::string, std::string>> gone;
    const bool look = seconds_since(last_peer_check) > 0.25;
    if (look) last_peer_check = Clock::now();
    for (const auto& [rid, c] : clients) {
      if (c.pending > 0) continue;
      if (look && c.pid > 0 && process_gone(c.pid))
        gone.emplace_back(rid, fmt::format("is gone (its process {} ended)", c.pid));
      else if (options.idle_timeout > 0 && seconds_since(c.last) > options.idle_timeout)
        gone.emplace_back(rid, fmt::format("was silent for more than {} s (--idle-timeout)", options.idle_timeout));
    }
    for (const auto& [rid, why] : gone) {
      ++stats.clients_reaped;
      close_client(rid, why.c_str());
    }
  }

  void fail_pending(uint32_t status, const std::string& why) {
    for (const Pending& p : pending) send_to(p.rid, p.route, error_reply(p.header, status, why));
    pending.clear();
    queued_entries = 0;
    queued_bytes = 0;
    for (auto& c : clients) {
      c.second.pending = 0;
      c.second.queued_entries = 0;
      c.second.queued_bytes = 0;
    }
  }

  // Takes the requests waiting in the clients' rings; returns whether there were any.
  bool poll_rings() {
    std::vector<std::string> ready;
    for (auto& [rid, c] : clients) {
      if (c.ring.base == nullptr) continue;
      uint32_t seq = 0;
      if (!fault_free_load(&c.ring.control()->request_seq, &seq))
        ring_faulted(c);
      else if (seq != c.ring.seen)
        ready.push_back(rid);
    }
    for (const std::string& rid : ready) {
      auto it = clients.find(rid);
      if (it == clients.end() || it->second.ring.base == nullptr) continue;
      Client& c = it->second;
      Ring& ring = c.ring;
      RingControl ctl;  // a copy: the client may change the control block at any time
      if (!fault_free_copy(&ctl, ring.control(), sizeof(ctl))) {
        ring_faulted(c);
        continue;
      }
      ring.seen = ctl.request_seq;
      route = Route{true, ctl.request_seq, ctl.reply_offset, ctl.reply_capacity};
      if (!ring.holds(route.reply_at, route.reply_capacity) || route.reply_capacity < 64) {
        TPDRAFT_LOG_WARN("{}: a ring request with a reply area outside the ring (or under 64 bytes): ignored", c.name);
        continue;
      }
      const uint64_t at = ctl.request_offset, bytes = ctl.request_bytes;
      if (!ring.holds(at, bytes)) {
        refuse(rid, Header{}, kMalformed,
               fmt::format("the ring request at offset {} ({} bytes) is outside the ring", at, bytes));
        continue;
      }
      ring_request.assign((bytes + 7) / 8, 0);
      if (!fault_free_copy(ring_request.data(), ring.base + at, bytes)) {
        ring_faulted(c);
        continue;
      }
      on_request(rid, nullptr, reinterpret_cast<const char*>(ring_request.data()), bytes);
    }
    return !ready.empty();
  }

  void set_sleeping(uint32_t v) {
    for (auto& c : clients)
      if (c.second.ring.base != nullptr && !fault_free_store(&c.second.ring.control()->server_sleeping, v))
        ring_faulted(c.second);
  }
};

Server::Server(engine::Group& group, const ServerOptions& options) : impl_(std::make_unique<Impl>(group, options)) {}

Server::~Server() = default;

std::string Server::bind() {
  Impl& s = *impl_;
  install_ring_fault_handler();
  s.ctx = zmq_ctx_new();
  TPDRAFT_CHECK(s.ctx != nullptr, "cannot start ZeroMQ: {}", zmq_strerror(zmq_errno()));
  s.sock = zmq_socket(s.ctx, ZMQ_ROUTER);
  TPDRAFT_CHECK(s.sock != nullptr, "cannot make a ZeroMQ socket: {}", zmq_strerror(zmq_errno()));
  const int linger = 500;  // ms to flush the last replies when the server closes
  zmq_setsockopt(s.sock, ZMQ_LINGER, &linger, sizeof(linger));
  // The largest request that can be valid: every entry with a full context of f32 rows inline.
  const engine::Caps& k = s.caps();
  const double largest = double(kHeaderBytes) + double(k.max_sessions) * (kEntryBytes + 8) +
                         double(k.max_sessions) * double(k.max_context) * double(k.taps_width) * 4;
  const int64_t max_msg = largest > 9e18 ? -1 : static_cast<int64_t>(largest) + 4096;
  zmq_setsockopt(s.sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof(max_msg));
  if (!s.options.curve_secret_key.empty()) {
    TPDRAFT_CHECK(curve_available(), "--curve-secret-key: this ZeroMQ was built without CURVE (libsodium)");
    const int on = 1;
    TPDRAFT_CHECK(zmq_setsockopt(s.sock, ZMQ_CURVE_SERVER, &on, sizeof(on)) == 0 &&
                      zmq_setsockopt(s.sock, ZMQ_CURVE_SECRETKEY, s.options.curve_secret_key.c_str(),
                                     kCurveKeyChars) == 0,
                  "--curve-secret-key: ZeroMQ refused the key: {}", zmq_strerror(zmq_errno()));
  } else if (!local_only(s.options.listen)) {
    TPDRAFT_LOG_WARN("--listen {}: any machine that reaches this address can open sessions, send taps and shut the "
                     "server down; give --curve-secret-key (tpdraft keys) to admit only clients that hold the "
                     "server's public key, or listen on 127.0.0.1 or ipc://",
                     s.options.listen);
  }
  // ZeroMQ would take over the path of a live server (which would then lose its socket, and later
  // unlink ours): refuse it, as tcp refuses a port in use. A socket file nobody listens on is
  // stale and is rebound.
  if (starts_with(s.options.listen, "ipc://")) {
    const std::string path = s.options.listen.substr(6);
    TPDRAFT_CHECK(!ipc_listener_at(path), "--listen {}: a server is listening there already (address in use)",
                  s.options.listen);
  }
  TPDRAFT_CHECK(zmq_bind(s.sock, s.options.listen.c_str()) == 0, "--listen {}: cannot listen there: {}",
                s.options.listen, zmq_strerror(zmq_errno()));
  char endpoint[1024] = {0};
  size_t size = sizeof(endpoint) - 1;
  zmq_getsockopt(s.sock, ZMQ_LAST_ENDPOINT, endpoint, &size);
  const std::string bound(endpoint);
  if (bound.rfind("ipc://", 0) == 0) {
    s.ipc_path = bound.substr(6);
    s.ipc_file = file_identity(s.ipc_path);
  }
  return published_endpoint(bound);
}

void Server::run() {
  Impl& s = *impl_;
  zmq_pollitem_t item{s.sock, 0, ZMQ_POLLIN, 0};
  try {
    while (!g_stop_requested && !s.shutdown) {
      // Busy for a moment after each request (the next step of a loop follows soon); then
      // asleep on the socket, which a client's doorbell wakes.
      long wait_ms = 0;
      const bool sleepy =
          s.pending.empty() && !s.poll_rings() && seconds_since(s.last_request) > s.options.spin_seconds;
      if (sleepy) {
        s.set_sleeping(1);
        if (!s.poll_rings()) wait_ms = 100;  // looked once more after saying so: nothing missed
      }
      if (!sleepy && !s.ready_to_run()) sched_yield();  // busy, but not in the way of a client on this core
      const int polled = zmq_poll(&item, 1, wait_ms);
      if (sleepy) s.set_sleeping(0);
      if (polled < 0 && zmq_errno() != EINTR) TPDRAFT_FAIL("waiting for requests: {}", zmq_strerror(zmq_errno()));
      s.drain();
      s.poll_rings();
      s.reap_idle();
      if (g_stop_requested || s.shutdown) break;
      if (s.ready_to_run()) {
        s.run_batch();
        // The clients just answered will ask again soon: look busily from now, not from their
        // requests' arrival (a long forward would have used the window up).
        s.last_request = Clock::now();
      }
    }
  } catch (...) {
    s.fail_pending(kRuntime, "the drafter failed; the server is ending");
    throw;
  }
  s.fail_pending(kClosing, "the server is shutting down");
  TPDRAFT_LOG_INFO("stopping ({}): {} forward(s), {} step(s), {} entries", g_stop_requested ? "signal" : "SHUTDOWN",
                   s.stats.forwards, s.stats.steps, s.stats.entries);
}

}  // namespace tpdraft::serve
