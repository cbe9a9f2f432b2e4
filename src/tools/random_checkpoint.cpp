// Random checkpoint generation: every element is a counter-based function of (seed, tensor
// name, index), so the result does not depend on the thread count; uniform values with the
// variance each tensor kind needs (1/fan_in for projections, ~1 for norms and embeddings).
// Sizes are checked against memory before anything is generated, and a checkpoint on disk is
// written beside its destination and moved into place whole.
#include "tools/random_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "core/strings.h"
#include "core/thread_pool.h"
#include "model/draft_vocab.h"
#include "model/selection.h"
#include "model/weights.h"

namespace tpdraft::model {

namespace {

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Element i of the stream `key` as a uniform double in [0, 1), from its top 53 bits.
double uniform(uint64_t key, uint64_t i) {
  return static_cast<double>(splitmix64(key + i) >> 11) * (1.0 / 9007199254740992.0);
}

using Specs = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// How a tensor's values are drawn: center + uniform(-a, a), a = sqrt(3) * sigma.
struct Law {
  double center = 0, sigma = 0;
};

Law law_for(const std::string& name, const std::vector<int64_t>& shape, const DrafterConfig& c) {
  if (ends_with(name, "norm.weight") || ends_with(name, "layernorm.weight")) return {1.0, 0.05};
  if (ends_with(name, ".bias")) return {0.0, 0.02};
  if (ends_with(name, "base_kernel")) return {0.0, 0.1};  // tap 0 is shifted to ~1 below
  if (ends_with(name, "kernel_projection.weight")) return {0.0, 0.05 / std::sqrt(static_cast<double>(c.hidden))};
  if (ends_with(name, "_codebook")) return {0.0, std::pow(static_cast<double>(c.selector_rank), -0.25)};
  if (ends_with(name, "embed_tokens.weight")) return {0.0, 1.0};
  // Linear layers [out, in], the head included: unit-variance outputs for unit-RMS inputs.
  return {0.0, 1.0 / std::sqrt(static_cast<double>(shape.back()))};
}

OwnedTensor generate(const std::string& name, const std::vector<int64_t>& shape, DType dtype, const Law& law,
                     uint64_t seed, ThreadPool& pool) {
  const int64_t n = checked_numel(shape, "random tensor '{}'", name);
  OwnedTensor t{name, dtype, shape,
                std::vector<std::byte>(checked_bytes(shape, dtype_size(dtype), "random tensor '{}'", name))};
  const uint64_t key = splitmix64(seed ^ name_hash(name));
  const double a = std::sqrt(3.0) * law.sigma;
  const bool base_kernel = ends_with(name, "base_kernel");
  const int64_t kh = base_kernel ? shape[1] * shape[2] : 0, h = base_kernel ? shape[2] : 0;
  pool.parallel_for(
      n,
      [&](int64_t begin, int64_t end, int) {
        std::vector<float> buf(4096);
        for (int64_t i0 = begin; i0 < end; i0 += 4096) {
          const int64_t cnt = std::min<int64_t>(4096, end - i0);
          for (int64_t j = 0; j < cnt; ++j) {
            const int64_t i = i0 + j;
            double v = law.center + a * (2.0 * uniform(key, static_cast<uint64_t>(i)) - 1.0);
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

std::vector<OwnedTensor> generate_all(const Specs& specs, const DrafterConfig& cfg,
                                      const RandomCheckpointOptions& opt,
                                      const std::function<void(size_t, size_t)>& progress) {
  ThreadPool pool(opt.threads);
  std::vector<OwnedTensor> out;
  out.reserve(specs.size());
  for (const auto& [name, shape] : specs) {
    out.push_back(generate(name, shape, opt.dtype, law_for(name, shape, cfg), opt.seed, pool));
    if (progress) progress(out.size(), specs.size());
  }
  return out;
}

int64_t target_rows(const DrafterConfig& cfg, const RandomCheckpointOptions& opt) {
  return opt.target_vocab > 0 ? opt.target_vocab : cfg.vocab;
}

// The config keys that size a tensor, with their values: what a user would shrink.
std::string sized_by(const std::string& name, const DrafterConfig& c, int64_t vt) {
  if (starts_with(name, "layers."))
    return fmt::format("the layers: num_hidden_layers = {} of hidden_size = {}, intermediate_size = {}", c.layers,
                       c.hidden, c.ffn);
  if (name == "fc.weight")
    return fmt::format("fc.weight: hidden_size = {} x {} target_layer_ids x hidden_size", c.hidden, c.n_taps());
  if (ends_with(name, "_codebook"))
    return fmt::format("the selector codebooks: vocab_size = {} x selector_rank = {}", c.vocab, c.selector_rank);
  if (starts_with(name, "drafter ")) return fmt::format("the drafter's own embedding and head: vocab_size = {} x "
                                                       "hidden_size = {}", c.vocab, c.hidden);
  if (ends_with(name, "embed_tokens.weight") || ends_with(name, "lm_head.weight"))
    return fmt::format("the target embedding and head: {} = {} x hidden_size = {}",
                       vt == c.vocab ? "vocab_size" : "target vocab", vt, c.hidden);
  return "the norms and small projections";
}

// Refuses, before anything is generated, random weights (drafter and target together: every use
// holds both) whose bytes exceed this machine's memory, naming the keys of the largest part.
void check_fits_in_memory(const Specs& specs, const DrafterConfig& cfg, const RandomCheckpointOptions& opt) {
  std::map<std::string, int64_t> parts;
  int64_t total = 0;
  for (const auto& [name, shape] : specs) {
    const auto bytes = static_cast<int64_t>(checked_bytes(shape, dtype_size(opt.dtype), "random tensor '{}'", name));
    int64_t& part = parts[sized_by(name, cfg, target_rows(cfg, opt))];
    part = checked_add(part, bytes, "random weights: bytes of {}", name);
    total = checked_add(total, bytes, "random weights: bytes in all");
  }
  const uint64_t memory = machine_memory();
  if (memory == 0 || static_cast<uint64_t>(total) <= memory) return;
  const auto largest = std::max_element(parts.begin(), parts.end(),
                                        [](const auto& a, const auto& b) { return a.second < b.second; });
  TPDRAFT_FAIL("random {} weights for this config take {} bytes ({:.1f} GiB), more than this machine's memory of {} "
               "bytes ({:.1f} GiB); the largest part is {} ({} bytes)",
               dtype_name(opt.dtype), total, gib(static_cast<uint64_t>(total)), memory, gib(memory), largest->first,
               largest->second);
}

// The bytes of n random tap rows, refused when they do not fit in this machine's memory.
size_t taps_bytes(const DrafterConfig& cfg, int64_t n) {
  const int64_t w = checked_mul(cfg.n_taps(), cfg.hidden, "random taps: row width T*H");
  const size_t bytes = checked_bytes({n, w}, sizeof(float), "random taps: {} rows of T*H = {} values", n, w);
  const uint64_t memory = machine_memory();
  TPDRAFT_CHECK(memory == 0 || bytes <= memory,
                "random taps: {} rows of T*H = {} f32 values take {} bytes ({:.1f} GiB), more than this machine's "
                "memory of {} bytes ({:.1f} GiB)",
                n, w, bytes, gib(bytes), memory, gib(memory));
  return bytes;
}

Specs target_specs(const DrafterConfig& cfg, const RandomCheckpointOptions& opt) {
  const int64_t vt = target_rows(cfg, opt);
  TPDRAFT_CHECK(opt.target_vocab == 0 || (opt.target_vocab >= cfg.vocab && opt.target_vocab <= size_limit("vocab_size")),
                "target vocab {} must be 0 (the drafter's vocab_size) or in [vocab_size = {}, {}]", opt.target_vocab,
                cfg.vocab, size_limit("vocab_size"));
  Specs specs = {{"model.embed_tokens.weight", {vt, cfg.hidden}}};
  if (!opt.tie_embeddings) specs.push_back({"lm_head.weight", {vt, cfg.hidden}});
  return specs;
}

// A speculators drafter's own float tables: its embedding (unless the options leave it out) and,
// with a draft vocabulary, its reduced head.
Specs own_table_specs(const DrafterConfig& cfg, const RandomCheckpointOptions& opt) {
  Specs specs;
  if (cfg.layout != Layout::Speculators) return specs;
  if (opt.own_embedding) specs.push_back({"embed_tokens.weight", {cfg.vocab, cfg.hidden}});
  if (cfg.draft_vocab > 0) specs.push_back({"lm_head.weight", {cfg.draft_vocab, cfg.hidden}});
  return specs;
}

// Validates the config (it may have been made in code) and the options, then the memory all of
// the random tensors will take; throws before anything is allocated.
void check_random_weights(const DrafterConfig& cfg, const RandomCheckpointOptions& opt) {
  cfg.validate("random weights' config");
  TPDRAFT_CHECK(is_float_weight(opt.dtype), "random checkpoint dtype must be F32, F16 or BF16, got {}",
                dtype_name(opt.dtype));
  TPDRAFT_CHECK(opt.threads >= 0, "random weights: thread count must be >= 0, got {}", opt.threads);
  Specs all = expected_drafter_tensors(cfg);
  for (auto& [name, shape] : own_table_specs(cfg, opt)) all.push_back({"drafter " + name, shape});
  for (auto& spec : target_specs(cfg, opt)) all.push_back(std::move(spec));
  check_fits_in_memory(all, cfg, opt);
}

void write_tensors(const std::vector<OwnedTensor>& tensors, const std::string& path) {
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const auto& t : tensors) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  w.write(path);
}

void write_json(const nlohmann::json& j, const std::string& path) {
  TPDRAFT_CHECK(write_file_whole(path, j.dump(2) + "\n"), "{}: cannot write", path);
}

}  // namespace

std::vector<OwnedTensor> random_drafter_tensors(const DrafterConfig& cfg, const RandomCheckpointOptions& opt,
                                                const std::function<void(size_t, size_t)>& progress) {
  check_random_weights(cfg, opt);
  Specs specs = expected_drafter_tensors(cfg);
  for (auto& spec : own_table_specs(cfg, opt)) specs.push_back(std::move(spec));
  std::vector<OwnedTensor> out = generate_all(specs, cfg, opt, progress);
  if (cfg.layout == Layout::Speculators && cfg.draft_vocab > 0) {
    // The map: draft row i scores target id ids[i] = i + d2t[i]; t2d marks those ids.
    const std::vector<int64_t> ids = random_draft_ids(cfg, opt.seed);
    OwnedTensor d2t{"d2t", DType::I64, {cfg.draft_vocab}, std::vector<std::byte>(ids.size() * sizeof(int64_t))};
    OwnedTensor t2d{"t2d", DType::BOOL, {cfg.vocab}, std::vector<std::byte>(static_cast<size_t>(cfg.vocab))};
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t offset = ids[i] - static_cast<int64_t>(i);
      std::memcpy(d2t.bytes.data() + i * sizeof(int64_t), &offset, sizeof(int64_t));
      t2d.bytes[static_cast<size_t>(ids[i])] = std::byte{1};
    }
    out.push_back(std::move(d2t));
    out.push_back(std::move(t2d));
  }
  return out;
}

std::vector<int64_t> random_draft_ids(const DrafterConfig& cfg, uint64_t seed) {
  return random_token_ids(cfg.vocab, cfg.draft_vocab, splitmix64(seed ^ name_hash("d2t")));
}

std::vector<OwnedTensor> random_target_tensors(const DrafterConfig& cfg, const RandomCheckpointOptions& opt,
                                               const std::function<void(size_t, size_t)>& progress) {
  check_random_weights(cfg, opt);
  return generate_all(target_specs(cfg, opt), cfg, opt, progress);
}

std::vector<float> random_taps(const DrafterConfig& cfg, int64_t n, uint64_t seed) {
  std::vector<float> taps(taps_bytes(cfg, n) / sizeof(float));
  const uint64_t key = splitmix64(seed ^ name_hash("taps"));
  for (size_t i = 0; i < taps.size(); ++i) taps[i] = static_cast<float>(std::sqrt(3.0) * (2.0 * uniform(key, i) - 1.0));
  return taps;
}

namespace {

namespace fs = std::filesystem;

// Refuses a destination init must not replace: anything but nothing, an empty directory, or a
// directory holding only what init writes (drafter/ and target/ with config.json and
// *.safetensors files, taps.safetensors). A typo in --out must never delete someone's data.
void check_replaceable(const fs::path& dest, const std::string& shown) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(dest, ec);
  if (!fs::exists(st)) return;
  TPDRAFT_CHECK(fs::is_directory(st), "{}: exists and is not a directory; init writes a checkpoint directory there",
                shown);
  auto refuse = [&](const std::string& what) {
    TPDRAFT_FAIL("{}: exists and is not a tpdraft checkpoint (it holds '{}'); init replaces only an empty directory "
                 "or one holding just drafter/, target/ and taps.safetensors: choose another output directory or "
                 "remove this one",
                 shown, what);
  };
  for (const auto& e : fs::directory_iterator(dest)) {
    const std::string name = e.path().filename().string();
    if (name == "taps.safetensors" && e.is_regular_file() && !e.is_symlink()) continue;
    if ((name != "drafter" && name != "target") || e.is_symlink() || !e.is_directory()) refuse(name);
    for (const auto& f : fs::directory_iterator(e.path())) {
      const std::string file = f.path().filename().string();
      const bool ours = file == "config.json" || (file.size() > 12 && ends_with(file, ".safetensors"));
      if (!ours || f.is_symlink() || !f.is_regular_file()) refuse(name + "/" + file);
    }
  }
}

// A fresh directory beside the destination, on the same file system so that it can be renamed
// into place; removed with whatever it holds unless committed.
class Staging {
 public:
  explicit Staging(const fs::path& dest) : dest_(dest) {
    std::random_device rd;
    for (int attempt = 0; attempt < 100 && path_.empty(); ++attempt) {
      const fs::path p = dest.parent_path() / fmt::format(".{}.tmp-{:08x}", dest.filename().string(), rd());
      std::error_code ec;
      if (fs::create_directory(p, ec)) path_ = p;
      TPDRAFT_CHECK(!ec, "{}: cannot create a directory to write the checkpoint in ({})", p.string(), ec.message());
    }
    TPDRAFT_CHECK(!path_.empty(), "{}: no free temporary name beside it", dest.string());
  }
  ~Staging() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  const fs::path& path() const { return path_; }

  // Puts the finished checkpoint at the destination in one step: a rename onto nothing or onto
  // an empty directory, else an exchange with the old checkpoint, which is then removed.
  void commit() {
    std::error_code ec;
    if (!fs::exists(dest_, ec) || fs::is_empty(dest_, ec)) {
      fs::rename(path_, dest_, ec);
      TPDRAFT_CHECK(!ec, "{}: cannot move the checkpoint into place ({})", dest_.string(), ec.message());
      path_.clear();
      return;
    }
#ifdef RENAME_EXCHANGE
    if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, dest_.c_str(), RENAME_EXCHANGE) == 0) return;  // old one in path_
#endif
    // No atomic exchange on this file system: move the old one aside first.
    const fs::path old = path_.string() + ".old";
    fs::rename(dest_, old, ec);
    TPDRAFT_CHECK(!ec, "{}: cannot move the earlier checkpoint aside ({})", dest_.string(), ec.message());
    fs::rename(path_, dest_, ec);
    TPDRAFT_CHECK(!ec, "{}: cannot move the checkpoint into place ({}); the earlier one is at {}", dest_.string(),
                  ec.message(), old.string());
    path_ = old;
  }

 private:
  fs::path dest_, path_;
};

// Writes every file of the checkpoint under root (a fresh, empty directory).
void write_files(const DrafterConfig& cfg, const fs::path& root, const RandomCheckpointOptions& opt,
                 int64_t taps_rows) {
  const fs::path drafter = root / "drafter", target = root / "target";
  for (const fs::path& d : {drafter, target}) {
    std::error_code ec;
    fs::create_directory(d, ec);
    TPDRAFT_CHECK(!ec, "{}: cannot create directory ({})", d.string(), ec.message());
  }
  auto report = [](const char* what) {
    return [what](size_t done, size_t total) {
      if (done == total || done % 16 == 0) TPDRAFT_LOG_INFO("{}: {}/{} tensors generated", what, done, total);
    };
  };
  write_tensors(random_drafter_tensors(cfg, opt, report("drafter")), (drafter / "model.safetensors").string());
  write_json(cfg.to_json(), (drafter / "config.json").string());
  write_tensors(random_target_tensors(cfg, opt, report("target")), (target / "model.safetensors").string());
  write_json({{"hidden_size", cfg.hidden}, {"vocab_size", target_rows(cfg, opt)},
              {"tie_word_embeddings", opt.tie_embeddings}},
             (target / "config.json").string());
  if (taps_rows > 0) {
    const std::vector<float> taps = random_taps(cfg, taps_rows, opt.seed);
    SafetensorsWriter w;
    w.add("taps", DType::F32, {taps_rows, cfg.n_taps() * cfg.hidden}, taps.data(), taps.size() * sizeof(float));
    w.write((root / "taps.safetensors").string());
  }
}

}  // namespace

void write_random_checkpoint(const DrafterConfig& cfg, const std::string& dir, const RandomCheckpointOptions& opt,
                             int64_t taps_rows) {
  // Everything that can be refused is refused before the first byte is written.
  check_random_weights(cfg, opt);
  TPDRAFT_CHECK(taps_rows >= 0, "random taps: row count must be >= 0, got {}", taps_rows);
  taps_bytes(cfg, taps_rows);
  TPDRAFT_CHECK(!dir.empty(), "init: the output directory name is empty");
  fs::path dest = fs::absolute(fs::path(dir)).lexically_normal();
  if (!dest.has_filename()) dest = dest.parent_path();  // "ck/" names ck
  check_replaceable(dest, dir);
  std::error_code ec;
  fs::create_directories(dest.parent_path(), ec);
  TPDRAFT_CHECK(!ec, "{}: cannot create directory ({})", dest.parent_path().string(), ec.message());

  Staging staging(dest);
  write_files(cfg, staging.path(), opt, taps_rows);
  staging.commit();
  TPDRAFT_LOG_INFO("wrote {}: drafter/, target/{}", dir, taps_rows > 0 ? fmt::format(", taps.safetensors ({} rows)", taps_rows) : "");
}

}  // namespace tpdraft::model
