// The cost model (model/cost.h) against what real drafts do: the collectives it predicts must
// equal the communicator's counters call for call and byte for byte (in-process ranks, tp 1, 2
// and 4, DFlash and DFlash 2, greedy and sampled, with and without the full-logits gather), and
// the memory it predicts must equal what the loader and the sessions allocate.
#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/cost.h"
#include "model/drafter.h"
#include "engine/runtime.h"
#include "parallel/thread_comm.h"
#include "support/rank.h"
#include "support/test_support.h"
#include "tools/random_checkpoint.h"

namespace tpdraft {
namespace {

using model::DrafterConfig;

struct DraftCase {
  std::string name;
  int64_t sessions = 1;
  model::SamplingParams sampling;
  bool gather_logits = false;
};

// A rank's counters after each case's draft.
using RankCounts = std::vector<parallel::CommStats>;

// Loads the checkpoint on tp ranks, settles 3 sessions and drafts every case once, counting.
std::vector<RankCounts> count_drafts(const std::string& ckpt, const DrafterConfig& cfg, int tp,
                                     const std::vector<DraftCase>& cases) {
  std::vector<RankCounts> out(static_cast<size_t>(tp));
  testing::run_group(tp, [&](parallel::Communicator& comm) {
    model::RuntimeOptions ro = testing::backend("cpu");
    ro.limits.max_sessions = 3;
    ro.limits.max_context = 64;
    const auto rt = testing::open_rank(comm, ckpt, cfg, ro);
    model::Drafter& drafter = rt->drafter();
    std::vector<std::unique_ptr<model::Session>> sessions;
    for (int64_t s = 0; s < ro.limits.max_sessions; ++s) {
      const auto taps = model::random_taps(cfg, 20 + 7 * s, 11 + static_cast<uint64_t>(s));
      sessions.push_back(drafter.new_session());
      drafter.settle(*sessions.back(), 0, taps.data(), 20 + 7 * s);
    }
    for (const DraftCase& c : cases) {
      std::vector<model::DraftRequest> reqs;
      for (int64_t s = 0; s < c.sessions; ++s)
        reqs.push_back({sessions[static_cast<size_t>(s)].get(), 3 + 5 * s, c.sampling});
      model::DraftDump dump;
      comm.reset_stats();
      drafter.draft(reqs, c.gather_logits ? &dump : nullptr);
      out[static_cast<size_t>(comm.rank())].push_back(comm.stats());
    }
  });
  return out;
}

void expect_counts(const model::DraftCollectives& want, const parallel::CommStats& got, const std::string& at) {
  EXPECT_EQ(got.all_reduce_calls, want.all_reduce.calls) << at;
  EXPECT_EQ(got.all_reduce_bytes, want.all_reduce.bytes) << at;
  EXPECT_EQ(got.all_gather_calls, want.all_gather.calls) << at;
  EXPECT_EQ(got.all_gather_bytes, want.all_gather.bytes) << at;
  EXPECT_EQ(got.broadcast_calls, want.broadcast.calls) << at;
  EXPECT_EQ(got.broadcast_bytes, want.broadcast.bytes) << at;
}

void check_model(const std::string& file, const std::vector<DraftCase>& cases) {
  const DrafterConfig cfg = testing::eight_heads_over_two(file);
  testing::TempDir dir;
  model::RandomCheckpointOptions o;
  o.target_vocab = cfg.vocab + 5;
  model::write_random_checkpoint(cfg, dir.path(), o, 0);
  for (int tp : {1, 2, 4}) {
    const auto counts = count_drafts(dir.path(), cfg, tp, cases);
    for (int r = 0; r < tp; ++r) {
      const auto plan = model::ShardPlan::make(cfg, r, tp);
      for (size_t i = 0; i < cases.size(); ++i) {
        const DraftCase& c = cases[i];
        const std::string at = file + " tp " + std::to_string(tp) + " rank " + std::to_string(r) + ": " + c.name;
        expect_counts(model::draft_collectives(cfg, plan, c.sessions, c.sampling, c.gather_logits),
                      counts[static_cast<size_t>(r)][i], at);
      }
    }
  }
}

model::SamplingParams sampling(double temperature, int64_t top_k, double top_p) {
  return {temperature, top_k, top_p, 7};
}

TEST(CostModel, DFlashCollectivesEqualTheCounters) {
  check_model("tiny-dflash.json", {
      {"greedy, 1 session", 1, {}, false},
      {"greedy, 3 sessions", 3, {}, false},
      {"greedy with the logits gathered", 2, {}, true},
      {"temperature", 3, sampling(0.9, 0, 1.0), false},
      {"temperature with the logits gathered", 1, sampling(0.9, 0, 1.0), true},
      {"top-k", 2, sampling(1.1, 25, 1.0), false},
      {"top-p within the pool", 2, sampling(0.8, 0, 0.5), false},
      {"top-k and top-p", 3, sampling(1.2, 25, 0.8), false},
  });
}

TEST(CostModel, DFlash2CollectivesEqualTheCounters) {
  check_model("tiny-dflash2.json", {
      {"greedy, 1 session", 1, {}, false},
      {"greedy, 3 sessions", 3, {}, false},
      {"greedy with the logits gathered", 2, {}, true},
      {"selector sampling", 3, sampling(0.8, 0, 1.0), false},
  });
}

// Hand count for one case, so that the model is not only checked against itself: tp = 2 greedy
// DFlash 2 with 2 sessions of B = 8 rows over H = 64 and 2 layers, k = 4 candidates.
TEST(CostModel, GreedyDraftByHand) {
  const DrafterConfig cfg = testing::eight_heads_over_two("tiny-dflash2.json");
  ASSERT_EQ(cfg.block, 8);
  ASSERT_EQ(cfg.hidden, 64);
  ASSERT_EQ(cfg.layers, 2);
  ASSERT_EQ(cfg.selector_topk, 4);
  const auto d = model::draft_collectives(cfg, model::ShardPlan::make(cfg, 1, 2), 2, {});
  EXPECT_EQ(d.all_reduce.calls, 4u);
  EXPECT_EQ(d.all_reduce.bytes, 4u * 16 * 64 * 4);  // 4 calls of [2 x 8 rows, 64] f32
  EXPECT_EQ(d.all_gather.calls, 1u);
  EXPECT_EQ(d.all_gather.bytes, 14u * 4 * 16);      // 14 draft rows x 4 candidates x 16 bytes
  EXPECT_EQ(d.broadcast.calls, 1u);
  EXPECT_EQ(d.broadcast.bytes, 14u * (8 + 4));      // int64 tokens and f32 probabilities, packed
}

// The FLOPs a draft spends on int8 and int4 weights (the bench's roofline takes them at the
// quantized matmuls' rates), by hand: q4 holds the layer matrices in int4, the kernel and selector
// projections in int8; +head adds the head in int8; at tp 2 a rank does half of the split matrices.
TEST(CostModel, QuantizedFlopsByHand) {
  const DrafterConfig plain = DrafterConfig::from_file(testing::source_path("configs/tiny-dflash2.json"));
  DrafterConfig cfg = plain;
  const double H = static_cast<double>(cfg.hidden), D = static_cast<double>(cfg.head_dim);
  const double L = static_cast<double>(cfg.layers), F = static_cast<double>(cfg.ffn);
  const double nq = static_cast<double>(cfg.n_q), nkv = static_cast<double>(cfg.n_kv);
  const int64_t sessions = 3;
  const double M = static_cast<double>(sessions * cfg.block), Md = static_cast<double>(sessions * (cfg.block - 1));
  const double layer = 2 * nq * D * H + 2 * nkv * D * H + 3 * F * H;
  const double kernel_proj = 2 * (2.0 * static_cast<double>(cfg.conv_kernel * cfg.conv_groups())) * H;
  const double selector = static_cast<double>(cfg.selector_rank) * H;
  const auto plan1 = model::ShardPlan::make(cfg, 0, 1);
  EXPECT_EQ(model::draft_quantized_flops(cfg, plan1, sessions), (std::array<double, 2>{0, 0}));  // a float drafter
  cfg.quant = model::quantization_on_load(plain, "q4", "test");
  auto f = model::draft_quantized_flops(cfg, plan1, sessions);
  EXPECT_EQ(f[1], 2 * M * L * layer);
  EXPECT_EQ(f[0], 2 * M * L * kernel_proj + 2 * Md * selector);
  cfg.quant = model::quantization_on_load(plain, "q8a8+head", "test");
  f = model::draft_quantized_flops(cfg, plan1, sessions);
  EXPECT_EQ(f[1], 0);
  EXPECT_EQ(f[0], 2 * M * L * (layer + kernel_proj) + 2 * Md * selector + 2 * Md * static_cast<double>(cfg.vocab) * H);
  // tp 2 (one kv head, replicated): q, o and the FFN split in half, k and v whole.
  cfg.quant = model::quantization_on_load(plain, "q4", "test");
  ASSERT_EQ(cfg.n_kv, 1);
  f = model::draft_quantized_flops(cfg, model::ShardPlan::make(cfg, 1, 2), sessions);
  EXPECT_EQ(f[1], 2 * M * L * (nq * D * H + 2 * nkv * D * H + 1.5 * F * H));
}

// The bytes the model says a rank holds are the bytes the loader allocates; the split matrices
// also by hand.
void check_memory(const DrafterConfig& cfg, DType dtype, bool tie) {
  testing::TempDir dir;
  model::RandomCheckpointOptions o;
  o.dtype = dtype;
  o.tie_embeddings = tie;
  o.target_vocab = cfg.vocab + 3;
  model::write_random_checkpoint(cfg, dir.path(), o, 0);
  const auto drafter = model::TensorStore::open(dir.path() + "/drafter");
  const auto target = model::TensorStore::open(dir.path() + "/target");
  auto ops = kernels::make_cpu_ops(1);
  const double e = static_cast<double>(dtype_size(dtype));
  const double H = static_cast<double>(cfg.hidden), D = static_cast<double>(cfg.head_dim);
  for (int tp : {1, 2, 4}) {
    for (int r = 0; r < tp; ++r) {
      const auto plan = model::ShardPlan::make(cfg, r, tp);
      const model::DrafterWeights w(cfg, drafter, target, plan, *ops);
      const model::RankMemory m = model::rank_memory(cfg, plan, [&](const std::string&) { return dtype; }, dtype);
      const std::string at = cfg.arch_name + " tp " + std::to_string(tp) + " rank " + std::to_string(r);
      EXPECT_EQ(m.total(), static_cast<double>(w.backend_bytes())) << at;
      // q and o: Nq/tp heads; k and v: the kv heads held; gate, up, down: F/tp rows or columns.
      const double per_layer = 2 * (static_cast<double>(cfg.n_q) / tp) * D * H +
                               2 * static_cast<double>(plan.kv_heads.size()) * D * H +
                               3 * (static_cast<double>(cfg.ffn) / tp) * H;
      const double bias_rows = (static_cast<double>(cfg.n_q) / tp + 2 * static_cast<double>(plan.kv_heads.size())) * D;
      const double biases = cfg.bias ? bias_rows * 4 : 0;  // f32
      EXPECT_EQ(m.sharded, static_cast<double>(cfg.layers) * (per_layer * e + biases)) << at;
      EXPECT_EQ(m.head, static_cast<double>(plan.vocab.size()) * H * e) << at;
    }
  }
}

TEST(CostModel, RankMemoryEqualsWhatTheLoaderHolds) {
  check_memory(testing::eight_heads_over_two("tiny-dflash.json"), DType::BF16, false);
  check_memory(testing::eight_heads_over_two("tiny-dflash2.json"), DType::F32, true);  // biases, tied head
}

// Context per position: what a session holds per settled position, read back layer by layer.
TEST(CostModel, ContextBytesPerPositionEqualTheSessionsAllocation) {
  const DrafterConfig cfg = testing::eight_heads_over_two("tiny-dflash2.json");
  testing::TempDir dir;
  model::write_random_checkpoint(cfg, dir.path(), {}, 0);
  for (int tp : {1, 2, 4}) {
    std::vector<size_t> session_bytes(static_cast<size_t>(tp)), drafter_says(static_cast<size_t>(tp));
    parallel::run_ranks(tp, [&](parallel::Communicator& comm) {
      model::RuntimeOptions ro = testing::backend("cpu");
      ro.limits.max_context = 50;
      ro.limits.keep_all_positions = true;
      const auto rt = testing::open_rank(comm, dir.path(), cfg, ro);
      model::Drafter& drafter = rt->drafter();
      auto session = drafter.new_session();
      const auto taps = model::random_taps(cfg, 10, 3);
      drafter.settle(*session, 0, taps.data(), 10);
      size_t held = 0;
      for (int64_t l = 0; l < cfg.layers; ++l) {
        std::vector<float> k, v;
        drafter.read_context(*session, l, &k, &v);
        held += (k.size() + v.size()) * sizeof(float);
      }
      session_bytes[static_cast<size_t>(comm.rank())] = held;
      drafter_says[static_cast<size_t>(comm.rank())] = drafter.context_bytes_per_position();
    });
    for (int r = 0; r < tp; ++r) {
      const auto plan = model::ShardPlan::make(cfg, r, tp);
      const size_t per_position = model::context_bytes_per_position(cfg, plan);
      EXPECT_EQ(session_bytes[static_cast<size_t>(r)], per_position * 10) << "tp " << tp << " rank " << r;
      EXPECT_EQ(drafter_says[static_cast<size_t>(r)], per_position);
      EXPECT_EQ(per_position, static_cast<size_t>(cfg.layers * 2 * plan.kv_heads.size() * cfg.head_dim * 4));
    }
  }
}

}  // namespace
}  // namespace tpdraft
