// Inputs and expected outputs shared by the CPU and CUDA kernel tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace tpdraft::kernels {

// n values drawn from N(mean, sd^2).
inline std::vector<float> randn(size_t n, std::mt19937_64& rng, float sd = 1.0f, float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// What head_topk must return, computed on the host from head_logits' own output: per row, the
// logits sorted by value descending, then id ascending; NaN logits never win (the CPU backend
// drops them), and places past the last candidate are -inf / -1.
struct TopK {
  std::vector<float> values;  // [m, k]
  std::vector<int64_t> ids;   // [m, k], id_base added
};

// The top k of every row of logits [m, n].
inline TopK sorted_top(const std::vector<float>& logits, int64_t m, int64_t n, int k, int64_t id_base) {
  TopK t{std::vector<float>(static_cast<size_t>(m * k), -std::numeric_limits<float>::infinity()),
         std::vector<int64_t>(static_cast<size_t>(m * k), -1)};
  std::vector<int64_t> order;
  for (int64_t i = 0; i < m; ++i) {
    const float* row = logits.data() + i * n;
    order.clear();
    for (int64_t v = 0; v < n; ++v)
      if (!std::isnan(row[v])) order.push_back(v);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
    for (int64_t j = 0; j < std::min<int64_t>(k, static_cast<int64_t>(order.size())); ++j) {
      t.values[static_cast<size_t>(i * k + j)] = row[order[static_cast<size_t>(j)]];
      t.ids[static_cast<size_t>(i * k + j)] = order[static_cast<size_t>(j)] + id_base;
    }
  }
  return t;
}

}  // namespace tpdraft::kernels
