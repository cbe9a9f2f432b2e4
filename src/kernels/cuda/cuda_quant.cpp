// The CUDA backend's quantized matrices: packing into the tiled layout at upload
// (kernels/qtile_layout.h) and the matmul's dispatch. Weight-only (bf16 activations): up to
// kQgemmTcMaxRows rows (a draft) run the tensor-core kernel, which streams the packed weights
// once; more rows (settle) dequantize the weights to bf16, a block of rows at a time, and multiply
// with cuBLAS, so that hundreds of rows do not re-read packed weights per 64 (cuda_qgemm.cu).
// int8 activations (matrices uploaded with activation_bits 8): the rows quantized once, then the
// int8 tensor-core kernel for any number of rows, with one split-K plan whatever the rows, so a
// row's result is the same alone or in a batch (cuda_qgemm_a8.cu).
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "cuda/runtime.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/int8_activations.h"
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
  if (src.activation_bits == 8) {
    const int64_t kb = activation_block(src.group, src.cols);
    TPDRAFT_CHECK(qtile::a8_blocks_fit(kb, src.cols),
                  "int8 activations on cuda: a [{}, {}] matrix with a scale per {} inputs is quantized in blocks of "
                  "{} inputs, and the tensor-core kernel needs blocks of a multiple of 32 (or one per row)",
                  src.rows, src.cols, src.group, kb);
    TPDRAFT_CHECK(src.cols <= 0x7fffffff, "int8 activations on cuda: {} inputs exceed the kernel's 32-bit index",
                  src.cols);
  }
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
  if (w.activation_bits == 8) return qmatmul_a8(w, x, m, y, bias);
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

void CudaOps::qmatmul_a8(const Matrix& w, const float* x, int64_t m, float* y, const float* bias) {
  const qtile::Layout l = qtile::layout(bits_of(w.format), w.rows, w.cols, w.group);
  const QuantTiles t{l, w.data, reinterpret_cast<const float*>(static_cast<const std::byte*>(w.data) + l.scale_offset)};
  const int64_t kb = activation_block(l.group, l.cols), nb = (l.cols + kb - 1) / kb, rows = (m + 15) / 16 * 16;
  auto* xq = static_cast<int8_t*>(xq_.get(static_cast<size_t>(rows * qtile::a8_row_bytes(l.cols)), stream_));
  float* xs = xs_.as<float>(static_cast<size_t>(rows * nb), stream_);
  launch_quantize_a8(x, m, l.cols, kb, xq, xs, stream_);
  int& blocks = qgemm_a8_occupancy_[l.bits == 8 ? 1 : 0];
  if (blocks == 0) blocks = qgemm_a8_blocks_per_sm(l.bits);
  const QTcPlan plan = qtile::split_k(l.tiles_n, l.cols, static_cast<int64_t>(blocks) * sm_count_);
  const int64_t slice = std::min(m, kQgemmTcMaxRows);
  float* partials = plan.splits > 1 ? parts_.as<float>(static_cast<size_t>(plan.splits * slice * l.rows), stream_) : nullptr;
  launch_qgemm_a8(t, plan, kb, xq, xs, m, y, bias, partials, stream_);
}

}  // namespace tpdraft::kernels::cuda
