// Which rows and columns of each weight a rank holds (docs/parallel.md, the shard plan), derived from the
// config and (rank, tp). One rank (tp = 1) holds everything; the same code serves every size.
// tensor_share() is the one place that maps a checkpoint tensor to the part a rank keeps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/config.h"
#include "core/dtype.h"
#include "core/range.h"

namespace tpdraft::model {

using tpdraft::Range;

struct ShardPlan {
  int rank = 0;
  int tp = 1;
  Range q_heads;   // query heads held
  Range kv_heads;  // kv heads held (one replicated head when tp > Nk)
  Range ffn;       // rows of gate/up, columns of down
  Range vocab;     // rows of the head: of the first V, or of a draft vocabulary's N (may be empty for padding)
  int64_t vocab_padded = 0;  // V (or N) rounded up to a multiple of tp

  // Checks the divisibility rules and builds the plan; errors name the field and tp.
  static ShardPlan make(const DrafterConfig& cfg, int rank, int tp);
  std::string describe() const;
};

// The context cache keeps K and V rows in f32 unless asked for bf16 (DrafterLimits::kv_dtype).
constexpr size_t kContextElementBytes = sizeof(float);

// Context bytes per position a rank holds: every layer's K and V rows of its kv heads.
size_t context_bytes_per_position(const DrafterConfig& cfg, const ShardPlan& plan,
                                  size_t element_bytes = kContextElementBytes);

// How a rank holds one checkpoint tensor.
enum class Placement {
  Replicated,    // every rank holds all of it
  SplitRows,     // rows `rows` only (a 1-D tensor: elements `rows`)
  SplitColumns,  // columns `cols` only
  HostMapped,    // read from the file mapping on demand; nothing in backend memory
};

// The part of one tensor a rank keeps. The tensor is seen as [shape[0], product of the rest]
// (1-D: [n, 1]); rows and cols are the kept ranges of that view.
struct TensorShare {
  Placement placement = Placement::Replicated;
  Range rows, cols;
  bool as_f32 = false;  // kept as f32 (norms, biases, conv base kernels), else in its own dtype

  bool sharded() const { return placement == Placement::SplitRows || placement == Placement::SplitColumns; }
  int64_t elements() const { return rows.size() * cols.size(); }
  // The kept elements as one flat range (every column kept): what a vector load copies.
  Range flat() const { return {rows.begin * cols.size(), rows.end * cols.size()}; }
  // Bytes this share takes in backend memory when the checkpoint stores the tensor as `dtype`.
  size_t backend_bytes(DType dtype) const;
};

// The share of the drafter tensor `name` (as spec'd by expected_drafter_tensors, or the target's
// "lm_head.weight" / "embed_tokens.weight") of full shape `shape` on the plan's rank. Throws for
// a name no rule covers, so a new tensor cannot be loaded or counted without one.
TensorShare tensor_share(const DrafterConfig& cfg, const ShardPlan& plan, const std::string& name,
                         const std::vector<int64_t>& shape);

}  // namespace tpdraft::model
