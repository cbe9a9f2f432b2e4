// Loading a rank's weights (src/model/weights.cpp) and making random ones
// (src/tools/random_checkpoint.cpp) from bad inputs: every tensor is checked before the first
// allocation, a NaN or Inf is found where the rank copies it or where a row lookup reads it, and
// random weights that cannot fit in memory are refused before anything is generated.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "engine/runtime.h"
#include "kernels/ops.h"
#include "model/weights.h"
#include "parallel/communicator.h"
#include "support/rank.h"
#include "support/test_support.h"
#include "tools/random_checkpoint.h"

namespace tpdraft::model {
namespace {

using testing::expect_error;
using testing::shipped_config;

// The CPU backend, counting its allocations.
class CountingOps final : public kernels::Ops {
 public:
  int allocs = 0;
  const char* name() const override { return inner_->name(); }
  bool host_memory() const override { return inner_->host_memory(); }
  void* alloc(size_t bytes) override {
    ++allocs;
    return inner_->alloc(bytes);
  }
  void release(void* p) override { inner_->release(p); }
  void to_device(void* dst, const void* src, size_t n) override { inner_->to_device(dst, src, n); }
  void to_host(void* dst, const void* src, size_t n) override { inner_->to_host(dst, src, n); }
  void sync() override { inner_->sync(); }
  void do_matmul(const kernels::Matrix& w, const float* x, int64_t m, float* y, const float* bias) override {
    inner_->matmul(w, x, m, y, bias);
  }
  void do_head_norm_rope(float* x, const float* w, int64_t rows, int64_t heads, int64_t d, float eps,
                         const int64_t* positions, double theta) override {
    inner_->head_norm_rope(x, w, rows, heads, d, eps, positions, theta);
  }
  void do_attention(const kernels::AttentionParams& p) override { inner_->attention(p); }
  void do_dyn_conv(const kernels::ConvParams& p) override { inner_->dyn_conv(p); }
  void do_silu_mul(const float* g, const float* u, float* out, int64_t n) override { inner_->silu_mul(g, u, out, n); }
  void do_add_rms_norm(float* h, const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) override {
    inner_->add_rms_norm(h, x, w, y, rows, n, eps);
  }
  void do_gather_rows(const float* src, const int64_t* index, int64_t rows, int64_t len, float* dst) override {
    inner_->gather_rows(src, index, rows, len, dst);
  }
  void do_store_rows(const float* src, int64_t rows, int64_t len, float* dst, int64_t cap, int64_t first) override {
    inner_->store_rows(src, rows, len, dst, cap, first);
  }
  void do_head_logits(const kernels::HeadParams& p, float* logits) override { inner_->head_logits(p, logits); }
  void do_head_topk(const kernels::HeadParams& p, int k, int64_t base, float* v, int64_t* ids) override {
    inner_->head_topk(p, k, base, v, ids);
  }
  void begin_capture() override { inner_->begin_capture(); }
  std::unique_ptr<kernels::OpGraph> end_capture() override { return inner_->end_capture(); }
  void abort_capture() noexcept override { inner_->abort_capture(); }
  void replay(const kernels::OpGraph& g) override { inner_->replay(g); }

 private:
  std::unique_ptr<kernels::Ops> inner_ = kernels::make_cpu_ops(1);
};

std::vector<OwnedTensor> without(std::vector<OwnedTensor> tensors, const std::string& name) {
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(), [&](const OwnedTensor& t) { return t.name == name; }),
                tensors.end());
  return tensors;
}

// ---- presence and shapes before any allocation ------------------------------------------------

TEST(Weights, EveryTensorIsCheckedBeforeTheFirstAllocation) {
  const DrafterConfig cfg = shipped_config("tiny-dflash2.json");
  RandomCheckpointOptions o;
  o.threads = 1;
  const auto drafter = random_drafter_tensors(cfg, o);
  const auto target = random_target_tensors(cfg, o);
  const ShardPlan plan = ShardPlan::make(cfg, 0, 1);
  // Loads d and t on a fresh backend; returns its allocations, after the error when one is expected.
  auto allocs_loading = [&](std::vector<OwnedTensor> d, std::vector<OwnedTensor> t,
                            const std::vector<std::string>& error = {}) {
    CountingOps ops;
    auto load = [&] {
      DrafterWeights w(cfg, TensorStore::from_memory("drafter", std::move(d)),
                       TensorStore::from_memory("target", std::move(t)), plan, ops);
    };
    if (error.empty()) load();
    else expect_error(load, error);
    return ops.allocs;
  };
  EXPECT_GT(allocs_loading(drafter, target), 0);  // the complete checkpoint loads
  // The last tensors read: the last layer's down projection, a codebook, the target's head.
  EXPECT_EQ(allocs_loading(without(drafter, "layers.1.mlp.down_proj.weight"), target,
                           {"drafter", "'layers.1.mlp.down_proj.weight'", "missing", "[64, 80]"}), 0);
  EXPECT_EQ(allocs_loading(without(drafter, "candidate_selector.successor_codebook"), target,
                           {"drafter", "'candidate_selector.successor_codebook'", "missing"}), 0);
  EXPECT_EQ(allocs_loading(drafter, without(target, "model.embed_tokens.weight"),
                           {"target", "'model.embed_tokens.weight'", "missing"}), 0);
  // A shape that differs from the config's.
  auto wrong = drafter;
  for (auto& t : wrong)
    if (t.name == "layers.1.self_attn.o_proj.weight") t.shape = {32, 128};
  EXPECT_EQ(allocs_loading(wrong, target, {"'layers.1.self_attn.o_proj.weight'", "[32, 128]", "[64, 64]"}), 0);
}

// ---- non-finite values ------------------------------------------------------------------------

// A random checkpoint on disk, for tests to plant values in, and loads of a rank's share of it.
struct Checkpoint {
  testing::TempDir dir;
  DrafterConfig cfg;
  std::unique_ptr<kernels::Ops> ops = kernels::make_cpu_ops(1);

  Checkpoint(const std::string& config, DType dtype, bool tie = false, int64_t target_vocab = 0)
      : cfg(shipped_config(config)) {
    RandomCheckpointOptions o;
    o.seed = 5;
    o.dtype = dtype;
    o.tie_embeddings = tie;
    o.target_vocab = target_vocab;
    o.threads = 1;
    write_random_checkpoint(cfg, dir.path(), o, 0);
  }
  std::string drafter_file() const { return dir.file("drafter/model.safetensors"); }
  std::string target_file() const { return dir.file("target/model.safetensors"); }
  std::unique_ptr<DrafterWeights> load(int rank = 0, int tp = 1) {
    return std::make_unique<DrafterWeights>(cfg, TensorStore::open(dir.file("drafter")),
                                            TensorStore::open(dir.file("target")), ShardPlan::make(cfg, rank, tp),
                                            *ops);
  }
};

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Weights, NonFiniteValuesAreFoundWhileLoading) {
  struct Case {
    std::string config;
    DType dtype;
    bool target;
    std::string tensor;
    int64_t index;
    float value;
    std::string where;
  };
  const Case cases[] = {
      {"tiny-dflash2.json", DType::BF16, false, "fc.weight", 5, kNaN, "row 0, column 5"},
      {"tiny-dflash2.json", DType::F16, false, "layers.1.mlp.down_proj.weight", 3 * 80 + 7, kInf, "row 3, column 7"},
      {"tiny-dflash.json", DType::F32, true, "lm_head.weight", 10 * 64 + 2, -kInf, "row 10, column 2"},
      {"tiny-dflash.json", DType::BF16, false, "layers.0.input_layernorm.weight", 9, kNaN, "element 9"},
      {"tiny-dflash2.json", DType::BF16, false, "layers.0.attention_conv.base_kernel", 70, kInf, "element 70"},
      {"tiny-dflash2.json", DType::F32, false, "candidate_selector.hidden_projection.weight", 64 + 1, kNaN,
       "row 1, column 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tensor);
    Checkpoint ck(c.config, c.dtype);
    const std::string file = c.target ? ck.target_file() : ck.drafter_file();
    testing::set_element(file, c.tensor, c.index, c.value);
    expect_error([&] { ck.load(); }, {file, "'" + c.tensor + "'", "non-finite", c.where});
  }
}

TEST(Weights, EachRankChecksTheShareItCopies) {
  // tiny-dflash2: V = 257; at tp 2 rank 0 holds head rows [0, 129), rank 1 [129, 257).
  Checkpoint ck("tiny-dflash2.json", DType::BF16, false, 260);
  testing::set_element(ck.target_file(), "lm_head.weight", 256 * 64 + 4, kNaN);
  EXPECT_NO_THROW(ck.load(0, 2));
  expect_error([&] { ck.load(1, 2); }, {"'lm_head.weight'", "row 256, column 4"});
  // Padding rows past V are never read, so a NaN there costs nothing.
  Checkpoint padded("tiny-dflash2.json", DType::BF16, false, 260);
  testing::set_element(padded.target_file(), "lm_head.weight", 258 * 64, kNaN);
  EXPECT_NO_THROW(padded.load());
  // A tied head is the embedding: its rows are copied, and checked, at load.
  Checkpoint tied("tiny-dflash.json", DType::BF16, true);
  testing::set_element(tied.target_file(), "model.embed_tokens.weight", 2 * 64 + 63, kInf);
  expect_error([&] { tied.load(); }, {tied.target_file(), "'model.embed_tokens.weight'", "row 2, column 63"});
}

TEST(Weights, TableRowsAreCheckedWhenLookedUp) {
  Checkpoint ck("tiny-dflash2.json", DType::BF16);
  testing::set_element(ck.target_file(), "model.embed_tokens.weight", 7 * 64 + 3, kNaN);
  testing::set_element(ck.drafter_file(), "candidate_selector.predecessor_codebook", 11 * 8 + 2, kInf);
  testing::set_element(ck.drafter_file(), "candidate_selector.successor_codebook", 12 * 8, -kInf);
  auto w = ck.load();  // the embedding and codebooks stay mapped: nothing read yet
  std::vector<float> row(64);
  expect_error([&] { w->embedding_row(7, row.data()); },
               {ck.target_file(), "'model.embed_tokens.weight'", "row 7", "column 3", "non-finite"});
  expect_error([&] { w->predecessor(11, row.data()); },
               {ck.drafter_file(), "'candidate_selector.predecessor_codebook'", "row 11", "column 2"});
  expect_error([&] { w->successor(12, row.data()); },
               {ck.drafter_file(), "'candidate_selector.successor_codebook'", "row 12", "column 0"});
  // Their neighbours read back as written.
  auto target = TensorStore::open(ck.dir.file("target"));
  const std::vector<float> all = to_f32(*target->find("embed_tokens.weight"));
  w->embedding_row(8, row.data());
  EXPECT_EQ(row, std::vector<float>(all.begin() + 8 * 64, all.begin() + 9 * 64));
  w->predecessor(12, row.data());
  w->successor(11, row.data());
}

TEST(Weights, DraftFromANonFiniteEmbeddingRowFailsInsteadOfReturningGarbage) {
  // Before the row check, this draft returned token -1 with probability 1.
  Checkpoint ck("tiny-dflash.json", DType::BF16);
  testing::set_element(ck.target_file(), "model.embed_tokens.weight", 7 * 64, kNaN);
  auto comm = parallel::make_single_rank();
  const auto rt = testing::open_rank(*comm, ck.dir.path(), ck.cfg);
  Drafter& drafter = rt->drafter();
  auto session = drafter.new_session();
  const std::vector<float> taps = random_taps(ck.cfg, 4, 1);
  drafter.settle(*session, 0, taps.data(), 4);
  expect_error([&] { drafter.draft({{session.get(), 7, {}}}); }, {"'model.embed_tokens.weight'", "row 7"});
  const auto ok = drafter.draft({{session.get(), 8, {}}});
  for (int64_t t : ok[0].tokens) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, ck.cfg.vocab);
  }
}

// ---- random weights and the machine's memory ------------------------------------------------

TEST(RandomWeights, MoreThanTheMachineHoldsIsRefusedBeforeGenerating) {
  // Within every key's bound, but 2 x 2^24 x 2^17 bf16 target rows are 8 TiB.
  DrafterConfig cfg = shipped_config("tiny-dflash.json");
  cfg.hidden = 131072;
  cfg.vocab = 1 << 24;
  cfg.validate("big");
  RandomCheckpointOptions o;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto* make : {&random_drafter_tensors, &random_target_tensors})
    expect_error([&] { make(cfg, o, {}); },
                 {"random BF16 weights", "bytes", "memory", "vocab_size = 16777216", "hidden_size = 131072"});
  // Generating them would take hours: a bound far above the check's time holds under load too.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  // The layers dominate when they are what is large.
  cfg = shipped_config("tiny-dflash.json");
  cfg.hidden = 65536;
  cfg.ffn = 1 << 20;
  cfg.layers = 1024;
  cfg.sliding.assign(1024, false);
  cfg.causal.assign(1024, false);
  expect_error([&] { random_drafter_tensors(cfg, o); }, {"num_hidden_layers = 1024", "intermediate_size = 1048576"});
}

TEST(RandomWeights, UncheckedProgrammaticConfigsAreValidatedFirst) {
  // A config made in code skips from_json: the generator validates it before sizing anything.
  DrafterConfig cfg = shipped_config("tiny-dflash.json");
  cfg.vocab = (int64_t{1} << 58) + 1;
  expect_error([&] { random_target_tensors(cfg, {}); }, {"'vocab_size'", "288230376151711745", "16777216"});
  expect_error([&] { random_drafter_tensors(cfg, {}); }, {"'vocab_size'"});
  RandomCheckpointOptions o;
  o.target_vocab = -5;
  expect_error([&] { random_target_tensors(shipped_config("tiny-dflash.json"), o); }, {"target vocab", "-5", "300"});
  o = {};
  o.threads = -2;
  expect_error([&] { random_drafter_tensors(shipped_config("tiny-dflash.json"), o); }, {"thread count", "-2"});
  o = {};
  o.dtype = DType::I32;
  expect_error([&] { random_drafter_tensors(shipped_config("tiny-dflash.json"), o); }, {"dtype", "I32"});
}

TEST(RandomWeights, WriteCheckpointRefusesBeforeWriting) {
  testing::TempDir dir;
  const DrafterConfig cfg = shipped_config("tiny-dflash.json");
  expect_error([&] { write_random_checkpoint(cfg, dir.file("ck"), {}, -1); }, {"random taps", "-1"});
  expect_error([&] { write_random_checkpoint(cfg, "", {}, 0); }, {"output directory name is empty"});
  // The parent of the destination is a file: its directory cannot be made.
  testing::write_text(dir.file("file"), "x");
  expect_error([&] { write_random_checkpoint(cfg, dir.file("file/ck"), {}, 0); }, {dir.file("file"), "cannot create"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("ck")));
  // The same destination, written twice, holds the second checkpoint only.
  write_random_checkpoint(cfg, dir.file("ck"), {}, 3);
  write_random_checkpoint(shipped_config("tiny-dflash2.json"), dir.file("ck"), {}, 0);
  EXPECT_FALSE(std::filesystem::exists(dir.file("ck/taps.safetensors")));
  EXPECT_TRUE(DrafterConfig::from_file(dir.file("ck/drafter/config.json")).is_dflash2());
  const auto beside_ck = std::count_if(std::filesystem::directory_iterator(dir.path()), {},
                                       [](const auto& e) { return e.path().filename() != "ck"; });
  EXPECT_EQ(beside_ck, 1);  // "file"; no temporary directory left beside ck
}

TEST(RandomWeights, TapRowsBeyondMemoryAreRefused) {
  const DrafterConfig cfg = shipped_config("tiny-dflash.json");
  EXPECT_EQ(random_taps(cfg, 3, 1).size(), 3u * 128u);
  expect_error([&] { random_taps(cfg, int64_t{1} << 40, 1); }, {"random taps", "1099511627776 rows", "bytes", "memory"});
  expect_error([&] { random_taps(cfg, -1, 1); }, {"random taps", "-1"});
}

}  // namespace
}  // namespace tpdraft::model
