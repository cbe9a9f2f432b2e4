// Weight-only int8 / int4 matmul (W8A16 / W4A16 with f32 activations): y[i][n] = sum_k x[i][k] *
// q[n][k] * scale[n][k / group] (+ bias[n]). The weights stay packed in device memory and are
// dequantized in registers; one warp per output row, the activation rows taken 8 at a time (a
// draft's 16 rows in two passes). A plain reference-quality kernel: no tensor cores, no
// Marlin-style layout, and large row counts (settle) re-read the weights once per 8 rows.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace tpdraft::kernels::cuda {
namespace {

constexpr int kWarps = 8;      // output rows per block
constexpr int kRowsPerPass = 8;  // activation rows per pass

// Weight (q * scale) of row n, column k in the packed layout of quant_layout_bytes.
__device__ __forceinline__ float weight_at(const QuantDeviceMatrix& w, int64_t n, int64_t k) {
  int q;
  if (w.bits == 8) {
    q = static_cast<int>(static_cast<const int8_t*>(w.q)[n * w.row_bytes + k]);
  } else {
    const uint8_t byte = static_cast<const uint8_t*>(w.q)[n * w.row_bytes + k / 2];
    q = static_cast<int>((k & 1) ? (byte >> 4) : (byte & 0xf)) - 8;
  }
  return __fmul_rn(static_cast<float>(q), w.scales[n * (w.cols / w.group) + k / w.group]);
}

__global__ void qgemm_kernel(QuantDeviceMatrix w, const float* x, int64_t m, float* y, const float* bias) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= w.rows) return;
  for (int64_t i0 = 0; i0 < m; i0 += kRowsPerPass) {
    const int rows = static_cast<int>(m - i0 < kRowsPerPass ? m - i0 : kRowsPerPass);
    float acc[kRowsPerPass];
#pragma unroll
    for (int i = 0; i < kRowsPerPass; ++i) acc[i] = 0.0f;
    for (int64_t k = lane; k < w.cols; k += 32) {
      const float wv = weight_at(w, n, k);
#pragma unroll
      for (int i = 0; i < kRowsPerPass; ++i)
        if (i < rows) acc[i] = __fmaf_rn(wv, x[(i0 + i) * w.cols + k], acc[i]);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerPass; ++i) {
      float v = acc[i];
      for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
      if (lane == 0 && i < rows) y[(i0 + i) * w.rows + n] = bias ? __fadd_rn(v, bias[n]) : v;
    }
  }
}

}  // namespace

void launch_qgemm(const QuantDeviceMatrix& w, const float* x, int64_t m, float* y, const float* bias,
                  cudaStream_t stream) {
  if (m <= 0 || w.rows <= 0) return;
  const int64_t blocks = (w.rows + kWarps - 1) / kWarps;
  qgemm_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(w, x, m, y, bias);
  TPDRAFT_CHECK_LAUNCH("qgemm");
}

}  // namespace tpdraft::kernels::cuda
