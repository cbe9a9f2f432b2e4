// Tensor-core helpers shared by the kernels that multiply bf16 fragments: packing two floats into
// a bf16 pair and mma.m16n8k16 (bf16 in, f32 accumulate); and mma.m16n8k32 on int8 (s32
// accumulate, exact), whose fragments kernels/qtile_layout.h describes (s8_a_row, s8_a_col). The fragment layouts are PTX's:
// A row-major (a0: row g, cols 2t, 2t+1; a1: row g + 8; a2: cols + 8; a3: both), B column-major
// (b0: rows 2t, 2t+1 of column g; b1: rows + 8), C (c0, c1: row g, cols 2t, 2t+1; c2, c3: row g +
// 8), with g = lane / 4 and t = lane % 4.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tpdraft::kernels::cuda {

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 mma needs sm_80; the build targets 80 and 90
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// d += a . b for int8 A (m16 x k32, row) and B (k32 x n8, col), exact int32 sums.
__device__ __forceinline__ void mma_s8(int32_t (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // m16n8k32 .s8 needs sm_80; the build targets 80 and 90
#else
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

}  // namespace tpdraft::kernels::cuda
