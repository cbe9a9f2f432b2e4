// The dot-product engine (exact f32 dots of activation rows against weight rows in their storage
// dtype) and the matmul op built on it. A draft's linear layers are 16 rows against 2048..6144
// wide weights: 2 FLOPs per weight element per row, so the kernels are compute bound and keep an
// MR x NR tile of accumulators in registers, widening each weight vector once for MR rows.

#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/cpu/simd.h"

namespace tpdraft::kernels::cpu {

int64_t detail::packed_cols(int64_t cols) { return (cols + 31) / 32 * 32; }

void detail::pack_rows(Isa isa, DType wtype, const float* x, int64_t x_stride, int64_t m,
                       int64_t cols, float* packed) {
  const int64_t pc = packed_cols(cols);
  // Lanes of the kernels that will read the packing (see exact_dots); 0: natural order.
  const int64_t lanes = wtype != DType::BF16 ? 0 : isa >= Isa::Avx512 ? 16 : isa == Isa::Avx2 ? 8 : 0;
  for (int64_t i = 0; i < m; ++i) {
    const float* src = x + i * x_stride;
    float* dst = packed + i * pc;
    if (lanes == 0) {
      std::memcpy(dst, src, static_cast<size_t>(cols) * sizeof(float));
      std::fill(dst + cols, dst + pc, 0.0f);
      continue;
    }
    for (int64_t c = 0; c < pc; c += 2 * lanes) {
      for (int64_t l = 0; l < lanes; ++l) {
        const int64_t even = c + 2 * l, odd = even + 1;
        dst[c + l] = even < cols ? src[even] : 0.0f;
        dst[c + lanes + l] = odd < cols ? src[odd] : 0.0f;
      }
    }
  }
}

namespace {

using detail::WeightRows;

// ---------------------------------------------------------------------------------------------
// AVX-512 and AVX2. Per (x row, weight row) pair: one accumulator, fed chunk by chunk in column
// order, then reduced by a fixed halving tree, whatever MR and NR are.

// AVX only, so that the kernels of both levels inline it.
__attribute__((target("avx"))) TPDRAFT_INLINE float hsum256(__m256 a) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

TPDRAFT_TARGET_AVX512 TPDRAFT_INLINE float hsum512(__m512 a) {
  return hsum256(_mm256_add_ps(_mm512_castps512_ps256(a),
                               _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))));
}

// Prefetches element `off` of each of NR rows into L1.
template <int NR, typename Elem>
TPDRAFT_INLINE void prefetch_rows(const Elem* const* w, int64_t off) {
  for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(w[j] + off), _MM_HINT_T0);
}

// A weight chunk widened to f32 vectors of L lanes, part by part: a bf16 chunk of 2L elements is
// its L even (part 0: the bits shifted into the high half) and L odd elements (part 1: the high
// half masked), the order pack_rows gave x; an f16 or f32 chunk is one part of L elements.
struct Bf16W {
  using Elem = uint16_t;
  static constexpr int kParts = 2;
  TPDRAFT_TARGET_AVX512 static TPDRAFT_INLINE __m512 widen512(const Elem* w, int part) {
    const __m512i raw = _mm512_loadu_si512(w);
    return _mm512_castsi512_ps(part == 0 ? _mm512_slli_epi32(raw, 16)
                                         : _mm512_and_si512(raw, _mm512_set1_epi32(kOddMask)));
  }
  TPDRAFT_TARGET_AVX2 static TPDRAFT_INLINE __m256 widen256(const Elem* w, int part) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    return _mm256_castsi256_ps(part == 0 ? _mm256_slli_epi32(raw, 16)
                                         : _mm256_and_si256(raw, _mm256_set1_epi32(kOddMask)));
  }
  static constexpr int kOddMask = static_cast<int>(0xffff0000u);
};

struct F16W {
  using Elem = uint16_t;
  static constexpr int kParts = 1;
  TPDRAFT_TARGET_AVX512 static TPDRAFT_INLINE __m512 widen512(const Elem* w, int) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  }
  TPDRAFT_TARGET_AVX2 static TPDRAFT_INLINE __m256 widen256(const Elem* w, int) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  }
};

struct F32W {
  using Elem = float;
  static constexpr int kParts = 1;
  TPDRAFT_TARGET_AVX512 static TPDRAFT_INLINE __m512 widen512(const Elem* w, int) {
    return _mm512_loadu_ps(w);
  }
  TPDRAFT_TARGET_AVX2 static TPDRAFT_INLINE __m256 widen256(const Elem* w, int) {
    return _mm256_loadu_ps(w);
  }
};

// The kernels of one level for weights W: step() multiplies one chunk of NR weight rows into MR x
// rows, tile<MR>() runs the steps along whole rows.
// AVX-512, tile 4 x 6: 24 accumulators + 6 weight vectors + 1 x vector fill the 32 zmm registers,
// and per 32 bf16 columns 48 FMAs need 12 weight loads, 12 widening ops and 8 x loads. Measured at
// m = 16, K = 2048 it beats 4x4, 4x5, 6x4 (about even) and 8x3 (spills): ~70% of one core's FMA
// peak with data in L2. The last partial chunk is copied into a zero-padded buffer first, so reads
// never pass the end of a row and padding contributes exact zeros.
template <class W>
struct Avx512 {
  using Elem = typename W::Elem;
  static constexpr int kChunk = 16 * W::kParts, kMr = 4, kNr = 6;
  template <int MR, int NR>
  TPDRAFT_TARGET_AVX512 static TPDRAFT_INLINE void step(__m512 (&acc)[MR][NR], const Elem* const* w, int64_t off,
                                                        const float* x, int64_t xs) {
    for (int part = 0; part < W::kParts; ++part) {
      __m512 wv[NR];
      for (int j = 0; j < NR; ++j) wv[j] = W::widen512(w[j] + off, part);
      for (int i = 0; i < MR; ++i) {
        const __m512 xv = _mm512_loadu_ps(x + i * xs + 16 * part);
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(wv[j], xv, acc[i][j]);
      }
    }
  }
  template <int MR>
  TPDRAFT_TARGET_AVX512 static void tile(const Elem* const* w, int64_t cols, const float* x,
                                         int64_t xs, float* out, int64_t os, int64_t prefetch,
                                         int pf_phase, int pf_period) {
    constexpr int NR = kNr, C = kChunk;
    __m512 acc[MR][NR];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
    const int64_t full = cols / C * C;
    // Rows are often exactly one 4 KiB page, where hardware prefetchers stop: fetch the next
    // tile's rows (prefetch elements further on); the row groups of a block take turns.
    if (prefetch == 0)
      for (int64_t c = 0; c < full; c += C) step<MR, NR>(acc, w, c, x + c, xs);
    else
      for (int64_t c = 0, s = 0; c < full; c += C, ++s) {
        if (s % pf_period == pf_phase) prefetch_rows<NR>(w, c + prefetch);
        step<MR, NR>(acc, w, c, x + c, xs);
      }
    if (full < cols) {
      alignas(64) Elem tail[NR][C] = {};
      const Elem* tw[NR];
      for (int j = 0; j < NR; ++j)
        tw[j] = static_cast<Elem*>(std::memcpy(tail[j], w[j] + full, (cols - full) * sizeof(Elem)));
      step<MR, NR>(acc, tw, 0, x + full, xs);
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) out[i * os + j] = hsum512(acc[i][j]);
  }
};

// AVX2 + FMA + F16C: the same on 8 lanes with a 2 x 4 tile (8 accumulators + 4 weight vectors + x
// of the 16 ymm registers).
template <class W>
struct Avx2 {
  using Elem = typename W::Elem;
  static constexpr int kChunk = 8 * W::kParts, kMr = 2, kNr = 4;
  template <int MR, int NR>
  TPDRAFT_TARGET_AVX2 static TPDRAFT_INLINE void step(__m256 (&acc)[MR][NR], const Elem* const* w, int64_t off,
                                                      const float* x, int64_t xs) {
    for (int part = 0; part < W::kParts; ++part) {
      __m256 wv[NR];
      for (int j = 0; j < NR; ++j) wv[j] = W::widen256(w[j] + off, part);
      for (int i = 0; i < MR; ++i) {
        const __m256 xv = _mm256_loadu_ps(x + i * xs + 8 * part);
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(wv[j], xv, acc[i][j]);
      }
    }
  }
  template <int MR>
  TPDRAFT_TARGET_AVX2 static void tile(const Elem* const* w, int64_t cols, const float* x,
                                       int64_t xs, float* out, int64_t os, int64_t prefetch,
                                       int pf_phase, int pf_period) {
    constexpr int NR = kNr, C = kChunk;
    __m256 acc[MR][NR];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
    const int64_t full = cols / C * C;
    if (prefetch == 0)
      for (int64_t c = 0; c < full; c += C) step<MR, NR>(acc, w, c, x + c, xs);
    else
      for (int64_t c = 0, s = 0; c < full; c += C, ++s) {  // as in Avx512::tile
        if (s % pf_period == pf_phase) prefetch_rows<NR>(w, c + prefetch);
        step<MR, NR>(acc, w, c, x + c, xs);
      }
    if (full < cols) {
      alignas(32) Elem tail[NR][C] = {};
      const Elem* tw[NR];
      for (int j = 0; j < NR; ++j)
        tw[j] = static_cast<Elem*>(std::memcpy(tail[j], w[j] + full, (cols - full) * sizeof(Elem)));
      step<MR, NR>(acc, tw, 0, x + full, xs);
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) out[i * os + j] = hsum256(acc[i][j]);
  }
};

// ---------------------------------------------------------------------------------------------
// Portable: 8 partial sums per pair (so a baseline compiler can still use SSE), halving tree.

template <typename Elem>
float widen(Elem v, DType t) {
  if constexpr (sizeof(Elem) == 4) {
    return v;
  } else {
    return t == DType::BF16 ? bf16_to_f32(v) : f16_to_f32(v);
  }
}

template <typename Elem>
float scalar_dot(const Elem* w, DType t, const float* x, int64_t cols) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t c = 0; c < cols; c += 8) {
    for (int l = 0; l < 8; ++l) {
      // Past the row end x is zero padding; the weight is read only inside the row.
      const float wv = c + l < cols ? widen(w[c + l], t) : 0.0f;
      lanes[l] = lanes[l] + wv * x[c + l];
    }
  }
  for (int half = 4; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) lanes[l] = lanes[l] + lanes[l + half];
  return lanes[0];
}

template <typename Elem>
void scalar_dots(const WeightRows& w, int64_t row0, int64_t nrows, const float* packed, int64_t m, float* out,
                 int64_t os) {
  const int64_t xs = detail::packed_cols(w.cols);
  const auto* base = static_cast<const Elem*>(w.data);
  for (int64_t j = 0; j < nrows; ++j) {
    const Elem* row = base + (row0 + j) * w.stride;
    for (int64_t i = 0; i < m; ++i) out[i * os + j] = scalar_dot(row, w.dtype, packed + i * xs, w.cols);
  }
}

// ---------------------------------------------------------------------------------------------
// Tiling driver. Rows of x are taken in blocks that fit in L2 (so a large-m call, e.g. settle
// with m = 1024, does not stream x from memory once per weight tile); inside a block, each weight
// tile of NR rows is read once from memory and reused from L1 for every MR-row group of x.

template <class K>
using TileFn = void (*)(const typename K::Elem* const*, int64_t, const float*, int64_t, float*, int64_t, int64_t, int,
                        int);

template <class K, size_t... I>
const TileFn<K>* tile_table(std::index_sequence<I...>) {
  static constexpr TileFn<K> table[] = {&K::template tile<static_cast<int>(I) + 1>...};
  return table;
}

template <class K>
void simd_dots(const WeightRows& w, int64_t row0, int64_t nrows, const float* packed, int64_t m, float* out,
               int64_t os) {
  using Elem = typename K::Elem;
  constexpr int MRMAX = K::kMr, NR = K::kNr;
  static_assert(MRMAX >= 1 && MRMAX <= 8, "tile heights 1..8 are instantiated");
  const TileFn<K>* tiles = tile_table<K>(std::make_index_sequence<MRMAX>{});
  const int64_t xs = detail::packed_cols(w.cols);
  const int64_t block_bytes = 512 * 1024;  // half of a 1 MiB L2, the rest for weight tiles
  int64_t mc = std::max<int64_t>(MRMAX, block_bytes / (xs * 4) / MRMAX * MRMAX);
  const auto* base = static_cast<const Elem*>(w.data);
  float tmp[MRMAX * NR];
  for (int64_t mb = 0; mb < m; mb += mc) {
    const int64_t me = std::min(m, mb + mc);
    const int groups = static_cast<int>(std::min<int64_t>(4, (me - mb + MRMAX - 1) / MRMAX));
    for (int64_t j0 = 0; j0 < nrows; j0 += NR) {
      const int nr = static_cast<int>(std::min<int64_t>(NR, nrows - j0));
      const Elem* rows[NR];
      // A short last tile repeats its last row; the repeats are computed and dropped.
      for (int j = 0; j < NR; ++j) rows[j] = base + (row0 + j0 + std::min(j, nr - 1)) * w.stride;
      for (int64_t i0 = mb; i0 < me; i0 += MRMAX) {
        const int mr = static_cast<int>(std::min<int64_t>(MRMAX, me - i0));
        const bool direct = nr == NR;
        float* dst = direct ? out + i0 * os + j0 : tmp;
        // Every row group of the block prefetches a share of the next weight tile.
        const int group = static_cast<int>((i0 - mb) / MRMAX);
        tiles[mr - 1](rows, w.cols, packed + i0 * xs, xs, dst, direct ? os : NR, group < groups ? NR * w.stride : 0,
                      group, groups);
        if (!direct)
          for (int i = 0; i < mr; ++i)
            for (int j = 0; j < nr; ++j) out[(i0 + i) * os + j0 + j] = tmp[i * NR + j];
      }
    }
  }
}

// The dots of level L for the weights' dtype.
template <template <class> class L>
void level_dots(const WeightRows& w, int64_t row0, int64_t nrows, const float* packed, int64_t m,
                float* out, int64_t os) {
  if (w.dtype == DType::BF16) return simd_dots<L<Bf16W>>(w, row0, nrows, packed, m, out, os);
  if (w.dtype == DType::F16) return simd_dots<L<F16W>>(w, row0, nrows, packed, m, out, os);
  simd_dots<L<F32W>>(w, row0, nrows, packed, m, out, os);
}

// What the threads of one matmul share; lambdas capture it by one reference, which fits
// std::function's inline storage, so a call allocates nothing.
struct MatmulJob {
  Isa isa;
  detail::WeightRows w;
  int64_t n;  // weight rows = output columns
  const float* x;
  float* packed;
  int64_t m, pc;
  float* y;
  const float* bias;
};

// Threads split the output columns in units of 48 weight rows (a multiple of every tile width).
constexpr int64_t kColumnUnit = 48;

void matmul_columns(const MatmulJob& job, int64_t unit_begin, int64_t unit_end) {
  const int64_t n0 = unit_begin * kColumnUnit, n1 = std::min(job.n, unit_end * kColumnUnit);
  detail::exact_dots(job.isa, job.w, n0, n1 - n0, job.packed, job.m, job.y + n0, job.n);
  if (job.bias == nullptr) return;
  for (int64_t i = 0; i < job.m; ++i)
    for (int64_t c = n0; c < n1; ++c) job.y[i * job.n + c] += job.bias[c];
}

}  // namespace

void detail::exact_dots(Isa isa, const WeightRows& w, int64_t row0, int64_t nrows,
                        const float* packed, int64_t m, float* out, int64_t out_stride) {
  if (nrows <= 0 || m <= 0) return;
  if (isa >= Isa::Avx512) return level_dots<Avx512>(w, row0, nrows, packed, m, out, out_stride);
  if (isa == Isa::Avx2) return level_dots<Avx2>(w, row0, nrows, packed, m, out, out_stride);
  if (w.dtype == DType::F32) return scalar_dots<float>(w, row0, nrows, packed, m, out, out_stride);
  return scalar_dots<uint16_t>(w, row0, nrows, packed, m, out, out_stride);
}

void CpuOps::do_matmul(const Matrix& w, const float* x, int64_t m, float* y, const float* bias) {
  if (recording(&CpuOps::do_matmul, w, x, m, y, bias)) return;
  if (m == 0) return;
  if (w.quantized()) return qmatmul(w, x, m, y, bias);
  const int64_t pc = detail::packed_cols(w.cols);
  const MatmulJob job{
      active_isa(), {w.dtype, w.data, w.cols, w.cols}, w.rows, x, packed_.get(static_cast<size_t>(m * pc)), m, pc, y,
      bias};
  pool_.parallel_for(
      m,
      [&job](int64_t b, int64_t e, int) {
        detail::pack_rows(job.isa, job.w.dtype, job.x + b * job.w.cols, job.w.cols, e - b, job.w.cols,
                          job.packed + b * job.pc);
      },
      64);
  pool_.parallel_for((w.rows + kColumnUnit - 1) / kColumnUnit,
                     [&job](int64_t b, int64_t e, int) { matmul_columns(job, b, e); });
}

}  // namespace tpdraft::kernels::cpu
