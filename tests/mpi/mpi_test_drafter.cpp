// Drafts under mpirun: every world size N drafts as one tensor-parallel group and must give the
// tokens of a single-rank draft of the same checkpoint, with hidden rows and logits within f32
// rounding, for DFlash and DFlash 2, greedy and seeded sampling, several sessions and a rollback;
// and drafts replayed from captured forwards (their all-reduces run over MPI between segments)
// must equal drafts issued op by op, bit for bit, over the rounds of support/draft_rounds.h.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/runtime.h"
#include "model/drafter.h"
#include "parallel/mpi_comm.h"
#include "support/draft_rounds.h"
#include "support/rank.h"
#include "support/test_support.h"
#include "tools/random_checkpoint.h"

namespace tpdraft {
namespace {

using model::DrafterConfig;

struct Output {
  std::vector<model::DraftResult> results;
  model::DraftDump dump;
};

Output draft_with(const std::string& dir, const DrafterConfig& cfg, parallel::Communicator& comm) {
  model::RuntimeOptions ro = testing::backend("cpu");
  ro.limits.max_sessions = 2;
  ro.limits.max_context = 96;
  const auto rt = testing::open_rank(comm, dir, cfg, ro);
  model::Drafter& drafter = rt->drafter();
  auto a = drafter.new_session(), b = drafter.new_session();
  const auto taps = model::random_taps(cfg, 60, 9);
  drafter.settle(*a, 0, taps.data(), 60);
  drafter.rollback(*a, 55);
  drafter.settle(*b, 0, taps.data(), 23);
  Output o;
  o.results = drafter.draft({{a.get(), 3, {}}, {b.get(), 11, {0.8, 0, 1.0, 77}}}, &o.dump);
  return o;
}

class MpiDrafter : public ::testing::TestWithParam<std::string> {};

TEST_P(MpiDrafter, GroupOfAllRanksEqualsOneRank) {
  DrafterConfig cfg = DrafterConfig::from_file(testing::source_path("configs/" + GetParam()));
  cfg.n_q = 8;
  cfg.n_kv = 2;  // 4 ranks replicate kv heads
  cfg.head_dim = 8;
  auto world = parallel::make_mpi(MPI_COMM_WORLD);
  // Rank 0 writes the checkpoint into a directory of this run's own (the np2 and np4 runs of
  // this test may run at once); the others wait for it, then every rank reads its share.
  const testing::SharedTempDir scratch(*world);
  const std::string dir = scratch.path();
  if (world->rank() == 0) {
    model::RandomCheckpointOptions o;
    o.seed = 4;
    o.target_vocab = cfg.vocab + 5;
    model::write_random_checkpoint(cfg, dir, o, 0);
  }
  world->barrier();
  auto single = parallel::make_single_rank();
  const Output want = draft_with(dir, cfg, *single);
  const Output got = draft_with(dir, cfg, *world);
  {
    const auto eager = testing::run_draft_rounds(*world, "cpu", dir, cfg, false);
    const auto graphs = testing::run_draft_rounds(*world, "cpu", dir, cfg, true);
    ASSERT_EQ(graphs.size(), testing::draft_rounds_replayed().size());
    for (size_t i = 0; i < graphs.size(); ++i) {
      EXPECT_EQ(graphs[i].replayed, testing::draft_rounds_replayed()[i]) << "round " << i;
      EXPECT_EQ(graphs[i].segments, static_cast<size_t>(2 * cfg.layers + 1)) << "round " << i;
      for (size_t s = 0; s < graphs[i].results.size(); ++s)
        EXPECT_EQ(graphs[i].results[s].tokens, eager[i].results[s].tokens) << "round " << i << " session " << s;
      EXPECT_EQ(graphs[i].dump.hidden, eager[i].dump.hidden) << "round " << i;
      EXPECT_EQ(graphs[i].dump.logits, eager[i].dump.logits) << "round " << i;
      EXPECT_EQ(graphs[i].stats.total_bytes(), eager[i].stats.total_bytes()) << "round " << i;
    }
  }
  ASSERT_EQ(got.results.size(), want.results.size());
  for (size_t s = 0; s < got.results.size(); ++s) {
    EXPECT_EQ(got.results[s].tokens, want.results[s].tokens) << "session " << s;
    for (size_t i = 0; i < got.results[s].probs.size(); ++i)
      EXPECT_NEAR(got.results[s].probs[i], want.results[s].probs[i], 1e-5);
  }
  EXPECT_LT(testing::relative_error(got.dump.hidden, std::vector<double>(want.dump.hidden.begin(), want.dump.hidden.end())), 1e-5);
  EXPECT_LT(testing::relative_error(got.dump.logits, std::vector<double>(want.dump.logits.begin(), want.dump.logits.end())), 1e-5);
  world->barrier();  // every rank is done reading before rank 0 removes the directory
}

INSTANTIATE_TEST_SUITE_P(Architectures, MpiDrafter, ::testing::Values("tiny-dflash.json", "tiny-dflash2.json"));

// A draft vocabulary over MPI ranks: a speculators checkpoint's own (its d2t) and a token map over
// a DFlash 2 checkpoint draft, greedy and sampled, what one rank drafts, in the same target ids.
Output draft_vocab_with(const std::string& dir, const std::vector<int64_t>& token_map, parallel::Communicator& comm) {
  model::ModelSource source = model::ModelSource::open(dir + "/drafter", dir + "/target");
  if (!token_map.empty()) model::apply_token_map(source, token_map, "test map");
  model::RuntimeOptions ro = testing::backend("cpu");
  ro.limits.max_sessions = 2;
  ro.limits.max_context = 64;
  model::RankRuntime rt(source, comm, ro);
  auto a = rt.drafter().new_session(), b = rt.drafter().new_session();
  const auto taps = model::random_taps(source.config, 40, 3);
  rt.drafter().settle(*a, 0, taps.data(), 40);
  rt.drafter().settle(*b, 0, taps.data(), 17);
  Output o;
  model::DraftRequest sampled{b.get(), 8, {0.8, 0, 1.0, 5}};
  sampled.dist_width = model::kFullDistribution;
  o.results = rt.drafter().draft({{a.get(), 2, {}}, sampled}, &o.dump);
  return o;
}

TEST(MpiDraftVocab, SpeculatorsAndTokenMapDraftAsOneRank) {
  auto world = parallel::make_mpi(MPI_COMM_WORLD);
  for (const char* file : {"tiny-dflash.json", "tiny-dflash2.json"}) {
    DrafterConfig cfg = DrafterConfig::from_file(testing::source_path(std::string("configs/") + file));
    cfg.n_q = 8;
    cfg.n_kv = 2;
    cfg.head_dim = 8;
    std::vector<int64_t> map;
    if (cfg.is_dflash2()) {
      for (int64_t t = 1; t < cfg.vocab; t += 4) map.push_back(t);  // 64 ids, a map over the target head
    } else {
      cfg.layout = model::Layout::Speculators;  // 77 ids of its own
      cfg.arch_name = "DFlashSpeculator";
      cfg.draft_vocab = 77;
    }
    const testing::SharedTempDir scratch(*world);
    if (world->rank() == 0) {
      model::RandomCheckpointOptions o;
      o.seed = 6;
      model::write_random_checkpoint(cfg, scratch.path(), o, 0);
    }
    world->barrier();
    auto single = parallel::make_single_rank();
    const Output want = draft_vocab_with(scratch.path(), map, *single);
    const Output got = draft_vocab_with(scratch.path(), map, *world);
    ASSERT_EQ(got.results.size(), want.results.size()) << file;
    for (size_t s = 0; s < got.results.size(); ++s) {
      EXPECT_EQ(got.results[s].tokens, want.results[s].tokens) << file << " session " << s;
      for (size_t i = 0; i < got.results[s].probs.size(); ++i)
        EXPECT_NEAR(got.results[s].probs[i], want.results[s].probs[i], 1e-5) << file;
    }
    ASSERT_EQ(got.results[1].dists.size(), want.results[1].dists.size()) << file;
    for (size_t r = 0; r < got.results[1].dists.size(); ++r)
      for (size_t v = 0; v < want.results[1].dists[r].probs.size(); ++v)
        ASSERT_NEAR(got.results[1].dists[r].probs[v], want.results[1].dists[r].probs[v], 1e-5) << file << " id " << v;
    EXPECT_EQ(got.dump.logit_ids, want.dump.logit_ids) << file;
    EXPECT_EQ(static_cast<int64_t>(got.dump.logit_ids.size()), cfg.is_dflash2() ? 64 : 77) << file;
    EXPECT_LT(testing::relative_error(got.dump.logits, std::vector<double>(want.dump.logits.begin(), want.dump.logits.end())),
              1e-5) << file;
    world->barrier();
  }
}

}  // namespace
}  // namespace tpdraft
