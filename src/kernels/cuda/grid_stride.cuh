// Grid-stride loops of the memory-bound kernels: blocks of kStrideThreads threads, at most 65536
// of them; thread grid_first() takes every grid_step()-th element from there on.
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

}  // namespace tpdraft::kernels::cuda
