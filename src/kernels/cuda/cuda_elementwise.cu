// Element-wise kernels: silu_mul and add. Memory bound: grid-stride loops, one element per
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

}  // namespace

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
