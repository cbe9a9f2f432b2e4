// RMSNorm over rows (alone, or after a residual add as one op), and the per-head RMSNorm + NeoX
// rotate-half RoPE applied to q and k (one op too). The bodies are plain loops over 16 fixed
// partial sums, compiled once per instruction set: every variant performs the same f32 operations
// in the same order (where the compiler contracts a multiply and an add into an FMA, results
// differ by f32 rounding).
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace tpdraft::kernels::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 16;  // elements; below this one thread is faster

TPDRAFT_INLINE float inv_rms(const float* x, int64_t n, float eps) {
  float lanes[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 16 <= n; c += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += x[c + l] * x[c + l];
  for (int l = 0; c + l < n; ++l) lanes[l] += x[c + l] * x[c + l];
  for (int half = 8; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  return 1.0f / std::sqrt(lanes[0] / static_cast<float>(n) + eps);
}

// y = w * (h * r), the order of PyTorch's Qwen RMSNorm (normalise, then weight), after h += add
// where add is not null (a residual add fused with the norm after it: the same f32 sums).
TPDRAFT_INLINE void rms_rows_body(float* h, const float* add, const float* w, float* y, int64_t rows, int64_t n,
                                  float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* hr = h + r * n;
    float* yr = y + r * n;
    if (add != nullptr)
      for (int64_t c = 0; c < n; ++c) hr[c] += add[r * n + c];
    const float s = inv_rms(hr, n, eps);
    for (int64_t c = 0; c < n; ++c) yr[c] = w[c] * (hr[c] * s);
  }
}

// One row of [heads, D]: RMSNorm each head with w[D], then rotate pairs (i, i + D/2) by the
// angles whose cos/sin are in cs[0 .. D/2) and cs[D/2 .. D).
TPDRAFT_INLINE void norm_rope_row_body(float* x, const float* w, int64_t heads, int64_t d, float eps, const float* cs) {
  const int64_t half = d / 2;
  const float* cosv = cs;
  const float* sinv = cs + half;
  for (int64_t h = 0; h < heads; ++h) {
    float* xh = x + h * d;
    rms_rows_body(xh, nullptr, w, xh, 1, d, eps);
    for (int64_t i = 0; i < half; ++i) {
      const float a = xh[i], b = xh[i + half];
      xh[i] = a * cosv[i] - b * sinv[i];
      xh[i + half] = b * cosv[i] + a * sinv[i];
    }
  }
}

}  // namespace

void CpuOps::do_add_rms_norm(float* h, const float* x, const float* w, float* y, int64_t rows, int64_t n,
                             float eps) {
  if (recording(&CpuOps::do_add_rms_norm, h, x, w, y, rows, n, eps)) return;
  const Isa isa = active_isa();
  if (rows * n < kParallelMin) return on_isa<rms_rows_body>(isa, h, x, w, y, rows, n, eps);
  pool_.parallel_for(rows, [&](int64_t b, int64_t e, int) {
    on_isa<rms_rows_body>(isa, h + b * n, x != nullptr ? x + b * n : nullptr, w, y + b * n, e - b, n, eps);
  });
}

void CpuOps::do_head_norm_rope(float* x, const float* w, int64_t rows, int64_t heads, int64_t head_dim, float eps,
                               const int64_t* positions, double theta) {
  if (recording(&CpuOps::do_head_norm_rope, x, w, rows, heads, head_dim, eps, positions, theta)) return;
  const int64_t half = head_dim / 2;
  if (rope_theta_ != theta || static_cast<int64_t>(rope_inv_freq_.size()) != half) {
    rope_inv_freq_.resize(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
      rope_inv_freq_[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    rope_theta_ = theta;
  }
  const Isa isa = active_isa();
  auto body = [&](int64_t b, int64_t e, int worker) {
    float* cs = workers_[worker].buf.get(static_cast<size_t>(head_dim));
    for (int64_t r = b; r < e; ++r) {
      const double pos = static_cast<double>(positions[r]);
      for (int64_t i = 0; i < half; ++i) {
        const double angle = pos * rope_inv_freq_[i];
        cs[i] = static_cast<float>(std::cos(angle));
        cs[half + i] = static_cast<float>(std::sin(angle));
      }
      on_isa<norm_rope_row_body>(isa, x + r * heads * head_dim, w, heads, head_dim, eps, cs);
    }
  };
  if (rows * heads * head_dim < kParallelMin) return body(0, rows, 0);
  pool_.parallel_for(rows, body);
}

}  // namespace tpdraft::kernels::cpu
