// One rank of a drafter, built in one place: the backend's ops, the shard plan (taken from the
// group's rank and size), the rank's share of the weights, the communicator that carries the
// backend's buffers, and the drafter, which checks that plan and communicator agree. The CLI,
// the tests and the library all start a rank here.
#pragma once

#include <memory>
#include <string>

#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "kernels/ops.h"
#include "model/draft_vocab.h"
#include "model/drafter.h"
#include "model/shard_plan.h"
#include "model/weights.h"
#include "parallel/communicator.h"

namespace tpdraft::model {

// What a rank loads: a drafter checkpoint and the target's embedding and head, from disk or
// held in memory (benchmarks on random weights).
struct ModelSource {
  DrafterConfig config;
  std::shared_ptr<const TensorStore> drafter;
  std::shared_ptr<const TensorStore> target;
  // The draft vocabulary (config.draft_vocab ids), or null: the head scores every id below V.
  std::shared_ptr<const DraftVocab> vocab;

  // A config and its tensors, with a speculators checkpoint's draft vocabulary read from d2t.
  static ModelSource from(DrafterConfig config, std::shared_ptr<const TensorStore> drafter,
                          std::shared_ptr<const TensorStore> target);
  // DRAFTER/config.json and the tensors of both directories.
  static ModelSource open(const std::string& drafter_dir, const std::string& target_dir);
};

// Restricts the head to the target ids of `token_map` (draft_vocab.h), read from `path` (a
// token map file) or given; refuses a checkpoint that has a draft vocabulary already.
void apply_token_map(ModelSource& source, const std::string& path);
void apply_token_map(ModelSource& source, const std::vector<int64_t>& ids, const std::string& label);

// The plan of --quant `mode` (QuantRequest::preset: "q8", "q4a8", "q8a16+head", ...) for the float
// checkpoint of `config`, the `+head` presets' head scheme included; refuses a checkpoint that is
// quantized already, naming `source`.
QuantConfig quantization_on_load(const DrafterConfig& config, const std::string& mode, const std::string& source);
// The float checkpoint's matrices are quantized as they load (its config's quant becomes the plan
// of `mode`); "" or "none": nothing.
void quantize_on_load(ModelSource& source, const std::string& mode);

enum class GraphMode { Auto, On, Off };  // Auto: on for backends whose memory is a device's

struct RuntimeOptions {
  std::string backend = "auto";  // "cpu", "cuda", or "auto" (cuda when a device is visible)
  int threads = 0;               // CPU worker threads (0: every core)
  // This rank's index among the ranks on its machine (-1: its rank in the group); its GPU is
  // this index modulo the devices the machine has.
  int local_rank = -1;
  bool nccl = false;             // device buffers over NCCL (one GPU per rank), else host staging
  GraphMode graphs = GraphMode::Auto;
  DrafterLimits limits;          // limits.graphs is decided by `graphs`
};

class RankRuntime {
 public:
  // `group` is this rank's tensor-parallel group (host buffers); it must outlive the runtime.
  RankRuntime(const ModelSource& source, parallel::Communicator& group, const RuntimeOptions& options);
  RankRuntime(const RankRuntime&) = delete;
  RankRuntime& operator=(const RankRuntime&) = delete;

  kernels::Ops& ops() { return *ops_; }
  // The communicator the drafter uses: `group`, or the device communicator built over it.
  parallel::Communicator& comm() { return *comm_; }
  const DrafterConfig& config() const { return weights_->config(); }
  const ShardPlan& plan() const { return weights_->plan(); }
  const DrafterWeights& weights() const { return *weights_; }
  Drafter& drafter() { return *drafter_; }
  const Drafter& drafter() const { return *drafter_; }

 private:
  // Destroyed in reverse order: the drafter before what it uses, the ops last.
  std::unique_ptr<kernels::Ops> ops_;
  std::shared_ptr<const DrafterWeights> weights_;
  std::unique_ptr<parallel::Communicator> device_comm_;
  parallel::Communicator* comm_ = nullptr;
  std::unique_ptr<Drafter> drafter_;
};

}  // namespace tpdraft::model
