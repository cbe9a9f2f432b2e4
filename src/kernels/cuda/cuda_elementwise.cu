// Element-wise kernels: silu_mul, add and the row gather that builds a draft's block rows. Memory bound: grid-stride loops, one element per
// thread per step; a draft's largest call is 16 x 12288 floats.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace tpdraft::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);  // grid-stride beyond that
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __fadd_rn(y[i], x[i]);
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
  gather_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(src, index, row_len, dst);
  TPDRAFT_CHECK_LAUNCH("gather_rows");
}

void launch_silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, stream>>>(gate, up, out, n);
  TPDRAFT_CHECK_LAUNCH("silu_mul");
}

void launch_add(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
  TPDRAFT_CHECK_LAUNCH("add");
}

}  // namespace tpdraft::kernels::cuda
