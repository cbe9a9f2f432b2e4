// Random checkpoint generation: every element is a counter-based function of (seed, tensor
// name, index), so the result does not depend on the thread count; uniform values with the
// variance each tensor kind needs (1/fan_in for projections, ~1 for norms and embeddings).
#include "model/random_checkpoint.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace tpdraft::model {

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// How a tensor's values are drawn: center + uniform(-a, a), a = sqrt(3) * sigma.
struct Law {
  double center = 0, sigma = 0;
};

Law law_for(const std::string& name, const std::vector<int64_t>& shape, const DrafterConfig& c) {
  auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with("norm.weight") || ends_with("layernorm.weight")) return {1.0, 0.05};
  if (ends_with(".bias")) return {0.0, 0.02};
  if (ends_with("base_kernel")) return {0.0, 0.1};  // tap 0 is shifted to ~1 below
  if (ends_with("kernel_projection.weight")) return {0.0, 0.05 / std::sqrt(static_cast<double>(c.hidden))};
  if (ends_with("_codebook")) return {0.0, std::pow(static_cast<double>(c.selector_rank), -0.25)};
  if (ends_with("embed_tokens.weight")) return {0.0, 1.0};
  // Linear layers [out, in], the head included: unit-variance outputs for unit-RMS inputs.
  return {0.0, 1.0 / std::sqrt(static_cast<double>(shape.back()))};
}

OwnedTensor generate(const std::string& name, const std::vector<int64_t>& shape, DType dtype, const Law& law,
                     uint64_t seed, ThreadPool& pool) {
  OwnedTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = shape;
  const int64_t n = checked_numel(shape, "random tensor '{}'", name);
  t.bytes.resize(checked_bytes(shape, dtype_size(dtype), "random tensor '{}'", name));
  const uint64_t key = mix(seed ^ name_hash(name));
  const double a = std::sqrt(3.0) * law.sigma;
  const bool base_kernel = name.size() > 11 && name.compare(name.size() - 11, 11, "base_kernel") == 0;
  const int64_t kh = base_kernel ? shape[1] * shape[2] : 0, h = base_kernel ? shape[2] : 0;
  pool.parallel_for(
      n,
      [&](int64_t begin, int64_t end, int) {
        std::vector<float> buf(4096);
        for (int64_t i0 = begin; i0 < end; i0 += 4096) {
          const int64_t cnt = std::min<int64_t>(4096, end - i0);
          for (int64_t j = 0; j < cnt; ++j) {
            const int64_t i = i0 + j;
            const double u = static_cast<double>(mix(key + static_cast<uint64_t>(i)) >> 11) * (1.0 / 9007199254740992.0);
            double v = law.center + a * (2.0 * u - 1.0);
            if (base_kernel && (i % kh) < h) v += 1.0;  // tap 0 of each side starts near identity
            buf[static_cast<size_t>(j)] = static_cast<float>(v);
          }
          convert_from_f32(dtype, buf.data(), t.bytes.data() + static_cast<size_t>(i0) * dtype_size(dtype),
                           static_cast<size_t>(cnt));
        }
      },
      4096);
  return t;
}

std::vector<OwnedTensor> generate_all(const std::vector<std::pair<std::string, std::vector<int64_t>>>& specs,
                                      const DrafterConfig& cfg, const RandomCheckpointOptions& opt,
                                      const std::function<void(size_t, size_t)>& progress) {
  TPDRAFT_CHECK(is_float_weight(opt.dtype), "random checkpoint dtype must be F32, F16 or BF16, got {}",
                dtype_name(opt.dtype));
  ThreadPool pool(opt.threads);
  std::vector<OwnedTensor> out;
  out.reserve(specs.size());
  for (const auto& [name, shape] : specs) {
    out.push_back(generate(name, shape, opt.dtype, law_for(name, shape, cfg), opt.seed, pool));
    if (progress) progress(out.size(), specs.size());
  }
  return out;
}

void write_tensors(const std::vector<OwnedTensor>& tensors, const std::string& path) {
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const auto& t : tensors) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  w.write(path);
}

void write_json(const nlohmann::json& j, const std::string& path) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  TPDRAFT_CHECK(out.good(), "{}: cannot write", path);
}

}  // namespace

std::vector<OwnedTensor> random_drafter_tensors(const DrafterConfig& cfg, const RandomCheckpointOptions& opt,
                                                const std::function<void(size_t, size_t)>& progress) {
  return generate_all(expected_drafter_tensors(cfg), cfg, opt, progress);
}

std::vector<OwnedTensor> random_target_tensors(const DrafterConfig& cfg, const RandomCheckpointOptions& opt,
                                               const std::function<void(size_t, size_t)>& progress) {
  const int64_t vt = opt.target_vocab > 0 ? opt.target_vocab : cfg.vocab;
  TPDRAFT_CHECK(vt >= cfg.vocab, "target vocab {} must be >= the drafter's vocab_size {}", vt, cfg.vocab);
  std::vector<std::pair<std::string, std::vector<int64_t>>> specs = {{"model.embed_tokens.weight", {vt, cfg.hidden}}};
  if (!opt.tie_embeddings) specs.push_back({"lm_head.weight", {vt, cfg.hidden}});
  return generate_all(specs, cfg, opt, progress);
}

std::vector<float> random_taps(const DrafterConfig& cfg, int64_t n, uint64_t seed) {
  const int64_t w = checked_mul(cfg.n_taps(), cfg.hidden, "random taps: row width T*H");
  std::vector<float> taps(static_cast<size_t>(checked_numel({n, w}, "random taps: {} rows of T*H = {} values", n, w)));
  const uint64_t key = mix(seed ^ name_hash("taps"));
  for (size_t i = 0; i < taps.size(); ++i) {
    const double u = static_cast<double>(mix(key + i) >> 11) * (1.0 / 9007199254740992.0);
    taps[i] = static_cast<float>(std::sqrt(3.0) * (2.0 * u - 1.0));
  }
  return taps;
}

void write_random_checkpoint(const DrafterConfig& cfg, const std::string& dir, const RandomCheckpointOptions& opt,
                             int64_t taps_rows) {
  namespace fs = std::filesystem;
  const fs::path root(dir), drafter = root / "drafter", target = root / "target";
  std::error_code ec;
  fs::create_directories(drafter, ec);
  TPDRAFT_CHECK(!ec, "{}: cannot create directory ({})", drafter.string(), ec.message());
  fs::create_directories(target, ec);
  TPDRAFT_CHECK(!ec, "{}: cannot create directory ({})", target.string(), ec.message());

  auto report = [](const char* what) {
    return [what](size_t done, size_t total) {
      if (done == total || done % 16 == 0) TPDRAFT_LOG_INFO("{}: {}/{} tensors generated", what, done, total);
    };
  };
  write_tensors(random_drafter_tensors(cfg, opt, report("drafter")), (drafter / "model.safetensors").string());
  write_json(cfg.to_json(), (drafter / "config.json").string());
  TPDRAFT_LOG_INFO("wrote {}", drafter.string());

  write_tensors(random_target_tensors(cfg, opt, report("target")), (target / "model.safetensors").string());
  nlohmann::json tj;
  tj["hidden_size"] = cfg.hidden;
  tj["vocab_size"] = opt.target_vocab > 0 ? opt.target_vocab : cfg.vocab;
  tj["tie_word_embeddings"] = opt.tie_embeddings;
  write_json(tj, (target / "config.json").string());
  TPDRAFT_LOG_INFO("wrote {}", target.string());

  if (taps_rows > 0) {
    const std::vector<float> taps = random_taps(cfg, taps_rows, opt.seed);
    SafetensorsWriter w;
    w.add("taps", DType::F32, {taps_rows, cfg.n_taps() * cfg.hidden}, taps.data(), taps.size() * sizeof(float));
    w.write((root / "taps.safetensors").string());
    TPDRAFT_LOG_INFO("wrote {} ({} rows)", (root / "taps.safetensors").string(), taps_rows);
  }
}

}  // namespace tpdraft::model
