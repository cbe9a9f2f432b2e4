// Block attention over a session's context ring and the block's own keys (docs/model.md), as
// small matrix products. For each kv head, the block's rows of every query head reading it
// (R = B x group rows) meet the keys in tiles of kTile. Everything is held transposed, rows
// innermost: the queries as Q^T [D][R], a tile's scores as S^T [keys][R] and the output as O^T
// [D][R], so that both products (S^T = K Q^T, O^T += V^T S^T) are the same broadcast kernel (a
// key or value element times a vector of rows, K and V read in place from the ring) and the
// online softmax (a running max and sum per row) runs on vectors of rows without one horizontal
// step. A long context is cut into chunks of kChunk positions that run on different threads
// (flash-decoding): each leaves its rows' max, sum and unnormalised output, and the merge
// rescales them to the common max. Sliding layers read only their window. The context may be held
// in f32 or bf16 (AttentionParams::kv_dtype; a bf16 tile is widened once, then read as f32).
//
// Every split is fixed by the session's own positions (chunks of kChunk, tiles of kTile from the
// start of its span, a ring's wrap inside a tile changes nothing): a row's result depends on its
// own session only, never on the batch it is drafted in, the thread count or where the ring wraps.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "kernels/cpu/simd.h"

namespace tpdraft::kernels::cpu {
namespace {

constexpr int64_t kTile = 128;    // keys per score tile: S^T [kTile][R] stays in L1 / L2
constexpr int64_t kChunk = 2048;  // context positions per work item (a multiple of kTile)
constexpr int64_t kRowPad = 16;   // rows are padded to a multiple of the widest vector
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// The broadcast kernel: out[a][r] (+)= sum_{k < nc} x[a * sa + k * sc] * y[k * ys + r] for
// a < na and r < nr (a multiple of the vector width), out rows os apart. Each out element is one
// FMA chain in k order, whatever the tile: the split into register tiles changes no bit.

// The accumulators are named variables, not an array: GCC 12 at -O3 stores an array of them to
// the stack on every pass of the k loop (a store per FMA, a third of the FMA rate).
#define TPDRAFT_ACC_ROW(V, i) [[maybe_unused]] V c##i##0, c##i##1, c##i##2, c##i##3
#define TPDRAFT_FOR_V(i, what)      \
  do {                              \
    what(i, 0);                     \
    if constexpr (RV > 1) what(i, 1); \
    if constexpr (RV > 2) what(i, 2); \
    if constexpr (RV > 3) what(i, 3); \
  } while (0)
#define TPDRAFT_FOR_A(what)                    \
  what(0);                                     \
  if constexpr (NA > 1) what(1);               \
  if constexpr (NA > 2) what(2);               \
  if constexpr (NA > 3) what(3);               \
  if constexpr (NA > 4) what(4);               \
  if constexpr (NA > 5) what(5)

template <int NA, int RV>
TPDRAFT_TARGET_AVX2 void bcast_tile256(const float* x, int64_t sa, int64_t sc, int64_t nc, const float* y, int64_t ys,
                                       float* out, int64_t os, bool accumulate) {
  static_assert(NA >= 1 && NA <= 6 && RV >= 1 && RV <= 4);
  TPDRAFT_ACC_ROW(__m256, 0); TPDRAFT_ACC_ROW(__m256, 1); TPDRAFT_ACC_ROW(__m256, 2);
  TPDRAFT_ACC_ROW(__m256, 3); TPDRAFT_ACC_ROW(__m256, 4); TPDRAFT_ACC_ROW(__m256, 5);
  [[maybe_unused]] __m256 y0, y1, y2, y3;
#define TPDRAFT_INIT(i, v) c##i##v = accumulate ? _mm256_loadu_ps(out + i * os + 8 * v) : _mm256_setzero_ps()
#define TPDRAFT_INIT_A(i) TPDRAFT_FOR_V(i, TPDRAFT_INIT)
  TPDRAFT_FOR_A(TPDRAFT_INIT_A);
  for (int64_t k = 0; k < nc; ++k) {
    const float* yk = y + k * ys;
    const float* xk = x + k * sc;
#define TPDRAFT_LOAD_Y(i, v) y##v = _mm256_loadu_ps(yk + 8 * v)
    TPDRAFT_FOR_V(0, TPDRAFT_LOAD_Y);
#define TPDRAFT_FMA(i, v) c##i##v = _mm256_fmadd_ps(b, y##v, c##i##v)
#define TPDRAFT_STEP_A(i)                                  \
  do {                                                     \
    const __m256 b = _mm256_broadcast_ss(xk + i * sa);     \
    TPDRAFT_FOR_V(i, TPDRAFT_FMA);                         \
  } while (0)
    TPDRAFT_FOR_A(TPDRAFT_STEP_A);
  }
#define TPDRAFT_STORE(i, v) _mm256_storeu_ps(out + i * os + 8 * v, c##i##v)
#define TPDRAFT_STORE_A(i) TPDRAFT_FOR_V(i, TPDRAFT_STORE)
  TPDRAFT_FOR_A(TPDRAFT_STORE_A);
#undef TPDRAFT_INIT
#undef TPDRAFT_LOAD_Y
#undef TPDRAFT_FMA
#undef TPDRAFT_STEP_A
#undef TPDRAFT_STORE
}

template <int NA, int RV>
TPDRAFT_TARGET_AVX512 void bcast_tile512(const float* x, int64_t sa, int64_t sc, int64_t nc, const float* y, int64_t ys,
                                         float* out, int64_t os, bool accumulate) {
  static_assert(NA >= 1 && NA <= 6 && RV >= 1 && RV <= 4);
  TPDRAFT_ACC_ROW(__m512, 0); TPDRAFT_ACC_ROW(__m512, 1); TPDRAFT_ACC_ROW(__m512, 2);
  TPDRAFT_ACC_ROW(__m512, 3); TPDRAFT_ACC_ROW(__m512, 4); TPDRAFT_ACC_ROW(__m512, 5);
  [[maybe_unused]] __m512 y0, y1, y2, y3;
#define TPDRAFT_INIT(i, v) c##i##v = accumulate ? _mm512_loadu_ps(out + i * os + 16 * v) : _mm512_setzero_ps()
  TPDRAFT_FOR_A(TPDRAFT_INIT_A);
  for (int64_t k = 0; k < nc; ++k) {
    const float* yk = y + k * ys;
    const float* xk = x + k * sc;
#define TPDRAFT_LOAD_Y(i, v) y##v = _mm512_loadu_ps(yk + 16 * v)
    TPDRAFT_FOR_V(0, TPDRAFT_LOAD_Y);
#define TPDRAFT_FMA(i, v) c##i##v = _mm512_fmadd_ps(b, y##v, c##i##v)
#define TPDRAFT_STEP_A(i)                                  \
  do {                                                     \
    const __m512 b = _mm512_set1_ps(xk[i * sa]);           \
    TPDRAFT_FOR_V(i, TPDRAFT_FMA);                         \
  } while (0)
    TPDRAFT_FOR_A(TPDRAFT_STEP_A);
  }
#define TPDRAFT_STORE(i, v) _mm512_storeu_ps(out + i * os + 16 * v, c##i##v)
  TPDRAFT_FOR_A(TPDRAFT_STORE_A);
#undef TPDRAFT_INIT
#undef TPDRAFT_LOAD_Y
#undef TPDRAFT_FMA
#undef TPDRAFT_STEP_A
#undef TPDRAFT_STORE
}
#undef TPDRAFT_ACC_ROW
#undef TPDRAFT_FOR_V
#undef TPDRAFT_FOR_A
#undef TPDRAFT_INIT_A
#undef TPDRAFT_STORE_A

void bcast_scalar(const float* x, int64_t sa, int64_t sc, int64_t na, int64_t nc, const float* y, int64_t ys,
                  int64_t nr, float* out, int64_t os, bool accumulate) {
  for (int64_t a = 0; a < na; ++a)
    for (int64_t r = 0; r < nr; ++r) {
      float acc = accumulate ? out[a * os + r] : 0.0f;
      for (int64_t k = 0; k < nc; ++k) acc = std::fma(x[a * sa + k * sc], y[k * ys + r], acc);
      out[a * os + r] = acc;
    }
}

using BcastFn = void (*)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t, bool);

// Register tiles: AVX2 6 x 2 vectors (12 accumulators, 2 row vectors and a broadcast: 15 of the
// 16 ymm registers; 8 loads per 12 FMAs); AVX-512 6 x 4 (24 + 4 + 1 of the 32 zmm registers). The
// tables hold every smaller tile for the edges: entry (na - 1) * RV + rv - 1.
template <int RV, int... I>
constexpr std::array<BcastFn, sizeof...(I)> tiles256(std::integer_sequence<int, I...>) {
  return {&bcast_tile256<I / RV + 1, I % RV + 1>...};
}
template <int RV, int... I>
constexpr std::array<BcastFn, sizeof...(I)> tiles512(std::integer_sequence<int, I...>) {
  return {&bcast_tile512<I / RV + 1, I % RV + 1>...};
}
constexpr int kNa256 = 6, kRv256 = 2, kNa512 = 6, kRv512 = 4;

BcastFn bcast_kernel(Isa isa, int na, int rv) {
  static constexpr auto k256 = tiles256<kRv256>(std::make_integer_sequence<int, kNa256 * kRv256>{});
  static constexpr auto k512 = tiles512<kRv512>(std::make_integer_sequence<int, kNa512 * kRv512>{});
  return isa >= Isa::Avx512 ? k512[(na - 1) * kRv512 + rv - 1] : k256[(na - 1) * kRv256 + rv - 1];
}

// The whole product over na x nr (nr a multiple of kRowPad).
void bcast(Isa isa, const float* x, int64_t sa, int64_t sc, int64_t na, int64_t nc, const float* y, int64_t ys,
           int64_t nr, float* out, int64_t os, bool accumulate) {
  if (na <= 0 || nr <= 0) return;
  if (isa < Isa::Avx2) return bcast_scalar(x, sa, sc, na, nc, y, ys, nr, out, os, accumulate);
  const bool wide = isa >= Isa::Avx512;
  const int64_t lanes = wide ? 16 : 8, ta = wide ? kNa512 : kNa256, trv = wide ? kRv512 : kRv256;
  const int64_t vecs = nr / lanes;
  for (int64_t a0 = 0; a0 < na; a0 += ta) {
    const int64_t a_here = std::min(ta, na - a0);
    for (int64_t v0 = 0; v0 < vecs; v0 += trv) {
      const int64_t v_here = std::min(trv, vecs - v0);
      bcast_kernel(isa, static_cast<int>(a_here), static_cast<int>(v_here))(
          x + a0 * sa, sa, sc, nc, y + v0 * lanes, ys, out + a0 * os + v0 * lanes, os, accumulate);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The online softmax of one tile, on S^T [n][rp]: scores scaled, row r's keys outside [a[r],
// e[r]) dropped (all kept when `masked` is false), the rows' max m and sum l updated, O^T [d][rp]
// rescaled where a max grew, and S^T left holding exp(score - m) (0 where dropped).

struct TileRows {
  const int32_t* a;  // [rp] first visible key of the tile, per row
  const int32_t* e;  // [rp] end of the visible keys
  bool masked;
};

TPDRAFT_TARGET_AVX2 void softmax_tile256(float* st, int64_t n, int64_t rp, float scale, const TileRows& vis,
                                         float* m, float* l, float* o, int64_t d) {
  const __m256 sc = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-kInf), zero = _mm256_setzero_ps();
  for (int64_t r = 0; r < rp; r += 8) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vis.a + r));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vis.e + r));
    __m256 mx = ninf;
    for (int64_t j = 0; j < n; ++j) {
      __m256 x = _mm256_mul_ps(_mm256_loadu_ps(st + j * rp + r), sc);
      if (vis.masked) {
        const __m256i jv = _mm256_set1_epi32(static_cast<int>(j));
        const __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(a, jv), _mm256_cmpgt_epi32(_mm256_add_epi32(jv, _mm256_set1_epi32(1)), e));
        x = _mm256_blendv_ps(x, ninf, _mm256_castsi256_ps(out));
      }
      _mm256_storeu_ps(st + j * rp + r, x);
      mx = _mm256_max_ps(mx, x);
    }
    const __m256 m_old = _mm256_loadu_ps(m + r), m_new = _mm256_max_ps(m_old, mx);
    // exp(old - new), 1 where the max stayed (also -inf == -inf), 0 from -inf.
    const __m256 same = _mm256_cmp_ps(m_old, m_new, _CMP_EQ_OQ);
    const __m256 grew = _mm256_cmp_ps(m_old, m_new, _CMP_LT_OQ);
    if (_mm256_movemask_ps(grew) != 0) {
      const __m256 f = _mm256_blendv_ps(_mm256_and_ps(exp256(_mm256_sub_ps(m_old, m_new)),
                                                      _mm256_cmp_ps(m_old, ninf, _CMP_NEQ_OQ)),
                                        _mm256_set1_ps(1.0f), same);
      _mm256_storeu_ps(l + r, _mm256_mul_ps(_mm256_loadu_ps(l + r), f));
      for (int64_t c = 0; c < d; ++c) _mm256_storeu_ps(o + c * rp + r, _mm256_mul_ps(_mm256_loadu_ps(o + c * rp + r), f));
    }
    _mm256_storeu_ps(m + r, m_new);
    __m256 sum = zero;
    for (int64_t j = 0; j < n; ++j) {
      const __m256 x = _mm256_loadu_ps(st + j * rp + r);
      const __m256 p = _mm256_and_ps(exp256(_mm256_sub_ps(x, m_new)), _mm256_cmp_ps(x, ninf, _CMP_NEQ_OQ));
      _mm256_storeu_ps(st + j * rp + r, p);
      sum = _mm256_add_ps(sum, p);
    }
    _mm256_storeu_ps(l + r, _mm256_add_ps(_mm256_loadu_ps(l + r), sum));
  }
}

TPDRAFT_TARGET_AVX512 void softmax_tile512(float* st, int64_t n, int64_t rp, float scale, const TileRows& vis,
                                           float* m, float* l, float* o, int64_t d) {
  const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-kInf);
  for (int64_t r = 0; r < rp; r += 16) {
    const __m512i a = _mm512_loadu_si512(vis.a + r), e = _mm512_loadu_si512(vis.e + r);
    __m512 mx = ninf;
    for (int64_t j = 0; j < n; ++j) {
      __m512 x = _mm512_mul_ps(_mm512_loadu_ps(st + j * rp + r), sc);
      if (vis.masked) {
        const __m512i jv = _mm512_set1_epi32(static_cast<int>(j));
        const __mmask16 in = _mm512_cmple_epi32_mask(a, jv) & _mm512_cmplt_epi32_mask(jv, e);
        x = _mm512_mask_blend_ps(in, ninf, x);
      }
      _mm512_storeu_ps(st + j * rp + r, x);
      mx = _mm512_max_ps(mx, x);
    }
    const __m512 m_old = _mm512_loadu_ps(m + r), m_new = _mm512_max_ps(m_old, mx);
    const __mmask16 grew = _mm512_cmp_ps_mask(m_old, m_new, _CMP_LT_OQ);
    if (grew != 0) {
      const __mmask16 finite_old = _mm512_cmp_ps_mask(m_old, ninf, _CMP_NEQ_OQ);
      const __m512 f = _mm512_mask_blend_ps(grew, _mm512_set1_ps(1.0f),
                                            _mm512_maskz_mov_ps(finite_old, exp512(_mm512_sub_ps(m_old, m_new))));
      _mm512_storeu_ps(l + r, _mm512_mul_ps(_mm512_loadu_ps(l + r), f));
      for (int64_t c = 0; c < d; ++c) _mm512_storeu_ps(o + c * rp + r, _mm512_mul_ps(_mm512_loadu_ps(o + c * rp + r), f));
    }
    _mm512_storeu_ps(m + r, m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const __m512 x = _mm512_loadu_ps(st + j * rp + r);
      const __m512 p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, ninf, _CMP_NEQ_OQ), exp512(_mm512_sub_ps(x, m_new)));
      _mm512_storeu_ps(st + j * rp + r, p);
      sum = _mm512_add_ps(sum, p);
    }
    _mm512_storeu_ps(l + r, _mm512_add_ps(_mm512_loadu_ps(l + r), sum));
  }
}

void softmax_tile_scalar(float* st, int64_t n, int64_t rp, float scale, const TileRows& vis, float* m, float* l,
                         float* o, int64_t d) {
  for (int64_t r = 0; r < rp; ++r) {
    float mx = -kInf;
    for (int64_t j = 0; j < n; ++j) {
      float& x = st[j * rp + r];
      x *= scale;
      if (vis.masked && (j < vis.a[r] || j >= vis.e[r])) x = -kInf;
      mx = std::max(mx, x);
    }
    const float m_new = std::max(m[r], mx);
    if (m[r] < m_new) {
      const float f = m[r] == -kInf ? 0.0f : std::exp(m[r] - m_new);
      l[r] *= f;
      for (int64_t c = 0; c < d; ++c) o[c * rp + r] *= f;
    }
    m[r] = m_new;
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      float& x = st[j * rp + r];
      x = x == -kInf ? 0.0f : std::exp(x - m_new);
      sum += x;
    }
    l[r] += sum;
  }
}

void softmax_tile(Isa isa, float* st, int64_t n, int64_t rp, float scale, const TileRows& vis, float* m, float* l,
                  float* o, int64_t d) {
  if (isa >= Isa::Avx512) return softmax_tile512(st, n, rp, scale, vis, m, l, o, d);
  if (isa == Isa::Avx2) return softmax_tile256(st, n, rp, scale, vis, m, l, o, d);
  softmax_tile_scalar(st, n, rp, scale, vis, m, l, o, d);
}

// n rows of d bf16 values (rows `stride` apart) widened to f32 rows of d.
TPDRAFT_TARGET_AVX2 void widen_rows256(const uint16_t* src, int64_t stride, int64_t n, int64_t d, float* dst) {
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* s = src + j * stride;
    float* t = dst + j * d;
    int64_t c = 0;
    for (; c + 8 <= d; c += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + c));
      _mm256_storeu_ps(t + c, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    }
    for (; c < d; ++c) t[c] = bf16_to_f32(s[c]);
  }
}

void widen_rows(Isa isa, const uint16_t* src, int64_t stride, int64_t n, int64_t d, float* dst) {
  if (isa >= Isa::Avx2) return widen_rows256(src, stride, n, d, dst);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < d; ++c) dst[j * d + c] = bf16_to_f32(src[j * stride + c]);
}

// ---------------------------------------------------------------------------------------------
// Geometry of one session: the context positions any row of the block may see, [lo, lo + count).

struct SessionSpan {
  int64_t lo = 0, count = 0;  // the union over rows (row 0 sees the most)
};

SessionSpan session_span(const AttentionParams& p, int64_t s) {
  const ContextView& c = p.context[s];
  const int64_t anchor = p.anchor[s];
  const int64_t lo = p.window > 0 ? std::max(c.begin, anchor - p.window + 1) : c.begin;
  return {lo, std::max<int64_t>(0, std::min(c.end, anchor) - lo)};
}

int64_t chunks_of(int64_t count) { return std::max<int64_t>(1, (count + kChunk - 1) / kChunk); }

// One work item: the rows of (session, kv head) against context positions span.lo + [c0, c1),
// and, for the session's last chunk, the block's keys.
struct Item {
  int64_t s, g, c0, c1;
  bool last;
};

// A row group's running softmax state over the keys seen so far, rows padded to rp: max, sum and
// the unnormalised output O^T (acc[c][r] = sum_j exp(score_rj - max_r) v_j[c]).
struct RowState {
  float* m;    // [rp]
  float* l;    // [rp]
  float* acc;  // [D][rp]
};

// One worker's scratch for an item.
struct ItemBuffers {
  float* qt;      // [D][rp] the queries, transposed
  float* scores;  // [kTile][rp]
  float* kw;      // [kTile][D] a bf16 tile's keys widened (unused for f32)
  float* vw;      // [kTile][D] its values
  int32_t* a;     // [rp] visible range per row
  int32_t* e;     // [rp]
};

int64_t padded_rows(int64_t rows) { return (rows + kRowPad - 1) / kRowPad * kRowPad; }

// A tile of n keys: k and v rows ks / vs floats apart (one segment of the ring, or a widened
// copy). Scores of the tile's keys j0.. land at S^T rows j0..
void tile_scores(Isa isa, const float* k, int64_t ks, int64_t j0, int64_t n, int64_t d, int64_t rp,
                 const ItemBuffers& buf) {
  bcast(isa, k, ks, 1, n, d, buf.qt, rp, rp, buf.scores + j0 * rp, rp, false);
}
void tile_values(Isa isa, const float* v, int64_t vs, int64_t j0, int64_t n, int64_t d, int64_t rp,
                 const ItemBuffers& buf, const RowState& st) {
  bcast(isa, v, 1, vs, d, n, buf.scores + j0 * rp, rp, rp, st.acc, rp, true);
}

void attend(Isa isa, const AttentionParams& p, const Item& it, const ItemBuffers& buf, const RowState& st) {
  const int64_t b = p.block, d = p.head_dim, ratio = p.n_q / p.n_kv, rows = ratio * b, rp = padded_rows(rows);
  const int64_t kv_stride = p.n_kv * d;
  const ContextView& ctx = p.context[it.s];
  const int64_t anchor = p.anchor[it.s];
  const SessionSpan span = session_span(p, it.s);
  // Q^T: row i = hh * b + r of the group (query head g * ratio + hh, block row r); padding 0.
  std::fill(buf.qt, buf.qt + d * rp, 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    const float* q = p.q + ((it.s * b + i % b) * p.n_q + it.g * ratio + i / b) * d;
    for (int64_t c = 0; c < d; ++c) buf.qt[c * rp + i] = q[c];
  }
  std::fill(st.m, st.m + rp, -kInf);
  std::fill(st.l, st.l + rp, 0.0f);
  std::fill(st.acc, st.acc + d * rp, 0.0f);
  // Padded rows see every key (their zero queries give finite weights that are never read).
  std::fill(buf.a, buf.a + rp, 0);
  const bool bf16 = p.kv_dtype == DType::BF16;
  const size_t esize = dtype_size(p.kv_dtype);
  const auto* kbase = static_cast<const unsigned char*>(static_cast<const void*>(ctx.k));
  const auto* vbase = static_cast<const unsigned char*>(static_cast<const void*>(ctx.v));
  // Context tiles [t, t + n) of the span; where the ring wraps inside one, in two segments.
  for (int64_t t = it.c0; t < it.c1; t += kTile) {
    const int64_t n = std::min(kTile, it.c1 - t);
    bool masked = false;
    for (int64_t i = 0; i < rp; ++i) {
      buf.e[i] = static_cast<int32_t>(n);
      if (i >= rows || p.window <= 0) continue;
      const int64_t lo_r = std::max(ctx.begin, anchor + i % b - p.window + 1);
      buf.a[i] = static_cast<int32_t>(std::clamp<int64_t>(lo_r - span.lo - t, 0, n));
      masked = masked || buf.a[i] > 0;
    }
    for (int64_t j0 = 0; j0 < n;) {
      const int64_t slot = (span.lo + t + j0) % ctx.capacity;
      const int64_t seg = std::min(n - j0, ctx.capacity - slot);
      const size_t at = static_cast<size_t>(slot * kv_stride + it.g * d) * esize;
      if (bf16) {
        widen_rows(isa, reinterpret_cast<const uint16_t*>(kbase + at), kv_stride, seg, d, buf.kw + j0 * d);
        widen_rows(isa, reinterpret_cast<const uint16_t*>(vbase + at), kv_stride, seg, d, buf.vw + j0 * d);
      } else {
        tile_scores(isa, reinterpret_cast<const float*>(kbase + at), kv_stride, j0, seg, d, rp, buf);
      }
      j0 += seg;
    }
    if (bf16) tile_scores(isa, buf.kw, d, 0, n, d, rp, buf);
    softmax_tile(isa, buf.scores, n, rp, p.scale, {buf.a, buf.e, masked}, st.m, st.l, st.acc, d);
    if (bf16) {
      tile_values(isa, buf.vw, d, 0, n, d, rp, buf, st);
      continue;
    }
    for (int64_t j0 = 0; j0 < n;) {
      const int64_t slot = (span.lo + t + j0) % ctx.capacity;
      const int64_t seg = std::min(n - j0, ctx.capacity - slot);
      tile_values(isa, reinterpret_cast<const float*>(vbase + static_cast<size_t>(slot * kv_stride + it.g * d) * esize),
                  kv_stride, j0, seg, d, rp, buf, st);
      j0 += seg;
    }
  }
  if (!it.last) return;
  // The block's own keys: row r sees key j for j in [b0, b1) (the mask of docs/model.md).
  const float* blk_k = p.k + (it.s * b * p.n_kv + it.g) * d;
  const float* blk_v = p.v + (it.s * b * p.n_kv + it.g) * d;
  for (int64_t j0 = 0; j0 < b; j0 += kTile) {
    const int64_t n = std::min(kTile, b - j0);
    bool masked = false;
    for (int64_t i = 0; i < rp; ++i) {
      int64_t b0 = 0, b1 = b;
      if (i < rows) {
        const int64_t r = i % b;
        b1 = p.causal ? r + 1 : b;
        if (p.window > 0) {
          b0 = std::max<int64_t>(0, r - p.window + 1);
          if (!p.causal) b1 = std::min(b1, r + p.window);
        }
      }
      buf.a[i] = static_cast<int32_t>(std::clamp<int64_t>(b0 - j0, 0, n));
      buf.e[i] = static_cast<int32_t>(std::clamp<int64_t>(b1 - j0, 0, n));
      masked = masked || buf.a[i] > 0 || buf.e[i] < n;
    }
    tile_scores(isa, blk_k + j0 * kv_stride, kv_stride, 0, n, d, rp, buf);
    softmax_tile(isa, buf.scores, n, rp, p.scale, {buf.a, buf.e, masked}, st.m, st.l, st.acc, d);
    tile_values(isa, blk_v + j0 * kv_stride, kv_stride, 0, n, d, rp, buf, st);
  }
}

}  // namespace

void CpuOps::do_attention(const AttentionParams& p) {
  if (recording(&CpuOps::do_attention, p)) return;
  check_attention_views(p);
  if (p.sessions == 0) return;
  const Isa isa = active_isa();
  const int64_t ratio = p.n_q / p.n_kv, rows = ratio * p.block, d = p.head_dim, rp = padded_rows(rows);
  // Items in (session, kv head, chunk) order; a pair's chunks are consecutive, its first at first_[pair].
  attn_items_.clear();
  attn_first_.clear();
  for (int64_t s = 0; s < p.sessions; ++s) {
    const int64_t count = session_span(p, s).count, chunks = chunks_of(count);
    for (int64_t g = 0; g < p.n_kv; ++g) {
      attn_first_.push_back(static_cast<int64_t>(attn_items_.size() / 4));
      for (int64_t c = 0; c < chunks; ++c)
        attn_items_.insert(attn_items_.end(), {s, g, c * kChunk, std::min(count, (c + 1) * kChunk)});
    }
  }
  const int64_t items = static_cast<int64_t>(attn_items_.size() / 4), pairs = p.sessions * p.n_kv;
  attn_first_.push_back(items);
  const int64_t state = rp * (d + 2);  // m, l, acc of one item
  float* states = attn_state_.get(static_cast<size_t>(items * state));
  const bool bf16 = p.kv_dtype != DType::F32;
  const int64_t tile_kv = bf16 ? kTile * d : 0;
  const size_t need = static_cast<size_t>(d * rp + kTile * rp + 2 * tile_kv + 2 * rp);
  for (auto& w : workers_) w.buf.get(need);
  auto state_of = [&](int64_t i) {
    float* base = states + i * state;
    return RowState{base, base + rp, base + 2 * rp};
  };
  pool_.parallel_for(items, [&](int64_t begin, int64_t end, int worker) {
    float* base = workers_[worker].buf.data();
    ItemBuffers buf;
    buf.qt = base;
    buf.scores = buf.qt + d * rp;
    buf.kw = buf.scores + kTile * rp;
    buf.vw = buf.kw + tile_kv;
    buf.a = reinterpret_cast<int32_t*>(buf.vw + tile_kv);
    buf.e = buf.a + rp;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t* e = attn_items_.data() + 4 * i;
      const bool last = e[3] == session_span(p, e[0]).count;
      attend(isa, p, {e[0], e[1], e[2], e[3], last}, buf, state_of(i));
    }
  });
  // Merge each pair's chunks at the common max: out = sum_c acc_c e^(m_c - M) / sum_c l_c e^(m_c - M).
  pool_.parallel_for(pairs, [&](int64_t begin, int64_t end, int) {
    for (int64_t pr = begin; pr < end; ++pr) {
      const int64_t s = pr / p.n_kv, g = pr % p.n_kv, first = attn_first_[pr], last = attn_first_[pr + 1];
      for (int64_t i = 0; i < rows; ++i) {
        float mx = -kInf;
        for (int64_t c = first; c < last; ++c) mx = std::max(mx, state_of(c).m[i]);
        const int64_t hh = i / p.block, r = i % p.block;
        float* out = p.out + ((s * p.block + r) * p.n_q + g * ratio + hh) * d;
        std::fill(out, out + d, 0.0f);
        float sum = 0.0f;
        for (int64_t c = first; c < last; ++c) {
          const RowState st = state_of(c);
          if (st.l[i] == 0.0f) continue;  // a chunk this row sees nothing of
          const float f = std::exp(st.m[i] - mx);
          sum += st.l[i] * f;
          for (int64_t k = 0; k < d; ++k) out[k] += st.acc[k * rp + i] * f;
        }
        const float inv = 1.0f / sum;
        for (int64_t k = 0; k < d; ++k) out[k] *= inv;
      }
    }
  });
}

}  // namespace tpdraft::kernels::cpu
