// What a draft or a settle costs one rank, counted from the geometry and the shard plan: FLOPs
// (2 per multiply-add), the bytes of weights and context it must read, the bytes it holds, and
// the collectives it issues. Benchmarks divide by these; `tpdraft info` and the scaling
// projections (bench/scaling) read them instead of counting again.
#pragma once

#include <array>

#include <cstdint>
#include <functional>
#include <string>

#include "checkpoint/config.h"
#include "core/dtype.h"
#include "model/selection.h"
#include "model/shard_plan.h"

namespace tpdraft::model {

struct WorkCount {
  double flops = 0;
  double weight_bytes = 0;   // weights streamed (each matrix read once)
  double context_bytes = 0;  // context K/V read
  double bytes() const { return weight_bytes + context_bytes; }
};

// One draft on one rank: `sessions` blocks, each over `context` settled positions.
// weight_dtype_bytes: bytes per weight element (2 for bf16); context_element_bytes: the cache's.
WorkCount draft_work(const DrafterConfig& cfg, const ShardPlan& plan, int64_t sessions, int64_t context,
                     double weight_dtype_bytes, double context_element_bytes = kContextElementBytes);
// Settling n rows on one rank (context_bytes: the rows written).
WorkCount settle_work(const DrafterConfig& cfg, const ShardPlan& plan, int64_t rows, double weight_dtype_bytes);

// Backend memory of one rank's weights, as DrafterWeights loads them: split matrices, the target
// head's vocabulary rows, and what every rank holds whole (host-mapped tables take none).
struct RankMemory {
  double sharded = 0, head = 0, replicated = 0;
  double total() const { return sharded + head + replicated; }
};
// Weight bytes one draft's forward reads on a rank (layer matrices, selector projection, head
// slice), with cfg.quant's matrices counted as packed values + f32 scales and the others in
// `dtype`.
double draft_weight_bytes(const DrafterConfig& cfg, const ShardPlan& plan, DType dtype, DType head_dtype);
// Of one draft's FLOPs on a rank (draft_work's, for `sessions` sessions), those of the matrices
// cfg.quant holds in int8 and in int4: [0] int8, [1] int4.
std::array<double, 2> draft_quantized_flops(const DrafterConfig& cfg, const ShardPlan& plan, int64_t sessions);

// dtype_of(name): how the checkpoint stores a drafter tensor (its file, or an assumption for a
// bare config; not asked for the matrices cfg.quant quantizes, counted as packed values + f32
// scales); head_dtype: the target head's.
RankMemory rank_memory(const DrafterConfig& cfg, const ShardPlan& plan,
                       const std::function<DType(const std::string&)>& dtype_of, DType head_dtype);

// Calls and bytes of one kind of collective, as parallel::CommStats counts them on a rank.
struct CollectiveCount {
  uint64_t calls = 0, bytes = 0;
  CollectiveCount& operator+=(const CollectiveCount& b) {
    calls += b.calls, bytes += b.bytes;
    return *this;
  }
};

struct DraftCollectives {
  CollectiveCount all_reduce, all_gather, broadcast;
};

// The collectives one rank issues for one draft of `sessions` sessions that all draft with
// `sampling`; gather_logits: the draft also assembles the full logits (a dump, bench
// --gather-logits). A top-p draw without top-k whose nucleus outgrows the candidate pool adds a
// full-logits gather the model cannot foresee; it is left out.
DraftCollectives draft_collectives(const DrafterConfig& cfg, const ShardPlan& plan, int64_t sessions,
                                   const SamplingParams& sampling, bool gather_logits = false);

}  // namespace tpdraft::model
