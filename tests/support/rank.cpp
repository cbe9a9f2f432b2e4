#include "support/rank.h"

#include <vector>

#include "parallel/thread_comm.h"
#include "support/test_support.h"
#include "tools/random_checkpoint.h"

namespace tpdraft::testing {

void run_group(int n, const std::function<void(parallel::Communicator&)>& fn) {
  if (n != 1) return parallel::run_ranks(n, fn);
  const auto single = parallel::make_single_rank();
  fn(*single);
}

model::RuntimeOptions backend(const std::string& name, int threads) {
  model::RuntimeOptions o;
  o.backend = name;
  o.threads = threads;
  return o;
}

std::unique_ptr<model::RankRuntime> open_rank(parallel::Communicator& group, const std::string& ckpt,
                                              const model::DrafterConfig& cfg, const model::RuntimeOptions& options,
                                              const std::string& quant) {
  model::ModelSource source = model::ModelSource::from(cfg, model::TensorStore::open(ckpt + "/drafter"),
                                                       model::TensorStore::open(ckpt + "/target"));
  if (!quant.empty()) model::quantize_on_load(source, quant);
  return std::make_unique<model::RankRuntime>(source, group, options);
}

model::DrafterConfig shipped_config(const std::string& file) {
  return model::DrafterConfig::from_file(source_path("configs/" + file));
}

model::DrafterConfig eight_heads_over_two(const std::string& file) {
  model::DrafterConfig c = shipped_config(file);
  c.n_q = 8;
  c.n_kv = 2;
  c.head_dim = 8;
  c.ffn = 96;
  return c;
}

std::string write_checkpoint(const TempDir& dir, const model::DrafterConfig& cfg, DType dtype) {
  model::RandomCheckpointOptions o;
  o.seed = 5;
  o.dtype = dtype;
  o.target_vocab = cfg.vocab + 13;  // a padded head; V is not a multiple of 8 either
  o.threads = 2;
  model::write_random_checkpoint(cfg, dir.path(), o, 0);
  return dir.path();
}

ScenarioOutput run_scenario(parallel::Communicator& group, model::RuntimeOptions options, const std::string& ckpt,
                            const model::DrafterConfig& cfg, const Scenario& sc) {
  options.limits.max_sessions = static_cast<int64_t>(sc.contexts.size());
  const auto rt = open_rank(group, ckpt, cfg, options, sc.quant);
  model::Drafter& drafter = rt->drafter();
  std::vector<std::unique_ptr<model::Session>> sessions;
  std::vector<model::DraftRequest> reqs;
  for (size_t s = 0; s < sc.contexts.size(); ++s) {
    const int64_t n = sc.contexts[s];
    const auto taps = model::random_taps(cfg, n + 10, 50 + s);
    sessions.push_back(drafter.new_session());
    if (sc.rollback && n >= 4) {
      drafter.settle(*sessions.back(), 0, taps.data(), n + 3);
      drafter.rollback(*sessions.back(), n - 4);
      drafter.settle(*sessions.back(), n - 4, taps.data() + (n - 4) * cfg.n_taps() * cfg.hidden, 4);
    } else {
      drafter.settle(*sessions.back(), 0, taps.data(), n);
    }
    reqs.push_back({sessions.back().get(), static_cast<int64_t>(7 + 31 * s) % cfg.vocab,
                    sc.sampling[s % sc.sampling.size()]});
  }
  rt->comm().reset_stats();
  ScenarioOutput o;
  o.results = drafter.draft(reqs, sc.dump ? &o.dump : nullptr);
  o.stats = rt->comm().stats();
  o.comm = rt->comm().name();
  return o;
}

}  // namespace tpdraft::testing
