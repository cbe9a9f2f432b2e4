// `tpdraft bench`: random weights in memory (or a checkpoint), N context rows settled, timed
// drafts; reports the median and spread of one draft, settle throughput, and the achieved FLOP
// and byte rates beside this machine's measured ceilings (read bandwidth, our GEMM rate).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/ranks.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "model/cost.h"
#include "model/drafter.h"
#include "model/random_checkpoint.h"
#include "model/safetensors.h"
#include "parallel/communicator.h"
#include "parallel/mpi_comm.h"
#include "parallel/nccl_comm.h"

namespace tpdraft::cli {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct BenchOpts {
  std::string config, drafter, target, dtype = "bf16";
  int64_t ctx = 1024, batch = 1, repeat = 10, warmup = 2;
  int threads = 0;
  int tp = 0;
  uint64_t seed = 0;
  bool json = false;
  bool gather_logits = false;
  std::string backend = "auto";
  std::string graphs = "auto";
};

struct Stats {
  double median = 0, min = 0, max = 0, p10 = 0, p90 = 0;
};

Stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)]; };
  const size_t n = v.size();
  const double median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return {median, v.front(), v.back(), at(0.1), at(0.9)};
}

// Read bandwidth ceiling: the best of a few parallel passes summing a buffer far larger than
// the caches (what streaming weights costs at best).
double measure_read_gbps(int threads) {
  const size_t n = size_t{1} << 27;  // 512 MiB of floats
  std::vector<float> buf(n, 1.0f);
  ThreadPool pool(threads);
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<double> sums(static_cast<size_t>(pool.size()), 0.0);
    const auto t0 = Clock::now();
    pool.parallel_for(static_cast<int64_t>(n), [&](int64_t b, int64_t e, int w) {
      float acc[16] = {0};
      for (int64_t i = b; i + 16 <= e; i += 16)
        for (int j = 0; j < 16; ++j) acc[j] += buf[static_cast<size_t>(i + j)];
      double s = 0;
      for (float a : acc) s += a;
      sums[static_cast<size_t>(w)] = s;
    }, 4096);
    best = std::max(best, static_cast<double>(n * sizeof(float)) / since(t0) / 1e9);
    if (sums[0] < 0) std::printf(" ");  // keep the sums alive
  }
  return best;
}

// Device memory ceiling: the best of a few device-to-device copies of 1 GiB (store_rows of one
// row is a plain copy), counting the bytes read and written.
double measure_copy_gbps(kernels::Ops& ops) {
  const int64_t n = int64_t{1} << 28;  // floats
  kernels::Buffer a(ops, static_cast<size_t>(n) * 4), b(ops, static_cast<size_t>(n) * 4);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    ops.sync();
    const auto t0 = Clock::now();
    ops.store_rows(a.f32(), 1, n, b.f32(), 1, 0);
    ops.sync();
    if (rep > 0) best = std::max(best, 2.0 * static_cast<double>(n) * 4 / since(t0) / 1e9);
  }
  return best;
}

// GEMM ceiling: our matmul on a compute-bound shape with the bench's weight dtype (more rows on
// a GPU, where 256 rows finish within the launch overhead).
double measure_gemm_gflops(kernels::Ops& ops, DType dtype, int64_t dim) {
  const int64_t m = std::string(ops.name()) == "cuda" ? 4096 : 256;
  std::vector<float> wf(static_cast<size_t>(dim * dim), 0.01f);
  std::vector<std::byte> wbytes(wf.size() * dtype_size(dtype));
  convert_from_f32(dtype, wf.data(), wbytes.data(), wf.size());
  kernels::Buffer w(ops, wbytes.size()), x(ops, static_cast<size_t>(m * dim) * 4), y(ops, static_cast<size_t>(m * dim) * 4);
  ops.to_device(w.get(), wbytes.data(), wbytes.size());
  std::vector<float> xf(static_cast<size_t>(m * dim), 0.5f);
  ops.to_device(x.get(), xf.data(), xf.size() * 4);
  const kernels::Matrix mat{dtype, dim, dim, w.get()};
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    ops.sync();
    const auto t0 = Clock::now();
    ops.matmul(mat, x.f32(), m, y.f32());
    ops.sync();
    best = std::max(best, 2.0 * static_cast<double>(m * dim * dim) / since(t0) / 1e9);
  }
  return best;
}

std::shared_ptr<model::TensorStore> memory_store(const std::string& label, std::vector<model::OwnedTensor> t) {
  return model::TensorStore::from_memory(label, std::move(t));
}

void run_bench(const BenchOpts& o, const RankContext& ctx) {
  auto ops = kernels::make_ops(o.backend, ctx.threads, o.backend == "cuda" ? rank_device(ctx) : 0);
  // Device buffers need a communicator that can carry them (NCCL under mpirun, else staging).
  const auto device_comm = parallel::make_backend_comm(ctx.comm, *ops, under_mpi());
  parallel::Communicator* comm = device_comm ? device_comm.get() : &ctx.comm;
  const bool gpu = std::string(ops->name()) == "cuda";
  std::shared_ptr<model::TensorStore> dstore, tstore;
  model::DrafterConfig cfg;
  const DType dtype = o.dtype == "bf16" ? DType::BF16 : o.dtype == "f16" ? DType::F16 : DType::F32;
  if (!o.drafter.empty()) {
    TPDRAFT_CHECK(!o.target.empty(), "bench: --drafter needs --target too");
    cfg = model::DrafterConfig::from_file(o.drafter + "/config.json");
    dstore = model::TensorStore::open(o.drafter);
    tstore = model::TensorStore::open(o.target);
  } else {
    TPDRAFT_CHECK(!o.config.empty(), "bench: give --config FILE (random weights) or --drafter/--target");
    cfg = model::DrafterConfig::from_file(o.config);
    model::RandomCheckpointOptions ro;
    ro.seed = o.seed;
    ro.dtype = dtype;
    ro.threads = ctx.threads;
    if (ctx.leader()) TPDRAFT_LOG_INFO("generating random {} weights for {}", o.dtype, o.config);
    dstore = memory_store(o.config, model::random_drafter_tensors(cfg, ro));
    tstore = memory_store(o.config + " (target)", model::random_target_tensors(cfg, ro));
  }
  const auto plan = model::ShardPlan::make(cfg, comm->rank(), comm->size());
  auto weights = std::make_shared<model::DrafterWeights>(cfg, dstore, tstore, plan, *ops);
  const double wbytes = static_cast<double>(dtype_size(weights->head.dtype));
  model::DrafterLimits limits;
  limits.max_sessions = o.batch;
  limits.max_context = std::max<int64_t>(1, o.ctx);
  limits.graphs = o.graphs == "on" || (o.graphs == "auto" && gpu);
  model::Drafter drafter(weights, *ops, *comm, limits);

  std::vector<std::unique_ptr<model::Session>> sessions;
  std::vector<model::DraftRequest> reqs;
  double settle_s = 0;
  for (int64_t s = 0; s < o.batch; ++s) {
    sessions.push_back(drafter.new_session());
    const std::vector<float> taps = model::random_taps(cfg, o.ctx, o.seed + static_cast<uint64_t>(s));
    // On a GPU the taps start on the device, where a target model leaves its hidden states; the
    // settle then times the drafter's own work, not a copy from pageable host memory.
    kernels::Buffer device_taps;
    const float* from = taps.data();
    if (gpu && !taps.empty()) {
      device_taps = kernels::Buffer(*ops, taps.size() * sizeof(float));
      ops->to_device(device_taps.get(), taps.data(), taps.size() * sizeof(float));
      from = device_taps.f32();
    }
    const auto t0 = Clock::now();
    drafter.settle(*sessions.back(), 0, from, o.ctx);
    settle_s += since(t0);
    reqs.push_back({sessions.back().get(), (17 + s) % cfg.vocab, {}});
  }
  if (ctx.leader())
    TPDRAFT_LOG_INFO("settled {} x {} rows; timing {} drafts after {} warm-up", o.batch, o.ctx, o.repeat, o.warmup);
  std::vector<double> times, layers, head, select, comm_times, compute_times;
  std::vector<int64_t> tokens;
  int64_t replayed = 0;
  parallel::CommStats comm_stats;
  for (int64_t i = 0; i < o.warmup + o.repeat; ++i) {
    if (i == o.warmup) comm->reset_stats();
    const double comm0 = comm->stats().seconds;
    const auto t0 = Clock::now();
    model::DraftDump full;  // --gather-logits: every rank assembles the whole [rows, V] logits
    const auto res = drafter.draft(reqs, o.gather_logits ? &full : nullptr);
    const double dt = since(t0);
    if (i >= o.warmup) {
      // Per draft, so that the medians of the time in and out of collectives resist outliers.
      const double dc = comm->stats().seconds - comm0;
      comm_times.push_back(dc);
      compute_times.push_back(dt - dc);
      times.push_back(dt);
      layers.push_back(drafter.last_times().layers);
      head.push_back(drafter.last_times().head);
      select.push_back(drafter.last_times().select);
      replayed += drafter.last_times().replayed ? 1 : 0;
    }
    tokens = res[0].tokens;
  }
  comm_stats = comm->stats();
  const double per = 1.0 / static_cast<double>(o.repeat);
  const Stats st = summarize(times);
  const model::WorkCount work = model::draft_work(cfg, plan, o.batch, o.ctx, wbytes);
  const model::WorkCount swork = model::settle_work(cfg, plan, o.ctx * o.batch, wbytes);
  comm->barrier();
  if (!ctx.leader()) return;  // the ceilings and the report come from one rank
  // The memory ceiling: host read bandwidth for the CPU, device copy bandwidth for a GPU.
  const double read_gbps = gpu ? measure_copy_gbps(*ops) : measure_read_gbps(ctx.threads);
  const double gemm_gflops = measure_gemm_gflops(*ops, dtype, std::min<int64_t>(cfg.hidden, 2048));
  // A GPU's settle is quoted against plain cuBLAS on 16-bit operands: the rate at the shape of
  // its largest GEMM (fc: settle chunk x T*H -> H) and at a large square one.
  double blas_settle_gflops = 0, blas_peak_gflops = 0;
  if (gpu && dtype != DType::F32) {
    blas_settle_gflops = kernels::cublas_gemm_gflops(*ops, dtype, std::min<int64_t>(limits.settle_chunk, std::max<int64_t>(1, o.ctx)),
                                                     cfg.hidden, cfg.n_taps() * cfg.hidden);
    blas_peak_gflops = kernels::cublas_gemm_gflops(*ops, dtype, 8192, 8192, 8192);
  }
  const double gflops = work.flops / st.median / 1e9, gbps = work.bytes() / st.median / 1e9;

  nlohmann::json j;
  j["config"] = o.drafter.empty() ? o.config : o.drafter;
  j["architecture"] = cfg.arch_name;
  j["backend"] = ops->name();
  j["threads"] = ctx.threads;
  j["tp"] = comm->size();
  j["gather_logits"] = o.gather_logits;
  j["graphs"] = drafter.graphs();
  j["replayed_drafts"] = replayed;
  j["replicas"] = ctx.replicas;
  j["communicator"] = comm->name();
  j["comm_ms"] = comm_stats.seconds * per * 1e3;
  j["comm_ms_median"] = summarize(comm_times).median * 1e3;
  j["compute_ms"] = summarize(compute_times).median * 1e3;  // outside collectives
  j["all_reduce_calls"] = static_cast<double>(comm_stats.all_reduce_calls) * per;
  j["all_reduce_bytes"] = static_cast<double>(comm_stats.all_reduce_bytes) * per;
  j["all_gather_calls"] = static_cast<double>(comm_stats.all_gather_calls) * per;
  j["all_gather_bytes"] = static_cast<double>(comm_stats.all_gather_bytes) * per;
  j["broadcast_calls"] = static_cast<double>(comm_stats.broadcast_calls) * per;
  j["broadcast_bytes"] = static_cast<double>(comm_stats.broadcast_bytes) * per;
  j["weights_bytes_per_rank"] = static_cast<double>(weights->backend_bytes());
  j["context_bytes_per_rank"] = static_cast<double>(drafter.context_bytes_per_position() * static_cast<size_t>(o.ctx * o.batch));
  j["sessions"] = o.batch;
  j["context"] = o.ctx;
  j["dtype"] = dtype_name(weights->head.dtype);
  j["draft_ms"] = st.median * 1e3;
  j["draft_ms_min"] = st.min * 1e3;
  j["draft_ms_max"] = st.max * 1e3;
  j["draft_ms_p10"] = st.p10 * 1e3;
  j["draft_ms_p90"] = st.p90 * 1e3;
  j["layers_ms"] = summarize(layers).median * 1e3;
  j["head_ms"] = summarize(head).median * 1e3;
  j["select_ms"] = summarize(select).median * 1e3;
  j["settle_rows_per_s"] = static_cast<double>(o.ctx * o.batch) / settle_s;
  j["settle_gflops"] = swork.flops / settle_s / 1e9;
  j["draft_gflop"] = work.flops / 1e9;
  j["draft_gbytes"] = work.bytes() / 1e9;
  j["achieved_gflops"] = gflops;
  j["achieved_gbps"] = gbps;
  j["machine_read_gbps"] = read_gbps;
  j["machine_memory_ceiling"] = gpu ? "device copy (read + write)" : "host read";
  j["machine_gemm_gflops"] = gemm_gflops;
  if (blas_peak_gflops > 0) {
    j["cublas_gemm_gflops_settle_shape"] = blas_settle_gflops;
    j["cublas_gemm_gflops_peak"] = blas_peak_gflops;
    j["settle_fraction_of_cublas"] = swork.flops / settle_s / 1e9 / blas_peak_gflops;
  }
  j["tokens"] = tokens;
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("tpdraft bench: %s, %s weights, %s backend, tp %d (%s), %d thread(s) per rank, %lld session(s) x %lld context rows\n",
              cfg.arch_name.c_str(), dtype_name(weights->head.dtype), ops->name(), comm->size(), comm->name().c_str(), ctx.threads,
              static_cast<long long>(o.batch), static_cast<long long>(o.ctx));
  std::printf("  draft      median %8.2f ms   min %8.2f   max %8.2f   p10..p90 %.2f..%.2f  (%lld runs)\n",
              st.median * 1e3, st.min * 1e3, st.max * 1e3, st.p10 * 1e3, st.p90 * 1e3,
              static_cast<long long>(o.repeat));
  std::printf("  phases     layers %.2f ms, head %.2f ms, selection %.2f ms (medians); forward %s (%lld of %lld replayed)\n",
              summarize(layers).median * 1e3, summarize(head).median * 1e3, summarize(select).median * 1e3,
              drafter.graphs() ? "captured once, replayed" : "issued op by op", static_cast<long long>(replayed),
              static_cast<long long>(o.repeat));
  std::printf("  comm       %.3f ms per draft: all-reduce %.0f x %.0f B, all-gather %.0f x %.0f B, broadcast %.0f x %.0f B\n",
              comm_stats.seconds * per * 1e3, static_cast<double>(comm_stats.all_reduce_calls) * per,
              comm_stats.all_reduce_calls ? static_cast<double>(comm_stats.all_reduce_bytes) / static_cast<double>(comm_stats.all_reduce_calls) : 0.0,
              static_cast<double>(comm_stats.all_gather_calls) * per,
              comm_stats.all_gather_calls ? static_cast<double>(comm_stats.all_gather_bytes) / static_cast<double>(comm_stats.all_gather_calls) : 0.0,
              static_cast<double>(comm_stats.broadcast_calls) * per,
              comm_stats.broadcast_calls ? static_cast<double>(comm_stats.broadcast_bytes) / static_cast<double>(comm_stats.broadcast_calls) : 0.0);
  std::printf("  work       %.2f GFLOP, %.3f GB per draft\n", work.flops / 1e9, work.bytes() / 1e9);
  std::printf("  achieved   %.1f GFLOP/s (%.0f%% of our GEMM's %.1f), %.1f GB/s (%.0f%% of %s bandwidth %.1f)\n",
              gflops, 100 * gflops / gemm_gflops, gemm_gflops, gbps, 100 * gbps / read_gbps,
              gpu ? "device copy" : "read", read_gbps);
  std::printf("  settle     %.0f rows/s (%.1f GFLOP/s)\n", static_cast<double>(o.ctx * o.batch) / settle_s,
              swork.flops / settle_s / 1e9);
  if (blas_peak_gflops > 0)
    std::printf("  cuBLAS     %.0f GFLOP/s at 8192^3, %.0f at the settle's fc shape: settle reaches %.0f%% of the first\n",
                blas_peak_gflops, blas_settle_gflops, 100 * swork.flops / settle_s / 1e9 / blas_peak_gflops);
}

}  // namespace

void add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOpts>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time drafts on a geometry with random weights in memory (or on a checkpoint): median and spread of "
               "one draft, settle rows/s, achieved GFLOP/s and GB/s against this machine's ceilings");
  cmd->add_option("--config", o->config, "Drafter config.json for random weights, e.g. configs/bench-dflash2-2048.json");
  cmd->add_option("--drafter", o->drafter, "Use this drafter checkpoint instead of random weights");
  cmd->add_option("--target", o->target, "Target directory for --drafter");
  cmd->add_option("--ctx", o->ctx, "Context rows settled per session")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch", o->batch, "Sessions drafted together")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--threads", o->threads, "CPU threads per rank (0: the cores shared among the ranks)")->capture_default_str();
  cmd->add_option("--repeat", o->repeat, "Timed drafts")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", o->warmup, "Untimed drafts first")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--dtype", o->dtype, "Random weight dtype")->check(CLI::IsMember({"bf16", "f16", "f32"}))->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the random weights and taps");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  cmd->add_flag("--gather-logits", o->gather_logits,
                "Also gather the full logits [rows, V] on every rank each draft (what a caller wanting whole "
                "distributions pays; the default exchanges only the top candidates)");
  cmd->add_option("--backend", o->backend, "Kernels: cpu, cuda, or auto (cuda when a GPU is present, else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--tp", o->tp, "Tensor-parallel ranks: in-process threads, or under mpirun the ranks per replica "
                              "(default: all of them)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--graphs", o->graphs,
                  "Capture the block forward once and replay it (CUDA graphs; a call tape on the CPU): on, off, or "
                  "auto (on for cuda)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->callback([o] {
    if (o->backend == "auto") o->backend = kernels::default_backend();
    run_ranks(o->tp, o->threads, [&](const RankContext& ctx) { run_bench(*o, ctx); });
  });
}

}  // namespace tpdraft::cli
