// Inputs and expected outputs shared by the CPU and CUDA kernel tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/cpu/cpu_ops.h"

namespace tpdraft::kernels {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A backend buffer holding `v` (or n NaNs: outputs are poisoned before every op).
template <typename T>
Buffer put(Ops& ops, const std::vector<T>& v) {
  Buffer b(ops, std::max<size_t>(1, v.size() * sizeof(T)));
  if (!v.empty()) ops.to_device(b.get(), v.data(), v.size() * sizeof(T));
  return b;
}
inline Buffer poisoned(Ops& ops, size_t n) { return put(ops, std::vector<float>(n, kNaN)); }
template <typename T>
std::vector<T> get(Ops& ops, const Buffer& b, size_t n) {
  std::vector<T> v(n);
  if (n > 0) ops.to_host(v.data(), b.get(), n * sizeof(T));
  return v;
}

// Every CPU kernel family up to the detected one; restores the detected family when done.
class IsaSweep {
 public:
  IsaSweep() {
    for (int i = 0; i <= static_cast<int>(cpu::detected_isa()); ++i)
      isas_.push_back(static_cast<cpu::Isa>(i));
  }
  ~IsaSweep() { cpu::force_isa(cpu::detected_isa()); }
  const std::vector<cpu::Isa>& isas() const { return isas_; }

 private:
  std::vector<cpu::Isa> isas_;
};

// n values drawn from N(mean, sd^2).
inline std::vector<float> randn(size_t n, std::mt19937_64& rng, float sd = 1.0f,
                                float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Random int8 / int4 weights [n, k]: q uniform over the signed `bits` range, then one scale per
// row and group, uniform in [lo, hi).
struct QuantWeights {
  std::vector<int8_t> q;
  std::vector<float> scales;
};
inline QuantWeights random_quant(int bits, int64_t n, int64_t k, int64_t group, float lo, float hi,
                                 std::mt19937_64& rng) {
  std::uniform_int_distribution<int> qd(-(1 << (bits - 1)), (1 << (bits - 1)) - 1);
  std::uniform_real_distribution<float> sd(lo, hi);
  QuantWeights w{std::vector<int8_t>(static_cast<size_t>(n * k)),
                 std::vector<float>(static_cast<size_t>(n * (k / group)))};
  for (auto& v : w.q) v = static_cast<int8_t>(qd(rng));
  for (auto& s : w.scales) s = sd(rng);
  return w;
}

// What head_topk must return, computed on the host from head_logits' own output: per row, the
// logits sorted by value descending, then id ascending; NaN logits never win (the CPU backend
// drops them), and places past the last candidate are -inf / -1.
struct TopK {
  std::vector<float> values;  // [m, k]
  std::vector<int64_t> ids;   // [m, k], id_base added
};

// The top k of every row of logits [m, n].
inline TopK sorted_top(const std::vector<float>& logits, int64_t m, int64_t n, int k,
                       int64_t id_base) {
  TopK t{std::vector<float>(static_cast<size_t>(m * k), -std::numeric_limits<float>::infinity()),
         std::vector<int64_t>(static_cast<size_t>(m * k), -1)};
  std::vector<int64_t> order;
  for (int64_t i = 0; i < m; ++i) {
    const float* row = logits.data() + i * n;
    order.clear();
    for (int64_t v = 0; v < n; ++v)
      if (!std::isnan(row[v])) order.push_back(v);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return row[a] > row[b]; });
    for (int64_t j = 0; j < std::min<int64_t>(k, static_cast<int64_t>(order.size())); ++j) {
      t.values[static_cast<size_t>(i * k + j)] = row[order[static_cast<size_t>(j)]];
      t.ids[static_cast<size_t>(i * k + j)] = order[static_cast<size_t>(j)] + id_base;
    }
  }
  return t;
}

}  // namespace tpdraft::kernels
