// The CUDA backend's ops against the CPU backend's (the twins) on fresh random inputs: outputs
// poisoned with NaN first, normalised mean squared error per dtype, NaN never passes. Attention
// (both kernels, simt and mma) at context lengths 0 .. 70000 with windows and ring wrap; head_topk equal to sorted
// head_logits (and to the CPU twin's head_topk where the logits agree). Every test skips itself, with the reason, where there is no CUDA device; the
// backend factory's errors are checked in every build.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "kernels/backend.h"
#include "support/test_support.h"

namespace tpdraft::kernels {
namespace {

TEST(Backend, FactoryNamesWhatIsMissing) {
  EXPECT_NE(make_ops("cpu", 1, 0), nullptr);
  testing::expect_error([] { make_ops("tpu", 1, 0); }, {"unknown backend 'tpu'"});
  EXPECT_EQ(default_backend(), cuda_device_available() ? "cuda" : "cpu");
  EXPECT_STREQ(make_ops("auto", 1, 0)->name(), default_backend().c_str());
  if (cuda_device_available()) {
    EXPECT_THROW(make_ops("cuda", 1, -1), Error);
    // A rank's place on its machine wraps around the devices.
    EXPECT_STREQ(make_ops("cuda", 1, cuda_devices())->name(), "cuda");
    return;
  }
  const std::string what = testing::error_of([] { make_ops("cuda", 1, 0); });
  EXPECT_TRUE(what.find("no CUDA device") != std::string::npos || what.find("built without") != std::string::npos)
      << "the cuda backend without a device: '" << what << "'";
}

}  // namespace
}  // namespace tpdraft::kernels

#ifdef TPDRAFT_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "kernels/buffer.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/kernel_cases.h"
#include "kernels/ops.h"

namespace tpdraft::kernels {
namespace {

// f32 work differs only in summation order; 16-bit weights see activations split into two
// 16-bit parts (~2^-16 relative), or one (~2^-9) under TPDRAFT_CUDA_MATMUL=single.
constexpr double kF32Nmse = 1e-10;
constexpr double kMmaAttentionNmse = 1e-4;
double half_nmse() {
  const char* mode = std::getenv("TPDRAFT_CUDA_MATMUL");
  return mode != nullptr && std::string(mode) == "single" ? 1e-4 : 1e-8;
}

// sum (got - want)^2 / sum want^2; every element of got must be finite.
void expect_nmse(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double num = 0, den = 0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) {
      if (bad++ < 3) ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i];
      continue;
    }
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  EXPECT_EQ(bad, 0u) << what << ": non-finite values";
  EXPECT_LE(num / std::max(den, 1e-300), tol) << what;
}

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device on this machine: the CUDA backend cannot run here";
    cpu = make_cpu_ops(2);
    gpu = std::make_unique<cuda::CudaOps>(0);  // the class itself: tests pick its attention kernel
  }
  std::unique_ptr<Ops> cpu;
  std::unique_ptr<cuda::CudaOps> gpu;
  std::mt19937_64 rng{1234};
};

// Weights [rows, cols] in `dtype` (raw bytes), uploaded to both backends.
struct TwinMatrix {
  Buffer c, g;
  Matrix on_cpu, on_gpu;
};
TwinMatrix twin_matrix(Ops& cpu, Ops& gpu, DType dtype, int64_t rows, int64_t cols, const std::vector<float>& values) {
  std::vector<uint8_t> raw(values.size() * dtype_size(dtype));
  convert_from_f32(dtype, values.data(), raw.data(), values.size());
  TwinMatrix t{put(cpu, raw), put(gpu, raw)};
  t.on_cpu = {dtype, rows, cols, t.c.get()};
  t.on_gpu = {dtype, rows, cols, t.g.get()};
  return t;
}

// ---- matmul, norms, element-wise ----------------------------------------------------------------

TEST_F(CudaOpsTest, MatmulEveryDtypeAndShape) {
  struct Case {
    int64_t m, k, n;
    bool bias;
  };
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (const Case& c : {Case{1, 7, 5, false}, Case{16, 64, 96, true}, Case{33, 130, 257, true},
                          Case{256, 512, 384, false}}) {
      const std::string what = fmt::format("matmul {} m {} k {} n {}", dtype_name(dt), c.m, c.k, c.n);
      TwinMatrix w = twin_matrix(*cpu, *gpu, dt, c.n, c.k, randn(static_cast<size_t>(c.n * c.k), rng, 0.05f));
      const auto x = randn(static_cast<size_t>(c.m * c.k), rng);
      const auto bias = randn(static_cast<size_t>(c.n), rng);
      Buffer xc = put(*cpu, x), xg = put(*gpu, x), bc = put(*cpu, bias), bg = put(*gpu, bias);
      Buffer yc = poisoned(*cpu, static_cast<size_t>(c.m * c.n)), yg = poisoned(*gpu, static_cast<size_t>(c.m * c.n));
      cpu->matmul(w.on_cpu, xc.f32(), c.m, yc.f32(), c.bias ? bc.f32() : nullptr);
      gpu->matmul(w.on_gpu, xg.f32(), c.m, yg.f32(), c.bias ? bg.f32() : nullptr);
      expect_nmse(get<float>(*gpu, yg, yc.bytes() / 4), get<float>(*cpu, yc, yc.bytes() / 4),
                  dt == DType::F32 ? kF32Nmse : half_nmse(), what);
    }
  }
}

TEST_F(CudaOpsTest, RmsNormInPlaceAndNot) {
  for (int64_t rows : {1, 5, 17})
    for (int64_t n : {1, 64, 4097}) {
      const auto x = randn(static_cast<size_t>(rows * n), rng, 3.0f);
      const auto w = randn(static_cast<size_t>(n), rng);
      for (bool in_place : {false, true}) {
        Buffer xc = put(*cpu, x), xg = put(*gpu, x), wc = put(*cpu, w), wg = put(*gpu, w);
        Buffer yc = poisoned(*cpu, x.size()), yg = poisoned(*gpu, x.size());
        float* outc = in_place ? xc.f32() : yc.f32();
        float* outg = in_place ? xg.f32() : yg.f32();
        cpu->rms_norm(xc.f32(), wc.f32(), outc, rows, n, 1e-6f);
        gpu->rms_norm(xg.f32(), wg.f32(), outg, rows, n, 1e-6f);
        expect_nmse(get<float>(*gpu, in_place ? xg : yg, x.size()), get<float>(*cpu, in_place ? xc : yc, x.size()),
                    kF32Nmse, "rms_norm rows " + std::to_string(rows) + " n " + std::to_string(n));
      }
    }
}

// The residual add is exact on both backends (one f32 add per element), so the sums agree bit for
// bit; the norm after it within f32 rounding.
TEST_F(CudaOpsTest, AddRmsNormMatchesTheTwin) {
  for (int64_t rows : {1, 5, 17})
    for (int64_t n : {1, 64, 4097}) {
      const auto h = randn(static_cast<size_t>(rows * n), rng, 3.0f), x = randn(h.size(), rng);
      const auto w = randn(static_cast<size_t>(n), rng);
      Buffer hc = put(*cpu, h), hg = put(*gpu, h), xc = put(*cpu, x), xg = put(*gpu, x), wc = put(*cpu, w),
             wg = put(*gpu, w);
      Buffer yc = poisoned(*cpu, h.size()), yg = poisoned(*gpu, h.size());
      cpu->add_rms_norm(hc.f32(), xc.f32(), wc.f32(), yc.f32(), rows, n, 1e-6f);
      gpu->add_rms_norm(hg.f32(), xg.f32(), wg.f32(), yg.f32(), rows, n, 1e-6f);
      const std::string what = "add_rms_norm rows " + std::to_string(rows) + " n " + std::to_string(n);
      EXPECT_EQ(get<float>(*gpu, hg, h.size()), get<float>(*cpu, hc, h.size())) << what;
      expect_nmse(get<float>(*gpu, yg, h.size()), get<float>(*cpu, yc, h.size()), kF32Nmse, what);
    }
}

TEST_F(CudaOpsTest, HeadNormRopeAtFarPositions) {
  struct Case {
    int64_t rows, heads, d;
    double theta;
  };
  for (const Case& c : {Case{3, 1, 8, 1e4}, Case{16, 32, 128, 1e6}, Case{40, 3, 10, 5e5}, Case{7, 2, 256, 1e4}}) {
    const auto x = randn(static_cast<size_t>(c.rows * c.heads * c.d), rng, 2.0f);
    const auto w = randn(static_cast<size_t>(c.d), rng);
    std::vector<int64_t> pos(static_cast<size_t>(c.rows));
    std::uniform_int_distribution<int64_t> pd(0, 70000);
    for (auto& p : pos) p = pd(rng);
    Buffer xc = put(*cpu, x), xg = put(*gpu, x), wc = put(*cpu, w), wg = put(*gpu, w);
    Buffer pc = put(*cpu, pos), pg = put(*gpu, pos);  // positions are read from backend memory
    cpu->head_norm_rope(xc.f32(), wc.f32(), c.rows, c.heads, c.d, 1e-6f, static_cast<const int64_t*>(pc.get()),
                        c.theta);
    gpu->head_norm_rope(xg.f32(), wg.f32(), c.rows, c.heads, c.d, 1e-6f, static_cast<const int64_t*>(pg.get()),
                        c.theta);
    expect_nmse(get<float>(*gpu, xg, x.size()), get<float>(*cpu, xc, x.size()), kF32Nmse,
                "head_norm_rope D " + std::to_string(c.d));
  }
}

TEST_F(CudaOpsTest, DynConvMatchesTheTwin) {
  for (int64_t kernel : {1, 2, 4}) {
    ConvParams p;
    p.sessions = 3;
    p.block = 8;
    p.hidden = 96;
    p.kernel = kernel;
    p.group_size = 16;
    const int64_t groups = p.hidden / p.group_size, rows = p.sessions * p.block;
    p.delta_stride = 2 * kernel * groups + 3;
    p.delta_offset = kernel * groups;
    const auto in = randn(static_cast<size_t>(rows * p.hidden), rng);
    const auto base = randn(static_cast<size_t>(kernel * p.hidden), rng);
    const auto delta = randn(static_cast<size_t>(rows * p.delta_stride), rng);
    Buffer ic = put(*cpu, in), ig = put(*gpu, in), bc = put(*cpu, base), bg = put(*gpu, base);
    Buffer dc = put(*cpu, delta), dg = put(*gpu, delta);
    Buffer oc = poisoned(*cpu, in.size()), og = poisoned(*gpu, in.size());
    ConvParams pc = p, pg = p;
    pc.in = ic.f32(), pc.base = bc.f32(), pc.delta = dc.f32(), pc.out = oc.f32();
    pg.in = ig.f32(), pg.base = bg.f32(), pg.delta = dg.f32(), pg.out = og.f32();
    cpu->dyn_conv(pc);
    gpu->dyn_conv(pg);
    expect_nmse(get<float>(*gpu, og, in.size()), get<float>(*cpu, oc, in.size()), kF32Nmse,
                "dyn_conv kernel " + std::to_string(kernel));
  }
}

TEST_F(CudaOpsTest, SiluMulAndRingStores) {
  for (int64_t n : {1, 1000, 196608}) {
    const auto a = randn(static_cast<size_t>(n), rng, 4.0f), b = randn(static_cast<size_t>(n), rng);
    Buffer ac = put(*cpu, a), ag = put(*gpu, a), bc = put(*cpu, b), bg = put(*gpu, b);
    Buffer oc = poisoned(*cpu, a.size()), og = poisoned(*gpu, a.size());
    cpu->silu_mul(ac.f32(), bc.f32(), oc.f32(), n);
    gpu->silu_mul(ag.f32(), bg.f32(), og.f32(), n);
    expect_nmse(get<float>(*gpu, og, a.size()), get<float>(*cpu, oc, a.size()), kF32Nmse, "silu_mul");
  }
  // Ring stores: wrapping, more rows than slots, far positions; untouched slots keep their data.
  struct Case {
    int64_t rows, row_len, capacity, first;
  };
  for (const Case& c : {Case{5, 7, 16, 0}, Case{5, 7, 16, 13}, Case{40, 3, 16, 70001}, Case{16, 64, 16, 5}}) {
    const auto src = randn(static_cast<size_t>(c.rows * c.row_len), rng);
    const auto dst = randn(static_cast<size_t>(c.capacity * c.row_len), rng);
    Buffer sc = put(*cpu, src), sg = put(*gpu, src), dc = put(*cpu, dst), dg = put(*gpu, dst);
    cpu->store_rows(sc.f32(), c.rows, c.row_len, dc.f32(), c.capacity, c.first);
    gpu->store_rows(sg.f32(), c.rows, c.row_len, dg.f32(), c.capacity, c.first);
    EXPECT_EQ(get<float>(*gpu, dg, dst.size()), get<float>(*cpu, dc, dst.size()))
        << "store_rows rows " << c.rows << " capacity " << c.capacity << " first " << c.first;
  }
  // The gather that builds a draft's block rows, by a table in device memory.
  const int64_t len = 4096 + 3;
  const auto src = randn(static_cast<size_t>(3 * len), rng);
  const std::vector<int64_t> index = {0, 2, 2, 2, 1, 2, 2, 0};
  Buffer sc = put(*cpu, src), sg = put(*gpu, src), ic = put(*cpu, index), ig = put(*gpu, index);
  Buffer oc = poisoned(*cpu, index.size() * len), og = poisoned(*gpu, index.size() * len);
  cpu->gather_rows(sc.f32(), static_cast<const int64_t*>(ic.get()), 8, len, oc.f32());
  gpu->gather_rows(sg.f32(), static_cast<const int64_t*>(ig.get()), 8, len, og.f32());
  EXPECT_EQ(get<float>(*gpu, og, index.size() * len), get<float>(*cpu, oc, index.size() * len)) << "gather_rows";
}

// ---- attention -----------------------------------------------------------------------------------

struct AttnCase {
  std::string name;
  std::vector<int64_t> lengths;  // context positions per session (end)
  int64_t capacity = 0;          // ring slots; 0: the longest length (no wrap)
  int64_t anchor_back = 0;       // anchor = end - anchor_back
  int64_t block = 16, n_q = 4, n_kv = 2, d = 64, window = 0;
  bool causal = false;
};

// Runs the case with max_context at the longest view, and again far above it (as a captured
// forward sizes it: the ring's capacity), which leaves most of the CUDA chunks empty.
void check_attention(Ops& cpu, cuda::CudaOps& gpu, std::mt19937_64& rng, const AttnCase& c) {
  SCOPED_TRACE(c.name);
  const int64_t S = static_cast<int64_t>(c.lengths.size()), B = c.block, D = c.d;
  const int64_t longest = *std::max_element(c.lengths.begin(), c.lengths.end());
  const int64_t cap = std::max<int64_t>(1, c.capacity > 0 ? c.capacity : longest);
  const auto q = randn(static_cast<size_t>(S * B * c.n_q * D), rng);
  const auto k = randn(static_cast<size_t>(S * B * c.n_kv * D), rng);
  const auto v = randn(static_cast<size_t>(S * B * c.n_kv * D), rng);
  std::vector<Buffer> rings;  // per session: cpu k, cpu v, gpu k, gpu v
  std::vector<ContextView> vc(static_cast<size_t>(S)), vg(static_cast<size_t>(S));
  std::vector<int64_t> anchors(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) {
    const int64_t end = c.lengths[static_cast<size_t>(s)];
    const auto rk = randn(static_cast<size_t>(cap * c.n_kv * D), rng);
    const auto rv = randn(static_cast<size_t>(cap * c.n_kv * D), rng);
    for (Ops* ops : {&cpu, static_cast<Ops*>(&gpu)})
      for (const auto* ring : {&rk, &rv}) rings.push_back(put(*ops, *ring));
    const int64_t begin = std::max<int64_t>(0, end - cap);
    const size_t r = static_cast<size_t>(4 * s);
    vc[static_cast<size_t>(s)] = {rings[r].f32(), rings[r + 1].f32(), cap, begin, end};
    vg[static_cast<size_t>(s)] = {rings[r + 2].f32(), rings[r + 3].f32(), cap, begin, end};
    anchors[static_cast<size_t>(s)] = std::max<int64_t>(0, end - c.anchor_back);
  }
  Buffer qc = put(cpu, q), qg = put(gpu, q), kc = put(cpu, k), kg = put(gpu, k), vc2 = put(cpu, v), vg2 = put(gpu, v);
  Buffer ac = put(cpu, anchors), ag = put(gpu, anchors), tc = put(cpu, vc), tg = put(gpu, vg);
  AttentionParams p;
  p.sessions = S;
  p.block = B;
  p.n_q = c.n_q;
  p.n_kv = c.n_kv;
  p.head_dim = D;
  p.causal = c.causal;
  p.window = c.window;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  int64_t span = 0;
  for (const ContextView& view : vc) span = std::max(span, view.end - view.begin);
  // Both kernels: simt (f32) everywhere, mma (bf16 q, k, p, v; f32 sums) where the head dim allows.
  const bool mma = D == 64 || D == 128;
  for (const char* kernel : {"simt", "mma"}) {
    gpu.set_attention_kernel(kernel);
    for (int64_t max_context : {span, 8 * cap + 1000}) {
      Buffer oc = poisoned(cpu, q.size()), og = poisoned(gpu, q.size());
      AttentionParams pc = p, pg = p;
      pc.q = qc.f32(), pc.k = kc.f32(), pc.v = vc2.f32(), pc.out = oc.f32();
      pc.anchor = static_cast<const int64_t*>(ac.get()), pc.context = static_cast<const ContextView*>(tc.get());
      pg.q = qg.f32(), pg.k = kg.f32(), pg.v = vg2.f32(), pg.out = og.f32();
      pg.anchor = static_cast<const int64_t*>(ag.get()), pg.context = static_cast<const ContextView*>(tg.get());
      pc.max_context = pg.max_context = max_context;
      cpu.attention(pc);
      gpu.attention(pg);
      // f32: softmax sums over up to 70000 terms, the tolerance grows with the keys summed. bf16
      // operands: ~2^-9 relative per score and weight, which the average over keys does not
      // grow (1.2e-5 in a float64 emulation of the rounding at 17 .. 70000 keys).
      const double tol = std::string(kernel) == "mma" && mma
                             ? kMmaAttentionNmse
                             : kF32Nmse * std::max<double>(1.0, static_cast<double>(longest) / 1000.0);
      expect_nmse(get<float>(gpu, og, q.size()), get<float>(cpu, oc, q.size()), tol,
                  c.name + ", max_context " + std::to_string(max_context) + ", kernel " + kernel);
    }
  }
  gpu.set_attention_kernel("mma");
}

TEST_F(CudaOpsTest, AttentionContextLengths) {
  for (int64_t n : {0, 1, 17, 4096}) {
    for (bool causal : {false, true}) {
      AttnCase c;
      c.name = "context " + std::to_string(n) + (causal ? " causal" : "");
      c.lengths = {n};
      c.causal = causal;
      check_attention(*cpu, *gpu, rng, c);
    }
  }
}

TEST_F(CudaOpsTest, AttentionLongContext) {
  AttnCase c;
  c.name = "context 70000";
  c.lengths = {70000};
  c.n_q = 8;
  c.d = 128;
  check_attention(*cpu, *gpu, rng, c);
  c.name = "context 70000, sliding window 4096 over a wrapped ring";
  c.capacity = 4096 + 16;
  c.window = 4096;
  check_attention(*cpu, *gpu, rng, c);
}

TEST_F(CudaOpsTest, AttentionWindowsRingsAndGqa) {
  for (int64_t window : {1, 5, 100}) {
    for (bool causal : {false, true}) {
      AttnCase c;
      c.name = "window " + std::to_string(window) + (causal ? " causal" : "") + ", wrapped ring";
      c.lengths = {300, 7, 0};
      c.capacity = window + 16;
      c.window = window;
      c.causal = causal;
      check_attention(*cpu, *gpu, rng, c);
    }
  }
  for (int64_t ratio : {1, 2, 4, 8}) {
    AttnCase c;
    c.name = "gqa " + std::to_string(ratio);
    c.lengths = {33, 250};
    c.n_kv = 2;
    c.n_q = 2 * ratio;
    c.d = ratio == 8 ? 256 : 16;
    check_attention(*cpu, *gpu, rng, c);
  }
  // The mma kernel's row groups: 4 or 8 q heads per kv head (64 or 128 rows), sessions of
  // different lengths, a partial last tile.
  for (int64_t ratio : {3, 4, 8}) {
    AttnCase c;
    c.name = "gqa " + std::to_string(ratio) + ", head dim 128";
    c.lengths = {33, 1000, 0};
    c.n_kv = 2;
    c.n_q = 2 * ratio;
    c.d = 128;
    c.causal = ratio == 8;
    check_attention(*cpu, *gpu, rng, c);
  }
  AttnCase odd;
  odd.name = "odd head dim, block 3, anchor before the end";
  odd.lengths = {50, 9};
  odd.block = 3;
  odd.d = 10;
  odd.n_q = 6;
  odd.n_kv = 3;
  odd.anchor_back = 4;
  check_attention(*cpu, *gpu, rng, odd);
}

// Context rings of bf16 (AttentionParams::kv_dtype), which the tensor-core kernel reads: against
// the CPU twin on the same rings rounded to bf16 and held as f32. A head dim the kernel does not
// take is refused by name.
TEST_F(CudaOpsTest, AttentionReadsBf16Rings) {
  const int64_t S = 2, B = 16, n_q = 8, n_kv = 2, D = 128, cap = 4096;
  const std::vector<int64_t> ends = {300, 4096};
  const auto q = randn(static_cast<size_t>(S * B * n_q * D), rng);
  const auto k = randn(static_cast<size_t>(S * B * n_kv * D), rng);
  const auto v = randn(static_cast<size_t>(S * B * n_kv * D), rng);
  std::vector<Buffer> rings;  // per session and k / v: cpu (rounded, f32), gpu (bf16)
  std::vector<ContextView> vc, vg;
  for (int64_t s = 0; s < S; ++s) {
    for (int kv = 0; kv < 2; ++kv) {
      const auto ring = randn(static_cast<size_t>(cap * n_kv * D), rng);
      std::vector<uint8_t> raw(ring.size() * 2);
      convert_from_f32(DType::BF16, ring.data(), raw.data(), ring.size());
      std::vector<float> rounded(ring.size());
      convert_to_f32(DType::BF16, raw.data(), rounded.data(), ring.size());
      rings.push_back(put(*cpu, rounded));
      rings.push_back(put(*gpu, raw));
    }
    const size_t r = static_cast<size_t>(4 * s);
    vc.push_back({rings[r].f32(), rings[r + 2].f32(), cap, 0, ends[static_cast<size_t>(s)]});
    vg.push_back({rings[r + 1].f32(), rings[r + 3].f32(), cap, 0, ends[static_cast<size_t>(s)]});
  }
  Buffer qc = put(*cpu, q), qg = put(*gpu, q), kc = put(*cpu, k), kg = put(*gpu, k), vc2 = put(*cpu, v),
         vg2 = put(*gpu, v);
  Buffer ac = put(*cpu, ends), ag = put(*gpu, ends), tc = put(*cpu, vc), tg = put(*gpu, vg);
  Buffer oc = poisoned(*cpu, q.size()), og = poisoned(*gpu, q.size());
  AttentionParams p;
  p.sessions = S, p.block = B, p.n_q = n_q, p.n_kv = n_kv, p.head_dim = D, p.max_context = cap;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  AttentionParams pc = p, pg = p;
  pc.q = qc.f32(), pc.k = kc.f32(), pc.v = vc2.f32(), pc.out = oc.f32();
  pc.anchor = static_cast<const int64_t*>(ac.get()), pc.context = static_cast<const ContextView*>(tc.get());
  pg.q = qg.f32(), pg.k = kg.f32(), pg.v = vg2.f32(), pg.out = og.f32();
  pg.anchor = static_cast<const int64_t*>(ag.get()), pg.context = static_cast<const ContextView*>(tg.get());
  pg.kv_dtype = DType::BF16;
  cpu->attention(pc);
  gpu->set_attention_kernel("simt");  // bf16 rings take the tensor-core kernel all the same
  gpu->attention(pg);
  gpu->set_attention_kernel("mma");
  expect_nmse(get<float>(*gpu, og, q.size()), get<float>(*cpu, oc, q.size()), kMmaAttentionNmse, "bf16 rings");
  pg.head_dim = 256;
  testing::expect_error([&] { gpu->attention(pg); }, {"bf16 context rings", "not 256"});
}

// ---- head ---------------------------------------------------------------------------------------

struct HeadCase {
  DType dtype = DType::BF16;
  int64_t rows = 300, valid = 300, hidden = 64, m = 15;
  float scale = 1.0f, cap = 0.0f;
  int k = 4;
};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

void check_head(Ops& cpu, Ops& gpu, std::mt19937_64& rng, const HeadCase& c, std::vector<float> g = {},
                std::vector<float> wv = {}) {
  const std::string what =
      fmt::format("head {} vocab {}/{} k {} cap {:f}", dtype_name(c.dtype), c.valid, c.rows, c.k, c.cap);
  SCOPED_TRACE(what);
  if (wv.empty()) wv = randn(static_cast<size_t>(c.rows * c.hidden), rng, 0.1f);
  if (g.empty()) g = randn(static_cast<size_t>(c.m * c.hidden), rng);
  TwinMatrix w = twin_matrix(cpu, gpu, c.dtype, c.rows, c.hidden, wv);
  Buffer gc = put(cpu, g), gg = put(gpu, g);
  HeadParams p;
  p.m = c.m;
  p.valid_rows = c.valid;
  p.scale = c.scale;
  p.cap = c.cap;
  HeadParams pc = p, pg = p;
  pc.head = w.on_cpu, pc.g = gc.f32();
  pg.head = w.on_gpu, pg.g = gg.f32();
  const size_t nl = static_cast<size_t>(c.m * c.valid), nk = static_cast<size_t>(c.m * c.k);
  Buffer lc = poisoned(cpu, nl), lg = poisoned(gpu, nl);
  cpu.head_logits(pc, lc.f32());
  gpu.head_logits(pg, lg.f32());
  const auto logits = get<float>(gpu, lg, nl);
  const bool nan_input = std::any_of(g.begin(), g.end(), [](float x) { return std::isnan(x); });
  if (!nan_input)
    expect_nmse(logits, get<float>(cpu, lc, nl), c.dtype == DType::F32 ? kF32Nmse : half_nmse(), "head_logits");

  const int64_t id_base = 1000;
  Buffer vg = poisoned(gpu, nk), ig(gpu, nk * sizeof(int64_t));
  gpu.head_topk(pg, c.k, id_base, vg.f32(), static_cast<int64_t*>(ig.get()));
  const auto vals = get<float>(gpu, vg, nk);
  const auto ids = get<int64_t>(gpu, ig, nk);
  // The GPU's head_logits sorted on the host.
  const TopK want = sorted_top(logits, c.m, c.valid, c.k, id_base);
  size_t bad = 0;
  for (size_t i = 0; i < nk; ++i)
    if ((ids[i] != want.ids[i] || !same_bits(vals[i], want.values[i])) && bad++ < 5)
      ADD_FAILURE() << "entry " << i << ": got (" << vals[i] << ", " << ids[i] << ") want (" << want.values[i]
                    << ", " << want.ids[i] << ")";
  EXPECT_EQ(bad, 0u) << "head_topk must equal the sorted head_logits bit for bit";

  // Rank by rank, the values agree with the CPU twin's top k (an id may differ only where two
  // logits lie within rounding of each other, so ids are not compared); empty places agree.
  Buffer cv = poisoned(cpu, nk), ci(cpu, nk * sizeof(int64_t));
  cpu.head_topk(pc, c.k, id_base, cv.f32(), static_cast<int64_t*>(ci.get()));
  const auto cpu_vals = get<float>(cpu, cv, nk);
  const auto cpu_ids = get<int64_t>(cpu, ci, nk);
  std::vector<float> got_ranked, want_ranked;
  for (size_t i = 0; i < nk; ++i) {
    if (cpu_ids[i] == -1) {
      EXPECT_EQ(ids[i], -1) << "entry " << i << ": the CPU twin has no candidate here";
      continue;
    }
    got_ranked.push_back(vals[i]);
    want_ranked.push_back(cpu_vals[i]);
  }
  expect_nmse(got_ranked, want_ranked, c.dtype == DType::F32 ? kF32Nmse : half_nmse(), "head_topk values vs cpu");
}

TEST_F(CudaOpsTest, HeadLogitsAndTopkEveryDtype) {
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    HeadCase c;
    c.dtype = dt;
    check_head(*cpu, *gpu, rng, c);
    c.cap = 1.5f;
    c.scale = 0.7f;
    c.valid = 290;  // padded rows never win
    check_head(*cpu, *gpu, rng, c);
  }
}

TEST_F(CudaOpsTest, HeadTopkMultiPassAndLargeK) {
  struct Case {
    int64_t vocab;
    int k;
  };
  // k = 1 takes the argmax kernels (one block per row, or a pass first), k > 1 the selection.
  for (const Case& cs : {Case{4096, 1}, Case{20000, 1}, Case{151936, 1}, Case{4097, 64}, Case{20000, 7},
                         Case{151936, 32}, Case{151936, 2048}, Case{9000, 2048}}) {
    HeadCase c;
    c.rows = c.valid = cs.vocab;
    c.k = cs.k;
    c.hidden = 32;
    c.m = 5;
    check_head(*cpu, *gpu, rng, c);
  }
}

TEST_F(CudaOpsTest, HeadTopkTiesNanAndShortVocab) {
  HeadCase c;
  c.rows = c.valid = 600;
  c.k = 16;
  c.m = 3;
  // Every row of the head appears 6 times: equal logits, broken by the lower id.
  auto base = randn(static_cast<size_t>(100 * c.hidden), rng, 0.1f);
  std::vector<float> wv;
  for (int rep = 0; rep < 6; ++rep) wv.insert(wv.end(), base.begin(), base.end());
  check_head(*cpu, *gpu, rng, c, {}, wv);
  c.k = 1;  // the argmax: ties to the lower id too
  check_head(*cpu, *gpu, rng, c, {}, wv);
  check_head(*cpu, *gpu, rng, c, std::vector<float>(static_cast<size_t>(c.m * c.hidden), kNaN));
  c.k = 16;
  // NaN inputs: every logit NaN, none may win: every place is -inf / -1.
  check_head(*cpu, *gpu, rng, c, std::vector<float>(static_cast<size_t>(c.m * c.hidden), kNaN));
  // Fewer valid rows than k: the tail is -inf / -1.
  c.valid = 10;
  check_head(*cpu, *gpu, rng, c);
  c.valid = 0;
  check_head(*cpu, *gpu, rng, c);
}

// ---- graphs ---------------------------------------------------------------------------------------

// A captured attention + head_norm_rope + add_rms_norm replays with the session tables, positions and
// inputs as they are at replay time: equal, bit for bit, to the same ops issued directly.
TEST_F(CudaOpsTest, CaptureReplaysWithTheTablesOfTheMoment) {
  const int64_t S = 2, B = 8, nq = 4, nkv = 2, D = 64, cap = 600;
  const auto q = randn(static_cast<size_t>(S * B * nq * D), rng), k = randn(static_cast<size_t>(S * B * nkv * D), rng);
  const auto v = randn(k.size(), rng), w = randn(static_cast<size_t>(D), rng);
  const auto ring = randn(static_cast<size_t>(cap * nkv * D), rng);
  Buffer qg = put(*gpu, q), kg = put(*gpu, k), vg = put(*gpu, v), wg = put(*gpu, w), rk = put(*gpu, ring),
         rv = put(*gpu, randn(ring.size(), rng));
  Buffer out(*gpu, q.size() * sizeof(float)), acc(*gpu, q.size() * sizeof(float)),
      normed(*gpu, q.size() * sizeof(float));
  Buffer anchors(*gpu, S * sizeof(int64_t)), views(*gpu, S * sizeof(ContextView)), pos(*gpu, S * B * sizeof(int64_t));
  auto set_tables = [&](int64_t end0, int64_t end1) {
    const std::vector<int64_t> a{end0, end1};
    const std::vector<ContextView> vv{{rk.f32(), rv.f32(), cap, 0, end0}, {rk.f32(), rv.f32(), cap, 0, end1}};
    std::vector<int64_t> p;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t r = 0; r < B; ++r) p.push_back(a[static_cast<size_t>(s)] + r);
    gpu->to_device(anchors.get(), a.data(), a.size() * sizeof(int64_t));
    gpu->to_device(views.get(), vv.data(), vv.size() * sizeof(ContextView));
    gpu->to_device(pos.get(), p.data(), p.size() * sizeof(int64_t));
  };
  AttentionParams ap;
  ap.q = qg.f32(), ap.k = kg.f32(), ap.v = vg.f32(), ap.out = out.f32();
  ap.sessions = S, ap.block = B, ap.n_q = nq, ap.n_kv = nkv, ap.head_dim = D, ap.causal = true;
  ap.anchor = static_cast<const int64_t*>(anchors.get()), ap.context = static_cast<const ContextView*>(views.get());
  ap.max_context = cap;
  ap.scale = 0.125f;
  auto issue = [&] {
    gpu->attention(ap);
    gpu->head_norm_rope(out.f32(), wg.f32(), S * B, nq, D, 1e-6f, static_cast<const int64_t*>(pos.get()), 1e6);
    gpu->add_rms_norm(acc.f32(), out.f32(), wg.f32(), normed.f32(), S * B * nq, D, 1e-6f);
  };
  auto direct = [&](int64_t end0, int64_t end1) {
    set_tables(end0, end1);
    gpu->to_device(acc.get(), q.data(), q.size() * sizeof(float));
    issue();
    return get<float>(*gpu, acc, q.size());
  };
  const auto want_short = direct(3, 100), want_long = direct(599, 250);
  ASSERT_NE(want_short, want_long);
  // Capture after the ops ran once (their workspaces exist), then replay with other tables.
  gpu->begin_capture();
  issue();
  EXPECT_THROW(gpu->to_host(nullptr, out.get(), 0), Error) << "a copy was accepted inside a capture";
  const auto graph = gpu->end_capture();
  for (auto [end0, end1, want] : {std::tuple{599, 250, &want_long}, std::tuple{3, 100, &want_short}}) {
    set_tables(end0, end1);
    gpu->to_device(acc.get(), q.data(), q.size() * sizeof(float));
    gpu->replay(*graph);
    EXPECT_EQ(get<float>(*gpu, acc, q.size()), *want) << "replay with contexts " << end0 << ", " << end1;
  }
  // A capture that would need a workspace first (this fixture's ops never ran a 16-bit matmul)
  // is refused with the reason, and dropped.
  std::vector<uint16_t> wbits(64 * 64, f32_to_bf16(0.5f));
  Buffer wm = put(*gpu, wbits), xm = put(*gpu, randn(64 * 64, rng)), ym(*gpu, 64 * 64 * sizeof(float));
  gpu->begin_capture();
  testing::expect_error([&] { gpu->matmul({DType::BF16, 64, 64, wm.get()}, xm.f32(), 64, ym.f32(), nullptr); },
                        {"during a graph capture"});
  gpu->abort_capture();
  EXPECT_EQ(direct(599, 250), want_long) << "the stream works again after an aborted capture";
}

TEST_F(CudaOpsTest, ErrorsNameTheOp) {
  HeadParams p;
  std::vector<uint16_t> w(64);
  Buffer wb = put(*gpu, w);
  p.head = {DType::BF16, 4, 16, wb.get()};
  p.m = 1;
  p.valid_rows = 4;
  Buffer g = put(*gpu, std::vector<float>(16, 1.0f)), v(*gpu, 4 * 4096), i(*gpu, 8 * 4096);
  p.g = g.f32();
  testing::expect_error([&] { gpu->head_topk(p, 4096, 0, v.f32(), static_cast<int64_t*>(i.get())); },
                        {"head_topk: k = 4096"});
  AttentionParams ap;
  ap.sessions = 1;
  ap.block = 2;
  ap.n_q = 1;
  ap.n_kv = 1;
  ap.head_dim = 512;
  int64_t anchor = 0;
  ContextView cv;
  ap.anchor = &anchor;
  ap.context = &cv;
  EXPECT_THROW(gpu->attention(ap), Error);
}

}  // namespace
}  // namespace tpdraft::kernels

#endif  // TPDRAFT_HAVE_CUDA
