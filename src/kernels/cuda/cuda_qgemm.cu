// Weight-only int8 / int4 matmul, y[i][n] = sum_k x[i][k] * q[n][k] * scale[n][k / group]
// (+ bias[n]), on weights in the tiled layout of kernels/qtile_layout.h.
//
// Up to 64 activation rows (a draft): tensor cores. Each block owns four tile columns (128
// outputs) and a share of K (split-K over the grid when there are too few block columns to fill
// the device); two warps per tile column take turns over the K tiles of each 128-input chunk
// (qtile::chunk_tile). The chunk's activations are converted to bf16 into shared memory once for
// all warps; each warp fetches a whole weight tile with one 16-byte load per lane, which is
// already its B fragments, dequantizes them in registers (q * scale, rounded to bf16) and issues
// mma.m16n8k16 (bf16 in, f32 accumulate) for every 16-row slice of the activations. The next
// chunk's tiles are loaded before the current one is multiplied. The warps' sums are added in a
// fixed order (bit-reproducible).
//
// More rows (settle): the weights are dequantized to bf16 into a workspace and cuBLAS multiplies
// (cuda_quant.cpp); launch_qdequant below is that first step.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/qgemm_block.cuh"
#include "kernels/qtile_layout.h"

namespace tpdraft::kernels::cuda {
namespace {

using qtile::kChunk;

constexpr int kThreads = kQgemmThreads;
constexpr int kStride = kChunk + 8;  // bf16 per staged row: rows 4 words apart, no bank conflicts

template <int MT>
__host__ __device__ constexpr int smem_bytes() {
  constexpr int stage = MT * 16 * kStride * 2, reduce = sum_bytes<MT>();
  return stage > reduce ? stage : reduce;
}

struct TcArgs {
  const uint4* tiles = nullptr;  // qtile layout
  const float* scales = nullptr;  // [groups][n_padded]
  const float* x = nullptr;       // [m, k]
  const float* bias = nullptr;    // [n] or null (applied only without split-K)
  float* out = nullptr;           // y [m, n] (one split) or partial sums [splits, m, n]
  int64_t m = 0, n = 0, k = 0, n_padded = 0, tiles_k = 0, group = 0, groups = 0;
  qtile::DivBy group_div;  // k / group by a multiply-high (no division per k16 step)
  int64_t tiles_n = 0, chunks = 0, chunks_per_split = 0;
  int splits = 1;
};

// One k16 step of one warp: B fragments from the lane's word per n8 group (element idx0 + e of
// the word), dequantized with the step's scales, times every 16-row slice of the staged rows.
template <int BITS, int MT, bool UNIFORM>
__device__ __forceinline__ void tc_step(const TcArgs& a, const uint32_t (&words)[4], int idx0, int64_t k0, int c0,
                                        const __nv_bfloat16* xs, int64_t n_tile0, int lane,
                                        float (&acc)[MT][4][4]) {
  uint32_t af[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      af[mt][r] = *reinterpret_cast<const uint32_t*>(
          &xs[(mt * 16 + qtile::a_row(lane, r)) * kStride + c0 + qtile::a_col(lane, r)]);
  const int64_t g_step = UNIFORM ? qtile::group_of(static_cast<uint32_t>(k0), a.group_div, a.groups) : 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t n = n_tile0 + qtile::frag_n(lane, j);
    const float s_step = UNIFORM ? __ldg(&a.scales[g_step * a.n_padded + n]) : 0.0f;
    float w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float s = UNIFORM ? s_step
                              : __ldg(&a.scales[qtile::group_of(static_cast<uint32_t>(k0 + qtile::frag_k(lane, e)),
                                                                 a.group_div, a.groups) *
                                                    a.n_padded + n]);
      // float(q) exactly (qtile::magic_bits), then q * scale rounded once, as before bf16.
      const float q = __fsub_rn(__uint_as_float(qtile::magic_bits(BITS, words[j], idx0 + e)), qtile::magic_offset(BITS));
      w[e] = __fmul_rn(q, s);
    }
    const uint32_t b0 = pack_bf16(w[0], w[1]), b1 = pack_bf16(w[2], w[3]);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) mma_bf16(acc[mt][j], af[mt], b0, b1);
  }
}

template <int BITS, int MT, bool UNIFORM>
__global__ void __launch_bounds__(kThreads) qgemm_tc_kernel(TcArgs a) {
  constexpr int KT = qtile::tile_k(BITS);
  constexpr int kLoads = qtile::loads_per_warp(BITS);  // tiles per warp and chunk: 4 (int8) or 2 (int4)
  __shared__ __align__(16) unsigned char smem[smem_bytes<MT>()];
  auto* xs = reinterpret_cast<__nv_bfloat16*>(smem);

  const WarpSpot spot = warp_spot(a.tiles_n, a.chunks, a.chunks_per_split);
  const int lane = spot.lane, kw = spot.kw;
  const int64_t n_tile0 = spot.n_tile0, c_begin = spot.c_begin, c_end = spot.c_end;
  const bool live = spot.live;
  const uint4* tiles = a.tiles + (live ? spot.tile_n : 0) * a.tiles_k * 32 + lane;

  float acc[MT][4][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][j][i] = 0.0f;

  // Tiles past K (last chunk) and past N (last block column) read nothing.
  auto load = [&](int64_t chunk, uint4 (&w)[kLoads]) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t kt = qtile::chunk_tile(BITS, chunk, kw, u);
      w[u] = live && kt < a.tiles_k ? __ldg(tiles + kt * 32) : make_uint4(0, 0, 0, 0);
    }
  };
  uint4 cur[kLoads] = {}, next[kLoads] = {};
  if (c_begin < c_end) load(c_begin, cur);
  for (int64_t chunk = c_begin; chunk < c_end; ++chunk) {
    if (chunk + 1 < c_end) load(chunk + 1, next);
    // Stage rows [0, 16 MT) x inputs [k_chunk, k_chunk + kChunk) as bf16, zeros past m and k.
    const int64_t k_chunk = chunk * kChunk;
    for (int p = threadIdx.x; p < MT * 16 * (kChunk / 2); p += kThreads) {
      const int row = p / (kChunk / 2), col = 2 * (p % (kChunk / 2));
      const int64_t k = k_chunk + col;
      float v0 = 0.0f, v1 = 0.0f;
      if (row < a.m) {
        const float* xr = a.x + row * a.k;
        if (k < a.k) v0 = xr[k];
        if (k + 1 < a.k) v1 = xr[k + 1];
      }
      *reinterpret_cast<uint32_t*>(&xs[row * kStride + col]) = pack_bf16(v0, v1);
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t kt = qtile::chunk_tile(BITS, chunk, kw, u);
      if (!live || kt >= a.tiles_k) break;
      const int local = static_cast<int>(kt - chunk * qtile::tiles_per_chunk(BITS));  // tile within the chunk
      const uint32_t words[4] = {cur[u].x, cur[u].y, cur[u].z, cur[u].w};
#pragma unroll
      for (int s = 0; s < KT / 16; ++s) {
        const int c0 = local * KT + 16 * s;
        tc_step<BITS, MT, UNIFORM>(a, words, 4 * s, k_chunk + c0, c0, xs, n_tile0, lane, acc);
      }
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kLoads; ++u) cur[u] = next[u];
  }

  store_sums<MT>(reinterpret_cast<float*>(smem), acc, spot, a.m, a.n, a.bias, a.out, a.splits);
}

// y = sum over the splits of the partial sums, in split order (+ bias).
__global__ void sum_splits_kernel(const float* part, int splits, int64_t m, int64_t n, const float* bias, float* y) {
  const int64_t count = m * n;
  for (int64_t i = grid_first(); i < count; i += grid_step()) {
    float v = part[i];
    for (int s = 1; s < splits; ++s) v = __fadd_rn(v, part[s * count + i]);
    if (bias != nullptr) v = __fadd_rn(v, bias[i % n]);
    y[i] = v;
  }
}

// out[r][k] = bf16(q[n0 + r][k] * scale), rows [n0, n0 + rows) of the matrix, row-major [rows, k].
template <int BITS>
__global__ void dequant_kernel(QuantTiles w, int64_t n0, int64_t rows, __nv_bfloat16* out) {
  const int64_t count = rows * w.l.cols;
  const auto* bytes = static_cast<const uint8_t*>(w.tiles);
  for (int64_t i = grid_first(); i < count; i += grid_step()) {
    const int64_t n = n0 + i / w.l.cols, k = i % w.l.cols;
    int shift = 0;
    const int64_t at = qtile::weight_byte(BITS, w.l.tiles_k, n, k, &shift);
    const int q = qtile::q_of_word(BITS, static_cast<uint32_t>(bytes[at]) >> shift, 0);
    const float s = w.scales[qtile::group_of(k, w.l.group, w.l.groups) * w.l.rows_padded + n];
    out[i] = __float2bfloat16_rn(__fmul_rn(static_cast<float>(q), s));
  }
}

// The tensor-core instantiation for a bit width, row tiles (MT = 1..4, 16 rows each) and whether
// the scale steps are uniform.
template <int BITS, int MT>
auto* tc_kernel(bool uniform) {
  return uniform ? qgemm_tc_kernel<BITS, MT, true> : qgemm_tc_kernel<BITS, MT, false>;
}

template <int BITS>
auto* tc_kernel(int mt, bool uniform) {
  switch (mt) {
    case 1: return tc_kernel<BITS, 1>(uniform);
    case 2: return tc_kernel<BITS, 2>(uniform);
    case 3: return tc_kernel<BITS, 3>(uniform);
    default: return tc_kernel<BITS, 4>(uniform);
  }
}

auto* tc_kernel_for(int bits, int64_t m, bool uniform) {
  const int mt = static_cast<int>((m + 15) / 16);
  return bits == 8 ? tc_kernel<8>(mt, uniform) : tc_kernel<4>(mt, uniform);
}

}  // namespace

void launch_qgemm_tc(const QuantTiles& w, const QTcPlan& plan, const float* x, int64_t m, float* y,
                     const float* bias, float* partials, cudaStream_t stream) {
  if (m <= 0) return;
  TcArgs a;
  a.tiles = static_cast<const uint4*>(w.tiles);
  a.scales = w.scales;
  a.x = x;
  a.bias = bias;
  a.out = plan.splits > 1 ? partials : y;
  a.m = m;
  a.n = w.l.rows;
  a.k = w.l.cols;
  a.n_padded = w.l.rows_padded;
  a.tiles_k = w.l.tiles_k;
  a.group = w.l.group;
  a.group_div = qtile::div_by(static_cast<uint32_t>(w.l.group));
  a.groups = w.l.groups;
  a.tiles_n = w.l.tiles_n;
  a.chunks = plan.chunks;
  a.chunks_per_split = plan.chunks_per_split;
  a.splits = plan.splits;
  const bool uniform = qtile::step_uniform(w.l.group, w.l.groups);
  const dim3 grid(static_cast<unsigned>(plan.block_columns), static_cast<unsigned>(plan.splits));
  tc_kernel_for(w.l.bits, m, uniform)<<<grid, kThreads, 0, stream>>>(a);
  TPDRAFT_CHECK_LAUNCH("qgemm (tensor cores)");
  if (plan.splits > 1) {
    launch_sum_splits(partials, plan.splits, m, w.l.rows, bias, y, stream);
  }
}

void launch_sum_splits(const float* partials, int splits, int64_t m, int64_t n, const float* bias, float* y,
                       cudaStream_t stream) {
  if (m * n <= 0) return;
  sum_splits_kernel<<<stride_blocks(m * n), kStrideThreads, 0, stream>>>(partials, splits, m, n, bias, y);
  TPDRAFT_CHECK_LAUNCH("qgemm (split-K sum)");
}

int qgemm_tc_blocks_per_sm(int bits, int64_t m, bool uniform) {
  int blocks = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, tc_kernel_for(bits, m, uniform), kThreads, 0));
  return blocks > 0 ? blocks : 1;
}

void launch_qdequant(const QuantTiles& w, int64_t n0, int64_t rows, void* out, cudaStream_t stream) {
  const int64_t count = rows * w.l.cols;
  if (count <= 0) return;
  const unsigned grid = stride_blocks(count);
  auto* o = static_cast<__nv_bfloat16*>(out);
  if (w.l.bits == 8)
    dequant_kernel<8><<<grid, kStrideThreads, 0, stream>>>(w, n0, rows, o);
  else
    dequant_kernel<4><<<grid, kStrideThreads, 0, stream>>>(w, n0, rows, o);
  TPDRAFT_CHECK_LAUNCH("qgemm (dequantize to bf16)");
}

}  // namespace tpdraft::kernels::cuda
