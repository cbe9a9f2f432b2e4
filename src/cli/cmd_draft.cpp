// `tpdraft draft`: settle a taps file, draft one block, print the tokens as JSON; --dump writes
// every intermediate a reference needs to check the draft.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "cli/commands.h"
#include "cli/job.h"
#include "cli/options.h"
#include "cli/ranks.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/runtime.h"

namespace tpdraft::cli {

namespace {

struct DraftOpts {
  std::string drafter, target, taps, dump;
  int64_t anchor = 0;
  model::SamplingParams sampling;  // --temperature, --top-k, --top-p, --seed
  RankOptions ranks;
};

// The tap rows of a taps file, read in place from the mapping when they are aligned f32 (no
// copy: a long context's rows are the largest input a rank holds), else converted to f32. Only a
// group's rank 0 reads the rows (`rows`): its step sends them to the others.
struct Taps {
  std::shared_ptr<model::TensorStore> store;
  const model::TensorInfo* info = nullptr;
  std::vector<float> converted;
  const float* rows = nullptr;
  int64_t n = 0;
};

Taps read_taps(const std::string& path, const model::DrafterConfig& cfg, bool rows) {
  Taps taps;
  taps.store = model::TensorStore::open(path);
  const model::TensorInfo* t = taps.store->find("taps");
  const int64_t width = checked_mul(cfg.n_taps(), cfg.hidden, "{}: taps row width T*H", path);
  TPDRAFT_CHECK(t != nullptr, "{}: no tensor 'taps' (expected [N, T*H] = [N, {}])", path, width);
  TPDRAFT_CHECK(t->shape.size() == 2 && t->shape[1] == width,
                "{}: tensor 'taps' has shape {}, expected [N, T*H] = [N, {}] ({} taps x hidden {})", path,
                t->shape_str(), width, cfg.n_taps(), cfg.hidden);
  taps.info = t;
  taps.n = t->shape[0];
  if (!rows) return taps;
  if (t->dtype == DType::F32 && reinterpret_cast<uintptr_t>(t->data) % alignof(float) == 0) {
    taps.rows = reinterpret_cast<const float*>(t->data);
  } else {
    taps.converted = model::to_f32(*t);
    taps.rows = taps.converted.data();
  }
  return taps;
}

// --dump is written last, after the draft: check first that it can be, so that a bad path
// fails before the work. Never replaces what is not a regular file (a device, a link, a pipe).
void check_dump_destination(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0)
    TPDRAFT_CHECK(S_ISREG(st.st_mode), "--dump {}: exists and is not a regular file; refusing to replace it", path);
  const std::string probe = path + ".tmp";
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TPDRAFT_CHECK(fd >= 0, "--dump {}: cannot write there: {}", path, std::strerror(errno));
  close(fd);
  unlink(probe.c_str());
}

// Everything a rank loads and checks before drafting; every rank meets its errors alike. The
// draft is one step of the group, as a library caller's would be: one session, every tap row
// of the file settled, one block drafted from the anchor. The session is opened on every rank's
// engine here (the same id everywhere, as the group would open it), so that rank 0's check of
// the step is an input error the ranks agree on before the group runs.
struct Prepared {
  model::ModelSource source;
  Taps taps;
  std::unique_ptr<engine::Engine> engine;
  engine::StepEntry entry;
};

void load(const DraftOpts& o, const RankContext& ctx, Prepared* p) {
  if (!o.dump.empty() && ctx.leader()) check_dump_destination(o.dump);
  p->source = model::ModelSource::open(o.drafter, o.target);
  apply_load_options(p->source, o.ranks);
  p->taps = read_taps(o.taps, p->source.config, ctx.comm.rank() == 0);
  fault_point(ctx, "load");
}

void prepare(const DraftOpts& o, const RankContext& ctx, Prepared* p) {
  model::RuntimeOptions ro = runtime_options(o.ranks, ctx);
  ro.limits.max_context = std::max<int64_t>(1, p->taps.n);
  ro.limits.keep_all_positions = !o.dump.empty();
  ro.graphs = model::GraphMode::Off;  // one draft: nothing would replay a capture
  p->engine = std::make_unique<engine::Engine>(p->source, ctx.comm, ro, 1);
  engine::StepEntry& e = p->entry;
  e.session = p->engine->open_session();
  e.p0 = 0;
  e.n_new = p->taps.n;
  e.taps = {p->taps.rows, DType::F32, false, nullptr};
  e.anchor = o.anchor;
  e.sampling = o.sampling;
  if (ctx.comm.rank() == 0) p->engine->check({e});
}

void write_dump(const DraftOpts& o, const model::DrafterConfig& cfg, int64_t n, const engine::StepDump& dump,
                const model::DraftResult& result) {
  const int64_t B = cfg.block, H = cfg.hidden, N = cfg.head_vocab();
  model::SafetensorsWriter w;
  w.add("hidden", DType::F32, {B, H}, dump.draft.hidden.data(), dump.draft.hidden.size() * sizeof(float));
  // Over a draft vocabulary: its N columns in ascending target id, and those ids.
  w.add("logits", DType::F32, {B - 1, N}, dump.draft.logits.data(), dump.draft.logits.size() * sizeof(float));
  if (!dump.draft.logit_ids.empty())
    w.add("logit_ids", DType::I64, {N}, dump.draft.logit_ids.data(), dump.draft.logit_ids.size() * sizeof(int64_t));
  w.add("tokens", DType::I64, {B - 1}, result.tokens.data(), result.tokens.size() * sizeof(int64_t));
  for (int64_t l = 0; l < cfg.layers; ++l) {
    const std::vector<float>& k = dump.k[static_cast<size_t>(l)];
    const std::vector<float>& v = dump.v[static_cast<size_t>(l)];
    w.add("context_k." + std::to_string(l), DType::F32, {n, cfg.n_kv, cfg.head_dim}, k.data(), k.size() * sizeof(float));
    w.add("context_v." + std::to_string(l), DType::F32, {n, cfg.n_kv, cfg.head_dim}, v.data(), v.size() * sizeof(float));
  }
  w.write(o.dump);
  TPDRAFT_LOG_INFO("wrote {}", o.dump);
}

void run_draft_on_rank(const DraftOpts& o, const RankContext& ctx) {
  Prepared p;
  agree_on(ctx.world, kExitInput, [&] { load(o, ctx, &p); });
  // The sampling options against this checkpoint (top-k and top-p do not apply to a DFlash 2
  // drafter): the command line's error, not the input's. (Token 0 is an anchor every drafter takes.)
  agree_on(ctx.world, kExitUsage, [&] { model::Drafter::check_request(p.source.config, 0, o.sampling); });
  agree_on(ctx.world, kExitInput, [&] { prepare(o, ctx, &p); });
  drive_group(ctx, *p.engine, [&](engine::Group* group) {
    if (group == nullptr) return;
    model::RankRuntime& rt = group->leader().runtime();
    engine::StepDump dump;
    dump.context = true;
    const auto results = group->apply({p.entry}, o.dump.empty() ? nullptr : &dump);
    model::release_pages(*p.taps.info);  // settled: the mapped rows are no longer needed
    const engine::StepTimes& st = group->leader().last_times();
    const model::DraftTimes& t = rt.drafter().last_times();
    // microseconds are all a single timing can tell
    const double step_ms = std::round((st.settle + st.draft) * 1e6) / 1000;
    const double draft_ms = std::round((t.layers + t.head + t.select) * 1e6) / 1000;
    if (!o.dump.empty() && ctx.leader()) write_dump(o, rt.config(), p.taps.n, dump, results[0]);
    // The other replicas drafted the same block: each group's rank 0 logs its tokens (the first
    // prints them below), so that a run across machines shows every replica's.
    if (ctx.replicas > 1)
      TPDRAFT_LOG_INFO("replica {} of {} drafted tokens {}", ctx.replica, ctx.replicas,
                       nlohmann::json(results[0].tokens).dump());
    if (!ctx.leader()) return;  // results are printed last, and only once all of it succeeded
    const nlohmann::json out = {{"tokens", results[0].tokens}, {"probs", results[0].probs}, {"anchor", o.anchor},
                                {"anchor_position", p.taps.n}, {"architecture", rt.config().arch_name},
                                {"tp", group->caps().tp}, {"backend", rt.ops().name()},
                                {"settle_ms", std::max(0.0, step_ms - draft_ms)}, {"draft_ms", draft_ms}};
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  });
}

}  // namespace

void add_draft(CLI::App& app) {
  auto o = std::make_shared<DraftOpts>();
  CLI::App* cmd = app.add_subcommand(
      "draft", "Settle every row of a taps file at positions 0..n-1, draft one block with the anchor at position n, "
               "print JSON {\"tokens\": [...], ...}");
  cmd->add_option("--drafter", o->drafter, "Drafter directory (config.json + safetensors)")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--target", o->target, "Target model directory (embedding + head)")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--taps", o->taps, "Safetensors file with tensor 'taps' [n, T*H]")->required()->check(CLI::ExistingFile);
  cmd->add_option("--anchor", o->anchor, "The last committed token (sits at position n)")
      ->required()
      ->check(whole_number(0));
  add_sampling_options(cmd, &o->sampling);
  cmd->add_option("--seed", o->sampling.seed, "Seed of the sampling noise")->check(seed_number());
  add_rank_options(cmd, &o->ranks);
  cmd->add_option("--dump", o->dump, "Write hidden, logits, tokens and every layer's context K/V to this safetensors file");
  cmd->callback([o] { run_ranks(o->ranks, [&](const RankContext& ctx) { run_draft_on_rank(*o, ctx); }); });
}

}  // namespace tpdraft::cli
