// Shard plan rules: heads and FFN split evenly, kv heads replicated when tp > Nk (each rank takes
// kv head floor(rank * Nk / tp)), the head's rows (V, or a draft vocabulary's N) split over that
// count padded to a multiple of tp; and the share of every checkpoint tensor that follows from them.
#include "model/shard_plan.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "core/strings.h"

namespace tpdraft::model {

ShardPlan ShardPlan::make(const DrafterConfig& cfg, int rank, int tp) {
  TPDRAFT_CHECK(tp >= 1, "tensor-parallel size must be at least 1, got {}", tp);
  TPDRAFT_CHECK(rank >= 0 && rank < tp, "rank {} outside [0, tp = {})", rank, tp);
  TPDRAFT_CHECK(cfg.n_q % tp == 0, "num_attention_heads ({}) is not divisible by tp = {}", cfg.n_q, tp);
  TPDRAFT_CHECK(cfg.n_kv % tp == 0 || tp % cfg.n_kv == 0,
                "num_key_value_heads ({}) and tp = {}: one must divide the other", cfg.n_kv, tp);
  TPDRAFT_CHECK(cfg.ffn % tp == 0, "intermediate_size ({}) is not divisible by tp = {}", cfg.ffn, tp);
  // A row-parallel quantized matrix (o, down) is split along its columns; each rank's part must
  // hold whole scale groups.
  for (int64_t l = 0; l < cfg.layers; ++l) {
    const std::pair<const char*, int64_t> row_parallel[] = {{"self_attn.o_proj.weight", cfg.n_q * cfg.head_dim},
                                                            {"mlp.down_proj.weight", cfg.ffn}};
    for (const auto& [suffix, cols] : row_parallel) {
      const std::string name = "layers." + std::to_string(l) + "." + suffix;
      const QuantScheme s = cfg.quant.scheme_for(name);
      if (s.strategy != QuantScheme::Strategy::Group || !s.quantized() || tp == 1) continue;
      TPDRAFT_CHECK(cols % tp == 0 && (cols / tp) % s.group == 0,
                    "tp = {} cuts the quantization groups of '{}': it splits the {} columns into parts of {}, not a "
                    "multiple of the group size {} (use a tp whose parts hold whole groups, or quantize with smaller "
                    "groups)", tp, name, cols, cols / tp, s.group);
    }
  }
  ShardPlan p;
  p.rank = rank;
  p.tp = tp;
  // The rank's part of n split evenly.
  auto part = [&](int64_t n) { return Range{rank * (n / tp), (rank + 1) * (n / tp)}; };
  p.q_heads = part(cfg.n_q);
  const int64_t kv_head = static_cast<int64_t>(rank) * cfg.n_kv / tp;  // the one it replicates when tp > Nk
  p.kv_heads = cfg.n_kv >= tp ? part(cfg.n_kv) : Range{kv_head, kv_head + 1};
  p.ffn = part(cfg.ffn);
  // The head's rows: the vocabulary, or the draft vocabulary (docs/model.md).
  const int64_t rows = cfg.head_vocab();
  p.vocab_padded = (rows + tp - 1) / tp * tp;
  const int64_t vs = p.vocab_padded / tp;
  p.vocab = {std::min(rows, rank * vs), std::min(rows, (rank + 1) * vs)};
  return p;
}

std::string ShardPlan::describe() const {
  return fmt::format("rank {}/{}: q heads [{}, {}), kv heads [{}, {}), ffn [{}, {}), vocab [{}, {})", rank, tp,
                     q_heads.begin, q_heads.end, kv_heads.begin, kv_heads.end, ffn.begin, ffn.end, vocab.begin,
                     vocab.end);
}

size_t context_bytes_per_position(const DrafterConfig& cfg, const ShardPlan& plan, size_t element_bytes) {
  return static_cast<size_t>(cfg.layers) * 2 * static_cast<size_t>(plan.kv_heads.size() * cfg.head_dim) *
         element_bytes;
}

size_t TensorShare::backend_bytes(DType dtype) const {
  if (placement == Placement::HostMapped) return 0;
  return static_cast<size_t>(elements()) * (as_f32 ? sizeof(float) : dtype_size(dtype));
}

namespace {

// The [rows, cols] view of a shape: dim 0 against the product of the rest.
TensorShare whole(const std::vector<int64_t>& shape, bool as_f32) {
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  TensorShare s;
  s.rows = {0, shape.empty() ? 1 : shape[0]};
  s.cols = {0, cols};
  s.as_f32 = as_f32;
  return s;
}

TensorShare split(TensorShare s, Placement how, Range part) {
  s.placement = how;
  (how == Placement::SplitRows ? s.rows : s.cols) = part;
  return s;
}

}  // namespace

TensorShare tensor_share(const DrafterConfig& cfg, const ShardPlan& plan, const std::string& name,
                         const std::vector<int64_t>& shape) {
  const int64_t D = cfg.head_dim;
  const Range q{plan.q_heads.begin * D, plan.q_heads.end * D};
  const Range kv{plan.kv_heads.begin * D, plan.kv_heads.end * D};
  const bool vector = ends_with(name, ".bias") || ends_with(name, "norm.weight") || ends_with(name, "base_kernel");
  const TensorShare all = whole(shape, vector);
  // Column-parallel projections keep their output rows; row-parallel ones their input columns.
  if (ends_with(name, "q_proj.weight") || ends_with(name, "q_proj.bias")) return split(all, Placement::SplitRows, q);
  if (ends_with(name, "k_proj.weight") || ends_with(name, "v_proj.weight") || ends_with(name, "k_proj.bias") ||
      ends_with(name, "v_proj.bias"))
    return split(all, Placement::SplitRows, kv);
  if (ends_with(name, "o_proj.weight")) return split(all, Placement::SplitColumns, q);
  if (ends_with(name, "gate_proj.weight") || ends_with(name, "up_proj.weight"))
    return split(all, Placement::SplitRows, plan.ffn);
  if (ends_with(name, "down_proj.weight")) return split(all, Placement::SplitColumns, plan.ffn);
  // The target head: this rank's vocabulary rows (padding rows belong to nobody).
  if (ends_with(name, "lm_head.weight")) return split(all, Placement::SplitRows, plan.vocab);
  // Tables read a row at a time (embedding lookups, selector codebooks) stay in the file mapping.
  if (ends_with(name, "embed_tokens.weight") || ends_with(name, "_codebook") || ends_with(name, "_codebook.weight")) {
    TensorShare mapped = all;
    mapped.placement = Placement::HostMapped;
    return mapped;
  }
  if (vector || ends_with(name, "o_proj.bias") || name == "fc.weight" || ends_with(name, "kernel_projection.weight") ||
      ends_with(name, "hidden_projection.weight"))
    return all;
  TPDRAFT_FAIL("no shard rule for tensor '{}'", name);
}

}  // namespace tpdraft::model
