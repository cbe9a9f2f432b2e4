// `tpdraft info`: what a checkpoint is (architecture, geometry, parameters, memory, tensors) and,
// with --tp, what each rank would hold.
#include <cstdio>
#include <map>
#include <string>

#include "cli/commands.h"
#include "cli/job.h"
#include "cli/options.h"
#include "core/error.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/shard_plan.h"
#include "model/weights.h"

namespace tpdraft::cli {

namespace {

struct InfoOpts {
  std::string drafter, target;
  int tp = 1;
  bool tensors = false;
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", b, units[u]);
}

// Bytes of a tensor that rank r holds under the plan: sharded matrices by their split, the rest whole.
double rank_bytes(const std::string& name, const model::TensorInfo& t, const model::DrafterConfig& c,
                  const model::ShardPlan& p, bool* sharded) {
  const double full = static_cast<double>(t.nbytes);
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  *sharded = true;
  if (has("q_proj")) return full * static_cast<double>(p.q_heads.size()) / static_cast<double>(c.n_q);
  if (has("k_proj") || has("v_proj")) return full * static_cast<double>(p.kv_heads.size()) / static_cast<double>(c.n_kv);
  if (has("o_proj.weight")) return full * static_cast<double>(p.q_heads.size()) / static_cast<double>(c.n_q);
  if (has("gate_proj") || has("up_proj") || has("down_proj"))
    return full * static_cast<double>(p.ffn.size()) / static_cast<double>(c.ffn);
  *sharded = false;
  if (has("_codebook")) return 0;  // host-mapped, never copied
  return full;
}

void run_info(const InfoOpts& o) {
  const model::DrafterConfig cfg = model::DrafterConfig::from_file(o.drafter + "/config.json");
  auto store = model::TensorStore::open(o.drafter);
  std::printf("drafter     %s (%s)\n", o.drafter.c_str(), cfg.arch_name.c_str());
  std::printf("geometry    H %lld, L %lld, heads %lld/%lld x %lld, F %lld, V %lld, B %lld, taps %lld [",
              static_cast<long long>(cfg.hidden), static_cast<long long>(cfg.layers), static_cast<long long>(cfg.n_q),
              static_cast<long long>(cfg.n_kv), static_cast<long long>(cfg.head_dim), static_cast<long long>(cfg.ffn),
              static_cast<long long>(cfg.vocab), static_cast<long long>(cfg.block), static_cast<long long>(cfg.n_taps()));
  for (size_t i = 0; i < cfg.taps.size(); ++i) std::printf("%s%lld", i ? ", " : "", static_cast<long long>(cfg.taps[i]));
  std::printf("]\n");
  std::printf("attention  ");
  for (int64_t l = 0; l < cfg.layers; ++l)
    std::printf(" %s%s", cfg.sliding[static_cast<size_t>(l)] ? fmt::format("sliding({})", cfg.window).c_str() : "full",
                cfg.causal[static_cast<size_t>(l)] ? "/causal" : "");
  std::printf("\n");
  if (cfg.is_dflash2())
    std::printf("dflash2     conv K %lld, group %lld (G %lld); selector rank %lld, top-k %lld\n",
                static_cast<long long>(cfg.conv_kernel), static_cast<long long>(cfg.conv_group),
                static_cast<long long>(cfg.conv_groups()), static_cast<long long>(cfg.selector_rank),
                static_cast<long long>(cfg.selector_topk));
  std::printf("head        m_in %g, m_out %g, soft cap %g, mask token %lld, bias %s\n", cfg.in_scale, cfg.out_scale,
              cfg.softcap, static_cast<long long>(cfg.mask_token), cfg.bias ? "yes" : "no");

  double params = 0, bytes = 0;
  std::map<std::string, double> by_dtype;
  for (const auto& name : store->names()) {
    const model::TensorInfo* t = store->find(name);
    params += static_cast<double>(t->numel());
    bytes += static_cast<double>(t->nbytes);
    by_dtype[dtype_name(t->dtype)] += static_cast<double>(t->nbytes);
  }
  std::printf("parameters  %.3f M in %zu tensors, %s", params / 1e6, store->names().size(), human_bytes(bytes).c_str());
  for (const auto& [d, b] : by_dtype) std::printf("  [%s %s]", d.c_str(), human_bytes(b).c_str());
  std::printf("\n");

  double head_bytes = 0;
  if (!o.target.empty()) {
    auto target = model::TensorStore::open(o.target);
    const model::TargetConfig tc = model::TargetConfig::from_dir(o.target);
    const model::TensorInfo* embed = target->find("embed_tokens.weight");
    TPDRAFT_CHECK(embed != nullptr, "{}: target tensor 'model.embed_tokens.weight' is missing", o.target);
    const model::TensorInfo* head = target->find("lm_head.weight");
    const bool tied = tc.tie_word_embeddings || head == nullptr;
    if (tied) head = embed;
    std::printf("target      %s: embedding %s %s, head %s%s (tokens drawn from the first %lld rows)\n", o.target.c_str(),
                embed->shape_str().c_str(), dtype_name(embed->dtype), head->shape_str().c_str(),
                tied ? " (tied)" : "", static_cast<long long>(cfg.vocab));
    head_bytes = static_cast<double>(cfg.vocab) * static_cast<double>(head->cols()) * static_cast<double>(dtype_size(head->dtype));
  }

  for (int r = 0; r < o.tp; ++r) {
    const auto plan = model::ShardPlan::make(cfg, r, o.tp);
    double sharded = 0, replicated = 0;
    for (const auto& name : store->names()) {
      bool is_sharded = false;
      const double b = rank_bytes(name, *store->find(name), cfg, plan, &is_sharded);
      (is_sharded ? sharded : replicated) += b;
    }
    const double head_share = head_bytes * static_cast<double>(plan.vocab.size()) / static_cast<double>(cfg.vocab);
    const double ctx = static_cast<double>(cfg.layers) * 2 * static_cast<double>(plan.kv_heads.size() * cfg.head_dim) * 4;
    std::printf("rank %d/%d    sharded %s + head %s + replicated %s = %s; context %s per position  (%s)\n", r, o.tp,
                human_bytes(sharded).c_str(), human_bytes(head_share).c_str(), human_bytes(replicated).c_str(),
                human_bytes(sharded + head_share + replicated).c_str(), human_bytes(ctx).c_str(),
                plan.describe().c_str());
  }
  if (o.tensors) {
    for (const auto& name : store->names()) {
      const model::TensorInfo* t = store->find(name);
      std::printf("  %-56s %-5s %s\n", name.c_str(), dtype_name(t->dtype), t->shape_str().c_str());
    }
  }
}

}  // namespace

void add_info(CLI::App& app) {
  auto o = std::make_shared<InfoOpts>();
  CLI::App* cmd = app.add_subcommand("info", "Describe a drafter checkpoint: architecture, geometry, parameters, "
                                             "memory, tensors; with --tp N, what each rank holds");
  cmd->add_option("--drafter", o->drafter, "Drafter directory")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--target", o->target, "Target directory (embedding + head)")->check(CLI::ExistingDirectory);
  cmd->add_option("--tp", o->tp, "Tensor-parallel size to plan for")->capture_default_str()->check(whole_number(1));
  cmd->add_flag("--tensors", o->tensors, "List every tensor");
  cmd->callback([o] { run_alone([&] { run_info(*o); }); });
}

}  // namespace tpdraft::cli
