// The CUDA backend's quantized matrices: the device layout (quant_device_layout), packing at load
// and the weight-only matmul's host side. The kernel is in cuda_qgemm.cu.
#include <cstring>
#include <vector>

#include "core/checked.h"
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops_impl.h"
#include "kernels/cuda/runtime.h"

namespace tpdraft::kernels::cuda {

QuantDeviceLayout quant_device_layout(int bits, int64_t rows, int64_t cols, int64_t group) {
  TPDRAFT_CHECK((bits == 4 || bits == 8) && rows > 0 && cols > 0 && group > 0 && cols % group == 0,
                "cuda backend: quantized matrix [{}, {}], {} bits, group {}: bits 4 or 8, a group dividing the "
                "columns", rows, cols, bits, group);
  QuantDeviceLayout l;
  l.row_bytes = bits == 8 ? cols : (cols + 1) / 2;
  const int64_t q_bytes = checked_mul(rows, l.row_bytes, "cuda quantized matrix [{}, {}]", rows, cols);
  l.scale_offset = (q_bytes + 255) / 256 * 256;
  const int64_t scales = checked_mul(rows, cols / group, "cuda quantized scales");
  l.total = checked_add(l.scale_offset, checked_mul(scales, 4, "cuda quantized scales"), "cuda quantized matrix");
  return l;
}

size_t CudaOps::quantized_bytes(WeightFormat format, int64_t rows, int64_t cols, int64_t group) const {
  TPDRAFT_CHECK(format == WeightFormat::Int8 || format == WeightFormat::Int4, "cuda backend: {} is not quantized",
                weight_format_name(format));
  return static_cast<size_t>(quant_device_layout(format == WeightFormat::Int4 ? 4 : 8, rows, cols, group).total);
}

Matrix CudaOps::upload_quantized(const QuantizedRows& src, void* dst) {
  check_not_capturing("upload_quantized");
  const QuantDeviceLayout l = quant_device_layout(src.bits, src.rows, src.cols, src.group);
  std::vector<std::byte> host(static_cast<size_t>(l.total), std::byte{0});
  auto* q = reinterpret_cast<uint8_t*>(host.data());
  for (int64_t r = 0; r < src.rows; ++r)
    for (int64_t c = 0; c < src.cols; ++c) {
      const int v = src.q[r * src.cols + c];
      if (src.bits == 8) {
        q[r * l.row_bytes + c] = static_cast<uint8_t>(static_cast<int8_t>(v));
      } else {
        uint8_t& byte = q[r * l.row_bytes + c / 2];
        byte = static_cast<uint8_t>(byte | ((c & 1) ? (v + 8) << 4 : (v + 8)));
      }
    }
  std::memcpy(host.data() + l.scale_offset, src.scales,
              static_cast<size_t>(src.rows * (src.cols / src.group)) * sizeof(float));
  to_device(dst, host.data(), host.size());
  Matrix m;
  m.format = src.bits == 4 ? WeightFormat::Int4 : WeightFormat::Int8;
  m.rows = src.rows;
  m.cols = src.cols;
  m.group = src.group;
  m.data = dst;
  return m;
}

void CudaOps::qmatmul(const Matrix& w, const float* x, int64_t m, float* y, const float* bias) {
  const int bits = w.format == WeightFormat::Int4 ? 4 : 8;
  const QuantDeviceLayout l = quant_device_layout(bits, w.rows, w.cols, w.group);
  QuantDeviceMatrix d;
  d.bits = bits;
  d.rows = w.rows;
  d.cols = w.cols;
  d.group = w.group;
  d.row_bytes = l.row_bytes;
  d.q = w.data;
  d.scales = reinterpret_cast<const float*>(static_cast<const std::byte*>(w.data) + l.scale_offset);
  DeviceGuard guard(device_);
  launch_qgemm(d, x, m, y, bias, stream_);
}

}  // namespace tpdraft::kernels::cuda
