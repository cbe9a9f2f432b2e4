// The CUDA backend's tiled layout of int8 / int4 weights (src/kernels/qtile_layout.h), checked
// without a GPU: the host packer's output is read back through the very index formulas the
// kernels use (the tensor-core kernel's fragment reads, the dequantizer's byte lookup, the warps'
// walk over K), and the tensor-core kernel's arithmetic is emulated lane by lane, its mma
// operands placed by the PTX ISA's fragment tables (written out here independently of the
// helpers), so that a wrong lane, byte, nibble, scale or padding shows up here rather than on a
// device. The bound the GPU test allows (tests/gpu/test_cuda_qmatmul.cpp) is checked against the
// emulation too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/int8_activations.h"
#include "kernels/kernel_cases.h"
#include "kernels/ops.h"
#include "kernels/qtile_layout.h"

namespace tpdraft::kernels {
namespace {

using namespace qtile;

struct Shape {
  int bits;
  int64_t n, k, group;
};

std::string name_of(const Shape& s) {
  return fmt::format("int{} n {} k {} group {}", s.bits, s.n, s.k, s.group);
}

// Random weights (q, scales) and their tiled layout.
struct Packed : QuantWeights {
  Layout l;
  std::vector<std::byte> bytes;
};

Packed make(const Shape& s, std::mt19937_64& rng) {
  Packed p{random_quant(s.bits, s.n, s.k, s.group, 0.001f, 0.05f, rng),
           layout(s.bits, s.n, s.k, s.group)};
  p.bytes.assign(static_cast<size_t>(p.l.total), std::byte{0x5a});  // garbage the packer must overwrite
  pack({s.bits, s.n, s.k, s.group, p.q.data(), p.scales.data()}, p.bytes.data());
  return p;
}

// The lane's 32-bit word j of tile (nt, kt), as the kernel's 16-byte load sees it (little endian).
uint32_t word_at(const Packed& p, int64_t nt, int64_t kt, int lane, int j) {
  uint32_t w = 0;
  std::memcpy(&w, p.bytes.data() + ((nt * p.l.tiles_k + kt) * 32 + lane) * kLaneBytes + 4 * j, 4);
  return w;
}

float scale_at(const Packed& p, int64_t g, int64_t n) {
  float s = 0;
  std::memcpy(&s, p.bytes.data() + p.l.scale_offset + (g * p.l.rows_padded + n) * 4, 4);
  return s;
}

int8_t source_q(const Packed& p, int64_t n, int64_t k) {
  return n < p.l.rows && k < p.l.cols ? p.q[static_cast<size_t>(n * p.l.cols + k)] : int8_t{0};
}

const Shape kShapes[] = {
    {8, 1, 16, 16},   {4, 1, 32, 32},    {8, 37, 200, 200}, {4, 37, 200, 200}, {8, 1000, 64, 32},
    {4, 1000, 64, 32}, {8, 40, 2048, 128}, {4, 40, 2048, 128}, {8, 13, 96, 32},  {4, 70, 33, 33},
    {8, 257, 33, 33},  {4, 24, 66, 33},    {8, 24, 66, 33},   {4, 9, 200, 8},    {8, 31, 40, 20},
    {4, 33, 264, 264},
};

TEST(QTileLayout, EveryWeightReadsBackThroughTheFragmentFormulas) {
  std::mt19937_64 rng(11);
  for (const Shape& s : kShapes) {
    const Packed p = make(s, rng);
    const Layout& l = p.l;
    ASSERT_EQ(l.rows_padded % kTileN, 0);
    ASSERT_EQ(l.cols_padded % tile_k(s.bits), 0);
    ASSERT_GE(l.rows_padded, s.n);
    ASSERT_LT(l.rows_padded - s.n, kTileN);
    ASSERT_LT(l.cols_padded - s.k, tile_k(s.bits));
    ASSERT_EQ(l.scale_offset % 256, 0);
    ASSERT_GE(l.scale_offset, l.tiles_n * l.tiles_k * kTileBytes);
    std::vector<int> seen(static_cast<size_t>(l.rows_padded * l.cols_padded), 0);
    size_t bad = 0;
    for (int64_t nt = 0; nt < l.tiles_n; ++nt)
      for (int64_t kt = 0; kt < l.tiles_k; ++kt)
        for (int lane = 0; lane < 32; ++lane)
          for (int j = 0; j < 4; ++j) {
            const uint32_t w = word_at(p, nt, kt, lane, j);
            for (int st = 0; st < tile_k(s.bits) / 16; ++st)
              for (int e = 0; e < 4; ++e) {
                const int64_t n = nt * kTileN + frag_n(lane, j);
                const int64_t k = kt * tile_k(s.bits) + 16 * st + frag_k(lane, e);
                ++seen[static_cast<size_t>(n * l.cols_padded + k)];
                const int got = q_of_word(s.bits, w, 4 * st + e);
                if (got != source_q(p, n, k) && bad++ < 5)
                  ADD_FAILURE() << name_of(s) << ": tile (" << nt << ", " << kt << ") lane " << lane << " word " << j
                                << " element " << 4 * st + e << " -> w[" << n << "][" << k << "] = " << got
                                << ", packed " << int{source_q(p, n, k)};
              }
          }
    EXPECT_EQ(bad, 0u) << name_of(s);
    for (size_t i = 0; i < seen.size(); ++i)
      ASSERT_EQ(seen[i], 1) << name_of(s) << ": padded weight " << i / l.cols_padded << ", " << i % l.cols_padded
                            << " read " << seen[i] << " times";
  }
}

TEST(QTileLayout, DequantizerLookupAndScales) {
  std::mt19937_64 rng(12);
  for (const Shape& s : kShapes) {
    const Packed p = make(s, rng);
    const auto* bytes = reinterpret_cast<const uint8_t*>(p.bytes.data());
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t k = 0; k < s.k; ++k) {
        int shift = -1;
        const int64_t at = weight_byte(s.bits, p.l.tiles_k, n, k, &shift);
        ASSERT_TRUE(at >= 0 && at < p.l.scale_offset) << name_of(s);
        ASSERT_EQ(q_of_word(s.bits, static_cast<uint32_t>(bytes[at]) >> shift, 0), source_q(p, n, k))
            << name_of(s) << " w[" << n << "][" << k << "]";
      }
    for (int64_t n = 0; n < p.l.rows_padded; ++n)
      for (int64_t g = 0; g < p.l.groups; ++g)
        ASSERT_EQ(scale_at(p, g, n), n < s.n ? p.scales[static_cast<size_t>(n * p.l.groups + g)] : 0.0f)
            << name_of(s) << " scale " << n << ", " << g;
    EXPECT_EQ(p.l.total, p.l.scale_offset + p.l.groups * p.l.rows_padded * 4);
    // One scale per output and k16 step where the kernel assumes it: the step's valid inputs
    // share the group of its first one.
    if (step_uniform(s.group, p.l.groups)) {
      for (int64_t k0 = 0; k0 < p.l.cols_padded; k0 += 16)
        for (int64_t k = k0; k < k0 + 16 && k < s.k; ++k)
          ASSERT_EQ(group_of(k, s.group, p.l.groups), group_of(k0, s.group, p.l.groups)) << name_of(s);
    }
  }
}

// The kernels' division by a multiply-high equals integer division: for every divisor up to
// 4096 and the group sizes checkpoints use, at small numerators, around each multiple of the
// divisor, near 2^32 and at random.
TEST(QTileLayout, DivisionByMultiplyHighIsExact) {
  std::mt19937_64 rng(7);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (uint32_t d : {5000u, 8191u, 12288u, 65536u, 1000003u, 0x7fffffffu, 0x80000000u, 0xffffffffu}) divisors.push_back(d);
  for (uint32_t d : divisors) {
    const DivBy v = div_by(d);
    auto check = [&](uint64_t n) {
      if (n > 0xffffffffu) return;
      const auto n32 = static_cast<uint32_t>(n);
      ASSERT_EQ(divide(n32, v), n32 / d) << n32 << " / " << d;
    };
    for (uint64_t n = 0; n < 300; ++n) check(n);
    for (uint64_t q = 1; q < 64; ++q)
      for (int64_t off : {-1, 0, 1}) check(q * d + static_cast<uint64_t>(off));
    for (uint64_t n = 0xffffffffu - 300; n <= 0xffffffffu; ++n) check(n);
    for (int i = 0; i < 300; ++i) check(static_cast<uint32_t>(rng()));
    const uint64_t top = 0xffffffffull / d * d;  // the last multiple, and its neighbours
    for (int64_t off : {-1, 0, 1}) check(top + static_cast<uint64_t>(off));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(QTileLayout, WarpsCoverEveryKTileOnce) {
  for (int bits : {4, 8})
    for (int64_t k : {16, 33, 64, 200, 256, 257, 2048, 4096, 12288, 12289})
      for (int64_t tiles_n : {1, 2, 32, 128, 384, 4748})
        for (int64_t resident : {1, 216, 264, 528}) {  // occupancy x SMs: 1, 2 x 108, 2 x 132, 4 x 132
          const int64_t tiles_k = (k + tile_k(bits) - 1) / tile_k(bits);
          const Split sp = split_k(tiles_n, k, resident);
          ASSERT_GE(sp.splits, 1);
          // One wave: no more blocks than the device holds, unless the columns alone exceed it;
          // and at least half the splits that fit (whole chunks per split round the rest away).
          if (sp.block_columns <= resident) {
            ASSERT_LE(sp.block_columns * sp.splits, resident) << "a tail wave: k " << k << " tiles_n " << tiles_n;
            ASSERT_GE(2 * sp.splits, std::min(resident / sp.block_columns, sp.chunks))
                << "too few splits: k " << k << " tiles_n " << tiles_n;
          } else {
            ASSERT_EQ(sp.splits, 1);
          }
          ASSERT_GE(sp.chunks_per_split * sp.chunks, 1);
          ASSERT_LT(static_cast<int64_t>(sp.splits - 1) * sp.chunks_per_split, sp.chunks) << "an empty split";
          // Block columns: warp w of block column b works on tile column b kColumns + w / kWarpsK.
          ASSERT_EQ(sp.block_columns, (tiles_n + kColumns - 1) / kColumns);
          std::vector<int> columns(static_cast<size_t>(sp.block_columns * kColumns), 0);
          for (int64_t b = 0; b < sp.block_columns; ++b)
            for (int warp = 0; warp < kWarps; warp += kWarpsK) ++columns[static_cast<size_t>(b * kColumns + warp / kWarpsK)];
          for (int64_t t = 0; t < tiles_n; ++t) ASSERT_EQ(columns[static_cast<size_t>(t)], 1) << "tile column " << t;
          std::vector<int> seen(static_cast<size_t>(tiles_k), 0);
          for (int split = 0; split < sp.splits; ++split) {
            const int64_t c0 = split * sp.chunks_per_split;
            const int64_t c1 = std::min(c0 + sp.chunks_per_split, sp.chunks);
            for (int64_t chunk = c0; chunk < c1; ++chunk)
              for (int kw = 0; kw < kWarpsK; ++kw)
                for (int u = 0; u < loads_per_warp(bits); ++u) {
                  const int64_t kt = chunk_tile(bits, chunk, kw, u);
                  // The tile's inputs lie in the chunk staged for it.
                  ASSERT_GE(kt * tile_k(bits), chunk * kChunk);
                  ASSERT_LE((kt + 1) * tile_k(bits), (chunk + 1) * kChunk);
                  if (kt < tiles_k) ++seen[static_cast<size_t>(kt)];
                }
          }
          for (int64_t kt = 0; kt < tiles_k; ++kt)
            ASSERT_EQ(seen[static_cast<size_t>(kt)], 1) << "bits " << bits << " k " << k << " tile " << kt;
        }
}

// bf16 round to nearest even of a finite f32, as __float2bfloat16_rn.
float bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// mma.m16n8k16 as the PTX ISA tables place it, independently of qtile's helpers: A element
// (row, col) is in lane 4 (row % 8) + (col % 8) / 2, register row / 8 + 2 (col / 8), half col % 2;
// B element (k, n) in lane 4 n + (k % 8) / 2, register k / 8, half k % 2; C (row, col) in lane
// 4 (row % 8) + col / 2, element 2 (row / 8) + col % 2. Halves are held as floats here.
void emulated_mma(const float (&a)[32][4][2], const float (&b)[32][2][2], double (&c)[32][4]) {
  for (int row = 0; row < 16; ++row)
    for (int col = 0; col < 8; ++col) {
      double sum = 0;
      for (int k = 0; k < 16; ++k)
        sum += static_cast<double>(a[4 * (row % 8) + (k % 8) / 2][row / 8 + 2 * (k / 8)][k % 2]) *
               b[4 * col + (k % 8) / 2][k / 8][k % 2];
      c[4 * (row % 8) + col / 2][2 * (row / 8) + col % 2] += sum;
    }
}

// The tensor-core kernel's arithmetic for all m rows, lane by lane through qtile's helpers.
std::vector<double> emulate_kernel(const Packed& p, const std::vector<float>& x, int64_t m) {
  const Layout& l = p.l;
  const int bits = l.bits;
  const bool uniform = step_uniform(l.group, l.groups);
  std::vector<double> y(static_cast<size_t>(m * l.rows), 0.0);
  const int64_t mts = (m + 15) / 16;
  for (int64_t nt = 0; nt < l.tiles_n; ++nt)
    for (int64_t mt = 0; mt < mts; ++mt) {
      double acc[4][32][4];
      std::memset(acc, 0, sizeof(acc));
      for (int64_t kt = 0; kt < l.tiles_k; ++kt)
        for (int st = 0; st < tile_k(bits) / 16; ++st) {
          const int64_t k0 = kt * tile_k(bits) + 16 * st;
          float a[32][4][2];
          for (int lane = 0; lane < 32; ++lane)
            for (int r = 0; r < 4; ++r)
              for (int h = 0; h < 2; ++h) {
                const int64_t row = mt * 16 + a_row(lane, r), k = k0 + a_col(lane, r) + h;
                a[lane][r][h] = row < m && k < l.cols ? bf16(x[static_cast<size_t>(row * l.cols + k)]) : 0.0f;
              }
          for (int j = 0; j < 4; ++j) {
            float b[32][2][2];
            for (int lane = 0; lane < 32; ++lane) {
              const int64_t n = nt * kTileN + frag_n(lane, j);
              const uint32_t w = word_at(p, nt, kt, lane, j);
              for (int e = 0; e < 4; ++e) {
                // The kernel's form of group_of: division by a multiply-high.
                const DivBy div = div_by(static_cast<uint32_t>(l.group));
                const int64_t g = uniform ? group_of(static_cast<uint32_t>(k0), div, l.groups)
                                          : group_of(static_cast<uint32_t>(k0 + frag_k(lane, e)), div, l.groups);
                const float qf = bit_cast<float>(magic_bits(bits, w, 4 * st + e));
                b[lane][e >> 1][e & 1] = bf16((qf - magic_offset(bits)) * scale_at(p, g, n));
              }
            }
            emulated_mma(a, b, acc[j]);
          }
        }
      for (int j = 0; j < 4; ++j)
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < 4; ++i) {
            const int64_t row = mt * 16 + c_row(lane, i), n = nt * kTileN + 8 * j + c_col(lane, i);
            if (row < m && n < l.rows) y[static_cast<size_t>(row * l.rows + n)] += acc[j][lane][i];
          }
    }
  return y;
}

TEST(QTileLayout, EmulatedTensorCoreKernelMatchesFloat64WithinTheBf16Bound) {
  std::mt19937_64 rng(13);
  for (const Shape& s : kShapes) {
    if (s.n * s.k > 100000) continue;  // the emulation is slow; the layout tests above cover the rest
    const Packed p = make(s, rng);
    for (int64_t m : {1, 7, 17}) {
      const std::vector<float> x = randn(static_cast<size_t>(m * s.k), rng);
      const std::vector<double> y = emulate_kernel(p, x, m);
      size_t bad = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t n = 0; n < s.n; ++n) {
          // Exact products of the bf16 operands, and the float64 product of the unrounded ones.
          double rounded = 0, exact = 0, mag = 0;
          for (int64_t k = 0; k < s.k; ++k) {
            const float w = static_cast<float>(p.q[static_cast<size_t>(n * s.k + k)]) *
                            p.scales[static_cast<size_t>(n * (s.k / s.group) + k / s.group)];
            const float xv = x[static_cast<size_t>(i * s.k + k)];
            rounded += static_cast<double>(bf16(w)) * bf16(xv);
            exact += static_cast<double>(w) * xv;
            mag += std::fabs(static_cast<double>(w) * xv);
          }
          const double got = y[static_cast<size_t>(i * s.n + n)];
          // The operands' roundings: |x^ w^ - x w| <= |x w| (2^-8 + 2^-18) (each within 2^-9).
          const double bound = mag * (std::ldexp(1.0, -8) + std::ldexp(1.0, -18));
          if ((std::fabs(got - rounded) > 1e-12 * (mag + 1) || std::fabs(got - exact) > bound) && bad++ < 5)
            ADD_FAILURE() << name_of(s) << " m " << m << ": y[" << i << "][" << n << "] = " << got << ", bf16 operands "
                          << rounded << ", float64 " << exact << " (bound " << bound << ")";
        }
      EXPECT_EQ(bad, 0u) << name_of(s) << " m " << m;
    }
  }
}

// The kernel's conversion of a packed element to float (magic_bits - magic_offset) is float(q)
// for every byte and nibble value, in every position of a word.
TEST(QTileLayout, MagicNumberConversionIsExact) {
  for (int bits : {8, 4})
    for (int idx = 0; idx < (bits == 8 ? 4 : 8); ++idx)
      for (uint32_t v = 0; v < (1u << bits); ++v) {
        const uint32_t word = (v << (bits * idx)) | (bits == 8 ? 0x5a5a5a5au & ~(0xffu << (8 * idx))
                                                                 : 0x9c3e71a5u & ~(0xfu << (4 * idx)));
        const float q = bit_cast<float>(magic_bits(bits, word, idx)) - magic_offset(bits);
        ASSERT_EQ(q, static_cast<float>(q_of_word(bits, word, idx))) << "bits " << bits << " idx " << idx << " v " << v;
        ASSERT_TRUE(bits == 8 ? (q >= -128 && q <= 127) : (q >= -8 && q <= 7));
      }
}

// ---- int8 activations (src/kernels/cuda/cuda_qgemm_a8.cu) --------------------------------------

// The stored order of an activation row is a permutation of each 16 inputs that puts input
// frag_k(lane, e) of a tile at the place the k32 B layout reads byte e of the lane from.
TEST(QTileLayout, A8OrderIsThePermutationTheTilesHold) {
  for (int64_t k0 : {0, 16, 4096}) {
    std::vector<int> hits(16, 0);
    for (int k = 0; k < 16; ++k) {
      const int64_t p = a8_pos(k0 + k);
      ASSERT_GE(p, k0);
      ASSERT_LT(p, k0 + 16);
      ++hits[static_cast<size_t>(p - k0)];
    }
    for (int h : hits) ASSERT_EQ(h, 1);
    for (int lane = 0; lane < 32; ++lane)
      for (int e = 0; e < 4; ++e) ASSERT_EQ(a8_pos(k0 + frag_k(lane, e)), k0 + 4 * (lane & 3) + e);
  }
}

// int4_s8_word gives byte e = the signed value of nibble 4 s + e, for every nibble in every place.
TEST(QTileLayout, Int4NibblesWidenToSignedBytes) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 4096; ++trial) {
    const uint32_t word = trial < 16 ? 0x11111111u * static_cast<uint32_t>(trial) : static_cast<uint32_t>(rng());
    for (int st = 0; st < 2; ++st) {
      const uint32_t b = int4_s8_word(word, st);
      for (int e = 0; e < 4; ++e)
        ASSERT_EQ(static_cast<int8_t>(static_cast<uint8_t>(b >> (8 * e))), q_of_word(4, word, 4 * st + e))
            << std::hex << word << " step " << st << " byte " << e;
    }
  }
}

// mma.m16n8k32 on int8 as the PTX ISA tables place it, independently of qtile's helpers: A
// element (row, col) is byte col % 4 of register row / 8 + 2 (col / 16) in lane
// 4 (row % 8) + (col % 16) / 4; B element (k, n) byte k % 4 of register k / 16 in lane
// 4 n + (k % 16) / 4; C (row, col) element 2 (row / 8) + col % 2 of lane 4 (row % 8) + col / 2.
int8_t byte_of(uint32_t r, int b) { return static_cast<int8_t>(static_cast<uint8_t>(r >> (8 * b))); }
void emulated_mma_s8(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], int64_t (&c)[32][4]) {
  for (int row = 0; row < 16; ++row)
    for (int col = 0; col < 8; ++col) {
      int64_t sum = 0;
      for (int k = 0; k < 32; ++k)
        sum += int64_t{byte_of(a[4 * (row % 8) + (k % 16) / 4][row / 8 + 2 * (k / 16)], k % 4)} *
               byte_of(b[4 * col + (k % 16) / 4][k / 16], k % 4);
      c[4 * (row % 8) + col / 2][2 * (row / 8) + col % 2] += sum;
    }
}

// The activations as the quantize kernel stores them: rows padded to 16, inputs in a8 order.
struct A8Rows {
  int64_t kb = 0, nb = 0, row_bytes = 0;
  std::vector<int8_t> q;   // [rows, row_bytes]
  std::vector<float> s;    // [rows, nb]
  std::vector<int8_t> logical;  // [m, k] in input order, for the reference
};
A8Rows quantize_a8(const std::vector<float>& x, int64_t m, int64_t k, int64_t group) {
  A8Rows a;
  a.kb = activation_block(group, k);
  a.nb = (k + a.kb - 1) / a.kb;
  a.row_bytes = a8_row_bytes(k);
  const int64_t rows = (m + 15) / 16 * 16;
  a.q.assign(static_cast<size_t>(rows * a.row_bytes), 0);
  a.s.assign(static_cast<size_t>(rows * a.nb), 0.0f);
  a.logical.assign(static_cast<size_t>(m * k), 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t b = 0; b < a.nb; ++b) {
      const int64_t c0 = b * a.kb, c1 = std::min(k, c0 + a.kb);
      float amax = 0;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[static_cast<size_t>(i * k + c)]));
      const float inv = amax > 0 ? 127.0f / amax : 0.0f;
      for (int64_t c = c0; c < c1; ++c) {
        const auto v = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, std::nearbyint(x[static_cast<size_t>(i * k + c)] * inv))));
        a.q[static_cast<size_t>(i * a.row_bytes + a8_pos(c))] = v;
        a.logical[static_cast<size_t>(i * k + c)] = v;
      }
      a.s[static_cast<size_t>(i * a.nb + b)] = amax / 127.0f;
    }
  return a;
}

// The int8-activation kernel's walk for one plan, lane by lane through qtile's helpers: every
// warp's steps (a8_step), their A and B registers, the emulated mma and the flushes where the
// warp's next step lies in another block. Returns the integer sums flushed, per row, output and
// block (what the kernel scales), and fails on a step taken twice or a flush over two blocks.
std::vector<int64_t> emulate_a8(const Packed& p, const A8Rows& a, int64_t m, const Split& sp) {
  const Layout& l = p.l;
  const int64_t steps = (l.tiles_k * tile_k(l.bits) + 31) / 32;
  std::vector<int64_t> sums(static_cast<size_t>(m * l.rows * a.nb), 0);
  std::vector<int> taken(static_cast<size_t>(steps * l.tiles_n), 0);
  const int64_t mts = (m + 15) / 16;
  for (int64_t nt = 0; nt < l.tiles_n; ++nt)
    for (int split = 0; split < sp.splits; ++split)
      for (int kw = 0; kw < kWarpsK; ++kw) {
        const int64_t c0 = split * sp.chunks_per_split, c1 = std::min(sp.chunks, c0 + sp.chunks_per_split);
        std::vector<int64_t> acc(static_cast<size_t>(mts * 4 * 32 * 4), 0);  // [mt][j][lane][i]
        for (int64_t chunk = c0; chunk < c1; ++chunk)
          for (int u = 0; u < 2; ++u) {
            const int64_t step = a8_step(chunk, kw, u);
            if (step >= steps) break;
            ++taken[static_cast<size_t>(nt * steps + step)];
            for (int64_t mt = 0; mt < mts; ++mt)
              for (int j = 0; j < 4; ++j) {
                uint32_t ar[32][4], br[32][2];
                for (int lane = 0; lane < 32; ++lane) {
                  for (int r = 0; r < 4; ++r) {
                    const int64_t at = (mt * 16 + s8_a_row(lane, r)) * a.row_bytes + 32 * step + s8_a_col(lane, r);
                    std::memcpy(&ar[lane][r], a.q.data() + at, 4);
                  }
                  for (int r = 0; r < 2; ++r) {
                    const int64_t kt = l.bits == 8 ? 2 * step + r : step;
                    const uint32_t w = kt < l.tiles_k ? word_at(p, nt, kt, lane, j) : 0u;
                    br[lane][r] = l.bits == 8 ? w : int4_s8_word(w, r);
                  }
                }
                int64_t c[32][4] = {};
                emulated_mma_s8(ar, br, c);
                for (int lane = 0; lane < 32; ++lane)
                  for (int i = 0; i < 4; ++i) acc[static_cast<size_t>(((mt * 4 + j) * 32 + lane) * 4 + i)] += c[lane][i];
              }
            const int64_t following = u == 0 ? step + 1 : a8_step(chunk + 1, kw, 0);
            const bool last = following >= steps || (u == 1 && chunk + 1 >= c1);
            const int64_t blk = 32 * step / a.kb;
            if (!last && 32 * following / a.kb == blk) continue;
            // The flushed sums must not include an earlier block's steps: every step since the
            // last flush lies in blk (consecutive steps of a warp, blocks in order).
            for (int64_t mt = 0; mt < mts; ++mt)
              for (int j = 0; j < 4; ++j)
                for (int lane = 0; lane < 32; ++lane)
                  for (int i = 0; i < 4; ++i) {
                    int64_t& v = acc[static_cast<size_t>(((mt * 4 + j) * 32 + lane) * 4 + i)];
                    const int64_t row = mt * 16 + c_row(lane, i), n = nt * kTileN + 8 * j + c_col(lane, i);
                    if (row < m && n < l.rows) sums[static_cast<size_t>((row * l.rows + n) * a.nb + blk)] += v;
                    else if (v != 0) ADD_FAILURE() << "padding row " << row << " or output " << n << " summed " << v;
                    v = 0;
                  }
          }
      }
  for (int64_t t = 0; t < steps * l.tiles_n; ++t)
    EXPECT_EQ(taken[static_cast<size_t>(t)], 1) << "k32 step " << t % steps << " of tile column " << t / steps;
  return sums;
}

// Every block's integer sum, from the tiles, the stored activations and the emulated mma, equals
// the sum over the block of source q times the activation's int8 value; so do the float results
// built from them the way the kernel scales (float(sum) * (weight scale * activation scale)).
TEST(QTileLayout, EmulatedInt8ActivationKernelSumsEveryBlockExactly) {
  std::mt19937_64 rng(17);
  int tried = 0;
  for (const Shape& s : kShapes) {
    const int64_t kb = activation_block(s.group, s.k);
    if (!a8_blocks_fit(kb, s.k) || s.n * s.k > 100000) continue;
    ++tried;
    const Packed p = make(s, rng);
    for (int64_t m : {1, 7, 17})
      for (int64_t resident : {1, 264}) {
        const std::vector<float> x = randn(static_cast<size_t>(m * s.k), rng);
        const A8Rows a = quantize_a8(x, m, s.k, s.group);
        const std::vector<int64_t> sums = emulate_a8(p, a, m, split_k(p.l.tiles_n, s.k, resident));
        size_t bad = 0;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t n = 0; n < s.n; ++n) {
            double y = 0, ref = 0, mag = 0;
            for (int64_t b = 0; b < a.nb; ++b) {
              int64_t want = 0;
              for (int64_t k = b * kb; k < std::min(s.k, (b + 1) * kb); ++k)
                want += int64_t{source_q(p, n, k)} * a.logical[static_cast<size_t>(i * s.k + k)];
              const int64_t got = sums[static_cast<size_t>((i * s.n + n) * a.nb + b)];
              if (got != want && bad++ < 5)
                ADD_FAILURE() << name_of(s) << " m " << m << ": row " << i << " output " << n << " block " << b
                              << " sums to " << got << ", want " << want;
              const float ws = p.scales[static_cast<size_t>(n * (s.k / s.group) + b * kb / s.group)];
              const float as = a.s[static_cast<size_t>(i * a.nb + b)];
              y += static_cast<double>(static_cast<float>(got)) * (ws * as);
              ref += static_cast<double>(want) * ws * as;
              mag += std::fabs(static_cast<double>(want) * ws * as);
            }
            EXPECT_NEAR(y, ref, 1e-6 * mag + 1e-30) << name_of(s) << " row " << i << " output " << n;
          }
        EXPECT_EQ(bad, 0u) << name_of(s) << " m " << m;
      }
  }
  EXPECT_GE(tried, 8) << "too few shapes suit the kernel";
}

// The shapes the kernel refuses: a k32 step would span two activation blocks.
TEST(QTileLayout, A8BlocksMustHoldWholeSteps) {
  EXPECT_TRUE(a8_blocks_fit(activation_block(128, 4096), 4096));
  EXPECT_TRUE(a8_blocks_fit(activation_block(32, 64), 64));
  EXPECT_TRUE(a8_blocks_fit(activation_block(200, 200), 200));   // one scale per row: one block
  EXPECT_TRUE(a8_blocks_fit(activation_block(1031, 1031), 1031));  // blocks of 128, the last short
  EXPECT_FALSE(a8_blocks_fit(activation_block(33, 66), 66));
  EXPECT_FALSE(a8_blocks_fit(activation_block(20, 40), 40));
  EXPECT_FALSE(a8_blocks_fit(activation_block(8, 200), 200));
}

TEST(QTileLayout, RefusesBadShapes) {
  EXPECT_ANY_THROW(layout(3, 4, 32, 32));
  EXPECT_ANY_THROW(layout(8, 0, 32, 32));
  EXPECT_ANY_THROW(layout(8, 4, 32, 24));
  EXPECT_NO_THROW(layout(4, 4, 33, 11));
}

}  // namespace
}  // namespace tpdraft::kernels
