// Random-weight checkpoints in the real on-disk format (HF config.json + safetensors for the
// drafter; embedding + head for the target; a taps file), deterministic by seed, so that users
// and tests can run tpdraft without downloading anything. Scales keep activations O(1).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "core/dtype.h"

namespace tpdraft::model {

struct RandomCheckpointOptions {
  uint64_t seed = 0;
  DType dtype = DType::BF16;  // BF16, F16 or F32
  int64_t target_vocab = 0;   // Vt >= V rows of the target tables; 0: V
  bool tie_embeddings = false;
  int threads = 0;
  // A speculators-layout config (Layout::Speculators): the drafter ships its own embedding [V, H]
  // (else it reads the target's), and with a draft vocabulary its own head [N, H] and the d2t /
  // t2d map of N random target ids. Its tables are drawn apart from the target's, so a draft
  // that read the target's instead would differ.
  bool own_embedding = true;
};

// Tensors of a drafter checkpoint (docs/checkpoint.md names, no prefix; a speculators one's own
// tables and map too) / a target (HF names with the "model." prefix), generated in parallel;
// `progress(done, total)` is called as tensors finish.
std::vector<OwnedTensor> random_drafter_tensors(const DrafterConfig& cfg, const RandomCheckpointOptions& opt,
                                                const std::function<void(size_t, size_t)>& progress = {});
std::vector<OwnedTensor> random_target_tensors(const DrafterConfig& cfg, const RandomCheckpointOptions& opt,
                                               const std::function<void(size_t, size_t)>& progress = {});
// The target ids of a random speculators checkpoint's draft vocabulary (d2t), by seed.
std::vector<int64_t> random_draft_ids(const DrafterConfig& cfg, uint64_t seed);
// Random tap rows [n, T*H] (f32), deterministic by seed.
std::vector<float> random_taps(const DrafterConfig& cfg, int64_t n, uint64_t seed);

// Writes DIR/drafter/{config.json, model.safetensors}, DIR/target/{config.json, model.safetensors}
// and, when taps_rows > 0, DIR/taps.safetensors (tensor "taps" [n, T*H] f32).
void write_random_checkpoint(const DrafterConfig& cfg, const std::string& dir, const RandomCheckpointOptions& opt,
                             int64_t taps_rows);

}  // namespace tpdraft::model
