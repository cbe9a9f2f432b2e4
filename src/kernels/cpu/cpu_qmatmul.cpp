// Matmul with int8 / int4 weights. Activations are quantized per row to int8 in blocks of the
// weights' scale groups, so that a block's dot product is an exact int32 sum of int8 x int8 (or
// int4 x int8) products, scaled once by the weight row's group scale times the activation block's
// scale. The weights are repacked at load into groups of 16 interleaved rows: 64 bytes hold 4
// consecutive columns of each of the 16 rows, so one broadcast of 4 activation bytes feeds all 16
// rows and every 32-bit lane accumulates one row (no horizontal sums). Variants: portable C++,
// AVX2 (maddubs + madd, 8 rows at a time), AVX-VNNI (vpdpbusd on 256 bits, 8 rows), AVX-512 VNNI
// (vpdpbusd, 16 rows). The integer sums are exact and
// the float steps are the same operations in the same order, so every variant gives bit-identical
// results.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "core/checked.h"
#include "core/error.h"
#include "kernels/cpu/simd.h"
#include "kernels/int8_activations.h"

namespace tpdraft::kernels::cpu {

detail::QuantLayout detail::quant_layout(WeightFormat format, int64_t rows, int64_t cols,
                                         int64_t group) {
  TPDRAFT_CHECK(format == WeightFormat::Int8 || format == WeightFormat::Int4, "quantized layout of a {} matrix",
                weight_format_name(format));
  TPDRAFT_CHECK(rows > 0 && cols > 0 && group > 0 && cols % group == 0,
                "quantized matrix [{}, {}] with group {}: the group must divide the columns", rows, cols, group);
  QuantLayout l{format == WeightFormat::Int4 ? 4 : 8, rows, cols, group};
  l.kb = activation_block(group, cols);
  // int32 block sums stay exact: |sum| <= kb * 128 * 127 < 2^31.
  TPDRAFT_CHECK(l.kb <= 131000, "quantized matrix [{}, {}]: a block of {} columns could overflow its int32 sums",
                rows, cols, l.kb);
  l.nb = (cols + l.kb - 1) / l.kb;
  l.kp = (l.kb + 7) / 8 * 8;
  l.rgroups = (rows + kQuantRows - 1) / kQuantRows;
  l.block_bytes = l.kp * kQuantRows * l.bits / 8;
  l.scale_offset = checked_mul(l.nb, l.block_bytes, "quantized matrix [{}, {}] layout", rows, cols);
  const int64_t rg = checked_add(l.scale_offset, checked_mul(l.nb, kQuantRows * 4, "quantized scales"),
                                 "quantized matrix layout");
  l.rg_bytes = (rg + 63) / 64 * 64;
  l.total = checked_mul(l.rgroups, l.rg_bytes, "quantized matrix [{}, {}] layout", rows, cols);
  return l;
}

void detail::quantize_activations(const QuantLayout& l, const float* x, int64_t m, int8_t* xq,
                                  float* xs, int32_t* xsum) {
  const int64_t stride = l.nb * l.kp;
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * l.cols;
    int8_t* q = xq + i * stride;
    for (int64_t b = 0; b < l.nb; ++b) {
      const int64_t c0 = b * l.kb, c1 = std::min(l.cols, c0 + l.kb);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(row[c]));
      const float scale = amax / 127.0f;
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t sum = 0;
      int8_t* qb = q + b * l.kp;
      for (int64_t c = c0; c < c1; ++c) {
        const float v = std::nearbyint(row[c] * inv);
        const auto qv = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, v)));
        qb[c - c0] = qv;
        sum += qv;
      }
      std::fill(qb + (c1 - c0), qb + l.kp, int8_t{0});
      xs[i * l.nb + b] = scale;
      xsum[i * l.nb + b] = sum;
    }
  }
}

namespace {

using detail::kQuantRows;
using detail::QuantLayout;

// Bytes of one int8 chunk (4 columns) or int4 pair (8 columns) of a row group.
constexpr int64_t kChunkBytes = kQuantRows * 4;

// Packs one row group: for block b, int8 chunk c (4 columns) is kChunkBytes [row][4 columns] of
// q + 128; int4 pair p (8 columns) is kChunkBytes whose low nibbles hold columns p*8..p*8+3 and
// high nibbles p*8+4..p*8+7 of each row as q + 8. Both are unsigned, as vpdpbusd wants its first
// operand; the offset times the block's activation sum is taken off per block. Then nb x
// kQuantRows f32 scales.
void pack_group(const QuantLayout& l, const QuantizedRows& src, int64_t rg, std::byte* dst) {
  const int64_t gpr = l.cols / l.group;  // scales per source row
  std::memset(dst, 0, static_cast<size_t>(l.rg_bytes));
  auto* scales = reinterpret_cast<float*>(dst + l.scale_offset);
  for (int64_t r = 0; r < kQuantRows; ++r) {
    const int64_t row = rg * kQuantRows + r;
    for (int64_t b = 0; b < l.nb; ++b) {
      uint8_t* blk = reinterpret_cast<uint8_t*>(dst + b * l.block_bytes);
      const int64_t c0 = b * l.kb;
      // Padding rows and columns: zero weights (stored as the offset) and zero scales.
      scales[b * kQuantRows + r] = row < l.rows ? src.scales[row * gpr + c0 / l.group] : 0.0f;
      for (int64_t k = 0; k < l.kp; ++k) {
        const int64_t c = c0 + k;
        const int q = (row < l.rows && k < l.kb && c < l.cols) ? src.q[row * l.cols + c] : 0;
        if (l.bits == 8) {
          blk[(k / 4) * kChunkBytes + r * 4 + k % 4] = static_cast<uint8_t>(q + 128);
        } else {
          const int64_t pair = k / 8, within = k % 8;
          const auto nib = static_cast<uint8_t>(q + 8);
          uint8_t& byte = blk[pair * kChunkBytes + r * 4 + within % 4];
          byte = static_cast<uint8_t>(byte | (within < 4 ? nib : static_cast<uint8_t>(nib << 4)));
        }
      }
    }
  }
}

// ---- kernels: MR activation rows x one row group, all blocks; out[i * os + r] ---------------------

// Portable. The int32 sums are exact; the float steps match the SIMD variants (a product of the
// two scales, then one fused multiply-add per block).
void scalar_group(const QuantLayout& l, const std::byte* wg, const int8_t* xq, int64_t xstride, const float* xs,
                  int mr, float* out, int64_t os) {
  const auto* scales = reinterpret_cast<const float*>(wg + l.scale_offset);
  for (int i = 0; i < mr; ++i) {
    float acc[kQuantRows] = {};
    const int8_t* x = xq + i * xstride;
    for (int64_t b = 0; b < l.nb; ++b) {
      const auto* blk = reinterpret_cast<const uint8_t*>(wg + b * l.block_bytes);
      const int8_t* xb = x + b * l.kp;
      for (int r = 0; r < kQuantRows; ++r) {
        int32_t sum = 0;
        for (int64_t k = 0; k < l.kp; ++k) {
          int q;
          if (l.bits == 8) {
            q = blk[(k / 4) * kChunkBytes + r * 4 + k % 4] - 128;
          } else {
            const uint8_t byte = blk[(k / 8) * kChunkBytes + r * 4 + (k % 8) % 4];
            q = (k % 8 < 4 ? (byte & 0xf) : (byte >> 4)) - 8;
          }
          sum += q * xb[k];
        }
        const float s = scales[b * kQuantRows + r] * xs[i * l.nb + b];
        acc[r] = std::fma(static_cast<float>(sum), s, acc[r]);
      }
    }
    for (int r = 0; r < kQuantRows; ++r) out[i * os + r] = acc[r];
  }
}

TPDRAFT_TARGET_AVX2 TPDRAFT_INLINE __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// AVX2: each half of the row group (8 rows) in turn, 8 lanes = 8 rows.
template <int MR, int Bits>
TPDRAFT_TARGET_AVX2 void avx2_group(const QuantLayout& l, const std::byte* wg, const int8_t* xq, int64_t xstride,
                                    const float* xs, const int32_t* xsum, float* out, int64_t os) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low = _mm256_set1_epi8(0x0f);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int h = 0; h < 2; ++h) {
    const auto* scales = reinterpret_cast<const float*>(wg + l.scale_offset) + h * 8;
    __m256 facc[MR];
    for (int i = 0; i < MR; ++i) facc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < l.nb; ++b) {
      const int8_t* xr[MR];
      for (int i = 0; i < MR; ++i) xr[i] = xq + i * xstride + b * l.kp;
      __m256i acc[MR];
      for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_si256();
      const std::byte* blk = wg + b * l.block_bytes + h * 32;
      if constexpr (Bits == 8) {
        for (int64_t k = 0; k < l.kp; k += 4) {
          // Unsigned q + 128 against signed x would overflow maddubs' int16 pairs: back to signed
          // q, then |q| (unsigned) times x carrying q's sign (pairs within 2 * 128 * 127).
          const __m256i q = _mm256_xor_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (k / 4) * kChunkBytes)), flip);
          const __m256i aq = _mm256_abs_epi8(q);
          for (int i = 0; i < MR; ++i)
            acc[i] = _mm256_add_epi32(
                acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(bcast4(xr[i] + k), q)), ones));
        }
      } else {
        // Unsigned nibbles (q + 8) times signed x: each maddubs pair is at most 2 * 15 * 127 = 3810
        // in size, so the int16 lanes can sum 8 of them (4 steps of 8 columns, 30480 < 2^15)
        // before one madd widens them: a third fewer multiply-unit instructions per column.
        for (int64_t k0 = 0; k0 < l.kp; k0 += 32) {
          __m256i s16[MR];
          for (int i = 0; i < MR; ++i) s16[i] = _mm256_setzero_si256();
          const int64_t k1 = std::min<int64_t>(l.kp, k0 + 32);
          for (int64_t k = k0; k < k1; k += 8) {
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (k / 8) * kChunkBytes));
            const __m256i lo = _mm256_and_si256(w, low);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
            for (int i = 0; i < MR; ++i)
              s16[i] = _mm256_add_epi16(s16[i], _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xr[i] + k)),
                                                                 _mm256_maddubs_epi16(hi, bcast4(xr[i] + k + 4))));
          }
          for (int i = 0; i < MR; ++i) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(s16[i], ones));
        }
        for (int i = 0; i < MR; ++i) acc[i] = _mm256_sub_epi32(acc[i], _mm256_set1_epi32(8 * xsum[i * l.nb + b]));
      }
      const __m256 ws = _mm256_loadu_ps(scales + b * kQuantRows);
      for (int i = 0; i < MR; ++i)
        facc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i]), _mm256_mul_ps(ws, _mm256_set1_ps(xs[i * l.nb + b])),
                                  facc[i]);
    }
    for (int i = 0; i < MR; ++i) _mm256_storeu_ps(out + i * os + h * 8, facc[i]);
  }
}

TPDRAFT_TARGET_VNNI TPDRAFT_INLINE __m512i bcast4_512(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// AVX-512 VNNI: 16 lanes = the whole row group; one vpdpbusd per activation row and 4 columns
// (int8) or two per 8 columns (int4).
template <int MR, int Bits>
TPDRAFT_TARGET_VNNI void vnni_group(const QuantLayout& l, const std::byte* wg, const int8_t* xq, int64_t xstride,
                                    const float* xs, const int32_t* xsum, float* out, int64_t os) {
  const auto* scales = reinterpret_cast<const float*>(wg + l.scale_offset);
  const __m512i low = _mm512_set1_epi8(0x0f);
  __m512 facc[MR];
  for (int i = 0; i < MR; ++i) facc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < l.nb; ++b) {
    const int8_t* xr[MR];
    for (int i = 0; i < MR; ++i) xr[i] = xq + i * xstride + b * l.kp;
    __m512i acc[MR];
    for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_si512();
    const std::byte* blk = wg + b * l.block_bytes;
    if constexpr (Bits == 8) {
      for (int64_t k = 0; k < l.kp; k += 4) {
        const __m512i w = _mm512_loadu_si512(blk + (k / 4) * kChunkBytes);
        for (int i = 0; i < MR; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], w, bcast4_512(xr[i] + k));
      }
    } else {
      for (int64_t k = 0; k < l.kp; k += 8) {
        const __m512i w = _mm512_loadu_si512(blk + (k / 8) * kChunkBytes);
        const __m512i lo = _mm512_and_si512(w, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
        for (int i = 0; i < MR; ++i)
          acc[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[i], lo, bcast4_512(xr[i] + k)), hi,
                                       bcast4_512(xr[i] + k + 4));
      }
    }
    // The stored offset (128 or 8) times the block's activation sum comes off.
    constexpr int offset = Bits == 8 ? 128 : 8;
    const __m512 ws = _mm512_loadu_ps(scales + b * kQuantRows);
    for (int i = 0; i < MR; ++i) {
      const __m512i dot = _mm512_sub_epi32(acc[i], _mm512_set1_epi32(offset * xsum[i * l.nb + b]));
      facc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(ws, _mm512_set1_ps(xs[i * l.nb + b])), facc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(out + i * os, facc[i]);
}

// vpdpbusd on 256 bits: acc + the sums of 4 products of unsigned bytes of u and signed bytes of s.
TPDRAFT_TARGET_AVXVNNI TPDRAFT_INLINE __m256i dpbusd256(__m256i acc, __m256i u, __m256i s) {
  return _mm256_dpbusd_avx_epi32(acc, u, s);
}
// The same sums from AVX2 instructions, exactly: bytes widened to int16 (u zero-, s sign-extended),
// the even and the odd ones multiplied and paired by vpmaddwd (|u * s| <= 255 * 128 fits int16
// products' int32 pair sums).
TPDRAFT_TARGET_AVX2 TPDRAFT_INLINE __m256i dpbusd256_emulated(__m256i acc, __m256i u, __m256i s) {
  const __m256i even_mask = _mm256_set1_epi16(0x00ff);
  const __m256i u_even = _mm256_and_si256(u, even_mask), u_odd = _mm256_srli_epi16(u, 8);
  const __m256i s_even = _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8), s_odd = _mm256_srai_epi16(s, 8);
  return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(u_even, s_even), _mm256_madd_epi16(u_odd, s_odd)));
}

// AVX-VNNI: each half of the row group (8 rows) in turn, as AVX2; one vpdpbusd per activation row
// and 4 columns (int8) or two per 8 columns (int4), on the stored unsigned values, the offset
// times the block's activation sum taken off as AVX-512 VNNI does. Defined twice, with the
// instruction and with its emulation (a function may only use what its target attribute names).
#define TPDRAFT_DP256_GROUP(NAME, TARGET, DOT)                                                                 \
  template <int MR, int Bits>                                                                                  \
  TARGET void NAME(const QuantLayout& l, const std::byte* wg, const int8_t* xq, int64_t xstride, const float* xs, \
                   const int32_t* xsum, float* out, int64_t os) {                                              \
    const __m256i low = _mm256_set1_epi8(0x0f);                                                                \
    constexpr int offset = Bits == 8 ? 128 : 8;                                                                \
    for (int h = 0; h < 2; ++h) {                                                                              \
      const auto* scales = reinterpret_cast<const float*>(wg + l.scale_offset) + h * 8;                       \
      __m256 facc[MR];                                                                                         \
      for (int i = 0; i < MR; ++i) facc[i] = _mm256_setzero_ps();                                              \
      for (int64_t b = 0; b < l.nb; ++b) {                                                                     \
        const int8_t* xr[MR];                                                                                  \
        for (int i = 0; i < MR; ++i) xr[i] = xq + i * xstride + b * l.kp;                                      \
        __m256i acc[MR];                                                                                       \
        for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_si256();                                          \
        const std::byte* blk = wg + b * l.block_bytes + h * 32;                                                \
        if constexpr (Bits == 8) {                                                                             \
          for (int64_t k = 0; k < l.kp; k += 4) {                                                              \
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (k / 4) * kChunkBytes)); \
            for (int i = 0; i < MR; ++i) acc[i] = DOT(acc[i], w, bcast4(xr[i] + k));                          \
          }                                                                                                    \
        } else {                                                                                               \
          for (int64_t k = 0; k < l.kp; k += 8) {                                                              \
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (k / 8) * kChunkBytes)); \
            const __m256i lo = _mm256_and_si256(w, low);                                                       \
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);                                 \
            for (int i = 0; i < MR; ++i)                                                                       \
              acc[i] = DOT(DOT(acc[i], lo, bcast4(xr[i] + k)), hi, bcast4(xr[i] + k + 4));                     \
          }                                                                                                    \
        }                                                                                                      \
        const __m256 ws = _mm256_loadu_ps(scales + b * kQuantRows);                                            \
        for (int i = 0; i < MR; ++i) {                                                                         \
          const __m256i dot = _mm256_sub_epi32(acc[i], _mm256_set1_epi32(offset * xsum[i * l.nb + b]));        \
          facc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(ws, _mm256_set1_ps(xs[i * l.nb + b])), \
                                    facc[i]);                                                                  \
        }                                                                                                      \
      }                                                                                                        \
      for (int i = 0; i < MR; ++i) _mm256_storeu_ps(out + i * os + h * 8, facc[i]);                            \
    }                                                                                                          \
  }

TPDRAFT_DP256_GROUP(avxvnni_group, TPDRAFT_TARGET_AVXVNNI, dpbusd256)
TPDRAFT_DP256_GROUP(avxvnni_emulated_group, TPDRAFT_TARGET_AVX2, dpbusd256_emulated)
#undef TPDRAFT_DP256_GROUP

using GroupFn = void (*)(const QuantLayout&, const std::byte*, const int8_t*, int64_t, const float*, const int32_t*,
                         float*, int64_t);
// Activation rows per weight load. AVX2's 16 registers just hold 8 int32 sums beside the weights
// and constants (the f32 sums, touched once a block, may spill): 8 rows measured ~10% faster than
// 4 for int8 (bench/matmul_ab) and the same for int4. AVX-512 (with VL) has 32.
constexpr int kAvx2Mr = 8, kVnniMr = 8, kQuantMr = std::max(kAvx2Mr, kVnniMr);

// The kernels for 1..kQuantMr activation rows: tables[kernel - 1][int8] (int4 or int8).
template <int... I>
const GroupFn* group_table(QuantKernel kernel, bool int8, std::integer_sequence<int, I...>) {
  static constexpr GroupFn tables[4][2][sizeof...(I)] = {
      {{&avx2_group<I + 1, 4>...}, {&avx2_group<I + 1, 8>...}},
      {{&vnni_group<I + 1, 4>...}, {&vnni_group<I + 1, 8>...}},
      {{&avxvnni_group<I + 1, 4>...}, {&avxvnni_group<I + 1, 8>...}},
      {{&avxvnni_emulated_group<I + 1, 4>...}, {&avxvnni_emulated_group<I + 1, 8>...}}};
  return tables[static_cast<int>(kernel) - 1][int8];
}

struct QJob {
  QuantKernel kernel;
  QuantLayout l;
  const std::byte* w;
  const int8_t* xq;
  const float* xs;
  const int32_t* xsum;
  int64_t m, xstride;
  float* y;
  const float* bias;
};

// Output columns [8 * g0, 8 * g1) for every activation row; rows taken in blocks that stay in L2.
void qmatmul_groups(const QJob& job, int64_t g0, int64_t g1) {
  const QuantLayout& l = job.l;
  const int64_t n = l.rows;
  const GroupFn* table = nullptr;
  if (job.kernel != QuantKernel::Scalar)
    table = group_table(job.kernel, l.bits == 8, std::make_integer_sequence<int, kQuantMr>{});
  const int64_t tile = job.kernel == QuantKernel::Avx512Vnni ? kVnniMr : kAvx2Mr;
  const int64_t mc = std::max<int64_t>(tile, (256 * 1024) / std::max<int64_t>(1, job.xstride) / tile * tile);
  float tmp[kQuantMr * kQuantRows];
  for (int64_t mb = 0; mb < job.m; mb += mc) {
    const int64_t me = std::min(job.m, mb + mc);
    for (int64_t g = g0; g < g1; ++g) {
      const std::byte* wg = job.w + g * l.rg_bytes;
      const int64_t c0 = g * kQuantRows, nr = std::min<int64_t>(kQuantRows, n - c0);
      for (int64_t i0 = mb; i0 < me; i0 += tile) {
        const int mr = static_cast<int>(std::min<int64_t>(tile, me - i0));
        const int8_t* xq = job.xq + i0 * job.xstride;
        const float* xs = job.xs + i0 * l.nb;
        const int32_t* xsum = job.xsum + i0 * l.nb;
        if (table == nullptr) {
          scalar_group(l, wg, xq, job.xstride, xs, mr, tmp, kQuantRows);
        } else {
          table[mr - 1](l, wg, xq, job.xstride, xs, xsum, tmp, kQuantRows);
        }
        for (int i = 0; i < mr; ++i) {
          float* yrow = job.y + (i0 + i) * n + c0;
          for (int64_t r = 0; r < nr; ++r) yrow[r] = tmp[i * kQuantRows + r] + (job.bias ? job.bias[c0 + r] : 0.0f);
        }
      }
    }
  }
}

bool cpu_has_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  // VNNI on top of the AVX-512 level (whose probe ran __builtin_cpu_init), as its kernels use.
  static const bool vnni = detected_isa() >= Isa::Avx512 && __builtin_cpu_supports("avx512vnni");
  return vnni;
#else
  return false;
#endif
}

std::atomic<int> g_forced_kernel{-1};

}  // namespace

bool cpu_has_avx_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  // CPUID leaf 7, subleaf 1: EAX bit 4 (not every compiler's __builtin_cpu_supports knows it).
  static const bool avx_vnni = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return detected_isa() >= Isa::Avx2 && __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0 && (a & (1u << 4)) != 0;
  }();
  return avx_vnni;
#else
  return false;
#endif
}

QuantKernel quant_kernel(Isa isa) {
  if (isa >= Isa::Avx512 && cpu_has_vnni()) return QuantKernel::Avx512Vnni;
  if (isa >= Isa::Avx2 && cpu_has_avx_vnni()) return QuantKernel::AvxVnni;
  if (isa >= Isa::Avx2) return QuantKernel::Avx2;
  return QuantKernel::Scalar;
}

int force_quant_kernel(int k) {
  TPDRAFT_CHECK(k >= -1 && k <= static_cast<int>(QuantKernel::AvxVnniEmulated), "force_quant_kernel({})", k);
  return g_forced_kernel.exchange(k);
}

const char* quant_kernel_name(QuantKernel k) {
  static constexpr const char* kNames[] = {"scalar", "avx2", "avx512-vnni", "avx-vnni", "avx-vnni-emulated"};
  const auto i = static_cast<size_t>(k);
  return i < std::size(kNames) ? kNames[i] : "?";
}

size_t CpuOps::do_quantized_bytes(WeightFormat format, int64_t rows, int64_t cols, int64_t group) const {
  return static_cast<size_t>(detail::quant_layout(format, rows, cols, group).total);
}

Matrix CpuOps::do_upload_quantized(const QuantizedRows& src, void* dst) {
  check_not_capturing("upload_quantized");
  const Matrix packed = quantized_matrix(src, dst);
  const QuantLayout l = detail::quant_layout(packed.format, src.rows, src.cols, src.group);
  auto* out = static_cast<std::byte*>(dst);
  pool_.parallel_for(l.rgroups, [&](int64_t b, int64_t e, int) {
    for (int64_t g = b; g < e; ++g) pack_group(l, src, g, out + g * l.rg_bytes);
  });
  return packed;
}

void CpuOps::qmatmul(const Matrix& w, const float* x, int64_t m, float* y, const float* bias) {
  const QuantLayout l = detail::quant_layout(w.format, w.rows, w.cols, w.group);
  const int64_t xstride = l.nb * l.kp;
  int8_t* xq = qx_.get(static_cast<size_t>(m * xstride));
  float* xs = qscale_.get(static_cast<size_t>(m * l.nb));
  int32_t* xsum = qsum_.get(static_cast<size_t>(m * l.nb));
  const int forced = g_forced_kernel.load(std::memory_order_relaxed);
  const QuantKernel kernel = forced >= 0 ? static_cast<QuantKernel>(forced) : quant_kernel(active_isa());
  const QJob job{kernel, l, static_cast<const std::byte*>(w.data), xq, xs, xsum, m, xstride, y,
                 bias};
  pool_.parallel_for(
      m,
      [&](int64_t b, int64_t e, int) {
        detail::quantize_activations(l, x + b * l.cols, e - b, xq + b * xstride, xs + b * l.nb, xsum + b * l.nb);
      },
      16);
  pool_.parallel_for(l.rgroups, [&job](int64_t b, int64_t e, int) { qmatmul_groups(job, b, e); });
}

}  // namespace tpdraft::kernels::cpu
