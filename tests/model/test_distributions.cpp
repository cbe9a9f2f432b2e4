// The draft distributions a caller may ask for with each draft (DraftRequest::dist_width),
// against distributions computed here in double from the float64 reference's logits: greedy
// (the pick alone), sampled DFlash unfiltered (the top w by the exact normaliser, the rest mass),
// top-k (exact over the kept set), top-p and both, the whole vocabulary, and the DFlash 2
// selector (over its candidates), at tp = 1, 2 and 4 (the head split unevenly).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "model/drafter.h"
#include "parallel/thread_comm.h"
#include "reference/reference.h"
#include "support/rank.h"
#include "support/test_support.h"
#include "tools/random_checkpoint.h"

namespace tpdraft {
namespace {

using model::DrafterConfig;
using model::RowDistribution;
using model::SamplingParams;

// softmax(logits / T) over the kept set of docs/sampling.md, in double, every token (0 outside).
std::vector<double> expected_row(const std::vector<double>& logits, const SamplingParams& s) {
  return testing::softmax_over(logits, testing::documented_kept_set(logits, s.temperature, s.top_k, s.top_p),
                               s.temperature);
}

void expect_distribution(const RowDistribution& got, const std::vector<double>& want, int64_t width,
                         const std::string& what) {
  const size_t V = want.size();
  if (width == model::kFullDistribution) {
    ASSERT_EQ(got.probs.size(), V) << what;
    for (size_t v = 0; v < V; ++v) EXPECT_NEAR(got.probs[v], want[v], 2e-4) << what << " token " << v;
    return;
  }
  ASSERT_EQ(got.ids.size(), static_cast<size_t>(width)) << what;
  const std::vector<int64_t> order = testing::ids_by_value(want.data(), static_cast<int64_t>(V));
  double kept = 0;
  for (size_t i = 0; i < static_cast<size_t>(width); ++i) {
    const bool real = i < V && want[order[i]] > 0;
    EXPECT_EQ(got.ids[i], real ? order[i] : -1) << what << " entry " << i;
    EXPECT_NEAR(got.probs[i], real ? want[order[i]] : 0.0, 2e-4) << what << " entry " << i;
    if (real) kept += want[order[i]];
  }
  EXPECT_NEAR(got.rest, 1.0 - kept, 2e-4) << what;
}

struct Ask {
  SamplingParams sampling;
  int64_t width;
};

// Drafts one session at tp ranks with each ask; returns rank 0's results, one per ask.
std::vector<model::DraftResult> draft_at(const std::string& ckpt, const DrafterConfig& cfg, int tp,
                                         const std::vector<float>& taps, int64_t n, const std::vector<Ask>& asks) {
  std::vector<model::DraftResult> out;
  parallel::run_ranks(tp, [&](parallel::Communicator& comm) {
    model::RuntimeOptions ro = testing::backend("cpu");
    ro.limits.max_context = 64;
    const auto rt = testing::open_rank(comm, ckpt, cfg, ro);
    auto session = rt->drafter().new_session();
    rt->drafter().settle(*session, 0, taps.data(), n);
    std::vector<model::DraftResult> mine;
    for (const Ask& a : asks) {
      model::DraftRequest req{session.get(), 5, a.sampling, a.width};
      mine.push_back(rt->drafter().draft({req})[0]);
    }
    if (comm.rank() == 0) out = mine;
  });
  return out;
}

TEST(Distributions, DFlashRowsEqualTheKeptSetsSoftmax) {
  DrafterConfig cfg = testing::eight_heads_over_two("tiny-dflash.json");
  cfg.vocab = 301;  // at tp 4 the last rank's slice of the head is narrower
  testing::TempDir dir;
  model::write_random_checkpoint(cfg, dir.path(), {}, 0);
  const int64_t n = 30;
  const auto taps = model::random_taps(cfg, n, 4);
  reference::RefModel ref(dir.file("drafter"), dir.file("target"));
  reference::RefContext ctx;
  ref.settle(ctx, 0, std::vector<double>(taps.begin(), taps.end()), n);
  const std::vector<double> logits = ref.draft(ctx, 5, {}).logits;
  const size_t V = static_cast<size_t>(cfg.vocab), rows = static_cast<size_t>(cfg.block - 1);
  // Temperatures that spread the mass, so that a width of 7 leaves real mass outside.
  const std::vector<Ask> asks = {{{2.0, 0, 1.0, 1}, 7},  {{2.0, 0, 1.0, 1}, model::kFullDistribution},
                                 {{1.5, 12, 1.0, 2}, 20}, {{1.5, 12, 1.0, 2}, 5},
                                 {{3.0, 0, 0.6, 3}, 40},  {{1.5, 40, 0.8, 4}, 9},
                                 {{0.0, 0, 1.0, 0}, 3}};
  for (int tp : {1, 2, 4}) {
    const auto got = draft_at(dir.path(), cfg, tp, taps, n, asks);
    ASSERT_EQ(got.size(), asks.size());
    for (size_t a = 0; a < asks.size(); ++a) {
      ASSERT_EQ(got[a].dists.size(), rows);
      for (size_t r = 0; r < rows; ++r) {
        const std::string what = "tp " + std::to_string(tp) + " ask " + std::to_string(a) + " row " + std::to_string(r + 1);
        const std::vector<double> row(logits.begin() + static_cast<std::ptrdiff_t>(r * V),
                                      logits.begin() + static_cast<std::ptrdiff_t>((r + 1) * V));
        std::vector<double> want(V, 0.0);
        if (asks[a].sampling.greedy())
          want[static_cast<size_t>(got[a].tokens[r])] = 1.0;
        else
          want = expected_row(row, asks[a].sampling);
        expect_distribution(got[a].dists[r], want, asks[a].width, what);
        // q(d) of the pick is its probability in the distribution.
        EXPECT_NEAR(got[a].probs[r], want[static_cast<size_t>(got[a].tokens[r])], 2e-4) << what;
      }
    }
  }
}

// DFlash 2 samples over the selector's k_top candidates: the distribution's support is exactly
// the k_top best logits, it sums to 1, and the pick carries its q.
TEST(Distributions, SelectorRowsCoverItsCandidates) {
  const DrafterConfig cfg = testing::eight_heads_over_two("tiny-dflash2.json");
  testing::TempDir dir;
  model::write_random_checkpoint(cfg, dir.path(), {}, 0);
  const int64_t n = 20, k = cfg.selector_topk;
  const auto taps = model::random_taps(cfg, n, 6);
  reference::RefModel ref(dir.file("drafter"), dir.file("target"));
  reference::RefContext ctx;
  ref.settle(ctx, 0, std::vector<double>(taps.begin(), taps.end()), n);
  const auto want = ref.draft(ctx, 5, {0.9, 0, 1.0, 8});
  const size_t V = static_cast<size_t>(cfg.vocab);
  for (int tp : {1, 2}) {
    const auto got = draft_at(dir.path(), cfg, tp, taps, n, {{{0.9, 0, 1.0, 8}, k + 3}});
    ASSERT_EQ(got[0].tokens, want.tokens);
    for (size_t r = 0; r < got[0].dists.size(); ++r) {
      const RowDistribution& d = got[0].dists[r];
      const std::vector<int64_t> order = testing::ids_by_value(want.logits.data() + r * V, cfg.vocab);
      std::vector<int64_t> support(d.ids.begin(), d.ids.begin() + k), top(order.begin(), order.begin() + k);
      std::sort(support.begin(), support.end());
      std::sort(top.begin(), top.end());
      EXPECT_EQ(support, top) << "row " << r + 1;
      EXPECT_EQ(std::vector<int64_t>(d.ids.begin() + k, d.ids.end()), std::vector<int64_t>(3, -1));
      EXPECT_NEAR(std::accumulate(d.probs.begin(), d.probs.end(), 0.0), 1.0, 1e-5);
      EXPECT_NEAR(d.rest, 0.0, 1e-5);
      const auto at = std::find(d.ids.begin(), d.ids.end(), got[0].tokens[r]);
      ASSERT_NE(at, d.ids.end());
      EXPECT_NEAR(d.probs[static_cast<size_t>(at - d.ids.begin())], want.probs[r], 1e-4) << "row " << r + 1;
    }
  }
}

TEST(Distributions, WidthsOutsideTheVocabularyAreRefused) {
  const DrafterConfig cfg = testing::eight_heads_over_two("tiny-dflash.json");
  testing::TempDir dir;
  model::write_random_checkpoint(cfg, dir.path(), {}, 0);
  const auto taps = model::random_taps(cfg, 4, 1);
  for (int64_t width : {int64_t{-2}, cfg.vocab + 1}) {
    SCOPED_TRACE(width);
    testing::expect_error([&] { draft_at(dir.path(), cfg, 1, taps, 4, {{{1.0, 0, 1.0, 1}, width}}); },
                          {"distribution width"});
  }
}

}  // namespace
}  // namespace tpdraft
