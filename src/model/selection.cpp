// Seeded sampling for DFlash drafts (docs/sampling.md): kept set by top-k / top-p, the exact
// q_r of the pick, and the Gumbel-max draw with counter-based noise.
#include "model/selection.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace tpdraft::model {

double sampling_uniform(uint64_t seed, uint64_t row, uint64_t id) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ row) ^ id);
  return (static_cast<double>(h >> 11) + 0.5) / 9007199254740992.0;  // 2^53
}

double gumbel_noise(uint64_t seed, uint64_t row, uint64_t id) { return -std::log(-std::log(sampling_uniform(seed, row, id))); }

void check_sampling(const SamplingParams& s) {
  TPDRAFT_CHECK(s.temperature > 0, "sampling needs a temperature > 0, got {}", s.temperature);
  TPDRAFT_CHECK(s.top_p > 0 && s.top_p <= 1, "top_p must lie in (0, 1], got {}", s.top_p);
  TPDRAFT_CHECK(s.top_k >= 0, "top_k must be >= 0, got {}", s.top_k);
}

std::vector<int64_t> kept_set(const float* logits, int64_t vocab, const SamplingParams& s) {
  std::vector<int64_t> kept(static_cast<size_t>(vocab));
  std::iota(kept.begin(), kept.end(), int64_t{0});
  if (s.top_k == 0 && s.top_p >= 1.0) return kept;
  const double inv_t = 1.0 / s.temperature;
  auto before = [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  const int64_t k = s.top_k > 0 ? std::min(s.top_k, vocab) : vocab;
  if (k < vocab) {
    std::partial_sort(kept.begin(), kept.begin() + k, kept.end(), before);
    kept.resize(static_cast<size_t>(k));
  } else {
    std::sort(kept.begin(), kept.end(), before);
  }
  if (s.top_p < 1.0) {
    const double mx = logits[kept.front()] * inv_t;
    double z = 0;
    for (int64_t id : kept) z += std::exp(logits[id] * inv_t - mx);
    double mass = 0;
    size_t n = 0;
    while (n < kept.size()) {
      mass += std::exp(logits[kept[n]] * inv_t - mx) / z;
      ++n;
      if (mass >= s.top_p) break;
    }
    kept.resize(n);
  }
  return kept;
}

Pick sample_from_logits(const float* logits, int64_t vocab, int64_t row, const SamplingParams& s) {
  // The Gumbel-max draw over the kept set, with the support's probability.
  const Support support = support_from_logits(logits, vocab, s);
  return gumbel_draw(support, [&](size_t i) { return logits[support[i].first]; }, 1.0 / s.temperature, s.seed,
                     static_cast<uint64_t>(row));
}

Support support_from_logits(const float* logits, int64_t vocab, const SamplingParams& s) {
  check_sampling(s);
  const double inv_t = 1.0 / s.temperature;
  const std::vector<int64_t> kept = kept_set(logits, vocab, s);
  double mx = -INFINITY;
  for (int64_t id : kept) mx = std::max(mx, logits[id] * inv_t);
  double z = 0;
  for (int64_t id : kept) z += std::exp(logits[id] * inv_t - mx);
  Support out;
  out.reserve(kept.size());
  for (int64_t id : kept) out.push_back({id, std::exp(logits[id] * inv_t - mx) / z});
  return out;
}

RowDistribution shape_distribution(Support support, int64_t width, int64_t vocab) {
  RowDistribution d;
  if (width == kFullDistribution) {
    d.probs.assign(static_cast<size_t>(vocab), 0.0f);
    for (const auto& [id, p] : support) d.probs[static_cast<size_t>(id)] = static_cast<float>(p);
    return d;
  }
  TPDRAFT_CHECK(width > 0, "a distribution's width must be > 0 or {} (every token), got {}", kFullDistribution, width);
  const size_t keep = std::min(support.size(), static_cast<size_t>(width));
  std::partial_sort(support.begin(), support.begin() + static_cast<std::ptrdiff_t>(keep), support.end(),
                    [](const auto& a, const auto& b) { return a.second > b.second || (a.second == b.second && a.first < b.first); });
  double kept = 0;
  for (size_t i = 0; i < static_cast<size_t>(width); ++i) {
    const bool real = i < keep;
    d.ids.push_back(real ? support[i].first : -1);
    d.probs.push_back(real ? static_cast<float>(support[i].second) : 0.0f);
    if (real) kept += support[i].second;
  }
  d.rest = static_cast<float>(std::max(0.0, 1.0 - kept));
  return d;
}

}  // namespace tpdraft::model
