// FLOP, byte and collective counts per draft and per settle, from the forward of docs/model.md,
// docs/parallel.md and the shard plan; each mirrors what drafter.cpp and sharded_head.cpp do.
#include "model/cost.h"

#include <algorithm>

#include "checkpoint/quant_tensors.h"
#include "core/strings.h"
#include "model/sharded_head.h"
#include "model/weights.h"

namespace tpdraft::model {

WorkCount draft_work(const DrafterConfig& c, const ShardPlan& p, int64_t sessions, int64_t context,
                     double wb, double ctx_elem) {
  const double H = static_cast<double>(c.hidden), D = static_cast<double>(c.head_dim);
  const double B = static_cast<double>(c.block), M = static_cast<double>(sessions) * B;
  const double Md = static_cast<double>(sessions) * (B - 1);
  const double nq = static_cast<double>(p.q_heads.size()), nkv = static_cast<double>(p.kv_heads.size());
  const double f = static_cast<double>(p.ffn.size());
  double layer_params = H * (nq * D) * 2 + H * (nkv * D) * 2 + 3 * H * f;
  if (c.is_dflash2()) layer_params += 2 * (2.0 * static_cast<double>(c.conv_kernel * c.conv_groups())) * H;
  WorkCount w;
  for (int64_t l = 0; l < c.layers; ++l) {
    // Context keys a block row can see in this layer.
    double keys = static_cast<double>(context);
    if (c.sliding[static_cast<size_t>(l)]) keys = std::min<double>(keys, static_cast<double>(c.window));
    w.flops += 2 * M * layer_params;
    w.flops += 2 * 2 * M * nq * D * (keys + B);  // scores and weighted sum
    w.weight_bytes += layer_params * wb;
    w.context_bytes += static_cast<double>(sessions) * keys * 2 * nkv * D * ctx_elem;
  }
  const double vocab = static_cast<double>(p.vocab.size());
  w.flops += 2 * Md * vocab * H;
  w.weight_bytes += vocab * H * wb;
  if (c.is_dflash2()) {
    w.flops += 2 * Md * static_cast<double>(c.selector_rank) * H;
    w.weight_bytes += static_cast<double>(c.selector_rank) * H * wb;
  }
  return w;
}

namespace {

// A share's backend bytes: quantized by `q`, else in `dtype`.
double share_bytes(const TensorShare& share, const QuantScheme& q, DType dtype) {
  return static_cast<double>(q.quantized() ? quantized_share_bytes(q, share.rows.size(), share.cols.size())
                                           : share.backend_bytes(dtype));
}

// The head's vocabulary slice on this rank: quantized by a +head preset, else in its dtype.
double head_bytes(const DrafterConfig& c, const ShardPlan& p, DType head_dtype) {
  const TensorShare share = tensor_share(c, p, "lm_head.weight", {c.head_vocab(), c.hidden});
  return share_bytes(share, c.quant.head, head_dtype);
}

}  // namespace

double draft_weight_bytes(const DrafterConfig& c, const ShardPlan& p, DType dtype, DType head_dtype) {
  double bytes = 0;
  for (const auto& [name, shape] : expected_drafter_tensors(c)) {
    // What a draft's forward streams: the layer matrices and the selector's projection (fc works
    // in settle only; norms and biases are noise).
    const bool layer_matrix = starts_with(name, "layers.") && quantizable_tensor(name);
    if (!layer_matrix && name != "candidate_selector.hidden_projection.weight") continue;
    bytes += share_bytes(tensor_share(c, p, name, shape), c.quant.scheme_for(name), dtype);
  }
  return bytes + head_bytes(c, p, head_dtype);
}

std::array<double, 2> draft_quantized_flops(const DrafterConfig& c, const ShardPlan& p, int64_t sessions) {
  std::array<double, 2> flops{0, 0};
  const double M = static_cast<double>(sessions * c.block), Md = static_cast<double>(sessions * (c.block - 1));
  auto add = [&](const QuantScheme& q, double rows, const TensorShare& share) {
    if (q.kind != QuantScheme::Kind::Int) return;
    flops[q.bits == 8 ? 0 : 1] += 2 * rows * static_cast<double>(share.rows.size() * share.cols.size());
  };
  for (const auto& [name, shape] : expected_drafter_tensors(c)) {
    // What draft_work counts: the layer matrices (the kernel projections included) for every
    // block row, the selector's projection for the drafted rows (fc works in settle only).
    const bool layer_matrix = starts_with(name, "layers.") && quantizable_tensor(name);
    if (layer_matrix) add(c.quant.scheme_for(name), M, tensor_share(c, p, name, shape));
    else if (name == "candidate_selector.hidden_projection.weight")
      add(c.quant.scheme_for(name), Md, tensor_share(c, p, name, shape));
  }
  add(c.quant.head, Md, tensor_share(c, p, "lm_head.weight", {c.head_vocab(), c.hidden}));
  return flops;
}

WorkCount settle_work(const DrafterConfig& c, const ShardPlan& p, int64_t rows, double wb) {
  const double H = static_cast<double>(c.hidden), D = static_cast<double>(c.head_dim);
  const double n = static_cast<double>(rows), nkv = static_cast<double>(p.kv_heads.size());
  const double params = H * static_cast<double>(c.n_taps()) * H + static_cast<double>(c.layers) * 2 * nkv * D * H;
  WorkCount w;
  w.flops = 2 * n * params;
  w.weight_bytes = params * wb;
  w.context_bytes = n * static_cast<double>(context_bytes_per_position(c, p));  // written
  return w;
}

RankMemory rank_memory(const DrafterConfig& c, const ShardPlan& p,
                       const std::function<DType(const std::string&)>& dtype_of, DType head_dtype) {
  RankMemory m;
  for (const auto& [name, shape] : expected_drafter_tensors(c)) {
    const TensorShare share = tensor_share(c, p, name, shape);
    const QuantScheme q = c.quant.scheme_for(name);
    // dtype_of only for a float tensor: a quantized one is stored as its parts, under other names.
    (share.sharded() ? m.sharded : m.replicated) += share_bytes(share, q, q.quantized() ? head_dtype : dtype_of(name));
  }
  m.head = head_bytes(c, p, head_dtype);
  return m;
}

namespace {

// sample_sharded for one session's B-1 rows: the max (or the top-k / top-p pool) merged across
// ranks, the normaliser summed unless top-k bounds the set, and without a filter each rank's
// best Gumbel draw gathered. Only the merge is skipped on one rank.
DraftCollectives sampling_exchanges(const DrafterConfig& c, int tp, const SamplingParams& s) {
  const uint64_t rows = static_cast<uint64_t>(c.block - 1);
  const bool filtered = s.top_k > 0 || s.top_p < 1.0;
  const int64_t pool = std::min(s.top_k > 0 ? s.top_k : kTopPPool, c.head_vocab());
  DraftCollectives d;
  if (tp > 1) d.all_gather += {1, rows * static_cast<uint64_t>(filtered ? pool : 1) * kCandidateWireBytes};
  if (s.top_k == 0) d.all_reduce += {1, rows * sizeof(float)};
  if (!filtered) d.all_gather += {1, rows * kDrawWireBytes};
  return d;
}

// How a draft ends at tp > 1.
CollectiveCount end_of_draft_broadcast(const DrafterConfig& cfg, int tp, int64_t draft_rows, bool sampled) {
  const uint64_t rows = static_cast<uint64_t>(draft_rows);
  // Greedy DFlash picks come from the merged candidates, identical on every rank: nothing to send.
  // The selector walk and sampling read per-rank values, so rank 0 broadcasts its tokens (int64)
  // and probabilities (f32) in one packed call.
  if (tp == 1 || !(cfg.is_dflash2() || sampled)) return {};
  return {1, rows * (sizeof(int64_t) + sizeof(float))};
}

}  // namespace

DraftCollectives draft_collectives(const DrafterConfig& c, const ShardPlan& p, int64_t sessions,
                                   const SamplingParams& sampling, bool gather_logits) {
  const uint64_t S = static_cast<uint64_t>(sessions), B = static_cast<uint64_t>(c.block);
  const uint64_t L = static_cast<uint64_t>(c.layers), H = static_cast<uint64_t>(c.hidden);
  const uint64_t Md = S * (B - 1);
  DraftCollectives d;
  // The block forward: the o and down projections' partial sums, [S*B, H] f32 (one rank counts
  // them too, as identities).
  d.all_reduce = {2 * L, 2 * L * S * B * H * sizeof(float)};
  // The head: every rank's k best (value, id) per draft row, merged for greedy and selector
  // rows (a sampled DFlash draft reads none); nothing to merge on one rank.
  const bool sampled = !sampling.greedy();
  const uint64_t k = c.is_dflash2() ? static_cast<uint64_t>(c.selector_topk) : 1;
  if (p.tp > 1 && (c.is_dflash2() || !sampled)) d.all_gather += {1, Md * k * kCandidateWireBytes};
  // A sampled DFlash draft exchanges per session; the DFlash 2 selector samples on the host.
  if (sampled && !c.is_dflash2()) {
    const DraftCollectives one = sampling_exchanges(c, p.tp, sampling);
    d.all_reduce += {one.all_reduce.calls * S, one.all_reduce.bytes * S};
    d.all_gather += {one.all_gather.calls * S, one.all_gather.bytes * S};
  }
  // Every rank's padded vocabulary slice of the draft rows' f32 logits.
  if (gather_logits) d.all_gather += {1, Md * static_cast<uint64_t>(p.vocab_padded / p.tp) * sizeof(float)};
  d.broadcast = end_of_draft_broadcast(c, p.tp, static_cast<int64_t>(Md), sampled);
  return d;
}

}  // namespace tpdraft::model
