// The CUDA backend's int8 / int4 matmul. Weight-only: against float64 on the dequantized weights
// and against the CPU backend, for both of its kernels (tensor cores up to 64 rows, bf16 dequant
// + cuBLAS above): 1 .. 300 rows, N that is not a multiple of the 32-output tiles, K that is not
// a multiple of the 16 / 32-input tiles, groups of 32 and 128, per-channel scales and odd groups
// (a k16 step crossing a group boundary), a bias. Skips itself, with the reason, without the
// CUDA backend or a device. The layout and the fragment arithmetic are checked without a device
// by tests/kernels/test_qtile_layout.cpp. With int8 activations: against the CPU backend, which
// holds the same integers, and row by row against itself in batches of every size (below).
//
// Error bound. Both kernels multiply bf16(x) by bf16(q * scale) with f32 sums. bf16 keeps 8
// significant bits, so each rounding is within a relative 2^-9 and a product within
// |x w| (2^-8 + 2^-18). The f32 sums (tensor-core accumulation, the warps' and the split-K sums,
// cuBLAS) add at most about K 2^-24 times sum |x w|; 2 K 2^-24 leaves room for the tensor cores'
// accumulation, which need not round to nearest. So, with S = sum_k |x_k w_k| (+ |bias|):
//   |gpu - float64| <= S (2^-8 + 2^-18 + K 2^-23) + 1e-30.
// The CPU backend quantizes x to int8 per block (docs/quantization.md): within
// sum_k |w_k| amax / 254 of float64, amax the block's largest |x| (the row's bounds it), plus
// its own f32 sums; the two bounds add for the GPU against the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "kernels/int8_activations.h"
#include "kernels/kernel_cases.h"
#include "kernels/ops.h"

namespace tpdraft::kernels {
namespace {

struct Shape {
  int64_t n, k, group;
  bool bias;
};

TEST(CudaQuantMatmul, MatchesFloat64AndTheCpuBackendWithinTheBf16Bound) {
  if (cuda_devices() == 0) GTEST_SKIP() << "no CUDA device (or a build without the CUDA backend)";
  auto gpu = make_ops("cuda", 1, 0);
  auto cpu = make_ops("cpu", 0, 0);
  std::mt19937_64 rng(5);
  const Shape shapes[] = {{37, 64, 32, true},     {1000, 200, 200, false}, {37, 2048, 128, false},
                          {1000, 2048, 128, true}, {70, 66, 33, true},      {24, 200, 8, false}};
  const int64_t rows[] = {1, 7, 16, 64, 65, 300};
  for (int bits : {8, 4})
    for (const Shape& s : shapes) {
      const auto [q, scales] = random_quant(bits, s.n, s.k, s.group, 0.001f, 0.05f, rng);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> bias(static_cast<size_t>(s.n));
      for (auto& v : bias) v = nd(rng);
      const QuantizedRows src{bits, s.n, s.k, s.group, q.data(), scales.data()};
      const WeightFormat format = bits == 4 ? WeightFormat::Int4 : WeightFormat::Int8;
      Buffer wg(*gpu, gpu->quantized_bytes(format, s.n, s.k, s.group));
      Buffer wc(*cpu, cpu->quantized_bytes(format, s.n, s.k, s.group));
      const Matrix w_gpu = gpu->upload_quantized(src, wg.get());
      const Matrix w_cpu = cpu->upload_quantized(src, wc.get());
      const Buffer bg = put(*gpu, bias);

      for (int64_t m : rows) {
        const std::string what = "int" + std::to_string(bits) + " m " + std::to_string(m) + " n " +
                                 std::to_string(s.n) + " k " + std::to_string(s.k) + " group " + std::to_string(s.group);
        std::vector<float> x(static_cast<size_t>(m * s.k));
        for (auto& v : x) v = nd(rng);
        const size_t out = static_cast<size_t>(m * s.n), guard = 64;
        // y with a guard band of NaNs past its end: the kernels write exactly y[i * n + col].
        std::vector<float> y(out + guard, kNaN), yc(out);
        const Buffer xg = put(*gpu, x), yg = put(*gpu, y);
        gpu->matmul(w_gpu, xg.f32(), m, yg.f32(), s.bias ? bg.f32() : nullptr);
        gpu->to_host(y.data(), yg.get(), y.size() * 4);
        const Buffer xc = put(*cpu, x), ycb(*cpu, out * 4);
        cpu->matmul(w_cpu, xc.f32(), m, ycb.f32(), s.bias ? bias.data() : nullptr);
        cpu->to_host(yc.data(), ycb.get(), out * 4);

        for (size_t i = out; i < y.size(); ++i) ASSERT_TRUE(std::isnan(y[i])) << what << ": wrote past y, at " << i;
        size_t bad = 0;
        const double acc = static_cast<double>(s.k) * std::ldexp(1.0, -23);
        for (int64_t i = 0; i < m; ++i) {
          float amax = 0.0f;
          for (int64_t k = 0; k < s.k; ++k) amax = std::max(amax, std::fabs(x[static_cast<size_t>(i * s.k + k)]));
          for (int64_t n = 0; n < s.n; ++n) {
            double ref = s.bias ? bias[static_cast<size_t>(n)] : 0.0, mag = std::fabs(ref), wsum = 0;
            for (int64_t k = 0; k < s.k; ++k) {
              const double w = static_cast<double>(static_cast<float>(q[static_cast<size_t>(n * s.k + k)]) *
                                                   scales[static_cast<size_t>(n * (s.k / s.group) + k / s.group)]);
              const double t = w * x[static_cast<size_t>(i * s.k + k)];
              ref += t;
              mag += std::fabs(t);
              wsum += std::fabs(w);
            }
            const double gpu_bound = mag * (std::ldexp(1.0, -8) + std::ldexp(1.0, -18) + acc) + 1e-30;
            const double cpu_bound = wsum * amax / 254.0 + mag * acc + 1e-30;
            const double got = y[static_cast<size_t>(i * s.n + n)], cpu_got = yc[static_cast<size_t>(i * s.n + n)];
            if (!(std::fabs(got - ref) <= gpu_bound) && bad++ < 3)
              ADD_FAILURE() << what << ": y[" << i << "][" << n << "] = " << got << ", float64 " << ref << " (bound "
                            << gpu_bound << ")";
            if (!(std::fabs(got - cpu_got) <= gpu_bound + cpu_bound) && bad++ < 3)
              ADD_FAILURE() << what << ": y[" << i << "][" << n << "] = " << got << ", cpu backend " << cpu_got
                            << " (bound " << gpu_bound + cpu_bound << ")";
          }
        }
        EXPECT_EQ(bad, 0u) << what;
      }
    }
}

// The same product twice gives the same bits (the warps' and the splits' sums have a fixed order),
// which graph replays and op-by-op runs rely on to draft the same tokens.
TEST(CudaQuantMatmul, RepeatsBitForBit) {
  if (cuda_devices() == 0) GTEST_SKIP() << "no CUDA device (or a build without the CUDA backend)";
  auto gpu = make_ops("cuda", 1, 0);
  std::mt19937_64 rng(6);
  const int64_t n = 4096, k = 4096, group = 128;
  for (int bits : {8, 4})
    for (int64_t m : {16, 100}) {
      std::uniform_int_distribution<int> qd(-(1 << (bits - 1)), (1 << (bits - 1)) - 1);
      std::vector<int8_t> q(static_cast<size_t>(n * k));
      for (auto& v : q) v = static_cast<int8_t>(qd(rng));
      const std::vector<float> scales(static_cast<size_t>(n * (k / group)), 0.01f);
      const std::vector<float> x = randn(static_cast<size_t>(m * k), rng);
      const WeightFormat format = bits == 4 ? WeightFormat::Int4 : WeightFormat::Int8;
      Buffer wg(*gpu, gpu->quantized_bytes(format, n, k, group));
      const Matrix w = gpu->upload_quantized({bits, n, k, group, q.data(), scales.data()}, wg.get());
      const size_t out = static_cast<size_t>(m * n);
      const Buffer xg = put(*gpu, x), yg(*gpu, out * 4);
      gpu->matmul(w, xg.f32(), m, yg.f32());
      const auto a = get<float>(*gpu, yg, out);
      gpu->matmul(w, xg.f32(), m, yg.f32());
      EXPECT_EQ(a, get<float>(*gpu, yg, out)) << "int" << bits << " m " << m;
    }
}

// int8 activations (matrices uploaded with activation_bits 8, --quant q8a8 / q4a8 on CUDA): the
// rows are quantized in the CPU backend's blocks with its rounding, so both backends hold the same
// integer block sums and differ only in the order of the f32 sums. With nb blocks per row and
// S = sum over blocks of |block sum| x weight scale x activation scale (bounded by
// sum_k (|x_k| + amax / 254) |w_k|), each backend is within about (nb + 8) 2^-24 S of the exact
// sum of the scaled blocks, so the two are within (nb + 8) 2^-23 S of each other. Shapes whose
// blocks the kernel cannot take (a k32 step across two blocks) are refused at upload.
TEST(CudaQuantMatmul, Int8ActivationsMatchTheCpuBackend) {
  if (cuda_devices() == 0) GTEST_SKIP() << "no CUDA device (or a build without the CUDA backend)";
  auto gpu = make_ops("cuda", 1, 0);
  auto cpu = make_ops("cpu", 0, 0);
  std::mt19937_64 rng(9);
  const Shape shapes[] = {{37, 64, 32, true},      {1000, 200, 200, false}, {37, 2048, 128, false},
                          {1000, 2048, 128, true}, {70, 96, 96, true},      {40, 1031, 1031, false},
                          {33, 384, 64, true}};
  const int64_t rows[] = {1, 7, 16, 64, 65, 300};
  for (int bits : {8, 4})
    for (const Shape& s : shapes) {
      const auto [q, scales] = random_quant(bits, s.n, s.k, s.group, 0.001f, 0.05f, rng);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> bias(static_cast<size_t>(s.n));
      for (auto& v : bias) v = nd(rng);
      const WeightFormat format = bits == 4 ? WeightFormat::Int4 : WeightFormat::Int8;
      Buffer wg(*gpu, gpu->quantized_bytes(format, s.n, s.k, s.group));
      Buffer wc(*cpu, cpu->quantized_bytes(format, s.n, s.k, s.group));
      const Matrix w_gpu = gpu->upload_quantized({bits, s.n, s.k, s.group, q.data(), scales.data(), 8}, wg.get());
      const Matrix w_cpu = cpu->upload_quantized({bits, s.n, s.k, s.group, q.data(), scales.data()}, wc.get());
      ASSERT_EQ(w_gpu.activation_bits, 8);
      const Buffer bg = put(*gpu, bias);
      const int64_t kb = activation_block(s.group, s.k), nb = (s.k + kb - 1) / kb;
      for (int64_t m : rows) {
        const std::string what = "int" + std::to_string(bits) + " a8 m " + std::to_string(m) + " n " +
                                 std::to_string(s.n) + " k " + std::to_string(s.k) + " group " + std::to_string(s.group);
        std::vector<float> x(static_cast<size_t>(m * s.k));
        for (auto& v : x) v = nd(rng);
        const size_t out = static_cast<size_t>(m * s.n), guard = 64;
        std::vector<float> y(out + guard, kNaN), yc(out);
        const Buffer xg = put(*gpu, x), yg = put(*gpu, y);
        gpu->matmul(w_gpu, xg.f32(), m, yg.f32(), s.bias ? bg.f32() : nullptr);
        gpu->to_host(y.data(), yg.get(), y.size() * 4);
        const Buffer xc = put(*cpu, x), ycb(*cpu, out * 4);
        cpu->matmul(w_cpu, xc.f32(), m, ycb.f32(), s.bias ? bias.data() : nullptr);
        cpu->to_host(yc.data(), ycb.get(), out * 4);
        for (size_t i = out; i < y.size(); ++i) ASSERT_TRUE(std::isnan(y[i])) << what << ": wrote past y, at " << i;
        size_t bad = 0;
        for (int64_t i = 0; i < m; ++i) {
          const float* xr = x.data() + i * s.k;
          for (int64_t n = 0; n < s.n; ++n) {
            double mag = s.bias ? std::fabs(bias[static_cast<size_t>(n)]) : 0.0;
            for (int64_t b = 0; b < nb; ++b) {
              float amax = 0.0f;
              for (int64_t k = b * kb; k < std::min(s.k, (b + 1) * kb); ++k) amax = std::max(amax, std::fabs(xr[k]));
              for (int64_t k = b * kb; k < std::min(s.k, (b + 1) * kb); ++k)
                mag += (std::fabs(xr[k]) + amax / 254.0) *
                       std::fabs(static_cast<double>(q[static_cast<size_t>(n * s.k + k)]) *
                                 scales[static_cast<size_t>(n * (s.k / s.group) + k / s.group)]);
            }
            const double bound = static_cast<double>(nb + 8) * std::ldexp(1.0, -23) * mag + 1e-30;
            const double got = y[static_cast<size_t>(i * s.n + n)], want = yc[static_cast<size_t>(i * s.n + n)];
            if (!(std::fabs(got - want) <= bound) && bad++ < 3)
              ADD_FAILURE() << what << ": y[" << i << "][" << n << "] = " << got << ", cpu backend " << want
                            << " (bound " << bound << ")";
          }
        }
        EXPECT_EQ(bad, 0u) << what;
      }
    }
  // A k32 step across two activation blocks: refused, saying why.
  const auto [q, scales] = random_quant(8, 24, 66, 33, 0.001f, 0.05f, rng);
  Buffer wg(*gpu, gpu->quantized_bytes(WeightFormat::Int8, 24, 66, 33));
  try {
    gpu->upload_quantized({8, 24, 66, 33, q.data(), scales.data(), 8}, wg.get());
    ADD_FAILURE() << "a [24, 66] matrix with groups of 33 was taken for int8 activations";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
  }
}

// A row's int8-activation product has the same bits alone, in a draft's 16 rows and in a batch of
// 300 (one split-K plan for every row count, 64 rows per launch), twice over.
TEST(CudaQuantMatmul, Int8ActivationRowsDoNotDependOnTheBatch) {
  if (cuda_devices() == 0) GTEST_SKIP() << "no CUDA device (or a build without the CUDA backend)";
  auto gpu = make_ops("cuda", 1, 0);
  std::mt19937_64 rng(10);
  const int64_t n = 4096, k = 4096, group = 128, m = 300;
  for (int bits : {8, 4}) {
    const auto [q, scales] = random_quant(bits, n, k, group, 0.001f, 0.05f, rng);
    const WeightFormat format = bits == 4 ? WeightFormat::Int4 : WeightFormat::Int8;
    Buffer wg(*gpu, gpu->quantized_bytes(format, n, k, group));
    const Matrix w = gpu->upload_quantized({bits, n, k, group, q.data(), scales.data(), 8}, wg.get());
    const std::vector<float> x = randn(static_cast<size_t>(m * k), rng);
    const Buffer xg = put(*gpu, x), yg(*gpu, static_cast<size_t>(m * n) * 4);
    gpu->matmul(w, xg.f32(), m, yg.f32());
    const auto all = get<float>(*gpu, yg, static_cast<size_t>(m * n));
    for (int64_t r0 : {int64_t{0}, int64_t{77}, int64_t{283}}) {
      for (int64_t rows : {int64_t{1}, int64_t{16}}) {
        if (r0 + rows > m) continue;
        const Buffer ys(*gpu, static_cast<size_t>(rows * n) * 4);
        gpu->matmul(w, xg.f32() + r0 * k, rows, ys.f32());
        const auto part = get<float>(*gpu, ys, static_cast<size_t>(rows * n));
        for (int64_t i = 0; i < rows * n; ++i)
          ASSERT_EQ(bit_cast<uint32_t>(part[static_cast<size_t>(i)]), bit_cast<uint32_t>(all[static_cast<size_t>(r0 * n + i)]))
              << "int" << bits << ": rows from " << r0 << " alone (" << rows << ") differ at " << i;
      }
    }
    gpu->matmul(w, xg.f32(), m, yg.f32());
    EXPECT_EQ(all, get<float>(*gpu, yg, static_cast<size_t>(m * n))) << "int" << bits << " twice";
  }
}

// A quantized head (--quant ...+head) on CUDA: head_logits are the matmul's dots through the logit
// transform (so within the bound above of the CPU backend's head, scale applied), padded vocabulary
// rows never appear, and head_topk equals sorting head_logits' own output (value, then id).
TEST(CudaQuantMatmul, QuantizedHead) {
  if (cuda_devices() == 0) GTEST_SKIP() << "no CUDA device (or a build without the CUDA backend)";
  auto gpu = make_ops("cuda", 1, 0);
  auto cpu = make_ops("cpu", 0, 0);
  ASSERT_TRUE(gpu->supports(WeightFormat::Int8, WeightOp::Head));
  std::mt19937_64 rng(7);
  const int64_t n = 1000, k = 256, group = 128, valid = 990;
  for (const int64_t m : {15, 90}) {  // the tensor-core kernel, and dequant + cuBLAS
    std::uniform_int_distribution<int> qd(-127, 127);
    std::uniform_real_distribution<float> sd(0.001f, 0.02f);
    std::vector<int8_t> q(static_cast<size_t>(n * k));
    for (auto& v : q) v = static_cast<int8_t>(qd(rng));
    std::vector<float> scales(static_cast<size_t>(n * (k / group)));
    for (auto& v : scales) v = sd(rng);
    const std::vector<float> x = randn(static_cast<size_t>(m * k), rng);
    const QuantizedRows src{8, n, k, group, q.data(), scales.data()};
    Buffer wg(*gpu, gpu->quantized_bytes(WeightFormat::Int8, n, k, group));
    Buffer wc(*cpu, cpu->quantized_bytes(WeightFormat::Int8, n, k, group));
    const Buffer xg = put(*gpu, x);
    HeadParams p;
    p.head = gpu->upload_quantized(src, wg.get());
    p.g = xg.f32();
    p.m = m;
    p.valid_rows = valid;
    p.scale = 0.5f;
    HeadParams pc = p;
    pc.head = cpu->upload_quantized(src, wc.get());
    pc.g = x.data();
    std::vector<float> lg(static_cast<size_t>(m * valid)), lc(lg.size());
    Buffer lgb(*gpu, lg.size() * 4);
    gpu->head_logits(p, lgb.f32());
    gpu->to_host(lg.data(), lgb.get(), lg.size() * 4);
    cpu->head_logits(pc, lc.data());
    size_t bad = 0;
    for (int64_t i = 0; i < m; ++i) {
      double amax = 0;
      for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(static_cast<double>(x[static_cast<size_t>(i * k + c)])));
      for (int64_t v = 0; v < valid; ++v) {
        double mag = 0, wsum = 0;
        for (int64_t c = 0; c < k; ++c) {
          const double w = static_cast<double>(q[static_cast<size_t>(v * k + c)]) * scales[static_cast<size_t>(v * (k / group) + c / group)];
          mag += std::fabs(w * x[static_cast<size_t>(i * k + c)]);
          wsum += std::fabs(w);
        }
        const double acc = static_cast<double>(k) * std::ldexp(1.0, -23);
        const double bound = 0.5 * (mag * (std::ldexp(1.0, -8) + std::ldexp(1.0, -18) + 2 * acc) + wsum * amax / 254.0) + 1e-30;
        const size_t o = static_cast<size_t>(i * valid + v);
        if (!(std::fabs(static_cast<double>(lg[o]) - lc[o]) <= bound) && bad++ < 3)
          ADD_FAILURE() << "m " << m << " logit [" << i << "][" << v << "] cuda " << lg[o] << ", cpu " << lc[o] << " (bound " << bound << ")";
      }
    }
    EXPECT_EQ(bad, 0u) << "m " << m;
    const int topk = 8;
    const int64_t base = 5000;
    const size_t nk = static_cast<size_t>(m * topk);
    const Buffer vb(*gpu, nk * 4), ib(*gpu, nk * 8);
    gpu->head_topk(p, topk, base, vb.f32(), static_cast<int64_t*>(ib.get()));
    const auto values = get<float>(*gpu, vb, nk);
    const auto ids = get<int64_t>(*gpu, ib, nk);
    const TopK want = sorted_top(lg, m, valid, topk, base);
    for (size_t e = 0; e < ids.size(); ++e) {
      EXPECT_EQ(ids[e], want.ids[e]) << "m " << m << " row " << e / topk;
      EXPECT_EQ(values[e], want.values[e]) << "m " << m << " row " << e / topk;
    }
  }
}

}  // namespace
}  // namespace tpdraft::kernels
