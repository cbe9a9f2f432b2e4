// The CPU attention op alone at a drafter's geometry: one session's block against a context of
// each given length (f32 or bf16 cache, full attention), each kernel level this processor runs,
// taking turns; prints the median time, the GFLOP/s of its score and value products (4 B Nq D
// FLOPs per context position) and their share of the rate our matmul reaches on this machine in
// the same run (a 256-row compute-bound GEMM of the config's width, bf16 weights).
//   attention_rate [--config FILE] [--ctx LIST] [--threads N] [--rounds N] [--repeat N] [--kv-dtype D]
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_main.h"
#include "checkpoint/config.h"
#include "core/dtype.h"
#include "core/timing.h"
#include "kernels/buffer.h"
#include "kernels/ceilings.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

namespace tpdraft::bench {
namespace {

namespace cpu = kernels::cpu;

struct Args {
  std::string config = "configs/bench-dflash2-2048.json", kv_dtype = "f32";
  std::vector<int64_t> ctx{1024, 8192, 32768};
  int threads = 2, rounds = 3, repeat = 5;
};

std::vector<float> randn(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

int run(const Args& a) {
  const model::DrafterConfig c = model::DrafterConfig::from_file(a.config);
  const DType kv = a.kv_dtype == "bf16" ? DType::BF16 : DType::F32;
  const int64_t B = c.block, nq = c.n_q, nkv = c.n_kv, D = c.head_dim, row_kv = nkv * D;
  auto ops = kernels::make_cpu_ops(a.threads);
  std::mt19937_64 rng(5);
  const int64_t longest = *std::max_element(a.ctx.begin(), a.ctx.end());
  const auto q = randn(static_cast<size_t>(B * nq * D), rng), k = randn(static_cast<size_t>(B * row_kv), rng),
             v = randn(static_cast<size_t>(B * row_kv), rng);
  std::vector<float> ck = randn(static_cast<size_t>(longest * row_kv), rng),
                     cv = randn(static_cast<size_t>(longest * row_kv), rng);
  std::vector<uint16_t> k16(ck.size()), v16(cv.size());
  convert_from_f32(DType::BF16, ck.data(), k16.data(), ck.size());
  convert_from_f32(DType::BF16, cv.data(), v16.data(), cv.size());
  std::vector<float> out(q.size());
  std::vector<cpu::Isa> levels;
  for (int l = static_cast<int>(cpu::Isa::Avx2); l <= static_cast<int>(cpu::detected_isa()); ++l)
    levels.push_back(static_cast<cpu::Isa>(l));
  std::vector<std::vector<SampleSummary>> times(levels.size(), std::vector<SampleSummary>(a.ctx.size()));
  MachineLoad load;
  double gemm = 0;
  for (int r = 0; r < a.rounds; ++r) {
    gemm = std::max(gemm, kernels::measure_gemm_gflops(*ops, DType::BF16, std::min<int64_t>(c.hidden, 2048)));
    for (size_t li = 0; li < levels.size(); ++li) {
      cpu::force_isa(levels[li]);
      for (size_t ci = 0; ci < a.ctx.size(); ++ci) {
        const bool b16 = kv == DType::BF16;
        kernels::ContextView view{b16 ? reinterpret_cast<const float*>(k16.data()) : ck.data(),
                                  b16 ? reinterpret_cast<const float*>(v16.data()) : cv.data(), longest, 0, a.ctx[ci]};
        const int64_t anchor = a.ctx[ci];
        kernels::AttentionParams p;
        p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out.data();
        p.sessions = 1, p.block = B, p.n_q = nq, p.n_kv = nkv, p.head_dim = D;
        p.anchor = &anchor, p.context = &view, p.max_context = a.ctx[ci];
        p.scale = 1.0f / 11.3f, p.kv_dtype = kv;
        times[li][ci].add(time_runs(1, a.repeat, [&](int64_t) { ops->attention(p); }).median());
      }
    }
  }
  load.stop();
  std::printf("%s: attention of one %lld-row block, %lld q / %lld kv heads of %lld, %s cache, %d threads, %d rounds\n",
              a.config.c_str(), static_cast<long long>(B), static_cast<long long>(nq), static_cast<long long>(nkv),
              static_cast<long long>(D), a.kv_dtype.c_str(), a.threads, a.rounds);
  std::printf("our matmul: %.1f GFLOP/s (best of the rounds)\n", gemm);
  std::printf("%-8s %9s %10s %10s %8s\n", "level", "context", "ms", "GFLOP/s", "of GEMM");
  for (size_t li = 0; li < levels.size(); ++li)
    for (size_t ci = 0; ci < a.ctx.size(); ++ci) {
      const double t = times[li][ci].median(), flops = 4.0 * static_cast<double>(B * nq * D * (a.ctx[ci] + B));
      std::printf("%-8s %9lld %10.3f %10.1f %7.0f%%\n", cpu::isa_name(levels[li]), static_cast<long long>(a.ctx[ci]),
                  t * 1e3, flops / t / 1e9, 100 * flops / t / 1e9 / gemm);
    }
  std::printf("machine: %s\n", load.describe().c_str());
  return 0;
}

}  // namespace
}  // namespace tpdraft::bench

int main(int argc, char** argv) {
  using namespace tpdraft::bench;
  Args a;
  CLI::App app{"The CPU attention op alone at a drafter's geometry, its rate against our matmul's", "attention_rate"};
  app.add_option("--config", a.config, "Drafter config.json (block, heads, head_dim, hidden)")->capture_default_str();
  app.add_option("--ctx", a.ctx, "Context lengths, a comma list")->delimiter(',')->capture_default_str();
  app.add_option("--kv-dtype", a.kv_dtype, "Context cache dtype")->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
  app.add_option("--threads", a.threads, "Threads")->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--rounds", a.rounds, "Rounds in which the levels take turns")->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--repeat", a.repeat, "Timed calls per round")->capture_default_str()->check(CLI::Range(1, 100000));
  return bench_main(app, argc, argv, [&] { return run(a); });
}
