// Building a rank: ops -> device communicator -> shard plan -> weights -> drafter.
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
  device_comm_ = parallel::make_backend_comm(group, *ops_, options.nccl);
  comm_ = device_comm_ ? device_comm_.get() : &group;
  const ShardPlan plan = ShardPlan::make(source.config, comm_->rank(), comm_->size());
  weights_ = std::make_shared<DrafterWeights>(source.config, source.drafter, source.target, plan, *ops_);
  DrafterLimits limits = options.limits;
  limits.graphs = options.graphs == GraphMode::On || (options.graphs == GraphMode::Auto && !ops_->host_memory());
  drafter_ = std::make_unique<Drafter>(weights_, *ops_, *comm_, limits);
}

RankRuntime::~RankRuntime() = default;

}  // namespace tpdraft::model
