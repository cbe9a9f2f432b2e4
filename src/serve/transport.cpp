// The ROUTER socket and the clients' rings of a server (serve/transport.h). Every ring access is
// fault-free: a client may shrink or remove its ring at any time, and the server only unmaps it.
#include "serve/transport.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csetjmp>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include <zmq.h>

#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "serve/keys.h"
#include "serve/protocol.h"

namespace tpdraft::serve {

namespace {

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
  return fault_free([&] { *out = shared_load(word); });
}
bool fault_free_store(uint32_t* word, uint32_t value) {
  return fault_free([&] { shared_store(word, value); });
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

std::string default_listen() {
  const char* t = std::getenv("TMPDIR");
  return "ipc://" + std::string(t != nullptr && *t != '\0' ? t : "/tmp") + "/tpdraft-serve-" +
         std::to_string(getpid()) + ".sock";
}

std::string replica_endpoint(const std::string& listen, int g, int replicas) {
  if (replicas == 1) return listen;
  if (starts_with(listen, "ipc://")) return listen + "." + std::to_string(g);
  const size_t colon = listen.rfind(':');
  TPDRAFT_CHECK(colon != std::string::npos && colon + 1 < listen.size(), "--listen {}: no port", listen);
  const std::string port = listen.substr(colon + 1);
  if (port == "*") return listen;
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  TPDRAFT_CHECK(*end == '\0' && p > 0 && p + replicas - 1 <= 65535,
                "--listen {}: port '{}' leaves no room for {} replicas' ports", listen, port, replicas);
  return listen.substr(0, colon + 1) + std::to_string(p + g);
}

}  // namespace

Transport::Transport(const std::string& listen, int replica, int replicas, std::string curve_secret_key)
    : listen_(replica_endpoint(listen.empty() ? default_listen() : listen, replica, replicas)),
      curve_secret_key_(std::move(curve_secret_key)) {}

Transport::~Transport() {
  for (auto& r : rings_) munmap(r.second.base, r.second.bytes);
  if (sock_ != nullptr) zmq_close(sock_);
  if (ctx_ != nullptr) zmq_ctx_term(ctx_);
}

std::string Transport::bind(int64_t max_request_bytes) {
  install_ring_fault_handler();
  ctx_ = zmq_ctx_new();
  TPDRAFT_CHECK(ctx_ != nullptr, "cannot start ZeroMQ: {}", zmq_strerror(zmq_errno()));
  sock_ = zmq_socket(ctx_, ZMQ_ROUTER);
  TPDRAFT_CHECK(sock_ != nullptr, "cannot make a ZeroMQ socket: {}", zmq_strerror(zmq_errno()));
  const int linger = 500;  // ms to flush the last replies when the server closes
  zmq_setsockopt(sock_, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_setsockopt(sock_, ZMQ_MAXMSGSIZE, &max_request_bytes, sizeof(max_request_bytes));
  if (!curve_secret_key_.empty()) {
    TPDRAFT_CHECK(curve_available(), "--curve-secret-key: this ZeroMQ was built without CURVE (libsodium)");
    const int on = 1;
    TPDRAFT_CHECK(zmq_setsockopt(sock_, ZMQ_CURVE_SERVER, &on, sizeof(on)) == 0 &&
                      zmq_setsockopt(sock_, ZMQ_CURVE_SECRETKEY, curve_secret_key_.c_str(), kCurveKeyChars) == 0,
                  "--curve-secret-key: ZeroMQ refused the key: {}", zmq_strerror(zmq_errno()));
  } else if (!local_only(listen_)) {
    TPDRAFT_LOG_WARN("--listen {}: any machine that reaches this address can open sessions, send taps and shut the "
                     "server down; give --curve-secret-key (tpdraft keys) to admit only clients that hold the "
                     "server's public key, or listen on 127.0.0.1 or ipc://",
                     listen_);
  }
  // ZeroMQ would take over the path of a live server (which would then lose its socket, and later
  // unlink ours): refuse it, as tcp refuses a port in use. A socket file nobody listens on is
  // stale and is rebound.
  if (starts_with(listen_, "ipc://"))
    TPDRAFT_CHECK(!ipc_listener_at(listen_.substr(6)), "--listen {}: a server is listening there already (address "
                  "in use)", listen_);
  TPDRAFT_CHECK(zmq_bind(sock_, listen_.c_str()) == 0, "--listen {}: cannot listen there: {}", listen_,
                zmq_strerror(zmq_errno()));
  char endpoint[1024] = {0};
  size_t size = sizeof(endpoint) - 1;
  zmq_getsockopt(sock_, ZMQ_LAST_ENDPOINT, endpoint, &size);
  const std::string bound(endpoint);
  if (starts_with(bound, "ipc://")) ipc_file_.own(bound.substr(6));
  return published_endpoint(bound);
}

void Transport::drain(const Handler& on_request) {
  for (;;) {
    Message id;
    if (zmq_msg_recv(&id.msg, sock_, ZMQ_DONTWAIT) < 0) return;
    Request req;
    req.route.client.assign(id.data(), id.size());
    bool more = true;
    int parts = 0;
    // A request is one frame; more frames than that are read and refused.
    while (more) {
      auto f = std::make_unique<Message>();
      if (zmq_msg_recv(&f->msg, sock_, 0) < 0) break;
      more = zmq_msg_more(&f->msg) != 0;
      if (++parts == 1) req.frame = std::move(f);
    }
    if (parts != 1) req.malformed = fmt::format("a request is one frame, got {}", parts);
    on_request(req);
  }
}

bool Transport::poll_rings(const Handler& on_request) {
  std::vector<std::string> ready;
  for (auto it = rings_.begin(); it != rings_.end();) {
    const std::string& client = (it++)->first;  // ring_faulted erases it
    const Ring& ring = rings_.at(client);
    uint32_t seq = 0;
    if (!fault_free_load(&ring.control()->request_seq, &seq))
      ring_faulted(client);
    else if (seq != ring.seen)
      ready.push_back(client);
  }
  for (const std::string& client : ready) {
    auto it = rings_.find(client);
    if (it == rings_.end()) continue;
    Ring& ring = it->second;
    RingControl ctl;  // a copy: the client may change the control block at any time
    if (!fault_free_copy(&ctl, ring.control(), sizeof(ctl))) {
      ring_faulted(client);
      continue;
    }
    ring.seen = ctl.request_seq;
    Request req;
    req.route = Route{client, true, ctl.request_seq, ctl.reply_offset, ctl.reply_capacity};
    if (!ring.holds(req.route.reply_at, req.route.reply_capacity) || req.route.reply_capacity < 64) {
      TPDRAFT_LOG_WARN("{}: a ring request with a reply area outside the ring (or under 64 bytes): ignored", ring.who);
      continue;
    }
    const uint64_t at = ctl.request_offset, bytes = ctl.request_bytes;
    if (!ring.holds(at, bytes)) {
      req.malformed = fmt::format("the ring request at offset {} ({} bytes) is outside the ring", at, bytes);
    } else {
      req.copy.assign((bytes + 7) / 8, 0);
      req.copy_bytes = bytes;
      if (!fault_free_copy(req.copy.data(), ring.base + at, bytes)) {
        ring_faulted(client);
        continue;
      }
    }
    on_request(req);
  }
  return !ready.empty();
}

void Transport::set_sleeping(bool sleeping) {
  for (auto it = rings_.begin(); it != rings_.end();) {
    const std::string& client = (it++)->first;
    if (!fault_free_store(&rings_.at(client).control()->server_sleeping, sleeping ? 1 : 0)) ring_faulted(client);
  }
}

void Transport::wait(long ms) {
  zmq_pollitem_t item{sock_, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, ms) < 0 && zmq_errno() != EINTR)
    TPDRAFT_FAIL("waiting for requests: {}", zmq_strerror(zmq_errno()));
}

void Transport::send(const Route& to, const std::string& body) {
  if (to.ring) {
    auto it = rings_.find(to.client);
    if (it == rings_.end()) return;
    if (body.size() > to.reply_capacity) {
      // An error reply instead, its message cut to fit (a reply area holds 64 bytes at least).
      std::string why = fmt::format("the reply of {} bytes does not fit the ring's reply area of {}", body.size(),
                                    to.reply_capacity);
      why.resize(std::min<size_t>(why.size(), to.reply_capacity - kHeaderBytes - 4));
      Reader r(body.data(), body.size());
      send(to, error_reply(r.header(), kArgument, why));
      return;
    }
    Ring& ring = it->second;
    RingControl* ctl = ring.control();
    const uint64_t bytes = body.size();
    uint32_t sleeping = 0;
    if (!fault_free_copy(ring.base + to.reply_at, body.data(), body.size()) ||
        !fault_free_copy(&ctl->reply_bytes, &bytes, sizeof(bytes)) || !fault_free_store(&ctl->reply_seq, to.seq) ||
        !fault_free_load(&ctl->client_sleeping, &sleeping)) {
      ring_faulted(to.client);
      return;
    }
    if (sleeping != 0) futex_wake(&ctl->reply_seq);  // a futex on a page that is gone fails, it does not fault
    return;
  }
  // A client that has gone is dropped by the ROUTER socket: nothing to do about it here.
  if (zmq_send(sock_, to.client.data(), to.client.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return;
  zmq_send(sock_, body.data(), body.size(), ZMQ_DONTWAIT);
}

// A ring access faulted: the client shrank or removed its ring. It is unmapped; the client's
// requests through the socket are still answered.
void Transport::ring_faulted(const std::string& client) {
  auto it = rings_.find(client);
  TPDRAFT_LOG_WARN("{}: its shared-memory ring faulted (shrunk or removed by the client): unmapped", it->second.who);
  forget(client);
}

// Only a segment a client of this server could have made is mapped: a tpdraft ring name, owned by
// this server's user, readable and writable by that user alone (as clients make them), never any
// other memory named to it.
std::string Transport::map_ring(const std::string& client, const std::string& who, const std::string& name,
                                uint64_t bytes) {
  forget(client);
  if (name.empty()) return "";
  // A ring is shared memory of this host: only a client over ipc:// can have made it.
  if (!starts_with(listen_, "ipc://"))
    return "a shared-memory ring serves clients over ipc:// only; this server listens on " + listen_;
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
  Ring& ring = rings_[client];
  ring = Ring{who, static_cast<char*>(p), bytes, 0};
  if (!fault_free_load(&ring.control()->request_seq, &ring.seen) ||
      !fault_free_store(&ring.control()->server_sleeping, 0)) {
    forget(client);
    return fmt::format("shared memory {} faulted as it was mapped (it was shrunk)", name);
  }
  return "";
}

uint64_t Transport::ring_bytes(const std::string& client) const {
  auto it = rings_.find(client);
  return it == rings_.end() ? 0 : it->second.bytes;
}

bool Transport::ring_copy(const std::string& client, uint64_t offset, uint64_t n, void* out) {
  auto it = rings_.find(client);
  if (it != rings_.end() && fault_free_copy(out, it->second.base + offset, n)) return true;
  if (it != rings_.end()) ring_faulted(client);
  return false;
}

pid_t Transport::peer_process(const Request& r) const {
  if (!r.frame || !starts_with(listen_, "ipc://")) return 0;
  const int fd = zmq_msg_get(&r.frame->msg, ZMQ_SRCFD);
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return 0;
  return cred.pid > 0 ? cred.pid : 0;
}

void Transport::forget(const std::string& client) {
  auto it = rings_.find(client);
  if (it == rings_.end()) return;
  munmap(it->second.base, it->second.bytes);
  rings_.erase(it);
}

}  // namespace tpdraft::serve
