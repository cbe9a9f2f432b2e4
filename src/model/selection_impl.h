// The templates of selection.h: the Gumbel-max draw over a support, whatever holds its logits,
// and the selector walk, over the codebook row source so that both host tables and test
// fixtures can feed it. Included by selection.h.
#pragma once

#include <cmath>
#include <vector>

namespace tpdraft::model {

template <typename LogitOf>
Pick gumbel_draw(const Support& support, const LogitOf& logit_of, double inv_t, uint64_t seed, uint64_t row) {
  double best_key = -INFINITY;
  size_t best = 0;
  for (size_t i = 0; i < support.size(); ++i) {
    const int64_t id = support[i].first;
    const double key = logit_of(i) * inv_t + gumbel_noise(seed, row, static_cast<uint64_t>(id));
    if (key > best_key || (key == best_key && id < support[best].first)) {
      best_key = key;
      best = i;
    }
  }
  return {support[best].first, static_cast<float>(support[best].second)};
}

template <typename Rows>
std::vector<Pick> selector_walk(int64_t anchor, const std::vector<std::vector<Candidate>>& cands,
                                const std::vector<std::vector<float>>& proj, const Rows& rows, int64_t rank,
                                const SamplingParams& s, std::vector<Support>* supports) {
  std::vector<Pick> picks;
  picks.reserve(cands.size());
  std::vector<float> prev_row(static_cast<size_t>(rank)), succ_row(static_cast<size_t>(rank));
  std::vector<double> weighted(static_cast<size_t>(rank)), score;
  int64_t prev = anchor;
  for (size_t i = 0; i < cands.size(); ++i) {
    const int64_t row = static_cast<int64_t>(i) + 1;
    rows.predecessor(prev, prev_row.data());
    for (int64_t k = 0; k < rank; ++k)
      weighted[static_cast<size_t>(k)] = static_cast<double>(prev_row[static_cast<size_t>(k)]) * proj[i][static_cast<size_t>(k)];
    const auto& c = cands[i];
    score.assign(c.size(), 0.0);
    for (size_t j = 0; j < c.size(); ++j) {
      rows.successor(c[j].id, succ_row.data());
      double pair = 0;
      for (int64_t k = 0; k < rank; ++k) pair += weighted[static_cast<size_t>(k)] * succ_row[static_cast<size_t>(k)];
      score[j] = static_cast<double>(c[j].value) + pair;
    }
    size_t best = 0;
    Pick pick;
    if (s.greedy()) {
      for (size_t j = 1; j < c.size(); ++j)
        if (score[j] > score[best]) best = j;
      pick = {c[best].id, 1.0f};
      if (supports != nullptr) supports->push_back({{c[best].id, 1.0}});
    } else {
      double best_key = -INFINITY, mx = -INFINITY;
      for (size_t j = 0; j < c.size(); ++j) {
        const double key = score[j] / s.temperature + gumbel_noise(s.seed, static_cast<uint64_t>(row), static_cast<uint64_t>(c[j].id));
        if (key > best_key) {
          best_key = key;
          best = j;
        }
        mx = std::max(mx, score[j] / s.temperature);
      }
      double z = 0;
      for (size_t j = 0; j < c.size(); ++j) z += std::exp(score[j] / s.temperature - mx);
      Support row_support;  // softmax(score / T) over the candidates; the pick's is its probability
      for (size_t j = 0; j < c.size(); ++j) row_support.push_back({c[j].id, std::exp(score[j] / s.temperature - mx) / z});
      pick = {c[best].id, static_cast<float>(row_support[best].second)};
      if (supports != nullptr) supports->push_back(std::move(row_support));
    }
    picks.push_back(pick);
    prev = pick.token;
  }
  return picks;
}

}  // namespace tpdraft::model
