// Matmul with int8 activations (W8A8, W4A8): y[i][n] = sum over the activation blocks b of
// (sum_{k in b} xq[i][k] q[n][k]) * (scale[n][group of b] * xs[i][b]) (+ bias[n]), on weights in
// the tiled layout of kernels/qtile_layout.h and activations quantized per row, block by block,
// as kernels/int8_activations.h says (the CPU backend's blocks and rounding, so both hold the same
// integers; only the order of the float sums differs).
//
// Two kernels. quantize_a8 writes each row's int8 values in the tiles' input order (qtile::a8_pos)
// and one scale per block. qgemm_a8 is the weight-only tensor-core kernel's shape (cuda_qgemm.cu:
// blocks of four tile columns, two warps per column, split-K over chunks of 128 inputs, the next
// chunk's tiles loaded before the current one is multiplied), with mma.m16n8k32 on int8 operands:
// each warp takes two consecutive k32 steps of a chunk (qtile::a8_step), reads its A fragments
// straight from the quantized rows (4 bytes per register, no staging), sums the products exactly
// in int32 and, where its next step lies in another activation block, adds the sum to f32 as
// float(sum) * (weight scale * activation scale). Up to 64 rows per launch; more rows are taken
// 64 at a time with the same split-K plan, so a row's result does not depend on the rows beside
// it. The warps' and the splits' sums are added in a fixed order (bit-reproducible).
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/qgemm_block.cuh"
#include "kernels/qtile_layout.h"

namespace tpdraft::kernels::cuda {
namespace {

constexpr int kThreads = kQgemmThreads;

// One warp per (row, block) of the rows padded to 16: the block's largest |x| (a butterfly max,
// exact in any order), then its values rounded as the CPU backend rounds them. Rows past m, and
// the inputs past cols in the last block, are written as zeros (no separate clearing launch).
__global__ void quantize_a8_kernel(const float* x, int64_t m, int64_t rows, int64_t cols, int64_t kb, int64_t nb,
                                   int64_t row_bytes, int8_t* xq, float* xs) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = grid_step() / 32;
  for (int64_t w = grid_first() / 32; w < rows * nb; w += warps) {
    const int64_t row = w / nb, b = w % nb;
    const int64_t c0 = b * kb, c1 = c0 + kb < cols ? c0 + kb : cols;
    const int64_t c_pad = b + 1 == nb ? row_bytes : c1;  // the last block also clears the tail
    const bool real = row < m;
    const float* xr = x + row * cols;
    float amax = 0.0f;
    if (real)
      for (int64_t c = c0 + lane; c < c1; c += 32) amax = fmaxf(amax, fabsf(xr[c]));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float inv = amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    int8_t* qr = xq + row * row_bytes;
    for (int64_t c = c0 + lane; c < c_pad; c += 32) {
      const float v = real && c < c1 ? fminf(127.0f, fmaxf(-127.0f, rintf(__fmul_rn(xr[c], inv)))) : 0.0f;
      qr[qtile::a8_pos(c)] = static_cast<int8_t>(v);
    }
    if (lane == 0) xs[row * nb + b] = __fdiv_rn(amax, 127.0f);
  }
}

struct A8Args {
  const uint4* tiles = nullptr;   // qtile layout
  const float* scales = nullptr;  // [groups][n_padded]
  const int8_t* xq = nullptr;     // [rows, row_bytes], this launch's first row first
  const float* xs = nullptr;      // [rows, nb]
  const float* bias = nullptr;    // [n] or null (applied only without split-K)
  float* out = nullptr;           // y [m, n] (one split) or partial sums [splits, m, n]
  int64_t m = 0, n = 0, n_padded = 0, tiles_k = 0, groups = 0, nb = 0, row_bytes = 0, steps = 0;
  qtile::DivBy kb_div, group_div;
  uint32_t kb = 0;
  int64_t tiles_n = 0, chunks = 0, chunks_per_split = 0;
  int splits = 1;
};

template <int BITS, int MT>
__global__ void __launch_bounds__(kThreads) qgemm_a8_kernel(A8Args a) {
  constexpr int kLoads = BITS == 8 ? 4 : 2;  // per warp and chunk: two steps of two int8 tiles or one int4 tile
  __shared__ __align__(16) float sums[sum_bytes<MT>() / 4];

  const WarpSpot spot = warp_spot(a.tiles_n, a.chunks, a.chunks_per_split);
  const int lane = spot.lane, kw = spot.kw;
  const int64_t n_tile0 = spot.n_tile0, c_begin = spot.c_begin, c_end = spot.c_end;
  const uint4* tiles = a.tiles + (spot.live ? spot.tile_n : 0) * a.tiles_k * 32 + lane;

  int32_t iacc[MT][4][4];
  float facc[MT][4][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        iacc[mt][j][i] = 0;
        facc[mt][j][i] = 0.0f;
      }

  // Tiles past K (last chunk) read as zero weights.
  auto load = [&](int64_t chunk, uint4 (&w)[kLoads]) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t step = qtile::a8_step(chunk, kw, BITS == 8 ? u / 2 : u);
      const int64_t kt = BITS == 8 ? 2 * step + u % 2 : step;
      w[u] = kt < a.tiles_k ? __ldg(tiles + kt * 32) : make_uint4(0, 0, 0, 0);
    }
  };
  // The integer sums so far, scaled into f32: activation block `blk` of every row.
  auto flush = [&](uint32_t blk) {
    const int64_t g = qtile::group_of(blk * a.kb, a.group_div, a.groups);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float ws = __ldg(&a.scales[g * a.n_padded + n_tile0 + 8 * j + qtile::c_col(lane, i)]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const float s = __fmul_rn(ws, a.xs[(mt * 16 + qtile::c_row(lane, i)) * a.nb + blk]);
          facc[mt][j][i] = __fmaf_rn(__int2float_rn(iacc[mt][j][i]), s, facc[mt][j][i]);
          iacc[mt][j][i] = 0;
        }
      }
  };

  if (spot.live) {
    uint4 cur[kLoads] = {}, next[kLoads] = {};
    if (c_begin < c_end) load(c_begin, cur);
    for (int64_t chunk = c_begin; chunk < c_end; ++chunk) {
      if (chunk + 1 < c_end) load(chunk + 1, next);
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int64_t step = qtile::a8_step(chunk, kw, u);
        if (step >= a.steps) break;
        uint32_t b[4][2];
        const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&cur[BITS == 8 ? 2 * u : u]);
        const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&cur[BITS == 8 ? 2 * u + 1 : u]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          b[j][0] = BITS == 8 ? w0[j] : qtile::int4_s8_word(w0[j], 0);
          b[j][1] = BITS == 8 ? w1[j] : qtile::int4_s8_word(w1[j], 1);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          uint32_t af[4];
#pragma unroll
          for (int r = 0; r < 4; ++r)
            af[r] = *reinterpret_cast<const uint32_t*>(a.xq + (mt * 16 + qtile::s8_a_row(lane, r)) * a.row_bytes +
                                                       32 * step + qtile::s8_a_col(lane, r));
#pragma unroll
          for (int j = 0; j < 4; ++j) mma_s8(iacc[mt][j], af, b[j][0], b[j][1]);
        }
        // The warp's next step: the other one of this chunk, or its first of the next chunk.
        const int64_t following = u == 0 ? step + 1 : qtile::a8_step(chunk + 1, kw, 0);
        const bool last = following >= a.steps || (u == 1 && chunk + 1 >= c_end);
        const uint32_t blk = qtile::divide(static_cast<uint32_t>(32 * step), a.kb_div);
        if (last || qtile::divide(static_cast<uint32_t>(32 * following), a.kb_div) != blk) flush(blk);
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) cur[u] = next[u];
    }
  }

  store_sums<MT>(sums, facc, spot, a.m, a.n, a.bias, a.out, a.splits);
}

template <int BITS>
auto* a8_kernel(int mt) {
  switch (mt) {
    case 1: return qgemm_a8_kernel<BITS, 1>;
    case 2: return qgemm_a8_kernel<BITS, 2>;
    case 3: return qgemm_a8_kernel<BITS, 3>;
    default: return qgemm_a8_kernel<BITS, 4>;
  }
}

auto* a8_kernel_for(int bits, int mt) { return bits == 8 ? a8_kernel<8>(mt) : a8_kernel<4>(mt); }

}  // namespace

void launch_quantize_a8(const float* x, int64_t m, int64_t cols, int64_t kb, int8_t* xq, float* xs,
                        cudaStream_t stream) {
  if (m <= 0) return;
  const int64_t nb = (cols + kb - 1) / kb, rows = (m + 15) / 16 * 16;
  quantize_a8_kernel<<<stride_blocks(rows * nb * 32), kStrideThreads, 0, stream>>>(
      x, m, rows, cols, kb, nb, qtile::a8_row_bytes(cols), xq, xs);
  TPDRAFT_CHECK_LAUNCH("qgemm (quantize activations to int8)");
}

void launch_qgemm_a8(const QuantTiles& w, const QTcPlan& plan, int64_t kb, const int8_t* xq, const float* xs,
                     int64_t m, float* y, const float* bias, float* partials, cudaStream_t stream) {
  A8Args a;
  a.tiles = static_cast<const uint4*>(w.tiles);
  a.scales = w.scales;
  a.bias = bias;
  a.n = w.l.rows;
  a.n_padded = w.l.rows_padded;
  a.tiles_k = w.l.tiles_k;
  a.groups = w.l.groups;
  a.nb = (w.l.cols + kb - 1) / kb;
  a.row_bytes = qtile::a8_row_bytes(w.l.cols);
  a.steps = (w.l.tiles_k * qtile::tile_k(w.l.bits) + 31) / 32;
  a.kb = static_cast<uint32_t>(kb);
  a.kb_div = qtile::div_by(a.kb);
  a.group_div = qtile::div_by(static_cast<uint32_t>(w.l.group));
  a.tiles_n = w.l.tiles_n;
  a.chunks = plan.chunks;
  a.chunks_per_split = plan.chunks_per_split;
  a.splits = plan.splits;
  const dim3 grid(static_cast<unsigned>(plan.block_columns), static_cast<unsigned>(plan.splits));
  for (int64_t r0 = 0; r0 < m; r0 += kQgemmTcMaxRows) {
    a.m = m - r0 < kQgemmTcMaxRows ? m - r0 : kQgemmTcMaxRows;
    a.xq = xq + r0 * a.row_bytes;
    a.xs = xs + r0 * a.nb;
    a.out = plan.splits > 1 ? partials : y + r0 * a.n;
    a8_kernel_for(w.l.bits, static_cast<int>((a.m + 15) / 16))<<<grid, kThreads, 0, stream>>>(a);
    TPDRAFT_CHECK_LAUNCH("qgemm (int8 activations, tensor cores)");
    if (plan.splits > 1) launch_sum_splits(partials, plan.splits, a.m, a.n, bias, y + r0 * a.n, stream);
  }
}

int qgemm_a8_blocks_per_sm(int bits) {
  int blocks = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, a8_kernel_for(bits, 1), kThreads, 0));
  return blocks > 0 ? blocks : 1;
}

}  // namespace tpdraft::kernels::cuda
