// Shard plan rules: heads and FFN split evenly, kv heads replicated when tp > Nk (each rank takes
// kv head floor(rank * Nk / tp)), vocabulary split over V padded to a multiple of tp.
#include "model/shard_plan.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace tpdraft::model {

ShardPlan ShardPlan::make(const DrafterConfig& cfg, int rank, int tp) {
  TPDRAFT_CHECK(tp >= 1, "tensor-parallel size must be at least 1, got {}", tp);
  TPDRAFT_CHECK(rank >= 0 && rank < tp, "rank {} outside [0, tp = {})", rank, tp);
  TPDRAFT_CHECK(cfg.n_q % tp == 0, "num_attention_heads ({}) is not divisible by tp = {}", cfg.n_q, tp);
  TPDRAFT_CHECK(cfg.n_kv % tp == 0 || tp % cfg.n_kv == 0,
                "num_key_value_heads ({}) and tp = {}: one must divide the other", cfg.n_kv, tp);
  TPDRAFT_CHECK(cfg.ffn % tp == 0, "intermediate_size ({}) is not divisible by tp = {}", cfg.ffn, tp);
  ShardPlan p;
  p.rank = rank;
  p.tp = tp;
  const int64_t qh = cfg.n_q / tp;
  p.q_heads = {rank * qh, (rank + 1) * qh};
  if (cfg.n_kv >= tp) {
    const int64_t kh = cfg.n_kv / tp;
    p.kv_heads = {rank * kh, (rank + 1) * kh};
  } else {
    const int64_t head = static_cast<int64_t>(rank) * cfg.n_kv / tp;
    p.kv_heads = {head, head + 1};
  }
  const int64_t f = cfg.ffn / tp;
  p.ffn = {rank * f, (rank + 1) * f};
  p.vocab_padded = (cfg.vocab + tp - 1) / tp * tp;
  const int64_t vs = p.vocab_padded / tp;
  p.vocab = {std::min(cfg.vocab, rank * vs), std::min(cfg.vocab, (rank + 1) * vs)};
  return p;
}

std::string ShardPlan::describe() const {
  return fmt::format("rank {}/{}: q heads [{}, {}), kv heads [{}, {}), ffn [{}, {}), vocab [{}, {})", rank, tp,
                     q_heads.begin, q_heads.end, kv_heads.begin, kv_heads.end, ffn.begin, ffn.end, vocab.begin,
                     vocab.end);
}

}  // namespace tpdraft::model
