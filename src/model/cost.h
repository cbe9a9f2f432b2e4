// What a draft or a settle must do, counted from the geometry: FLOPs (2 per multiply-add) and
// the bytes of weights and context it must read. Benchmarks divide by these to report achieved
// rates; scaling projections start from them.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/shard_plan.h"

namespace tpdraft::model {

struct WorkCount {
  double flops = 0;
  double weight_bytes = 0;   // weights streamed (each matrix read once)
  double context_bytes = 0;  // context K/V read
  double bytes() const { return weight_bytes + context_bytes; }
};

// One draft on one rank: `sessions` blocks, each over `context` settled positions.
// weight_dtype_bytes: bytes per weight element (2 for bf16).
WorkCount draft_work(const DrafterConfig& cfg, const ShardPlan& plan, int64_t sessions, int64_t context,
                     double weight_dtype_bytes);
// Settling n rows on one rank.
WorkCount settle_work(const DrafterConfig& cfg, const ShardPlan& plan, int64_t rows, double weight_dtype_bytes);

}  // namespace tpdraft::model
