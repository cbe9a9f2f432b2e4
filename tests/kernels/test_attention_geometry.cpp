// The CUDA attention kernels' geometry (kernels/cuda/attention_geometry.h), run on the host
// against the visibility rule of kernels/ops.h: for every query row, the keys the kernels visit
// (context chunks intersected with the row's range, and the block's own rows) are exactly the
// keys the rule makes visible, each once. Needs no GPU; the kernels call these same functions.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/attention_geometry.h"

namespace tpdraft::kernels::cuda {
namespace {

struct Case {
  int64_t begin, end, anchor, window, block, splits;
  bool causal;
  std::string str() const {
    return fmt::format("begin {} end {} anchor {} window {} block {} splits {}{}", begin, end, anchor, window, block,
                       splits, causal ? " causal" : "");
  }
};

// ops.h: query row r sits at q = anchor + r and sees context positions p in [begin, min(end, anchor))
// and block rows j (at anchor + j) where causal -> k <= q; window W -> q - k < W, and when not
// causal k - q < W.
bool visible(const Case& c, int64_t q, int64_t k) {
  if (c.causal && k > q) return false;
  if (c.window > 0 && q - k >= c.window) return false;
  if (c.window > 0 && !c.causal && k - q >= c.window) return false;
  return true;
}

void check(const Case& c) {
  SCOPED_TRACE(c.str());
  const AttnSpan sp = attn_span(c.begin, c.end, c.anchor, c.window, c.splits);
  EXPECT_EQ(sp.chunk % kAttnTileKeys, 0);
  EXPECT_GE(sp.chunk, kAttnMinChunk);
  // The chunks tile [lo, lo + count): in order, without gaps or overlaps, none past the end.
  int64_t next = sp.lo;
  for (int64_t ch = 0; ch < c.splits; ++ch) {
    const KeyRange k = attn_chunk(sp, ch);
    if (k.lo >= k.hi) {
      EXPECT_GE(k.lo, sp.lo + sp.count) << "an empty chunk before the span's end, chunk " << ch;
      continue;
    }
    EXPECT_EQ(k.lo, next) << "chunk " << ch;
    EXPECT_LE(k.hi - k.lo, sp.chunk);
    next = k.hi;
  }
  EXPECT_EQ(next, sp.lo + sp.count) << "the chunks do not reach the span's end";

  for (int64_t r = 0; r < c.block; ++r) {
    const int64_t q = c.anchor + r;
    // Context: positions the kernels visit for row r.
    std::vector<int> seen(static_cast<size_t>(std::max<int64_t>(c.end, 1)), 0);
    const int64_t from = attn_context_from(c.begin, c.anchor, c.window, r);
    for (int64_t ch = 0; ch < c.splits; ++ch) {
      const KeyRange k = attn_chunk(sp, ch);
      for (int64_t p = k.lo; p < k.hi; ++p)
        if (p >= from) ++seen[static_cast<size_t>(p)];
    }
    for (int64_t p = 0; p < c.end; ++p) {
      const bool want = p >= c.begin && p < c.anchor && visible(c, q, p);
      ASSERT_EQ(seen[static_cast<size_t>(p)], want ? 1 : 0) << "row " << r << " context position " << p;
    }
    // Block rows.
    const KeyRange b = attn_block_keys(r, c.block, c.causal, c.window);
    for (int64_t j = 0; j < c.block; ++j)
      ASSERT_EQ(j >= b.lo && j < b.hi, visible(c, q, c.anchor + j)) << "row " << r << " block row " << j;
  }
}

TEST(AttentionGeometry, EdgeCases) {
  check({0, 0, 0, 0, 16, 1, false});       // no context
  check({0, 1, 1, 0, 16, 17, false});       // one position, many splits
  check({0, 17, 17, 0, 16, 4, true});
  check({0, 4096, 4096, 0, 16, 17, false});
  check({0, 4096, 4096, 0, 16, 1, false});  // one split: one long chunk
  check({69000, 70000, 70000, 4096, 16, 33, true});
  check({3000, 7000, 7000, 1000, 16, 8, false});  // window inside the ring
  check({0, 50, 46, 0, 3, 5, false});             // anchor before the end: positions >= anchor unseen
  check({0, 300, 300, 1, 16, 4, true});           // window 1: only the row itself
  check({0, 300, 300, 5, 16, 4, false});          // a window shorter than the block, not causal
}

TEST(AttentionGeometry, RandomSessions) {
  std::mt19937_64 rng(2024);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int i = 0; i < 3000; ++i) {
    Case c;
    c.end = pick(0, 1500);
    c.begin = pick(0, c.end);
    c.anchor = std::max<int64_t>(0, c.end - (pick(0, 3) == 0 ? pick(0, 20) : 0));
    c.window = pick(0, 2) == 0 ? 0 : pick(1, 400);
    c.block = pick(1, 20);
    c.splits = pick(1, 40);
    c.causal = pick(0, 1) == 1;
    check(c);
    if (::testing::Test::HasFailure()) break;
  }
}

// The split from the occupancy figure: the grid (row blocks x (splits + 1)) fits one wave of
// resident blocks whenever two chunks per row block do, uses at least as many chunks as the wave
// leaves room for unless the context is shorter, and never cuts the context finer than
// kAttnMinChunk keys per chunk.
TEST(AttentionGeometry, SplitFillsOneWave) {
  for (int64_t resident : {1, 132, 264, 528, 1056})
    for (int64_t row_blocks : {1, 2, 8, 64, 200, 600})
      for (int64_t max_context : {0, 1, 64, 65, 4096, 32768, 131072}) {
        SCOPED_TRACE(fmt::format("resident {} row blocks {} max_context {}", resident, row_blocks, max_context));
        const int64_t splits = attn_plan_splits(row_blocks, max_context, resident);
        ASSERT_GE(splits, 1);
        if (2 * row_blocks <= resident) {
          EXPECT_LE(row_blocks * (splits + 1), resident) << "a tail wave";
          const int64_t useful = std::max<int64_t>(1, (max_context + kAttnMinChunk - 1) / kAttnMinChunk);
          EXPECT_EQ(splits, std::min(resident / row_blocks - 1, useful));
        } else {
          EXPECT_EQ(splits, 1);
        }
        if (splits > 1) {
          EXPECT_GE(attn_span(0, max_context, max_context, 0, splits).chunk, kAttnMinChunk);
        }
      }
  // The H200 case: 132 SMs x 2 resident mma blocks, 8 kv heads of one session at 4096 positions:
  // 32 chunks of 128 keys and the block's own keys, 264 blocks in one wave.
  EXPECT_EQ(attn_plan_splits(8, 4096, 264), 32);
  EXPECT_EQ(attn_span(0, 4096, 4096, 0, 32).chunk, 128);
}

}  // namespace
}  // namespace tpdraft::kernels::cuda
