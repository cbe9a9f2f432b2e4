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

// The vector exp of the softmaxes and SiLU: exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 (ln2 split in two so n*ln2_hi is
// exact), exp(r) by its degree-7 Taylor polynomial on |r| <= ln2/2 (truncation < 6e-9 relative,
// below half an f32 ulp). Result within ~2 ulp of exp over the whole f32 range.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[8] = {1.0f, 1.0f, 0.5f, 1.0f / 6, 1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};

TPDRAFT_TARGET_AVX512 TPDRAFT_INLINE __m512 exp512(__m512 x) {
  // Constant first: min/max return the second operand when one is NaN, so NaN propagates.
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[7]);
  for (int i = 6; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  return _mm512_scalef_ps(p, n);  // p * 2^n, gradual underflow and overflow to inf handled
}

TPDRAFT_TARGET_AVX2 TPDRAFT_INLINE __m256 exp256(__m256 x) {
  // Clamped so that 2^n stays a normal float: below -87.3 the result is ~1e-38 instead of a
  // subnormal or zero, an absolute difference far below anything a softmax or SiLU can see.
  x = _mm256_max_ps(_mm256_set1_ps(-87.33f), _mm256_min_ps(_mm256_set1_ps(88.37f), x));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[7]);
  for (int i = 6; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

}  // namespace tpdraft::kernels::cpu
