// Order statistics of a long series in bounded memory: the exact count, minimum, maximum and
// mean, and quantiles from a uniform sample of at most `capacity` values (reservoir sampling with
// a fixed seed, so a run is repeatable). Exact while the series is no longer than the capacity.
// A benchmark timing millions of drafts keeps a few KiB, not every sample.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tpdraft {

class SampleSummary {
 public:
  explicit SampleSummary(size_t capacity = 4096);
  void add(double x);

  size_t count() const { return static_cast<size_t>(count_); }
  double min() const { return min_; }
  double max() const { return max_; }
  double mean() const { return count_ ? sum_ / static_cast<double>(count_) : 0.0; }
  // The value at rank round(q * (n - 1)) of the sorted sample, q in [0, 1]; 0 when empty.
  double quantile(double q) const;
  // The middle of the sorted sample (the mean of the two middle values for an even count).
  double median() const;

 private:
  std::vector<double> sorted_sample() const;

  size_t capacity_;
  std::vector<double> sample_;
  uint64_t count_ = 0;
  uint64_t rng_ = 0x9E3779B97F4A7C15ull;
  double min_ = 0, max_ = 0, sum_ = 0;
};

}  // namespace tpdraft
