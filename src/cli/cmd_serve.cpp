// `tpdraft serve`: the drafter as a server that target engines call per step over ZeroMQ
// (docs/protocol.md). In process (--tp N thread ranks) or under mpirun (a group of tp ranks per
// replica, each replica's rank 0 listening on its own address).
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/job.h"
#include "cli/options.h"
#include "cli/ranks.h"
#include "core/bounds.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/group.h"
#include "engine/runtime.h"
#include "serve/keys.h"
#include "serve/server.h"
#include "serve/transport.h"

namespace tpdraft::cli {

namespace {

struct ServeOpts {
  std::string drafter, target, address_file, curve_key_file;
  int64_t max_sessions = 8, max_open_sessions = 64, max_context = 4096, max_memory = 0;
  serve::ServerOptions server;  // the rest of the options (its defaults are theirs)
  RankOptions ranks;
};

int64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// Every session the server may open holds max_context positions: refuse a configuration whose
// sessions could not all fit, instead of being killed for memory later.
void check_memory(const ServeOpts& o, engine::Engine& e, int ranks_here) {
  const double per = static_cast<double>(e.runtime().drafter().session_bytes());
  const double need = per * static_cast<double>(o.max_open_sessions) * ranks_here;
  const int64_t have = o.max_memory > 0 ? o.max_memory : available_memory();
  const double mib = 1024.0 * 1024.0;
  TPDRAFT_CHECK(have <= 0 || need <= static_cast<double>(have),
                "--max-open-sessions {} sessions x {:.1f} MiB of context each (--max-context {}) x {} rank(s) here "
                "need {:.0f} MiB, more than the {:.0f} MiB {}; lower --max-open-sessions or --max-context",
                o.max_open_sessions, per / mib, o.max_context, ranks_here, need / mib, have / mib,
                o.max_memory > 0 ? "--max-memory allows" : "this machine has available");
}

void serve_on_rank(const ServeOpts& o, const RankContext& ctx) {
  model::ModelSource source;
  std::unique_ptr<engine::Engine> engine;
  agree_on(ctx.world, kExitInput, [&] {
    source = model::ModelSource::open(o.drafter, o.target);
    apply_load_options(source, o.ranks);
    fault_point(ctx, "load");
    model::RuntimeOptions ro = runtime_options(o.ranks, ctx);
    ro.limits.max_sessions = o.max_sessions;
    ro.limits.max_context = o.max_context;
    engine = std::make_unique<engine::Engine>(source, ctx.comm, ro, o.max_open_sessions);
    check_memory(o, *engine, ctx.process_ranks);
  });
  drive_group(ctx, *engine, [&](engine::Group* group) {
    std::unique_ptr<serve::Server> server;
    std::string endpoint;
    agree_on(ctx.world, kExitUsage, [&] {
      if (group == nullptr) return;
      serve::ServerOptions so = o.server;
      so.replica = ctx.replica;
      so.replicas = ctx.replicas;
      server = std::make_unique<serve::Server>(*group, so);
      endpoint = server->bind();
    });
    // Every replica's address, in replica order, for the address file.
    constexpr size_t kSlot = 1024;
    std::string mine(kSlot, '\0');
    if (group != nullptr) mine.replace(0, std::min(endpoint.size(), kSlot - 1), endpoint.substr(0, kSlot - 1));
    std::string all(kSlot * static_cast<size_t>(ctx.world.size()), '\0');
    ctx.world.all_gather(mine.data(), all.data(), kSlot);
    serve::OwnedFile address_file;
    if (ctx.world.rank() == 0 && !o.address_file.empty()) {
      std::string text;
      for (int r = 0; r < ctx.world.size(); ++r) {
        const std::string a(all.c_str() + static_cast<size_t>(r) * kSlot);
        if (!a.empty()) text += a + "\n";
      }
      TPDRAFT_CHECK(write_file_whole(o.address_file, text), "--address-file {}: cannot write it (through {}.tmp)",
                    o.address_file, o.address_file);
      address_file.own(o.address_file);
    }
    if (group == nullptr) return;  // follows rank 0 from here
    std::printf("%s\n", endpoint.c_str());
    std::fflush(stdout);
    TPDRAFT_LOG_INFO("replica {} of {} serving {} (tp {}, {} backend) on {}", ctx.replica, ctx.replicas,
                     engine->caps().architecture, ctx.comm.size(), engine->runtime().ops().name(), endpoint);
    server->run();
    group->close();
    server.reset();  // closes the socket (and removes an ipc:// socket file) before the job ends
  });
}

}  // namespace

void add_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOpts>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "Serve the drafter to target engines over ZeroMQ (docs/protocol.md): print the address, answer HELLO, "
               "OPEN, CLOSE, STEP, STATS and SHUTDOWN until SIGTERM");
  cmd->add_option("--drafter", o->drafter, "Drafter directory (config.json + safetensors)")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--target", o->target, "Target model directory (embedding + head)")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--listen", o->server.listen,
                  "ipc://PATH or tcp://HOST:PORT (PORT * picks a free one); default an ipc socket in $TMPDIR. Under "
                  "mpirun replica g listens on PATH.g or PORT+g");
  cmd->add_option("--address-file", o->address_file, "Write the address(es), one line per replica, to this file once listening; removed on exit");
  cmd->add_option("--max-sessions", o->max_sessions, "Entries one forward may hold (STEPs of many clients are batched up to this)")
      ->check(whole_number(1, kMaxStepEntries))->capture_default_str();
  cmd->add_option("--max-open-sessions", o->max_open_sessions, "Sessions open at once, over every client")
      ->check(whole_number(1, kMaxOpenSessions))->capture_default_str();
  cmd->add_option("--max-context", o->max_context, "Positions one session may hold")
      ->check(whole_number(1, kMaxContext))->capture_default_str();
  cmd->add_option("--idle-timeout", o->server.idle_timeout, "Close the sessions of a client silent this many seconds (0: never)")
      ->check(real_number(0, 1e7))->capture_default_str();
  cmd->add_option("--spin-us", o->server.spin_us,
                  "Microseconds rank 0 keeps looking at the clients' shared-memory rings after a request before it "
                  "sleeps on the socket (0: sleep at once; a client then rings a doorbell)")
      ->check(real_number(0, 1e6))->capture_default_str();
  cmd->add_option("--gather-us", o->server.gather_us,
                  "Microseconds queued STEPs may wait, at most (and never over a tenth of the last forward), for "
                  "the clients of the last forward to ask again, so that they share the next one (0: never wait)")
      ->check(real_number(0, 1e6))->capture_default_str();
  cmd->add_option("--max-client-sessions", o->server.max_client_sessions,
                  "Sessions one client may hold at once (0: --max-open-sessions)")
      ->check(whole_number(0, kMaxOpenSessions))->capture_default_str();
  cmd->add_option("--max-queued-bytes", o->server.max_queued_bytes,
                  "Bytes of STEP requests (their inline taps) waiting for a forward, over every client; one client "
                  "may hold a quarter. A request past the bound is answered 'busy' and may be sent again")
      ->check(whole_number(int64_t{1} << 20, int64_t{1} << 40))->capture_default_str();
  cmd->add_option("--curve-secret-key", o->curve_key_file,
                  "Encrypt the connection and admit only clients given this server's public key (ZeroMQ CURVE): the "
                  "file of the server's secret key, mode 600 (tpdraft keys --out NAME writes NAME.secret and "
                  "NAME.public; clients take NAME.public)");
  cmd->add_option("--max-memory", o->max_memory,
                  "Bytes the sessions' context may take on this machine (0: what /proc/meminfo says is available)")
      ->check(whole_number(0));
  add_rank_options(cmd, &o->ranks);
  cmd->callback([o] {
    if (!o->curve_key_file.empty()) {
      TPDRAFT_CHECK(serve::curve_available(), "--curve-secret-key: this ZeroMQ was built without CURVE (libsodium)");
      o->server.curve_secret_key = serve::read_curve_key(o->curve_key_file, true, "--curve-secret-key");
    }
    serve::install_stop_signals();
    run_ranks(o->ranks, [&](const RankContext& ctx) { serve_on_rank(*o, ctx); });
  });
}

void add_keys(CLI::App& app) {
  auto out = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "keys", "Make a CURVE key pair for tpdraft serve --curve-secret-key: NAME.secret (mode 600, the server's) and "
              "NAME.public (for clients: tpdraft_client_options.server_key, tpdraft.Client(server_key=...))");
  cmd->add_option("--out", *out, "NAME: the files NAME.secret and NAME.public are written (never overwritten)")
      ->required();
  cmd->callback([out] {
    const std::string pub = serve::write_curve_keys(*out);
    std::printf("%s\n", pub.c_str());
    TPDRAFT_LOG_INFO("wrote {}.secret (keep it to the server) and {}.public (give it to clients): public key {}", *out,
                     *out, pub);
  });
}

}  // namespace tpdraft::cli
