// `tpdraft serve` as target engines use it, checked against the in-process library: several
// clients at once over ipc:// + shared memory and over tcp:// draft exactly what tpdraft_step
// drafts; and each fault a server meets (malformed frames, limits, a client killed or silent, a
// rank that fails or is killed, a server that stops answering, SIGTERM) answered as
// docs/protocol.md says, without a hang: every client call carries a timeout.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <zmq.h>

#include "serve/message.h"
#include "serve/protocol.h"
#include "serve/ring.h"
#include "serve/serve_harness.h"
#include "support/rank.h"

#ifndef TPDRAFT_MPIRUN
#define TPDRAFT_MPIRUN ""  // a build without MPI: the ServeMpi tests skip themselves
#endif

namespace tpdraft::serve_test {
namespace {

// The steps one client made and what the server answered.
struct Trace {
  std::vector<std::vector<Spec>> steps;  // per step, per session
  std::vector<std::vector<Out>> outs;
};

// A client that opens `sessions` sessions and makes `steps` steps of all of them at once.
Trace drive(const std::string& address, size_t sessions, int steps, uint64_t seed,
            int shared_memory) {
  Trace t;
  Client c(address, 30, shared_memory);
  if (c.c == nullptr) return t;
  const tpdraft_caps caps = client_caps(c.c);
  std::vector<tpdraft_session> ids;
  std::vector<int64_t> lengths(sessions, 0);
  for (size_t i = 0; i < sessions; ++i) ids.push_back(c.open());
  std::mt19937_64 rng(seed);
  for (int k = 0; k < steps; ++k) {
    std::vector<Spec> specs(sessions);
    std::vector<Out> outs(sessions);
    std::vector<tpdraft_step_entry> entries(sessions);
    for (size_t i = 0; i < sessions; ++i) {
      const Spec& s = specs[i] = random_spec(rng, lengths[i], caps.taps_width, caps.vocab_size, 3);
      lengths[i] = (s.keep >= 0 ? s.keep : lengths[i]) + s.n_new;
      fill_entry(s, ids[i], caps.block_size, &outs[i], &entries[i]);
    }
    const tpdraft_status st = tpdraft_client_step(c.c, entries.data(), entries.size());
    EXPECT_EQ(st, TPDRAFT_OK) << "step " << k << ": " << tpdraft_last_error();
    if (st != TPDRAFT_OK) return t;
    t.steps.push_back(std::move(specs));
    t.outs.push_back(std::move(outs));
  }
  for (size_t i = 0; i < sessions; ++i) {
    int64_t n = -1;
    EXPECT_EQ(tpdraft_client_session_length(c.c, ids[i], &n), TPDRAFT_OK);
    EXPECT_EQ(n, lengths[i]);
  }
  return t;
}

// Replays a trace through the in-process library and compares every output.
void replay(tpdraft_drafter* d, const Trace& t, const std::string& who) {
  tpdraft_caps caps{sizeof caps};
  ASSERT_EQ(tpdraft_caps_get(d, &caps), TPDRAFT_OK);
  std::vector<tpdraft_session> ids;
  for (size_t k = 0; k < t.steps.size(); ++k) {
    const size_t n = t.steps[k].size();
    while (ids.size() < n) {
      tpdraft_session s = -1;
      ASSERT_EQ(tpdraft_session_open(d, &s), TPDRAFT_OK) << tpdraft_last_error();
      ids.push_back(s);
    }
    std::vector<Out> outs(n);
    std::vector<tpdraft_step_entry> entries(n);
    for (size_t i = 0; i < n; ++i)
      fill_entry(t.steps[k][i], ids[i], caps.block_size, &outs[i], &entries[i]);
    ASSERT_EQ(tpdraft_step(d, entries.data(), n), TPDRAFT_OK) << tpdraft_last_error();
    for (size_t i = 0; i < n; ++i)
      expect_same(t.outs[k][i], outs[i], who + " step " + std::to_string(k) + " session " + std::to_string(i));
  }
  for (tpdraft_session s : ids) tpdraft_session_close(d, s);
}

tpdraft_drafter* open_library(const std::string& dir, int tp, const char* quant = nullptr) {
  tpdraft_options o;
  tpdraft_options_init(&o);
  o.backend = "cpu";
  o.threads = 1;
  o.tp = tp;
  o.quant = quant;
  tpdraft_drafter* d = nullptr;
  EXPECT_EQ(tpdraft_open((dir + "/drafter").c_str(), (dir + "/target").c_str(), &o, &d), TPDRAFT_OK)
      << tpdraft_last_error();
  return d;
}

// One step of session s as `spec` asks; the call's status, the outputs in *out.
tpdraft_status step_one(const Client& c, tpdraft_session s, const Spec& spec, Out* out) {
  tpdraft_step_entry e;
  fill_entry(spec, s, client_caps(c.c).block_size, out, &e);
  return tpdraft_client_step(c.c, &e, 1);
}

// One step of session s with a random spec of up to 2 new rows (keep = 0: from an empty
// session); the call's status, the outputs in *out.
tpdraft_status random_step(const Client& c, tpdraft_session s, std::mt19937_64& rng, Out* out, int64_t keep = -1) {
  const tpdraft_caps caps = client_caps(c.c);
  Spec spec = random_spec(rng, 0, caps.taps_width, caps.vocab_size, 2);
  if (keep >= 0) spec.keep = keep;
  return step_one(c, s, spec, out);
}

// Several clients at once against one server, then every client's trace through the library.
void many_clients_match_the_library(const std::string& dir, const std::string& address, int shared_memory,
                                    const char* quant = nullptr) {
  constexpr int kClients = 3;
  std::vector<Trace> traces(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] { traces[static_cast<size_t>(i)] = drive(address, 2, 10, 100 + i, shared_memory); });
  for (auto& t : threads) t.join();
  tpdraft_drafter* d = open_library(dir, 2, quant);
  ASSERT_NE(d, nullptr);
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(traces[static_cast<size_t>(i)].steps.size(), 10u) << "client " << i;
    replay(d, traces[static_cast<size_t>(i)], "client " + std::to_string(i));
  }
  tpdraft_close(d);
}

// Each test's own temp dir, a random checkpoint in it, and the server started on that.
class Serve : public ::testing::Test {
 protected:
  // Writes a random checkpoint of configs/`config` (testing::write_checkpoint) and starts
  // `[launcher] tpdraft serve args` on it, listening on ipc://DIR/s.sock unless `args` name a
  // --listen of their own; asserts that it wrote its address (call it through
  // ASSERT_NO_FATAL_FAILURE).
  void start(std::vector<std::string> args, const std::vector<std::string>& launcher = {},
             const std::vector<std::string>& env = {},
             const std::string& config = "tiny-dflash2.json") {
    testing::write_checkpoint(dir, testing::shipped_config(config));
    if (std::find(args.begin(), args.end(), "--listen") == args.end())
      args.insert(args.end(), {"--listen", "ipc://" + dir.file("s.sock")});
    server.emplace(dir.path(), args, launcher, env);
    address = server->wait_address();
    ASSERT_FALSE(address.empty()) << server->log();
  }
  // A server that stopped cleanly left neither its address file nor its socket behind.
  void expect_files_removed() const {
    EXPECT_FALSE(std::filesystem::exists(server->address_file()));
    EXPECT_FALSE(std::filesystem::exists(dir.file("s.sock")));
  }
  int sigterm_while_clients_step();

  testing::TempDir dir;
  std::optional<ServerProcess> server;
  std::string address;
};

TEST_F(Serve, HelpAnswersWithoutWork) {
  const auto r = testing::run_command(std::string(TPDRAFT_BIN) + " serve --help");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("--listen"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--idle-timeout"), std::string::npos) << r.out;
}

TEST_F(Serve, ManyClientsOverIpcAndSharedMemoryDraftWhatTheLibraryDrafts) {
  ASSERT_NO_FATAL_FAILURE(start({"--tp", "2", "--max-sessions", "4"}));
  {
    Client probe(address);
    ASSERT_NE(probe.c, nullptr);
    EXPECT_EQ(tpdraft_client_shared_memory(probe.c), 1);
    const tpdraft_caps caps = client_caps(probe.c);
    EXPECT_EQ(caps.tp, 2);
    EXPECT_EQ(caps.max_sessions, 4);
    EXPECT_STREQ(caps.architecture, "DFlash2DraftModel");
  }
  many_clients_match_the_library(dir.path(), address, -1);
  // SIGTERM: a clean stop that removes the address file and the socket.
  server->signal(SIGTERM);
  EXPECT_EQ(server->wait_exit(30), 0) << server->log();
  expect_files_removed();
}

// --quant quantizes the served drafter while it loads, as the library's options.quant does.
TEST_F(Serve, AQuantizedServerDraftsWhatTheQuantizedLibraryDrafts) {
  ASSERT_NO_FATAL_FAILURE(start({"--tp", "2", "--quant", "q4+head"}));
  many_clients_match_the_library(dir.path(), address, -1, "q4+head");
  server->signal(SIGTERM);
  EXPECT_EQ(server->wait_exit(30), 0) << server->log();
}

TEST_F(Serve, ManyClientsOverTcpDraftWhatTheLibraryDrafts) {
  const std::string tcp = "tcp://127.0.0.1:";
  ASSERT_NO_FATAL_FAILURE(start({"--tp", "2", "--max-sessions", "6", "--listen", tcp + "*"}, {}, {},
                                "tiny-dflash.json"));
  ASSERT_EQ(address.rfind(tcp, 0), 0u) << address << server->log();
  {
    Client probe(address);
    ASSERT_NE(probe.c, nullptr);
    EXPECT_EQ(tpdraft_client_shared_memory(probe.c), 0);  // over tcp the taps travel inline
  }
  many_clients_match_the_library(dir.path(), address, 0);
}

TEST_F(Serve, StepsThatArriveDuringAForwardShareTheNextOne) {
  ASSERT_NO_FATAL_FAILURE(start({"--max-sessions", "3"}));
  constexpr size_t kClients = 5;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<tpdraft_session> sessions;
  for (size_t i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Client>(address));
    sessions.push_back(clients.back()->open());
  }
  const tpdraft_caps caps = client_caps(clients[0]->c);
  tpdraft_server_stats stats{};
  // The server is stopped while five clients send a step each, so the five wait together when
  // it goes on: it takes them 3 (--max-sessions) then 2. Over a few rounds at least one forward
  // must have held more than one client's step, and none more than 3 entries.
  for (int round = 0; round < 4; ++round) {
    server->signal(SIGSTOP);
    std::vector<std::thread> threads;
    std::vector<Out> outs(kClients);
    std::mt19937_64 rng(static_cast<uint64_t>(round));
    std::vector<Spec> specs(kClients);
    for (Spec& s : specs) {
      s = random_spec(rng, 0, caps.taps_width, caps.vocab_size, 2);
      s.keep = 0;
    }
    for (size_t i = 0; i < kClients; ++i)
      threads.emplace_back([&, i] {
        EXPECT_EQ(step_one(*clients[i], sessions[i], specs[i], &outs[i]), TPDRAFT_OK) << tpdraft_last_error();
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // lets the requests reach the socket
    server->signal(SIGCONT);
    for (auto& t : threads) t.join();
    ASSERT_EQ(tpdraft_client_stats(clients[0]->c, &stats), TPDRAFT_OK) << tpdraft_last_error();
    if (stats.max_batch > 1) break;
  }
  EXPECT_GT(stats.max_batch, 1u);
  EXPECT_LE(stats.max_batch, 3u);
  EXPECT_LT(stats.forwards, stats.steps);
}

// A reply's status and message ("" when ok).
std::pair<uint32_t, std::string> status_of(const char* reply, size_t bytes) {
  serve::Reader r(reply, bytes);
  const serve::Header h = r.header();
  return {h.status, h.status == 0 ? "" : r.str("message")};
}

// A raw DEALER socket: frames of our own making, and the server's reply to each.
struct RawSocket {
  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_DEALER);
  explicit RawSocket(const std::string& address) {
    const int linger = 0, timeout = 20000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
    zmq_connect(sock, address.c_str());
  }
  ~RawSocket() {
    zmq_close(sock);
    zmq_ctx_term(ctx);
  }
  // Sends the parts; returns the reply's status and message ("TIMEOUT" when none came).
  std::pair<uint32_t, std::string> ask(const std::vector<std::string>& parts) {
    for (size_t i = 0; i < parts.size(); ++i)
      zmq_send(sock, parts[i].data(), parts[i].size(), i + 1 < parts.size() ? ZMQ_SNDMORE : 0);
    serve::Message m;
    if (zmq_msg_recv(&m.msg, sock, 0) < 0) return {99, "TIMEOUT"};
    return status_of(m.data(), m.size());
  }
};

std::string frame(uint16_t kind, uint32_t count, const std::string& body, uint16_t version = serve::kProtocolVersion) {
  serve::Header h;
  h.version = version;
  h.kind = kind;
  h.count = count;
  h.id = 42;
  std::string out;
  serve::Writer(&out).header(h);
  return out + body;
}

std::string entry_bytes(const serve::WireEntry& e) {
  std::string out;
  serve::Writer w(&out);
  serve::put_entry(w, e);
  return out;
}

// A HELLO's body: the ring's name ("" for none) and its bytes.
std::string hello_body(const std::string& ring_name, uint64_t bytes) {
  std::string body;
  serve::Writer(&body).str(ring_name);
  serve::Writer(&body).put<uint64_t>(bytes);
  return body;
}

// A client's ring of 64 KiB made as clients make them (mode 600) and mapped here; nullptr on failure.
constexpr size_t kTestRingBytes = 65536;
char* make_test_ring(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return nullptr;
  void* mapped = ftruncate(fd, kTestRingBytes) == 0
                     ? mmap(nullptr, kTestRingBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                     : MAP_FAILED;
  close(fd);
  return mapped == MAP_FAILED ? nullptr : static_cast<char*>(mapped);
}

TEST_F(Serve, MalformedAndWrongRequestsGetAnErrorNamingTheProblemAndChangeNothing) {
  ASSERT_NO_FATAL_FAILURE(start({"--max-sessions", "2", "--spin-us", "0"}));
  // A well-behaved client steps before and after; its drafts must equal the library's.
  // (--spin-us 0: the server sleeps after every request, so each of its ring requests rings the
  // doorbell.)
  Client good(address);
  const tpdraft_caps caps = client_caps(good.c);
  const tpdraft_session gs = good.open();
  std::mt19937_64 rng(5);
  Trace trace;
  auto good_step = [&] {
    Spec s = random_spec(rng, trace.steps.empty() ? 0 : 1, caps.taps_width, caps.vocab_size, 2);
    s.keep = -1;
    Out out;
    ASSERT_EQ(step_one(good, gs, s, &out), TPDRAFT_OK) << tpdraft_last_error();
    trace.steps.push_back({s});
    trace.outs.push_back({out});
  };
  good_step();

  RawSocket raw(address);
  const std::string taps(static_cast<size_t>(caps.taps_width) * 4, '\0');
  // Its own session, for the entries below.
  ASSERT_EQ(raw.ask({frame(serve::kHello, 0, hello_body("", 0))}).first, 0u);
  ASSERT_EQ(raw.ask({frame(serve::kOpen, 0, "")}).first, 0u);
  const int64_t own = gs + 1;  // sessions are numbered in opening order
  serve::WireEntry fine;
  fine.session = own;
  fine.n_new = 1;
  fine.anchor = 1;
  fine.taps_where = serve::kTapsInline;
  fine.taps_bytes = taps.size();
  struct Case {
    std::string what;
    std::vector<std::string> parts;
    uint32_t status;
    std::string says;
  };
  serve::WireEntry bad_dtype = fine, past_end = fine, no_ring = fine, other = fine, bad_where = fine, nan_taps = fine;
  bad_dtype.taps_dtype = 7;
  past_end.taps_offset = 8;
  no_ring.taps_where = serve::kTapsRing;
  other.session = gs;  // the good client's
  bad_where.taps_where = 9;
  std::string nan_area = taps, huge_area = taps;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&nan_area[4], &nan, 4);
  // Finite taps that overflow the forward, and a temperature whose inverse does: refused, where
  // they once passed every check and ended the server for every client.
  const std::vector<float> huge(static_cast<size_t>(caps.taps_width), 3e38f);
  std::memcpy(&huge_area[0], huge.data(), huge_area.size());
  serve::WireEntry cold = fine;
  cold.temperature = 1e-310;
  std::string bad_magic = frame(serve::kStats, 0, "");
  bad_magic[0] = 'X';
  const std::vector<Case> cases = {
      {"short frame", {"abc"}, serve::kMalformed, "shorter than the 24-byte header"},
      {"bad magic", {bad_magic}, serve::kMalformed, "header.magic"},
      {"other version", {frame(serve::kStats, 0, "", 9)}, serve::kMalformed, "protocol version 9"},
      {"unknown kind", {frame(77, 0, "")}, serve::kMalformed, "unknown request kind 77"},
      {"two frames", {frame(serve::kStats, 0, ""), "x"}, serve::kMalformed, "one frame, got 2"},
      {"trailing bytes", {frame(serve::kStats, 0, "zz")}, serve::kMalformed, "2 bytes past the end"},
      {"truncated entry", {frame(serve::kStep, 1, "0123")}, serve::kMalformed, "frame ends inside entry.session"},
      {"too many entries", {frame(serve::kStep, 3, "")}, serve::kArgument, "1 to 2 entries (--max-sessions), got 3"},
      {"bad dtype", {frame(serve::kStep, 1, entry_bytes(bad_dtype) + taps)}, serve::kArgument, "taps_dtype 7"},
      {"taps past end", {frame(serve::kStep, 1, entry_bytes(past_end) + taps)}, serve::kArgument, "pass the end"},
      {"no ring", {frame(serve::kStep, 1, entry_bytes(no_ring) + taps)}, serve::kArgument, "mapped none"},
      {"bad where", {frame(serve::kStep, 1, entry_bytes(bad_where) + taps)}, serve::kArgument, "taps_where 9"},
      {"another client's session", {frame(serve::kStep, 1, entry_bytes(other) + taps)}, serve::kArgument,
       "session " + std::to_string(gs) + " is not open for client"},
      {"NaN taps", {frame(serve::kStep, 1, entry_bytes(nan_taps) + nan_area)}, serve::kArgument, "NaN or Inf"},
      {"huge taps", {frame(serve::kStep, 1, entry_bytes(fine) + huge_area)}, serve::kArgument, "beyond the ±2^30"},
      {"tiny temperature", {frame(serve::kStep, 1, entry_bytes(cold) + taps)}, serve::kArgument, "at least 1e-06"},
      {"close unknown", {frame(serve::kClose, 0, std::string(8, '\x09'))}, serve::kArgument, "is not open for"},
  };
  for (const Case& c : cases) {
    const auto [status, message] = raw.ask(c.parts);
    EXPECT_EQ(status, c.status) << c.what << ": " << message;
    EXPECT_NE(message.find(c.says), std::string::npos) << c.what << ": '" << message << "' lacks '" << c.says << "'";
  }
  // A ring of its own, named in a HELLO: a request placed outside it is refused through the ring,
  // and one placed inside is answered there.
  const std::string ring_name = "/tpdraft-ring-test-" + std::to_string(getpid());
  char* mapped = make_test_ring(ring_name);
  ASSERT_NE(mapped, nullptr);
  const std::string ring_hello = hello_body(ring_name, kTestRingBytes);
  RawSocket ringed(address);
  EXPECT_EQ(ringed.ask({frame(serve::kHello, 0, ring_hello)}).first, 0u);
  shm_unlink(ring_name.c_str());
  char* ring = mapped;
  auto* ctl = reinterpret_cast<serve::RingControl*>(ring);
  auto ring_ask = [&](uint64_t at, const std::string& request, uint32_t seq) -> std::pair<uint32_t, std::string> {
    if (at + request.size() <= 65536) std::memcpy(ring + at, request.data(), request.size());
    ctl->request_offset = at;
    ctl->request_bytes = request.size();
    ctl->reply_offset = 32768;
    ctl->reply_capacity = 32768;
    shared_store(&ctl->request_seq, seq);
    zmq_send(ringed.sock, frame(serve::kBell, 0, "").data(), serve::kHeaderBytes, 0);  // wakes it if asleep
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (shared_load(&ctl->reply_seq) != seq && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (shared_load(&ctl->reply_seq) != seq) return {99, "TIMEOUT"};
    return status_of(ring + 32768, ctl->reply_bytes);
  };
  const auto outside = ring_ask(1 << 20, frame(serve::kStats, 0, ""), 1);
  EXPECT_EQ(outside.first, serve::kMalformed) << outside.second;
  EXPECT_NE(outside.second.find("outside the ring"), std::string::npos) << outside.second;
  const auto hello_in_ring = ring_ask(4096, frame(serve::kHello, 0, ring_hello), 2);
  EXPECT_NE(hello_in_ring.second.find("HELLO must come through the socket"), std::string::npos)
      << hello_in_ring.second;
  EXPECT_EQ(ring_ask(4096, frame(serve::kStats, 0, ""), 3).first, 0u);
  munmap(mapped, kTestRingBytes);

  // The same socket's well-formed step still works, and its session did not move.
  EXPECT_EQ(raw.ask({frame(serve::kStep, 1, entry_bytes(fine) + taps)}).first, 0u);
  good_step();
  good_step();
  tpdraft_server_stats stats{};
  ASSERT_EQ(tpdraft_client_stats(good.c, &stats), TPDRAFT_OK);
  EXPECT_EQ(stats.errors, cases.size() + 2);  // and the two ring requests
  EXPECT_EQ(stats.open_sessions, 2u);
  tpdraft_drafter* d = open_library(dir.path(), 1);
  ASSERT_NE(d, nullptr);
  replay(d, trace, "the good client");
  tpdraft_close(d);
  EXPECT_TRUE(server->running()) << server->log();
}

// A client whose STEP reads its taps from its ring, and which then says HELLO without a ring
// before that STEP ran: the HELLO is refused (the ring stays mapped for the queued step), the STEP
// is answered, and the server lives on. The server is stopped while both are sent, so that it
// reads them in one go.
TEST_F(Serve, AHelloWhileItsStepsWaitIsRefusedAndTheirRingStaysMapped) {
  ASSERT_NO_FATAL_FAILURE(start({"--max-sessions", "2"}));
  Client probe(address);
  const tpdraft_caps caps = client_caps(probe.c);
  const std::string ring_name = "/tpdraft-ring-test-hello-" + std::to_string(getpid());
  char* mapped = make_test_ring(ring_name);
  ASSERT_NE(mapped, nullptr);
  RawSocket raw(address);
  const std::string ring_hello = hello_body(ring_name, kTestRingBytes), plain_hello = hello_body("", 0);
  ASSERT_EQ(raw.ask({frame(serve::kHello, 0, ring_hello)}).first, 0u);
  shm_unlink(ring_name.c_str());
  const std::string open = frame(serve::kOpen, 0, "");
  zmq_send(raw.sock, open.data(), open.size(), 0);
  serve::Message opened;
  ASSERT_GE(zmq_msg_recv(&opened.msg, raw.sock, 0), 0);
  serve::Reader opened_reply(opened.data(), opened.size());
  ASSERT_EQ(opened_reply.header().status, 0u);
  const std::vector<float> rows(static_cast<size_t>(2 * caps.taps_width), 0.5f);
  std::memcpy(mapped + 4096, rows.data(), rows.size() * sizeof(float));
  serve::WireEntry e;
  e.session = opened_reply.get<int64_t>("session");
  e.n_new = 2;
  e.anchor = 3;
  e.taps_where = serve::kTapsRing;
  e.taps_offset = 4096;
  e.taps_bytes = rows.size() * sizeof(float);
  const std::string step = frame(serve::kStep, 1, entry_bytes(e)), hello = frame(serve::kHello, 0, plain_hello);
  server->signal(SIGSTOP);
  zmq_send(raw.sock, step.data(), step.size(), 0);
  zmq_send(raw.sock, hello.data(), hello.size(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server->signal(SIGCONT);
  std::map<uint16_t, std::pair<uint32_t, std::string>> replies;  // by request kind
  for (int i = 0; i < 2; ++i) {
    serve::Message m;
    ASSERT_GE(zmq_msg_recv(&m.msg, raw.sock, 0), 0) << "no reply " << i << ": " << server->log();
    serve::Reader r(m.data(), m.size());
    replies[static_cast<uint16_t>(r.header().kind & ~serve::kReply)] = status_of(m.data(), m.size());
  }
  EXPECT_EQ(replies[serve::kStep].first, 0u) << replies[serve::kStep].second;
  EXPECT_EQ(replies[serve::kHello].first, serve::kArgument);
  EXPECT_NE(replies[serve::kHello].second.find("HELLO while 1 STEP request(s)"), std::string::npos)
      << replies[serve::kHello].second;
  EXPECT_TRUE(server->running()) << server->log();
  // Once its steps are answered the client may say HELLO again.
  EXPECT_EQ(raw.ask({hello}).first, 0u);
  munmap(mapped, kTestRingBytes);
}

// The ring a HELLO names: its reply's "mapped" flag and why not.
std::pair<uint32_t, std::string> hello_ring(RawSocket& raw, const std::string& name, uint64_t bytes) {
  const std::string request = frame(serve::kHello, 0, hello_body(name, bytes));
  zmq_send(raw.sock, request.data(), request.size(), 0);
  serve::Message m;
  if (zmq_msg_recv(&m.msg, raw.sock, 0) < 0) return {99, "TIMEOUT"};
  serve::Reader r(m.data(), m.size());
  if (r.header().status != 0) return {98, "refused"};
  serve::get_caps(r);
  r.get<double>("idle_timeout");
  const uint32_t mapped = r.get<uint32_t>("mapped");
  return {mapped, r.str("why not")};
}

// A shared-memory segment of `bytes` with `mode`, unlinked when the object dies.
struct Segment {
  std::string name;
  Segment(std::string n, mode_t mode, size_t bytes = 65536) : name(std::move(n)) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, mode);
    EXPECT_GE(fd, 0) << name;
    EXPECT_EQ(fchmod(fd, mode), 0);  // past the umask
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    close(fd);
  }
  ~Segment() { shm_unlink(name.c_str()); }
};

// A server maps only a ring one of its own clients could have made: named as clients name them,
// this user's alone; and none at all for a client over tcp, which could name any segment of the
// server's host.
TEST_F(Serve, OnlyAClientsOwnRingIsMapped) {
  ASSERT_NO_FATAL_FAILURE(start({}));
  const std::string pid = std::to_string(getpid());
  const Segment good("/tpdraft-ring-test-own-" + pid, 0600), open_to_all("/tpdraft-ring-test-open-" + pid, 0644),
      other("/tpdraft-test-other-" + pid, 0600);
  RawSocket raw(address);
  EXPECT_EQ(hello_ring(raw, good.name, 65536), std::make_pair(1u, std::string()));
  const auto shared = hello_ring(raw, open_to_all.name, 65536);
  EXPECT_EQ(shared.first, 0u);
  EXPECT_NE(shared.second.find("is not this server user's alone"), std::string::npos) << shared.second;
  const auto foreign = hello_ring(raw, other.name, 65536);
  EXPECT_EQ(foreign.first, 0u);
  EXPECT_NE(foreign.second.find("does not start with /tpdraft-ring-"), std::string::npos) << foreign.second;
}

TEST_F(Serve, ATcpClientNamesNoRing) {
  ASSERT_NO_FATAL_FAILURE(start({"--listen", "tcp://127.0.0.1:*"}));
  const Segment good("/tpdraft-ring-test-tcp-" + std::to_string(getpid()), 0600);
  RawSocket raw(address);
  const auto got = hello_ring(raw, good.name, 65536);
  EXPECT_EQ(got.first, 0u);
  EXPECT_NE(got.second.find("ipc:// only"), std::string::npos) << got.second;
  // Its steps take their taps inline, and draft.
  Client c(address);
  EXPECT_FALSE(tpdraft_client_shared_memory(c.c));
  std::mt19937_64 rng(2);
  Out out;
  EXPECT_EQ(random_step(c, c.open(), rng, &out), TPDRAFT_OK) << tpdraft_last_error();
  EXPECT_NE(out.tokens[0], -1);
}

// A second server on the ipc path of a live one is refused, as tcp refuses a port in use; the
// first keeps its socket and address file. A socket file nobody listens on (its server was
// killed) is stale and taken over, and removed when that server ends.
TEST_F(Serve, ASecondServerOnALiveIpcPathIsRefused) {
  ASSERT_NO_FATAL_FAILURE(start({}));
  const std::string path = dir.file("s.sock");
  {
    ServerProcess second(dir.path(), {"--listen", "ipc://" + path});
    EXPECT_EQ(second.wait_exit(20), 2) << second.log();  // --listen: the command line's error
    EXPECT_NE(second.log().find("--listen ipc://" + path + ": a server is listening there already"), std::string::npos)
        << second.log();
  }
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::exists(server->address_file()));
  {
    Client c(address);
    std::mt19937_64 rng(4);
    Out out;
    EXPECT_EQ(random_step(c, c.open(), rng, &out), TPDRAFT_OK) << tpdraft_last_error();
  }
  server->signal(SIGKILL);
  server->wait_exit(30);
  ASSERT_TRUE(std::filesystem::exists(path));  // left behind: stale
  ServerProcess third(dir.path(), {"--listen", "ipc://" + path});
  const std::string again = third.wait_address();
  ASSERT_FALSE(again.empty()) << third.log();
  {
    Client c(again);
    std::mt19937_64 rng(5);
    Out out;
    EXPECT_EQ(random_step(c, c.open(), rng, &out), TPDRAFT_OK) << tpdraft_last_error();
  }
  third.signal(SIGTERM);
  EXPECT_EQ(third.wait_exit(30), 0) << third.log();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(Serve, LimitsAnswerWithErrors) {
  ASSERT_NO_FATAL_FAILURE(
      start({"--max-sessions", "2", "--max-open-sessions", "3", "--max-context", "16"}));
  Client a(address), b(address);
  const tpdraft_caps caps = client_caps(a.c);
  EXPECT_EQ(caps.max_context, 16);
  EXPECT_EQ(caps.max_open_sessions, 3);
  const tpdraft_session s1 = a.open(), s2 = a.open(), s3 = b.open();
  tpdraft_session s4 = -1;
  EXPECT_EQ(tpdraft_client_session_open(b.c, &s4), TPDRAFT_ERROR_ARGUMENT);
  EXPECT_NE(std::string(tpdraft_last_error()).find("all 3 sessions allowed (--max-open-sessions) are open"),
            std::string::npos) << tpdraft_last_error();
  // Three entries in one step: refused by the client already, which knows the server's limit.
  std::vector<Out> outs(3);
  std::vector<tpdraft_step_entry> e(3);
  std::mt19937_64 rng(1);
  std::vector<Spec> specs;
  for (int i = 0; i < 3; ++i) specs.push_back(random_spec(rng, 0, caps.taps_width, caps.vocab_size, 2));
  const tpdraft_session ids[3] = {s1, s2, s3};
  for (size_t i = 0; i < 3; ++i) fill_entry(specs[i], ids[i], caps.block_size, &outs[i], &e[i]);
  EXPECT_EQ(tpdraft_client_step(a.c, e.data(), 3), TPDRAFT_ERROR_ARGUMENT);
  EXPECT_NE(std::string(tpdraft_last_error()).find("1 to 2 entries"), std::string::npos) << tpdraft_last_error();
  // A count beyond the limit is refused before any entry is read or written: the entries, all
  // three of the caller's here, keep what they held (a count past the array must not be written
  // through).
  const std::vector<int64_t> untouched(static_cast<size_t>(caps.block_size - 1), -7);
  for (const Out& o : outs) EXPECT_EQ(o.tokens, untouched);
  // An entry refused by the client: the ones before it, which it checked, say "no drafts".
  e[1].tokens = nullptr;
  EXPECT_EQ(tpdraft_client_step(a.c, e.data(), 2), TPDRAFT_ERROR_ARGUMENT);
  EXPECT_NE(std::string(tpdraft_last_error()).find("entry 1"), std::string::npos) << tpdraft_last_error();
  EXPECT_EQ(outs[0].tokens, std::vector<int64_t>(static_cast<size_t>(caps.block_size - 1), -1));  // no drafts
  EXPECT_EQ(outs[1].tokens, untouched);
  e[1].tokens = outs[1].tokens.data();
  // A step of `rows` new rows (all 0.5) on s1, the rest as the first spec asks.
  auto step_rows = [&](int64_t rows) {
    Spec big = specs[0];
    big.n_new = rows;
    big.keep = -1;
    big.taps.assign(static_cast<size_t>(rows * caps.taps_width), 0.5f);
    Out out;
    return step_one(a, s1, big, &out);
  };
  // More positions than the max context.
  EXPECT_EQ(step_rows(17), TPDRAFT_ERROR_ARGUMENT);
  EXPECT_NE(std::string(tpdraft_last_error()).find("max context 16"), std::string::npos) << tpdraft_last_error();
  EXPECT_EQ(step_rows(16), TPDRAFT_OK) << tpdraft_last_error();
  EXPECT_EQ(step_rows(1), TPDRAFT_ERROR_ARGUMENT);  // the session is full
  EXPECT_NE(std::string(tpdraft_last_error()).find("do not fit the max context 16"), std::string::npos)
      << tpdraft_last_error();
  // After a close there is room for one more.
  EXPECT_EQ(tpdraft_client_session_close(a.c, s2), TPDRAFT_OK) << tpdraft_last_error();
  EXPECT_EQ(tpdraft_client_session_open(b.c, &s4), TPDRAFT_OK) << tpdraft_last_error();
  EXPECT_TRUE(server->running());

  // Memory: sessions that could not all fit are refused at start, with the numbers.
  ServerProcess tight(dir.path(), {"--max-open-sessions", "1000", "--max-memory", "1000000", "--listen",
                                   "ipc://" + dir.file("t.sock")});
  EXPECT_EQ(tight.wait_exit(60), 3) << tight.log();
  EXPECT_NE(tight.log().find("more than the 1 MiB --max-memory allows"), std::string::npos) << tight.log();
}

// A client process that opens two sessions and is killed without a word; returns its pid.
pid_t kill_a_client_holding_two_sessions(const std::string& address) {
  const pid_t child = fork();
  if (child == 0) {
    tpdraft_client* c = nullptr;
    tpdraft_session s;
    if (tpdraft_client_open(address.c_str(), nullptr, &c) != TPDRAFT_OK) _exit(2);
    if (tpdraft_client_session_open(c, &s) != TPDRAFT_OK || tpdraft_client_session_open(c, &s) != TPDRAFT_OK) _exit(3);
    raise(SIGKILL);
  }
  int st = 0;
  EXPECT_EQ(waitpid(child, &st, 0), child);
  EXPECT_TRUE(WIFSIGNALED(st)) << "the client process failed before it was killed: " << st;
  return child;
}

// Polls the server's stats through `live` until one session is open (at most a minute); the last.
tpdraft_server_stats wait_for_one_open_session(const Client& live) {
  tpdraft_server_stats stats{};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(tpdraft_client_stats(live.c, &stats), TPDRAFT_OK) << tpdraft_last_error();
  } while (stats.open_sessions != 1 && std::chrono::steady_clock::now() < deadline);
  return stats;
}

// A client process killed without a word: over ipc:// the server sees its process end and closes
// its sessions within a second, whatever --idle-timeout says (it waited the whole timeout, 300 s by
// default, while such clients blocked every new session).
TEST_F(Serve, AKilledClientOverIpcHasItsSessionsClosedAtOnce) {
  ASSERT_NO_FATAL_FAILURE(start({}));
  const pid_t child = kill_a_client_holding_two_sessions(address);
  Client live(address, 20);  // another, which keeps talking: its session stays
  const tpdraft_session mine = live.open();
  const tpdraft_server_stats stats = wait_for_one_open_session(live);
  EXPECT_EQ(stats.open_sessions, 1u) << server->log();
  EXPECT_EQ(stats.clients_reaped, 1u);
  int64_t n = -1;
  EXPECT_EQ(tpdraft_client_session_length(live.c, mine, &n), TPDRAFT_OK) << tpdraft_last_error();
  EXPECT_NE(server->log().find("is gone (its process " + std::to_string(child) + " ended)"), std::string::npos)
      << server->log();
}

// Over tcp:// no process can be watched: a client silent for --idle-timeout loses its sessions.
TEST_F(Serve, AKilledOrSilentClientHasItsSessionsClosed) {
  ASSERT_NO_FATAL_FAILURE(start({"--idle-timeout", "1", "--listen", "tcp://127.0.0.1:*"}));
  kill_a_client_holding_two_sessions(address);
  Client live(address, 20);
  const tpdraft_session mine = live.open();
  const tpdraft_server_stats stats = wait_for_one_open_session(live);
  EXPECT_EQ(stats.open_sessions, 1u) << server->log();
  EXPECT_GE(stats.clients_reaped, 1u);
  int64_t n = -1;
  EXPECT_EQ(tpdraft_client_session_length(live.c, mine, &n), TPDRAFT_OK) << tpdraft_last_error();
  EXPECT_NE(server->log().find("was silent for more than 1 s"), std::string::npos) << server->log();
}

// A client that shrinks its ring under the server (ftruncate on its own descriptor) made the
// server's next look at the ring a SIGBUS, ending it for every client. The server now only
// unmaps that ring, and goes on answering through the socket.
TEST_F(Serve, AClientThatShrinksItsRingLosesOnlyTheRing) {
  ASSERT_NO_FATAL_FAILURE(start({"--spin-us", "0"}));
  Client good(address);
  const tpdraft_session gs = good.open();
  const std::string ring_name = "/tpdraft-ring-test-shrink-" + std::to_string(getpid());
  char* mapped = make_test_ring(ring_name);
  ASSERT_NE(mapped, nullptr);
  RawSocket raw(address);
  ASSERT_EQ(raw.ask({frame(serve::kHello, 0, hello_body(ring_name, kTestRingBytes))}).first, 0u);
  const int fd = shm_open(ring_name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  shm_unlink(ring_name.c_str());
  // A doorbell makes the server look at the ring; STATS after it is answered through the socket.
  const std::string bell = frame(serve::kBell, 0, "");
  zmq_send(raw.sock, bell.data(), bell.size(), 0);
  EXPECT_EQ(raw.ask({frame(serve::kStats, 0, "")}).first, 0u);
  EXPECT_TRUE(server->running()) << server->log();
  int64_t n = -1;
  EXPECT_EQ(tpdraft_client_session_length(good.c, gs, &n), TPDRAFT_OK) << tpdraft_last_error();
  EXPECT_NE(server->log().find("its shared-memory ring faulted"), std::string::npos) << server->log();
  munmap(mapped, kTestRingBytes);
}

TEST_F(Serve, AClientMayHoldOnlyItsShareOfSessions) {
  ASSERT_NO_FATAL_FAILURE(start({"--max-client-sessions", "2"}));
  Client a(address), b(address);
  a.open();
  a.open();
  tpdraft_session third = -1;
  EXPECT_EQ(tpdraft_client_session_open(a.c, &third), TPDRAFT_ERROR_ARGUMENT);
  EXPECT_NE(std::string(tpdraft_last_error()).find("as many as one client may (--max-client-sessions)"),
            std::string::npos) << tpdraft_last_error();
  b.open();  // the others' share is untouched
  b.open();
}

// A request frame with its own id, so that replies that come out of order can be told apart.
std::string frame_id(uint16_t kind, uint32_t count, const std::string& body, uint64_t id) {
  std::string f = frame(kind, count, body);
  std::memcpy(&f[16], &id, sizeof(id));  // header.id: magic, version, kind, status, count come first
  return f;
}

// STEPs sent while the server is stopped pile up in its queue when it wakes: those past the
// queue's bounds are answered "busy" at once (nothing done, the client may ask again), the rest
// are drafted; the server's memory no longer grows with what a client sends without reading.
TEST_F(Serve, AFullQueueAnswersBusyAndTheClientMayAskAgain) {
  ASSERT_NO_FATAL_FAILURE(start({"--max-sessions", "1", "--max-context", "4096", "--max-queued-bytes", "1048576"}));
  Client probe(address);
  const tpdraft_caps caps = client_caps(probe.c);
  RawSocket raw(address);
  const std::string open = frame(serve::kOpen, 0, "");
  zmq_send(raw.sock, open.data(), open.size(), 0);
  serve::Message opened;
  ASSERT_GE(zmq_msg_recv(&opened.msg, raw.sock, 0), 0);
  serve::Reader opened_reply(opened.data(), opened.size());
  ASSERT_EQ(opened_reply.header().status, 0u);
  const int64_t session = opened_reply.get<int64_t>("session");
  // One entry of `rows` f32 rows inline, restarting the session (keep 0).
  auto step = [&](int64_t rows, uint64_t id) {
    serve::WireEntry e;
    e.session = session;
    e.keep = 0;
    e.n_new = rows;
    e.anchor = 3;
    e.taps_where = serve::kTapsInline;
    e.taps_bytes = static_cast<uint64_t>(rows * caps.taps_width) * sizeof(float);
    const std::vector<float> taps(static_cast<size_t>(rows * caps.taps_width), 0.25f);
    return frame_id(serve::kStep, 1, entry_bytes(e) + std::string(reinterpret_cast<const char*>(taps.data()),
                                                                   e.taps_bytes), id);
  };
  // Sends the frames while the server is stopped; returns each reply's (status, message) by id.
  auto pile_up = [&](const std::vector<std::string>& frames) {
    server->signal(SIGSTOP);
    for (const std::string& f : frames) zmq_send(raw.sock, f.data(), f.size(), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server->signal(SIGCONT);
    std::map<uint64_t, std::pair<uint32_t, std::string>> replies;
    for (size_t i = 0; i < frames.size(); ++i) {
      serve::Message m;
      if (zmq_msg_recv(&m.msg, raw.sock, 0) < 0) break;
      serve::Reader r(m.data(), m.size());
      replies[r.header().id] = status_of(m.data(), m.size());
    }
    return replies;
  };
  // Entries: one session, one entry a forward: two queued entries per client at most.
  auto replies = pile_up({step(2, 1), step(2, 2), step(2, 3), step(2, 4)});
  ASSERT_EQ(replies.size(), 4u) << server->log();
  EXPECT_EQ(replies[1].first, 0u) << replies[1].second;
  EXPECT_EQ(replies[2].first, 0u) << replies[2].second;
  for (uint64_t id : {3, 4}) {
    EXPECT_EQ(replies[id].first, serve::kBusy) << id << ": " << replies[id].second;
    EXPECT_NE(replies[id].second.find("queue is full"), std::string::npos) << replies[id].second;
    EXPECT_NE(replies[id].second.find("at most 2 per client"), std::string::npos) << replies[id].second;
  }
  // Bytes: a quarter of the 1 MiB bound per client, its first queued request excepted. Both must
  // be in the queue at once, which a frame this large reaches only as ZeroMQ delivers it: the pair
  // is sent again until the second was read before the first ran (every reply ok or busy).
  const int64_t big = (300 << 10) / (caps.taps_width * 4) + 1;  // rows of just over 300 KiB
  bool refused = false;
  for (uint64_t attempt = 0; attempt < 100 && !refused; ++attempt) {
    replies = pile_up({step(big, 100 + 2 * attempt), step(big, 101 + 2 * attempt)});
    ASSERT_EQ(replies.size(), 2u) << server->log();
    EXPECT_EQ(replies[100 + 2 * attempt].first, 0u) << replies[100 + 2 * attempt].second;
    const auto& second = replies[101 + 2 * attempt];
    if (second.first == 0) continue;
    refused = true;
    EXPECT_EQ(second.first, serve::kBusy) << second.second;
    EXPECT_NE(second.second.find("at most 262144 per client (--max-queued-bytes / 4)"), std::string::npos)
        << second.second;
  }
  EXPECT_TRUE(refused) << "the second of two 300 KiB steps was never refused";
  // Asked again once the queue has room, the same request is drafted.
  replies = pile_up({step(big, 7)});
  EXPECT_EQ(replies[7].first, 0u) << replies[7].second;
  EXPECT_TRUE(server->running()) << server->log();
}

// A server that answers HELLO, OPEN and LENGTH and says "busy" to every STEP: the client returns
// TPDRAFT_ERROR_BUSY with no drafts in the entry, and stays open for the next call.
TEST(ServeClient, BusyLeavesTheClientOpen) {
  testing::TempDir dir;
  const std::string address = "ipc://" + dir.file("busy.sock");
  void* ctx = zmq_ctx_new();
  void* router = zmq_socket(ctx, ZMQ_ROUTER);
  ASSERT_EQ(zmq_bind(router, address.c_str()), 0);
  std::atomic<bool> done{false};
  std::thread fake([&] {
    const int timeout = 100;
    zmq_setsockopt(router, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
    while (!done) {
      serve::Message id, body;
      if (zmq_msg_recv(&id.msg, router, 0) < 0) continue;
      zmq_msg_recv(&body.msg, router, 0);
      serve::Reader r(body.data(), body.size());
      const serve::Header h = r.header();
      std::string out;
      serve::Writer w(&out);
      if (h.kind == serve::kStep) {
        out = serve::error_reply(h, serve::kBusy, "the server's queue is full (test)");
      } else {
        w.header(serve::reply_header(h));
        if (h.kind == serve::kHello) {
          serve::WireCaps caps{{"DFlash2DraftModel", 4, 4, 4, 16, 0, 15, {1}, 1, 2, 64, 4}, "cpu"};
          serve::put_caps(w, caps);
          w.put<double>(0);
          w.put<uint32_t>(0);
          w.str("");
        } else if (h.kind == serve::kOpen || h.kind == serve::kLength) {
          w.put<int64_t>(h.kind == serve::kOpen ? 7 : 0);
        }
      }
      zmq_send(router, id.data(), id.size(), ZMQ_SNDMORE);
      zmq_send(router, out.data(), out.size(), 0);
    }
  });
  tpdraft_client_options o;
  tpdraft_client_options_init(&o);
  o.shared_memory = 0;
  o.timeout_seconds = 20;
  tpdraft_client* c = nullptr;
  ASSERT_EQ(tpdraft_client_open(address.c_str(), &o, &c), TPDRAFT_OK) << tpdraft_last_error();
  tpdraft_session s = -1;
  ASSERT_EQ(tpdraft_client_session_open(c, &s), TPDRAFT_OK) << tpdraft_last_error();
  std::vector<float> taps(4, 0.5f);
  std::vector<int64_t> tokens(3, 99);
  std::vector<float> q(3, 9.0f);
  tpdraft_step_entry e{};
  e.session = s;
  e.keep = -1;
  e.p0 = -1;
  e.n_new = 1;
  e.taps = taps.data();
  e.anchor = 1;
  e.sampling.top_p = 1;
  e.tokens = tokens.data();
  e.q = q.data();
  EXPECT_EQ(tpdraft_client_step(c, &e, 1), TPDRAFT_ERROR_BUSY);
  EXPECT_NE(std::string(tpdraft_last_error()).find("queue is full"), std::string::npos) << tpdraft_last_error();
  EXPECT_STREQ(tpdraft_status_name(TPDRAFT_ERROR_BUSY), "busy");
  EXPECT_EQ(tokens, std::vector<int64_t>(3, -1));  // no drafts
  int64_t n = -1;
  EXPECT_EQ(tpdraft_client_session_length(c, s, &n), TPDRAFT_OK) << tpdraft_last_error();  // still open
  tpdraft_client_close(c);
  done = true;
  fake.join();
  zmq_close(router);
  zmq_ctx_term(ctx);
}

// CURVE over tcp: a client given the server's public key (tpdraft keys) drafts; one without it,
// or with another key, gets no answer and says why it may be; a secret key readable by others,
// or a file that holds no key, is refused at start; a tcp listen beyond loopback without keys is
// warned about.
TEST_F(Serve, CurveAdmitsOnlyClientsGivenTheServersKey) {
  testing::TempDir key_dir;  // beside the checkpoint's directory, which init wants to itself
  const std::string keys = key_dir.file("server"), other = key_dir.file("other");
  for (const std::string& prefix : {keys, other}) {
    const std::string cmd = std::string(TPDRAFT_BIN) + " keys --out " + prefix + " > " + prefix + ".out 2> " + prefix + ".err";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  struct stat st {};
  ASSERT_EQ(stat((keys + ".secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::ifstream printed(keys + ".out");
  std::string printed_key;
  printed >> printed_key;
  std::ifstream pub_file(keys + ".public");
  std::string pub;
  pub_file >> pub;
  EXPECT_EQ(printed_key, pub);
  EXPECT_EQ(pub.size(), 40u);
  EXPECT_NE(std::system((std::string(TPDRAFT_BIN) + " keys --out " + keys + " 2>/dev/null").c_str()), 0)
      << "keys overwrote an existing pair";
  ASSERT_NO_FATAL_FAILURE(start({"--listen", "tcp://127.0.0.1:*", "--curve-secret-key", keys + ".secret"}));
  auto open_with = [&](const char* key, double timeout, tpdraft_client** out) {
    tpdraft_client_options o;
    tpdraft_client_options_init(&o);
    o.server_key = key;
    o.timeout_seconds = timeout;
    return tpdraft_client_open(address.c_str(), &o, out);
  };
  for (const std::string& given : {keys + ".public", pub}) {  // the file, or the key itself
    tpdraft_client* c = nullptr;
    ASSERT_EQ(open_with(given.c_str(), 20, &c), TPDRAFT_OK) << tpdraft_last_error();
    tpdraft_session s = -1;
    EXPECT_EQ(tpdraft_client_session_open(c, &s), TPDRAFT_OK) << tpdraft_last_error();
    tpdraft_client_close(c);
  }
  tpdraft_client* c = nullptr;
  EXPECT_EQ(open_with(nullptr, 20, &c), TPDRAFT_ERROR_UNAVAILABLE);  // refused at once, not timed out
  EXPECT_NE(std::string(tpdraft_last_error()).find("refused the connection's handshake: it takes only clients given its CURVE key"), std::string::npos)
      << tpdraft_last_error();
  const std::string wrong = other + ".public";
  EXPECT_EQ(open_with(wrong.c_str(), 20, &c), TPDRAFT_ERROR_UNAVAILABLE);
  EXPECT_NE(std::string(tpdraft_last_error()).find("does not hold the secret key"), std::string::npos)
      << tpdraft_last_error();
  EXPECT_EQ(open_with("not-a-key", 1, &c), TPDRAFT_ERROR_ARGUMENT);
  EXPECT_NE(std::string(tpdraft_last_error()).find("options.server_key not-a-key"), std::string::npos)
      << tpdraft_last_error();
  EXPECT_TRUE(server->running()) << server->log();
  EXPECT_EQ(server->log().find("any machine that reaches this address"), std::string::npos) << server->log();

  ASSERT_EQ(chmod((other + ".secret").c_str(), 0644), 0);
  ServerProcess open_key(dir.path(), {"--listen", "tcp://127.0.0.1:*", "--curve-secret-key", other + ".secret"});
  EXPECT_NE(open_key.wait_exit(60), 0);
  EXPECT_NE(open_key.log().find("a secret key readable by others (mode 644)"), std::string::npos) << open_key.log();
  ServerProcess not_key(dir.path(), {"--listen", "tcp://127.0.0.1:*", "--curve-secret-key", keys + ".out"});
  EXPECT_NE(not_key.wait_exit(60), 0);
  ServerProcess wide(dir.path(), {"--listen", "tcp://0.0.0.0:*"});
  // Its address names this machine, not the wildcard: a client elsewhere can use it.
  char host[256] = {0};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const std::string address = wide.wait_address();
  EXPECT_EQ(address.rfind("tcp://" + std::string(host) + ":", 0), 0u) << address << "\n" << wide.log();
  EXPECT_NE(wide.log().find("any machine that reaches this address"), std::string::npos) << wide.log();
}

TEST_F(Serve, AServerThatStopsAnsweringFailsTheCallClosedWithinItsTimeout) {
  ASSERT_NO_FATAL_FAILURE(start({}));
  Client c(address, 1.0);
  const tpdraft_caps caps = client_caps(c.c);
  const tpdraft_session s = c.open();
  server->signal(SIGSTOP);
  std::mt19937_64 rng(3);
  Out out;
  EXPECT_EQ(random_step(c, s, rng, &out), TPDRAFT_ERROR_UNAVAILABLE);
  EXPECT_NE(std::string(tpdraft_last_error()).find("no reply"), std::string::npos) << tpdraft_last_error();
  EXPECT_EQ(out.tokens, std::vector<int64_t>(static_cast<size_t>(caps.block_size - 1), -1));
  EXPECT_EQ(out.q, std::vector<float>(static_cast<size_t>(caps.block_size - 1), 0.0f));
  EXPECT_NE(std::string(tpdraft_last_error()).find("larger than it accepts"), std::string::npos)
      << tpdraft_last_error();
  // Closed for good: the next call fails at once, the same way, naming itself and the failure.
  int64_t n = 0;
  EXPECT_EQ(tpdraft_client_session_length(c.c, s, &n), TPDRAFT_ERROR_UNAVAILABLE);
  const std::string again = tpdraft_last_error();
  EXPECT_EQ(again.find("tpdraft_client_session_length: this client is closed after an earlier failure: "
                       "tpdraft_client_step: no reply"), 0u) << again;
  server->signal(SIGCONT);
  // No server at all: the open fails within its timeout too.
  tpdraft_client_options o;
  tpdraft_client_options_init(&o);
  o.timeout_seconds = 0.5;
  tpdraft_client* none = nullptr;
  EXPECT_EQ(tpdraft_client_open(("ipc://" + dir.file("nobody.sock")).c_str(), &o, &none), TPDRAFT_ERROR_UNAVAILABLE);
  EXPECT_EQ(none, nullptr);
  // A ring past the bound of core/bounds.h is refused by value, before anything is mapped.
  o.ring_bytes = int64_t{1} << 50;
  EXPECT_EQ(tpdraft_client_open(address.c_str(), &o, &none), TPDRAFT_ERROR_ARGUMENT);
  EXPECT_NE(std::string(tpdraft_last_error()).find("options.ring_bytes is 1125899906842624, expected 8192.."),
            std::string::npos) << tpdraft_last_error();
  EXPECT_EQ(none, nullptr);
}

TEST_F(Serve, ARankThatFailsEndsTheGroupAndTheClientGetsAnError) {
  ASSERT_NO_FATAL_FAILURE(start({"--tp", "2"}, {}, {"TPDRAFT_FAULT=1:draft"}));
  Client c(address, 20);
  const tpdraft_session s = c.open();
  std::mt19937_64 rng(3);
  Out out;
  const tpdraft_status st = random_step(c, s, rng, &out);
  EXPECT_TRUE(st == TPDRAFT_ERROR_UNAVAILABLE || st == TPDRAFT_ERROR_RUNTIME) << tpdraft_status_name(st);
  EXPECT_NE(std::string(tpdraft_last_error()).find("rank 1: injected fault at 'draft'"), std::string::npos)
      << tpdraft_last_error();
  EXPECT_EQ(out.tokens[0], -1);
  EXPECT_EQ(server->wait_exit(30), 1) << server->log();
  expect_files_removed();
}

// Three clients step until their server goes; once 30 steps have drafted, SIGTERM goes to the
// server's process (tpdraft, or its launcher). Every step must either draft or fail closed,
// every client must see its server go, and the server must say it stopped for the signal and
// leave no file behind. Returns the server's exit status.
int Serve::sigterm_while_clients_step() {
  std::atomic<int> done{0}, failed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      Client c(address, 20);
      if (c.c == nullptr) return;
      const tpdraft_session s = c.open();
      std::mt19937_64 rng(static_cast<uint64_t>(i));
      // Until the server goes (a minute at most: a server still answering then fails the test).
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (std::chrono::steady_clock::now() < deadline) {
        Out out;
        const tpdraft_status st = random_step(c, s, rng, &out, 0);
        if (st != TPDRAFT_OK) {
          EXPECT_EQ(st, TPDRAFT_ERROR_UNAVAILABLE) << tpdraft_last_error();
          EXPECT_EQ(out.tokens[0], -1);
          ++failed;
          return;
        }
        EXPECT_GE(out.tokens[0], 0);
        ++done;
      }
    });
  while (done < 30) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  server->signal(SIGTERM);
  const int status = server->wait_exit(30);
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed, 3);
  EXPECT_NE(server->log().find("stopping (signal)"), std::string::npos) << server->log();
  expect_files_removed();
  return status;
}

TEST_F(Serve, SigtermFinishesTheForwardInFlightAndEveryCallEnds) {
  ASSERT_NO_FATAL_FAILURE(start({"--tp", "2"}));
  EXPECT_EQ(sigterm_while_clients_step(), 0) << server->log();
}

// ---- under mpirun (CTest test_serve_mpi, labelled mpi) ------------------------------------------

class ServeMpi : public Serve {
 protected:
  void SetUp() override {
    if (std::string(TPDRAFT_MPIRUN).empty()) GTEST_SKIP() << "this build has no MPI";
  }
};

std::vector<std::string> mpirun(int np) {
  std::vector<std::string> argv;
  std::string word;
  std::istringstream in(TPDRAFT_MPIRUN);
  while (in >> word) argv.push_back(word);
  argv.insert(argv.end(), {"-np", std::to_string(np)});
  return argv;
}

// The pid of the process of world rank `rank` among the launcher's children.
pid_t rank_pid(pid_t launcher, int rank) {
  const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  pid_t found = -1;
  for (const auto& d : std::filesystem::directory_iterator("/proc")) {
    const pid_t pid = static_cast<pid_t>(std::atoi(d.path().filename().c_str()));
    if (pid <= 0) continue;
    std::ifstream stat(d.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != launcher) continue;
    // NUL-separated NAME=VALUE entries: `want` must be one of them whole.
    std::ifstream env(d.path() / "environ");
    const std::string all = '\0' + std::string(std::istreambuf_iterator<char>(env), {}) + '\0';
    if (all.find('\0' + want + '\0') != std::string::npos) found = pid;
  }
  return found;
}

TEST_F(ServeMpi, ATp2GroupUnderMpirunDraftsWhatTheLibraryDrafts) {
  ASSERT_NO_FATAL_FAILURE(start({"--tp", "2", "--max-sessions", "4"}, mpirun(2)));
  many_clients_match_the_library(dir.path(), address, -1);
  {
    Client c(address);
    ASSERT_EQ(tpdraft_client_shutdown(c.c), TPDRAFT_OK) << tpdraft_last_error();
  }
  EXPECT_EQ(server->wait_exit(60), 0) << server->log();
  expect_files_removed();
}

TEST_F(ServeMpi, AKilledRankEndsTheGroupAndTheClientGetsAnError) {
  ASSERT_NO_FATAL_FAILURE(start({"--tp", "2"}, mpirun(2)));
  Client c(address, 30);
  const tpdraft_session s = c.open();
  const pid_t victim = rank_pid(server->pid(), 1);
  ASSERT_GT(victim, 0) << "no rank 1 among mpirun's children";
  kill(victim, SIGKILL);
  std::mt19937_64 rng(3);
  Out out;
  EXPECT_EQ(random_step(c, s, rng, &out), TPDRAFT_ERROR_UNAVAILABLE) << tpdraft_last_error();
  EXPECT_EQ(out.tokens[0], -1);
  const int status = server->wait_exit(60);
  EXPECT_NE(status, 0) << server->log();
  EXPECT_NE(status, -1) << "the job did not end after its rank 1 was killed:\n" << server->log();
}

// SIGTERM to mpirun: it passes the signal to every rank (and ends the job with status 1, as
// OpenMPI does for a job it was told to stop); rank 0 finishes the forward in flight, answers and
// stops the group cleanly, as in process.
TEST_F(ServeMpi, SigtermToMpirunStopsTheGroupCleanly) {
  ASSERT_NO_FATAL_FAILURE(start({"--tp", "2"}, mpirun(2)));
  const int status = sigterm_while_clients_step();
  EXPECT_NE(status, -1) << "the job did not end after SIGTERM:\n" << server->log();
  EXPECT_EQ(server->log().find("[error]"), std::string::npos)
      << "no rank may fail on the way out:\n" << server->log();
}

TEST_F(ServeMpi, ARankThatFailsEndsTheJobNamingIt) {
  auto launcher = mpirun(2);
  launcher.insert(launcher.end(), {"-x", "TPDRAFT_FAULT=1:draft"});
  ASSERT_NO_FATAL_FAILURE(start({"--tp", "2"}, launcher));
  Client c(address, 30);
  const tpdraft_session s = c.open();
  std::mt19937_64 rng(3);
  Out out;
  EXPECT_EQ(random_step(c, s, rng, &out), TPDRAFT_ERROR_UNAVAILABLE) << tpdraft_last_error();
  EXPECT_EQ(server->wait_exit(60), 1) << server->log();
  EXPECT_NE(server->log().find("rank 1: injected fault at 'draft'"), std::string::npos)
      << server->log();
}

}  // namespace
}  // namespace tpdraft::serve_test
