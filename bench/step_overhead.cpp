// What one tpdraft_step costs through the C ABI beyond the draft itself. For each geometry the
// same steps run three ways, interleaved: through libtpdraft.so (tpdraft_step), through
// engine::Engine::step on the same checkpoint, and straight on the drafter (rollback, settle,
// draft). Each step rolls back to a fixed context and settles 1-4 new rows, as a decoding loop
// does, so the context never grows. Prints a table, whether the machine was idle, and one JSON line
// per geometry (timed figures in the shape of core/timing.h).
//   step_overhead [--config FILE]... [--steps N] [--context N] [--threads N]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_main.h"
#include "core/error.h"
#include "core/summary.h"
#include "core/timing.h"
#include "engine/engine.h"
#include "engine/runtime.h"
#include "parallel/communicator.h"
#include "tools/random_checkpoint.h"
#include "tpdraft/tpdraft.h"

// Allocations made so far by the whole process, libtpdraft.so included (allocation_count.cpp).
uint64_t allocations_so_far();

namespace tpdraft::bench {
namespace {

struct Args {
  std::vector<std::string> configs;
  int64_t steps = 0;    // 0: 6000 on a tiny geometry, 40 on a large one
  int64_t context = 0;  // 0: 64 on a tiny geometry, 1024 on a large one
  int threads = 1;
};

// A temp directory holding a random checkpoint (generated on every core), removed at the end.
struct ScratchCheckpoint {
  std::string dir;
  explicit ScratchCheckpoint(const model::DrafterConfig& cfg) {
    std::string templ = (std::filesystem::temp_directory_path() / "tpdraft-overhead-XXXXXX").string();
    TPDRAFT_CHECK(mkdtemp(templ.data()) != nullptr, "cannot make a temp directory from {}", templ);
    dir = templ;
    model::RandomCheckpointOptions o;
    o.seed = 3;
    model::write_random_checkpoint(cfg, dir, o, 0);
  }
  ~ScratchCheckpoint() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

// The steps every path runs: step i rolls back to `context` and settles rows(i) = 1 + i % 4 rows.
struct Workload {
  int64_t context = 0, width = 0;
  std::vector<float> prefix;                   // [context, width]
  std::vector<std::vector<float>> new_rows;    // [4][r + 1 rows]
  int64_t rows(int64_t i) const { return 1 + i % 4; }
  const float* taps(int64_t i) const { return new_rows[static_cast<size_t>(rows(i) - 1)].data(); }
  int64_t anchor(int64_t i, int64_t vocab) const { return (17 + 31 * i) % vocab; }
};

Workload make_workload(const model::DrafterConfig& cfg, int64_t context) {
  Workload w;
  w.context = context;
  w.width = cfg.n_taps() * cfg.hidden;
  w.prefix = model::random_taps(cfg, context, 5);
  for (int64_t r = 1; r <= 4; ++r) w.new_rows.push_back(model::random_taps(cfg, r, 10 + static_cast<uint64_t>(r)));
  return w;
}

// The C ABI: a handle on the checkpoint with one session holding the context.
class AbiPath {
 public:
  AbiPath(const std::string& dir, const Workload& w, int threads, int64_t block)
      : tokens_(static_cast<size_t>(block - 1)) {
    tpdraft_options o;
    tpdraft_options_init(&o);
    o.backend = "cpu";
    o.threads = threads;
    o.max_sessions = 1;
    o.max_context = w.context + 8;
    check(tpdraft_open((dir + "/drafter").c_str(), (dir + "/target").c_str(), &o, &d_));
    check(tpdraft_session_open(d_, &session_));
    tpdraft_step_entry e = entry(-1, w.context, w.prefix.data(), 0);
    check(tpdraft_step(d_, &e, 1));
  }
  ~AbiPath() { tpdraft_close(d_); }
  void step(const Workload& w, int64_t i, int64_t vocab) {
    tpdraft_step_entry e = entry(w.context, w.rows(i), w.taps(i), w.anchor(i, vocab));
    check(tpdraft_step(d_, &e, 1));
  }
  const std::vector<int64_t>& tokens() const { return tokens_; }

 private:
  tpdraft_step_entry entry(int64_t keep, int64_t n_new, const float* taps, int64_t anchor) {
    tpdraft_step_entry e;
    tpdraft_step_entry_init(&e);  // p0 -1, f32 taps, a greedy draft
    e.session = session_;
    e.keep = keep;
    e.n_new = n_new;
    e.taps = taps;
    e.anchor = anchor;
    e.tokens = tokens_.data();
    return e;
  }
  static void check(tpdraft_status st) { TPDRAFT_CHECK(st == TPDRAFT_OK, "C ABI: {}", tpdraft_last_error()); }

  tpdraft_drafter* d_ = nullptr;
  tpdraft_session session_ = -1;
  std::vector<int64_t> tokens_;
};

// The engine on its own copy of the checkpoint, one session through Engine::step, and one more
// session driven on the engine's drafter directly.
class EnginePaths {
 public:
  EnginePaths(const std::string& dir, const Workload& w, int threads) : comm_(parallel::make_single_rank()) {
    model::RuntimeOptions ro;
    ro.backend = "cpu";
    ro.threads = threads;
    ro.limits.max_sessions = 1;
    ro.limits.max_context = w.context + 8;
    const model::ModelSource source = model::ModelSource::open(dir + "/drafter", dir + "/target");
    engine_ = std::make_unique<engine::Engine>(source, *comm_, ro, 1);
    session_ = engine_->open_session();
    engine::StepEntry e = entry(-1, w.context, w.prefix.data(), 0);
    engine_->step({e});
    raw_ = engine_->runtime().drafter().new_session();
    engine_->runtime().drafter().settle(*raw_, 0, w.prefix.data(), w.context);
  }
  void engine_step(const Workload& w, int64_t i, int64_t vocab) {
    entries_.assign(1, entry(w.context, w.rows(i), w.taps(i), w.anchor(i, vocab)));
    results_ = engine_->step(entries_);
  }
  void drafter_step(const Workload& w, int64_t i, int64_t vocab) {
    model::Drafter& d = engine_->runtime().drafter();
    d.rollback(*raw_, w.context);
    d.settle(*raw_, w.context, w.taps(i), w.rows(i));
    raw_results_ = d.draft({{raw_.get(), w.anchor(i, vocab), {}}});
  }
  // The checks alone (Engine::check, the NaN scan of the taps included) of step i's entry.
  void check_step(const Workload& w, int64_t i, int64_t vocab) {
    entries_.assign(1, entry(w.context, w.rows(i), w.taps(i), w.anchor(i, vocab)));
    engine_->check(entries_);
  }
  const std::vector<int64_t>& engine_tokens() const { return results_[0].tokens; }
  const std::vector<int64_t>& drafter_tokens() const { return raw_results_[0].tokens; }

 private:
  engine::StepEntry entry(int64_t keep, int64_t n_new, const float* taps, int64_t anchor) const {
    engine::StepEntry e;
    e.session = session_;
    e.keep = keep;
    e.n_new = n_new;
    e.taps.data = taps;
    e.anchor = anchor;
    return e;
  }

  std::unique_ptr<parallel::Communicator> comm_;
  std::unique_ptr<engine::Engine> engine_;
  int64_t session_ = -1;
  std::unique_ptr<model::Session> raw_;
  std::vector<engine::StepEntry> entries_;
  std::vector<model::DraftResult> results_, raw_results_;
};

// One path's timed steps: the seconds of each, and the allocations of all.
struct Series {
  SampleSummary seconds{100000};
  uint64_t allocations = 0;
};

struct Measured {
  std::string config;
  int64_t steps = 0, context = 0, round = 0;
  int threads = 1;
  Series abi, engine, drafter;
  // Per round: the median step of one path less the other's.
  SampleSummary abi_minus_engine{100000}, engine_minus_drafter{100000};
  SampleSummary checks;  // Engine::check of one step's entry, timed on its own
  int64_t mismatches = 0;  // steps whose tokens differed between the paths
  MachineLoad load;        // around the steps and checks
  double per_step(const Series& s) const { return static_cast<double>(s.allocations) / static_cast<double>(steps); }
};

enum Path { kAbi, kEngine, kDrafter };

// `count` steps from `first` on one path; each step's time and allocations, and the tokens.
SampleSummary run_round(Path path, int64_t first, int64_t count, const Workload& w, int64_t vocab, AbiPath& abi,
                        EnginePaths& eng, Series* series, std::vector<std::vector<int64_t>>* tokens) {
  SampleSummary round(static_cast<size_t>(count));
  for (int64_t i = first; i < first + count; ++i) {
    const uint64_t a0 = allocations_so_far();
    const auto t0 = Clock::now();
    if (path == kAbi) abi.step(w, i, vocab);
    if (path == kEngine) eng.engine_step(w, i, vocab);
    if (path == kDrafter) eng.drafter_step(w, i, vocab);
    const double seconds = seconds_since(t0);
    const uint64_t allocations = allocations_so_far() - a0;
    if (series != nullptr) {
      series->seconds.add(seconds);
      series->allocations += allocations;
    }
    round.add(seconds);
    tokens->push_back(path == kAbi ? abi.tokens() : path == kEngine ? eng.engine_tokens() : eng.drafter_tokens());
  }
  return round;
}

// Rounds of `m->round` steps on each path in turn (the order rotating from round to round), so
// that each path runs on weights its own steps just used, as a decoding loop does, and slow
// drifts of the machine fall on every path alike. The first rounds warm up.
void run_steps(const Workload& w, int64_t vocab, int64_t warmup_rounds, AbiPath& abi, EnginePaths& eng,
               Measured* m) {
  const int64_t rounds = (m->steps + m->round - 1) / m->round;
  for (int64_t r = 0; r < warmup_rounds + rounds; ++r) {
    const bool timed_round = r >= warmup_rounds;
    const int64_t first = r * m->round;
    double median[3] = {0, 0, 0};
    std::vector<std::vector<int64_t>> tokens[3];
    for (int k = 0; k < 3; ++k) {
      const Path p = static_cast<Path>((r + k) % 3);
      Series* series = !timed_round ? nullptr : p == kAbi ? &m->abi : p == kEngine ? &m->engine : &m->drafter;
      median[p] = run_round(p, first, m->round, w, vocab, abi, eng, series, &tokens[p]).median();
    }
    for (size_t i = 0; i < tokens[0].size(); ++i)
      if (tokens[kAbi][i] != tokens[kEngine][i] || tokens[kEngine][i] != tokens[kDrafter][i]) ++m->mismatches;
    if (!timed_round) continue;
    m->abi_minus_engine.add(median[kAbi] - median[kEngine]);
    m->engine_minus_drafter.add(median[kEngine] - median[kDrafter]);
  }
  m->steps = rounds * m->round;
}

Measured measure(const std::string& config, const Args& a) {
  const model::DrafterConfig cfg = model::DrafterConfig::from_file(config);
  const bool tiny = cfg.hidden * cfg.vocab < (int64_t{1} << 24);
  Measured m;
  m.config = config;
  m.steps = a.steps > 0 ? a.steps : tiny ? 6000 : 40;
  m.round = tiny ? 100 : 2;
  m.context = a.context > 0 ? a.context : tiny ? 64 : 1024;
  m.threads = a.threads;
  std::fprintf(stderr, "%s: writing a random checkpoint...\n", config.c_str());
  const ScratchCheckpoint ck(cfg);
  const Workload w = make_workload(cfg, m.context);
  AbiPath abi(ck.dir, w, a.threads, cfg.block);
  EnginePaths eng(ck.dir, w, a.threads);
  std::fprintf(stderr, "%s: %lld steps...\n", config.c_str(), static_cast<long long>(m.steps));
  m.load = MachineLoad();
  run_steps(w, cfg.vocab, tiny ? 3 : 1, abi, eng, &m);
  // Engine::check of the steps' entries, many times: a short, steady piece of work whose cost
  // (the NaN scan grows with the tap rows) the draft's noise would hide.
  m.checks = time_runs(400, 3600, [&](int64_t i) { eng.check_step(w, i, cfg.vocab); });
  m.load.stop();
  return m;
}

double us(double seconds) { return seconds * 1e6; }

nlohmann::json to_json(const Measured& m) {
  nlohmann::json j = {{"config", m.config},
          {"steps", m.steps},
          {"round", m.round},
          {"context", m.context},
          {"new_rows", "1-4"},
          {"threads", m.threads},
          {"tp", 1},
          {"allocations_per_step",
           {{"drafter", m.per_step(m.drafter)}, {"engine", m.per_step(m.engine)},
            {"abi", m.per_step(m.abi)}}},
          {"token_mismatches", m.mismatches},
          {"goal_us", 5.0},
          {"machine_load", m.load.to_json()}};
  put_figure(j, "drafter_us", m.drafter.seconds, 1e6);
  put_figure(j, "engine_us", m.engine.seconds, 1e6);
  put_figure(j, "abi_us", m.abi.seconds, 1e6);
  put_figure(j, "abi_minus_engine_us", m.abi_minus_engine, 1e6);
  put_figure(j, "engine_minus_drafter_us", m.engine_minus_drafter, 1e6);
  put_figure(j, "engine_check_us", m.checks, 1e6);
  return j;
}

void print_table(const std::vector<Measured>& all) {
  std::printf("%-34s %6s %5s %11s %11s %11s %22s %22s %9s %15s\n", "config", "steps", "ctx", "drafter us",
              "engine us", "C ABI us", "C ABI-engine us", "engine-drafter us", "check us", "allocs d/e/abi");
  for (const Measured& m : all) {
    auto spread = [](const SampleSummary& s) {
      return fmt::format("{:.2f} [{:.1f}, {:.1f}]", us(s.median()), us(s.quantile(0.1)), us(s.quantile(0.9)));
    };
    std::printf("%-34s %6lld %5lld %11.1f %11.1f %11.1f %22s %22s %9.2f %5.1f/%4.1f/%4.1f\n", m.config.c_str(),
                static_cast<long long>(m.steps), static_cast<long long>(m.context), us(m.drafter.seconds.median()),
                us(m.engine.seconds.median()), us(m.abi.seconds.median()), spread(m.abi_minus_engine).c_str(),
                spread(m.engine_minus_drafter).c_str(), us(m.checks.median()),
                m.per_step(m.drafter), m.per_step(m.engine), m.per_step(m.abi));
  }
  std::printf("(medians per step; differences: median [p10, p90] over rounds of the difference of the rounds' "
              "median steps; goal: C ABI - engine <= 5 us)\n");
  for (const Measured& m : all) std::printf("%s: machine %s\n", m.config.c_str(), m.load.describe().c_str());
}

}  // namespace
}  // namespace tpdraft::bench

int main(int argc, char** argv) {
  using namespace tpdraft::bench;
  Args a;
  CLI::App app{"What one tpdraft_step costs through the C ABI beyond the draft itself", "step_overhead"};
  app.add_option("--config", a.configs, "Drafter config.json (repeatable; default tiny-dflash2 and "
                                        "bench-dflash2-2048)");
  app.add_option("--steps", a.steps, "Steps per way (0: 6000 on a tiny geometry, 40 on a large one)");
  app.add_option("--context", a.context, "Context kept per step (0: 64 on a tiny geometry, 1024 on a large one)");
  app.add_option("--threads", a.threads, "Threads")->capture_default_str();
  return bench_main(app, argc, argv, [&] {
    if (a.configs.empty()) a.configs = {"configs/tiny-dflash2.json", "configs/bench-dflash2-2048.json"};
    std::vector<Measured> all;
    for (const std::string& c : a.configs) all.push_back(measure(c, a));
    print_table(all);
    for (const Measured& m : all) std::printf("%s\n", to_json(m).dump().c_str());
    for (const Measured& m : all)
      if (m.mismatches > 0) std::fprintf(stderr, "%s: %lld steps drafted different tokens\n", m.config.c_str(),
                                         static_cast<long long>(m.mismatches));
    return 0;
  });
}
