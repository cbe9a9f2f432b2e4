// The element-wise stages around the cuBLAS GEMMs of matmul and the head (cuda_gemm.cpp).
// cuBLAS multiplies operands of one type, so f32 activations meet bf16 / f16 weights as 16-bit
// values: split into hi = round(x) and lo = round(x - hi), stacked as 2m rows of one GEMM (the
// weights are read once), and the two output rows summed afterwards. hi + lo keeps ~16
// significant bits of x for bf16 (~22 for f16); see cuda_gemm.cpp and docs/gpu.md.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernel_util.cuh"

namespace tpdraft::kernels::cuda {
namespace {

template <typename T>
__device__ __forceinline__ T round_to(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 round_to<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half round_to<__half>(float v) {
  return __float2half_rn(v);
}
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }

template <typename T>
__global__ void split_kernel(const float* x, int64_t count, int parts, T* out) {
  for (int64_t i = grid_first(); i < count; i += grid_step()) {
    const float v = x[i];
    const T hi = round_to<T>(v);
    out[i] = hi;
    if (parts == 2) {
      // inf - inf would make the low part NaN: an infinite (or NaN) input lives in hi alone.
      const float hv = widen(hi);
      out[count + i] = round_to<T>(isfinite(hv) ? __fsub_rn(v, hv) : 0.0f);
    }
  }
}

__global__ void sum_parts_kernel(const float* parts_buf, int parts, int64_t m, int64_t n, const float* bias,
                                 float* y) {
  const int64_t count = m * n;
  for (int64_t i = grid_first(); i < count; i += grid_step()) {
    float v = parts_buf[i];
    if (parts == 2) v = __fadd_rn(v, parts_buf[count + i]);
    if (bias != nullptr) v = __fadd_rn(v, bias[i % n]);
    y[i] = v;
  }
}

// The CPU twin's logit_of: x = scale * dot; cap > 0 ? cap * tanh(x / cap) : x (IEEE division).
__global__ void head_post_kernel(const float* parts_buf, int parts, int64_t m, int64_t n, float scale, float cap,
                                 float* logits) {
  const int64_t count = m * n;
  for (int64_t i = grid_first(); i < count; i += grid_step()) {
    float dot = parts_buf[i];
    if (parts == 2) dot = __fadd_rn(dot, parts_buf[count + i]);
    const float x = __fmul_rn(scale, dot);
    logits[i] = cap > 0.0f ? __fmul_rn(cap, tanhf(__fdiv_rn(x, cap))) : x;
  }
}

}  // namespace

void launch_split_activations(const float* x, int64_t m, int64_t cols, DType wtype, int parts, void* out,
                              cudaStream_t stream) {
  const int64_t count = m * cols;
  if (count <= 0) return;
  if (wtype == DType::BF16)
    split_kernel<<<stride_blocks(count), kStrideThreads, 0, stream>>>(x, count, parts,
                                                                       static_cast<__nv_bfloat16*>(out));
  else
    split_kernel<<<stride_blocks(count), kStrideThreads, 0, stream>>>(x, count, parts, static_cast<__half*>(out));
  TPDRAFT_CHECK_LAUNCH("matmul (activation split)");
}

void launch_sum_parts(const float* parts_buf, int parts, int64_t m, int64_t n, const float* bias, float* y,
                      cudaStream_t stream) {
  if (m * n <= 0) return;
  sum_parts_kernel<<<stride_blocks(m * n), kStrideThreads, 0, stream>>>(parts_buf, parts, m, n, bias, y);
  TPDRAFT_CHECK_LAUNCH("matmul (sum and bias)");
}

void launch_head_post(const float* parts_buf, int parts, int64_t m, int64_t n, float scale, float cap,
                      float* logits, cudaStream_t stream) {
  if (m * n <= 0) return;
  head_post_kernel<<<stride_blocks(m * n), kStrideThreads, 0, stream>>>(parts_buf, parts, m, n, scale, cap, logits);
  TPDRAFT_CHECK_LAUNCH("head (scale and soft cap)");
}

}  // namespace tpdraft::kernels::cuda
