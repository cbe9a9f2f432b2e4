// What the two quantized tensor-core kernels (cuda_qgemm.cu: bf16 activations; cuda_qgemm_a8.cu:
// int8 activations) share: where a warp works in the block layout of kernels/qtile_layout.h (its
// tile column, its turn within the column, its split's chunks), and the end of a block, where the
// warps' f32 sums are added in a fixed order and written out.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/qtile_layout.h"

namespace tpdraft::kernels::cuda {

constexpr int kQgemmThreads = qtile::kWarps * 32;

// This thread's warp in the grid: block column blockIdx.x, split blockIdx.y.
struct WarpSpot {
  int lane = 0, column = 0, kw = 0;  // tile column of the block, turn within it
  int64_t tile_n = 0, n_tile0 = 0;   // the tile column over N, its first output
  bool live = false;                 // false past N's tiles (the last block column)
  int64_t c_begin = 0, c_end = 0;    // the split's chunks of kChunk inputs
};

__device__ __forceinline__ WarpSpot warp_spot(int64_t tiles_n, int64_t chunks, int64_t chunks_per_split) {
  WarpSpot s;
  s.lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  s.column = warp / qtile::kWarpsK;
  s.kw = warp % qtile::kWarpsK;
  s.tile_n = static_cast<int64_t>(blockIdx.x) * qtile::kColumns + s.column;
  s.n_tile0 = s.tile_n * qtile::kTileN;
  s.live = s.tile_n < tiles_n;
  s.c_begin = blockIdx.y * chunks_per_split;
  s.c_end = s.c_begin + chunks_per_split < chunks ? s.c_begin + chunks_per_split : chunks;
  return s;
}

// Shared memory the block's sums need: kColumns x (16 MT rows x kTileN outputs) floats.
template <int MT>
__host__ __device__ constexpr int sum_bytes() {
  return qtile::kColumns * MT * 16 * qtile::kTileN * 4;
}

// The block's end: each tile column's warps summed in `smem` (sum_bytes<MT>(), free to reuse),
// kw = 0 first, then in order; then row by row over the block's 128 outputs (consecutive threads
// write consecutive floats): y [m, n] (+ bias) with one split, else partial sums [splits, m, n].
template <int MT>
__device__ __forceinline__ void store_sums(float* smem, const float (&acc)[MT][4][4], const WarpSpot& s, int64_t m,
                                           int64_t n, const float* bias, float* out, int splits) {
  float* mine = smem + s.column * (MT * 16 * qtile::kTileN);
  for (int r = 0; r < qtile::kWarpsK; ++r) {
    if (s.kw == r) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float& v = mine[(mt * 16 + qtile::c_row(s.lane, i)) * qtile::kTileN + 8 * j + qtile::c_col(s.lane, i)];
            v = r == 0 ? acc[mt][j][i] : __fadd_rn(v, acc[mt][j][i]);
          }
    }
    __syncthreads();
  }
  constexpr int kOutputs = qtile::kColumns * qtile::kTileN;
  for (int p = threadIdx.x; p < MT * 16 * kOutputs; p += kQgemmThreads) {
    const int row = p / kOutputs, cc = p % kOutputs;
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kOutputs + cc;
    if (row >= m || col >= n) continue;
    const float v = smem[((cc / qtile::kTileN) * MT * 16 + row) * qtile::kTileN + cc % qtile::kTileN];
    if (splits == 1)
      out[row * n + col] = bias != nullptr ? __fadd_rn(v, bias[col]) : v;
    else
      out[(blockIdx.y * m + row) * n + col] = v;
  }
}

}  // namespace tpdraft::kernels::cuda
