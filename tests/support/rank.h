// The tests' way to a rank: a RankRuntime over a checkpoint directory that write_random_checkpoint
// made for a config the test holds (so that a test may vary geometry without a file of its own),
// and the multi-head geometry the tensor-parallel tests share.
#pragma once

#include <memory>
#include <string>

#include "model/runtime.h"
#include "parallel/communicator.h"

namespace tpdraft::testing {

// Options for `name` ("cpu", "cuda") on `threads` CPU threads; the rest at their defaults.
model::RuntimeOptions backend(const std::string& name, int threads = 1);

// A runtime on `group` for CKPT/drafter and CKPT/target read with `cfg`.
std::unique_ptr<model::RankRuntime> open_rank(parallel::Communicator& group, const std::string& ckpt,
                                              const model::DrafterConfig& cfg,
                                              const model::RuntimeOptions& options = backend("cpu"));

// configs/FILE with 8 query heads over 2 kv heads of 8 and an FFN of 96: tp = 2 splits the kv
// heads, tp = 4 and 8 replicate them.
model::DrafterConfig eight_heads_over_two(const std::string& file);

}  // namespace tpdraft::testing
