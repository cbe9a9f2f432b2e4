// The CPU backend's matmul on int8 / int4 weights against float64 loops written here, for every
// quantized kernel this processor can run (portable, AVX2, AVX-VNNI, AVX-512 VNNI, and the AVX-VNNI
// kernel with its instruction emulated, which any AVX2 processor runs). Two references:
// (1) the same arithmetic in float64 (activations quantized per block as docs/quantization.md
// says), which the kernels must match to f32 rounding; (2) the dequantized weights against the
// unquantized activations, which they must match within the bound the activation rounding
// allows: |error| <= sum over k of |w[k]| * (block amax / 127) / 2. Odd K and N, groups that are
// not multiples of 8, per-channel rows longer than a block, many rows (the settle path).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <cstring>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/int8_activations.h"
#include "kernels/kernel_cases.h"
#include "support/test_support.h"

namespace tpdraft::kernels {
namespace {

using cpu::Isa;

struct QCase {
  int bits;
  int64_t m, k, n, group;
  bool bias;
};

QuantWeights random_weights(const QCase& c, std::mt19937_64& rng) {
  return random_quant(c.bits, c.n, c.k, c.group, 0.002f, 0.03f, rng);
}

std::vector<float> random_rows(int64_t m, int64_t k, std::mt19937_64& rng) {
  std::vector<float> x = randn(static_cast<size_t>(m * k), rng);
  // A few outlier channels, as real activations have.
  for (int64_t i = 0; i < m; ++i) x[static_cast<size_t>(i * k + (7 * i) % k)] *= 12.0f;
  return x;
}

struct Refs {
  std::vector<double> same;   // float64 with the activations quantized as the kernels do
  std::vector<double> scale;  // sum of |terms| of `same` (what f32 rounding grows with)
  std::vector<double> exact;  // dequantized weights times the f32 activations
  std::vector<double> bound;  // the most the activation rounding can move an output
};

Refs reference(const QCase& c, const QuantWeights& w, const std::vector<float>& x,
               const std::vector<float>& bias) {
  const int64_t kb = activation_block(c.group, c.k);
  Refs r;
  const size_t out = static_cast<size_t>(c.m * c.n);
  for (std::vector<double>* v : {&r.same, &r.scale, &r.exact, &r.bound}) v->assign(out, 0.0);
  for (int64_t i = 0; i < c.m; ++i) {
    const float* xr = x.data() + i * c.k;
    // Per block of kb columns: scale amax / 127, values round(x * 127 / amax) (f32, as specified).
    std::vector<double> xq(static_cast<size_t>(c.k)), xs(static_cast<size_t>(c.k));
    for (int64_t b0 = 0; b0 < c.k; b0 += kb) {
      const int64_t b1 = std::min(c.k, b0 + kb);
      float amax = 0.0f;
      for (int64_t k = b0; k < b1; ++k) amax = std::max(amax, std::fabs(xr[k]));
      const float inv = amax > 0 ? 127.0f / amax : 0.0f;
      for (int64_t k = b0; k < b1; ++k) {
        xq[static_cast<size_t>(k)] = std::nearbyint(xr[k] * inv);
        xs[static_cast<size_t>(k)] = static_cast<double>(amax / 127.0f);
      }
    }
    for (int64_t n = 0; n < c.n; ++n) {
      double same = 0, scale = 0, exact = 0, bound = 0;
      for (int64_t k = 0; k < c.k; ++k) {
        const double wv = static_cast<double>(w.q[static_cast<size_t>(n * c.k + k)]) *
                          w.scales[static_cast<size_t>(n * (c.k / c.group) + k / c.group)];
        const double t = wv * xq[static_cast<size_t>(k)] * xs[static_cast<size_t>(k)];
        same += t;
        scale += std::fabs(t);
        exact += wv * xr[k];
        bound += std::fabs(wv) * xs[static_cast<size_t>(k)] / 2;
      }
      const double b = c.bias ? bias[static_cast<size_t>(n)] : 0.0;
      const size_t o = static_cast<size_t>(i * c.n + n);
      r.same[o] = same + b;
      r.scale[o] = scale + std::fabs(b);
      r.exact[o] = exact + b;
      r.bound[o] = bound;
    }
  }
  return r;
}

// Runs the case on every kernel the machine has; checks both references and that all agree bit for bit.
void check_case(Ops& ops, const QCase& c, std::mt19937_64& rng) {
  const std::string what = fmt::format("int{} m={} k={} n={} group={}", c.bits, c.m, c.k, c.n, c.group);
  const QuantWeights w = random_weights(c, rng);
  const std::vector<float> x = random_rows(c.m, c.k, rng);
  const std::vector<float> bias = randn(static_cast<size_t>(c.n), rng);
  const Refs ref = reference(c, w, x, bias);

  const WeightFormat format = c.bits == 4 ? WeightFormat::Int4 : WeightFormat::Int8;
  Buffer buf(ops, ops.quantized_bytes(format, c.n, c.k, c.group));
  const Matrix mat = ops.upload_quantized({c.bits, c.n, c.k, c.group, w.q.data(), w.scales.data()}, buf.get());
  ASSERT_EQ(mat.format, format);

  std::vector<float> first;
  const IsaSweep sweep;
  // Every level the processor has (its own kernel each), then each kernel a level would not
  // choose here: AVX2's when AVX-VNNI replaces it, and the AVX-VNNI kernel with its instruction
  // emulated (where the processor has AVX2), which runs that kernel's code on any AVX2 machine.
  std::vector<std::pair<Isa, int>> runs;
  for (Isa isa : sweep.isas()) runs.emplace_back(isa, -1);
  if (cpu::detected_isa() >= Isa::Avx2) {
    runs.emplace_back(Isa::Avx2, static_cast<int>(cpu::QuantKernel::Avx2));
    runs.emplace_back(Isa::Avx2, static_cast<int>(cpu::QuantKernel::AvxVnniEmulated));
  }
  struct Unforce {
    ~Unforce() { cpu::force_quant_kernel(-1); }
  } unforce;
  for (const auto& [isa, forced] : runs) {
    cpu::force_isa(isa);
    cpu::force_quant_kernel(forced);
    const cpu::QuantKernel kernel = forced >= 0 ? static_cast<cpu::QuantKernel>(forced) : cpu::quant_kernel(isa);
    const std::string label = what + " on " + cpu::quant_kernel_name(kernel);
    std::vector<float> y(static_cast<size_t>(c.m * c.n), kNaN);
    ops.matmul(mat, x.data(), c.m, y.data(), c.bias ? bias.data() : nullptr);
    size_t bad_same = 0, bad_exact = 0;
    for (size_t o = 0; o < y.size(); ++o) {
      const bool ok_same = std::isfinite(y[o]) && std::fabs(y[o] - ref.same[o]) <= 2e-6 * ref.scale[o] + 1e-30;
      const bool ok_exact = std::isfinite(y[o]) && std::fabs(y[o] - ref.exact[o]) <= ref.bound[o] + 2e-6 * ref.scale[o];
      if (!ok_same && bad_same++ < 3)
        ADD_FAILURE() << label << ": output " << o << " = " << y[o] << ", float64 same arithmetic " << ref.same[o];
      if (!ok_exact && bad_exact++ < 3)
        ADD_FAILURE() << label << ": output " << o << " = " << y[o] << ", dequantized float64 " << ref.exact[o]
                      << " (bound " << ref.bound[o] << ")";
    }
    // The worst case bound is loose (errors of random sign partly cancel); in the mean the
    // quantized product is within 5% of the dequantized float64 one (a few outputs with
    // an outlier channel in every row are the hardest case).
    EXPECT_LT(testing::relative_error(y, ref.exact), 5e-2) << label;
    if (first.empty()) {
      first = y;
    } else {
      EXPECT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float)))
          << label << ": differs from the portable kernel";
    }
  }
}

const QCase kCases[] = {
    {8, 1, 64, 8, 64, false},     {4, 1, 64, 8, 64, false},     {8, 5, 96, 13, 32, true},
    {4, 5, 96, 13, 32, true},     {8, 16, 33, 7, 33, true},     {4, 16, 33, 7, 33, false},
    {8, 3, 200, 17, 40, false},   {4, 3, 200, 17, 40, true},    {8, 7, 1024, 9, 128, true},
    {4, 16, 1024, 24, 128, false}, {8, 4, 600, 10, 600, false}, {4, 4, 600, 10, 600, true},
    {8, 9, 1031, 5, 1031, true},  {4, 2, 1031, 3, 1031, false}, {4, 6, 40, 11, 5, true},
};

TEST(CpuQuantMatmul, MatchesFloat64OnEveryKernel) {
  auto ops = make_cpu_ops(2);
  std::mt19937_64 rng(11);
  for (const QCase& c : kCases) check_case(*ops, c, rng);
}

// The settle path: hundreds of rows, taken in several row blocks and split over threads.
TEST(CpuQuantMatmul, ManyRows) {
  auto ops = make_cpu_ops(2);
  std::mt19937_64 rng(12);
  check_case(*ops, {8, 300, 512, 40, 128, true}, rng);
  check_case(*ops, {4, 257, 512, 33, 64, false}, rng);
}

TEST(CpuQuantMatmul, LayoutAndBlocks) {
  EXPECT_EQ(activation_block(128, 1024), 128);
  EXPECT_EQ(activation_block(33, 33), 33);
  EXPECT_EQ(activation_block(600, 1200), 200);    // the largest divisor up to 256
  EXPECT_EQ(activation_block(1031, 2062), 1031);  // a prime: one block
  EXPECT_EQ(activation_block(4096, 8192), 256);
  EXPECT_EQ(activation_block(1031, 1031), 128);   // one scale per row: blocks of 128, the last short
  const auto l = cpu::detail::quant_layout(WeightFormat::Int4, 29, 200, 40);
  EXPECT_EQ(l.kb, 40);
  EXPECT_EQ(l.nb, 5);
  EXPECT_EQ(l.rgroups, 2);
  EXPECT_EQ(l.rg_bytes % 64, 0);
  // int4 holds half the bytes of int8, bf16 twice those of int8 (plus scales).
  auto ops = make_cpu_ops(1);
  const size_t q8 = ops->quantized_bytes(WeightFormat::Int8, 4096, 4096, 128);
  const size_t q4 = ops->quantized_bytes(WeightFormat::Int4, 4096, 4096, 128);
  EXPECT_NEAR(static_cast<double>(q8) / (4096.0 * 4096.0), 1.0, 0.04);
  EXPECT_NEAR(static_cast<double>(q4) / (4096.0 * 4096.0), 0.5, 0.04);
  EXPECT_THROW(cpu::detail::quant_layout(WeightFormat::Int8, 4, 100, 30), Error);  // 30 does not divide 100
}

// A captured matmul on quantized weights reads the activations when it is replayed.
TEST(CpuQuantMatmul, CaptureAndReplay) {
  auto ops = make_cpu_ops(2);
  std::mt19937_64 rng(13);
  const QCase c{4, 3, 64, 9, 32, false};
  const QuantWeights w = random_weights(c, rng);
  Buffer buf(*ops, ops->quantized_bytes(WeightFormat::Int4, c.n, c.k, c.group));
  const Matrix mat = ops->upload_quantized({4, c.n, c.k, c.group, w.q.data(), w.scales.data()}, buf.get());
  std::vector<float> x(static_cast<size_t>(c.m * c.k), 0.0f), y(static_cast<size_t>(c.m * c.n), -1.0f);
  ops->begin_capture();
  ops->matmul(mat, x.data(), c.m, y.data());
  auto graph = ops->end_capture();
  EXPECT_EQ(y[0], -1.0f);  // not run while captured
  const std::vector<float> fresh = random_rows(c.m, c.k, rng);
  std::copy(fresh.begin(), fresh.end(), x.begin());  // the same memory the capture points to
  ops->replay(*graph);
  const Refs ref = reference(c, w, x, {});
  for (size_t o = 0; o < y.size(); ++o) EXPECT_NEAR(y[o], ref.same[o], 2e-6 * ref.scale[o] + 1e-30) << o;
}

// The activations a matrix is uploaded for: the CPU backend's own (int8, asked as 0 or 8) gives
// the same matrix and the same bits; bf16 activations, which it has no kernels for, are refused,
// naming the backend (the model holds a16 weights dequantized instead).
TEST(CpuQuantMatmul, UploadTakesOnlyTheBackendsOwnActivations) {
  auto ops = make_cpu_ops(1);
  std::mt19937_64 rng(14);
  const QCase c{8, 5, 64, 11, 32, false};
  const QuantWeights w = random_weights(c, rng);
  EXPECT_TRUE(ops->offers_activation_bits(0));
  EXPECT_TRUE(ops->offers_activation_bits(8));
  EXPECT_FALSE(ops->offers_activation_bits(16));
  Buffer own(*ops, ops->quantized_bytes(WeightFormat::Int8, c.n, c.k, c.group));
  Buffer a8(*ops, ops->quantized_bytes(WeightFormat::Int8, c.n, c.k, c.group));
  const Matrix m0 = ops->upload_quantized({8, c.n, c.k, c.group, w.q.data(), w.scales.data()}, own.get());
  const Matrix m8 = ops->upload_quantized({8, c.n, c.k, c.group, w.q.data(), w.scales.data(), 8}, a8.get());
  EXPECT_EQ(m8.activation_bits, 8);
  const std::vector<float> x = random_rows(c.m, c.k, rng);
  std::vector<float> y0(static_cast<size_t>(c.m * c.n)), y8(y0.size());
  ops->matmul(m0, x.data(), c.m, y0.data());
  ops->matmul(m8, x.data(), c.m, y8.data());
  EXPECT_EQ(y0, y8);
  try {
    ops->upload_quantized({8, c.n, c.k, c.group, w.q.data(), w.scales.data(), 16}, a8.get());
    ADD_FAILURE() << "bf16 activations were taken by the cpu backend";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backend 'cpu' has no kernels for int8 weights with 16-bit activations"),
              std::string::npos)
        << e.what();
  }
}

// A quantized head (--quant ...+head): head_logits are the matmul's dots through the logit
// transform (against the float64 reference), rows past valid_rows never appear, and head_topk
// equals sorting head_logits' output (value descending, then id), ties and the soft cap included.
TEST(CpuQuantMatmul, QuantizedHeadLogitsAndTopk) {
  auto ops = make_cpu_ops(2);
  std::mt19937_64 rng(14);
  for (const float cap : {0.0f, 0.05f}) {
    const QCase c{8, 5, 96, 301, 32, false};
    const QuantWeights w = random_weights(c, rng);
    Buffer buf(*ops, ops->quantized_bytes(WeightFormat::Int8, c.n, c.k, c.group));
    const Matrix mat = ops->upload_quantized({8, c.n, c.k, c.group, w.q.data(), w.scales.data()}, buf.get());
    const std::vector<float> x = random_rows(c.m, c.k, rng);
    HeadParams p;
    p.head = mat;
    p.g = x.data();
    p.m = c.m;
    p.valid_rows = 290;
    p.scale = 0.75f;
    p.cap = cap;
    std::vector<float> logits(static_cast<size_t>(c.m * p.valid_rows));
    ops->head_logits(p, logits.data());
    const Refs ref = reference(c, w, x, {});
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t v = 0; v < p.valid_rows; ++v) {
        const size_t o = static_cast<size_t>(i * c.n + v);
        const double raw = 0.75 * ref.same[o], want = cap > 0 ? cap * std::tanh(raw / cap) : raw;
        EXPECT_NEAR(logits[static_cast<size_t>(i * p.valid_rows + v)], want, 2e-6 * 0.75 * ref.scale[o] + 1e-30)
            << "cap " << cap << " row " << i << " vocab " << v;
      }
    const int k = 9;
    const int64_t base = 1000;
    std::vector<float> values(static_cast<size_t>(c.m * k));
    std::vector<int64_t> ids(static_cast<size_t>(c.m * k));
    ops->head_topk(p, k, base, values.data(), ids.data());
    const TopK want = sorted_top(logits, c.m, p.valid_rows, k, base);
    for (size_t e = 0; e < ids.size(); ++e) {
      EXPECT_EQ(ids[e], want.ids[e]) << "cap " << cap << " row " << e / k;
      EXPECT_EQ(values[e], want.values[e]) << "cap " << cap << " row " << e / k;
    }
  }
}

}  // namespace
}  // namespace tpdraft::kernels
