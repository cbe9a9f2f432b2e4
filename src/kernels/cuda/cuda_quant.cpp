// The CUDA backend's quantized matrices: packing into the tiled layout at upload
// (kernels/qtile_layout.h) and the weight-only matmul's dispatch. Up to kQgemmTcMaxRows rows (a
// draft) run the tensor-core kernel, which streams the packed weights once; more rows (settle)
// dequantize the weights to bf16, a block of rows at a time, and multiply with cuBLAS, so that
// hundreds of rows do not re-read packed weights per 64. Kernels in cuda_qgemm.cu.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "cuda/runtime.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/qtile_layout.h"

namespace tpdraft::kernels::cuda {
namespace {

int bits_of(WeightFormat f) { return f == WeightFormat::Int4 ? 4 : 8; }

// Bytes of bf16 weights dequantized at a time on the cuBLAS path.
constexpr int64_t kDequantBytes = int64_t{64} << 20;

}  // namespace

// Ops::quantized_bytes has refused a dense format already.
size_t CudaOps::do_quantized_bytes(WeightFormat format, int64_t rows, int64_t cols, int64_t group) const {
  return static_cast<size_t>(qtile::layout(bits_of(format), rows, cols, group).total);
}

Matrix CudaOps::do_upload_quantized(const QuantizedRows& src, void* dst) {
  check_not_capturing("upload_quantized");
  const qtile::Layout l = qtile::layout(src.bits, src.rows, src.cols, src.group);
  std::vector<std::byte> host(static_cast<size_t>(l.total));
  qtile::pack(src, host.data());
  to_device(dst, host.data(), host.size());
  return quantized_matrix(src, dst);
}

void CudaOps::qmatmul(const Matrix& w, const float* x, int64_t m, float* y, const float* bias) {
  const qtile::Layout l = qtile::layout(bits_of(w.format), w.rows, w.cols, w.group);
  const QuantTiles t{l, w.data, reinterpret_cast<const float*>(static_cast<const std::byte*>(w.data) + l.scale_offset)};
  TPDRAFT_CHECK(l.tiles_n <= 0x7fffffff, "matmul: {} output rows exceed the cuda grid", l.rows);
  TPDRAFT_CHECK(l.cols_padded <= 0xffffffff, "matmul: {} inputs exceed the quantized kernel's 32-bit index", l.cols);
  DeviceGuard guard(device_);
  if (m <= kQgemmTcMaxRows) {
    // The kernel's occupancy for this bit width, row tiles and scale steps, asked once.
    const bool uniform = qtile::step_uniform(l.group, l.groups);
    int& blocks = qgemm_occupancy_[l.bits == 8 ? 1 : 0][(m - 1) / 16][uniform ? 1 : 0];
    if (blocks == 0) blocks = qgemm_tc_blocks_per_sm(l.bits, m, uniform);
    const QTcPlan plan = qtile::split_k(l.tiles_n, l.cols, static_cast<int64_t>(blocks) * sm_count_);
    float* partials = plan.splits > 1 ? parts_.as<float>(static_cast<size_t>(plan.splits * m * l.rows), stream_) : nullptr;
    launch_qgemm_tc(t, plan, x, m, y, bias, partials, stream_);
    return;
  }
  // Activations rounded to bf16 once (the same rounding the tensor-core kernel applies), then
  // each block of weight rows dequantized and multiplied straight into its columns of y.
  void* xa = act_.get(static_cast<size_t>(m * l.cols) * 2, stream_);
  launch_split_activations(x, m, l.cols, DType::BF16, 1, xa, stream_);
  const int64_t block_rows = std::min(l.rows, std::max<int64_t>(qtile::kTileN, kDequantBytes / (2 * l.cols)));
  void* wb = dequant_.get(static_cast<size_t>(block_rows * l.cols) * 2, stream_);
  for (int64_t n0 = 0; n0 < l.rows; n0 += block_rows) {
    const int64_t rows = std::min(block_rows, l.rows - n0);
    launch_qdequant(t, n0, rows, wb, stream_);
    gemm_bf16_into(wb, rows, l.cols, xa, m, y + n0, l.rows);
  }
  if (bias != nullptr) launch_sum_parts(y, 1, m, l.rows, bias, y, stream_);
}

}  // namespace tpdraft::kernels::cuda
