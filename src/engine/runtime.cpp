// Building a rank: ops -> shard plan -> weights -> device communicator -> drafter.
#include "engine/runtime.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/backend.h"
#include "parallel/nccl_comm.h"

namespace tpdraft::model {

ModelSource ModelSource::open(const std::string& drafter_dir, const std::string& target_dir) {
  DrafterConfig config = DrafterConfig::from_file(drafter_dir + "/config.json");
  return from(std::move(config), TensorStore::open(drafter_dir), TensorStore::open(target_dir));
}

ModelSource ModelSource::from(DrafterConfig config, std::shared_ptr<const TensorStore> drafter,
                              std::shared_ptr<const TensorStore> target) {
  ModelSource s{std::move(config), std::move(drafter), std::move(target), nullptr};
  if (s.config.draft_vocab > 0) {
    // The speculators layout: draft row i scores target id i + d2t[i], from the drafter's own
    // reduced head, or, when it ships none, from the target head's rows of those ids.
    const std::vector<int64_t> ids = read_d2t(*s.drafter, s.config.draft_vocab, s.config.vocab);
    const bool own_head = s.drafter->find("lm_head.weight") != nullptr;
    std::vector<int64_t> rows(ids.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = own_head ? static_cast<int64_t>(i) : ids[i];
    s.vocab = std::make_shared<DraftVocab>(make_draft_vocab(ids, rows, s.drafter->source() + " (d2t)", s.config.vocab));
  }
  return s;
}

void apply_token_map(ModelSource& source, const std::string& path) {
  apply_token_map(source, read_token_map(path, source.config.vocab), path);
}

void apply_token_map(ModelSource& source, const std::vector<int64_t>& ids, const std::string& label) {
  TPDRAFT_CHECK(source.config.draft_vocab == 0,
                "{}: the checkpoint has a draft vocabulary of its own ({} tokens); a token map restricts a full head",
                label, source.config.draft_vocab);
  // Rows of the full head: the target's, or a speculators drafter's own [V, H] head. Repeats are
  // dropped, as a map file's are.
  std::vector<int64_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  source.vocab = std::make_shared<DraftVocab>(make_draft_vocab(sorted, sorted, label, source.config.vocab));
  DrafterConfig cfg = source.config;
  cfg.draft_vocab = source.vocab->size();
  cfg.validate(label);  // e.g. a DFlash 2 selector's top-k beyond the map
  source.config = cfg;
}

RankRuntime::RankRuntime(const ModelSource& source, parallel::Communicator& group, const RuntimeOptions& options) {
  TPDRAFT_CHECK(source.drafter && source.target, "a rank needs both a drafter and a target checkpoint");
  ops_ = kernels::make_ops(options.backend, options.threads,
                           options.local_rank >= 0 ? options.local_rank : group.rank());
  // Everything that can fail on the input (the plan, the tensors) comes before the device
  // communicator, whose start is a collective: a rank that fails here leaves none waiting in it.
  const ShardPlan plan = ShardPlan::make(source.config, group.rank(), group.size());
  weights_ = std::make_shared<DrafterWeights>(source.config, source.drafter, source.target, plan, *ops_, source.vocab);
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
  q.activation_bits = request.activation_bits;
  return q;
}

void quantize_on_load(ModelSource& source, const std::string& mode) {
  if (mode.empty() || mode == "none") return;
  source.config.quant = quantization_on_load(
      source.config, mode, source.drafter ? source.drafter->source() : std::string("drafter"));
}

}  // namespace tpdraft::model
