// The CUDA backend's weight-only int8 / int4 matmul against float64 on the dequantized weights
// (the activations stay f32 here, so only f32 rounding separates them): odd row and column
// counts, int4 rows of odd length, per-row and grouped scales, 1 .. 37 activation rows, a bias.
// Skips itself, with the reason, without the CUDA backend or a device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"

namespace tpdraft::kernels {
namespace {

struct Case {
  int bits;
  int64_t m, n, k, group;
  bool bias;
};

TEST(CudaQuantMatmul, MatchesFloat64OnTheDequantizedWeights) {
  if (cuda_devices() == 0) GTEST_SKIP() << "no CUDA device (or a build without the CUDA backend)";
  auto gpu = make_ops("cuda", 1, 0);
  std::mt19937_64 rng(5);
  const Case cases[] = {{8, 1, 13, 96, 32, false}, {4, 16, 13, 96, 32, true}, {8, 16, 257, 33, 33, true},
                        {4, 37, 70, 33, 33, false}, {4, 9, 40, 512, 128, true}, {8, 64, 24, 512, 512, true}};
  for (const Case& c : cases) {
    const std::string what = "int" + std::to_string(c.bits) + " m " + std::to_string(c.m) + " n " +
                             std::to_string(c.n) + " k " + std::to_string(c.k) + " group " + std::to_string(c.group);
    std::uniform_int_distribution<int> qd(-(1 << (c.bits - 1)), (1 << (c.bits - 1)) - 1);
    std::uniform_real_distribution<float> sd(0.001f, 0.05f);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<int8_t> q(static_cast<size_t>(c.n * c.k));
    for (auto& v : q) v = static_cast<int8_t>(qd(rng));
    std::vector<float> scales(static_cast<size_t>(c.n * (c.k / c.group))), x(static_cast<size_t>(c.m * c.k)),
        bias(static_cast<size_t>(c.n));
    for (auto& v : scales) v = sd(rng);
    for (auto& v : x) v = nd(rng);
    for (auto& v : bias) v = nd(rng);

    const WeightFormat format = c.bits == 4 ? WeightFormat::Int4 : WeightFormat::Int8;
    Buffer wbuf(*gpu, gpu->quantized_bytes(format, c.n, c.k, c.group));
    const Matrix w = gpu->upload_quantized({c.bits, c.n, c.k, c.group, q.data(), scales.data()}, wbuf.get());
    Buffer xb(*gpu, x.size() * 4), bb(*gpu, bias.size() * 4), yb(*gpu, static_cast<size_t>(c.m * c.n) * 4);
    gpu->to_device(xb.get(), x.data(), x.size() * 4);
    gpu->to_device(bb.get(), bias.data(), bias.size() * 4);
    std::vector<float> y(static_cast<size_t>(c.m * c.n), std::numeric_limits<float>::quiet_NaN());
    gpu->to_device(yb.get(), y.data(), y.size() * 4);
    gpu->matmul(w, xb.f32(), c.m, yb.f32(), c.bias ? bb.f32() : nullptr);
    gpu->to_host(y.data(), yb.get(), y.size() * 4);
    size_t bad = 0;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t n = 0; n < c.n; ++n) {
        double ref = c.bias ? bias[static_cast<size_t>(n)] : 0.0, mag = std::fabs(ref);
        for (int64_t k = 0; k < c.k; ++k) {
          const double t = static_cast<double>(q[static_cast<size_t>(n * c.k + k)]) *
                           scales[static_cast<size_t>(n * (c.k / c.group) + k / c.group)] * x[static_cast<size_t>(i * c.k + k)];
          ref += t;
          mag += std::fabs(t);
        }
        const float got = y[static_cast<size_t>(i * c.n + n)];
        if (!(std::fabs(got - ref) <= 1e-5 * mag + 1e-30) && bad++ < 3)
          ADD_FAILURE() << what << ": y[" << i << "][" << n << "] = " << got << ", float64 " << ref;
      }
    EXPECT_EQ(bad, 0u) << what;
  }
}

}  // namespace
}  // namespace tpdraft::kernels
