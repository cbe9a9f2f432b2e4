// Element-wise kernels: silu_mul, 16-bit floats widened to f32 and the row gather that builds a draft's block rows. Memory bound: grid-stride loops, one element per
// thread per step; a draft's largest call is 16 x 12288 floats.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernel_util.cuh"

namespace tpdraft::kernels::cuda {
namespace {

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_step()) {
    const float g = gate[i];
    out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
  }
}

// Exact: every bf16 and f16 value is an f32 value.
__global__ void widen_kernel(const uint16_t* src, bool bf16, float* dst, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_step())
    dst[i] = bf16 ? __uint_as_float(static_cast<uint32_t>(src[i]) << 16) : __half2float(__ushort_as_half(src[i]));
}

// One block per row: the row's index is read once, the copy strides over its floats.
__global__ void gather_rows_kernel(const float* src, const int64_t* index, int64_t row_len, float* dst) {
  const int64_t r = blockIdx.x;
  const float* from = src + index[r] * row_len;
  float* to = dst + r * row_len;
  for (int64_t c = threadIdx.x; c < row_len; c += blockDim.x) to[c] = from[c];
}

}  // namespace

void launch_gather_rows(const float* src, const int64_t* index, int64_t rows, int64_t row_len, float* dst,
                        cudaStream_t stream) {
  if (rows <= 0 || row_len <= 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(rows), kStrideThreads, 0, stream>>>(src, index, row_len, dst);
  TPDRAFT_CHECK_LAUNCH("gather_rows");
}

void launch_silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  silu_mul_kernel<<<stride_blocks(n), kStrideThreads, 0, stream>>>(gate, up, out, n);
  TPDRAFT_CHECK_LAUNCH("silu_mul");
}

void launch_widen_to_f32(const void* src, bool bf16, float* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  widen_kernel<<<stride_blocks(n), kStrideThreads, 0, stream>>>(static_cast<const uint16_t*>(src), bf16, dst, n);
  TPDRAFT_CHECK_LAUNCH("widen_to_f32");
}

}  // namespace tpdraft::kernels::cuda
