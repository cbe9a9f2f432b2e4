// Drafts under mpirun: every world size N drafts as one tensor-parallel group and must give the
// tokens of a single-rank draft of the same checkpoint, with hidden rows and logits within f32
// rounding, for DFlash and DFlash 2, greedy and seeded sampling, several sessions and a rollback;
// and drafts replayed from captured forwards (their all-reduces run over MPI between segments)
// must equal drafts issued op by op, bit for bit, over the rounds of support/draft_rounds.h.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model/random_checkpoint.h"
#include "model/runtime.h"
#include "parallel/mpi_comm.h"
#include "support/draft_rounds.h"
#include "support/rank.h"
#include "support/test_support.h"

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

}  // namespace
}  // namespace tpdraft
