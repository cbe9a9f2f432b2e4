// The CPU matmul on bf16, int8 and int4 weights, A/B in one run: the layer shapes of a drafter
// config against M activation rows (16: one draft), each kernel level this processor runs, taking
// turns for several rounds; prints per level and format the median time of one pass over every
// layer matrix, the multiply-adds per second and the speed relative to bf16 at that level, and
// whether the machine was idle meanwhile.
//   matmul_ab [--config FILE] [--rows M] [--threads N] [--rounds N] [--repeat N] [--group G]
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_main.h"
#include "checkpoint/config.h"
#include "checkpoint/quant_tensors.h"
#include "core/dtype.h"
#include "core/timing.h"
#include "kernels/buffer.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "model/weights.h"

namespace tpdraft::bench {
namespace {

using kernels::Matrix;
using kernels::WeightFormat;
namespace cpu = kernels::cpu;

struct Args {
  std::string config = "configs/bench-dflash2-2048.json";
  int64_t rows = 16, group = 128;
  int threads = 2, rounds = 5, repeat = 5;
};

struct Shape {
  int64_t n, k;
};

// One layer's matrices: q, k, v, o, gate, up, down.
std::vector<Shape> layer_shapes(const model::DrafterConfig& c) {
  const int64_t h = c.hidden, q = c.n_q * c.head_dim, kv = c.n_kv * c.head_dim;
  return {{q, h}, {kv, h}, {kv, h}, {h, q}, {c.ffn, h}, {c.ffn, h}, {h, c.ffn}};
}

struct Variant {
  std::string name;
  std::vector<Matrix> mats;
};

int run(const Args& a) {
  const model::DrafterConfig config = model::DrafterConfig::from_file(a.config);
  const std::vector<Shape> shapes = layer_shapes(config);
  auto ops = kernels::make_cpu_ops(a.threads);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  std::vector<kernels::Buffer> keep;
  auto buffer = [&](size_t bytes) { return keep.emplace_back(*ops, bytes).get(); };
  Variant bf16{"bf16", {}}, q8{"int8", {}}, q4{"int4", {}};
  double macs = 0;
  for (const Shape& s : shapes) {
    std::vector<float> w(static_cast<size_t>(s.n * s.k));
    for (float& v : w) v = normal(rng) * 0.02f;
    std::vector<uint16_t> wb(w.size());
    convert_from_f32(DType::BF16, w.data(), wb.data(), w.size());
    void* d = buffer(wb.size() * 2);
    ops->to_device(d, wb.data(), wb.size() * 2);
    bf16.mats.push_back({DType::BF16, s.n, s.k, d});
    // The int variants of these bf16 weights, quantized as tpdraft quantizes them while loading.
    const model::TensorInfo t{"w", DType::BF16, {s.n, s.k}, reinterpret_cast<const std::byte*>(wb.data()),
                              wb.size() * 2};
    model::QuantRequest request;
    request.group = a.group;
    for (const int bits : {8, 4}) {
      const model::QuantShare q = model::quantize_share(t, request.scheme(bits, s.k), {0, s.n}, {0, s.k});
      const WeightFormat f = bits == 8 ? WeightFormat::Int8 : WeightFormat::Int4;
      void* dq = buffer(ops->quantized_bytes(f, s.n, s.k, q.group));
      (bits == 8 ? q8 : q4).mats.push_back(ops->upload_quantized(model::quantized_rows(q), dq));
    }
    macs += static_cast<double>(s.n) * static_cast<double>(s.k) * static_cast<double>(a.rows);
  }
  int64_t max_n = 0, max_k = 0;
  for (const Shape& s : shapes) max_n = std::max(max_n, s.n), max_k = std::max(max_k, s.k);
  std::vector<float> x(static_cast<size_t>(a.rows * max_k));
  for (float& v : x) v = normal(rng);
  float* dx = static_cast<float*>(buffer(x.size() * 4));
  float* dy = static_cast<float*>(buffer(static_cast<size_t>(a.rows * max_n) * 4));
  ops->to_device(dx, x.data(), x.size() * 4);

  std::vector<cpu::Isa> levels;
  for (int l = static_cast<int>(cpu::Isa::Avx2); l <= static_cast<int>(cpu::detected_isa()); ++l)
    levels.push_back(static_cast<cpu::Isa>(l));
  std::vector<Variant*> variants{&bf16, &q8, &q4};
  // times[level][variant]: per-round medians of one pass over the layer's matrices.
  std::vector<std::vector<SampleSummary>> times(levels.size(), std::vector<SampleSummary>(3));
  MachineLoad load;
  for (int r = 0; r < a.rounds; ++r)
    for (size_t li = 0; li < levels.size(); ++li) {
      cpu::force_isa(levels[li]);
      for (size_t vi = 0; vi < variants.size(); ++vi)
        times[li][vi].add(time_runs(1, a.repeat, [&](int64_t) {  // the first pass warms the caches
                            for (const Matrix& m : variants[vi]->mats) ops->matmul(m, dx, a.rows, dy, nullptr);
                            ops->sync();
                          }).median());
    }
  load.stop();
  std::printf("%s: one layer's 7 matrices, %lld activation rows, %d threads, group %lld, %d rounds x %d passes\n",
              a.config.c_str(), static_cast<long long>(a.rows), a.threads, static_cast<long long>(a.group), a.rounds,
              a.repeat);
  std::printf("%-12s %-6s %10s %12s %8s\n", "level", "weights", "ms", "GMAC/s", "x bf16");
  for (size_t li = 0; li < levels.size(); ++li) {
    const double base = times[li][0].median();
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      const double t = times[li][vi].median();
      const char* kernel = vi == 0 ? cpu::isa_name(levels[li]) : cpu::quant_kernel_name(cpu::quant_kernel(levels[li]));
      std::printf("%-12s %-6s %10.3f %12.1f %8.2f\n", kernel, variants[vi]->name.c_str(), t * 1e3, macs / t * 1e-9,
                  base / t);
    }
  }
  std::printf("machine: %s\n", load.describe().c_str());
  return 0;
}

}  // namespace
}  // namespace tpdraft::bench

int main(int argc, char** argv) {
  using namespace tpdraft::bench;
  Args a;
  CLI::App app{"The CPU matmul on bf16, int8 and int4 weights at a drafter's layer shapes, A/B in one run",
               "matmul_ab"};
  app.add_option("--config", a.config, "Drafter config.json whose layer shapes are timed")->capture_default_str();
  app.add_option("--rows", a.rows, "Activation rows M (16: one draft)")->capture_default_str();
  app.add_option("--group", a.group, "Quantization group along the input")->capture_default_str();
  app.add_option("--threads", a.threads, "Threads")->capture_default_str();
  app.add_option("--rounds", a.rounds, "Rounds in which the variants take turns")->capture_default_str();
  app.add_option("--repeat", a.repeat, "Passes over the layer matrices per round")->capture_default_str();
  return bench_main(app, argc, argv, [&] { return run(a); });
}
