// Rank set-up for the CLI: in-process thread groups or MPI replica groups, the options they
// share, and a watchdog over each rank's collectives.
#include "cli/ranks.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <string>

#include "cli/job.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/bounds.h"
#include "core/log.h"
#include "engine/group.h"
#include "kernels/backend.h"
#include "parallel/launch.h"
#include "parallel/thread_comm.h"
#include "parallel/watchdog.h"

namespace tpdraft::cli {

namespace {
// One rank's body: the watchdog over its group's collectives while fn runs.
void run_rank(const RankOptions& options, const RankContext& ctx, const std::function<void(const RankContext&)>& fn) {
  parallel::CollectiveWatchdog watchdog(ctx.comm, options.comm_timeout);
  fn(ctx);
}

// Where a rank of a job landed, as it worked it out: its machine, its place among the job's ranks
// there (the GPU it takes) and its group. Every rank says so, at info level: across machines
// this is what shows whether each found its own.
void log_placement(int local_rank, int local_size, int replica, int group_rank) {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '?';
  const int devices = kernels::cuda_devices();
  TPDRAFT_LOG_INFO("host {}: node-local rank {} of {}, replica {} rank {}; {}", host, local_rank, local_size, replica,
                   group_rank,
                   devices > 0 ? fmt::format("GPU {} of the {} here", local_rank % devices, devices)
                               : std::string("no GPU here"));
}

void warn_oversubscribed(int ranks_here, int threads) {
  if (ranks_here * threads > machine_cores())
    TPDRAFT_LOG_WARN("{} rank(s) x {} thread(s) on this machine's {} cores: ranks will take turns on the cores "
                     "and run slower than with fewer threads",
                     ranks_here, threads, machine_cores());
}

}  // namespace

void fault_point(const RankContext& ctx, const char* stage) {
  const char* spec = std::getenv("TPDRAFT_FAULT");
  if (spec == nullptr) return;
  const std::string s(spec);
  const size_t colon = s.find(':');
  if (colon == std::string::npos || std::atoi(s.substr(0, colon).c_str()) != ctx.world_rank) return;
  const std::string rest = s.substr(colon + 1);
  if (rest == std::string(stage) + ":stop") {
    // As if the rank had been stopped (SIGSTOP) or had hung: its peers wait in their next
    // collective until --comm-timeout ends the job.
    TPDRAFT_LOG_WARN("rank {}: stopping at '{}' (TPDRAFT_FAULT={})", ctx.world_rank, stage, s);
    std::raise(SIGSTOP);
    return;
  }
  if (rest == stage) TPDRAFT_FAIL("rank {}: injected fault at '{}' (TPDRAFT_FAULT={})", ctx.world_rank, stage, s);
}

void add_rank_options(CLI::App* cmd, RankOptions* o) {
  cmd->add_option("--quant", o->quant,
                  "Quantize a float checkpoint while loading: q8 (every matrix int8) or q4 (layer matrices int4, fc "
                  "and the projections int8); groups of 128 columns where they divide, else per channel. a8 / a16 after "
                  "the bits pick the activations (q8a8: int8; q8a16: float, which the cpu backend runs on weights "
                  "dequantized to f32; neither: the backend's own, int8 on cpu, bf16 on cuda). +head: the target's "
                  "head int8 too (q8+head, q4a8+head)")
      ->check(CLI::IsMember(model::quant_presets()));
  cmd->add_option("--token-map", o->token_map,
                  "Draft over these target ids only (a JSON list of ids, or a safetensors file with an I64 tensor "
                  "'token_ids'; tpdraft vocab writes one): the head is cut to their rows at load")
      ->check(CLI::ExistingFile);
  cmd->add_option("--kv-dtype", o->kv_dtype,
                  "The context cache's element type: f32, or bf16 (half the memory and bytes read per draft; "
                  "cpu backend only for now; its error: docs/model.md)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--backend", o->backend, "Kernels: cpu, cuda, or auto (cuda when a GPU is present, else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  // Ranks and threads beyond core/bounds.h's are surely a typo: each is an OS thread.
  cmd->add_option("--tp", o->tp, "Tensor-parallel ranks: in-process threads, or under mpirun the ranks per replica "
                                 "(default: all of them)")
      ->check(whole_number(0, kMaxInProcessRanks));
  cmd->add_option("--threads", o->threads, "CPU threads per rank (0: the cores shared among the ranks)")
      ->check(whole_number(0, max_threads_per_rank(), fmt::format("8 x this machine's {} cores", machine_cores())));
  cmd->add_option("--comm-timeout", o->comm_timeout,
                  "End the job when a collective waits longer than this many seconds for the other ranks (a rank "
                  "stopped or gone); 0: wait forever")
      ->check(real_number(0, 86400))
      ->capture_default_str();
}

void apply_load_options(model::ModelSource& source, const RankOptions& o) {
  if (!o.token_map.empty()) model::apply_token_map(source, o.token_map);
  model::quantize_on_load(source, o.quant);
}

model::RuntimeOptions runtime_options(const RankOptions& options, const RankContext& ctx) {
  model::RuntimeOptions r;
  r.backend = options.backend;
  r.threads = ctx.threads;
  r.local_rank = ctx.local_rank;
  r.nccl = parallel::multi_process();
  r.limits.kv_dtype = options.kv_dtype == "bf16" ? DType::BF16 : DType::F32;
  return r;
}

void drive_group(const RankContext& ctx, engine::Engine& engine, const std::function<void(engine::Group*)>& fn) {
  std::unique_ptr<parallel::CommandChannel> channel;
  if (ctx.comm.size() > 1) channel = ctx.open_channel();
  const engine::StepHook hook = [&ctx] {
    fault_point(ctx, "settle");
    fault_point(ctx, "draft");
  };
  if (ctx.comm.rank() == 0) {
    engine::LeaderGroup group(engine, ctx.comm, channel.get(), hook);
    fn(&group);
    return;
  }
  fn(nullptr);
  engine::follow(engine, ctx.comm, *channel, hook);
}

void run_ranks(const RankOptions& options, const std::function<void(const RankContext&)>& fn) {
  const int tp = options.tp, threads = options.threads;
  if (parallel::multi_process()) {
    auto world = parallel::world();
    const int size = world->size(), group = tp == 0 ? size : tp;
    agree_on(*world, kExitUsage, [&] {
      TPDRAFT_CHECK(group <= size, "--tp {} needs at least {} ranks, but mpirun started {}", group, group, size);
      TPDRAFT_CHECK(size % group == 0, "--tp {} does not split the {} MPI ranks into whole replicas", group, size);
    });
    parallel::Replica g = parallel::split_replicas(group);
    const int per_rank = engine::threads_per_rank(threads, g.local_size);
    log_placement(g.local_rank, g.local_size, g.replica, g.comm->rank());
    if (world->rank() == 0) warn_oversubscribed(g.local_size, per_rank);
    RankContext ctx{*g.comm, *world, g.replica, g.replicas, per_rank, world->rank(), g.local_rank};
    if (g.comm->size() > 1) ctx.open_channel = g.open_channel;
    run_rank(options, ctx, fn);
    return;
  }
  const int n = std::max(tp, 1);
  const int per_rank = engine::threads_per_rank(threads, n);
  if (n == 1) {
    auto comm = parallel::make_single_rank();
    run_rank(options, RankContext{*comm, *comm, 0, 1, per_rank, 0, 0}, fn);
    return;
  }
  warn_oversubscribed(n, per_rank);
  parallel::Mailbox mailbox(n);
  // A failure every rank reported through agree_on ends every rank at the same point: keep its
  // status and end the job with it once all ranks have returned.
  std::atomic<int> agreed{kExitOk};
  parallel::run_ranks(n, [&](parallel::Communicator& comm) {
    log::set_thread_rank(comm.rank(), comm.size());
    RankContext ctx{comm, comm, 0, 1, per_rank, comm.rank(), comm.rank(), n};
    ctx.open_channel = [&mailbox, r = comm.rank()] { return mailbox.channel(r); };
    try {
      run_rank(options, ctx, fn);
    } catch (const JobFailure& f) {
      agreed = f.status;
    }
  });
  if (agreed != kExitOk) throw JobFailure{agreed};
}

}  // namespace tpdraft::cli
