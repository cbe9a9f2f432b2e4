// RMSNorm over rows, after a residual add or not (one block per row, warp-shuffle reductions), and the per-head RMSNorm +
// NeoX rotate-half RoPE on q and k (one block per row, one warp per head). Both follow the CPU
// twin's formula: s = 1 / sqrt(sum(x^2) / n + eps), y = w * (x * s); angles pos * theta^(-2i/D)
// in double, their cos / sin rounded to f32, as the CPU does.
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernel_util.cuh"

namespace tpdraft::kernels::cuda {
namespace {

constexpr int kNormThreads = 256;
constexpr int kRopeWarps = 4;

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0.0f;
  return warp_sum(v);
}

// y = rms_norm(h), after h += add where add is not null (a residual add fused with the norm that
// follows it). y may alias h: every thread reads its elements for the sum before block_sum's
// barriers, and reads them again (its own) only to write them.
__global__ void rms_norm_kernel(float* h, const float* add, const float* w, float* y, int64_t n, float eps) {
  float* hr = h + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    if (add != nullptr) hr[c] = __fadd_rn(hr[c], add[blockIdx.x * n + c]);
    sum = fmaf(hr[c], hr[c], sum);
  }
  sum = block_sum(sum);
  const float s = 1.0f / sqrtf(sum / static_cast<float>(n) + eps);
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) yr[c] = __fmul_rn(w[c], __fmul_rn(hr[c], s));
}

// Block = one row of [heads, D]; shared cs[0 .. D/2) = cos, cs[D/2 .. D) = sin of the row's angles.
__global__ void head_norm_rope_kernel(float* x, const float* w, int64_t heads, int64_t d, float eps,
                                      const int64_t* positions, const double* inv_freq) {
  extern __shared__ float cs[];
  const int64_t half = d / 2;
  const double pos = static_cast<double>(positions[blockIdx.x]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    double sn, cn;
    sincos(pos * inv_freq[i], &sn, &cn);
    cs[i] = static_cast<float>(cn);
    cs[half + i] = static_cast<float>(sn);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t h = warp; h < heads; h += kRopeWarps) {
    float* xh = x + (blockIdx.x * heads + h) * d;
    float sum = 0.0f;
    for (int64_t i = lane; i < d; i += 32) sum = fmaf(xh[i], xh[i], sum);
    const float s = 1.0f / sqrtf(warp_sum(sum) / static_cast<float>(d) + eps);
    for (int64_t i = lane; i < half; i += 32) {
      const float a = __fmul_rn(w[i], __fmul_rn(xh[i], s));
      const float b = __fmul_rn(w[i + half], __fmul_rn(xh[i + half], s));
      xh[i] = __fsub_rn(__fmul_rn(a, cs[i]), __fmul_rn(b, cs[half + i]));
      xh[i + half] = __fadd_rn(__fmul_rn(b, cs[i]), __fmul_rn(a, cs[half + i]));
    }
  }
}

}  // namespace

void launch_rms_norm(float* h, const float* add, const float* w, float* y, int64_t rows, int64_t n, float eps,
                     cudaStream_t stream) {
  if (rows <= 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, stream>>>(h, add, w, y, n, eps);
  TPDRAFT_CHECK_LAUNCH("rms_norm");
}

void launch_head_norm_rope(float* x, const float* w, int64_t rows, int64_t heads, int64_t head_dim, float eps,
                           const int64_t* positions, const double* inv_freq, cudaStream_t stream) {
  if (rows <= 0) return;
  const size_t shared = static_cast<size_t>(head_dim) * sizeof(float);
  head_norm_rope_kernel<<<static_cast<unsigned>(rows), kRopeWarps * 32, shared, stream>>>(x, w, heads, head_dim, eps,
                                                                                            positions, inv_freq);
  TPDRAFT_CHECK_LAUNCH("head_norm_rope");
}

}  // namespace tpdraft::kernels::cuda
