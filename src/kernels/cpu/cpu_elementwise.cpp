// Elementwise ops (silu_mul, gather_rows, store_rows) and the softmax's exp sum (the vector exp is
// simd.h's). These are memory bound and small (a draft's silu_mul is 16 x 6144 floats), so threads
// are used only for large n; the exp is vectorised because expf per element would cost more than
// the matmul it follows.

#include <cmath>
#include <cstring>

#include "kernels/cpu/simd.h"

namespace tpdraft::kernels::cpu {
namespace {

// Work below this many elements stays on the calling thread: waking a worker costs more.
constexpr int64_t kParallelMin = 1 << 17;

TPDRAFT_TARGET_AVX512 float exp_sum512(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(n - i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s));
    _mm512_mask_storeu_ps(x + i, m, e);
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, e));
  }
  return _mm512_reduce_add_ps(acc);
}

TPDRAFT_TARGET_AVX2 float exp_sum256(float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  if (i < n) {  // tail through a padded buffer; the padding's results are dropped
    float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm256_storeu_ps(buf, exp256(_mm256_sub_ps(_mm256_loadu_ps(buf), s)));
    std::memcpy(x + i, buf, static_cast<size_t>(n - i) * sizeof(float));
    for (int64_t l = 0; l < n - i; ++l) lanes[l] += buf[l];
  }
  float sum = 0.0f;
  for (float v : lanes) sum += v;
  return sum;
}

TPDRAFT_TARGET_AVX512 void silu_mul512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

TPDRAFT_TARGET_AVX2 void silu_mul256(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    float g[8] = {0, 0, 0, 0, 0, 0, 0, 0}, u[8] = {0, 0, 0, 0, 0, 0, 0, 0}, o[8];
    std::memcpy(g, gate + i, static_cast<size_t>(n - i) * sizeof(float));
    std::memcpy(u, up + i, static_cast<size_t>(n - i) * sizeof(float));
    silu_mul256(g, u, o, 8);
    std::memcpy(out + i, o, static_cast<size_t>(n - i) * sizeof(float));
  }
}

void silu_mul_scalar(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace

float detail::exp_shifted_sum(Isa isa, float* x, int64_t n, float shift) {
  if (n <= 0) return 0.0f;
  if (isa >= Isa::Avx512) return exp_sum512(x, n, shift);
  if (isa == Isa::Avx2) return exp_sum256(x, n, shift);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

void CpuOps::do_silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  if (recording(&CpuOps::do_silu_mul, gate, up, out, n)) return;
  const Isa isa = active_isa();
  const auto kernel =
      isa >= Isa::Avx512 ? silu_mul512 : isa == Isa::Avx2 ? silu_mul256 : silu_mul_scalar;
  if (n < kParallelMin) return kernel(gate, up, out, n);
  // Chunks in multiples of 64 elements keep every thread's slice vector aligned in length.
  pool_.parallel_for(
      n, [&](int64_t b, int64_t e, int) { kernel(gate + b, up + b, out + b, e - b); }, 64);
}

void CpuOps::do_gather_rows(const float* src, const int64_t* index, int64_t rows, int64_t row_len, float* dst) {
  if (recording(&CpuOps::do_gather_rows, src, index, rows, row_len, dst)) return;
  const size_t bytes = static_cast<size_t>(row_len) * sizeof(float);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * row_len, src + index[r] * row_len, bytes);
}

void CpuOps::do_store_rows(const float* src, int64_t rows, int64_t row_len, float* dst, int64_t capacity,
                           int64_t first_pos) {
  if (recording(&CpuOps::do_store_rows, src, rows, row_len, dst, capacity, first_pos)) return;
  const size_t bytes = static_cast<size_t>(row_len) * sizeof(float);
  for (int64_t j = 0; j < rows; ++j) {
    const int64_t slot = (first_pos + j) % capacity;
    std::memcpy(dst + slot * row_len, src + j * row_len, bytes);
  }
}

// BF16, the one other dtype holds_context() takes.
void CpuOps::do_store_context_rows(DType dtype, const float* src, int64_t rows, int64_t row_len, void* dst,
                                   int64_t capacity, int64_t first_pos) {
  if (recording(&CpuOps::do_store_context_rows, dtype, src, rows, row_len, dst, capacity, first_pos)) return;
  auto* ring = static_cast<uint16_t*>(dst);
  for (int64_t j = 0; j < rows; ++j) {
    const int64_t slot = (first_pos + j) % capacity;
    convert_from_f32(DType::BF16, src + j * row_len, ring + slot * row_len, static_cast<size_t>(row_len));
  }
}

}  // namespace tpdraft::kernels::cpu
