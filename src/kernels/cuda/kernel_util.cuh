// Device helpers shared by the kernels: grid-stride loops (blocks of kStrideThreads threads, at
// most 65536 of them; thread grid_first() takes every grid_step()-th element from there on) and
// a warp's butterfly sum.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tpdraft::kernels::cuda {

constexpr int kStrideThreads = 256;

// Blocks for n elements (at least one); past 65536 blocks the loops stride over the rest.
inline unsigned stride_blocks(int64_t n) {
  const int64_t b = (n + kStrideThreads - 1) / kStrideThreads;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

__device__ __forceinline__ int64_t grid_first() { return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ int64_t grid_step() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// The sum of v over the warp's 32 lanes, which every lane gets.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace tpdraft::kernels::cuda
