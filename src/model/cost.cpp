// FLOP and byte counts per draft and per settle, straight from docs/model.md and the shard plan.
#include "model/cost.h"

#include <algorithm>

namespace tpdraft::model {

WorkCount draft_work(const DrafterConfig& c, const ShardPlan& p, int64_t sessions, int64_t context,
                     double wb) {
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
    w.context_bytes += static_cast<double>(sessions) * keys * 2 * nkv * D * 4;
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

WorkCount settle_work(const DrafterConfig& c, const ShardPlan& p, int64_t rows, double wb) {
  const double H = static_cast<double>(c.hidden), D = static_cast<double>(c.head_dim);
  const double n = static_cast<double>(rows), nkv = static_cast<double>(p.kv_heads.size());
  const double params = H * static_cast<double>(c.n_taps()) * H + static_cast<double>(c.layers) * 2 * nkv * D * H;
  WorkCount w;
  w.flops = 2 * n * params;
  w.weight_bytes = params * wb;
  w.context_bytes = n * static_cast<double>(c.layers) * 2 * nkv * D * 4;  // written
  return w;
}

}  // namespace tpdraft::model
