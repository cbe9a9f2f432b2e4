// Which rows and columns of each weight a rank holds (docs/parallel.md, the shard plan), derived from the
// config and (rank, tp). One rank (tp = 1) holds everything; the same code serves every size.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace tpdraft::model {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

struct ShardPlan {
  int rank = 0;
  int tp = 1;
  Range q_heads;   // query heads held
  Range kv_heads;  // kv heads held (one replicated head when tp > Nk)
  Range ffn;       // rows of gate/up, columns of down
  Range vocab;     // rows of the target head (within the first V rows; may be empty for padding)
  int64_t vocab_padded = 0;  // V rounded up to a multiple of tp

  // Checks the divisibility rules and builds the plan; errors name the field and tp.
  static ShardPlan make(const DrafterConfig& cfg, int rank, int tp);
  std::string describe() const;
};

}  // namespace tpdraft::model
