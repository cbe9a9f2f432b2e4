// The shard plan of docs/parallel.md: who holds which heads, FFN rows and vocabulary rows at
// every tp, kv replication when tp > Nk, vocabulary padding, the share of every checkpoint
// tensor, and the start-up errors.
#include <gtest/gtest.h>

#include <string>

#include "core/checked.h"
#include "model/shard_plan.h"
#include "model/weights.h"
#include "support/rank.h"
#include "support/test_support.h"

namespace tpdraft {
namespace {

model::DrafterConfig config(int64_t nq, int64_t nkv, int64_t ffn, int64_t vocab) {
  model::DrafterConfig c = testing::shipped_config("tiny-dflash.json");
  c.n_q = nq;
  c.n_kv = nkv;
  c.ffn = ffn;
  c.vocab = vocab;
  return c;
}

TEST(ShardPlan, RanksPartitionHeadsFfnAndVocabulary) {
  const auto cfg = config(8, 4, 96, 301);  // V not a multiple of tp
  for (int tp : {1, 2, 4}) {
    int64_t q = 0, kv = 0, f = 0, v = 0;
    for (int r = 0; r < tp; ++r) {
      const auto p = model::ShardPlan::make(cfg, r, tp);
      EXPECT_EQ(p.q_heads.begin, q);
      EXPECT_EQ(p.kv_heads.begin, kv);
      EXPECT_EQ(p.ffn.begin, f);
      EXPECT_EQ(p.vocab.begin, v);
      q = p.q_heads.end;
      kv = p.kv_heads.end;
      f = p.ffn.end;
      v = p.vocab.end;
      EXPECT_EQ(p.vocab_padded, (301 + tp - 1) / tp * tp);
    }
    EXPECT_EQ(q, 8);
    EXPECT_EQ(kv, 4);
    EXPECT_EQ(f, 96);
    EXPECT_EQ(v, 301);  // padded rows belong to nobody
  }
}

TEST(ShardPlan, KvHeadsReplicatedWhenTpExceedsThem) {
  const auto cfg = config(8, 2, 96, 300);
  // tp 8 > Nk 2: rank r holds kv head floor(r * 2 / 8), the head its query heads read.
  for (int r = 0; r < 8; ++r) {
    const auto p = model::ShardPlan::make(cfg, r, 8);
    EXPECT_EQ(p.kv_heads.size(), 1);
    EXPECT_EQ(p.kv_heads.begin, r * 2 / 8);
    EXPECT_EQ(p.q_heads.begin * cfg.n_kv / cfg.n_q, p.kv_heads.begin);
  }
}

TEST(ShardPlan, StartUpErrorsNameTheFieldAndTp) {
  auto expect_refused = [](const model::DrafterConfig& c, int tp, const std::string& needle) {
    testing::expect_error([&] { model::ShardPlan::make(c, 0, tp); }, {needle});
  };
  expect_refused(config(8, 4, 96, 300), 3, "num_attention_heads (8) is not divisible by tp = 3");
  expect_refused(config(12, 3, 96, 300), 2, "num_key_value_heads (3) and tp = 2");
  expect_refused(config(8, 4, 90, 300), 4, "intermediate_size (90) is not divisible by tp = 4");
  expect_refused(config(8, 4, 96, 300), 0, "at least 1");
}

// Every expected tensor's shares: split ones tile the tensor across ranks exactly once (the
// target head: its first V rows), replicated ones are whole on every rank, tables stay mapped.
void check_shares(const model::DrafterConfig& cfg, int tp) {
  auto tensors = model::expected_drafter_tensors(cfg);
  tensors.push_back({"lm_head.weight", {cfg.vocab + 7, cfg.hidden}});
  for (const auto& [name, shape] : tensors) {
    const int64_t full = checked_numel(shape, "tensor '{}'", name);
    int64_t covered = 0;
    for (int r = 0; r < tp; ++r) {
      const auto share = model::tensor_share(cfg, model::ShardPlan::make(cfg, r, tp), name, shape);
      const std::string at = name + " rank " + std::to_string(r) + "/" + std::to_string(tp);
      if (name.find("_codebook") != std::string::npos) {
        EXPECT_EQ(share.placement, model::Placement::HostMapped) << at;
        EXPECT_EQ(share.backend_bytes(DType::BF16), 0u) << at;
        continue;
      }
      const bool vector = shape.size() != 2;
      EXPECT_EQ(share.as_f32, vector) << at;
      EXPECT_EQ(share.backend_bytes(DType::BF16), static_cast<size_t>(share.elements()) * (vector ? 4 : 2)) << at;
      covered += share.elements();
      if (!share.sharded()) {
        EXPECT_EQ(share.elements(), full) << at;
      }
    }
    const auto first = model::tensor_share(cfg, model::ShardPlan::make(cfg, 0, tp), name, shape);
    if (first.placement == model::Placement::HostMapped) continue;
    const bool kv_replicated =
        cfg.n_kv < tp && (name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos);
    if (name == "lm_head.weight") {
      EXPECT_EQ(covered, cfg.vocab * cfg.hidden) << name;
    } else if (kv_replicated) {
      EXPECT_EQ(covered, full * tp / cfg.n_kv) << name;  // each kv head on tp / Nk ranks
    } else {
      EXPECT_EQ(covered, first.sharded() ? full : full * tp) << name;
    }
  }
}

TEST(ShardPlan, TensorSharesTileEverySplitTensor) {
  model::DrafterConfig dflash = config(8, 2, 96, 301);
  model::DrafterConfig dflash2 = testing::shipped_config("tiny-dflash2.json");
  dflash2.n_q = 8;
  dflash2.n_kv = 2;
  for (int tp : {1, 2, 4, 8}) {
    check_shares(dflash, tp);
    check_shares(dflash2, tp);
  }
}

TEST(ShardPlan, TensorWithoutARuleIsRefused) {
  const auto cfg = config(8, 4, 96, 300);
  const auto plan = model::ShardPlan::make(cfg, 0, 2);
  testing::expect_error([&] { model::tensor_share(cfg, plan, "layers.0.mlp.extra_proj.weight", {4, 4}); },
                        {"no shard rule for tensor 'layers.0.mlp.extra_proj.weight'"});
}

}  // namespace
}  // namespace tpdraft
