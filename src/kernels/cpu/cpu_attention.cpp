// Block attention over a session's context ring and the block's own keys (docs/model.md).
// One task is (session, kv head, group of the q heads reading it): the group's B x heads query
// rows share every K/V row read, so scores come from the matmul dot engine (queries as rows,
// keys as weight rows), softmax runs in f32 on whole score rows, and P.V is a register-blocked
// broadcast kernel. For a few thousand context rows this is ~4 FLOPs per key element per query.

#include <algorithm>
#include <limits>

#include "kernels/cpu/simd.h"
#include "kernels/ops_checks.h"

namespace tpdraft::kernels::cpu {
namespace {

// ---------------------------------------------------------------------------------------------
// o[r][d] += sum_j p[r][j] * v[j][d] for r < RT rows, j < n keys (v rows `vs` floats apart).

template <int RT>
TPDRAFT_TARGET_AVX512 void pv_tile512(const float* p, int64_t ps, const float* v, int64_t vs, int64_t n, int64_t d,
                                      float* o, int64_t os) {
  for (int64_t d0 = 0; d0 < d; d0 += 64) {  // 4 vectors of 16 dims per pass: 4*RT accumulators
    __mmask16 mask[4];
    for (int c = 0; c < 4; ++c) mask[c] = mask16(std::max<int64_t>(0, d - d0 - 16 * c));
    __m512 acc[RT][4];
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_maskz_loadu_ps(mask[c], o + r * os + d0 + 16 * c);
    for (int64_t j = 0; j < n; ++j) {
      __m512 vv[4];
      for (int c = 0; c < 4; ++c) vv[c] = _mm512_maskz_loadu_ps(mask[c], v + j * vs + d0 + 16 * c);
      for (int r = 0; r < RT; ++r) {
        const __m512 pr = _mm512_set1_ps(p[r * ps + j]);
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(pr, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < 4; ++c) _mm512_mask_storeu_ps(o + r * os + d0 + 16 * c, mask[c], acc[r][c]);
  }
}

template <int RT>
TPDRAFT_TARGET_AVX2 void pv_tile256(const float* p, int64_t ps, const float* v, int64_t vs, int64_t n, int64_t d,
                                    float* o, int64_t os) {
  for (int64_t d0 = 0; d0 < d; d0 += 32) {  // 4 vectors of 8 dims per pass
    __m256i mask[4];
    for (int c = 0; c < 4; ++c) {
      const int64_t left = std::min<int64_t>(8, std::max<int64_t>(0, d - d0 - 8 * c));
      mask[c] =
          _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }
    __m256 acc[RT][4];
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_maskload_ps(o + r * os + d0 + 8 * c, mask[c]);
    for (int64_t j = 0; j < n; ++j) {
      __m256 vv[4];
      for (int c = 0; c < 4; ++c) vv[c] = _mm256_maskload_ps(v + j * vs + d0 + 8 * c, mask[c]);
      for (int r = 0; r < RT; ++r) {
        const __m256 pr = _mm256_set1_ps(p[r * ps + j]);
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_fmadd_ps(pr, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < 4; ++c) _mm256_maskstore_ps(o + r * os + d0 + 8 * c, mask[c], acc[r][c]);
  }
}

void pv_scalar(const float* p, int64_t ps, int64_t rows, const float* v, int64_t vs, int64_t n, int64_t d, float* o,
               int64_t os) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const float pr = p[r * ps + j];
      for (int64_t c = 0; c < d; ++c) o[r * os + c] += pr * v[j * vs + c];
    }
}

using PvFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, float*, int64_t);

void pv_accumulate(Isa isa, const float* p, int64_t ps, int64_t rows, const float* v, int64_t vs, int64_t n, int64_t d,
                   float* o, int64_t os) {
  if (n <= 0) return;
  if (isa < Isa::Avx2) return pv_scalar(p, ps, rows, v, vs, n, d, o, os);
  static constexpr PvFn k512[6] = {&pv_tile512<1>, &pv_tile512<2>, &pv_tile512<3>,
                                   &pv_tile512<4>, &pv_tile512<5>, &pv_tile512<6>};
  static constexpr PvFn k256[2] = {&pv_tile256<1>, &pv_tile256<2>};
  const int64_t rt = isa >= Isa::Avx512 ? 6 : 2;
  for (int64_t r0 = 0; r0 < rows; r0 += rt) {
    const int64_t here = std::min(rt, rows - r0);
    const PvFn fn = isa >= Isa::Avx512 ? k512[here - 1] : k256[here - 1];
    fn(p + r0 * ps, ps, v, vs, n, d, o + r0 * os, os);
  }
}

// ---------------------------------------------------------------------------------------------
// Geometry of one session: the context positions any row of the block may see, [lo, hi).

struct SessionSpan {
  int64_t lo = 0, count = 0;  // context positions lo .. lo + count - 1 (the union over rows)
};

SessionSpan session_span(const AttentionParams& p, int64_t s) {
  const ContextView& c = p.context[s];
  const int64_t anchor = p.anchor[s];
  const int64_t lo = p.window > 0 ? std::max(c.begin, anchor - p.window + 1) : c.begin;  // row 0 sees the most
  return {lo, std::max<int64_t>(0, std::min(c.end, anchor) - lo)};
}

struct Task {
  int64_t s, g, h0, heads;  // session, kv head, first q head, q heads in the group
};

// Everything one task needs, carved from its worker's scratch.
struct TaskBuffers {
  float* packed;  // [R, packed_cols(D)] query rows
  float* scores;  // [R, ncols]
  float* acc;     // [R, D]
  float* sums;    // [R] softmax denominators
  int64_t ncols;
};

void softmax_row(Isa isa, const AttentionParams& p, float* row, int64_t r, int64_t ctx_from, int64_t nctx,
                 float* sum_out) {
  const int64_t b = p.block;
  int64_t b0 = 0, b1 = p.causal ? r + 1 : b;
  if (p.window > 0) {
    b0 = std::max<int64_t>(0, r - p.window + 1);
    if (!p.causal) b1 = std::min(b1, r + p.window);
  }
  float* blk = row + nctx;
  std::fill(row, row + ctx_from, 0.0f);
  std::fill(blk, blk + b0, 0.0f);
  std::fill(blk + b1, blk + b, 0.0f);
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = ctx_from; j < nctx; ++j) {
    row[j] *= p.scale;
    mx = std::max(mx, row[j]);
  }
  for (int64_t j = b0; j < b1; ++j) {
    blk[j] *= p.scale;
    mx = std::max(mx, blk[j]);
  }
  *sum_out = detail::exp_shifted_sum(isa, row + ctx_from, nctx - ctx_from, mx) +
             detail::exp_shifted_sum(isa, blk + b0, b1 - b0, mx);
}

void attend(Isa isa, const AttentionParams& p, const Task& t, const TaskBuffers& buf) {
  const int64_t b = p.block, d = p.head_dim, rows = t.heads * b, pc = detail::packed_cols(d);
  const int64_t kv_stride = p.n_kv * d;
  const ContextView& ctx = p.context[t.s];
  const SessionSpan span = session_span(p, t.s);
  const int64_t nctx = span.count, ncols = buf.ncols;
  for (int64_t hh = 0; hh < t.heads; ++hh)
    detail::pack_rows(isa, DType::F32, p.q + (t.s * b * p.n_q + t.h0 + hh) * d, p.n_q * d, b, d,
                      buf.packed + hh * b * pc);
  // Scores against the context (one or two ring segments) and the block's keys.
  const int64_t first = nctx > 0 ? span.lo % ctx.capacity : 0;
  const int64_t len1 = std::min(nctx, ctx.capacity - first);
  const detail::WeightRows ctx_k{DType::F32, nctx > 0 ? ctx.k + t.g * d : nullptr, kv_stride, d};
  detail::exact_dots(isa, ctx_k, first, len1, buf.packed, rows, buf.scores, ncols);
  detail::exact_dots(isa, ctx_k, 0, nctx - len1, buf.packed, rows, buf.scores + len1, ncols);
  const float* blk_k = p.k + (t.s * b * p.n_kv + t.g) * d;
  detail::exact_dots(isa, {DType::F32, blk_k, kv_stride, d}, 0, b, buf.packed, rows, buf.scores + nctx, ncols);
  float* sums = buf.sums;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = i % b;
    const int64_t lo_r = p.window > 0 ? std::max(ctx.begin, p.anchor[t.s] + r - p.window + 1) : ctx.begin;
    const int64_t from = std::clamp<int64_t>(lo_r - span.lo, 0, nctx);
    softmax_row(isa, p, buf.scores + i * ncols, r, from, nctx, &sums[i]);
  }
  std::fill(buf.acc, buf.acc + rows * d, 0.0f);
  if (nctx > 0) {
    const float* v1 = ctx.v + first * kv_stride + t.g * d;
    pv_accumulate(isa, buf.scores, ncols, rows, v1, kv_stride, len1, d, buf.acc, d);
    pv_accumulate(isa, buf.scores + len1, ncols, rows, ctx.v + t.g * d, kv_stride, nctx - len1, d, buf.acc, d);
  }
  const float* blk_v = p.v + (t.s * b * p.n_kv + t.g) * d;
  pv_accumulate(isa, buf.scores + nctx, ncols, rows, blk_v, kv_stride, b, d, buf.acc, d);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t hh = i / b, r = i % b;
    const float inv = 1.0f / sums[i];
    float* out = p.out + ((t.s * b + r) * p.n_q + t.h0 + hh) * d;
    for (int64_t c = 0; c < d; ++c) out[c] = buf.acc[i * d + c] * inv;
  }
}

}  // namespace

void CpuOps::attention(const AttentionParams& p) {
  check_attention_params(p);
  if (recording(&CpuOps::attention, p)) return;
  check_attention_views(p);
  if (p.sessions == 0) return;
  const Isa isa = active_isa();
  const int64_t ratio = p.n_q / p.n_kv;
  // Heads per task: the whole GQA group (most K/V reuse) unless that leaves threads idle.
  int64_t heads = ratio;
  while (heads % 2 == 0 && p.sessions * p.n_q / heads < 2 * pool_.size()) heads /= 2;
  const int64_t groups = ratio / heads, tasks = p.sessions * p.n_kv * groups;
  int64_t max_ncols = 0;
  for (int64_t s = 0; s < p.sessions; ++s) max_ncols = std::max(max_ncols, session_span(p, s).count + p.block);
  const int64_t rows = heads * p.block, pc = detail::packed_cols(p.head_dim);
  const size_t need = static_cast<size_t>(rows * (pc + max_ncols + p.head_dim + 1));
  for (auto& w : workers_) w.buf.get(need);
  pool_.parallel_for(tasks, [&](int64_t begin, int64_t end, int worker) {
    float* base = workers_[worker].buf.data();
    for (int64_t i = begin; i < end; ++i) {
      const int64_t g = (i / groups) % p.n_kv;
      const Task t{i / (p.n_kv * groups), g, g * ratio + (i % groups) * heads, heads};
      const int64_t ncols = session_span(p, t.s).count + p.block;
      float* acc = base + rows * (pc + ncols);
      TaskBuffers buf{base, base + rows * pc, acc, acc + rows * p.head_dim, ncols};
      attend(isa, p, t, buf);
    }
  });
}

}  // namespace tpdraft::kernels::cpu
