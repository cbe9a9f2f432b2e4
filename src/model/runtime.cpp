// Building a rank: ops -> shard plan -> weights -> device communicator -> drafter.
#include "model/runtime.h"

#include "core/error.h"
#include "kernels/backend.h"
#include "parallel/nccl_comm.h"

namespace tpdraft::model {

ModelSource ModelSource::open(const std::string& drafter_dir, const std::string& target_dir) {
  ModelSource s;
  s.config = DrafterConfig::from_file(drafter_dir + "/config.json");
  s.drafter = TensorStore::open(drafter_dir);
  s.target = TensorStore::open(target_dir);
  return s;
}

RankRuntime::RankRuntime(const ModelSource& source, parallel::Communicator& group, const RuntimeOptions& options) {
  TPDRAFT_CHECK(source.drafter && source.target, "a rank needs both a drafter and a target checkpoint");
  ops_ = kernels::make_ops(options.backend, options.threads,
                           options.local_rank >= 0 ? options.local_rank : group.rank());
  // Everything that can fail on the input (the plan, the tensors) comes before the device
  // communicator, whose start is a collective: a rank that fails here leaves none waiting in it.
  const ShardPlan plan = ShardPlan::make(source.config, group.rank(), group.size());
  weights_ = std::make_shared<DrafterWeights>(source.config, source.drafter, source.target, plan, *ops_);
  device_comm_ = parallel::make_backend_comm(group, *ops_, options.nccl);
  comm_ = device_comm_ ? device_comm_.get() : &group;
  DrafterLimits limits = options.limits;
  limits.graphs = options.graphs == GraphMode::On || (options.graphs == GraphMode::Auto && !ops_->host_memory());
  drafter_ = std::make_unique<Drafter>(weights_, *ops_, *comm_, limits);
}

QuantConfig quantization_on_load(const DrafterConfig& config, const std::string& mode, const std::string& source) {
  TPDRAFT_CHECK(!config.quant.any(), "{}: --quant {}: the checkpoint is quantized already ({})", source, mode,
                config.quant.file);
  const QuantRequest request = QuantRequest::preset(mode);
  QuantConfig q = plan_quantization(request, expected_drafter_tensors(config), QuantConfig::Source::OnLoad);
  // The head's rows are vocabulary entries of `hidden` columns.
  if (request.head_bits > 0) q.head = request.scheme(request.head_bits, config.hidden);
  return q;
}

void quantize_on_load(ModelSource& source, const std::string& mode) {
  if (mode.empty() || mode == "none") return;
  source.config.quant = quantization_on_load(
      source.config, mode, source.drafter ? source.drafter->source() : std::string("drafter"));
}

}  // namespace tpdraft::model
