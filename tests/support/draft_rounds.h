// A fixed run of drafts for checking captured forwards (DrafterLimits::graphs) against ops issued
// one by one: between drafts, contexts grow, roll back and wrap the sliding rings, sessions swap
// places in the batch, and the batch shrinks from two sessions to one.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/config.h"
#include "model/drafter.h"
#include "parallel/communicator.h"

namespace tpdraft::testing {

struct DraftRound {
  model::DraftDump dump;
  std::vector<model::DraftResult> results;
  parallel::CommStats stats;  // this draft's collectives
  bool replayed = false;      // the forward was a graph replay
  size_t segments = 0;        // graph segments held for this draft's session count
  size_t nodes = 0;           // and the nodes they hold (CPU: recorded calls)
};

// Runs the rounds on one rank of `group` (checkpoint directory `ckpt` as written by
// write_random_checkpoint for `cfg`) on a fresh rank runtime of the given backend.
// nccl: device buffers over NCCL (RuntimeOptions::nccl) instead of host staging.
std::vector<DraftRound> run_draft_rounds(parallel::Communicator& group, const std::string& backend,
                                         const std::string& ckpt, const model::DrafterConfig& cfg, bool graphs,
                                         bool nccl = false);

// Which rounds replay a graph when graphs are on: the first draft of each session count is
// issued op by op (and captured), the others replay.
const std::vector<bool>& draft_rounds_replayed();

}  // namespace tpdraft::testing
