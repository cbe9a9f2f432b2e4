#include "support/draft_rounds.h"

#include <gtest/gtest.h>

#include <memory>

#include "engine/runtime.h"
#include "support/rank.h"
#include "tools/random_checkpoint.h"

namespace tpdraft::testing {

std::vector<DraftRound> run_draft_rounds(parallel::Communicator& group, const std::string& backend,
                                         const std::string& ckpt, const model::DrafterConfig& cfg, bool graphs,
                                         bool nccl) {
  model::RuntimeOptions ro = testing::backend(backend);
  ro.limits.max_sessions = 2;
  ro.limits.max_context = 160;
  ro.limits.settle_chunk = 32;
  ro.graphs = graphs ? model::GraphMode::On : model::GraphMode::Off;
  ro.nccl = nccl;
  const auto rt = open_rank(group, ckpt, cfg, ro);
  model::Drafter& drafter = rt->drafter();
  parallel::Communicator& comm = rt->comm();
  const int64_t row = cfg.n_taps() * cfg.hidden;
  const auto taps_a = model::random_taps(cfg, 150, 91), taps_b = model::random_taps(cfg, 150, 92);
  auto a = drafter.new_session(), b = drafter.new_session();
  auto settle_to = [&](model::Session& s, const std::vector<float>& taps, int64_t length) {
    drafter.settle(s, s.length(), taps.data() + s.length() * row, length - s.length());
  };
  settle_to(*a, taps_a, 40);
  settle_to(*b, taps_b, 70);
  model::SamplingParams sampled;  // DFlash 2 samples only over its selector's candidates
  if (!cfg.is_dflash2()) sampled.temperature = 0.8, sampled.seed = 3;
  std::vector<DraftRound> out;
  auto draft = [&](std::vector<model::DraftRequest> reqs) {
    DraftRound r;
    comm.reset_stats();
    r.results = drafter.draft(reqs, &r.dump);
    r.stats = comm.stats();
    r.replayed = drafter.last_times().replayed;
    r.segments = drafter.graph_segments(static_cast<int64_t>(reqs.size()));
    r.nodes = drafter.graph_nodes(static_cast<int64_t>(reqs.size()));
    out.push_back(std::move(r));
  };
  draft({{a.get(), 11, {}}, {b.get(), 12, sampled}});  // first with two sessions
  settle_to(*a, taps_a, 43);
  settle_to(*b, taps_b, 75);
  draft({{a.get(), 13, {}}, {b.get(), 14, sampled}});
  drafter.rollback(*a, 41);
  settle_to(*a, taps_a, 42);
  draft({{b.get(), 15, sampled}, {a.get(), 16, {}}});  // the sessions swap places
  draft({{a.get(), 17, {}}});                           // first with one session
  settle_to(*a, taps_a, 120);                           // past the sliding rings' capacity
  draft({{a.get(), 18, sampled}});
  draft({{b.get(), 19, {}}});
  EXPECT_EQ(drafter.graphs(), graphs) << "a capture failed";
  return out;
}

const std::vector<bool>& draft_rounds_replayed() {
  static const std::vector<bool> replayed{false, true, true, false, true, true};
  return replayed;
}

}  // namespace tpdraft::testing
