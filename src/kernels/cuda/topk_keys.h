// The keys head_topk ranks by, and the digit walk of its per-block selection: plain functions,
// compiled for the device by nvcc and for the host everywhere else, so the CPU tests check them
// against the order of kernels/ops.h (tests/kernels/test_topk_keys.cpp).
//
// A (value, id) pair becomes one 64-bit key whose integer order is the wanted order: value
// descending (-0 as +0), then id ascending. A NaN logit becomes key 0, the padding key, and never
// wins: a real key's upper word is at least ord(-inf) = 0x007fffff.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TPDRAFT_TOPK_HD __host__ __device__ inline
#else
#define TPDRAFT_TOPK_HD inline
#endif

namespace tpdraft::kernels::cuda {

TPDRAFT_TOPK_HD uint64_t topk_key(float v, uint32_t id) {
  if (v != v) return 0;  // NaN
  if (v == 0.0f) v = 0.0f;
#if defined(__CUDA_ARCH__)
  uint32_t u = __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
#endif
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(u) << 32) | static_cast<uint32_t>(~id);
}

TPDRAFT_TOPK_HD uint32_t topk_key_id(uint64_t key) { return ~static_cast<uint32_t>(key); }

// Selection by digits, most significant byte first: among the keys that share the digits chosen
// so far, a histogram of the next byte; the bin that holds the need-th largest of them is the next
// digit. After eight bytes the chosen digits are the need-th largest key itself.
constexpr int kTopkDigitBits = 8;
constexpr int kTopkBins = 1 << kTopkDigitBits;

struct DigitPick {
  int digit = 0;
  uint32_t need = 0;  // the key's rank (1-based, from the largest) among the keys of that bin
};

// Walks bins hi - 1 down to lo, with `above` keys in the bins above hi: the bin of the need-th
// largest key. Requires above < need <= above + the bins' sum.
TPDRAFT_TOPK_HD DigitPick topk_pick_digit(const uint32_t* hist, int lo, int hi, uint32_t above, uint32_t need) {
  DigitPick p;
  for (int d = hi - 1; d >= lo; --d) {
    if (above + hist[d] >= need) {
      p.digit = d;
      p.need = need - above;
      return p;
    }
    above += hist[d];
  }
  p.digit = lo;
  p.need = need - above;
  return p;
}

// The host's run of the same walk over `n` keys (the tests' model of one block's selection):
// the k-th largest key, 1 <= k <= n.
inline uint64_t topk_select_kth(const uint64_t* keys, int64_t n, uint32_t k) {
  uint64_t prefix = 0, mask = 0;
  uint32_t need = k;
  for (int shift = 64 - kTopkDigitBits; shift >= 0; shift -= kTopkDigitBits) {
    uint32_t hist[kTopkBins] = {};
    for (int64_t i = 0; i < n; ++i)
      if ((keys[i] & mask) == prefix) ++hist[(keys[i] >> shift) & (kTopkBins - 1)];
    const DigitPick p = topk_pick_digit(hist, 0, kTopkBins, 0, need);
    prefix |= static_cast<uint64_t>(p.digit) << shift;
    mask |= static_cast<uint64_t>(kTopkBins - 1) << shift;
    need = p.need;
  }
  return prefix;
}

}  // namespace tpdraft::kernels::cuda
