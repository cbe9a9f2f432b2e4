// `tpdraft bench`: random weights in memory (or a checkpoint), N context rows settled, timed
// drafts (greedy or sampled), all as steps of the group; reports the median and spread of one
// draft, settle throughput (warm), and the achieved FLOP and byte rates beside this machine's
// measured ceilings (read bandwidth, our GEMM rate) and the roofline they set, and whether the
// machine was idle while the drafts ran. A list of contexts sweeps them on one loaded drafter.
// The ceilings are measured before and after the drafts (the larger of each is used) and held
// against the best this machine has recorded (ceilings_low, docs/model.md "Measured").
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "cli/commands.h"
#include "cli/job.h"
#include "cli/options.h"
#include "cli/ranks.h"
#include "core/error.h"
#include "core/log.h"
#include "core/summary.h"
#include "core/timing.h"
#include "engine/group.h"
#include "engine/runtime.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "kernels/ceilings.h"
#include "kernels/ops.h"
#include "model/cost.h"
#include "model/draft_vocab.h"
#include "parallel/communicator.h"
#include "tools/random_checkpoint.h"

namespace tpdraft::cli {

namespace {

struct BenchOpts {
  std::string config, drafter, target, dtype = "bf16";
  std::vector<int64_t> ctx{1024};  // a sweep when several
  int64_t batch = 1, repeat = 10, warmup = 2;
  int64_t token_map_size = 0;  // a random draft vocabulary of this many ids (timing)
  model::SamplingParams sampling;  // of the timed drafts; its seed (--seed) also seeds the weights and taps
  bool json = false, gather_logits = false;
  RankOptions ranks;
  std::string graphs = "auto";
};

// The checkpoint the bench drafts from: a directory pair, or random weights made in memory once
// the geometry is known to shard at this tp (generating a large one takes a while).
model::ModelSource bench_source(const BenchOpts& o, const RankContext& ctx, DType dtype) {
  if (!o.drafter.empty()) return model::ModelSource::open(o.drafter, o.target);
  const model::DrafterConfig cfg = model::DrafterConfig::from_file(o.config);
  model::ShardPlan::make(cfg, ctx.comm.rank(), ctx.comm.size());
  model::RandomCheckpointOptions ro;
  ro.seed = o.sampling.seed;
  ro.dtype = dtype;
  ro.threads = ctx.threads;
  if (ctx.leader()) TPDRAFT_LOG_INFO("generating random {} weights for {}", o.dtype, o.config);
  return model::ModelSource::from(cfg, model::TensorStore::from_memory(o.config, model::random_drafter_tensors(cfg, ro)),
                                  model::TensorStore::from_memory(o.config + " (target)",
                                                                  model::random_target_tensors(cfg, ro)));
}

// What one bench run measured, and what it ran on (rank 0's runtime and the options): the JSON
// and the table are both written from it.
struct BenchResult {
  BenchResult(const BenchOpts& o, model::RankRuntime& rt, const RankContext& ctx, int64_t context)
      : o(&o), rt(&rt), ctx(&ctx), context(context) {}
  const BenchOpts* o;
  model::RankRuntime* rt;
  const RankContext* ctx;
  int64_t context, replayed = 0;
  SampleSummary draft, layers, head, select;            // seconds
  SampleSummary comm_times, compute_times;              // seconds per draft in and out of collectives
  MachineLoad load;                                     // around the timed drafts; the job counts as ours
  parallel::CommStats comm;                             // over the timed drafts
  model::WorkCount work, settle_work;
  double settle_seconds = 0;
  double read_gbps = 0, gemm_gflops = 0, blas_settle_gflops = 0, blas_peak_gflops = 0;
  // The ceilings of the matrices held in int8 and int4 ([0], [1]; 0 where none is), and the
  // FLOPs of a draft's that those matrices do.
  std::array<double, 2> int_gops{0, 0}, int_flops{0, 0};
  std::vector<int64_t> tokens;
  nlohmann::json ceilings;                // how the two ceilings were measured and judged
  std::vector<std::string> ceilings_low;  // why they cannot be trusted; empty: they can

  const model::DrafterConfig& cfg() const { return rt->config(); }
  bool gpu() const { return !rt->ops().host_memory(); }
  double per_draft(uint64_t total) const { return static_cast<double>(total) / static_cast<double>(o->repeat); }
  double comm_mean() const { return comm.seconds / static_cast<double>(o->repeat); }
  // The weights' dtype, and how they were quantized.
  std::string dtype() const {
    const std::string d = dtype_name(rt->weights().head_dtype);
    if (!o->ranks.quant.empty()) return d + " --quant " + o->ranks.quant;
    return cfg().quant.any() ? d + " (quantized checkpoint)" : d;
  }
  // Of the timed drafts: "greedy", or "temperature T, top-k K, top-p P".
  std::string sampling() const {
    const model::SamplingParams& sp = o->sampling;
    return sp.greedy() ? "greedy" : fmt::format("temperature {}, top-k {}, top-p {}", sp.temperature, sp.top_k, sp.top_p);
  }
  // The fastest a draft can be on this machine: its FLOPs at our GEMM rates (those of the
  // quantized matrices at our int8 / int4 matmul's rate, the rest at the float one) or its bytes
  // at the memory ceiling, whichever takes longer (seconds).
  double compute_seconds() const {
    double float_flops = work.flops, t = 0;
    for (size_t b = 0; b < 2; ++b)
      if (int_gops[b] > 0) {
        float_flops -= int_flops[b];
        t += int_flops[b] / (int_gops[b] * 1e9);
      }
    return t + float_flops / (gemm_gflops * 1e9);
  }
  double roofline() const { return std::max(compute_seconds(), work.bytes() / (read_gbps * 1e9)); }
  double achieved_gflops() const { return work.flops / draft.median() / 1e9; }
  double achieved_gbps() const { return work.bytes() / draft.median() / 1e9; }
  double settle_rows_per_s() const { return static_cast<double>(context * o->batch) / settle_seconds; }
  double settle_gflops() const { return settle_work.flops / settle_seconds / 1e9; }
};

// Settles `rows` random tap rows into each session, one step each (which drafts a block too,
// untimed); returns the seconds rank 0 took to settle.
double settle_sessions(const BenchOpts& o, int64_t rows, engine::Group& group, const std::vector<int64_t>& sessions) {
  model::RankRuntime& rt = group.leader().runtime();
  double seconds = 0;
  for (size_t s = 0; s < sessions.size(); ++s) {
    const std::vector<float> taps = model::random_taps(rt.config(), rows, o.sampling.seed + s);
    engine::StepEntry e;
    e.session = sessions[s];
    e.n_new = rows;
    e.taps = {taps.data(), DType::F32, false, nullptr};
    e.anchor = static_cast<int64_t>(17 + s) % rt.config().vocab;
    // On a GPU the taps start on the device, where a target model leaves its hidden states; the
    // settle then times the drafter's own work, not a copy from pageable host memory.
    kernels::Buffer device_taps;
    if (!rt.ops().host_memory() && !taps.empty()) {
      device_taps = kernels::Buffer(rt.ops(), taps.size() * sizeof(float));
      rt.ops().to_device(device_taps.get(), taps.data(), taps.size() * sizeof(float));
      e.taps = {device_taps.get(), DType::F32, true, nullptr};
    }
    group.leader().check({e});
    group.apply({e});
    seconds += group.leader().last_times().settle;
  }
  return seconds;
}

// The job's other processes on this machine (mpirun starts a process per rank; ranks that are
// threads of one process count once): their CPU time is the run's own work, not other load.
// Collective over the job.
std::vector<int64_t> job_processes_here(const RankContext& ctx) {
  struct Process {
    int64_t pid;
    uint64_t host;
  };
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const Process mine{static_cast<int64_t>(getpid()), std::hash<std::string>{}(host)};
  std::vector<Process> all(static_cast<size_t>(ctx.world.size()));
  ctx.world.all_gather(&mine, all.data(), sizeof(Process));
  std::set<int64_t> seen{mine.pid};
  std::vector<int64_t> pids;
  for (const Process& p : all)
    if (p.host == mine.host && seen.insert(p.pid).second) pids.push_back(p.pid);
  return pids;
}

// The CPU seconds these processes have used (utime + stime, fields 14 and 15 of /proc/PID/stat).
double cpu_seconds(const std::vector<int64_t>& pids) {
  double ticks = 0;
  for (const int64_t pid : pids) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string line, skip;
    std::getline(in, line);
    std::istringstream fields(line.substr(line.rfind(')') + 1));  // after the name, field 3 on
    for (int f = 3; f < 14; ++f) fields >> skip;
    double user = 0, system = 0;
    fields >> user >> system;
    ticks += user + system;
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Warm-up and timed drafts, steps of the group; fills the timing, collective and token fields of
// `r` from rank 0's engine (`pids`: the job's other processes here, see job_processes_here).
void time_drafts(const BenchOpts& o, engine::Group& group, const std::vector<engine::StepEntry>& entries,
                 const std::vector<int64_t>& pids, BenchResult* r) {
  r->load = MachineLoad();
  const double others0 = cpu_seconds(pids);
  for (int64_t i = 0; i < o.warmup + o.repeat; ++i) {
    engine::StepDump full;  // --gather-logits: every rank assembles the whole [rows, V] logits
    const auto res = group.apply(entries, o.gather_logits ? &full : nullptr);
    const engine::StepTimes& t = group.leader().last_times();
    if (i >= o.warmup) {
      // Per draft, so that the medians of the time in and out of collectives resist outliers.
      r->comm_times.add(t.comm.seconds);
      r->compute_times.add(t.draft - t.comm.seconds);
      r->draft.add(t.draft);
      r->comm += t.comm;
      const model::DraftTimes& phases = group.leader().runtime().drafter().last_times();
      r->layers.add(phases.layers);
      r->head.add(phases.head);
      r->select.add(phases.select);
      r->replayed += phases.replayed ? 1 : 0;
    }
    if (i + 1 == o.warmup + o.repeat) r->tokens = res[0].tokens;
  }
  r->load.stop();
  r->load.add_own_cpu(cpu_seconds(pids) - others0);
}

// This machine's ceilings the achieved rates are quoted against (rank 0 only).
struct Ceilings {
  double read_gbps = 0, gemm_gflops = 0, blas_settle_gflops = 0, blas_peak_gflops = 0;
  std::array<double, 2> int_gops{0, 0};  // int8, int4: measured where the drafter holds such matrices
};

Ceilings measure_ceilings(model::RankRuntime& rt, DType dtype, int threads, int64_t ctx) {
  kernels::Ops& ops = rt.ops();
  const model::DrafterConfig& cfg = rt.config();
  const bool gpu = !ops.host_memory();
  Ceilings c;
  // The memory ceiling: host read bandwidth for the CPU, device copy bandwidth for a GPU.
  c.read_gbps = gpu ? kernels::measure_copy_gbps(ops) : kernels::measure_read_gbps(threads);
  c.gemm_gflops = kernels::measure_gemm_gflops(ops, dtype, std::min<int64_t>(cfg.hidden, 2048));
  if (!rt.weights().dequantized()) {
    const std::array<double, 2> qf = model::draft_quantized_flops(cfg, rt.plan(), 1);
    for (size_t b = 0; b < 2; ++b)
      if (qf[b] > 0) c.int_gops[b] = kernels::measure_qgemm_gops(ops, b == 0 ? 8 : 4, std::min<int64_t>(cfg.hidden, 2048));
  }
  // A GPU's settle is quoted against plain cuBLAS on 16-bit operands: the rate at the shape of
  // its largest GEMM (fc: settle chunk x T*H -> H) and at a large square one.
  if (gpu && dtype != DType::F32) {
    const int64_t chunk = std::min<int64_t>(rt.drafter().limits().settle_chunk, std::max<int64_t>(1, ctx));
    c.blas_settle_gflops = kernels::cublas_gemm_gflops(ops, dtype, chunk, cfg.hidden, cfg.n_taps() * cfg.hidden);
    c.blas_peak_gflops = kernels::cublas_gemm_gflops(ops, dtype, 8192, 8192, 8192);
  }
  return c;
}

// The best ceilings recorded on this machine, one entry per (processor, backend, dtype, threads,
// GEMM size), in bench-ceilings.json of the build folder the program runs from, or the file
// TPDRAFT_CEILINGS_FILE names ("none": no record). Installed programs keep no record.
std::string ceilings_file() {
  if (const char* env = std::getenv("TPDRAFT_CEILINGS_FILE"); env != nullptr && *env != '\0')
    return std::string(env) == "none" ? "" : env;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec || !std::filesystem::exists(dir / "CMakeCache.txt", ec)) return "";
  return (dir / "bench-ceilings.json").string();
}

std::string processor_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  return "unknown processor";
}

// A ceiling under this share of the recorded best, or other work above this many cores per core
// of the machine (the load average before the run, or other processes' CPU during it), marks the
// run's ceilings low: a roofline taken from them flatters every ratio.
constexpr double kCeilingShare = 0.7, kLoadPerCore = 0.5;

// Takes the larger of each ceiling measured before and after the drafts, compares them with the
// record (which keeps the best ever seen) and with the machine's load over the whole run.
void judge_ceilings(BenchResult& r, const Ceilings& before, const Ceilings& after, const MachineLoad& run_load) {
  r.read_gbps = std::max(before.read_gbps, after.read_gbps);
  r.gemm_gflops = std::max(before.gemm_gflops, after.gemm_gflops);
  r.blas_settle_gflops = std::max(before.blas_settle_gflops, after.blas_settle_gflops);
  r.blas_peak_gflops = std::max(before.blas_peak_gflops, after.blas_peak_gflops);
  for (size_t b = 0; b < 2; ++b) r.int_gops[b] = std::max(before.int_gops[b], after.int_gops[b]);
  const double loadavg_before = run_load.loadavg_before();
  const std::string key = fmt::format("{} | {} | {} | {} threads | gemm {}", processor_name(), r.rt->ops().name(),
                                      dtype_name(r.rt->weights().head_dtype), r.ctx->threads,
                                      std::min<int64_t>(r.cfg().hidden, 2048));
  const std::string file = ceilings_file();
  nlohmann::json record = nlohmann::json::object();
  if (!file.empty()) {
    std::ifstream in(file);
    if (in) {
      try {
        record = nlohmann::json::parse(in);
        if (!record.is_object()) record = nlohmann::json::object();
      } catch (const nlohmann::json::exception&) {
        TPDRAFT_LOG_WARN("bench: {} is not a JSON object of ceilings; starting a new record", file);
        record = nlohmann::json::object();
      }
    }
  }
  nlohmann::json& best = record[key];
  if (!best.is_object()) best = nlohmann::json::object();
  const double best_read = best.value("read_gbps", 0.0), best_gemm = best.value("gemm_gflops", 0.0);
  const double cores = static_cast<double>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  auto low_against = [&](const char* what, double now, double recorded, const char* unit) {
    if (recorded > 0 && now < kCeilingShare * recorded)
      r.ceilings_low.push_back(fmt::format("{} {:.1f} {} is under {:.0f}% of the {:.1f} recorded", what, now, unit,
                                           100 * kCeilingShare, recorded));
  };
  low_against("GEMM", r.gemm_gflops, best_gemm, "GFLOP/s");
  low_against("read", r.read_gbps, best_read, "GB/s");
  if (loadavg_before > kLoadPerCore * cores)
    r.ceilings_low.push_back(fmt::format("load average {:.2f} before the run on {:.0f} cores", loadavg_before, cores));
  if (run_load.other_cores() > kLoadPerCore * cores)
    r.ceilings_low.push_back(fmt::format("other processes kept {:.2f} of {:.0f} cores busy", run_load.other_cores(), cores));
  r.ceilings = {{"gemm_gflops_before", before.gemm_gflops}, {"gemm_gflops_after", after.gemm_gflops},
                {"read_gbps_before", before.read_gbps},   {"read_gbps_after", after.read_gbps},
                {"recorded_gemm_gflops", best_gemm}, {"recorded_read_gbps", best_read},
                {"record", file.empty() ? nlohmann::json(nullptr) : nlohmann::json(file)},
                {"record_key", key},                 {"loadavg_before", loadavg_before},
                {"other_cores", run_load.other_cores()}};
  if (file.empty() || (r.gemm_gflops <= best_gemm && r.read_gbps <= best_read)) return;
  best["gemm_gflops"] = std::max(best_gemm, r.gemm_gflops);
  best["read_gbps"] = std::max(best_read, r.read_gbps);
  // Written beside and renamed over, so that a reader never sees half a file.
  const std::string tmp = fmt::format("{}.{}.tmp", file, getpid());
  {
    std::ofstream out(tmp);
    out << record.dump(2) << "\n";
    if (!out) {
      TPDRAFT_LOG_WARN("bench: cannot write the ceilings record {}", tmp);
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) {
    TPDRAFT_LOG_WARN("bench: cannot replace the ceilings record {}: {}", file, ec.message());
    std::filesystem::remove(tmp, ec);
  }
}

nlohmann::json to_json(const BenchResult& r) {
  const parallel::CommStats& c = r.comm;
  nlohmann::json j;
  j["config"] = r.o->drafter.empty() ? r.o->config : r.o->drafter;
  j["architecture"] = r.cfg().arch_name;
  j["backend"] = r.rt->ops().name();
  j["threads"] = r.ctx->threads;
  j["tp"] = r.rt->comm().size();
  j["gather_logits"] = r.o->gather_logits;
  j["sampling"] = r.sampling();
  j["graphs"] = r.rt->drafter().graphs();
  j["replayed_drafts"] = r.replayed;
  j["graph_nodes"] = r.rt->drafter().graph_nodes(r.o->batch);
  j["replicas"] = r.ctx->replicas;
  j["communicator"] = r.rt->comm().name();
  j["all_reduce_path"] = r.rt->comm().all_reduce_path();
  j["comm_ms"] = r.comm_mean() * 1e3;
  j["comm_ms_median"] = r.comm_times.median() * 1e3;
  j["comm_timing"] = c.timing;  // "events": the device all-reduces outside a graph by CUDA events
  j["compute_ms"] = r.compute_times.median() * 1e3;  // outside collectives
  j["all_reduce_calls"] = r.per_draft(c.all_reduce_calls);
  j["all_reduce_bytes"] = r.per_draft(c.all_reduce_bytes);
  j["all_gather_calls"] = r.per_draft(c.all_gather_calls);
  j["all_gather_bytes"] = r.per_draft(c.all_gather_bytes);
  j["broadcast_calls"] = r.per_draft(c.broadcast_calls);
  j["broadcast_bytes"] = r.per_draft(c.broadcast_bytes);
  j["weights_bytes_per_rank"] = static_cast<double>(r.rt->weights().backend_bytes());
  j["context_bytes_per_rank"] = static_cast<double>(r.rt->drafter().context_bytes_per_position() *
                                                    static_cast<size_t>(r.context * r.o->batch));
  j["vocab"] = r.cfg().vocab;
  j["draft_vocab"] = r.cfg().draft_vocab;
  j["sessions"] = r.o->batch;
  j["context"] = r.context;
  j["dtype"] = r.dtype();
  j["draft_ms"] = r.draft.median() * 1e3;  // the median, under the name the scaling scripts read
  put_figure(j, "draft_ms", r.draft, 1e3);
  j["layers_ms"] = r.layers.median() * 1e3;
  j["head_ms"] = r.head.median() * 1e3;
  j["select_ms"] = r.select.median() * 1e3;
  j["settle_rows_per_s"] = r.settle_rows_per_s();
  j["settle_gflops"] = r.settle_gflops();
  j["settle_warm"] = true;  // timed after one untimed settle: no first use in the figure
  j["draft_gflop"] = r.work.flops / 1e9;
  j["draft_gbytes"] = r.work.bytes() / 1e9;
  j["draft_weight_gbytes"] = r.work.weight_bytes / 1e9;
  j["achieved_gflops"] = r.achieved_gflops();
  j["achieved_gbps"] = r.achieved_gbps();
  j["machine_read_gbps"] = r.read_gbps;
  j["machine_memory_ceiling"] = r.gpu() ? "device copy (read + write)" : "host read";
  j["machine_gemm_gflops"] = r.gemm_gflops;
  if (r.int_gops[0] > 0) j["machine_int8_gemm_gops"] = r.int_gops[0];
  if (r.int_gops[1] > 0) j["machine_int4_gemm_gops"] = r.int_gops[1];
  j["draft_int8_gflop"] = r.int_flops[0] / 1e9;
  j["draft_int4_gflop"] = r.int_flops[1] / 1e9;
  j["roofline_ms"] = r.roofline() * 1e3;
  j["roofline_ratio"] = r.draft.median() / r.roofline();
  j["ceilings"] = r.ceilings;
  j["ceilings_low"] = !r.ceilings_low.empty();
  j["ceilings_low_because"] = r.ceilings_low;
  if (r.blas_peak_gflops > 0) {
    j["cublas_gemm_gflops_settle_shape"] = r.blas_settle_gflops;
    j["cublas_gemm_gflops_peak"] = r.blas_peak_gflops;
    j["settle_fraction_of_cublas"] = r.settle_gflops() / r.blas_peak_gflops;
  }
  j["machine_load"] = r.load.to_json();
  j["tokens"] = r.tokens;
  return j;
}

// "trusted (...)" or "LOW: why", for the tables.
std::string ceilings_verdict(const BenchResult& r) {
  const nlohmann::json& c = r.ceilings;
  const std::string seen =
      fmt::format("GEMM {:.1f} / {:.1f} GFLOP/s and read {:.1f} / {:.1f} GB/s before / after the drafts",
                  c.value("gemm_gflops_before", 0.0), c.value("gemm_gflops_after", 0.0), c.value("read_gbps_before", 0.0),
                  c.value("read_gbps_after", 0.0));
  if (!r.ceilings_low.empty()) return fmt::format("LOW: {} ({})", fmt::join(r.ceilings_low, "; "), seen);
  const double rec = c.value("recorded_gemm_gflops", 0.0);
  return rec > 0 ? fmt::format("trusted ({}; best recorded GEMM {:.1f})", seen, rec)
                 : fmt::format("trusted as far as known ({}; no earlier record)", seen);
}

// "N x B B" for a collective: calls per draft and bytes per call.
std::string calls_and_bytes(const BenchResult& r, uint64_t calls, uint64_t bytes) {
  const double per_call = calls ? static_cast<double>(bytes) / static_cast<double>(calls) : 0.0;
  return fmt::format("{:.0f} x {:.0f} B", r.per_draft(calls), per_call);
}

void print_table(const BenchResult& r) {
  const parallel::CommStats& c = r.comm;
  model::RankRuntime& rt = *r.rt;
  std::printf("tpdraft bench: %s, %s weights, %s backend, tp %d (%s), %d thread(s) per rank, %lld session(s) x %lld "
              "context rows, %s drafts\n",
              r.cfg().arch_name.c_str(), r.dtype().c_str(), rt.ops().name(), rt.comm().size(), rt.comm().name().c_str(),
              r.ctx->threads, static_cast<long long>(r.o->batch), static_cast<long long>(r.context),
              r.sampling().c_str());
  if (r.cfg().draft_vocab > 0)
    std::printf("  head       a draft vocabulary of %lld of the %lld tokens\n",
                static_cast<long long>(r.cfg().draft_vocab), static_cast<long long>(r.cfg().vocab));
  std::printf("  draft      median %8.2f ms   min %8.2f   max %8.2f   p10..p90 %.2f..%.2f  (%lld runs)\n",
              r.draft.median() * 1e3, r.draft.min() * 1e3, r.draft.max() * 1e3, r.draft.quantile(0.1) * 1e3,
              r.draft.quantile(0.9) * 1e3, static_cast<long long>(r.o->repeat));
  std::printf("  phases     layers %.2f ms, head %.2f ms, selection %.2f ms (medians); forward %s (%lld of %lld "
              "replayed, %zu graph nodes)\n",
              r.layers.median() * 1e3, r.head.median() * 1e3, r.select.median() * 1e3,
              rt.drafter().graphs() ? "captured once, replayed" : "issued op by op", static_cast<long long>(r.replayed),
              static_cast<long long>(r.o->repeat), rt.drafter().graph_nodes(r.o->batch));
  std::printf("  comm       %.3f ms per draft: all-reduce %s, all-gather %s, broadcast %s\n", r.comm_mean() * 1e3,
              calls_and_bytes(r, c.all_reduce_calls, c.all_reduce_bytes).c_str(),
              calls_and_bytes(r, c.all_gather_calls, c.all_gather_bytes).c_str(),
              calls_and_bytes(r, c.broadcast_calls, c.broadcast_bytes).c_str());
  if (!rt.comm().all_reduce_path().empty()) std::printf("  all-reduce %s\n", rt.comm().all_reduce_path().c_str());
  std::printf("  work       %.2f GFLOP, %.3f GB per draft (weights %.3f GB, context %.3f GB)\n", r.work.flops / 1e9,
              r.work.bytes() / 1e9, r.work.weight_bytes / 1e9, r.work.context_bytes / 1e9);
  std::printf("  achieved   %.1f GFLOP/s (%.0f%% of our GEMM's %.1f), %.1f GB/s (%.0f%% of %s bandwidth %.1f)\n",
              r.achieved_gflops(), 100 * r.achieved_gflops() / r.gemm_gflops, r.gemm_gflops, r.achieved_gbps(),
              100 * r.achieved_gbps() / r.read_gbps, r.gpu() ? "device copy" : "read", r.read_gbps);
  std::printf("  roofline   %.2f ms (max of FLOPs / GEMM rate, bytes / %s rate): the draft takes %.2fx\n",
              r.roofline() * 1e3, r.gpu() ? "copy" : "read", r.draft.median() / r.roofline());
  for (size_t b = 0; b < 2; ++b)
    if (r.int_gops[b] > 0)
      std::printf("             of it %.2f GFLOP on int%d weights, at our int%d matmul's %.1f GOP/s\n",
                  r.int_flops[b] / 1e9, b == 0 ? 8 : 4, b == 0 ? 8 : 4, r.int_gops[b]);
  std::printf("  ceilings   %s\n", ceilings_verdict(r).c_str());
  std::printf("  settle     %.0f rows/s (%.1f GFLOP/s), warm (after one untimed settle)\n", r.settle_rows_per_s(),
              r.settle_gflops());
  std::printf("  machine    %s\n", r.load.describe().c_str());
  if (r.blas_peak_gflops > 0)
    std::printf("  cuBLAS     %.0f GFLOP/s at 8192^3, %.0f at the settle's fc shape: settle reaches %.0f%% of the first\n",
                r.blas_peak_gflops, r.blas_settle_gflops, 100 * r.settle_gflops() / r.blas_peak_gflops);
}

// Settles `context` rows into fresh sessions and times drafts over them, through the group (on
// its rank 0).
BenchResult bench_context(const BenchOpts& o, const RankContext& ctx, engine::Group& group, DType dtype,
                          int64_t context, const std::vector<int64_t>& pids) {
  model::RankRuntime& rt = group.leader().runtime();
  const model::DrafterConfig& cfg = rt.config();
  BenchResult r(o, rt, ctx, context);
  std::vector<int64_t> sessions;
  for (int64_t s = 0; s < o.batch; ++s) sessions.push_back(group.open_session());
  r.settle_seconds = settle_sessions(o, context, group, sessions);
  std::vector<engine::StepEntry> entries(sessions.size());
  for (size_t s = 0; s < sessions.size(); ++s) {
    entries[s].session = sessions[s];
    entries[s].anchor = static_cast<int64_t>(17 + s) % cfg.vocab;
    entries[s].sampling = o.sampling;
  }
  group.leader().check(entries);
  if (ctx.leader())
    TPDRAFT_LOG_INFO("settled {} x {} rows; timing {} drafts after {} warm-up", o.batch, context, o.repeat, o.warmup);
  time_drafts(o, group, entries, pids, &r);
  for (const int64_t s : sessions) group.close_session(s);
  const double wbytes = static_cast<double>(dtype_size(rt.weights().head_dtype));
  r.work = model::draft_work(cfg, rt.plan(), o.batch, context, wbytes,
                             static_cast<double>(dtype_size(rt.drafter().limits().kv_dtype)));
  // Quantized matrices read fewer bytes than the head's dtype says.
  if (!rt.weights().dequantized()) r.int_flops = model::draft_quantized_flops(cfg, rt.plan(), o.batch);
  if (rt.weights().dequantized()) {
    // a16 on a backend with int8-activation kernels: every preset matrix is held in f32.
    model::DrafterConfig held = cfg;
    held.quant = {};
    r.work.weight_bytes = model::draft_weight_bytes(held, rt.plan(), DType::F32,
                                                    cfg.quant.head.quantized() ? DType::F32 : rt.weights().head_dtype);
  } else if (cfg.quant.any()) {
    r.work.weight_bytes = model::draft_weight_bytes(cfg, rt.plan(), rt.weights().head_dtype, rt.weights().head_dtype);
  }
  r.settle_work = model::settle_work(cfg, rt.plan(), context * o.batch, wbytes);
  return r;
}


// One row per context of a sweep.
void print_sweep(const std::vector<BenchResult>& rows) {
  std::printf("context sweep (%s, %d thread(s), tp %d; roofline: max of FLOPs / %.0f GFLOP/s, bytes / %.1f GB/s)\n",
              rows[0].cfg().arch_name.c_str(), rows[0].ctx->threads, rows[0].rt->comm().size(), rows[0].gemm_gflops,
              rows[0].read_gbps);
  std::printf("  %9s %10s %10s %9s %12s %6s  %s\n", "context", "draft ms", "layers ms", "head ms", "roofline ms",
              "ratio", "machine");
  for (const BenchResult& r : rows)
    std::printf("  %9lld %10.2f %10.2f %9.2f %12.2f %6.2f  %s\n", static_cast<long long>(r.context),
                r.draft.median() * 1e3, r.layers.median() * 1e3, r.head.median() * 1e3, r.roofline() * 1e3,
                r.draft.median() / r.roofline(), r.load.describe().c_str());
}

void run_bench(const BenchOpts& o, const RankContext& ctx) {
  const DType dtype = weight_dtype(o.dtype);
  std::unique_ptr<engine::Engine> engine;
  agree_on(ctx.world, kExitInput, [&] {
    model::ModelSource source = bench_source(o, ctx, dtype);
    if (o.token_map_size > 0)
      model::apply_token_map(source, model::random_token_ids(source.config.vocab, o.token_map_size, o.sampling.seed),
                             fmt::format("--token-map-size {}", o.token_map_size));
    apply_load_options(source, o.ranks);
    model::RuntimeOptions ro = runtime_options(o.ranks, ctx);
    ro.limits.max_sessions = o.batch;
    ro.limits.max_context = std::max<int64_t>(1, *std::max_element(o.ctx.begin(), o.ctx.end()));
    ro.graphs = o.graphs == "on" ? model::GraphMode::On : o.graphs == "off" ? model::GraphMode::Off : model::GraphMode::Auto;
    engine = std::make_unique<engine::Engine>(source, ctx.comm, ro, o.batch);
  });
  // Sampling options this drafter cannot take (top-k and top-p on DFlash 2) are the command line's error.
  agree_on(ctx.world, kExitUsage, [&] { model::Drafter::check_request(engine->runtime().config(), 0, o.sampling); });
  const std::vector<int64_t> pids = job_processes_here(ctx);
  drive_group(ctx, *engine, [&](engine::Group* group) {
    if (group == nullptr) return;
    // One untimed settle first (a session opened, settled and closed): the timed settles then
    // pay no first use (allocations, a GPU's library handles and kernels).
    const int64_t warm = group->open_session();
    settle_sessions(o, std::min(o.ctx[0], engine->runtime().drafter().limits().settle_chunk), *group, {warm});
    group->close_session(warm);
    // The ceilings (rank 0's) before the first context and after the last, the larger of each
    // kept: a machine that slowed for part of the run does not set a low roofline.
    model::RankRuntime& rt = group->leader().runtime();
    MachineLoad run_load;
    Ceilings before;
    if (ctx.leader()) before = measure_ceilings(rt, dtype, ctx.threads, o.ctx[0]);
    std::vector<BenchResult> rows;
    for (const int64_t context : o.ctx) rows.push_back(bench_context(o, ctx, *group, dtype, context, pids));
    if (!ctx.leader()) return;
    const Ceilings after = measure_ceilings(rt, dtype, ctx.threads, o.ctx.back());
    run_load.stop();
    judge_ceilings(rows[0], before, after, run_load);
    for (BenchResult& r : rows) {
      r.read_gbps = rows[0].read_gbps, r.gemm_gflops = rows[0].gemm_gflops;
      r.blas_settle_gflops = rows[0].blas_settle_gflops, r.blas_peak_gflops = rows[0].blas_peak_gflops;
      r.int_gops = rows[0].int_gops;
      r.ceilings = rows[0].ceilings, r.ceilings_low = rows[0].ceilings_low;
    }
    if (!rows[0].ceilings_low.empty())
      TPDRAFT_LOG_WARN("bench: the ceilings are low ({}): every roofline ratio of this run is flattered",
                       fmt::join(rows[0].ceilings_low, "; "));
    for (const BenchResult& r : rows) {
      if (o.json)
        std::printf("%s\n", to_json(r).dump().c_str());
      else if (o.ctx.size() == 1)
        print_table(r);
    }
    if (!o.json && o.ctx.size() > 1) {
      print_sweep(rows);
      std::printf("  ceilings %s\n", ceilings_verdict(rows[0]).c_str());
    }
    std::fflush(stdout);
  });
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
  cmd->add_option("--ctx", o->ctx, "Context rows settled per session; a comma list (1024,32768) sweeps them, one "
                                  "result per context")
      ->delimiter(',')
      ->capture_default_str()
      ->check(whole_number(0));
  cmd->add_option("--batch", o->batch, "Sessions drafted together")
      ->capture_default_str()
      ->check(whole_number(1, 65536, "sessions in one forward"));
  cmd->add_option("--repeat", o->repeat, "Timed drafts")->capture_default_str()->check(whole_number(1));
  cmd->add_option("--warmup", o->warmup, "Untimed drafts first")->capture_default_str()->check(whole_number(0));
  cmd->add_option("--dtype", o->dtype, "Random weight dtype")->check(CLI::IsMember({"bf16", "f16", "f32"}))->capture_default_str();
  cmd->add_option("--seed", o->sampling.seed, "Seed of the random weights, taps and sampling noise")->check(seed_number());
  add_sampling_options(cmd, &o->sampling);
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  cmd->add_flag("--gather-logits", o->gather_logits,
                "Also gather the full logits [rows, V] on every rank each draft (what a caller wanting whole "
                "distributions pays; the default exchanges only the top candidates)");
  add_rank_options(cmd, &o->ranks);
  cmd->add_option("--token-map-size", o->token_map_size,
                  "Draft over a random draft vocabulary of N target ids (drawn by --seed): what a token map of that "
                  "size costs, for timing")
      ->check(whole_number(1, model::size_limit("vocab_size")));
  cmd->add_option("--graphs", o->graphs,
                  "Capture the block forward once and replay it (CUDA graphs; a call tape on the CPU): on, off, or "
                  "auto (on for cuda)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->callback([o] {
    if (o->drafter.empty() == o->config.empty() || o->drafter.empty() != o->target.empty())
      throw CLI::ValidationError("bench", "give either --config FILE (random weights) or --drafter DIR and --target DIR");
    if (o->token_map_size > 0 && !o->ranks.token_map.empty())
      throw CLI::ValidationError("bench", "give --token-map FILE or --token-map-size N, not both");
    run_ranks(o->ranks, [&](const RankContext& ctx) { run_bench(*o, ctx); });
  });
}

}  // namespace tpdraft::cli
