// The tests' way to a rank: a RankRuntime over a checkpoint directory that write_random_checkpoint
// made for a config the test holds (so that a test may vary geometry without a file of its own),
// and the multi-head geometry the tensor-parallel tests share.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "engine/runtime.h"
#include "model/drafter.h"
#include "parallel/communicator.h"

namespace tpdraft::testing {

// Options for `name` ("cpu", "cuda") on `threads` CPU threads; the rest at their defaults.
model::RuntimeOptions backend(const std::string& name, int threads = 1);

// A runtime on `group` for CKPT/drafter and CKPT/target read with `cfg`, quantized as it loads
// with --quant `quant` unless that is empty.
std::unique_ptr<model::RankRuntime> open_rank(parallel::Communicator& group, const std::string& ckpt,
                                              const model::DrafterConfig& cfg,
                                              const model::RuntimeOptions& options = backend("cpu"),
                                              const std::string& quant = "");

// fn on a group of n ranks as a run of that size has it: at n = 1 on the single-rank communicator
// (which, unlike the in-process one, a captured graph can hold), else on n in-process ranks.
void run_group(int n, const std::function<void(parallel::Communicator&)>& fn);

// configs/FILE of the source tree (e.g. "tiny-dflash.json").
model::DrafterConfig shipped_config(const std::string& file);

// configs/FILE with 8 query heads over 2 kv heads of 8 and an FFN of 96: tp = 2 splits the kv
// heads, tp = 4 and 8 replicate them.
model::DrafterConfig eight_heads_over_two(const std::string& file);

class TempDir;

// A random checkpoint for `cfg` in `dir` (seed 5, a head padded 13 rows past the vocabulary);
// returns the directory.
std::string write_checkpoint(const TempDir& dir, const model::DrafterConfig& cfg, DType dtype = DType::BF16);

// One draft over sessions settled to `contexts` positions; with `rollback`, a session of 4 or
// more first settles 3 rows too many, rolls back 7 and settles 4 (a rejected round). Session s
// drafts with sampling[s % size], from its own taps and anchor.
struct Scenario {
  std::vector<int64_t> contexts = {40};
  std::vector<model::SamplingParams> sampling = {{}};
  bool rollback = false;
  bool dump = true;  // also gather the hidden states and full logits
  std::string quant;  // --quant mode applied as the checkpoint loads ("" for none)
};

struct ScenarioOutput {
  std::vector<model::DraftResult> results;
  model::DraftDump dump;
  parallel::CommStats stats;  // of the draft alone
  std::string comm;           // the communicator the drafter used
};

// Runs `sc` on one rank of `group` with a fresh runtime (options' max sessions set to the
// scenario's).
ScenarioOutput run_scenario(parallel::Communicator& group, model::RuntimeOptions options, const std::string& ckpt,
                            const model::DrafterConfig& cfg, const Scenario& sc);

}  // namespace tpdraft::testing
