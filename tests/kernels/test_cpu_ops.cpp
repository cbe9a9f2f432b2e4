// The CPU backend's ops against naive float64 loops written here from the ops.h contracts, for
// every kernel family this processor has (portable, AVX2, AVX-512, AVX-512 + BF16). Outputs are
// poisoned with NaN first; errors are normalised by the magnitudes that f32 rounding scales with.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/kernel_cases.h"
#include "support/test_support.h"

namespace tpdraft::kernels {
namespace {

using cpu::Isa;
using testing::expect_error;

// Weights stored in `dtype`; `wide`, when given, receives the exact f32 values the kernels must use.
std::vector<uint8_t> make_weights(DType dtype, const std::vector<float>& values, std::vector<float>* wide = nullptr) {
  std::vector<uint8_t> raw(values.size() * dtype_size(dtype));
  convert_from_f32(dtype, values.data(), raw.data(), values.size());
  if (wide) {
    wide->resize(values.size());
    convert_to_f32(dtype, raw.data(), wide->data(), values.size());
  }
  return raw;
}

// |got - ref| <= tol * scale element by element (scale: the sum of |terms| behind each value,
// what f32 rounding error grows with); NaN and inf never pass. Returns the largest |got - ref| / scale.
double expect_close(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& scale,
                    double tol, const std::string& what) {
  EXPECT_EQ(got.size(), ref.size()) << what;
  if (got.size() != ref.size()) return INFINITY;
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isfinite(got[i]) && std::fabs(got[i] - ref[i]) <= tol * scale[i] + 1e-30;
    if (!ok && bad++ < 5) ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << ref[i];
    worst = std::max(worst, std::isfinite(got[i]) ? std::fabs(got[i] - ref[i]) / scale[i] : INFINITY);
  }
  EXPECT_EQ(bad, 0u) << what;
  return worst;
}

// The ops on two threads, and every kernel family to sweep.
class CpuOps : public ::testing::Test {
 protected:
  IsaSweep sweep;
  std::unique_ptr<Ops> ops = make_cpu_ops(2);
};

// ------------------------------------------------------------------------------------------------
// matmul

struct MatmulCase {
  DType dtype;
  int64_t m, k, n;
  bool bias;
};

void check_matmul(Ops& ops, const MatmulCase& c, std::mt19937_64& rng, const IsaSweep& sweep) {
  std::vector<float> wide;
  const auto raw = make_weights(c.dtype, randn(static_cast<size_t>(c.n * c.k), rng, 0.05f), &wide);
  const auto x = randn(static_cast<size_t>(c.m * c.k), rng);
  const auto bias = randn(static_cast<size_t>(c.n), rng);
  std::vector<double> ref(static_cast<size_t>(c.m * c.n)), scale(ref.size());
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double s = c.bias ? bias[j] : 0.0, a = c.bias ? std::fabs(bias[j]) : 0.0;
      for (int64_t t = 0; t < c.k; ++t) {
        s += static_cast<double>(wide[j * c.k + t]) * x[i * c.k + t];
        a += std::fabs(static_cast<double>(wide[j * c.k + t]) * x[i * c.k + t]);
      }
      ref[i * c.n + j] = s;
      scale[i * c.n + j] = a;
    }
  const Matrix w{c.dtype, c.n, c.k, raw.data()};
  for (Isa isa : sweep.isas()) {
    cpu::force_isa(isa);
    std::vector<float> y(ref.size(), kNaN);
    ops.matmul(w, x.data(), c.m, y.data(), c.bias ? bias.data() : nullptr);
    expect_close(y, ref, scale, 2e-6,
                 fmt::format("matmul {} m={} k={} n={} bias={} isa={}", dtype_name(c.dtype), c.m, c.k, c.n, c.bias,
                             cpu::isa_name(isa)));
  }
}

TEST_F(CpuOps, MatmulMatchesFloat64AcrossShapesDtypesAndIsas) {
  std::mt19937_64 rng(11);
  int index = 0;
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (int64_t m : {1, 3, 16, 17, 33})
      for (int64_t k : {16, 20, 77, 2053})
        for (int64_t n : {1, 7, 33}) check_matmul(*ops, {dt, m, k, n, (index++ % 2) == 0}, rng, sweep);
}

TEST_F(CpuOps, MatmulLargeRowBlocksAndThreadSplits) {
  auto ops3 = make_cpu_ops(3);  // more workers than cores: uneven column splits
  std::mt19937_64 rng(12);
  // m = 300 with 2080 packed columns spans several L2 row blocks; n = 250 several thread chunks.
  for (DType dt : {DType::BF16, DType::F32}) check_matmul(*ops3, {dt, 300, 2053, 250, true}, rng, sweep);
  check_matmul(*ops3, {DType::F16, 40, 6144, 100, false}, rng, sweep);
}

// The head relies on this: one (x row, weight row) pair gives the same bits in any call shape.
TEST_F(CpuOps, MatmulDotDoesNotDependOnCallShape) {
  std::mt19937_64 rng(13);
  const int64_t m = 16, k = 2050, n = 45;
  const auto raw = make_weights(DType::BF16, randn(n * k, rng, 0.05f));
  const auto x = randn(m * k, rng);
  for (Isa isa : sweep.isas()) {
    cpu::force_isa(isa);
    std::vector<float> all(m * n, kNaN), one(n, kNaN);
    ops->matmul({DType::BF16, n, k, raw.data()}, x.data(), m, all.data(), nullptr);
    ops->matmul({DType::BF16, n, k, raw.data()}, x.data() + 9 * k, 1, one.data(), nullptr);
    EXPECT_EQ(0, std::memcmp(all.data() + 9 * n, one.data(), n * sizeof(float))) << cpu::isa_name(isa);
  }
}

// The variants agree with one another to within f32 rounding (not only with float64).
TEST_F(CpuOps, IsaVariantsAgree) {
  std::mt19937_64 rng(14);
  const int64_t m = 16, k = 1000, n = 40;
  const auto raw = make_weights(DType::BF16, randn(n * k, rng, 0.05f));
  const auto x = randn(m * k, rng);
  std::vector<std::vector<float>> outs;
  for (Isa isa : sweep.isas()) {
    cpu::force_isa(isa);
    outs.emplace_back(m * n, kNaN);
    ops->matmul({DType::BF16, n, k, raw.data()}, x.data(), m, outs.back().data(), nullptr);
  }
  for (size_t v = 1; v < outs.size(); ++v) {
    std::vector<double> ref(outs[0].begin(), outs[0].end());
    EXPECT_LT(testing::relative_error(outs[v], ref), 2e-6) << cpu::isa_name(sweep.isas()[v]);
  }
}

// ------------------------------------------------------------------------------------------------
// norms and RoPE

// rms_norm in float64 over rows of x: ref = w * x / sqrt(mean(x^2) + 1e-6), scale = |ref|.
template <typename T>
void rms_norm_f64(const std::vector<T>& x, const std::vector<float>& w, int64_t rows, int64_t n,
                  std::vector<double>& ref, std::vector<double>& scale) {
  ref.assign(rows * n, 0.0);
  scale.assign(rows * n, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < n; ++c) ss += static_cast<double>(x[r * n + c]) * x[r * n + c];
    const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int64_t c = 0; c < n; ++c) {
      ref[r * n + c] = w[c] * static_cast<double>(x[r * n + c]) * inv;
      scale[r * n + c] = std::fabs(ref[r * n + c]);
    }
  }
}

TEST_F(CpuOps, RmsNormMatchesFloat64) {
  std::mt19937_64 rng(21);
  for (int64_t rows : {1, 5, 16, 40})
    for (int64_t n : {1, 7, 33, 2048}) {
      const auto x = randn(rows * n, rng, 3.0f, 0.5f);
      const auto w = randn(n, rng, 0.2f, 1.0f);
      std::vector<double> ref, scale;
      rms_norm_f64(x, w, rows, n, ref, scale);
      for (Isa isa : sweep.isas()) {
        cpu::force_isa(isa);
        std::vector<float> y(rows * n, kNaN);
        ops->rms_norm(x.data(), w.data(), y.data(), rows, n, 1e-6f);
        expect_close(y, ref, scale, 1e-5, fmt::format("rms_norm {}x{} {}", rows, n, cpu::isa_name(isa)));
        std::vector<float> inplace = x;  // y may alias x
        ops->rms_norm(inplace.data(), w.data(), inplace.data(), rows, n, 1e-6f);
        EXPECT_EQ(0, std::memcmp(inplace.data(), y.data(), y.size() * sizeof(float)));
      }
    }
}

// The fused residual add + norm is the add (plain f32 sums, computed here) then rms_norm, bit for
// bit, on every ISA and on the threaded path; and within the norm's tolerance of float64.
TEST_F(CpuOps, AddRmsNormIsTheAddThenTheNorm) {
  std::mt19937_64 rng(22);
  for (int64_t rows : {1, 5, 16, 40})
    for (int64_t n : {1, 7, 33, 2048}) {
      const auto h0 = randn(rows * n, rng, 3.0f, 0.5f), x = randn(rows * n, rng, 2.0f);
      const auto w = randn(n, rng, 0.2f, 1.0f);
      std::vector<float> sum(rows * n);
      std::vector<double> exact(rows * n), ref, scale;
      for (int64_t i = 0; i < rows * n; ++i) sum[i] = h0[i] + x[i], exact[i] = static_cast<double>(h0[i]) + x[i];
      rms_norm_f64(exact, w, rows, n, ref, scale);
      for (Isa isa : sweep.isas()) {
        cpu::force_isa(isa);
        const std::string at = fmt::format("add_rms_norm {}x{} {}", rows, n, cpu::isa_name(isa));
        std::vector<float> h = h0, y(rows * n, kNaN), y_pair(rows * n, kNaN);
        ops->add_rms_norm(h.data(), x.data(), w.data(), y.data(), rows, n, 1e-6f);
        ops->rms_norm(sum.data(), w.data(), y_pair.data(), rows, n, 1e-6f);
        EXPECT_EQ(0, std::memcmp(h.data(), sum.data(), h.size() * sizeof(float))) << at;
        EXPECT_EQ(0, std::memcmp(y.data(), y_pair.data(), y.size() * sizeof(float))) << at;
        expect_close(y, ref, scale, 1e-5, at);
      }
    }
  std::vector<float> buf(8, 0.0f);
  expect_error([&] { ops->add_rms_norm(buf.data(), buf.data(), buf.data(), buf.data(), -1, 8, 1e-6f); },
               {"add_rms_norm: bad shape"});
}

TEST_F(CpuOps, HeadNormRopeMatchesFloat64) {
  std::mt19937_64 rng(22);
  for (int64_t d : {8, 64, 128})
    for (int64_t rows : {3, 17, 600}) {  // 600 x 4 heads x 128 crosses the threading threshold
      const int64_t heads = 4;
      const double theta = d == 64 ? 10000.0 : 1000000.0;
      const auto x0 = randn(rows * heads * d, rng, 2.0f);
      const auto w = randn(d, rng, 0.3f, 1.0f);
      std::vector<int64_t> pos(rows);
      for (int64_t r = 0; r < rows; ++r) pos[r] = static_cast<int64_t>(rng() % 200000);
      std::vector<double> ref(x0.size()), scale(x0.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < heads; ++h) {
          const float* xh = x0.data() + (r * heads + h) * d;
          double ss = 0;
          for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xh[i]) * xh[i];
          const double inv = 1.0 / std::sqrt(ss / d + 1e-6);
          std::vector<double> nrm(d);
          for (int64_t i = 0; i < d; ++i) nrm[i] = w[i] * xh[i] * inv;
          for (int64_t i = 0; i < d / 2; ++i) {
            const double angle = pos[r] * std::pow(theta, -2.0 * i / d);
            const double c = std::cos(angle), s = std::sin(angle);
            const size_t o = (r * heads + h) * d;
            ref[o + i] = nrm[i] * c - nrm[i + d / 2] * s;
            ref[o + i + d / 2] = nrm[i + d / 2] * c + nrm[i] * s;
            scale[o + i] = scale[o + i + d / 2] = std::fabs(nrm[i]) + std::fabs(nrm[i + d / 2]);
          }
        }
      for (Isa isa : sweep.isas()) {
        cpu::force_isa(isa);
        std::vector<float> x = x0;
        ops->head_norm_rope(x.data(), w.data(), rows, heads, d, 1e-6f, pos.data(), theta);
        expect_close(x, ref, scale, 1e-5, fmt::format("head_norm_rope d={} rows={} {}", d, rows, cpu::isa_name(isa)));
      }
    }
}

// ------------------------------------------------------------------------------------------------
// attention

struct AttnCase {
  int64_t sessions, block, n_q, n_kv, d;
  bool causal;
  int64_t window;
  std::vector<int64_t> ctx_len, begin, capacity, anchor_gap;  // per session; anchor = end + gap
};

// How the context is held and what the float64 reference reads: with a bf16 cache either the
// values the kernel reads (the rounded ones: f32 arithmetic is all that differs) or the f32 values
// before rounding (the cache's own error).
struct AttnCheck {
  DType kv = DType::F32;
  bool reference_before_rounding = false;
  double tol = 2e-5;
};

// Checks the kernel against float64 for every kernel family; returns the largest error seen
// (normalised as expect_close does).
double check_attention(Ops& ops, const AttnCase& c, std::mt19937_64& rng, const IsaSweep& sweep,
                       const AttnCheck& how = {}) {
  const int64_t S = c.sessions, B = c.block, D = c.d, row_q = c.n_q * D, row_kv = c.n_kv * D;
  const auto q = randn(S * B * row_q, rng), k = randn(S * B * row_kv, rng), v = randn(S * B * row_kv, rng);
  std::vector<std::vector<float>> ck(S), cv(S);
  std::vector<ContextView> views(S);
  std::vector<int64_t> anchors(S);
  for (int64_t s = 0; s < S; ++s) {
    // Slots that hold no valid position are NaN: reading one poisons the output.
    ck[s].assign(c.capacity[s] * row_kv, kNaN);
    cv[s].assign(c.capacity[s] * row_kv, kNaN);
    const int64_t end = c.begin[s] + c.ctx_len[s];
    for (int64_t p = c.begin[s]; p < end; ++p) {
      const auto kr = randn(row_kv, rng), vr = randn(row_kv, rng);
      std::copy(kr.begin(), kr.end(), ck[s].begin() + (p % c.capacity[s]) * row_kv);
      std::copy(vr.begin(), vr.end(), cv[s].begin() + (p % c.capacity[s]) * row_kv);
    }
    views[s] = {ck[s].data(), cv[s].data(), c.capacity[s], c.begin[s], end};
    anchors[s] = std::max<int64_t>(0, end + c.anchor_gap[s]);
  }
  // A bf16 cache: the rings rounded (NaN slots stay NaN), read by the kernel through the views.
  std::vector<std::vector<uint8_t>> k16(S), v16(S);
  if (how.kv == DType::BF16)
    for (int64_t s = 0; s < S; ++s) {
      std::vector<float> kw, vw;
      k16[s] = make_weights(DType::BF16, ck[s], how.reference_before_rounding ? nullptr : &kw);
      v16[s] = make_weights(DType::BF16, cv[s], how.reference_before_rounding ? nullptr : &vw);
      if (!how.reference_before_rounding) ck[s].swap(kw), cv[s].swap(vw);
    }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<double> ref(S * B * row_q), mag(ref.size());
  for (int64_t s = 0; s < S; ++s)
    for (int64_t r = 0; r < B; ++r)
      for (int64_t h = 0; h < c.n_q; ++h) {
        const int64_t g = h / (c.n_q / c.n_kv), qp = anchors[s] + r;
        const float* qv = q.data() + ((s * B + r) * c.n_q + h) * D;
        std::vector<std::pair<double, const float*>> keys;  // (score, v row)
        auto visible = [&](int64_t kp) {
          if (c.causal && kp > qp) return false;
          if (c.window > 0 && qp - kp >= c.window) return false;
          if (c.window > 0 && !c.causal && kp - qp >= c.window) return false;
          return true;
        };
        auto add_key = [&](const float* kr, const float* vr) {
          double dot = 0;
          for (int64_t i = 0; i < D; ++i) dot += static_cast<double>(qv[i]) * kr[i];
          keys.push_back({dot * scale, vr});
        };
        for (int64_t p = views[s].begin; p < views[s].end; ++p)
          if (p < anchors[s] && visible(p)) {
            const int64_t slot = p % c.capacity[s];
            add_key(ck[s].data() + slot * row_kv + g * D, cv[s].data() + slot * row_kv + g * D);
          }
        for (int64_t j = 0; j < B; ++j)
          if (visible(anchors[s] + j))
            add_key(k.data() + ((s * B + j) * c.n_kv + g) * D, v.data() + ((s * B + j) * c.n_kv + g) * D);
        double mx = -1e300, sum = 0;
        for (auto& kv : keys) mx = std::max(mx, kv.first);
        for (auto& kv : keys) sum += std::exp(kv.first - mx);
        const size_t o = ((s * B + r) * c.n_q + h) * D;
        for (auto& kv : keys) {
          const double pr = std::exp(kv.first - mx) / sum;
          for (int64_t i = 0; i < D; ++i) {
            ref[o + i] += pr * kv.second[i];
            mag[o + i] += pr * std::fabs(kv.second[i]);
          }
        }
        for (int64_t i = 0; i < D; ++i) mag[o + i] += 1.0;  // scores' rounding moves weights by ~1e-6
      }
  AttentionParams p;
  p.q = q.data(), p.k = k.data(), p.v = v.data();
  p.sessions = S, p.block = B, p.n_q = c.n_q, p.n_kv = c.n_kv, p.head_dim = D;
  p.anchor = anchors.data(), p.context = views.data(), p.causal = c.causal, p.window = c.window, p.scale = scale;
  p.max_context = *std::max_element(c.ctx_len.begin(), c.ctx_len.end());
  p.kv_dtype = how.kv;
  if (how.kv == DType::BF16)
    for (int64_t s = 0; s < S; ++s)
      views[s].k = reinterpret_cast<const float*>(k16[s].data()), views[s].v = reinterpret_cast<const float*>(v16[s].data());
  double worst = 0;
  for (Isa isa : sweep.isas()) {
    cpu::force_isa(isa);
    std::vector<float> out(ref.size(), kNaN);
    p.out = out.data();
    ops.attention(p);
    worst = std::max(worst, expect_close(out, ref, mag, how.tol,
                                         fmt::format("attention S={} B={} nq={} nkv={} D={} causal={} window={} {} {}",
                                                     S, B, c.n_q, c.n_kv, D, c.causal, c.window, dtype_name(how.kv),
                                                     cpu::isa_name(isa))));
  }
  return worst;
}

TEST_F(CpuOps, AttentionMatchesFloat64) {
  std::mt19937_64 rng(31);
  // Contexts of 0, 1, 17 and 300 rows; session 3's ring wrapped (begin 250, capacity 320);
  // session 2's anchor sits inside its context (positions >= anchor must stay invisible).
  const std::vector<int64_t> len{0, 1, 17, 300}, begin{0, 4, 30, 250}, cap{8, 8, 64, 320}, gap{0, 0, -5, 0};
  for (bool causal : {false, true})
    for (int64_t window : {0, 3, 40})
      for (auto [nq, nkv] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {8, 2}})
        for (DType kv : {DType::F32, DType::BF16})
          check_attention(*ops, {4, 6, nq, nkv, 64, causal, window, len, begin, cap, gap}, rng, sweep, {kv});
}

// Contexts long enough to be cut into chunks that several threads run and merge, with a wrapped
// ring and an anchor inside the context, for every mask kind, on 1, 2 and 4 threads, with f32 and
// bf16 caches.
TEST_F(CpuOps, AttentionLongContextsSplitAcrossThreadsMatchFloat64) {
  std::mt19937_64 rng(33);
  struct Kind {
    bool causal;
    int64_t window;
  };
  for (int threads : {1, 2, 4}) {
    auto ops_t = make_cpu_ops(threads);
    for (const Kind k : {Kind{true, 0}, Kind{false, 2000}, Kind{false, 0}, Kind{true, 1500}})
      for (DType kv : {DType::F32, DType::BF16})
        check_attention(*ops_t, {2, 16, 8, 2, 64, k.causal, k.window, {2600, 1100}, {1500, 0}, {2700, 1100}, {0, -9}},
                        rng, sweep, {kv});
  }
}

// A session's rows are the same bits whether it is attended alone or in a batch with sessions
// of other lengths, on any number of threads: the chunks and tiles follow its own positions.
TEST_F(CpuOps, AttentionRowsDoNotDependOnTheBatchOrThreads) {
  std::mt19937_64 rng(35);
  const int64_t B = 16, nq = 8, nkv = 2, D = 64, row_q = nq * D, row_kv = nkv * D;
  const std::vector<int64_t> len{5000, 300, 2600}, cap{5200, 320, 2700}, begin{700, 0, 2000};
  const int64_t S = static_cast<int64_t>(len.size());
  const auto q = randn(S * B * row_q, rng), k = randn(S * B * row_kv, rng), v = randn(S * B * row_kv, rng);
  std::vector<std::vector<float>> ck(S), cv(S);
  std::vector<std::vector<uint8_t>> k16(S), v16(S);
  std::vector<ContextView> views(S);
  std::vector<int64_t> anchors(S);
  for (int64_t s = 0; s < S; ++s) {
    ck[s] = randn(cap[s] * row_kv, rng), cv[s] = randn(cap[s] * row_kv, rng);
    k16[s] = make_weights(DType::BF16, ck[s], nullptr), v16[s] = make_weights(DType::BF16, cv[s], nullptr);
    anchors[s] = begin[s] + len[s];
  }
  for (Isa isa : sweep.isas())
    for (const int64_t window : {int64_t{0}, int64_t{2000}})
      for (const DType kv : {DType::F32, DType::BF16}) {
        cpu::force_isa(isa);
        // Sessions [first, first + count) of the batch on `threads` threads: their output rows.
        auto run = [&](int threads, int64_t first, int64_t count) {
          for (int64_t s = 0; s < S; ++s) {
            const bool b16 = kv == DType::BF16;
            views[s] = {b16 ? reinterpret_cast<const float*>(k16[s].data()) : ck[s].data(),
                        b16 ? reinterpret_cast<const float*>(v16[s].data()) : cv[s].data(), cap[s], begin[s],
                        begin[s] + len[s]};
          }
          auto ops_t = make_cpu_ops(threads);
          AttentionParams p;
          p.q = q.data() + first * B * row_q, p.k = k.data() + first * B * row_kv, p.v = v.data() + first * B * row_kv;
          p.sessions = count, p.block = B, p.n_q = nq, p.n_kv = nkv, p.head_dim = D;
          p.anchor = anchors.data() + first, p.context = views.data() + first;
          p.causal = window > 0, p.window = window, p.scale = 0.125f, p.kv_dtype = kv;
          p.max_context = *std::max_element(len.begin() + first, len.begin() + first + count);
          std::vector<float> out(static_cast<size_t>(count * B * row_q), kNaN);
          p.out = out.data();
          ops_t->attention(p);
          return out;
        };
        const std::vector<float> batch = run(2, 0, S);
        for (int64_t s = 0; s < S; ++s)
          for (int threads : {1, 3}) {
            const std::vector<float> alone = run(threads, s, 1);
            const auto* from = batch.data() + s * B * row_q;
            EXPECT_EQ(0, std::memcmp(alone.data(), from, alone.size() * sizeof(float)))
                << "session " << s << " alone on " << threads << " thread(s), window " << window << ", "
                << dtype_name(kv) << ", " << cpu::isa_name(isa);
          }
      }
}

// A bf16 cache against float64 of the f32 values it rounded: the bound docs/model.md gives.
TEST_F(CpuOps, AttentionBf16CacheErrorIsBounded) {
  std::mt19937_64 rng(34);
  double worst = 0;
  for (bool causal : {false, true})
    for (int64_t window : {0, 40})
      worst = std::max(worst, check_attention(*ops, {2, 16, 8, 2, 128, causal, window, {300, 1500}, {0, 100},
                                                     {320, 1600}, {0, 0}},
                                              rng, sweep, {DType::BF16, true, 5e-3}));
  RecordProperty("bf16_cache_error", fmt::format("{:.2e}", worst));
  // The cache must not be a silent f32 one either: rounding K and V moves the output.
  EXPECT_GT(worst, 1e-5);
}

TEST_F(CpuOps, AttentionOddHeadDimAndLongBlock) {
  auto ops3 = make_cpu_ops(3);
  std::mt19937_64 rng(32);
  check_attention(*ops3, {2, 16, 6, 3, 40, true, 0, {33, 70}, {0, 10}, {64, 80}, {0, 0}}, rng, sweep);
  check_attention(*ops3, {1, 16, 16, 4, 128, false, 20, {300}, {100}, {320}, {0}}, rng, sweep);
  check_attention(*ops3, {1, 4, 2, 1, 16, false, 0, {0}, {0}, {1}, {0}}, rng, sweep);
  check_attention(*ops3, {2, 16, 6, 3, 40, true, 0, {33, 70}, {0, 10}, {64, 80}, {0, 0}}, rng, sweep, {DType::BF16});
  check_attention(*ops3, {1, 8, 4, 2, 20, false, 5, {50}, {0}, {64}, {0}}, rng, sweep, {DType::BF16});
}

// ------------------------------------------------------------------------------------------------
// dyn_conv and the elementwise ops

TEST_F(CpuOps, DynConvMatchesFloat64) {
  std::mt19937_64 rng(41);
  const int64_t S = 2, B = 5, H = 48;
  for (int64_t kernel : {1, 2, 3})
    for (int64_t gs : {1, 16, 48})
      for (int64_t offset_taps : {0, 1}) {
        const int64_t G = H / gs, offset = offset_taps * kernel * G, stride = 2 * kernel * G + 3;
        const auto in = randn(S * B * H, rng), base = randn(kernel * H, rng, 0.5f);
        const auto delta = randn(S * B * stride, rng, 0.5f);
        std::vector<double> ref(S * B * H), mag(ref.size());
        for (int64_t s = 0; s < S; ++s)
          for (int64_t t = 0; t < B; ++t)
            for (int64_t ch = 0; ch < H; ++ch)
              for (int64_t j = 0; j < kernel && j <= t; ++j) {
                const double coef = base[j * H + ch] + delta[(s * B + t) * stride + offset + j * G + ch / gs];
                const double term = coef * in[(s * B + t - j) * H + ch];
                ref[(s * B + t) * H + ch] += term;
                mag[(s * B + t) * H + ch] += std::fabs(term) + std::fabs(in[(s * B + t - j) * H + ch]);
              }
        ConvParams p;
        p.in = in.data(), p.base = base.data(), p.delta = delta.data();
        p.delta_stride = stride, p.delta_offset = offset;
        p.sessions = S, p.block = B, p.hidden = H, p.kernel = kernel, p.group_size = gs;
        for (Isa isa : sweep.isas()) {
          cpu::force_isa(isa);
          std::vector<float> out(ref.size(), kNaN);
          p.out = out.data();
          ops->dyn_conv(p);
          expect_close(out, ref, mag, 1e-6, fmt::format("dyn_conv K={} gs={} {}", kernel, gs, cpu::isa_name(isa)));
        }
      }
}

TEST_F(CpuOps, SiluMulStoreRows) {
  std::mt19937_64 rng(51);
  for (int64_t n : {1, 15, 16, 17, 1000, 300000}) {
    auto gate = randn(n, rng, 4.0f);
    if (n > 4) gate[0] = -100.0f, gate[1] = 100.0f, gate[2] = 0.0f, gate[3] = -30.0f;  // tails of exp
    const auto up = randn(n, rng);
    std::vector<double> ref(n), mag(n);
    for (int64_t i = 0; i < n; ++i) {
      ref[i] = gate[i] / (1.0 + std::exp(-static_cast<double>(gate[i]))) * up[i];
      mag[i] = std::fabs(ref[i]) + 1e-30;
    }
    for (Isa isa : sweep.isas()) {
      cpu::force_isa(isa);
      std::vector<float> out(n, kNaN);
      ops->silu_mul(gate.data(), up.data(), out.data(), n);
      expect_close(out, ref, mag, 1e-6, fmt::format("silu_mul n={} {}", n, cpu::isa_name(isa)));
    }
  }
  // Ring writes wrap: 4 rows from position 13 into 5 slots land in slots 3, 4, 0, 1.
  const int64_t len = 3, cap = 5;
  const auto src = randn(4 * len, rng);
  std::vector<float> ring(cap * len, -7.0f);
  ops->store_rows(src.data(), 4, len, ring.data(), cap, 13);
  const int64_t slot_of_row[4] = {3, 4, 0, 1};
  for (int64_t j = 0; j < 4; ++j)
    for (int64_t c = 0; c < len; ++c) EXPECT_EQ(ring[slot_of_row[j] * len + c], src[j * len + c]);
  for (int64_t c = 0; c < len; ++c) EXPECT_EQ(ring[2 * len + c], -7.0f);  // untouched slot
}

// A gather by a table: every destination row is the indexed source row, repeats included.
TEST_F(CpuOps, GatherRows) {
  auto ops1 = make_cpu_ops(1);
  std::mt19937_64 rng(52);
  const int64_t len = 37;
  const auto src = randn(4 * len, rng);
  const std::vector<int64_t> index = {2, 3, 3, 3, 0, 3, 1, 2};
  std::vector<float> dst(index.size() * len, kNaN);
  ops1->gather_rows(src.data(), index.data(), static_cast<int64_t>(index.size()), len, dst.data());
  for (size_t r = 0; r < index.size(); ++r)
    for (int64_t c = 0; c < len; ++c) ASSERT_EQ(dst[r * len + c], src[index[r] * len + c]) << "row " << r;
  ops1->gather_rows(nullptr, nullptr, 0, len, nullptr);  // nothing to do is fine
}

// ------------------------------------------------------------------------------------------------
// head

struct HeadCase {
  DType dtype;
  int64_t vocab, valid, h, m;
  float scale, cap;
  int k;
};

// A head whose rows are realistic (N(0, 0.02)) with engineered near-ties: exact duplicates of
// strong rows at higher ids (equal logits: the lower id must come first), rows differing from a
// strong row in one low bit, and a dominant direction so many rows crowd the top.
std::vector<float> tied_head(const HeadCase& c, const std::vector<float>& g, std::mt19937_64& rng) {
  auto w = randn(c.vocab * c.h, rng, 0.02f);
  for (int64_t v = 0; v < c.vocab; v += 7)  // every 7th row leans toward input row 0
    for (int64_t i = 0; i < c.h; ++i) w[v * c.h + i] += 0.004f * g[i];
  for (int64_t v = 10; v + 40 < c.vocab; v += 97) {
    std::copy(w.begin() + v * c.h, w.begin() + (v + 1) * c.h, w.begin() + (v + 31) * c.h);
    std::copy(w.begin() + v * c.h, w.begin() + (v + 1) * c.h, w.begin() + (v + 40) * c.h);
    w[(v + 40) * c.h + 3] = std::nextafter(w[(v + 40) * c.h + 3], 1.0f);
  }
  return w;
}

void check_head(Ops& ops, const HeadCase& c, std::mt19937_64& rng, const IsaSweep& sweep) {
  const auto g = randn(c.m * c.h, rng, 1.0f);
  std::vector<float> wide;
  const auto raw = make_weights(c.dtype, tied_head(c, g, rng), &wide);
  HeadParams p;
  p.head = {c.dtype, c.vocab, c.h, raw.data()};
  p.g = g.data(), p.m = c.m, p.valid_rows = c.valid, p.scale = c.scale, p.cap = c.cap;
  // float64 logits for head_logits' accuracy.
  std::vector<double> ref(c.m * c.valid), mag(ref.size());
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t v = 0; v < c.valid; ++v) {
      double dot = 0, a = 0;
      for (int64_t t = 0; t < c.h; ++t) {
        dot += static_cast<double>(wide[v * c.h + t]) * g[i * c.h + t];
        a += std::fabs(static_cast<double>(wide[v * c.h + t]) * g[i * c.h + t]);
      }
      const double x = c.scale * dot;
      ref[i * c.valid + v] = c.cap > 0 ? c.cap * std::tanh(x / c.cap) : x;
      mag[i * c.valid + v] = c.scale * a + std::fabs(ref[i * c.valid + v]);
    }
  const int64_t id_base = 1000;
  for (Isa isa : sweep.isas()) {
    cpu::force_isa(isa);
    const std::string what = fmt::format("head {} V={} valid={} H={} m={} cap={} k={} {}", dtype_name(c.dtype), c.vocab,
                                         c.valid, c.h, c.m, c.cap, c.k, cpu::isa_name(isa));
    std::vector<float> logits(c.m * c.valid, kNaN);
    ops.head_logits(p, logits.data());
    expect_close(logits, ref, mag, 2e-6, what);
    std::vector<float> values(c.m * c.k, kNaN);
    std::vector<int64_t> ids(c.m * c.k, -2);
    ops.head_topk(p, c.k, id_base, values.data(), ids.data());
    const TopK want = sorted_top(logits, c.m, c.valid, c.k, id_base);
    for (size_t e = 0; e < ids.size(); ++e) {
      ASSERT_EQ(ids[e], want.ids[e]) << what << " row " << e / c.k << " rank " << e % c.k;
      ASSERT_EQ(0, std::memcmp(&values[e], &want.values[e], sizeof(float)))
          << what << " row " << e / c.k;
    }
  }
}

TEST_F(CpuOps, HeadLogitsAndTopkExact) {
  std::mt19937_64 rng(61);
  for (DType dt : {DType::BF16, DType::F32, DType::F16})
    for (int k : {1, 16}) {
      check_head(*ops, {dt, 3000, 3000, 256, 15, 0.25f, 0.0f, k}, rng, sweep);
      check_head(*ops, {dt, 2100, 1990, 100, 3, 1.0f, 30.0f, k}, rng, sweep);  // padded slice, cap
    }
  // A small cap saturates tanh: distinct dots share one logit and the lower id must win.
  check_head(*ops, {DType::BF16, 1500, 1500, 64, 4, 40.0f, 0.5f, 16}, rng, sweep);
  // Fewer valid rows than k: the rest is -inf with id -1.
  check_head(*ops, {DType::BF16, 40, 5, 32, 2, 1.0f, 0.0f, 16}, rng, sweep);
  check_head(*ops, {DType::F32, 40, 0, 32, 2, 1.0f, 0.0f, 4}, rng, sweep);
}

TEST_F(CpuOps, HeadTopkDraftGeometry) {
  std::mt19937_64 rng(62);
  check_head(*ops, {DType::BF16, 4099, 4099, 2048, 15, 0.196f, 0.0f, 16}, rng, sweep);
  check_head(*ops, {DType::BF16, 1000, 999, 2050, 2, 0.196f, 20.0f, 1}, rng, sweep);
}

// Rows built from the input's bf16 rounding residual e = g - bf16(g). "Hidden" rows
// c g_hi/|g_hi| + K e_perp/|e_perp| (e_perp: e without its g_hi component) look to a bf16 copy of
// g about K |e_perp| smaller than they are, nearly the whole screening bound; "plain" rows along
// g_hi, with tight bounds, sit just below the hidden ones. A bound 20% tighter than the rigorous
// one would let the plain rows' lower bounds push the true top rows out of the candidates.
TEST_F(CpuOps, HeadTopkSurvivesAdversarialRounding) {
  std::mt19937_64 rng(64);
  const int64_t h = 512, plain = 30, hidden = 20, fillers = 300, vocab = plain + hidden + fillers;
  const int k = 16;
  const auto g = randn(h, rng);
  std::vector<double> dir(h), e(h);  // g_hi / |g_hi| and e_perp / |e_perp|
  double hn = 0, eh = 0, en = 0;
  for (int64_t i = 0; i < h; ++i) dir[i] = bf16_to_f32(f32_to_bf16(g[i])), hn += dir[i] * dir[i];
  hn = std::sqrt(hn);
  for (int64_t i = 0; i < h; ++i) dir[i] /= hn, e[i] = g[i] - dir[i] * hn, eh += e[i] * dir[i];
  for (int64_t i = 0; i < h; ++i) e[i] -= eh * dir[i], en += e[i] * e[i];
  en = std::sqrt(en);
  for (auto& x : e) x /= en;
  const double big = 10.0;
  // A row as stored (bf16) and its exact dot with g; `jitter` spreads rows bf16 rounding would
  // otherwise snap to a few values.
  std::normal_distribution<double> jitter(0.0, 1e-4);
  auto make_row = [&](double c, double along_e, float* out) {
    double dot = 0;
    for (int64_t i = 0; i < h; ++i) {
      out[i] = bf16_to_f32(f32_to_bf16(static_cast<float>(c * dir[i] + along_e * e[i] + jitter(rng))));
      dot += static_cast<double>(out[i]) * g[i];
    }
    return dot;
  };
  auto w = randn(vocab * h, rng, 0.02f);
  double top_plain = -1e300;
  for (int64_t j = 0; j < plain; ++j) top_plain = std::max(top_plain, make_row(1.0, 0.0, &w[j * h]));
  // Hidden rows 0.05% .. 2% of the bound above the plain ones: scan c across the crossing.
  std::vector<float> row(h);
  int64_t placed = 0;
  for (int tries = 0; placed < hidden && tries < 200000; ++tries) {
    const double c = 1.0 - big * en / hn + 1e-5 * static_cast<double>(tries % 200 - 100);
    const double gap = make_row(c, big, row.data()) - top_plain;
    if (gap > 0.0005 * big * en && gap < 0.02 * big * en) {
      std::copy(row.begin(), row.end(), w.begin() + (plain + placed) * h);
      ++placed;
    }
  }
  ASSERT_EQ(placed, hidden);
  const auto raw = make_weights(DType::BF16, w);
  HeadParams p;
  p.head = {DType::BF16, vocab, h, raw.data()};
  p.g = g.data(), p.m = 1, p.valid_rows = vocab, p.scale = 1.0f;
  for (Isa isa : sweep.isas()) {
    cpu::force_isa(isa);
    std::vector<float> logits(vocab, kNaN), values(k, kNaN);
    std::vector<int64_t> ids(k, -2);
    ops->head_logits(p, logits.data());
    ops->head_topk(p, k, 0, values.data(), ids.data());
    const TopK want = sorted_top(logits, 1, vocab, k, 0);
    for (int j = 0; j < k; ++j) {
      ASSERT_EQ(ids[j], want.ids[j]) << cpu::isa_name(isa) << " rank " << j;
      ASSERT_EQ(values[j], want.values[j]);
    }
  }
}

// A second head at the same address with the same shape must not reuse cached row norms.
TEST_F(CpuOps, HeadTopkAfterHeadContentsChange) {
  std::mt19937_64 rng(63);
  const HeadCase c{DType::BF16, 800, 800, 64, 2, 1.0f, 0.0f, 8};
  auto g = randn(c.m * c.h, rng);
  std::vector<uint16_t> head(c.vocab * c.h);
  for (int round = 0; round < 2; ++round) {
    const auto w = randn(c.vocab * c.h, rng, round == 0 ? 0.001f : 0.5f);
    convert_from_f32(DType::BF16, w.data(), head.data(), w.size());
    HeadParams p;
    p.head = {DType::BF16, c.vocab, c.h, head.data()};
    p.g = g.data(), p.m = c.m, p.valid_rows = c.valid, p.scale = 1.0f;
    std::vector<float> logits(c.m * c.valid), values(c.m * c.k);
    std::vector<int64_t> ids(c.m * c.k);
    ops->head_logits(p, logits.data());
    ops->head_topk(p, c.k, 0, values.data(), ids.data());
    for (int64_t i = 0; i < c.m; ++i) {
      const float* row = logits.data() + i * c.valid;
      const float best = *std::max_element(row, row + c.valid);
      EXPECT_EQ(values[i * c.k], best);
      EXPECT_EQ(row[ids[i * c.k]], best);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// errors a caller can meet

TEST_F(CpuOps, BadArgumentsAreNamed) {
  expect_error([] { make_cpu_ops(-1); }, {"thread count"});
  std::vector<float> buf(64, 0.0f);
  std::vector<int64_t> ids(4);
  expect_error([&] { ops->matmul({DType::I32, 2, 2, buf.data()}, buf.data(), 1, buf.data()); },
               {"not F32, F16 or BF16"});
  expect_error([&] { ops->matmul({DType::F32, 0, 2, buf.data()}, buf.data(), 1, buf.data()); }, {"empty weight"});
  expect_error([&] { ops->rms_norm(buf.data(), buf.data(), buf.data(), 1, 0, 1e-6f); }, {"rms_norm"});
  int64_t pos = 0;
  expect_error([&] { ops->head_norm_rope(buf.data(), buf.data(), 1, 1, 3, 1e-6f, &pos, 1e4); },
               {"head_dim must be even"});
  expect_error([&] { ops->head_norm_rope(buf.data(), buf.data(), 1, 1, 4, 1e-6f, &pos, 0.0); }, {"rope theta"});
  AttentionParams a;
  ContextView view{buf.data(), buf.data(), 2, 0, 3};
  int64_t anchor = 3;
  a.q = a.k = a.v = buf.data(), a.out = buf.data(), a.sessions = 1, a.block = 1, a.n_q = 3, a.n_kv = 2, a.head_dim = 4;
  a.anchor = &anchor, a.context = &view, a.max_context = 3;
  expect_error([&] { ops->attention(a); }, {"not a multiple of n_kv"});
  a.n_q = 2;
  expect_error([&] { ops->attention(a); }, {"does not fit its ring"});
  view.capacity = 4, a.max_context = 2;
  expect_error([&] { ops->attention(a); }, {"holds 3 context positions, more than max_context 2"});
  a.max_context = -1;
  expect_error([&] { ops->attention(a); }, {"max_context must be >= 0"});
  ConvParams c;
  c.in = buf.data(), c.out = buf.data() + 32, c.base = buf.data(), c.delta = buf.data();
  c.sessions = 1, c.block = 1, c.hidden = 6, c.kernel = 1, c.group_size = 4, c.delta_stride = 8;
  expect_error([&] { ops->dyn_conv(c); }, {"must be > 0 and divide hidden"});
  c.group_size = 3, c.delta_stride = 1;
  expect_error([&] { ops->dyn_conv(c); }, {"exceeds the delta row stride"});
  expect_error([&] { ops->store_rows(buf.data(), 1, 1, buf.data(), 0, 0); }, {"capacity must be > 0"});
  HeadParams h;
  h.head = {DType::F32, 4, 4, buf.data()}, h.g = buf.data(), h.m = 1, h.valid_rows = 5;
  expect_error([&] { ops->head_logits(h, buf.data()); }, {"valid rows 5 must be in [0, 4]"});
  h.valid_rows = 4;
  expect_error([&] { ops->head_topk(h, 0, 0, buf.data(), ids.data()); }, {"k must be >= 1"});
  h.scale = -1.0f;
  expect_error([&] { ops->head_topk(h, 1, 0, buf.data(), ids.data()); }, {"logit scale must be finite and > 0"});
  h.scale = 1.0f, h.cap = -1.0f;
  expect_error([&] { ops->head_topk(h, 1, 0, buf.data(), ids.data()); }, {"soft cap"});
}

// Capture records calls and runs nothing; replay runs them with the arguments of the capture but
// reads memory as it is at replay time (as a CUDA graph does).
TEST_F(CpuOps, CaptureDefersAndReplayReadsMemoryThen) {
  auto ops1 = make_cpu_ops(1);
  std::mt19937_64 rng(77);
  const int64_t rows = 3, heads = 2, d = 8;
  std::vector<float> x = randn(rows * heads * d, rng), w = randn(d, rng);
  std::vector<float> y(x.size(), 1.0f);
  std::vector<int64_t> pos{5, 6, 7};
  const std::vector<float> x0 = x;
  std::vector<float> normed(x.size());  // add_rms_norm's other output, unused here

  ops1->begin_capture();
  ops1->add_rms_norm(y.data(), x.data(), w.data(), normed.data(), rows * heads, d, 1e-6f);
  ops1->head_norm_rope(y.data(), w.data(), rows, heads, d, 1e-6f, pos.data(), 1e4);
  // Argument checks run when an op is issued, capture or not.
  expect_error([&] { ops1->add_rms_norm(y.data(), x.data(), w.data(), normed.data(), -1, d, 1e-6f); },
               {"add_rms_norm: bad shape"});
  expect_error([&] { ops1->sync(); }, {"sync during a capture"});
  expect_error([&] { ops1->to_device(y.data(), x.data(), 4); }, {"to_device during a capture"});
  expect_error([&] { ops1->to_host(y.data(), x.data(), 4); }, {"to_host during a capture"});
  expect_error([&] { ops1->alloc(64); }, {"alloc during a capture"});
  expect_error([&] { ops1->begin_capture(); }, {"already running"});
  const auto graph = ops1->end_capture();
  EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 1.0f; })) << "capture ran an op";
  expect_error([&] { ops1->end_capture(); }, {"without begin_capture"});

  // The same two ops issued directly, on copies, are what each replay must give.
  auto expected = [&](const std::vector<float>& xs, const std::vector<float>& y_in, const std::vector<int64_t>& ps) {
    std::vector<float> out = y_in;
    std::vector<float> unused(xs.size());
    ops1->add_rms_norm(out.data(), xs.data(), w.data(), unused.data(), rows * heads, d, 1e-6f);
    ops1->head_norm_rope(out.data(), w.data(), rows, heads, d, 1e-6f, ps.data(), 1e4);
    return out;
  };
  const auto want1 = expected(x, y, pos);
  ops1->replay(*graph);
  EXPECT_EQ(y, want1);
  // New contents behind the same pointers: the replay uses them.
  for (auto& v : x) v *= -2.0f;
  pos = {100, 0, 31};
  const auto want2 = expected(x, y, pos);
  ops1->replay(*graph);
  EXPECT_EQ(y, want2);
  EXPECT_NE(want2, want1);

  // An aborted capture keeps nothing and leaves the ops running directly again.
  ops1->begin_capture();
  ops1->add_rms_norm(y.data(), x0.data(), w.data(), normed.data(), rows * heads, d, 1e-6f);
  ops1->abort_capture();
  ops1->abort_capture();  // harmless when no capture runs
  const auto before = y;
  ops1->add_rms_norm(y.data(), x0.data(), w.data(), normed.data(), rows * heads, d, 1e-6f);
  EXPECT_NE(y, before);
}

// Buffers may die while a capture unwinds from an error: release is put off until the capture
// ends, and what the capture recorded is unaffected.
TEST_F(CpuOps, ReleaseDuringCaptureWaitsForItsEnd) {
  auto ops1 = make_cpu_ops(1);
  for (bool abort : {false, true}) {
    auto* buf = static_cast<float*>(ops1->alloc(4 * sizeof(float)));
    std::vector<float> y{1, 2, 3, 4};
    const std::vector<float> x{1, 1, 1, 1};
    std::vector<float> normed(4);
    ops1->begin_capture();
    ops1->add_rms_norm(y.data(), x.data(), x.data(), normed.data(), 1, 4, 1e-6f);
    ops1->release(buf);
    buf[0] = 7.0f;  // still ours until the capture ends
    if (abort) {
      ops1->abort_capture();
      EXPECT_EQ(y, (std::vector<float>{1, 2, 3, 4}));
    } else {
      const auto g = ops1->end_capture();
      ops1->replay(*g);
      EXPECT_EQ(y, (std::vector<float>{2, 3, 4, 5}));
    }
  }
}

TEST_F(CpuOps, MemoryIsAlignedAndCopies) {
  auto ops1 = make_cpu_ops(1);
  EXPECT_STREQ(ops1->name(), "cpu");
  void* p = ops1->alloc(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  const std::vector<float> src{1, 2, 3, 4};
  std::vector<float> back(4, 0);
  ops1->to_device(p, src.data(), 16);
  ops1->sync();
  ops1->to_host(back.data(), p, 16);
  EXPECT_EQ(back, src);
  ops1->release(p);
  auto* big = static_cast<unsigned char*>(ops1->alloc(5 << 20));  // weights-sized: huge-page path
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big) % 64, 0u);
  big[0] = 1, big[(5 << 20) - 1] = 2;
  EXPECT_EQ(big[0] + big[(5 << 20) - 1], 3);
  ops1->release(big);
  EXPECT_EQ(cpu::force_isa(Isa::Scalar), Isa::Scalar);
  EXPECT_EQ(cpu::active_isa(), Isa::Scalar);
  EXPECT_EQ(cpu::force_isa(Isa::Avx512Bf16), cpu::detected_isa());
}

}  // namespace
}  // namespace tpdraft::kernels
