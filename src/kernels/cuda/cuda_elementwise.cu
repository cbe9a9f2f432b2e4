// Element-wise kernels: silu_mul, add, and the bf16 <-> f32 conversions the NCCL communicator's
// bf16 all-reduce uses (sum in f32, one rounding at the end). Memory bound: grid-stride loops,
// one element per thread per step; a draft's largest call is 16 x 12288 floats.
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

__global__ void bf16_to_f32_kernel(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
}

// The host's f32_to_bf16, bit for bit: NaN stays a (quiet) NaN, else round to nearest even.
__global__ void f32_to_bf16_kernel(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t u = __float_as_uint(in[i]);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      out[i] = static_cast<uint16_t>((u >> 16) | 0x40);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      out[i] = static_cast<uint16_t>(u >> 16);
    }
  }
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

void launch_bf16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(in, out, n);
  TPDRAFT_CHECK_LAUNCH("bf16_to_f32");
}

void launch_f32_to_bf16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(in, out, n);
  TPDRAFT_CHECK_LAUNCH("f32_to_bf16");
}

}  // namespace tpdraft::kernels::cuda
