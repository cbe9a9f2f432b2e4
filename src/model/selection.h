// Choosing draft tokens on the host (docs/sampling.md): the order of candidates, the counter-based
// noise of every draw, sampling from one row's whole logits, and the DFlash 2 selector walk.
// Merging candidates and sampling across vocabulary slices of several ranks is sharded_head.h.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace tpdraft::model {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  uint64_t seed = 0;
  bool greedy() const { return temperature <= 0.0; }
};
// Throws unless the parameters can sample: temperature > 0, top_p in (0, 1], top_k >= 0.
void check_sampling(const SamplingParams& s);

struct Candidate {
  float value;
  int64_t id;
};

// Ordering of candidates everywhere: value descending, then id ascending.
inline bool candidate_before(const Candidate& a, const Candidate& b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

// The splitmix64 finaliser: the counter-based hash behind the sampling noise and random weights.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The counter-based uniform in (0, 1) and Gumbel noise keyed by (seed, row, id).
double sampling_uniform(uint64_t seed, uint64_t row, uint64_t id);
double gumbel_noise(uint64_t seed, uint64_t row, uint64_t id);

struct Pick {
  int64_t token = 0;
  float prob = 1.0f;
};

// DFlash sampling over one row's full logits [V] (ids 0..V-1), docs/sampling.md.
Pick sample_from_logits(const float* logits, int64_t vocab, int64_t row, const SamplingParams& s);

// The tokens a DFlash draw at temperature > 0 may take (top_k, then top_p; every id when neither
// filters), in candidate order when filtered.
std::vector<int64_t> kept_set(const float* logits, int64_t vocab, const SamplingParams& s);

// One draft row's distribution as a caller asked for it. Width w > 0: the w most likely tokens
// (probability descending, ties to the lower id; id -1 with probability 0 pads a narrower
// support) and `rest`, the mass of every other token. Width kFullDistribution: the probability
// of every token of the vocabulary in `probs` (ids implied, 0 .. V-1; `ids` empty).
struct RowDistribution {
  std::vector<int64_t> ids;
  std::vector<float> probs;
  float rest = 0.0f;
};
constexpr int64_t kFullDistribution = -1;
using Support = std::vector<std::pair<int64_t, double>>;  // (token, probability); others 0

// Shapes a support into a RowDistribution of `width`; rest = 1 - the mass kept (never below 0).
RowDistribution shape_distribution(Support support, int64_t width, int64_t vocab);
// The draw's distribution from one row's full logits: softmax(logits / T) over kept_set.
Support support_from_logits(const float* logits, int64_t vocab, const SamplingParams& s);

// The Gumbel-max draw over a support (keys logit / T plus the noise keyed by (seed, row, id), ties
// to the lower id), with the pick's probability in the support; logit_of(i) is support[i]'s logit.
template <typename LogitOf>
Pick gumbel_draw(const Support& support, const LogitOf& logit_of, double inv_t, uint64_t seed, uint64_t row);

// The DFlash 2 selector walk over rows r = 1..B-1 of one block.
// cands[r-1]: the k_top candidates of row r in candidate order; proj[r-1]: s_r [R];
// pred(token, out[R]) / succ(token, out[R]) fetch codebook rows. With `supports`, each row's
// draft distribution too: the pick alone when greedy, softmax(score / T) over the candidates.
template <typename Rows>
std::vector<Pick> selector_walk(int64_t anchor, const std::vector<std::vector<Candidate>>& cands,
                                const std::vector<std::vector<float>>& proj, const Rows& rows, int64_t rank,
                                const SamplingParams& s, std::vector<Support>* supports = nullptr);

}  // namespace tpdraft::model

#include "model/selection_impl.h"
