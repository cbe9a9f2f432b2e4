// Block attention, flash-decoding style: the context positions a session's rows may see are cut
// into a fixed number of chunks; one thread block per (chunk, kv head, group of 16 query rows,
// session) computes, for each of its rows, the running max, the softmax denominator and the
// unnormalised weighted sum of V over its chunk (online softmax over tiles of 32 keys staged in
// shared memory); the block's own keys form one more chunk. A merge kernel rescales and adds the
// chunks per row. No context length limit: chunks grow with the context, and since the kernels
// read the session tables from device memory, one captured launch serves every context length.
// Two partial kernels write the same partials: the f32 one below (any head dim; the fallback) and
// the tensor-core one further down (head dims 64 and 128), which reads each K/V tile once per kv
// head; CudaOps picks one (TPDRAFT_CUDA_ATTENTION) and sizes the split from its occupancy.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/cuda_check.h"
#include "kernels/cuda/attention_geometry.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/mma.cuh"

namespace tpdraft::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = kAttnRowsPerBlock / kWarps;  // 4
constexpr int kTileKeys = static_cast<int>(kAttnTileKeys);  // one key per lane in the score step
constexpr int kMergeThreads = 128;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Shared memory of a partial block: queries [16][D], key tile [32][ks] (ks = D rounded up to
// odd, so lanes reading one key row each hit distinct banks), value tile [32][D].
__host__ __device__ inline int64_t key_stride(int64_t d) { return d | 1; }
size_t partial_shared_bytes(int64_t d) {
  return static_cast<size_t>(kAttnRowsPerBlock * d + kTileKeys * key_stride(d) + kTileKeys * d) * sizeof(float);
}

// A session as the partial kernel sees it: its context ring and the span its rows may see.
struct Span {
  int64_t begin, anchor, capacity;
  AttnSpan span;
  const float* k;
  const float* v;
};

__device__ Span session_span(const AttnArgs& a, int64_t s) {
  const ContextView c = a.p.context[s];
  Span sp;
  sp.begin = c.begin;
  sp.anchor = a.p.anchor[s];
  sp.capacity = c.capacity;
  sp.k = c.k;
  sp.v = c.v;
  sp.span = attn_span(c.begin, c.end, sp.anchor, a.p.window, a.splits);
  return sp;
}

// One query row of the block as a warp sees it: where its output goes and which keys of the
// chunk it may see ([vlo, vhi) in the chunk's coordinate: positions, or block row indices).
struct RowView {
  bool valid;
  int64_t h, r, vlo, vhi;
};

__device__ RowView row_view(const AttnArgs& a, const Span& se, int64_t g, int64_t i, bool block_chunk) {
  const int64_t ratio = a.p.n_q / a.p.n_kv;
  RowView v;
  v.valid = i < ratio * a.p.block;
  v.h = g * ratio + i / a.p.block;
  v.r = i % a.p.block;
  KeyRange keys;
  if (!block_chunk) {
    keys.lo = attn_context_from(se.begin, se.anchor, a.p.window, v.r);
    keys.hi = INT64_MAX;  // the chunk ends at the span's end, min(end, anchor)
  } else {
    keys = attn_block_keys(v.r, a.p.block, a.p.causal, a.p.window);
  }
  v.vlo = keys.lo;
  v.vhi = keys.hi;
  return v;
}

// DC = ceil(D / 32) register columns of the output per lane (D <= 32 * DC).
template <int DC>
__global__ void __launch_bounds__(kWarps * 32) attn_partial_kernel(AttnArgs a, int64_t qgroups) {
  const int64_t s = blockIdx.z, c = blockIdx.x;
  const Span se = session_span(a, s);
  const bool block_chunk = c == a.splits;
  const int64_t g = blockIdx.y / qgroups, qg = blockIdx.y % qgroups;
  const int64_t D = a.p.head_dim, ks = key_stride(D), ratio = a.p.n_q / a.p.n_kv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // The chunk's keys: context positions [kbeg, kend), or block rows [0, B).
  int64_t kbeg = 0, kend = a.p.block;
  if (!block_chunk) {
    const KeyRange chunk = attn_chunk(se.span, c);
    kbeg = chunk.lo;
    kend = chunk.hi;
    if (kbeg >= kend) {
      // An empty chunk (the context is shorter than the split allows): mark its slots empty for
      // the merge, which then reads nothing else of them. The whole block leaves together.
      for (int64_t row = threadIdx.x; row < kAttnRowsPerBlock; row += blockDim.x) {
        const int64_t i = qg * kAttnRowsPerBlock + row;
        if (i >= ratio * a.p.block) continue;
        const int64_t slot = ((s * a.p.n_q + g * ratio + i / a.p.block) * a.p.block + i % a.p.block) * (a.splits + 1) + c;
        a.part_ml[slot * 2] = -INFINITY;
        a.part_ml[slot * 2 + 1] = 0.0f;
      }
      return;
    }
  }
  extern __shared__ float smem[];
  float* qs = smem;
  float* kt = qs + kAttnRowsPerBlock * D;
  float* vt = kt + kTileKeys * ks;

  // Staging loops: a warp per row, lanes along D (coalesced, no divisions per element).
  for (int row = warp; row < kAttnRowsPerBlock; row += kWarps) {
    const int64_t i = qg * kAttnRowsPerBlock + row;
    const float* src = nullptr;
    if (i < ratio * a.p.block) src = a.p.q + ((s * a.p.block + i % a.p.block) * a.p.n_q + g * ratio + i / a.p.block) * D;
    for (int64_t d = lane; d < D; d += 32) qs[row * D + d] = src != nullptr ? src[d] : 0.0f;
  }

  RowView rows[kRowsPerWarp];
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j)
    rows[j] = row_view(a, se, g, qg * kAttnRowsPerBlock + warp * kRowsPerWarp + j, block_chunk);

  const float* ksrc = block_chunk ? a.p.k : se.k;
  const float* vsrc = block_chunk ? a.p.v : se.v;

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][DC];
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.0f;
#pragma unroll
    for (int t = 0; t < DC; ++t) acc[j][t] = 0.0f;
  }

  for (int64_t t0 = kbeg; t0 < kend; t0 += kTileKeys) {
    const int n = static_cast<int>(attn_min(kTileKeys, kend - t0));
    __syncthreads();  // the previous tile has been consumed (and, first time, qs is written)
    for (int j = warp; j < n; j += kWarps) {
      const int64_t key = t0 + j;
      const int64_t row = block_chunk ? (s * a.p.block + key) * a.p.n_kv + g : (key % se.capacity) * a.p.n_kv + g;
      const float* kr = ksrc + row * D;
      const float* vr = vsrc + row * D;
      for (int64_t d = lane; d < D; d += 32) {
        kt[j * ks + d] = kr[d];
        vt[j * D + d] = vr[d];
      }
    }
    __syncthreads();

    // Scores: lane <-> key t0 + lane, for the warp's rows.
    float sc[kRowsPerWarp];
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) sc[j] = 0.0f;
    if (lane < n) {
      const float* kr = kt + lane * ks;
      const float* qr = qs + warp * kRowsPerWarp * D;
      for (int64_t d = 0; d < D; ++d) {
        const float kv = kr[d];
#pragma unroll
        for (int j = 0; j < kRowsPerWarp; ++j) sc[j] = fmaf(qr[j * D + d], kv, sc[j]);
      }
    }
    const int64_t key = t0 + lane;
    float p[kRowsPerWarp];
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) {
      const bool visible = rows[j].valid && lane < n && key >= rows[j].vlo && key < rows[j].vhi;
      const float score = visible ? sc[j] * a.p.scale : -INFINITY;
      const float m_new = fmaxf(m[j], warp_max(score));
      if (m_new == -INFINITY) {  // nothing visible to this row yet: its state stays empty
        p[j] = 0.0f;
        continue;
      }
      const float alpha = expf(m[j] - m_new);  // 0 when m[j] is still -inf
      p[j] = visible ? expf(score - m_new) : 0.0f;
      l[j] = l[j] * alpha + warp_sum(p[j]);
      m[j] = m_new;
#pragma unroll
      for (int t = 0; t < DC; ++t) acc[j][t] *= alpha;
    }
    // Weighted values: lane <-> output dims lane + 32 t; p of key jj from lane jj.
    for (int jj = 0; jj < n; ++jj) {
      const float* vr = vt + jj * D;
      float vv[DC];
#pragma unroll
      for (int t = 0; t < DC; ++t) vv[t] = lane + 32 * t < D ? vr[lane + 32 * t] : 0.0f;
#pragma unroll
      for (int j = 0; j < kRowsPerWarp; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p[j], jj);
#pragma unroll
        for (int t = 0; t < DC; ++t) acc[j][t] = fmaf(pj, vv[t], acc[j][t]);
      }
    }
  }

#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    if (!rows[j].valid) continue;
    const int64_t slot = ((s * a.p.n_q + rows[j].h) * a.p.block + rows[j].r) * (a.splits + 1) + c;
#pragma unroll
    for (int t = 0; t < DC; ++t)
      if (lane + 32 * t < D) a.part_acc[slot * D + lane + 32 * t] = acc[j][t];
    if (lane == 0) {
      a.part_ml[slot * 2] = m[j];
      a.part_ml[slot * 2 + 1] = l[j];
    }
  }
}

// One block per (session, q head, block row): out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c
// over the chunks the row saw something in (m_c > -inf; the others' acc is never read).
__global__ void attn_merge_kernel(AttnArgs a) {
  const int64_t idx = blockIdx.x;  // ((s * n_q + h) * B + r)
  const int64_t r = idx % a.p.block, h = (idx / a.p.block) % a.p.n_q, s = idx / (a.p.block * a.p.n_q);
  const int64_t used = a.splits + 1;
  const float* ml = a.part_ml + idx * used * 2;
  float mx = -INFINITY;
  for (int64_t c = 0; c < used; ++c) mx = fmaxf(mx, ml[c * 2]);
  float denom = 0.0f;
  for (int64_t c = 0; c < used; ++c)
    if (ml[c * 2] != -INFINITY) denom += expf(ml[c * 2] - mx) * ml[c * 2 + 1];
  const float inv = 1.0f / denom;
  float* out = a.p.out + ((s * a.p.block + r) * a.p.n_q + h) * a.p.head_dim;
  const float* acc = a.part_acc + idx * used * a.p.head_dim;
  for (int64_t d = threadIdx.x; d < a.p.head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int64_t c = 0; c < used; ++c)
      if (ml[c * 2] != -INFINITY) sum += expf(ml[c * 2] - mx) * acc[c * a.p.head_dim + d];
    out[d] = sum * inv;
  }
}

// ---- the tensor-core partial kernel ----------------------------------------------------------------
//
// One block per (chunk, kv head, group of 64 query rows, session): the rows of all the q heads
// that share the kv head (ratio x B of them), so each K/V tile is read once for all of them. Four
// warps own 16 rows each. A tile of 64 keys is staged as bf16 (K row-major, V row-major and read
// transposed by ldmatrix); a warp computes its 16 x 64 scores with mma.m16n8k16 against the query
// fragments it keeps in registers, updates the online softmax in the score fragments themselves
// (which are the A fragments of P, rounded to bf16) and adds P V into 16 x D f32 accumulators.
// Scores are kept in log2 units (scale x log2 e folded in); m is written back in natural units,
// the partials' format the merge kernel reads.

constexpr int kMmaWarps = kAttnMmaRowsPerBlock / 16;
constexpr int kMmaKeys = 64;  // keys per staged tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
__host__ __device__ constexpr int mma_stride() {
  return D + 8;  // bf16 per staged row: 16-byte aligned rows, 4 banks apart (conflict-free fragments)
}

// Four consecutive elements as four bf16 (two words), from f32 or bf16 memory.
__device__ __forceinline__ uint2 load4_bf16(const float* p) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  return make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
}
__device__ __forceinline__ uint2 load4_bf16(const __nv_bfloat16* p) { return *reinterpret_cast<const uint2*>(p); }

// n keys of a tile into ks / vs ([kMmaKeys][stride] bf16), zeros past n (so that P = 0 never
// meets a NaN of stale memory). Key j is at (first_slot + j) * row_step + head_offset of the
// sources, the slot wrapped once past a ring's capacity (capacity 0: the block's rows, no ring).
template <int D, typename T>
__device__ void stage_tile(const T* ksrc, const T* vsrc, int64_t first_slot, int64_t capacity, int64_t row_step,
                           int64_t head_offset, int n, __nv_bfloat16* ks, __nv_bfloat16* vs) {
  constexpr int kQuads = D / 4, kStride = mma_stride<D>();
  for (int p = threadIdx.x; p < kMmaKeys * kQuads; p += kMmaWarps * 32) {
    const int j = p / kQuads, col = 4 * (p % kQuads);
    uint2 kw = make_uint2(0, 0), vw = make_uint2(0, 0);
    if (j < n) {
      int64_t slot = first_slot + j;
      if (capacity > 0 && slot >= capacity) slot -= capacity;
      const int64_t at = slot * row_step + head_offset + col;
      kw = load4_bf16(ksrc + at);
      vw = load4_bf16(vsrc + at);
    }
    *reinterpret_cast<uint2*>(ks + j * kStride + col) = kw;
    *reinterpret_cast<uint2*>(vs + j * kStride + col) = vw;
  }
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* p) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <int D, typename KV>
__global__ void __launch_bounds__(kMmaWarps * 32) attn_mma_kernel(AttnArgs a, int64_t qgroups) {
  constexpr int kStride = mma_stride<D>(), KD = D / 16, ND = D / 8, NK = kMmaKeys / 8;
  __shared__ __align__(16) __nv_bfloat16 ks[kMmaKeys * kStride];
  __shared__ __align__(16) __nv_bfloat16 vs[kMmaKeys * kStride];

  const int64_t s = blockIdx.z, c = blockIdx.x;
  const Span se = session_span(a, s);
  const bool block_chunk = c == a.splits;
  const int64_t g = blockIdx.y / qgroups, qg = blockIdx.y % qgroups, ratio = a.p.n_q / a.p.n_kv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = qg * kAttnMmaRowsPerBlock + warp * 16;  // the warp's first row

  // This lane's two rows of the warp's tile: lane / 4 and lane / 4 + 8.
  RowView rows[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) rows[h] = row_view(a, se, g, row0 + lane / 4 + 8 * h, block_chunk);

  int64_t kbeg = 0, kend = a.p.block;
  if (!block_chunk) {
    const KeyRange chunk = attn_chunk(se.span, c);
    kbeg = chunk.lo;
    kend = chunk.hi;
  }
  auto slot_of = [&](const RowView& rv) { return ((s * a.p.n_q + rv.h) * a.p.block + rv.r) * (a.splits + 1) + c; };
  if (kbeg >= kend) {  // an empty chunk: its slots are marked empty for the merge
    if (lane % 4 == 0)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (rows[h].valid) {
          a.part_ml[slot_of(rows[h]) * 2] = -INFINITY;
          a.part_ml[slot_of(rows[h]) * 2 + 1] = 0.0f;
        }
    return;
  }

  // Query fragments for the whole loop (zeros for rows past ratio x B).
  uint32_t qf[KD][4];
  {
    const float* qrow[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      qrow[h] = rows[h].valid ? a.p.q + ((s * a.p.block + rows[h].r) * a.p.n_q + rows[h].h) * D : nullptr;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk)
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const float* src = qrow[f & 1];
        const int col = kk * 16 + 2 * (lane % 4) + 8 * (f >> 1);
        qf[kk][f] = src != nullptr ? pack_bf16(src[col], src[col + 1]) : 0u;
      }
  }
  const bool warp_live = row0 < ratio * a.p.block;
  const float scale2 = a.p.scale * kLog2e;

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float acc[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; ++nd)
#pragma unroll
    for (int f = 0; f < 4; ++f) acc[nd][f] = 0.0f;

  const int64_t slot0 = block_chunk ? s * a.p.block : kbeg % se.capacity;
  for (int64_t t0 = kbeg; t0 < kend; t0 += kMmaKeys) {
    const int n = static_cast<int>(attn_min(kMmaKeys, kend - t0));
    __syncthreads();  // the previous tile has been consumed
    const int64_t first = slot0 + (t0 - kbeg);
    if (block_chunk)
      stage_tile<D>(a.p.k, a.p.v, first, 0, a.p.n_kv * D, g * D, n, ks, vs);
    else
      stage_tile<D>(reinterpret_cast<const KV*>(se.k), reinterpret_cast<const KV*>(se.v),
                    first >= se.capacity ? first - se.capacity : first, se.capacity, a.p.n_kv * D, g * D, n, ks, vs);
    __syncthreads();
    if (!warp_live) continue;

    // Scores: 16 rows x 64 keys, eight n8 tiles.
    float sc[NK][4];
#pragma unroll
    for (int nk = 0; nk < NK; ++nk) {
#pragma unroll
      for (int f = 0; f < 4; ++f) sc[nk][f] = 0.0f;
      const __nv_bfloat16* kr = ks + (nk * 8 + lane / 4) * kStride + 2 * (lane % 4);
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + kk * 16);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + kk * 16 + 8);
        mma_bf16(sc[nk], qf[kk], b0, b1);
      }
    }
    // Visibility as tile indices [lo, hi) per row, then the online softmax per row.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int lo = n, hi = 0;
      if (rows[h].valid) {
        lo = static_cast<int>(attn_min(n, attn_max(0, rows[h].vlo - t0)));
        hi = static_cast<int>(attn_max(0, attn_min(n, rows[h].vhi == INT64_MAX ? n : rows[h].vhi - t0)));
      }
      float mx = -INFINITY;
#pragma unroll
      for (int nk = 0; nk < NK; ++nk)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = nk * 8 + 2 * (lane % 4) + e;
          float& v = sc[nk][2 * h + e];
          v = j >= lo && j < hi ? v * scale2 : -INFINITY;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: p = 0, state stays empty
      const float alpha = exp2f(m[h] - m_use);
      float sum = 0.0f;
#pragma unroll
      for (int nk = 0; nk < NK; ++nk)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& v = sc[nk][2 * h + e];
          v = exp2f(v - m_use);
          sum += v;
        }
      l[h] = l[h] * alpha + sum;  // this lane's columns; the quad's lanes are added at the end
      m[h] = m_new;
#pragma unroll
      for (int nd = 0; nd < ND; ++nd) {
        acc[nd][2 * h] *= alpha;
        acc[nd][2 * h + 1] *= alpha;
      }
    }
    // acc += P V: the score fragments of n8 tiles 2 kk and 2 kk + 1 are P's A fragment of k16 step kk.
#pragma unroll
    for (int kk = 0; kk < kMmaKeys / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int nd = 0; nd < ND; nd += 2) {
        // Lanes 0-15 address keys 16 kk + 0..15 at dims 8 nd.., lanes 16-31 the same keys at 8 (nd + 1)..
        uint32_t b[4];
        ldmatrix_x4_trans(b, vs + (kk * 16 + (lane & 15)) * kStride + 8 * (nd + (lane >> 4)));
        mma_bf16(acc[nd], pa, b[0], b[1]);
        mma_bf16(acc[nd + 1], pa, b[2], b[3]);
      }
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (!rows[h].valid) continue;
    const int64_t slot = slot_of(rows[h]);
    float* out = a.part_acc + slot * D + 2 * (lane % 4);
#pragma unroll
    for (int nd = 0; nd < ND; ++nd)
      *reinterpret_cast<float2*>(out + nd * 8) = make_float2(acc[nd][2 * h], acc[nd][2 * h + 1]);
    if (lane % 4 == 0) {
      a.part_ml[slot * 2] = m[h] == -INFINITY ? -INFINITY : m[h] * kLn2;
      a.part_ml[slot * 2 + 1] = l[h];
    }
  }
}

// The mma instantiation for a head dim (64 or 128) and ring element type.
auto* mma_kernel_for(int64_t d, bool kv_bf16) {
  if (kv_bf16) return d == 64 ? attn_mma_kernel<64, __nv_bfloat16> : attn_mma_kernel<128, __nv_bfloat16>;
  return d == 64 ? attn_mma_kernel<64, float> : attn_mma_kernel<128, float>;
}

// The simt instantiation for a head dim, allowed its shared memory: above the default 48 KiB a
// kernel must opt in (D > 128 here). The setting is per device, so it is made on every call (a
// cheap host call).
auto* partial_kernel_for(int64_t d) {
  auto* fn = d <= 64 ? attn_partial_kernel<2> : d <= 128 ? attn_partial_kernel<4> : attn_partial_kernel<8>;
  const size_t shared = partial_shared_bytes(d);
  if (shared > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  return fn;
}

}  // namespace

bool attention_mma_supports(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

int attention_blocks_per_sm(AttnKernel kernel, int64_t head_dim, bool kv_bf16) {
  int blocks = 0;
  if (kernel == AttnKernel::mma)
    CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, mma_kernel_for(head_dim, kv_bf16), kMmaWarps * 32, 0));
  else
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, partial_kernel_for(head_dim), kWarps * 32,
                                                             partial_shared_bytes(head_dim)));
  return blocks > 0 ? blocks : 1;
}

void launch_attention(const AttnArgs& a, AttnKernel kernel, cudaStream_t stream) {
  if (a.p.sessions <= 0) return;
  const int64_t ratio = a.p.n_q / a.p.n_kv, rows = attention_rows_per_block(kernel);
  const int64_t qgroups = (ratio * a.p.block + rows - 1) / rows;
  const dim3 grid(static_cast<unsigned>(a.splits + 1), static_cast<unsigned>(a.p.n_kv * qgroups),
                  static_cast<unsigned>(a.p.sessions));
  if (kernel == AttnKernel::mma)
    mma_kernel_for(a.p.head_dim, a.p.kv_dtype == DType::BF16)<<<grid, kMmaWarps * 32, 0, stream>>>(a, qgroups);
  else
    partial_kernel_for(a.p.head_dim)<<<grid, kWarps * 32, partial_shared_bytes(a.p.head_dim), stream>>>(a, qgroups);
  TPDRAFT_CHECK_LAUNCH("attention (chunk partials)");
  attn_merge_kernel<<<static_cast<unsigned>(a.p.sessions * a.p.n_q * a.p.block), kMergeThreads, 0, stream>>>(a);
  TPDRAFT_CHECK_LAUNCH("attention (merge)");
}

}  // namespace tpdraft::kernels::cuda
