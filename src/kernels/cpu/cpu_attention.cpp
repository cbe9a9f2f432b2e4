// Block attention over a session's context ring and the block's own keys (docs/model.md), shaped
// like a GEMM. For each kv head, the block's rows of every query head reading it (B x group
// rows) meet the keys in tiles of kTile: a tile's scores come from the matmul dot engine (queries
// as rows, keys as weight rows), go through an online softmax (a running max and sum per row)
// and into the P.V accumulators, so K and V are read once per kv head and the scores never leave
// the cache. A long context is cut into chunks that run on different threads (flash-decoding):
// each chunk leaves its rows' max, sum and unnormalised output, and the merge rescales them to
// the common max, which is exact. Sliding layers read only their window. The context may be held
// in f32 or bf16 (AttentionParams::kv_dtype); either way the arithmetic is f32.

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/simd.h"

namespace tpdraft::kernels::cpu {
namespace {

constexpr int64_t kTile = 128;       // keys per score tile: the group's scores stay in L1 / L2
constexpr int64_t kMinChunk = 1024;  // context positions below which a chunk is not worth a thread

// ---------------------------------------------------------------------------------------------
// o[r][d] += sum_j p[r][j] * v[j][d] for r < RT rows, j < n keys (v rows `vs` elements apart, f32
// or bf16).

template <int RT, bool Bf16>
TPDRAFT_TARGET_AVX512 void pv_tile512(const float* p, int64_t ps, const void* vp, int64_t vs, int64_t n, int64_t d,
                                      float* o, int64_t os) {
  for (int64_t d0 = 0; d0 < d; d0 += 64) {  // 4 vectors of 16 dims per pass: 4*RT accumulators
    __mmask16 mask[4];
    for (int c = 0; c < 4; ++c) mask[c] = mask16(std::max<int64_t>(0, d - d0 - 16 * c));
    __m512 acc[RT][4];
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_maskz_loadu_ps(mask[c], o + r * os + d0 + 16 * c);
    for (int64_t j = 0; j < n; ++j) {
      __m512 vv[4];
      for (int c = 0; c < 4; ++c) {
        const int64_t at = j * vs + d0 + 16 * c;
        if constexpr (Bf16) {
          const __m256i h = _mm256_maskz_loadu_epi16(mask[c], static_cast<const uint16_t*>(vp) + at);
          vv[c] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        } else {
          vv[c] = _mm512_maskz_loadu_ps(mask[c], static_cast<const float*>(vp) + at);
        }
      }
      for (int r = 0; r < RT; ++r) {
        const __m512 pr = _mm512_set1_ps(p[r * ps + j]);
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(pr, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < 4; ++c) _mm512_mask_storeu_ps(o + r * os + d0 + 16 * c, mask[c], acc[r][c]);
  }
}

// AVX2 has no 16-bit masked load: bf16 rows take this path only when d is a multiple of 8.
template <int RT, bool Bf16>
TPDRAFT_TARGET_AVX2 void pv_tile256(const float* p, int64_t ps, const void* vp, int64_t vs, int64_t n, int64_t d,
                                    float* o, int64_t os) {
  for (int64_t d0 = 0; d0 < d; d0 += 32) {  // 4 vectors of 8 dims per pass
    __m256i mask[4];
    for (int c = 0; c < 4; ++c) {
      const int64_t left = std::min<int64_t>(8, std::max<int64_t>(0, d - d0 - 8 * c));
      mask[c] =
          _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }
    const int nv = static_cast<int>(std::min<int64_t>(4, (d - d0 + 7) / 8));
    __m256 acc[RT][4];
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_maskload_ps(o + r * os + d0 + 8 * c, mask[c]);
    for (int64_t j = 0; j < n; ++j) {
      __m256 vv[4];
      for (int c = 0; c < 4; ++c) {
        const int64_t at = j * vs + d0 + 8 * c;
        if constexpr (Bf16) {
          vv[c] = c < nv ? _mm256_castsi256_ps(_mm256_slli_epi32(
                               _mm256_cvtepu16_epi32(_mm_loadu_si128(
                                   reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(vp) + at))),
                               16))
                         : _mm256_setzero_ps();
        } else {
          vv[c] = _mm256_maskload_ps(static_cast<const float*>(vp) + at, mask[c]);
        }
      }
      for (int r = 0; r < RT; ++r) {
        const __m256 pr = _mm256_set1_ps(p[r * ps + j]);
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_fmadd_ps(pr, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < 4; ++c) _mm256_maskstore_ps(o + r * os + d0 + 8 * c, mask[c], acc[r][c]);
  }
}

float element(const void* v, DType dtype, int64_t i) {
  return dtype == DType::BF16 ? bf16_to_f32(static_cast<const uint16_t*>(v)[i]) : static_cast<const float*>(v)[i];
}

void pv_scalar(const float* p, int64_t ps, int64_t rows, const void* v, DType vtype, int64_t vs, int64_t n, int64_t d,
               float* o, int64_t os) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const float pr = p[r * ps + j];
      for (int64_t c = 0; c < d; ++c) o[r * os + c] += pr * element(v, vtype, j * vs + c);
    }
}

using PvFn = void (*)(const float*, int64_t, const void*, int64_t, int64_t, int64_t, float*, int64_t);

template <bool Bf16>
PvFn pv_kernel(Isa isa, int64_t rows) {
  static constexpr PvFn k512[6] = {&pv_tile512<1, Bf16>, &pv_tile512<2, Bf16>, &pv_tile512<3, Bf16>,
                                   &pv_tile512<4, Bf16>, &pv_tile512<5, Bf16>, &pv_tile512<6, Bf16>};
  static constexpr PvFn k256[2] = {&pv_tile256<1, Bf16>, &pv_tile256<2, Bf16>};
  return isa >= Isa::Avx512 ? k512[rows - 1] : k256[rows - 1];
}

void pv_accumulate(Isa isa, const float* p, int64_t ps, int64_t rows, const void* v, DType vtype, int64_t vs,
                   int64_t n, int64_t d, float* o, int64_t os) {
  if (n <= 0) return;
  const bool bf16 = vtype == DType::BF16;
  if (isa < Isa::Avx2 || (bf16 && isa == Isa::Avx2 && d % 8 != 0))
    return pv_scalar(p, ps, rows, v, vtype, vs, n, d, o, os);
  const int64_t rt = isa >= Isa::Avx512 ? 6 : 2;
  for (int64_t r0 = 0; r0 < rows; r0 += rt) {
    const int64_t here = std::min(rt, rows - r0);
    const PvFn fn = bf16 ? pv_kernel<true>(isa, here) : pv_kernel<false>(isa, here);
    fn(p + r0 * ps, ps, v, vs, n, d, o + r0 * os, os);
  }
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

// One work item: the rows of (session, kv head) against context positions span.lo + [c0, c1),
// and, for the session's last chunk, the block's keys.
struct Item {
  int64_t s, g, c0, c1;
  bool last;
};

// A row group's running softmax state over the keys seen so far: max, sum and the unnormalised
// output (acc = sum_j exp(score_j - max) v_j).
struct RowState {
  float* m;    // [R]
  float* l;    // [R]
  float* acc;  // [R, D]
};

// Scores x[0, n) of one row, of which [a, e) are visible: scaled, folded into the row's state,
// and left as exp(score - max) (0 where invisible) for P.V.
void online_row(Isa isa, float scale, float* x, int64_t n, int64_t a, int64_t e, float* m, float* l, float* acc,
                int64_t d) {
  a = std::clamp<int64_t>(a, 0, n);
  e = std::clamp<int64_t>(e, a, n);
  std::fill(x, x + a, 0.0f);
  std::fill(x + e, x + n, 0.0f);
  if (a == e) return;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = a; j < e; ++j) {
    x[j] *= scale;
    mx = std::max(mx, x[j]);
  }
  if (mx > *m) {  // a new max: what was summed so far shrinks by exp(old - new) (0 from -inf)
    const float f = std::exp(*m - mx);
    *l *= f;
    for (int64_t c = 0; c < d; ++c) acc[c] *= f;
    *m = mx;
  }
  *l += detail::exp_shifted_sum(isa, x + a, e - a, *m);
}

struct ItemBuffers {
  float* packed_f32;  // [R, pc] queries packed for f32 keys (the block's)
  float* packed_ctx;  // [R, pc] packed for the context's dtype (== packed_f32 for f32)
  float* scores;      // [R, kTile]
};

void attend(Isa isa, const AttentionParams& p, const Item& it, const ItemBuffers& buf, const RowState& st) {
  const int64_t b = p.block, d = p.head_dim, ratio = p.n_q / p.n_kv, rows = ratio * b;
  const int64_t pc = detail::packed_cols(d), kv_stride = p.n_kv * d;
  const ContextView& ctx = p.context[it.s];
  const int64_t anchor = p.anchor[it.s];
  const SessionSpan span = session_span(p, it.s);
  for (int64_t hh = 0; hh < ratio; ++hh) {
    const float* q = p.q + (it.s * b * p.n_q + it.g * ratio + hh) * d;
    detail::pack_rows(isa, DType::F32, q, p.n_q * d, b, d, buf.packed_f32 + hh * b * pc);
    if (buf.packed_ctx != buf.packed_f32)
      detail::pack_rows(isa, p.kv_dtype, q, p.n_q * d, b, d, buf.packed_ctx + hh * b * pc);
  }
  std::fill(st.m, st.m + rows, -std::numeric_limits<float>::infinity());
  std::fill(st.l, st.l + rows, 0.0f);
  std::fill(st.acc, st.acc + rows * d, 0.0f);
  const size_t esize = dtype_size(p.kv_dtype);
  const auto* kbase = static_cast<const unsigned char*>(static_cast<const void*>(ctx.k));
  const auto* vbase = static_cast<const unsigned char*>(static_cast<const void*>(ctx.v));
  const detail::WeightRows keys{p.kv_dtype, kbase + static_cast<size_t>(it.g * d) * esize, kv_stride, d};
  // Context tiles: [t, t + n) of the span, never across the ring's wrap.
  for (int64_t t = it.c0; t < it.c1;) {
    const int64_t slot = (span.lo + t) % ctx.capacity;
    const int64_t n = std::min({kTile, it.c1 - t, ctx.capacity - slot});
    detail::exact_dots(isa, keys, slot, n, buf.packed_ctx, rows, buf.scores, kTile);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = i % b;
      const int64_t lo_r = p.window > 0 ? std::max(ctx.begin, anchor + r - p.window + 1) : ctx.begin;
      online_row(isa, p.scale, buf.scores + i * kTile, n, lo_r - span.lo - t, n, st.m + i, st.l + i, st.acc + i * d,
                 d);
    }
    const void* v = vbase + static_cast<size_t>(slot * kv_stride + it.g * d) * esize;
    pv_accumulate(isa, buf.scores, kTile, rows, v, p.kv_dtype, kv_stride, n, d, st.acc, d);
    t += n;
  }
  if (!it.last) return;
  // The block's own keys: row r sees key j for j in [b0, b1) (the mask of docs/model.md).
  const float* blk_k = p.k + (it.s * b * p.n_kv + it.g) * d;
  const float* blk_v = p.v + (it.s * b * p.n_kv + it.g) * d;
  for (int64_t j0 = 0; j0 < b; j0 += kTile) {
    const int64_t n = std::min(kTile, b - j0);
    detail::exact_dots(isa, {DType::F32, blk_k, kv_stride, d}, j0, n, buf.packed_f32, rows, buf.scores, kTile);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = i % b;
      int64_t b0 = 0, b1 = p.causal ? r + 1 : b;
      if (p.window > 0) {
        b0 = std::max<int64_t>(0, r - p.window + 1);
        if (!p.causal) b1 = std::min(b1, r + p.window);
      }
      online_row(isa, p.scale, buf.scores + i * kTile, n, b0 - j0, b1 - j0, st.m + i, st.l + i, st.acc + i * d, d);
    }
    pv_accumulate(isa, buf.scores, kTile, rows, blk_v + j0 * kv_stride, DType::F32, kv_stride, n, d, st.acc, d);
  }
}

}  // namespace

void CpuOps::do_attention(const AttentionParams& p) {
  if (recording(&CpuOps::do_attention, p)) return;
  check_attention_views(p);
  if (p.sessions == 0) return;
  const Isa isa = active_isa();
  const int64_t ratio = p.n_q / p.n_kv, rows = ratio * p.block, d = p.head_dim, pc = detail::packed_cols(d);
  // Chunk length: enough items to keep every thread busy (a few per thread, so that uneven ones
  // even out), but never chunks so short that their fixed costs (packing, merge) dominate.
  int64_t longest = 0;
  for (int64_t s = 0; s < p.sessions; ++s) longest = std::max(longest, session_span(p, s).count);
  const int64_t pairs = p.sessions * p.n_kv, want = 4 * static_cast<int64_t>(pool_.size());
  const int64_t per_pair = (want + pairs - 1) / pairs;
  int64_t chunk = std::max(kMinChunk, (longest + per_pair - 1) / per_pair);
  chunk = (chunk + kTile - 1) / kTile * kTile;
  // Items in (session, kv head, chunk) order; a pair's chunks are consecutive, its first at first_[pair].
  attn_items_.clear();
  attn_first_.clear();
  for (int64_t s = 0; s < p.sessions; ++s) {
    const int64_t count = session_span(p, s).count, chunks = std::max<int64_t>(1, (count + chunk - 1) / chunk);
    for (int64_t g = 0; g < p.n_kv; ++g) {
      attn_first_.push_back(static_cast<int64_t>(attn_items_.size() / 4));
      for (int64_t c = 0; c < chunks; ++c)
        attn_items_.insert(attn_items_.end(), {s, g, c * chunk, std::min(count, (c + 1) * chunk)});
    }
  }
  const int64_t items = static_cast<int64_t>(attn_items_.size() / 4);
  attn_first_.push_back(items);
  const int64_t state = rows * (d + 2);  // m, l, acc of one item
  float* states = attn_state_.get(static_cast<size_t>(items * state));
  const bool bf16 = p.kv_dtype != DType::F32;
  const size_t need = static_cast<size_t>(rows * ((bf16 ? 2 : 1) * pc + kTile));
  for (auto& w : workers_) w.buf.get(need);
  auto state_of = [&](int64_t i) {
    float* base = states + i * state;
    return RowState{base, base + rows, base + 2 * rows};
  };
  pool_.parallel_for(items, [&](int64_t begin, int64_t end, int worker) {
    float* base = workers_[worker].buf.data();
    for (int64_t i = begin; i < end; ++i) {
      const int64_t* e = attn_items_.data() + 4 * i;
      const bool last = e[3] == session_span(p, e[0]).count;
      const ItemBuffers buf{base, bf16 ? base + rows * pc : base, base + (bf16 ? 2 : 1) * rows * pc};
      attend(isa, p, {e[0], e[1], e[2], e[3], last}, buf, state_of(i));
    }
  });
  // Merge each pair's chunks at the common max: out = sum_c acc_c e^(m_c - M) / sum_c l_c e^(m_c - M).
  pool_.parallel_for(pairs, [&](int64_t begin, int64_t end, int) {
    for (int64_t pr = begin; pr < end; ++pr) {
      const int64_t s = pr / p.n_kv, g = pr % p.n_kv, first = attn_first_[pr], last = attn_first_[pr + 1];
      for (int64_t i = 0; i < rows; ++i) {
        float mx = -std::numeric_limits<float>::infinity();
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
          for (int64_t k = 0; k < d; ++k) out[k] += st.acc[i * d + k] * f;
        }
        const float inv = 1.0f / sum;
        for (int64_t k = 0; k < d; ++k) out[k] *= inv;
      }
    }
  });
}

}  // namespace tpdraft::kernels::cpu
