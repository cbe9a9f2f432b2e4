// What the SIMD kernel files share: the intrinsics and small helpers around them.
#pragma once

// GCC 12's AVX-512 headers self-initialise "undefined" vectors and trip -Wuninitialized at every
// inlined use (GCC PR 105593); the warning is located in the header, so silence it there only
// (clang has neither the problem nor the -Wmaybe-uninitialized group).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include <cstdint>

#include "kernels/cpu/cpu_ops.h"

namespace tpdraft::kernels::cpu {

// The first `left` of 16 lanes (all of them for left >= 16): the tail of a masked loop.
TPDRAFT_INLINE __mmask16 mask16(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

}  // namespace tpdraft::kernels::cpu
