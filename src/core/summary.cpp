// Reservoir sampling (every value seen so far is in the sample with the same probability).
#include "core/summary.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tpdraft {

SampleSummary::SampleSummary(size_t capacity) : capacity_(capacity) {
  TPDRAFT_CHECK(capacity >= 1, "a sample summary needs room for at least one value");
  sample_.reserve(capacity);
}

void SampleSummary::add(double x) {
  min_ = count_ == 0 ? x : std::min(min_, x);
  max_ = count_ == 0 ? x : std::max(max_, x);
  sum_ += x;
  ++count_;
  if (sample_.size() < capacity_) {
    sample_.push_back(x);
    return;
  }
  // xorshift64*: value number count_ replaces a random slot with probability capacity / count_.
  rng_ ^= rng_ >> 12;
  rng_ ^= rng_ << 25;
  rng_ ^= rng_ >> 27;
  const uint64_t slot = (rng_ * 0x2545F4914F6CDD1Dull) % count_;
  if (slot < capacity_) sample_[static_cast<size_t>(slot)] = x;
}

std::vector<double> SampleSummary::sorted_sample() const {
  std::vector<double> v = sample_;
  std::sort(v.begin(), v.end());
  return v;
}

double SampleSummary::quantile(double q) const {
  if (sample_.empty()) return 0.0;
  const std::vector<double> v = sorted_sample();
  const double rank = std::round(std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size() - 1));
  return v[static_cast<size_t>(rank)];
}

double SampleSummary::median() const {
  if (sample_.empty()) return 0.0;
  const std::vector<double> v = sorted_sample();
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace tpdraft
