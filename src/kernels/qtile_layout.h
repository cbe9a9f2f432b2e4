// The tiled layout the CUDA backend holds int8 / int4 weights in (docs/quantization.md, "The CUDA
// backend"). It lives outside src/kernels/cuda so that every build compiles the packing and the
// index formulas, and a CPU test reads every weight back through the formulas the kernels use.
//
// A matrix W [N, K] (N outputs, K inputs) is cut into tiles of 32 outputs x KT inputs (KT = 16
// for int8, 32 for int4), N and K padded up to whole tiles with zero weights. A tile is 512
// bytes: 16 per lane of a warp, so one 16-byte load per lane fetches a whole tile, coalesced, and
// the bytes a lane gets are exactly its B fragments of `mma.m16n8k16` (B = W^T, k16 x n8) for the
// tile's four n8 column groups: 32-bit word j of the lane holds n8 group j, output
// n = 8 j + lane / 4; element e (0..3) of a fragment is input k = frag_k(lane, e). int8: byte e
// of word j, as a two's complement q. int4: nibble 4 s + e of word j (s: the tile's first or
// second k16 step), as q + 8. Tiles are ordered output tile by output tile, K innermost, so a
// warp walking K reads consecutive 512-byte tiles.
//
// Scales follow the tiles at scale_offset: f32 [groups][N padded], so the 32 scales a tile's
// lanes need for one group are one contiguous 128-byte line. Padded outputs have scale 0.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define TPDRAFT_QTILE_HD __host__ __device__ __forceinline__
#else
#define TPDRAFT_QTILE_HD inline
#endif

namespace tpdraft::kernels {
struct QuantizedRows;
}

namespace tpdraft::kernels::qtile {

constexpr int kTileN = 32;       // outputs per tile (four n8 fragments)
constexpr int kLaneBytes = 16;   // one uint4 per lane and tile
constexpr int kTileBytes = 512;  // 32 lanes x 16 bytes

// Inputs per tile: 16 (int8, 4 bytes per fragment) or 32 (int4, two k16 steps in 2 bytes each).
TPDRAFT_QTILE_HD constexpr int tile_k(int bits) { return bits == 8 ? 16 : 32; }

// mma.m16n8k16 fragment coordinates (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .bf16),
// for lane = 4 * groupID + threadID_in_group.
// B (k16 x n8): element e of the lane's two registers (e = 0, 1 in the first, 2, 3 in the second).
TPDRAFT_QTILE_HD int frag_k(int lane, int e) { return 2 * (lane & 3) + (e & 1) + 8 * (e >> 1); }
// Output of n8 fragment j within a tile.
TPDRAFT_QTILE_HD int frag_n(int lane, int j) { return 8 * j + (lane >> 2); }
// A (m16 x k16): register r (0..3) holds row a_row, columns a_col and a_col + 1.
TPDRAFT_QTILE_HD int a_row(int lane, int r) { return (lane >> 2) + 8 * (r & 1); }
TPDRAFT_QTILE_HD int a_col(int lane, int r) { return 2 * (lane & 3) + 8 * (r >> 1); }
// C / D (m16 x n8, f32): element i (0..3) of the lane's accumulators.
TPDRAFT_QTILE_HD int c_row(int lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
TPDRAFT_QTILE_HD int c_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

// Element idx of a lane's 32-bit word: int8 idx 0..3 (byte idx), int4 idx 0..7 (nibble idx =
// 4 s + e). Returns q.
TPDRAFT_QTILE_HD int q_of_word(int bits, uint32_t word, int idx) {
  if (bits == 8) return static_cast<int>(static_cast<int8_t>(static_cast<uint8_t>(word >> (8 * idx))));
  return static_cast<int>((word >> (4 * idx)) & 0xfu) - 8;
}

// The same element as a float, without an int -> float conversion (a quarter-rate instruction on
// the SMs, which would bound the kernel below memory speed): its bits, made unsigned (int8: the
// sign bit flipped, q + 128; int4: stored as q + 8), go into the mantissa of 2^23, and
// magic_offset subtracts 2^23 plus that offset again. Both steps are exact: float(q) bit for bit.
TPDRAFT_QTILE_HD uint32_t magic_bits(int bits, uint32_t word, int idx) {
  if (bits == 8) return 0x4b000000u | (((word >> (8 * idx)) & 0xffu) ^ 0x80u);
  return 0x4b000000u | ((word >> (4 * idx)) & 0xfu);
}
TPDRAFT_QTILE_HD constexpr float magic_offset(int bits) { return bits == 8 ? 8388736.0f : 8388616.0f; }

// Byte offset of W[n][k] from the start of the tiles, and the bit shift of its value in that byte
// (int4: 0 for the low nibble, 4 for the high one). The inverse of the fragment formulas above:
// the packer writes through it and the bf16 dequantizer reads through it.
TPDRAFT_QTILE_HD int64_t weight_byte(int bits, int64_t tiles_k, int64_t n, int64_t k, int* shift) {
  const int64_t nt = n / kTileN, kt = k / tile_k(bits);
  const int nn = static_cast<int>(n % kTileN), kk = static_cast<int>(k % tile_k(bits));
  const int j = nn >> 3, s = kk >> 4, k16 = kk & 15;
  const int lane = 4 * (nn & 7) + ((k16 & 7) >> 1);  // frag_n / frag_k inverted
  const int e = (k16 & 1) | ((k16 >> 3) << 1);
  const int64_t word = ((nt * tiles_k + kt) * 32 + lane) * kLaneBytes + 4 * j;
  if (bits == 8) {
    *shift = 0;
    return word + e;
  }
  const int p = 4 * s + e;
  *shift = 4 * (p & 1);
  return word + (p >> 1);
}

// The scale group of input k; inputs in the padding past K take the last group (their weights are
// zero, so any finite scale does).
TPDRAFT_QTILE_HD int64_t group_of(int64_t k, int64_t group, int64_t groups) {
  const int64_t g = k / group;
  return g < groups ? g : groups - 1;
}

// Division by a divisor fixed before the launch, without a divide instruction (the round-up
// multiplier of Granlund and Montgomery): n / d == (n + hi32(n * mul)) >> shift for every 32-bit n.
struct DivBy {
  uint32_t mul = 1;
  int shift = 0;
};
inline DivBy div_by(uint32_t d) {  // d >= 1
  DivBy v;
  while ((uint64_t{1} << v.shift) < d) ++v.shift;
  v.mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << v.shift) - d)) / d + 1);
  return v;
}
TPDRAFT_QTILE_HD uint32_t divide(uint32_t n, DivBy v) {
  const uint64_t hi = (static_cast<uint64_t>(n) * v.mul) >> 32;
  return static_cast<uint32_t>((hi + n) >> v.shift);
}
// group_of with the group's divider (the kernels' form): k < 2^32.
TPDRAFT_QTILE_HD int64_t group_of(uint32_t k, DivBy group, int64_t groups) {
  const int64_t g = divide(k, group);
  return g < groups ? g : groups - 1;
}

// Whether every k16 step of the tiles lies in one scale group (one scale per output and step).
TPDRAFT_QTILE_HD bool step_uniform(int64_t group, int64_t groups) { return groups == 1 || group % 16 == 0; }

// How the tensor-core kernel divides the work (src/kernels/cuda/cuda_qgemm.cu). A block owns
// kColumns tile columns (128 outputs, so each staged activation serves 128 outputs) and a range
// of K chunks of kChunk inputs, staged in shared memory one at a time. Its kWarps warps are
// kColumns x kWarpsK: warp w works on tile column w / kWarpsK of the block and takes, of each
// chunk, the K tiles kw, kw + kWarpsK, ... (kw = w % kWarpsK; its u-th is chunk_tile(...); tiles
// at or past tiles_k, in the last chunk, are skipped). `splits` blocks per block column cover K
// (split-K), chunks_per_split chunks each.
constexpr int kWarps = 8;
constexpr int kColumns = 4;
constexpr int kWarpsK = kWarps / kColumns;
constexpr int kChunk = 128;
TPDRAFT_QTILE_HD constexpr int tiles_per_chunk(int bits) { return kChunk / tile_k(bits); }
TPDRAFT_QTILE_HD constexpr int loads_per_warp(int bits) { return tiles_per_chunk(bits) / kWarpsK; }
TPDRAFT_QTILE_HD int64_t chunk_tile(int bits, int64_t chunk, int kw, int u) {
  return chunk * tiles_per_chunk(bits) + kw + kWarpsK * u;
}
static_assert(kWarps % kColumns == 0, "every tile column of a block has the same warps");
static_assert(kChunk % (kWarpsK * 32) == 0, "every warp takes whole tiles of a chunk, int4 and int8");

struct Split {
  int64_t chunks = 0, chunks_per_split = 0;
  int64_t block_columns = 0;  // blocks along N: tiles_n / kColumns, rounded up
  int splits = 1;
};
// Split-K for `tiles_n` tile columns of K inputs on a device that holds `resident` blocks at
// once (the occupancy API's blocks per SM x SMs): as many splits as fill that one wave, so every
// block streams weights from the start and none waits for a second wave; no empty split.
inline Split split_k(int64_t tiles_n, int64_t k, int64_t resident) {
  Split p;
  p.block_columns = (tiles_n + kColumns - 1) / kColumns;
  p.chunks = (k + kChunk - 1) / kChunk;
  int64_t want = (resident > 0 ? resident : 1) / p.block_columns;
  want = want < 1 ? 1 : (want > p.chunks ? p.chunks : want);
  p.chunks_per_split = (p.chunks + want - 1) / want;
  p.splits = static_cast<int>((p.chunks + p.chunks_per_split - 1) / p.chunks_per_split);
  return p;
}

// ---- int8 activations (W8A8 / W4A8: src/kernels/cuda/cuda_qgemm_a8.cu) ----------------------
// The same tiles feed mma.m16n8k32 with .s8 operands. A k32 step multiplies 32 inputs: int8 tiles
// 2p and 2p + 1 (B register 0 holds the lane's word j of the first, register 1 of the second), or
// one int4 tile (its k16 steps 0 and 1, widened by int4_s8_word). The k32 B layout puts input
// 4 (lane % 4) + e of a k16 half in byte e, while a tile holds input frag_k(lane, e) there; a dot
// product does not depend on the order of its terms, so the activations are stored in the tiles'
// order instead: each 16 inputs of a quantized activation row permuted, input k at a8_pos(k).
TPDRAFT_QTILE_HD int64_t a8_pos(int64_t k) {
  const int k16 = static_cast<int>(k & 15);
  return (k & ~int64_t{15}) + 4 * ((k16 & 7) >> 1) + ((k16 & 1) | ((k16 >> 3) << 1));
}
// A (m16 x k32, .s8): register r of a lane holds row s8_a_row(lane, r) and the 4 stored inputs
// from s8_a_col(lane, r) of the step (bytes 0..3). B (k32 x n8): register r, byte e is input
// 16 r + 4 (lane % 4) + e of column lane / 4. C (m16 x n8, s32): as c_row / c_col.
TPDRAFT_QTILE_HD int s8_a_row(int lane, int r) { return (lane >> 2) + 8 * (r & 1); }
TPDRAFT_QTILE_HD int s8_a_col(int lane, int r) { return 4 * (lane & 3) + 16 * (r >> 1); }
// B register of k16 step s of an int4 tile's word: nibble 4 s + e (q + 8) into byte e as the
// signed byte q. The nibbles are spread one per byte, then q's 4-bit two's complement (the
// nibble with bit 3 flipped) is sign-extended: 0xf0 where that bit is set.
TPDRAFT_QTILE_HD uint32_t int4_s8_word(uint32_t word, int s) {
  uint32_t x = (word >> (16 * s)) & 0xffffu;
  x = (x | (x << 8)) & 0x00ff00ffu;
  x = (x | (x << 4)) & 0x0f0f0f0fu;
  return (x ^ 0x08080808u) | ((~x & 0x08080808u) * 0x1eu);
}
// The k32 steps: kA8Steps per chunk of kChunk inputs; warp kw takes steps 2 kw and 2 kw + 1 of
// each (a warp's steps are consecutive, so an activation block of 64 inputs is one warp's). Step t covers
// inputs [32 t, 32 t + 32): int8 tiles 2 t and 2 t + 1, int4 tile t.
constexpr int kA8Steps = kChunk / 32;
TPDRAFT_QTILE_HD int64_t a8_step(int64_t chunk, int kw, int u) { return chunk * kA8Steps + 2 * kw + u; }
// Whether activation blocks of kb inputs (kernels/int8_activations.h) in rows of `cols` suit the
// kernel: every k32 step inside one block (kb a multiple of 32, or one block per row).
TPDRAFT_QTILE_HD bool a8_blocks_fit(int64_t kb, int64_t cols) { return kb % 32 == 0 || kb >= cols; }
// Bytes per quantized activation row: cols rounded up to whole k32 steps.
TPDRAFT_QTILE_HD int64_t a8_row_bytes(int64_t cols) { return (cols + 31) / 32 * 32; }
static_assert(kA8Steps == 2 * kWarpsK, "two k32 steps per warp and chunk");

struct Layout {
  int bits = 8;
  int64_t rows = 0, cols = 0, group = 0;  // N, K and the scale group of the source
  int64_t rows_padded = 0, cols_padded = 0, tiles_n = 0, tiles_k = 0, groups = 0;
  int64_t scale_offset = 0, total = 0;  // bytes
};

// The layout of a [rows, cols] matrix of `bits` bits with a scale per `group` columns. Throws
// tpdraft::Error unless bits is 4 or 8, the shape positive and group divides cols.
Layout layout(int bits, int64_t rows, int64_t cols, int64_t group);

// Writes `src` into `dst` (layout(...).total bytes, host memory) in the tiled layout.
void pack(const QuantizedRows& src, std::byte* dst);

}  // namespace tpdraft::kernels::qtile
