// Block attention, flash-decoding style: the context positions a session's rows may see are cut
// into a fixed number of chunks; one thread block per (chunk, kv head, group of 16 query rows,
// session) computes, for each of its rows, the running max, the softmax denominator and the
// unnormalised weighted sum of V over its chunk (online softmax over tiles of 32 keys staged in
// shared memory); the block's own keys form one more chunk. A merge kernel rescales and adds the
// chunks per row. No context length limit: chunks grow with the context, and since the kernels
// read the session tables from device memory, one captured launch serves every context length.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/attention_geometry.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernel_util.cuh"

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
  const ContextView c = a.context[s];
  Span sp;
  sp.begin = c.begin;
  sp.anchor = a.anchor[s];
  sp.capacity = c.capacity;
  sp.k = c.k;
  sp.v = c.v;
  sp.span = attn_span(c.begin, c.end, sp.anchor, a.window, a.splits);
  return sp;
}

// One query row of the block as a warp sees it: where its output goes and which keys of the
// chunk it may see ([vlo, vhi) in the chunk's coordinate: positions, or block row indices).
struct RowView {
  bool valid;
  int64_t h, r, vlo, vhi;
};

__device__ RowView row_view(const AttnArgs& a, const Span& se, int64_t g, int64_t i, bool block_chunk) {
  const int64_t ratio = a.n_q / a.n_kv;
  RowView v;
  v.valid = i < ratio * a.B;
  v.h = g * ratio + i / a.B;
  v.r = i % a.B;
  KeyRange keys;
  if (!block_chunk) {
    keys.lo = attn_context_from(se.begin, se.anchor, a.window, v.r);
    keys.hi = INT64_MAX;  // the chunk ends at the span's end, min(end, anchor)
  } else {
    keys = attn_block_keys(v.r, a.B, a.causal, a.window);
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
  const int64_t D = a.D, ks = key_stride(D), ratio = a.n_q / a.n_kv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // The chunk's keys: context positions [kbeg, kend), or block rows [0, B).
  int64_t kbeg = 0, kend = a.B;
  if (!block_chunk) {
    const KeyRange chunk = attn_chunk(se.span, c);
    kbeg = chunk.lo;
    kend = chunk.hi;
    if (kbeg >= kend) {
      // An empty chunk (the context is shorter than the split allows): mark its slots empty for
      // the merge, which then reads nothing else of them. The whole block leaves together.
      for (int64_t row = threadIdx.x; row < kAttnRowsPerBlock; row += blockDim.x) {
        const int64_t i = qg * kAttnRowsPerBlock + row;
        if (i >= ratio * a.B) continue;
        const int64_t slot = ((s * a.n_q + g * ratio + i / a.B) * a.B + i % a.B) * (a.splits + 1) + c;
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
    if (i < ratio * a.B) src = a.q + ((s * a.B + i % a.B) * a.n_q + g * ratio + i / a.B) * D;
    for (int64_t d = lane; d < D; d += 32) qs[row * D + d] = src != nullptr ? src[d] : 0.0f;
  }

  RowView rows[kRowsPerWarp];
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j)
    rows[j] = row_view(a, se, g, qg * kAttnRowsPerBlock + warp * kRowsPerWarp + j, block_chunk);

  const float* ksrc = block_chunk ? a.k : se.k;
  const float* vsrc = block_chunk ? a.v : se.v;

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
      const int64_t row = block_chunk ? (s * a.B + key) * a.n_kv + g : (key % se.capacity) * a.n_kv + g;
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
      const float score = visible ? sc[j] * a.scale : -INFINITY;
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
    const int64_t slot = ((s * a.n_q + rows[j].h) * a.B + rows[j].r) * (a.splits + 1) + c;
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
  const int64_t r = idx % a.B, h = (idx / a.B) % a.n_q, s = idx / (a.B * a.n_q);
  const int64_t used = a.splits + 1;
  const float* ml = a.part_ml + idx * used * 2;
  float mx = -INFINITY;
  for (int64_t c = 0; c < used; ++c) mx = fmaxf(mx, ml[c * 2]);
  float denom = 0.0f;
  for (int64_t c = 0; c < used; ++c)
    if (ml[c * 2] != -INFINITY) denom += expf(ml[c * 2] - mx) * ml[c * 2 + 1];
  const float inv = 1.0f / denom;
  float* out = a.out + ((s * a.B + r) * a.n_q + h) * a.D;
  const float* acc = a.part_acc + idx * used * a.D;
  for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x) {
    float sum = 0.0f;
    for (int64_t c = 0; c < used; ++c)
      if (ml[c * 2] != -INFINITY) sum += expf(ml[c * 2] - mx) * acc[c * a.D + d];
    out[d] = sum * inv;
  }
}

template <int DC>
void launch_partial(const AttnArgs& a, dim3 grid, int64_t qgroups, cudaStream_t stream) {
  const size_t shared = partial_shared_bytes(a.D);
  // Above the default 48 KiB a kernel must opt in (D > 128 here). The setting is per device,
  // so it is made on every such launch (a cheap host call).
  if (shared > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(attn_partial_kernel<DC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(shared)));
  attn_partial_kernel<DC><<<grid, kWarps * 32, shared, stream>>>(a, qgroups);
}

}  // namespace

void launch_attention(const AttnArgs& a, cudaStream_t stream) {
  if (a.S <= 0) return;
  const int64_t ratio = a.n_q / a.n_kv;
  const int64_t qgroups = (ratio * a.B + kAttnRowsPerBlock - 1) / kAttnRowsPerBlock;
  const dim3 grid(static_cast<unsigned>(a.splits + 1), static_cast<unsigned>(a.n_kv * qgroups),
                  static_cast<unsigned>(a.S));
  if (a.D <= 64)
    launch_partial<2>(a, grid, qgroups, stream);
  else if (a.D <= 128)
    launch_partial<4>(a, grid, qgroups, stream);
  else
    launch_partial<8>(a, grid, qgroups, stream);
  TPDRAFT_CHECK_LAUNCH("attention (chunk partials)");
  attn_merge_kernel<<<static_cast<unsigned>(a.S * a.n_q * a.B), kMergeThreads, 0, stream>>>(a);
  TPDRAFT_CHECK_LAUNCH("attention (merge)");
}

}  // namespace tpdraft::kernels::cuda
