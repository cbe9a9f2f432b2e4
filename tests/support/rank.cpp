#include "support/rank.h"

#include "support/test_support.h"

namespace tpdraft::testing {

model::RuntimeOptions backend(const std::string& name, int threads) {
  model::RuntimeOptions o;
  o.backend = name;
  o.threads = threads;
  return o;
}

std::unique_ptr<model::RankRuntime> open_rank(parallel::Communicator& group, const std::string& ckpt,
                                              const model::DrafterConfig& cfg, const model::RuntimeOptions& options) {
  const model::ModelSource source{cfg, model::TensorStore::open(ckpt + "/drafter"),
                                  model::TensorStore::open(ckpt + "/target")};
  return std::make_unique<model::RankRuntime>(source, group, options);
}

model::DrafterConfig eight_heads_over_two(const std::string& file) {
  model::DrafterConfig c = model::DrafterConfig::from_file(source_path("configs/" + file));
  c.n_q = 8;
  c.n_kv = 2;
  c.head_dim = 8;
  c.ffn = 96;
  return c;
}

}  // namespace tpdraft::testing
