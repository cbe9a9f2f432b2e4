// The head over a vocabulary slice: every logit (head_logits), or the exact top-k (head_topk).
// The head is a draft's largest matrix (151936 x 2048 bf16 = 622 MB, 9.3 GFLOP for 15 rows), so
// head_topk screens a bf16 head with vdpbf16ps (2x the f32 FMA rate) under a rigorous error bound
// and recomputes the few rows that can still win with head_logits' exact f32 dot (same bits).

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/dtype.h"
#include "kernels/cpu/simd.h"

namespace tpdraft::kernels::cpu {
namespace {

constexpr int64_t kBlock = 64;  // vocabulary rows per scan block (dots land in a [m, 64] tile)
constexpr float kInf = std::numeric_limits<float>::infinity();

// The logit of a raw dot: post(scale * dot), post(x) = cap * tanh(x / cap) when cap > 0. Both ops
// call this one function, so equal dots give bit-equal logits. For scale > 0 it is monotone
// non-decreasing in dot (f32 multiply, divide and tanhf are), which the top-k scan relies on.
float logit_of(float dot, float scale, float cap) {
  const float x = scale * dot;
  return cap > 0.0f ? cap * std::tanh(x / cap) : x;
}

// Order-preserving map of floats to integers (-0 and +0 both map to 0), and back.
int64_t float_order(float f) {
  const uint32_t u = bit_cast<uint32_t>(f);
  return (u & 0x80000000u) ? -static_cast<int64_t>(u & 0x7fffffffu) : static_cast<int64_t>(u);
}
float order_float(int64_t k) {
  return bit_cast<float>(k >= 0 ? static_cast<uint32_t>(k) : (static_cast<uint32_t>(-k) | 0x80000000u));
}

// The smallest raw dot x with logit_of(x) >= logit_of(t). Rounding of scale * x and tanh's
// saturation map runs of raw values to one logit, so a row whose raw dot is a little below t
// can tie the logit of t and then win on its lower id: the scan must keep it. Galloping search
// down from t, then bisection; usually a handful of evaluations.
float raw_cutoff(float t, float scale, float cap) {
  if (!(t > -kInf)) return -kInf;
  const float target = logit_of(t, scale, cap);
  const int64_t floor_key = float_order(-kInf);
  int64_t good = float_order(t), bad = floor_key, step = 1;
  for (;;) {
    const int64_t probe = good - step;
    if (probe <= floor_key) {
      if (logit_of(-kInf, scale, cap) >= target) return -kInf;
      break;
    }
    if (logit_of(order_float(probe), scale, cap) >= target) {
      good = probe;
      step *= 2;
    } else {
      bad = probe;
      break;
    }
  }
  while (good - bad > 1) {
    const int64_t mid = bad + (good - bad) / 2;
    (logit_of(order_float(mid), scale, cap) >= target ? good : bad) = mid;
  }
  return order_float(good);
}

// ---------------------------------------------------------------------------------------------
// Screening dots with vdpbf16ps: weight rows (bf16) against input rows rounded to bf16, 32
// columns per instruction. The input rows are zero padded to packed_cols; the weight tail is a
// masked load. Tile: MR input rows x 4 weight rows (a draft's 15 rows are 3 tiles of 5).

constexpr int kDpNr = 4, kDpMr = 5;

template <int MR>
TPDRAFT_TARGET_AVX512BF16 void dp_tile(const uint16_t* const* w, int64_t cols, const uint16_t* g, int64_t gs,
                                       float* out, int64_t os, int64_t prefetch, int pf_phase, int pf_period) {
  __m512 acc[MR][kDpNr];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kDpNr; ++j) acc[i][j] = _mm512_setzero_ps();
  const int64_t full = cols / 32 * 32;
  for (int64_t c = 0, s = 0; c < full; c += 32, ++s) {
    __m512bh wv[kDpNr];
    for (int j = 0; j < kDpNr; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(w[j] + c);
    // A 2048-column row is one 4 KiB page, where hardware prefetch stops: fetch the next tile,
    // the input row groups taking turns.
    if (s % pf_period == pf_phase)
      for (int j = 0; j < kDpNr; ++j) _mm_prefetch(reinterpret_cast<const char*>(w[j] + c + prefetch), _MM_HINT_T0);
    for (int i = 0; i < MR; ++i) {
      const __m512bh gv = (__m512bh)_mm512_loadu_si512(g + i * gs + c);
      for (int j = 0; j < kDpNr; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[j], gv);
    }
  }
  if (full < cols) {
    const __mmask32 m = static_cast<__mmask32>((1ull << (cols - full)) - 1);
    __m512bh wv[kDpNr];
    for (int j = 0; j < kDpNr; ++j) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(m, w[j] + full);
    for (int i = 0; i < MR; ++i) {
      const __m512bh gv = (__m512bh)_mm512_loadu_si512(g + i * gs + full);
      for (int j = 0; j < kDpNr; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[j], gv);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kDpNr; ++j) out[i * os + j] = _mm512_reduce_add_ps(acc[i][j]);
}

using DpFn = void (*)(const uint16_t* const*, int64_t, const uint16_t*, int64_t, float*, int64_t, int64_t, int, int);

void screen_dots(const detail::WeightRows& w, int64_t row0, int64_t nrows, const uint16_t* g, int64_t m, float* out,
                 int64_t os) {
  static constexpr DpFn tiles[kDpMr] = {&dp_tile<1>, &dp_tile<2>, &dp_tile<3>, &dp_tile<4>, &dp_tile<5>};
  const int64_t gs = detail::packed_cols(w.cols);
  const auto* base = static_cast<const uint16_t*>(w.data);
  float tmp[kDpMr * kDpNr];
  const int groups = static_cast<int>((m + kDpMr - 1) / kDpMr);
  for (int64_t j0 = 0; j0 < nrows; j0 += kDpNr) {
    const int nr = static_cast<int>(std::min<int64_t>(kDpNr, nrows - j0));
    const uint16_t* rows[kDpNr];
    for (int j = 0; j < kDpNr; ++j) rows[j] = base + (row0 + j0 + std::min(j, nr - 1)) * w.stride;
    for (int64_t i0 = 0; i0 < m; i0 += kDpMr) {
      const int mr = static_cast<int>(std::min<int64_t>(kDpMr, m - i0));
      tiles[mr - 1](rows, w.cols, g + i0 * gs, gs, tmp, kDpNr, kDpNr * w.stride, static_cast<int>(i0 / kDpMr), groups);
      for (int i = 0; i < mr; ++i)
        for (int j = 0; j < nr; ++j) out[(i0 + i) * os + j0 + j] = tmp[i * kDpNr + j];
    }
  }
}

// ||row||_2 of bf16 rows, f32 sums over 16 lanes. The sum's relative error is below
// (cols/16 + 4) * 2^-24 (~1e-5 for 2048 columns) and squares below 2^-126 may lose up to
// cols * 2^-126 in total, so the result is inflated by 1e-4 relative plus sqrt(cols) * 2^-62
// absolute: an upper bound on the true norm, which is all the screening bound needs.
TPDRAFT_TARGET_AVX512 void bf16_row_norms(const uint16_t* base, int64_t stride, int64_t cols, int64_t r0, int64_t r1,
                                          float* out) {
  const double floor = std::sqrt(static_cast<double>(cols)) * std::ldexp(1.0, -62);
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* w = base + r * stride;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; c += 16) {
      const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask16(cols - c), w + c));
      const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
      acc = _mm512_fmadd_ps(x, x, acc);
    }
    const double sum = _mm512_reduce_add_ps(acc);
    out[r] = static_cast<float>(std::sqrt(sum) * (1.0 + 1e-4) + floor);
  }
}

// FNV-1a over 256 elements spread evenly across the matrix: cheap (a few hundred cache lines)
// next to the 10+ ms a draft's head pass takes, and any reload of different weights changes it.
uint64_t head_fingerprint(const Matrix& head) {
  const auto* e = static_cast<const uint16_t*>(head.data);
  const uint64_t total = static_cast<uint64_t>(head.rows) * static_cast<uint64_t>(head.cols);
  uint64_t hash = 1469598103934665603ull;
  for (uint64_t t = 0; t < 256; ++t) {
    hash ^= e[(t * (total - 1)) / 255];
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace

const std::vector<float>& CpuOps::head_row_norms(const Matrix& head) {
  std::lock_guard<std::mutex> lock(norms_mutex_);
  const uint64_t fingerprint = head_fingerprint(head);
  RowNorms& entry = norms_[std::make_tuple(head.data, head.rows, head.cols)];
  if (entry.norms.size() == static_cast<size_t>(head.rows) && entry.fingerprint == fingerprint) return entry.norms;
  entry.norms.assign(static_cast<size_t>(head.rows), 0.0f);
  entry.fingerprint = fingerprint;
  const auto* base = static_cast<const uint16_t*>(head.data);
  float* out = entry.norms.data();
  pool_.parallel_for(head.rows,
                     [&](int64_t b, int64_t e, int) { bf16_row_norms(base, head.cols, head.cols, b, e, out); });
  return entry.norms;
}

const float* CpuOps::quantized_head_dots(const HeadParams& p) {
  float* dots = qhead_.get(static_cast<size_t>(p.m * p.head.rows));
  qmatmul(p.head, p.g, p.m, dots, nullptr);
  return dots;
}

void CpuOps::do_head_logits(const HeadParams& p, float* logits) {
  if (recording(&CpuOps::do_head_logits, p, logits)) return;
  if (p.m == 0 || p.valid_rows == 0) return;
  if (p.head.quantized()) {
    const float* dots = quantized_head_dots(p);
    const int64_t n = p.valid_rows, rows = p.head.rows;
    pool_.parallel_for(p.m, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i)
        for (int64_t v = 0; v < n; ++v) logits[i * n + v] = logit_of(dots[i * rows + v], p.scale, p.cap);
    });
    return;
  }
  const Isa isa = active_isa();
  const int64_t h = p.head.cols, pc = detail::packed_cols(h), n = p.valid_rows;
  float* packed = packed_.get(static_cast<size_t>(p.m * pc));
  detail::pack_rows(isa, p.head.dtype, p.g, h, p.m, h, packed);
  const detail::WeightRows rows{p.head.dtype, p.head.data, h, h};
  pool_.parallel_for((n + kBlock - 1) / kBlock, [&](int64_t b, int64_t e, int) {
    const int64_t v0 = b * kBlock, v1 = std::min(n, e * kBlock);
    detail::exact_dots(isa, rows, v0, v1 - v0, packed, p.m, logits + v0, n);
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t v = v0; v < v1; ++v) logits[i * n + v] = logit_of(logits[i * n + v], p.scale, p.cap);
  });
}

// Screening bound (per input row g, vocabulary row w; d = exact real dot, g_hi = bf16(g), A the
// vdpbf16ps result, E the exact f32 path's result, u = 2^-24, n = 2 ceil(H/32) + 8 the longest
// chain of roundings any lane of either kernel sees, 2 per 32 columns plus the final reduction):
//   |E - d|          <= gamma_n sum|w_i g_i|    <= gamma_n ||w|| ||g||        (Cauchy-Schwarz)
//   |d - w.g_hi|     =  |w.(g - g_hi)|          <= ||w|| ||g - g_hi||
//   |w.g_hi - A|     <= gamma_n ||w|| ||g_hi||  + flush-to-zero terms of vdpbf16ps (inputs and
//                       results below 2^-126 become 0: at most 2^-126 (sqrt(H)(||g||+||w||) + 16n))
// gamma_n is doubled in case an implementation rounds more often than this model, the sum is
// inflated by 1e-3, and 2^-20 ||w|| ||g_hi|| covers rounding when forming A +- bound in f32.
// The ||g - g_hi|| term dominates (~2^-9 ||g||); the rest adds a few percent.
void CpuOps::do_head_topk(const HeadParams& p, int k, int64_t id_base, float* values, int64_t* ids) {
  if (recording(&CpuOps::do_head_topk, p, k, id_base, values, ids)) return;
  if (p.m == 0) return;
  if (p.head.quantized()) {
    // The dots are the matmul kernels' (exact for the quantized model): scan them with no bound.
    const float* dots = p.valid_rows > 0 ? quantized_head_dots(p) : nullptr;
    head_scan(p, k, false, nullptr, dots);
    head_finish(p, k, id_base, values, ids, dots);
    return;
  }
  const Isa isa = active_isa();
  const int64_t h = p.head.cols, pc = detail::packed_cols(h);
  float* packed = packed_.get(static_cast<size_t>(p.m * pc));
  detail::pack_rows(isa, p.head.dtype, p.g, h, p.m, h, packed);
  const bool screen = p.head.dtype == DType::BF16 && isa == Isa::Avx512Bf16 && p.valid_rows > 0;
  const float* norms = nullptr;
  if (screen) {
    norms = head_row_norms(p.head).data();
    packed_bf16_.get(static_cast<size_t>(p.m * pc));
    bound_scale_.resize(static_cast<size_t>(p.m));
    bound_slack_.resize(static_cast<size_t>(p.m));
    const double chain = 2.0 * static_cast<double>((h + 31) / 32) + 8.0;
    const double gamma = 2.0 * chain * std::ldexp(1.0, -24) / (1.0 - chain * std::ldexp(1.0, -24));
    const double tiny = std::ldexp(1.0, -126);
    for (int64_t i = 0; i < p.m; ++i) {
      const float* g = p.g + i * h;
      uint16_t* gb = packed_bf16_.data() + i * pc;
      double gn = 0, hn = 0, en = 0;
      for (int64_t c = 0; c < h; ++c) {
        gb[c] = f32_to_bf16(g[c]);
        const double hi = bf16_to_f32(gb[c]);
        gn += static_cast<double>(g[c]) * g[c];
        hn += hi * hi;
        en += (g[c] - hi) * (g[c] - hi);
      }
      std::fill(gb + h, gb + pc, uint16_t{0});
      gn = std::sqrt(gn), hn = std::sqrt(hn), en = std::sqrt(en);
      const double per_norm =
          (en + gamma * (gn + hn) + tiny * std::sqrt(static_cast<double>(h))) * (1.0 + 1e-3) + std::ldexp(hn, -20);
      const double slack = tiny * (std::sqrt(static_cast<double>(h)) * gn + 16.0 * chain + 1.0) * 2.0;
      bound_scale_[i] = static_cast<float>(per_norm * (1.0 + 1e-6));
      bound_slack_[i] = static_cast<float>(slack);
    }
  }
  head_scan(p, k, screen, norms, nullptr);
  head_finish(p, k, id_base, values, ids, nullptr);
}

// Pass 1. Each worker takes a contiguous vocabulary range and keeps, per input row, a min-heap
// of the k largest lower bounds A - bound it has seen; its k-th (T) is a lower bound of the
// row's true k-th raw dot, so a vocabulary row whose upper bound A + bound is below
// raw_cutoff(T) cannot be in the top k, and every other row is recorded as a candidate. Without
// screening the dots are exact and the bound is 0.
void CpuOps::head_scan(const HeadParams& p, int k, bool screen, const float* norms, const float* qdots) {
  const Isa isa = active_isa();
  const int64_t n = p.valid_rows, h = p.head.cols;
  const detail::WeightRows rows{p.head.dtype, p.head.data, h, h};
  for (auto& w : workers_) {
    w.scans.resize(static_cast<size_t>(p.m));
    for (auto& s : w.scans) {
      s.best.clear();
      s.candidates.clear();
      s.cutoff = -kInf;
    }
  }
  pool_.parallel_for((n + kBlock - 1) / kBlock, [&](int64_t b, int64_t e, int worker) {
    Worker& wk = workers_[worker];
    float* tile = wk.buf.get(static_cast<size_t>(p.m * kBlock));
    for (int64_t v0 = b * kBlock; v0 < std::min(n, e * kBlock); v0 += kBlock) {
      const int64_t cnt = std::min(kBlock, n - v0);
      if (screen)
        screen_dots(rows, v0, cnt, packed_bf16_.data(), p.m, tile, kBlock);
      else if (qdots == nullptr)  // a quantized head's dots are read in place below
        detail::exact_dots(isa, rows, v0, cnt, packed_.data(), p.m, tile, kBlock);
      for (int64_t i = 0; i < p.m; ++i) {
        RowScan& s = wk.scans[i];
        const float sc = screen ? bound_scale_[i] : 0.0f, sl = screen ? bound_slack_[i] : 0.0f;
        const float* a = qdots != nullptr ? qdots + i * p.head.rows + v0 : tile + i * kBlock;
        for (int64_t j = 0; j < cnt; ++j) {
          const float bound = screen ? norms[v0 + j] * sc + sl : 0.0f;
          const float upper = a[j] + bound;
          if (!(upper >= s.cutoff)) continue;
          const float lower = a[j] - bound;
          s.candidates.push_back({v0 + j, upper});
          if (static_cast<int64_t>(s.best.size()) < k) {
            s.best.push_back(lower);
            std::push_heap(s.best.begin(), s.best.end(), std::greater<float>());
            if (static_cast<int64_t>(s.best.size()) == k) s.cutoff = raw_cutoff(s.best.front(), p.scale, p.cap);
          } else if (lower > s.best.front()) {
            std::pop_heap(s.best.begin(), s.best.end(), std::greater<float>());
            s.best.back() = lower;
            std::push_heap(s.best.begin(), s.best.end(), std::greater<float>());
            s.cutoff = raw_cutoff(s.best.front(), p.scale, p.cap);
          }
        }
      }
    }
  });
}

// Pass 2, per input row: T = the k-th largest lower bound over all workers (a lower bound of the
// k-th exact dot E_k). A top-k row v has logit_of(E_v) >= logit_of(E_k) >= logit_of(T) and
// upper_v >= E_v, so upper_v >= raw_cutoff(T): filtering candidates by that keeps every top-k row
// and every row tying the k-th logit. Survivors are recomputed with the exact dot of head_logits.
void CpuOps::head_finish(const HeadParams& p, int k, int64_t id_base, float* values, int64_t* ids,
                         const float* qdots) {
  const Isa isa = active_isa();
  const int64_t h = p.head.cols, pc = detail::packed_cols(h);
  const detail::WeightRows rows{p.head.dtype, p.head.data, h, h};
  pool_.parallel_for(p.m, [&](int64_t b, int64_t e, int worker) {
    Worker& wk = workers_[worker];
    for (int64_t i = b; i < e; ++i) {
      wk.lower.clear();
      for (const auto& w : workers_) wk.lower.insert(wk.lower.end(), w.scans[i].best.begin(), w.scans[i].best.end());
      float t = -kInf;
      if (static_cast<int64_t>(wk.lower.size()) >= k) {
        std::nth_element(wk.lower.begin(), wk.lower.begin() + (k - 1), wk.lower.end(), std::greater<float>());
        t = wk.lower[k - 1];
      }
      const float cutoff = raw_cutoff(t, p.scale, p.cap);
      wk.picks.clear();
      for (const auto& w : workers_) {
        for (const Candidate& c : w.scans[i].candidates) {
          if (!(c.upper >= cutoff)) continue;
          float dot;
          if (qdots != nullptr)
            dot = qdots[i * p.head.rows + c.row];
          else
            detail::exact_dots(isa, rows, c.row, 1, packed_.data() + i * pc, 1, &dot, 1);
          wk.picks.push_back({logit_of(dot, p.scale, p.cap), c.row});
        }
      }
      // NaN logits order last, so the comparison stays a strict weak order.
      auto key = [](float v) { return std::isnan(v) ? -kInf : v; };
      auto better = [&](const Pick& x, const Pick& y) {
        const float kx = key(x.value), ky = key(y.value);
        return kx > ky || (kx == ky && x.row < y.row);
      };
      const int64_t take = std::min<int64_t>(k, static_cast<int64_t>(wk.picks.size()));
      std::partial_sort(wk.picks.begin(), wk.picks.begin() + take, wk.picks.end(), better);
      for (int64_t j = 0; j < k; ++j) {
        values[i * k + j] = j < take ? wk.picks[j].value : -kInf;
        ids[i * k + j] = j < take ? wk.picks[j].row + id_base : -1;
      }
    }
  });
}

}  // namespace tpdraft::kernels::cpu
