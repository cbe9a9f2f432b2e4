// How a quantized matmul with int8 activations (W8A8 / W4A8, docs/quantization.md) cuts a row of
// activations into blocks, the same on every backend that offers it (the CPU kernels, the CUDA
// tensor-core kernel): a block of kb inputs never spans two weight scale groups, so its dot
// product is one exact integer sum scaled by (weight group scale) x (activation block scale).
// Each block is quantized symmetrically: scale = amax / 127, q = round_to_nearest_even(x * (127 /
// amax)) clamped to [-127, 127], both f32 operations (0 for an all-zero block).
#pragma once

#include <cstdint>

namespace tpdraft::kernels {

// Inputs per activation block for weight scale groups of `group` inputs in rows of `cols`
// (group divides cols). One scale per row (group == cols): the whole row up to 256 inputs, else
// blocks of 128 (the last one may be short). Groups up to 256: the group. Larger groups: their
// largest divisor up to 256 (at least 16), or the whole group when it has none.
inline int64_t activation_block(int64_t group, int64_t cols) {
  if (group == cols) return cols <= 256 ? cols : 128;
  if (group <= 256) return group;
  for (int64_t d = 256; d >= 16; --d)
    if (group % d == 0) return d;
  return group;
}

}  // namespace tpdraft::kernels
