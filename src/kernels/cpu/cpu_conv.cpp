// DFlash 2's grouped dynamic causal convolution along the rows of each session's block
// (docs/model.md). Depthwise per channel: the inner loop runs over the channels of one group, whose
// dynamic coefficient is a single scalar, and is compiled once per instruction set.
#include "kernels/cpu/cpu_ops.h"

namespace tpdraft::kernels::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 17;  // multiply-adds; below this one thread is faster

// Output rows [row_begin, row_end) of the flattened [S*B] rows. Terms are added in tap order
// j = 0, 1, ... to a zeroed row, the same order whatever the instruction set.
TPDRAFT_INLINE void conv_rows_body(const ConvParams& p, int64_t row_begin, int64_t row_end) {
  const int64_t h = p.hidden, gs = p.group_size, groups = p.hidden / p.group_size;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t t = row % p.block;  // position inside the session's block
    float* o = p.out + row * h;
    for (int64_t c = 0; c < h; ++c) o[c] = 0.0f;
    const int64_t taps = t + 1 < p.kernel ? t + 1 : p.kernel;  // in_{t-j} = 0 before the block
    for (int64_t j = 0; j < taps; ++j) {
      const float* in = p.in + (row - j) * h;
      const float* base = p.base + j * h;
      const float* delta = p.delta + row * p.delta_stride + p.delta_offset + j * groups;
      for (int64_t g = 0; g < groups; ++g) {
        const float dv = delta[g];
        for (int64_t c = g * gs; c < (g + 1) * gs; ++c) o[c] += (base[c] + dv) * in[c];
      }
    }
  }
}

}  // namespace

void CpuOps::do_dyn_conv(const ConvParams& p) {
  if (recording(&CpuOps::do_dyn_conv, p)) return;
  const Isa isa = active_isa();
  const int64_t rows = p.sessions * p.block;
  if (rows * p.hidden * p.kernel < kParallelMin) return on_isa<conv_rows_body>(isa, p, 0, rows);
  pool_.parallel_for(rows,
                     [&](int64_t b, int64_t e, int) { on_isa<conv_rows_body>(isa, p, b, e); });
}

}  // namespace tpdraft::kernels::cpu
