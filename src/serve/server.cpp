// The serving loop of a group's rank 0. One thread: it drains every request that has arrived
// (through the transport: the socket and the clients' rings), answers the cheap ones at once,
// queues the STEPs, and runs the queued STEPs as one forward (whole requests in arrival order, up
// to max_sessions entries). Requests that arrive while a forward runs wait in ZeroMQ's queue and
// make up the next forward.
#include "serve/server.h"

#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <new>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/timing.h"
#include "serve/protocol.h"
#include "serve/transport.h"

namespace tpdraft::serve {

namespace {

std::atomic<bool> g_stop_requested{false};  // set by SIGTERM / SIGINT

extern "C" void on_stop_signal(int) { g_stop_requested = true; }

// Whether process `pid` has ended: gone, or a zombie its parent has not reaped yet.
bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');  // the state follows the command name, which may hold spaces
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

struct Client {
  std::string name;  // "client N", for logs and messages
  std::set<int64_t> sessions;
  Clock::time_point last;
  int pending = 0;               // STEP requests queued
  int64_t queued_entries = 0;    // their entries
  uint64_t queued_bytes = 0;     // and the bytes of their frames the queue holds
  pid_t pid = 0;                 // over ipc://, the client's process (0: unknown)
};

struct Pending {
  Header header;
  // Kept alive while the entries read their taps from it: the frame, or for a request that came
  // through the client's ring the copy taken from there; and its route.
  Request request;
  std::vector<engine::StepEntry> entries;
  std::vector<std::vector<uint64_t>> staged;  // inline taps copied to aligned memory when misaligned
  uint64_t bytes = 0;                         // what it holds of the queue: its frame and taps copied out
  Clock::time_point arrived;
};

// A request refused for its arguments or a limit (kArgument), or a STEP not taken because the
// queue is full (kBusy: the client may ask again).
struct Refusal {
  std::string message;
  uint32_t status = kArgument;
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
  Transport transport{options.listen, options.replica, options.replicas, options.curve_secret_key};
  const Transport::Handler on_request_ = [this](Request& r) { on_request(r); };
  std::map<std::string, Client> clients;
  std::deque<Pending> pending;
  uint64_t next_client = 1;
  bool shutdown = false;
  WireStats stats{};
  Clock::time_point started = Clock::now();
  std::set<std::string> last_batch;  // the clients the last forward answered
  double last_forward_seconds = 0;
  Route route;  // the route of the request being answered now
  Clock::time_point last_request = Clock::now();
  Clock::time_point last_peer_check = Clock::now();
  int64_t queued_entries = 0;  // over every client
  uint64_t queued_bytes = 0;

  Impl(engine::Group& g, const ServerOptions& o) : group(g), engine(g.leader()), options(o) {}

  const engine::Caps& caps() const { return engine.caps(); }

  void refuse(const Header& h, uint32_t status, const std::string& message) {
    ++stats.errors;
    auto it = clients.find(route.client);
    const std::string who = it != clients.end() ? it->second.name : "a client";
    TPDRAFT_LOG_WARN("{}: {} refused: {}", who, kind_name(h.kind), message);
    transport.send(route, error_reply(h, status, message));
  }

  // An ok reply to `request` (a STEP's carries `count` entries): the header, then what `body` writes.
  void reply(const Header& request, const std::function<void(Writer&)>& body = {}, uint32_t count = 0) {
    std::string out;
    Writer w(&out);
    w.header(reply_header(request, kOk, count));
    if (body) body(w);
    transport.send(route, out);
  }

  static void expect_end(const Reader& r, const char* kind) {
    if (r.left() != 0) throw ProtocolError(fmt::format("{} bytes past the end of the {} request", r.left(), kind));
  }

  void close_client(const std::string& rid, const char* why) {
    auto it = clients.find(rid);
    if (it == clients.end()) return;
    Client& c = it->second;
    for (int64_t s : c.sessions) group.close_session(s);
    transport.forget(rid);
    TPDRAFT_LOG_INFO("{} {}: closed its {} session(s)", c.name, why, c.sessions.size());
    clients.erase(it);
  }

  // ---- requests -------------------------------------------------------------------------------

  void on_hello(Client& c, const Header& h, Reader& r) {
    const std::string ring_name = r.str("hello.ring_name", 255);
    const uint64_t ring_bytes = r.get<uint64_t>("hello.ring_bytes");
    expect_end(r, "HELLO");
    const std::string note = transport.map_ring(route.client, c.name, ring_name, ring_bytes);
    if (!note.empty()) TPDRAFT_LOG_WARN("{}: no shared-memory ring: {}", c.name, note);
    const WireCaps wc{caps(), engine.runtime().ops().name()};
    reply(h, [&](Writer& w) {
      put_caps(w, wc);
      w.put<double>(options.idle_timeout);
      w.put<uint32_t>(transport.ring_bytes(route.client) != 0 ? 1 : 0);
      w.str(note);
    });
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
    const int64_t all_entries = 2 * std::max<int64_t>(S, caps().max_open_sessions);
    const uint64_t client_bytes = options.max_queued_bytes / 4, all_bytes = options.max_queued_bytes;
    auto busy = [&](const std::string& what) {
      return Refusal{fmt::format("the server's queue is full ({}); the step was not taken: ask again once an "
                                 "earlier reply has come", what), kBusy};
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

  void on_step(Client& c, const Header& h, Reader& r, Request& req) {
    const int64_t S = caps().max_sessions;
    if (h.count == 0 || h.count > S)
      throw Refusal{fmt::format("a step takes 1 to {} entries (--max-sessions), got {}", S, h.count)};
    const uint64_t frame_bytes = req.frame ? req.frame->size() : req.copy.size() * 8;
    uint64_t copied_bytes = 0;  // taps copied out of the ring
    check_queue_room(c, h.count, frame_bytes);
    std::vector<WireEntry> wire;
    for (uint32_t i = 0; i < h.count; ++i) wire.push_back(get_entry(r));
    const char* area = r.rest();
    const uint64_t area_bytes = r.left();
    Pending p;
    p.header = h;
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
      engine::StepEntry e{x.session, x.keep, x.p0, x.n_new, {nullptr, wire_dtype(x.taps_dtype)}, x.anchor,
                          {x.temperature, x.top_k, x.top_p, x.seed}, x.dist_width};
      if (x.taps_where > kTapsRing)
        throw bad(fmt::format("taps_where {} is not 0 (none), 1 (inline) or 2 (ring)", x.taps_where));
      if (x.taps_where == kTapsNone) {
        if (x.n_new != 0) throw bad(fmt::format("{} new rows but no taps", x.n_new));
      } else {
        if (x.taps_bytes != need)
          throw bad(fmt::format("taps_bytes {} but {} rows of {} values take {}", x.taps_bytes, x.n_new, width, need));
        const bool in_ring = x.taps_where == kTapsRing;
        const uint64_t ring = in_ring ? transport.ring_bytes(route.client) : 0;
        if (in_ring && ring == 0) throw bad("taps in the shared-memory ring, but this client's HELLO mapped none");
        const uint64_t size = in_ring ? ring : area_bytes;
        if (x.taps_offset > size || need > size - x.taps_offset)
          throw bad(fmt::format("taps at offset {} ({} bytes) pass the end of the {} ({} bytes)", x.taps_offset, need,
                                in_ring ? "ring" : "frame's taps area", size));
        const char* at = area + x.taps_offset;
        if (in_ring) {  // copied out: the client may change or shrink its ring while the step waits
          if (x.taps_offset < kRingControlBytes)
            throw bad(fmt::format("taps at offset {} lie in the ring's control block (its first {} bytes)",
                                  x.taps_offset, kRingControlBytes));
          copied_bytes += need;  // held by the queue as a frame's bytes are
          check_queue_room(c, h.count, frame_bytes + copied_bytes);
          p.staged.emplace_back((need + 7) / 8);
          if (!transport.ring_copy(route.client, x.taps_offset, need, p.staged.back().data()))
            throw bad("the shared-memory ring faulted while its taps were read (it was shrunk or removed)");
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
    p.request = std::move(req);
    p.bytes = frame_bytes + copied_bytes;
    account(p, 1);
    pending.push_back(std::move(p));
  }

  // A request frame, from the socket or the client's ring.
  void on_request(Request& req) {
    route = req.route;
    if (!req.malformed.empty()) {
      refuse(Header{}, kMalformed, req.malformed);
      return;
    }
    const std::string& rid = route.client;
    last_request = Clock::now();
    const auto [it, fresh] = clients.try_emplace(rid);
    Client& c = it->second;
    if (fresh) {
      c.name = fmt::format("client {}", next_client++);
      c.pid = transport.peer_process(req);
      TPDRAFT_LOG_INFO("{} connected{}", c.name, c.pid > 0 ? fmt::format(" (process {})", c.pid) : "");
    }
    c.last = Clock::now();
    Reader r(req.data(), req.size());
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
      // The kinds whose request is the header alone.
      if (h.kind == kOpen || h.kind == kStats || h.kind == kShutdown || h.kind == kBell || h.kind == kBye)
        expect_end(r, kind_name(h.kind));
      switch (h.kind) {
        case kHello:
          // It may replace the ring this request came through: only through the socket.
          if (route.ring) throw ProtocolError("HELLO must come through the socket, not the ring");
          // Nor while queued STEPs of this client read taps (or came) through its ring.
          if (c.pending > 0)
            throw Refusal{fmt::format("HELLO while {} STEP request(s) of {} are in flight; wait for their replies",
                                      c.pending, c.name)};
          on_hello(c, h, r);
          break;
        case kOpen: {
          const int64_t open = engine.open_sessions();
          if (open >= caps().max_open_sessions)
            throw Refusal{fmt::format("all {} sessions allowed (--max-open-sessions) are open", open)};
          const int64_t mine = static_cast<int64_t>(c.sessions.size());
          if (options.max_client_sessions > 0 && mine >= options.max_client_sessions)
            throw Refusal{fmt::format("{} holds {} sessions, as many as one client may (--max-client-sessions)", c.name,
                                      mine)};
          const int64_t s = group.open_session();
          c.sessions.insert(s);
          reply(h, [&](Writer& w) { w.put<int64_t>(s); });
          break;
        }
        case kClose: {
          const int64_t s = session_arg(r, c, "CLOSE");
          group.close_session(s);
          c.sessions.erase(s);
          reply(h);
          break;
        }
        case kLength: {
          const int64_t s = session_arg(r, c, "LENGTH");
          reply(h, [&](Writer& w) { w.put<int64_t>(engine.session_length(s)); });
          break;
        }
        case kStep: on_step(c, h, r, req); break;
        case kStats: {
          stats.clients = clients.size();
          stats.open_sessions = static_cast<uint64_t>(engine.open_sessions());
          stats.uptime_seconds = seconds_since(started);
          reply(h, [&](Writer& w) { put_stats(w, stats); });
          break;
        }
        case kShutdown:
          TPDRAFT_LOG_INFO("{} asked the server to shut down", c.name);
          shutdown = true;
          reply(h);
          break;
        case kBell: break;  // poll_rings() finds the request
        case kBye:
          reply(h);
          if (c.pending == 0) close_client(rid, "said goodbye");
          break;
        default: throw ProtocolError(fmt::format("unknown request kind {}", h.kind));
      }
    } catch (const ProtocolError& e) {
      refuse(h, kMalformed, fmt::format("malformed {} request: {}", kind_name(h.kind), e.what()));
    } catch (const Refusal& e) {
      refuse(h, e.status, e.message);
    } catch (const std::bad_alloc&) {
      refuse(h, kArgument, fmt::format("out of memory for the {} request", kind_name(h.kind)));
    }
  }

  // ---- the batched forward --------------------------------------------------------------------

  // Whether the queued STEPs should run now. The clients the last forward answered ask again
  // soon: wait until each of them has (or is gone), or the queue holds a full forward, or the
  // first queued request has waited the gather time (options.gather_us, at most a tenth of
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
    return seconds_since(pending.front().arrived) >= std::min(options.gather_us * 1e-6, 0.1 * last_forward_seconds);
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
      account(p, -1);
      try {
        engine.check(p.entries);
      } catch (const Error& e) {
        route = p.request.route;
        refuse(p.header, kArgument, e.what());
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
      for (const Pending& p : batch) transport.send(p.request.route, error_reply(p.header, kRuntime, why));
      throw;
    }
    last_forward_seconds = seconds_since(forward_start);
    last_batch.clear();
    for (const Pending& p : batch) last_batch.insert(p.request.route.client);
    ++stats.forwards;
    stats.steps += batch.size();
    stats.entries += all.size();
    stats.max_batch = std::max<uint64_t>(stats.max_batch, all.size());
    const engine::StepTimes& t = engine.last_times();
    size_t k = 0;
    const int64_t rows = caps().block - 1;
    for (const Pending& p : batch) {
      route = p.request.route;
      reply(p.header, [&](Writer& w) {
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
      }, static_cast<uint32_t>(p.entries.size()));
    }
  }

  // A request joins (+1) or leaves (-1: to run, or refused) the queue: its client's counts and
  // the server's.
  void account(const Pending& p, int sign) {
    const int64_t entries = sign * static_cast<int64_t>(p.entries.size());
    const uint64_t bytes = sign > 0 ? p.bytes : 0 - p.bytes;  // modulo 2^64: a subtraction
    queued_entries += entries;
    queued_bytes += bytes;
    auto it = clients.find(p.request.route.client);
    if (it == clients.end()) return;
    it->second.pending += sign;
    it->second.queued_entries += entries;
    it->second.queued_bytes += bytes;
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
    for (const Pending& p : pending) {
      account(p, -1);
      transport.send(p.request.route, error_reply(p.header, status, why));
    }
    pending.clear();
  }

};

Server::Server(engine::Group& group, const ServerOptions& options) : impl_(std::make_unique<Impl>(group, options)) {}

Server::~Server() = default;

std::string Server::bind() {
  Impl& s = *impl_;
  // The largest request that can be valid: every entry with a full context of f32 rows inline.
  const engine::Caps& k = s.caps();
  const double largest = double(kHeaderBytes) + double(k.max_sessions) * (kEntryBytes + 8) +
                         double(k.max_sessions) * double(k.max_context) * double(k.taps_width) * 4;
  const int64_t max_msg = largest > 9e18 ? -1 : static_cast<int64_t>(largest) + 4096;
  return s.transport.bind(max_msg);
}

void Server::run() {
  Impl& s = *impl_;
  try {
    while (!g_stop_requested && !s.shutdown) {
      // Busy for a moment after each request (the next step of a loop follows soon); then
      // asleep on the socket, which a client's doorbell wakes.
      long wait_ms = 0;
      Transport& t = s.transport;
      const bool sleepy =
          s.pending.empty() && !t.poll_rings(s.on_request_) && seconds_since(s.last_request) > s.options.spin_us * 1e-6;
      if (sleepy) {
        t.set_sleeping(true);
        if (!t.poll_rings(s.on_request_)) wait_ms = 100;  // looked once more after saying so: nothing missed
      }
      if (!sleepy && !s.ready_to_run()) sched_yield();  // busy, but not in the way of a client on this core
      t.wait(wait_ms);
      if (sleepy) t.set_sleeping(false);
      t.drain(s.on_request_);
      t.poll_rings(s.on_request_);
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
