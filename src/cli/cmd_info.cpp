// `tpdraft info`: what a checkpoint (or a bare config.json) is: architecture, geometry,
// parameters, memory, tensors; with --tp, what each rank holds; with --json, one object with
// the cost model's bytes, work and collectives per rank (bench/scaling reads it).
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/config.h"
#include "checkpoint/quant_tensors.h"
#include "checkpoint/safetensors.h"
#include "cli/commands.h"
#include "cli/job.h"
#include "cli/options.h"
#include "core/checked.h"
#include "core/error.h"
#include "engine/runtime.h"
#include "model/cost.h"
#include "model/draft_vocab.h"
#include "model/shard_plan.h"
#include "model/weights.h"

namespace tpdraft::cli {

namespace {

struct InfoOpts {
  std::string drafter, config, target, dtype = "bf16", quant, token_map;
  int tp = 1;
  int64_t sessions = 1, ctx = 1024, token_map_size = 0;
  bool tensors = false, json = false;
};

// What the numbers are computed from: a checkpoint's tensors, or a config's expected shapes
// with an assumed dtype.
struct Source {
  std::string path;
  model::DrafterConfig cfg;
  std::shared_ptr<model::TensorStore> store;  // null for a bare config
  DType assumed = DType::BF16;
  DType head_dtype = DType::BF16;
  bool head_from_target = false;  // head_dtype is a file's (the target's, or the drafter's own head)
  std::string target_line;  // what the target holds, for the text output
  std::string vocab_line;   // where a draft vocabulary comes from, for the text output

  DType dtype_of(const std::string& name) const {
    if (!store) return assumed;
    const model::TensorInfo* t = store->find(name);
    if (t == nullptr) t = store->find(name + ".weight");  // codebooks may carry the suffix
    TPDRAFT_CHECK(t != nullptr, "{}: tensor '{}' is missing", path, name);
    return t->dtype;
  }
  // How a drafter tensor is held: its scheme when quantized, else its dtype.
  std::string format_of(const std::string& name) const {
    const model::QuantScheme q = cfg.quant.scheme_for(name);
    return q.quantized() ? q.describe() : dtype_name(dtype_of(name));
  }
  // Bytes per element of the streamed matrices (the first layer's q projection; quantized:
  // packed values plus their f32 scales).
  double weight_bytes() const {
    const std::string q = "layers.0.self_attn.q_proj.weight";
    const model::QuantScheme s = cfg.quant.scheme_for(q);
    if (!s.quantized()) return static_cast<double>(dtype_size(dtype_of(q)));
    const double n = static_cast<double>(cfg.n_q * cfg.head_dim) * static_cast<double>(cfg.hidden);
    return static_cast<double>(model::quantized_share_bytes(s, cfg.n_q * cfg.head_dim, cfg.hidden)) / n;
  }
  // What a rank of `plan` holds.
  model::RankMemory memory(const model::ShardPlan& plan) const {
    return model::rank_memory(cfg, plan, [this](const std::string& n) { return dtype_of(n); }, head_dtype);
  }
};

void read_target(const std::string& dir, Source* src) {
  auto target = model::TensorStore::open(dir);
  const model::TargetConfig tc = model::TargetConfig::from_dir(dir);
  const model::TensorInfo* embed = target->find("embed_tokens.weight");
  TPDRAFT_CHECK(embed != nullptr, "{}: target tensor 'model.embed_tokens.weight' is missing", dir);
  const model::TensorInfo* head = target->find("lm_head.weight");
  const bool tied = tc.tie_word_embeddings || head == nullptr;
  if (tied) head = embed;
  src->head_dtype = head->dtype;
  src->head_from_target = true;
  src->target_line = fmt::format("{}: embedding {} {}, head {}{} (tokens drawn from the first {} rows)", dir,
                                 embed->shape_str(), dtype_name(embed->dtype), head->shape_str(),
                                 tied ? " (tied)" : "", src->cfg.vocab);
}

Source open_source(const InfoOpts& o) {
  TPDRAFT_CHECK(o.drafter.empty() != o.config.empty(), "info: give --drafter DIR (a checkpoint) or --config FILE "
                                                       "(a bare config.json), not both");
  Source src;
  src.assumed = weight_dtype(o.dtype);
  src.head_dtype = src.assumed;
  src.path = o.drafter.empty() ? o.config : o.drafter;
  src.cfg = model::DrafterConfig::from_file(o.drafter.empty() ? o.config : o.drafter + "/config.json");
  if (!o.drafter.empty()) src.store = model::TensorStore::open(o.drafter);
  if (!o.target.empty()) read_target(o.target, &src);
  // A speculators drafter's own head is the one it drafts with.
  if (const model::TensorInfo* own = src.store && src.cfg.layout == model::Layout::Speculators
                                         ? src.store->find("lm_head.weight")
                                         : nullptr) {
    src.head_dtype = own->dtype;
    src.head_from_target = true;
    if (!src.target_line.empty()) src.target_line += "; the drafter's own head replaces this one";
  }
  TPDRAFT_CHECK(o.token_map.empty() || o.token_map_size == 0, "info: give --token-map FILE or --token-map-size N, not "
                "both");
  if (src.cfg.draft_vocab > 0) src.vocab_line = fmt::format("{} (speculators d2t)", src.path);
  if (!o.token_map.empty() || o.token_map_size > 0) {
    TPDRAFT_CHECK(src.cfg.draft_vocab == 0, "{}: the checkpoint has a draft vocabulary of its own ({} tokens); a token "
                  "map restricts a full head", src.path, src.cfg.draft_vocab);
    const int64_t n = o.token_map.empty() ? o.token_map_size
                                          : static_cast<int64_t>(model::read_token_map(o.token_map, src.cfg.vocab).size());
    src.cfg.draft_vocab = n;
    src.cfg.validate(o.token_map.empty() ? fmt::format("--token-map-size {}", n) : o.token_map);
    src.vocab_line = o.token_map.empty() ? "--token-map-size" : "token map " + o.token_map;
  }
  if (!o.quant.empty()) src.cfg.quant = model::quantization_on_load(src.cfg, o.quant, src.path);
  return src;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  for (; b >= 1024 && u < 4; ++u) b /= 1024;
  return fmt::format("{:.2f} {}", b, units[u]);
}

void print_geometry(const Source& src) {
  const model::DrafterConfig& cfg = src.cfg;
  std::printf("drafter     %s (%s)%s\n", src.path.c_str(), cfg.arch_name.c_str(),
              src.store ? "" : fmt::format(", no checkpoint: {} assumed", dtype_name(src.assumed)).c_str());
  fmt::print("geometry    H {}, L {}, heads {}/{} x {}, F {}, V {}, B {}, taps {} [{}]\n", cfg.hidden, cfg.layers,
             cfg.n_q, cfg.n_kv, cfg.head_dim, cfg.ffn, cfg.vocab, cfg.block, cfg.n_taps(), fmt::join(cfg.taps, ", "));
  std::string attention;
  for (int64_t l = 0; l < cfg.layers; ++l)
    attention += fmt::format(" {}{}", cfg.sliding[static_cast<size_t>(l)] ? fmt::format("sliding({})", cfg.window) : "full",
                             cfg.causal[static_cast<size_t>(l)] ? "/causal" : "");
  std::printf("attention  %s\n", attention.c_str());
  if (cfg.is_dflash2())
    fmt::print("dflash2     conv K {}, group {} (G {}); selector rank {}, top-k {}\n", cfg.conv_kernel,
               cfg.conv_group, cfg.conv_groups(), cfg.selector_rank, cfg.selector_topk);
  std::printf("head        m_in %g, m_out %g, soft cap %g, mask token %lld, bias %s\n", cfg.in_scale, cfg.out_scale,
              cfg.softcap, static_cast<long long>(cfg.mask_token), cfg.bias ? "yes" : "no");
  if (cfg.draft_vocab > 0)
    fmt::print("draft vocab {} of the {} target ids ({:.1f}%; {}): the head holds {} rows\n", cfg.draft_vocab, cfg.vocab,
               100.0 * static_cast<double>(cfg.draft_vocab) / static_cast<double>(cfg.vocab), src.vocab_line,
               cfg.draft_vocab);
}

// Parameters and bytes of every drafter tensor: the checkpoint's, or the expected ones.
void print_parameters(const Source& src) {
  double params = 0, bytes = 0;
  size_t count = 0;
  std::map<std::string, double> by_dtype;
  auto add = [&](const std::vector<int64_t>& shape, DType dtype) {
    double n = 1;
    for (int64_t d : shape) n *= static_cast<double>(d);
    params += n;
    bytes += n * static_cast<double>(dtype_size(dtype));
    by_dtype[dtype_name(dtype)] += n * static_cast<double>(dtype_size(dtype));
    ++count;
  };
  if (src.store) {
    for (const auto& name : src.store->names()) add(src.store->find(name)->shape, src.store->find(name)->dtype);
  } else {
    for (const auto& [name, shape] : model::expected_drafter_tensors(src.cfg)) add(shape, src.assumed);
  }
  std::printf("parameters  %.3f M in %zu tensors, %s", params / 1e6, count, human_bytes(bytes).c_str());
  for (const auto& [d, b] : by_dtype) std::printf("  [%s %s]", d.c_str(), human_bytes(b).c_str());
  std::printf("\n");
  if (!src.target_line.empty()) std::printf("target      %s\n", src.target_line.c_str());
}

// Every drafter tensor a rank loads into backend memory: its format and the bytes each rank holds.
void print_shares(const Source& src, const std::vector<model::ShardPlan>& plans) {
  const std::string ranks = plans.size() > 1 ? ", ranks 0.." + std::to_string(plans.size() - 1) : "";
  std::printf("tensor shares (format, shape, bytes per rank%s)\n", ranks.c_str());
  for (const auto& [name, shape] : model::expected_drafter_tensors(src.cfg)) {
    std::string bytes;
    for (const auto& plan : plans) {
      const model::TensorShare share = model::tensor_share(src.cfg, plan, name, shape);
      const model::QuantScheme q = src.cfg.quant.scheme_for(name);
      const bool mapped = share.placement == model::Placement::HostMapped;
      const size_t b = mapped ? 0
                       : q.quantized() ? model::quantized_share_bytes(q, share.rows.size(), share.cols.size())
                                       : share.backend_bytes(src.dtype_of(name));
      bytes += (bytes.empty() ? "" : " / ") + (mapped ? std::string("mapped") : human_bytes(static_cast<double>(b)));
    }
    std::printf("  %-52s %-17s %s  %s\n", name.c_str(), src.format_of(name).c_str(), shape_string(shape).c_str(),
                bytes.c_str());
  }
}

void print_ranks(const Source& src, const std::vector<model::ShardPlan>& plans) {
  for (const model::ShardPlan& plan : plans) {
    const model::RankMemory m = src.memory(plan);
    const std::string assumed = src.head_from_target || src.cfg.quant.head.quantized() ? "" : fmt::format(" ({} assumed)", dtype_name(src.head_dtype));
    const std::string head = human_bytes(m.head) + assumed;
    std::printf("rank %d/%d    sharded %s + head %s + replicated %s = %s; context %s per position  (%s)\n", plan.rank, plan.tp,
                human_bytes(m.sharded).c_str(), head.c_str(), human_bytes(m.replicated).c_str(),
                human_bytes(m.total()).c_str(),
                human_bytes(static_cast<double>(model::context_bytes_per_position(src.cfg, plan))).c_str(),
                plan.describe().c_str());
  }
}

nlohmann::json range_json(const model::Range& r) { return nlohmann::json::array({r.begin, r.end}); }

nlohmann::json collectives_json(const model::DraftCollectives& d) {
  auto one = [](const model::CollectiveCount& c) { return nlohmann::json{{"calls", c.calls}, {"bytes", c.bytes}}; };
  return {{"all_reduce", one(d.all_reduce)}, {"all_gather", one(d.all_gather)}, {"broadcast", one(d.broadcast)}};
}

nlohmann::json work_json(const model::WorkCount& w) {
  return {{"flops", w.flops}, {"weight_bytes", w.weight_bytes}, {"context_bytes", w.context_bytes}, {"bytes", w.bytes()}};
}

// One rank's plan, memory, work per draft and per settled row, and collectives per draft.
nlohmann::json rank_json(const Source& src, const InfoOpts& o, const model::ShardPlan& plan) {
  const model::DrafterConfig& cfg = src.cfg;
  const model::RankMemory m = src.memory(plan);
  const double wb = src.weight_bytes();
  const model::WorkCount settle = model::settle_work(cfg, plan, 1, wb);
  model::WorkCount draft = model::draft_work(cfg, plan, o.sessions, o.ctx, wb);
  if (cfg.quant.any()) {
    const DType dense = src.store ? src.head_dtype : src.assumed;
    draft.weight_bytes = model::draft_weight_bytes(cfg, plan, dense, src.head_dtype);
  }
  const model::SamplingParams sampled{1.0};  // temperature 1, no top-k / top-p
  return {
      {"rank", plan.rank},
      {"plan", {{"q_heads", range_json(plan.q_heads)}, {"kv_heads", range_json(plan.kv_heads)},
                {"ffn", range_json(plan.ffn)}, {"vocab", range_json(plan.vocab)}}},
      {"bytes", {{"sharded", m.sharded}, {"head", m.head}, {"replicated", m.replicated}, {"total", m.total()},
                 {"context_per_position", model::context_bytes_per_position(cfg, plan)}}},
      {"draft", work_json(draft)},
      {"settle", {{"flops_per_row", settle.flops}, {"context_bytes_per_row", settle.context_bytes},
                  {"weight_bytes_per_forward", settle.weight_bytes}}},
      {"collectives", {{"greedy", collectives_json(model::draft_collectives(cfg, plan, o.sessions, {}))},
                       {"sampled", collectives_json(model::draft_collectives(cfg, plan, o.sessions, sampled))},
                       {"greedy_gather_logits",
                        collectives_json(model::draft_collectives(cfg, plan, o.sessions, {}, true))}}},
  };
}

nlohmann::json geometry_json(const model::DrafterConfig& c) {
  return {{"hidden", c.hidden}, {"layers", c.layers}, {"q_heads", c.n_q}, {"kv_heads", c.n_kv},
          {"head_dim", c.head_dim}, {"ffn", c.ffn}, {"vocab", c.vocab}, {"draft_vocab", c.draft_vocab},
          {"head_rows", c.head_vocab()}, {"block", c.block}, {"taps", c.taps},
          {"sliding", c.sliding}, {"causal", c.causal}, {"window", c.window}, {"conv_kernel", c.conv_kernel},
          {"conv_group", c.conv_group}, {"selector_rank", c.selector_rank}, {"selector_top_k", c.selector_topk}};
}

void print_json(const Source& src, const InfoOpts& o, const std::vector<model::ShardPlan>& plans) {
  nlohmann::json j = {
      {"source", src.store ? "checkpoint" : "config"}, {"path", src.path}, {"architecture", src.cfg.arch_name},
      {"layout", src.cfg.layout == model::Layout::Speculators ? "speculators" : "dflash"},
      {"dflash2", src.cfg.is_dflash2()}, {"geometry", geometry_json(src.cfg)}, {"tp", o.tp},
      {"vocab_padded", plans[0].vocab_padded}, {"sessions", o.sessions}, {"context", o.ctx},
      {"weight_dtype", src.format_of("layers.0.self_attn.q_proj.weight")},
      {"head_dtype", dtype_name(src.head_dtype)}, {"head_dtype_assumed", !src.head_from_target},
      {"head_format", src.cfg.quant.head.quantized() ? src.cfg.quant.head.describe() : dtype_name(src.head_dtype)},
      {"sampled_mode", "temperature > 0, no top-k / top-p"}};
  for (const model::ShardPlan& plan : plans) j["ranks"].push_back(rank_json(src, o, plan));
  std::printf("%s\n", j.dump().c_str());
}

void run_info(const InfoOpts& o) {
  const Source src = open_source(o);
  // Every rank's plan: a tp the geometry cannot take is refused before anything is printed.
  std::vector<model::ShardPlan> plans;
  for (int r = 0; r < o.tp; ++r) plans.push_back(model::ShardPlan::make(src.cfg, r, o.tp));
  if (o.json) {
    print_json(src, o, plans);
    return;
  }
  print_geometry(src);
  print_parameters(src);
  if (src.cfg.quant.any()) {
    std::map<std::string, int> formats;
    for (const auto& [name, shape] : model::expected_drafter_tensors(src.cfg))
      if (src.cfg.quant.scheme_for(name).quantized()) ++formats[src.cfg.quant.scheme_for(name).describe()];
    std::string list;
    for (const auto& [f, n] : formats) list += fmt::format("{}{} x {}", list.empty() ? "" : ", ", n, f);
    if (src.cfg.quant.head.quantized()) list += ", head " + src.cfg.quant.head.describe();
    const std::string how = src.cfg.quant.source == model::QuantConfig::Source::OnLoad
                                ? "while loading, --quant " + o.quant
                                : "quantization_config, " + src.cfg.quant.format;
    std::printf("quantized   %s (%s)\n", list.c_str(), how.c_str());
  }
  print_ranks(src, plans);
  if (o.tensors) print_shares(src, plans);
}

}  // namespace

void add_info(CLI::App& app) {
  auto o = std::make_shared<InfoOpts>();
  CLI::App* cmd = app.add_subcommand("info", "Describe a drafter checkpoint or config: architecture, geometry, "
                                             "parameters, memory, tensors; with --tp N, what each rank holds; "
                                             "with --json, the cost model per rank");
  cmd->add_option("--drafter", o->drafter, "Drafter directory")->check(CLI::ExistingDirectory);
  cmd->add_option("--config", o->config, "A drafter config.json without a checkpoint (tensors of the expected "
                                         "shapes, in --dtype)")->check(CLI::ExistingFile);
  cmd->add_option("--target", o->target, "Target directory (embedding + head)")->check(CLI::ExistingDirectory);
  cmd->add_option("--dtype", o->dtype, "Weight dtype assumed where no file says (--config; the head without --target)")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}))->capture_default_str();
  cmd->add_option("--tp", o->tp, "Tensor-parallel size to plan for")->capture_default_str()->check(whole_number(1));
  cmd->add_option("--sessions", o->sessions, "Sessions per draft, for the work and collectives of --json")
      ->capture_default_str()->check(whole_number(1));
  cmd->add_option("--ctx", o->ctx, "Context positions per session, for the work of --json")
      ->capture_default_str()->check(whole_number(0));
  std::vector<std::string> stored_presets;  // a16 is left out: the cpu backend holds its weights in f32
  for (const auto& name : model::quant_presets())
    if (name.find("a16") == std::string::npos) stored_presets.push_back(name);
  cmd->add_option("--quant", o->quant, "Count the weights as --quant q8|q4|q8+head|q4+head would hold them (a float "
                  "checkpoint; an a8 preset holds the same; for a16 on the cpu backend, count --dtype f32 instead)")
      ->check(CLI::IsMember(stored_presets));
  cmd->add_option("--token-map", o->token_map, "Count the head as this token map cuts it (a JSON list of target ids "
                  "or a safetensors file with 'token_ids')")->check(CLI::ExistingFile);
  cmd->add_option("--token-map-size", o->token_map_size, "Count the head as a draft vocabulary of N target ids would "
                  "hold it (no file needed)")
      ->check(whole_number(1, model::size_limit("vocab_size")));
  cmd->add_flag("--tensors", o->tensors, "List every drafter tensor: its format, shape and the bytes each rank holds");
  cmd->add_flag("--json", o->json, "Print one JSON object: geometry, and per rank the bytes held, the work per draft "
                                   "and per settled row, and the collectives per draft");
  cmd->callback([o] { run_alone([&] { run_info(*o); }); });
}

}  // namespace tpdraft::cli
