// The vocabulary-sharded head on its own, at tp = 1, 2, 3, 4 with the in-process communicator and
// the drafter's slicing (V padded to a multiple of tp, the last slices narrower or empty):
// local_top and merge_candidates against a sort of the whole row (ties, short and empty slices),
// gather_logits bit for bit, sample_sharded against sample_from_logits on the whole row for every
// filter, and the wire: O(V) bytes only on the top-p pool overflow path.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "model/selection.h"
#include "model/sharded_head.h"
#include "parallel/communicator.h"
#include "parallel/thread_comm.h"
#include "support/test_support.h"

namespace tpdraft::model {
namespace {

using parallel::Communicator;

// Rank `rank`'s slice of `vocab` ids at `tp` ranks, cut as the drafter does: V padded up to a
// multiple of tp, slices of Vp / tp, clipped at V.
VocabSlice slice_of(int rank, int tp, int64_t vocab) {
  const int64_t stride = (vocab + tp - 1) / tp;
  const int64_t begin = std::min<int64_t>(vocab, rank * stride);
  const int64_t end = std::min<int64_t>(vocab, (rank + 1) * stride);
  return {begin, end - begin, stride, vocab};
}

// Columns [id_base, id_base + width) of a [rows, vocab] matrix, as [rows, width].
std::vector<float> columns_of(const std::vector<float>& full, int64_t rows, const VocabSlice& s) {
  std::vector<float> out(static_cast<size_t>(rows * s.width));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < s.width; ++v)
      out[static_cast<size_t>(r * s.width + v)] = full[static_cast<size_t>(r * s.vocab + s.id_base + v)];
  return out;
}

// [rows, vocab] logits from `seed`: normal(0, 1), or with `levels` > 0 the negative integers
// -1 .. -levels (many ties, and all below the 0 an unset wire entry would carry).
std::vector<float> random_logits(int64_t rows, int64_t vocab, uint32_t seed, int levels = 0) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> level(1, std::max(1, levels));
  std::vector<float> out(static_cast<size_t>(rows * vocab));
  for (float& x : out) x = levels > 0 ? -static_cast<float>(level(gen)) : normal(gen);
  return out;
}

// Nearly flat logits in [0, 0.01): a top-p nucleus covers almost all of them.
std::vector<float> flat_logits(int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> tiny(0.0f, 0.01f);
  std::vector<float> out(static_cast<size_t>(vocab));
  for (float& x : out) x = tiny(gen);
  return out;
}

// normal(0, 1) logits with 12 tokens raised by 15: those hold > 99.8% of the mass at T = 1.
std::vector<float> peaked_logits(int64_t vocab, uint32_t seed) {
  std::vector<float> out = random_logits(1, vocab, seed);
  for (int64_t j = 0; j < 12; ++j) out[static_cast<size_t>((j * 7919 + seed) % vocab)] += 15.0f;
  return out;
}

// The k best of a row by a stable sort on value alone (equal values keep ascending id order).
std::vector<Candidate> top_by_sort(const float* row, int64_t vocab, int64_t k) {
  const std::vector<int64_t> ids = testing::ids_by_value(row, vocab);
  std::vector<Candidate> out;
  for (int64_t j = 0; j < std::min(k, vocab); ++j) out.push_back({row[ids[j]], ids[j]});
  return out;
}

void expect_same_candidates(const std::vector<Candidate>& got, const std::vector<Candidate>& want,
                            const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t j = 0; j < want.size(); ++j) {
    EXPECT_EQ(got[j].id, want[j].id) << what << " position " << j;
    EXPECT_EQ(got[j].value, want[j].value) << what << " position " << j;
  }
}

// fn(comm, slice) on every rank of a fresh tp-rank group; element r is rank r's result.
template <typename T>
std::vector<T> on_each_rank(int tp, int64_t vocab, const std::function<T(Communicator&, const VocabSlice&)>& fn) {
  std::vector<T> out(static_cast<size_t>(tp));
  parallel::run_ranks(tp, [&](Communicator& comm) {
    out[static_cast<size_t>(comm.rank())] = fn(comm, slice_of(comm.rank(), tp, vocab));
  });
  return out;
}

TEST(ShardedHead, SlicesAreCutLikeTheDrafters) {
  // V = 5 at tp = 4: Vp = 8, slices of 2: [0, 2), [2, 4), [4, 5) and an empty one.
  const int64_t bases[] = {0, 2, 4, 5}, widths[] = {2, 2, 1, 0};
  for (int r = 0; r < 4; ++r) {
    const VocabSlice s = slice_of(r, 4, 5);
    EXPECT_EQ(s.id_base, bases[r]);
    EXPECT_EQ(s.width, widths[r]);
    EXPECT_EQ(s.slice_stride, 2);
  }
}

TEST(ShardedHead, LocalTopOrdersByValueThenIdAndOffsetsIds) {
  const std::vector<float> row = {3, 1, 3, 2, 3, 1};
  expect_same_candidates(local_top(row.data(), 6, 10, 4), {{3, 10}, {3, 12}, {3, 14}, {2, 13}}, "k 4");
  expect_same_candidates(local_top(row.data(), 6, 10, 9), {{3, 10}, {3, 12}, {3, 14}, {2, 13}, {1, 11}, {1, 15}},
                         "k above the width");
  EXPECT_TRUE(local_top(row.data(), 6, 10, 0).empty());
  EXPECT_TRUE(local_top(row.data(), 0, 10, 3).empty());
}

TEST(ShardedHead, LocalTopMatchesASortOfTheRow) {
  for (int levels : {0, 3}) {
    const std::vector<float> row = random_logits(1, 97, 11, levels);
    for (int64_t k : {1, 2, 5, 50, 97, 200}) {
      std::vector<Candidate> want = top_by_sort(row.data(), 97, k);
      for (Candidate& c : want) c.id += 1000;
      expect_same_candidates(local_top(row.data(), 97, 1000, k), want, "levels " + std::to_string(levels));
    }
  }
}

// Equal values on different ranks go to the lower id; every slice holds fewer than k = 4 (the
// last none), so the exchange is padded with entries that must never appear, even though every
// real value is below the 0 they carry.
TEST(ShardedHead, MergeBreaksTiesAcrossRanksAndIgnoresPadding) {
  const std::vector<float> full = {-3, -1, -2, -5, -1, -3};  // tp 4: [0,2) [2,4) [4,6) [6,6)
  const auto merged = on_each_rank<std::vector<Candidate>>(4, 6, [&](Communicator& comm, const VocabSlice& s) {
    const std::vector<float> local = columns_of(full, 1, s);
    return merge_candidates({local_top(local.data(), s.width, s.id_base, 4)}, 4, comm).at(0);
  });
  for (int r = 0; r < 4; ++r)
    expect_same_candidates(merged[static_cast<size_t>(r)], {{-1, 1}, {-1, 4}, {-2, 2}, {-3, 0}},
                           "rank " + std::to_string(r));
}

TEST(ShardedHead, MergeGivesTheGlobalTopKOnEveryRank) {
  const int64_t rows = 4;
  for (int tp : {1, 2, 3, 4}) {
    for (int64_t vocab : {1, 2, 3, 5, 7, 10, 13, 40}) {
      for (int levels : {0, 3}) {
        const std::vector<float> full = random_logits(rows, vocab, static_cast<uint32_t>(vocab * 7 + levels), levels);
        for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{8}, vocab + 3}) {
          const std::string what = fmt::format("tp {} V {} k {} levels {}", tp, vocab, k, levels);
          const auto merged = on_each_rank<std::vector<std::vector<Candidate>>>(
              tp, vocab, [&](Communicator& comm, const VocabSlice& s) {
                const std::vector<float> local = columns_of(full, rows, s);
                std::vector<std::vector<Candidate>> tops;
                for (int64_t r = 0; r < rows; ++r)
                  tops.push_back(local_top(local.data() + r * s.width, s.width, s.id_base, k));
                return merge_candidates(tops, k, comm);
              });
          for (int q = 0; q < tp; ++q) {
            ASSERT_EQ(merged[static_cast<size_t>(q)].size(), static_cast<size_t>(rows)) << what;
            for (int64_t r = 0; r < rows; ++r)
              expect_same_candidates(merged[static_cast<size_t>(q)][static_cast<size_t>(r)],
                                     top_by_sort(full.data() + r * vocab, vocab, k),
                                     what + " rank " + std::to_string(q) + " row " + std::to_string(r));
          }
        }
      }
    }
  }
}

struct Gathered {
  std::vector<float> full;
  parallel::CommStats stats;
};

TEST(ShardedHead, GatherLogitsRebuildsTheRowsOnEveryRank) {
  const int64_t rows = 3;
  for (int tp : {1, 2, 3, 4}) {
    for (int64_t vocab : {1, 5, 7, 13, 40}) {
      const std::vector<float> full = random_logits(rows, vocab, static_cast<uint32_t>(vocab));
      const auto got = on_each_rank<Gathered>(tp, vocab, [&](Communicator& comm, const VocabSlice& s) {
        const std::vector<float> local = columns_of(full, rows, s);
        comm.reset_stats();
        std::vector<float> all = gather_logits(local.data(), rows, s, comm);
        return Gathered{std::move(all), comm.stats()};
      });
      const uint64_t stride = static_cast<uint64_t>((vocab + tp - 1) / tp);
      for (int q = 0; q < tp; ++q) {
        EXPECT_EQ(got[static_cast<size_t>(q)].full, full) << "tp " << tp << " V " << vocab << " rank " << q;
        EXPECT_EQ(got[static_cast<size_t>(q)].stats.all_gather_bytes, rows * stride * sizeof(float));
      }
    }
  }
}

// ---- sampling ------------------------------------------------------------------------------

struct Sampled {
  std::vector<Pick> picks;
  parallel::CommStats stats;
};

// sample_sharded over `full` at tp ranks, rank by rank, with the counters of that call.
std::vector<Sampled> sample_on_ranks(int tp, const std::vector<float>& full, int64_t rows, int64_t vocab,
                                     int64_t first_row, const SamplingParams& p) {
  return on_each_rank<Sampled>(tp, vocab, [&](Communicator& comm, const VocabSlice& s) {
    const std::vector<float> local = columns_of(full, rows, s);
    comm.reset_stats();
    std::vector<Pick> picks = sample_sharded(local.data(), rows, first_row, s, p, comm);
    return Sampled{std::move(picks), comm.stats()};
  });
}

// Every rank's picks equal sample_from_logits on the whole rows: same token, prob within f32.
void expect_matches_full_rows(const std::vector<Sampled>& got, const std::vector<float>& full, int64_t rows,
                              int64_t vocab, int64_t first_row, const SamplingParams& p, const std::string& what) {
  for (int64_t r = 0; r < rows; ++r) {
    const Pick want = sample_from_logits(full.data() + r * vocab, vocab, first_row + r, p);
    for (size_t q = 0; q < got.size(); ++q) {
      ASSERT_EQ(got[q].picks.size(), static_cast<size_t>(rows)) << what;
      const Pick& pick = got[q].picks[static_cast<size_t>(r)];
      EXPECT_EQ(pick.token, want.token) << what << " rank " << q << " row " << r;
      EXPECT_NEAR(pick.prob, want.prob, 1e-5 * want.prob) << what << " rank " << q << " row " << r;
    }
  }
}

struct Filter {
  std::string name;
  SamplingParams params;
};

std::vector<Filter> filters(uint64_t seed) {
  return {{"T 1", {1.0, 0, 1.0, seed}},
          {"T 0.6", {0.6, 0, 1.0, seed}},
          {"T 1.7", {1.7, 0, 1.0, seed}},
          {"top_k 1", {1.0, 1, 1.0, seed}},
          {"top_k 3", {0.8, 3, 1.0, seed}},
          {"top_k 50", {1.2, 50, 1.0, seed}},
          {"top_p 0.5", {1.0, 0, 0.5, seed}},
          {"top_p 0.9", {0.7, 0, 0.9, seed}},
          {"top_k 20 top_p 0.8", {1.0, 20, 0.8, seed}},
          {"top_k 4 top_p 0.95", {1.5, 4, 0.95, seed}}};
}

TEST(ShardedHead, SamplingMatchesTheWholeRowForEveryFilter) {
  const int64_t rows = 3;
  for (int tp : {1, 2, 3, 4}) {
    for (int64_t vocab : {5, 7, 37, 300}) {
      for (int levels : {0, 4}) {
        const std::vector<float> full = random_logits(rows, vocab, static_cast<uint32_t>(vocab + 100 * levels), levels);
        for (uint64_t seed : {1u, 2024u}) {
          for (const Filter& f : filters(seed)) {
            const std::string what = fmt::format("tp {} V {} levels {} seed {} {}", tp, vocab, levels, seed, f.name);
            const int64_t first_row = static_cast<int64_t>(seed % 5) + 1;
            expect_matches_full_rows(sample_on_ranks(tp, full, rows, vocab, first_row, f.params), full, rows, vocab,
                                     first_row, f.params, what);
          }
        }
      }
    }
  }
}

// Bytes one rank sent through all-gather and all-reduce in a sample_sharded call.
uint64_t bytes_sent(const Sampled& s) { return s.stats.all_gather_bytes + s.stats.all_reduce_bytes; }

// The rows one after another, as one [rows, vocab] matrix.
std::vector<float> stack_rows(const std::vector<std::vector<float>>& rows) {
  std::vector<float> out;
  for (const auto& row : rows) out.insert(out.end(), row.begin(), row.end());
  return out;
}

// Tokens in the top-p nucleus of a row at temperature t, counted here in double.
int64_t nucleus_size(const std::vector<float>& row, double t, double top_p) {
  std::vector<double> w(row.size());
  double z = 0;
  for (size_t v = 0; v < row.size(); ++v) z += (w[v] = std::exp(row[v] / t));
  std::sort(w.begin(), w.end(), std::greater<double>());
  double mass = 0;
  int64_t n = 0;
  while (n < static_cast<int64_t>(w.size()) && mass < top_p) mass += w[static_cast<size_t>(n++)] / z;
  return n;
}

TEST(ShardedHead, FixtureNucleiAreWhatTheWireTestsAssume) {
  EXPECT_GT(nucleus_size(flat_logits(3000, 5), 1.0, 0.99), 2900);  // far past the 256-token pool
  EXPECT_LT(nucleus_size(flat_logits(20000, 5), 1.0, 0.005), 200);  // inside it
  EXPECT_LE(nucleus_size(peaked_logits(20000, 9), 1.0, 0.9), 12);
}

// Two rows of `vocab` logits: nearly flat ones, or peaked ones.
std::vector<float> two_rows(bool flat, int64_t vocab) {
  if (flat) return stack_rows({flat_logits(vocab, 5), flat_logits(vocab, 6)});
  return stack_rows({peaked_logits(vocab, 9), peaked_logits(vocab, 10)});
}

// Without the overflow, what crosses the wire does not depend on V: the same byte counts at
// V = 2000 and V = 20000, for every filter (a top-k of 300 over flat rows included: top-k bounds
// the pool, so no overflow).
TEST(ShardedHead, SamplingWithoutOverflowMovesNoVocabularySizedData) {
  struct WireCase {
    Filter filter;
    bool flat;
  };
  const std::vector<WireCase> cases = {{{"T 1", {1.0, 0, 1.0, 3}}, false},
                                       {{"top_k 8", {1.0, 8, 1.0, 3}}, false},
                                       {{"top_p 0.9", {1.0, 0, 0.9, 3}}, false},
                                       {{"top_k 40 top_p 0.9", {1.0, 40, 0.9, 3}}, false},
                                       {{"top_k 300 top_p 0.99 flat", {1.0, 300, 0.99, 3}}, true},
                                       {{"top_p 0.005 flat", {1.0, 0, 0.005, 3}}, true}};
  for (int tp : {1, 2, 3, 4}) {
    for (const WireCase& c : cases) {
      std::vector<uint64_t> bytes;
      for (int64_t vocab : {2000, 20000}) {
        const std::vector<float> full = two_rows(c.flat, vocab);
        const std::string what = "tp " + std::to_string(tp) + " V " + std::to_string(vocab) + " " + c.filter.name;
        const auto got = sample_on_ranks(tp, full, 2, vocab, 1, c.filter.params);
        expect_matches_full_rows(got, full, 2, vocab, 1, c.filter.params, what);
        bytes.push_back(bytes_sent(got[0]));
      }
      EXPECT_EQ(bytes[0], bytes[1]) << "tp " << tp << " " << c.filter.name << ": bytes grow with V";
    }
  }
}

// A top-p without top-k whose nucleus needs ~3000 of 3000 tokens: the rows that overflow the
// pool take the full-logits gather (rows * Vp/tp floats per rank, so the count grows with V) and
// still draw exactly what the whole row gives; the peaked row in between needs no gather.
TEST(ShardedHead, TopPPoolOverflowGathersTheRowsAndMatches) {
  const int64_t rows = 3;
  for (int tp : {1, 2, 3, 4}) {
    for (double t : {1.0, 0.8}) {
      const SamplingParams p{t, 0, 0.99, 77};
      std::vector<uint64_t> bytes;
      std::vector<int64_t> strides;
      for (int64_t vocab : {3001, 6000}) {
        const std::vector<float> full =
            stack_rows({flat_logits(vocab, 5), peaked_logits(vocab, 9), flat_logits(vocab, 6)});
        const std::string what = "tp " + std::to_string(tp) + " T " + std::to_string(t) + " V " + std::to_string(vocab);
        const auto got = sample_on_ranks(tp, full, rows, vocab, 2, p);
        expect_matches_full_rows(got, full, rows, vocab, 2, p, what);
        const int64_t stride = (vocab + tp - 1) / tp;
        EXPECT_GE(bytes_sent(got[0]), static_cast<uint64_t>(rows * stride) * sizeof(float)) << what;
        bytes.push_back(bytes_sent(got[0]));
        strides.push_back(stride);
      }
      // The only term that depends on V is the gather of all rows' slices.
      EXPECT_EQ(bytes[1] - bytes[0], static_cast<uint64_t>(rows * (strides[1] - strides[0])) * sizeof(float))
          << "tp " << tp << " T " << t;
    }
  }
}

// The sharded draw refuses the parameters the whole-row draw refuses, with the same words.
TEST(ShardedHead, SamplingRefusesParametersLikeTheWholeRow) {
  const std::vector<float> row = {0.5f, 1.0f, -2.0f};
  const VocabSlice slice{0, 3, 3, 3};
  auto comm = parallel::make_single_rank();
  for (const SamplingParams& bad : {SamplingParams{0.0, 0, 1.0, 1}, SamplingParams{1.0, 0, 0.0, 1},
                                    SamplingParams{1.0, 0, 1.5, 1}, SamplingParams{1.0, -1, 1.0, 1}}) {
    const std::string sharded = testing::error_of([&] { sample_sharded(row.data(), 1, 1, slice, bad, *comm); });
    const std::string whole = testing::error_of([&] { sample_from_logits(row.data(), 3, 1, bad); });
    EXPECT_FALSE(whole.empty());
    EXPECT_EQ(sharded, whole);
  }
}

}  // namespace
}  // namespace tpdraft::model
