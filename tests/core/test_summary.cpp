// SampleSummary: exact against a sort of the whole series while it fits its capacity; on a series
// a thousand times longer, the memory stays at the capacity, count / min / max / mean stay exact,
// and the quantiles of a uniform series land within a few hundredths of the true ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/summary.h"

namespace tpdraft {
namespace {

double nearest_rank(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

TEST(SampleSummary, ExactWhileTheSeriesFits) {
  std::mt19937 gen(5);
  std::normal_distribution<double> dist(3.0, 2.0);
  for (size_t n : {1, 2, 7, 100, 4096}) {
    SampleSummary s(4096);
    std::vector<double> all;
    for (size_t i = 0; i < n; ++i) {
      all.push_back(dist(gen));
      s.add(all.back());
    }
    std::vector<double> sorted = all;
    std::sort(sorted.begin(), sorted.end());
    const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    EXPECT_EQ(s.count(), n);
    EXPECT_EQ(s.min(), sorted.front());
    EXPECT_EQ(s.max(), sorted.back());
    EXPECT_EQ(s.median(), median) << n;
    for (double q : {0.0, 0.1, 0.5, 0.9, 1.0}) EXPECT_EQ(s.quantile(q), nearest_rank(all, q)) << n << " q " << q;
  }
}

TEST(SampleSummary, LongSeriesStayBoundedAndRepresentative) {
  SampleSummary s(1000);
  double sum = 0;
  const size_t n = 1000000;
  for (size_t i = 0; i < n; ++i) {
    // A shuffled ramp: every value 0 .. n-1 once, in an order that a reservoir must not follow.
    const double x = static_cast<double>((i * 7919) % n);
    sum += x;
    s.add(x);
  }
  EXPECT_EQ(s.count(), n);
  EXPECT_EQ(s.min(), 0.0);
  EXPECT_EQ(s.max(), static_cast<double>(n - 1));
  EXPECT_DOUBLE_EQ(s.mean(), sum / static_cast<double>(n));
  for (double q : {0.1, 0.5, 0.9}) EXPECT_NEAR(s.quantile(q) / static_cast<double>(n), q, 0.05) << q;
}

// Keeping only the first values (the mistake a bounded buffer invites) would put the median of
// a rising series near its start; the reservoir must not.
TEST(SampleSummary, LaterValuesAreNotIgnored) {
  SampleSummary s(100);
  for (int i = 0; i < 100000; ++i) s.add(i);
  EXPECT_GT(s.median(), 30000.0);
  EXPECT_LT(s.median(), 70000.0);
}

}  // namespace
}  // namespace tpdraft
