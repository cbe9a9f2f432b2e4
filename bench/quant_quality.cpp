// How far quantized drafts are from the bf16 draft of the same checkpoint: on random bf16 weights
// given a few outlier input channels (real checkpoints have them, and they are what hurts
// per-group rounding), drafts over several contexts and many anchors, once in bf16 and once per
// quantization; per variant, the share of drafted tokens equal to bf16's, the mean length of the
// prefix that agrees (what acceptance follows), and the KL divergence KL(bf16 || quantized) of each
// row's softmax over the logits (mean and max), and the relative L2 error of the logits.
//   quant_quality [--config FILE] [--ctx N] [--contexts N] [--anchors N] [--outliers F] [--threads N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_main.h"
#include "checkpoint/quant_config.h"
#include "engine/runtime.h"
#include "model/weights.h"
#include "parallel/communicator.h"
#include "tools/random_checkpoint.h"

namespace tpdraft::bench {
namespace {

struct Args {
  std::string config = "configs/bench-dflash2-2048.json";
  int64_t ctx = 256, contexts = 3, anchors = 8;
  double outliers = 8.0;  // scale of the outlier channels (1: none)
  int threads = 2;
};

// Scales 1 in 64 input columns of every quantizable matrix by `factor` (the same columns in every
// row: an outlier channel of the activations the matrix reads).
void add_outlier_channels(std::vector<model::OwnedTensor>& tensors, double factor) {
  std::mt19937_64 rng(99);
  for (auto& t : tensors) {
    if (!model::quantizable_tensor(t.name) || t.shape.size() != 2 || factor == 1.0) continue;
    const int64_t rows = t.shape[0], cols = t.shape[1];
    std::vector<int64_t> picked;
    std::uniform_int_distribution<int64_t> pick(0, cols - 1);
    for (int64_t n = 0; n < std::max<int64_t>(1, cols / 64); ++n) picked.push_back(pick(rng));
    std::vector<float> v(static_cast<size_t>(rows * cols));
    convert_to_f32(t.dtype, t.bytes.data(), v.data(), v.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c : picked) v[static_cast<size_t>(r * cols + c)] *= static_cast<float>(factor);
    convert_from_f32(t.dtype, v.data(), t.bytes.data(), v.size());
  }
}

// Log-softmax of each row of logits [rows, V].
std::vector<double> log_softmax(const std::vector<float>& logits, int64_t rows, int64_t v) {
  std::vector<double> out(logits.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits.data() + r * v;
    const double m = *std::max_element(l, l + v);
    double z = 0;
    for (int64_t i = 0; i < v; ++i) z += std::exp(l[i] - m);
    const double lz = m + std::log(z);
    for (int64_t i = 0; i < v; ++i) out[static_cast<size_t>(r * v + i)] = l[i] - lz;
  }
  return out;
}

struct Draft {
  std::vector<int64_t> tokens;
  std::vector<double> logp;   // [B-1, V]
  std::vector<float> logits;  // [B-1, V]
};

// Every (context, anchor) draft of one variant.
std::vector<Draft> run_variant(const model::ModelSource& source, const Args& a) {
  auto comm = parallel::make_single_rank();
  model::RuntimeOptions ro;
  ro.backend = "cpu";
  ro.threads = a.threads;
  ro.limits.max_context = a.ctx + 1;
  model::RankRuntime rt(source, *comm, ro);
  const model::DrafterConfig& cfg = rt.config();
  std::vector<Draft> out;
  for (int64_t c = 0; c < a.contexts; ++c) {
    const auto taps = model::random_taps(cfg, a.ctx, 1000 + static_cast<uint64_t>(c));
    auto session = rt.drafter().new_session();
    rt.drafter().settle(*session, 0, taps.data(), a.ctx);
    for (int64_t k = 0; k < a.anchors; ++k) {
      const int64_t anchor = (7919 * (c * a.anchors + k) + 13) % cfg.vocab;
      model::DraftDump dump;
      const auto r = rt.drafter().draft({{session.get(), anchor, {}}}, &dump);
      out.push_back({r[0].tokens, log_softmax(dump.logits, cfg.block - 1, cfg.vocab), dump.logits});
    }
  }
  return out;
}

int run(const Args& a) {
  model::ModelSource base;
  base.config = model::DrafterConfig::from_file(a.config);
  model::RandomCheckpointOptions ro;
  ro.seed = 5;
  ro.threads = a.threads;
  auto drafter = model::random_drafter_tensors(base.config, ro);
  add_outlier_channels(drafter, a.outliers);
  base.drafter = model::TensorStore::from_memory(a.config, std::move(drafter));
  base.target = model::TensorStore::from_memory(a.config + " (target)", model::random_target_tensors(base.config, ro));
  const int64_t V = base.config.vocab, rows = base.config.block - 1;

  const std::vector<Draft> ref = run_variant(base, a);
  struct Variant {
    const char* name;
    const char* preset;  // a --quant preset, or nullptr: `req`
    model::QuantRequest req;
  };
  model::QuantRequest mlp4;
  mlp4.bits = 4;
  mlp4.only = "mlp";
  model::QuantRequest mlp8 = mlp4;
  mlp8.bits = 8;
  const Variant variants[] = {{"q8 (all int8)", "q8", {}},
                              {"q4 (layers int4, rest int8)", "q4", {}},
                              {"q8+head (head int8 too)", "q8+head", {}},
                              {"q4+head (head int8 too)", "q4+head", {}},
                              {"int8 MLP only", nullptr, mlp8},
                              {"int4 MLP only", nullptr, mlp4}};
  std::printf("%s, %lld contexts x %lld anchors, %lld context rows, outlier channels x%g, greedy drafts of %lld "
              "tokens\n", a.config.c_str(), static_cast<long long>(a.contexts), static_cast<long long>(a.anchors),
              static_cast<long long>(a.ctx), a.outliers, static_cast<long long>(rows));
  std::printf("%-30s %10s %14s %12s %12s %12s\n", "variant", "tokens =", "prefix =", "KL mean", "KL max",
              "logits err");
  for (const Variant& v : variants) {
    model::ModelSource q = base;
    q.config.quant = v.preset != nullptr ? model::quantization_on_load(q.config, v.preset, a.config)
                                         : model::plan_quantization(v.req, model::expected_drafter_tensors(q.config),
                                                                    model::QuantConfig::Source::OnLoad);
    const std::vector<Draft> got = run_variant(q, a);
    double same = 0, prefix = 0, kl_sum = 0, kl_max = 0, err2 = 0, norm2 = 0;
    for (size_t d = 0; d < ref.size(); ++d) {
      for (size_t i = 0; i < ref[d].logits.size(); ++i) {
        const double e = static_cast<double>(got[d].logits[i]) - ref[d].logits[i];
        err2 += e * e;
        norm2 += static_cast<double>(ref[d].logits[i]) * ref[d].logits[i];
      }
      bool agree = true;
      for (int64_t r = 0; r < rows; ++r) {
        const bool eq = got[d].tokens[static_cast<size_t>(r)] == ref[d].tokens[static_cast<size_t>(r)];
        same += eq;
        agree = agree && eq;
        prefix += agree;
        double kl = 0;
        for (int64_t i = 0; i < V; ++i) {
          const double p = ref[d].logp[static_cast<size_t>(r * V + i)], qv = got[d].logp[static_cast<size_t>(r * V + i)];
          kl += std::exp(p) * (p - qv);
        }
        kl_sum += kl;
        kl_max = std::max(kl_max, kl);
      }
    }
    const double n = static_cast<double>(ref.size());
    std::printf("%-30s %9.1f%% %8.2f / %lld %12.2e %12.2e %11.2f%%\n", v.name,
                100 * same / (n * static_cast<double>(rows)), prefix / n, static_cast<long long>(rows),
                kl_sum / (n * static_cast<double>(rows)), kl_max, 100 * std::sqrt(err2 / norm2));
  }
  return 0;
}

}  // namespace
}  // namespace tpdraft::bench

int main(int argc, char** argv) {
  using namespace tpdraft::bench;
  Args a;
  CLI::App app{"How far quantized drafts are from the bf16 ones on random weights", "quant_quality"};
  app.add_option("--config", a.config, "Drafter config.json")->capture_default_str();
  app.add_option("--ctx", a.ctx, "Context rows settled per context")->capture_default_str();
  app.add_option("--contexts", a.contexts, "Random contexts")->capture_default_str();
  app.add_option("--anchors", a.anchors, "Drafts per context")->capture_default_str();
  app.add_option("--outliers", a.outliers, "Scale of the outlier input channels (1: none)")->capture_default_str();
  app.add_option("--threads", a.threads, "Threads")->capture_default_str();
  return bench_main(app, argc, argv, [&] { return run(a); });
}
