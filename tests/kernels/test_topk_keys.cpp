// head_topk's keys and its per-block selection (kernels/cuda/topk_keys.h), run on the host: the
// key order is the order kernels/ops.h asks for (value descending, then id ascending; -0 as +0;
// NaN never wins), the digit walk finds the k-th largest key, and the whole plan the kernels
// follow (chunks of 4096 keys each keep their k largest, unordered, in passes until one chunk
// is left, then a sort) gives what a full sort gives. Needs no GPU; the kernels call these same
// functions.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cuda/topk_keys.h"

namespace tpdraft::kernels::cuda {
namespace {

constexpr int64_t kChunk = 4096;  // keys per block, as in cuda_topk.cu

struct Ranked {
  float value;
  int64_t id;
};

// ops.h's order, written from the rule: NaN loses to everything, -0 ties with +0.
bool before(const Ranked& a, const Ranked& b) {
  if (std::isnan(a.value) || std::isnan(b.value)) return !std::isnan(a.value) && std::isnan(b.value);
  if (a.value != b.value) return a.value > b.value;
  return a.id < b.id;
}

std::vector<float> logits_with_ties(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = normal(rng);
  // Repeats, signed zeros, infinities and NaN.
  for (int64_t i = 0; i < n / 7; ++i) v[static_cast<size_t>(rng() % n)] = v[static_cast<size_t>(rng() % n)];
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  for (float sp : specials)
    for (int i = 0; i < 3 && n > 0; ++i) v[static_cast<size_t>(rng() % n)] = sp;
  return v;
}

TEST(TopkKeys, OrderIsValueDescendingThenId) {
  std::mt19937_64 rng(11);
  const auto v = logits_with_ties(rng, 3000);
  for (int i = 0; i < 20000; ++i) {
    const auto a = static_cast<uint32_t>(rng() % v.size()), b = static_cast<uint32_t>(rng() % v.size());
    if (a == b) continue;
    const uint64_t ka = topk_key(v[a], a), kb = topk_key(v[b], b);
    if (std::isnan(v[a])) {
      ASSERT_EQ(ka, 0u);
    } else {
      ASSERT_NE(ka, 0u);
      ASSERT_EQ(topk_key_id(ka), a);
    }
    if (std::isnan(v[a]) && std::isnan(v[b])) continue;
    ASSERT_EQ(ka > kb, before({v[a], a}, {v[b], b})) << v[a] << " id " << a << " vs " << v[b] << " id " << b;
  }
  EXPECT_GT(topk_key(-0.0f, 1), topk_key(0.0f, 2)) << "-0 ties with +0: the lower id first";
  EXPECT_GT(topk_key(-std::numeric_limits<float>::infinity(), 0xfffffffeu), 0u);
}

TEST(TopkKeys, DigitWalkFindsTheKthLargest) {
  std::mt19937_64 rng(12);
  for (int64_t n : {1, 2, 31, 4096}) {
    const auto v = logits_with_ties(rng, n);
    std::vector<uint64_t> keys(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) keys[static_cast<size_t>(i)] = topk_key(v[static_cast<size_t>(i)], static_cast<uint32_t>(i));
    std::vector<uint64_t> sorted = keys;
    std::sort(sorted.rbegin(), sorted.rend());
    for (int64_t k = 1; k <= n; k += std::max<int64_t>(1, n / 97))
      ASSERT_EQ(topk_select_kth(keys.data(), n, static_cast<uint32_t>(k)), sorted[static_cast<size_t>(k - 1)])
          << "n " << n << " k " << k;
  }
  // The walk over a part of the bins, with keys counted above it (the kernel's lanes).
  const uint32_t hist[8] = {3, 0, 5, 1, 0, 0, 2, 4};
  // 10 keys above, then 4 in bin 7 and 2 in bin 6: the 17th is the first of bin 3.
  const DigitPick p = topk_pick_digit(hist, 0, 8, 10, 17);
  EXPECT_EQ(p.digit, 3);
  EXPECT_EQ(p.need, 1u);
  const DigitPick q = topk_pick_digit(hist, 0, 8, 10, 25);  // the last key: the third of bin 0
  EXPECT_EQ(q.digit, 0);
  EXPECT_EQ(q.need, 3u);
}

// The kernels' plan on the host: per chunk, the keys above its k-th largest plus that key
// (padding 0 fills short chunks), in passes until a row fits one chunk, then a sort; k = 1 takes
// the largest instead. Against a full sort in ops.h's order.
TEST(TopkKeys, ChunkSelectionAndMergeEqualAFullSort) {
  std::mt19937_64 rng(13);
  for (auto [n, k] : {std::pair<int64_t, int>{1, 1}, {10, 16}, {4096, 1}, {4097, 64}, {20000, 7}, {20000, 1},
                      {151936, 32}, {151936, 1}, {151936, 2048}, {9000, 2048}}) {
    SCOPED_TRACE(fmt::format("vocab {} k {}", n, k));
    const auto v = logits_with_ties(rng, n);
    std::vector<uint64_t> keys(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) keys[static_cast<size_t>(i)] = topk_key(v[static_cast<size_t>(i)], static_cast<uint32_t>(i));
    while (static_cast<int64_t>(keys.size()) > kChunk) {
      std::vector<uint64_t> kept;
      for (size_t first = 0; first < keys.size(); first += kChunk) {
        std::vector<uint64_t> chunk(kChunk, 0);
        std::copy(keys.begin() + static_cast<int64_t>(first),
                  keys.begin() + static_cast<int64_t>(std::min(keys.size(), first + kChunk)), chunk.begin());
        const uint64_t kth = topk_select_kth(chunk.data(), kChunk, static_cast<uint32_t>(k));
        size_t above = 0;
        for (uint64_t key : chunk)
          if (key > kth) {
            kept.push_back(key);
            ++above;
          }
        ASSERT_LT(above, static_cast<size_t>(k));
        kept.insert(kept.end(), static_cast<size_t>(k) - above, kth);
      }
      std::shuffle(kept.begin(), kept.end(), rng);  // the kernels keep them in no order
      keys = kept;
    }
    std::sort(keys.rbegin(), keys.rend());
    std::vector<Ranked> want;
    for (int64_t i = 0; i < n; ++i) want.push_back({v[static_cast<size_t>(i)], i});
    std::sort(want.begin(), want.end(), before);
    for (int i = 0; i < k; ++i) {
      const uint64_t key = i < static_cast<int>(keys.size()) ? keys[static_cast<size_t>(i)] : 0;
      const bool real = i < n && !std::isnan(want[static_cast<size_t>(i)].value);
      if (!real) {
        ASSERT_EQ(key, 0u) << "place " << i << " must be empty";
        continue;
      }
      ASSERT_EQ(static_cast<int64_t>(topk_key_id(key)), want[static_cast<size_t>(i)].id) << "place " << i;
    }
  }
}

}  // namespace
}  // namespace tpdraft::kernels::cuda
