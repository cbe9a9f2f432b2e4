// Packing into the CUDA backend's tiled layout of quantized weights (qtile_layout.h). Host code
// in every build: the CUDA backend uploads what it writes, the CPU tests check it.
#include "kernels/qtile_layout.h"

#include <cstring>

#include "core/checked.h"
#include "core/error.h"
#include "kernels/ops.h"

namespace tpdraft::kernels::qtile {

Layout layout(int bits, int64_t rows, int64_t cols, int64_t group) {
  TPDRAFT_CHECK((bits == 4 || bits == 8) && rows > 0 && cols > 0 && group > 0 && cols % group == 0,
                "quantized matrix [{}, {}], {} bits, group {}: bits 4 or 8, a group dividing the columns", rows,
                cols, bits, group);
  Layout l{bits, rows, cols, group};
  l.tiles_n = (rows + kTileN - 1) / kTileN;
  l.tiles_k = (cols + tile_k(bits) - 1) / tile_k(bits);
  l.rows_padded = checked_mul(l.tiles_n, int64_t{kTileN}, "quantized matrix [{}, {}]", rows, cols);
  l.cols_padded = l.tiles_k * tile_k(bits);
  l.groups = cols / group;
  const int64_t tiles = checked_mul(l.tiles_n, l.tiles_k, "quantized matrix [{}, {}]", rows, cols);
  const int64_t q_bytes = checked_mul(tiles, int64_t{kTileBytes}, "quantized matrix [{}, {}]", rows, cols);
  l.scale_offset = (q_bytes + 255) / 256 * 256;
  const int64_t scales = checked_mul(l.groups, l.rows_padded, "quantized scales [{}, {}]", l.groups, l.rows_padded);
  l.total = checked_add(l.scale_offset, checked_mul(scales, int64_t{4}, "quantized scales"), "quantized matrix");
  return l;
}

void pack(const QuantizedRows& src, std::byte* dst) {
  const Layout l = layout(src.bits, src.rows, src.cols, src.group);
  // Padding must decode to q = 0: a zero byte for int8, nibbles of 8 (q + 8) for int4.
  std::memset(dst, src.bits == 8 ? 0 : 0x88, static_cast<size_t>(l.scale_offset));
  auto* q = reinterpret_cast<uint8_t*>(dst);
  for (int64_t n = 0; n < src.rows; ++n)
    for (int64_t k = 0; k < src.cols; ++k) {
      const int v = src.q[n * src.cols + k];
      int shift = 0;
      uint8_t& byte = q[weight_byte(src.bits, l.tiles_k, n, k, &shift)];
      if (src.bits == 8)
        byte = static_cast<uint8_t>(static_cast<int8_t>(v));
      else
        byte = static_cast<uint8_t>((byte & ~(0xf << shift)) | ((v + 8) << shift));
    }
  auto* scales = reinterpret_cast<float*>(dst + l.scale_offset);
  std::memset(scales, 0, static_cast<size_t>(l.groups * l.rows_padded) * sizeof(float));
  for (int64_t n = 0; n < src.rows; ++n)
    for (int64_t g = 0; g < l.groups; ++g) scales[g * l.rows_padded + n] = src.scales[n * l.groups + g];
}

}  // namespace tpdraft::kernels::qtile
