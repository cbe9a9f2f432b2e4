// Which keys the CUDA attention kernels visit for which query rows: the session's context span,
// its cut into chunks, and each row's visible keys. Plain integer functions, compiled for the
// device by nvcc and for the host everywhere else, so the CPU tests check the kernels' very
// geometry against the visibility rule of kernels/ops.h (tests/kernels/test_attention_geometry.cpp).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TPDRAFT_HOST_DEVICE __host__ __device__
#else
#define TPDRAFT_HOST_DEVICE
#endif

namespace tpdraft::kernels::cuda {

constexpr int64_t kAttnTileKeys = 32;   // keys staged per tile
constexpr int64_t kAttnMinChunk = 64;   // two tiles: short contexts do not pay a merge per key

TPDRAFT_HOST_DEVICE inline int64_t attn_max(int64_t a, int64_t b) { return a > b ? a : b; }
TPDRAFT_HOST_DEVICE inline int64_t attn_min(int64_t a, int64_t b) { return a < b ? a : b; }

// Keys [lo, hi): context positions, or indices of the block's own rows.
struct KeyRange {
  int64_t lo = 0, hi = 0;
};

// The context positions any row of a session may see, [lo, lo + count) (row 0 sees the most:
// [max(begin, anchor - W + 1), min(end, anchor))), cut into `splits` chunks of `chunk` keys, a
// multiple of the tile and at least kAttnMinChunk; the last chunks may be empty.
struct AttnSpan {
  int64_t lo = 0, count = 0, chunk = 0;
};

TPDRAFT_HOST_DEVICE inline AttnSpan attn_span(int64_t begin, int64_t end, int64_t anchor, int64_t window,
                                              int64_t splits) {
  AttnSpan sp;
  sp.lo = window > 0 ? attn_max(begin, anchor - window + 1) : begin;
  sp.count = attn_max(0, attn_min(end, anchor) - sp.lo);
  const int64_t per = (sp.count + splits - 1) / splits;
  sp.chunk = attn_max(kAttnMinChunk, (per + kAttnTileKeys - 1) / kAttnTileKeys * kAttnTileKeys);
  return sp;
}

// Chunk c's context positions (empty when lo >= hi).
TPDRAFT_HOST_DEVICE inline KeyRange attn_chunk(const AttnSpan& sp, int64_t c) {
  KeyRange k;
  k.lo = sp.lo + c * sp.chunk;
  k.hi = attn_min(sp.lo + sp.count, k.lo + sp.chunk);
  return k;
}

// The context positions block row r may see within its session's span: from max(begin,
// anchor + r - W + 1) on (the span's end bounds the rest).
TPDRAFT_HOST_DEVICE inline int64_t attn_context_from(int64_t begin, int64_t anchor, int64_t window, int64_t r) {
  return window > 0 ? attn_max(begin, anchor + r - window + 1) : begin;
}

// The block rows j that block row r may see: causal -> j <= r; window W -> r - j < W, and when not
// causal also j - r < W.
TPDRAFT_HOST_DEVICE inline KeyRange attn_block_keys(int64_t r, int64_t block, bool causal, int64_t window) {
  KeyRange k;
  k.lo = window > 0 ? attn_max(0, r - window + 1) : 0;
  k.hi = causal ? r + 1 : block;
  if (window > 0 && !causal) k.hi = attn_min(k.hi, r + window);
  return k;
}

// The context chunks per session, sized from the occupancy API's figure: the whole grid,
// row_blocks x (splits + 1) blocks (the last chunk of each row block being its block's own keys),
// fits one wave of `resident` blocks (blocks per SM x SMs), so no tail wave runs after the rest;
// no more chunks than max_context has kAttnMinChunk keys for; at least one.
inline int64_t attn_plan_splits(int64_t row_blocks, int64_t max_context, int64_t resident) {
  const int64_t wave = resident / attn_max(1, row_blocks) - 1;
  const int64_t useful = (max_context + kAttnMinChunk - 1) / kAttnMinChunk;
  return attn_max(1, attn_min(wave, useful));
}

}  // namespace tpdraft::kernels::cuda
