// DFlash 2's grouped dynamic causal convolution (docs/model.md) along the rows of each session's
// block, one thread per output element. The taps are added in order j = 0, 1, ... to a zero with
// explicitly rounded operations (no fused multiply-add), the order of the CPU twin; the CPU's
// vector variants may contract a multiply and an add into one FMA, so the two agree to f32
// rounding, not always bit for bit.
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernel_util.cuh"

namespace tpdraft::kernels::cuda {
namespace {

__global__ void dyn_conv_kernel(ConvParams p, int64_t total) {
  const int64_t h = p.hidden, groups = p.hidden / p.group_size;
  for (int64_t e = grid_first(); e < total; e += grid_step()) {
    const int64_t row = e / h, c = e % h;
    const int64_t t = row % p.block;  // position inside the session's block
    const int64_t taps = t + 1 < p.kernel ? t + 1 : p.kernel;
    const float* delta = p.delta + row * p.delta_stride + p.delta_offset + c / p.group_size;
    float o = 0.0f;
    for (int64_t j = 0; j < taps; ++j) {
      const float coef = __fadd_rn(p.base[j * h + c], delta[j * groups]);
      o = __fadd_rn(o, __fmul_rn(coef, p.in[(row - j) * h + c]));
    }
    p.out[e] = o;
  }
}

}  // namespace

void launch_dyn_conv(const ConvParams& p, cudaStream_t stream) {
  const int64_t total = p.sessions * p.block * p.hidden;
  if (total <= 0) return;
  dyn_conv_kernel<<<stride_blocks(total), kStrideThreads, 0, stream>>>(p, total);
  TPDRAFT_CHECK_LAUNCH("dyn_conv");
}

}  // namespace tpdraft::kernels::cuda
