// The drafter's weights on one rank: the rank's shard of every matrix, kept in its checkpoint
// dtype in backend memory, norms and small vectors as f32; plus the host-mapped target embedding
// and selector codebooks, whose rows are looked up on demand.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/config.h"
#include "checkpoint/quant_tensors.h"
#include "checkpoint/safetensors.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "model/draft_vocab.h"
#include "model/shard_plan.h"

namespace tpdraft::model {

struct LayerWeights {
  kernels::Matrix q, k, v, o, gate, up, down;  // local shards
  const float* q_bias = nullptr;  // local rows; nullptr without attention_bias
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* o_bias = nullptr;  // full [H]: added once, by rank 0's partial sum only
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  // DFlash 2 (replicated).
  const float* attn_conv_base = nullptr;  // [2, K, H]
  const float* mlp_conv_base = nullptr;   // [2, K, H]
  kernels::Matrix attn_conv_proj, mlp_conv_proj;  // [2*K*G, H]
};

class DrafterWeights {
 public:
  // Loads this rank's share. `drafter` and `target` stay referenced for the host-mapped tables.
  // With `vocab` (cfg.draft_vocab ids) the head holds the rank's rows of the draft vocabulary.
  DrafterWeights(const DrafterConfig& cfg, std::shared_ptr<const TensorStore> drafter,
                 std::shared_ptr<const TensorStore> target, const ShardPlan& plan, kernels::Ops& ops,
                 std::shared_ptr<const DraftVocab> vocab = nullptr);

  const DrafterConfig& config() const { return cfg_; }
  const ShardPlan& plan() const { return plan_; }

  kernels::Matrix fc;                // [H, T*H]
  const float* hidden_norm = nullptr;
  const float* final_norm = nullptr;
  std::vector<LayerWeights> layers;
  // Local vocabulary rows [plan.vocab.size(), H]: head row j scores target id j, or, with a draft
  // vocabulary, draft_vocab()->ids[j] (rows taken from the target head or a speculators drafter's own).
  kernels::Matrix head;
  DType head_dtype = DType::BF16;    // the head's dtype in its checkpoint (also when quantized)
  kernels::Matrix selector_proj;     // [R, H] (DFlash 2)

  // Host lookups (f32 out): target embedding row, selector codebook rows (selector_walk's `rows`).
  void embedding_row(int64_t token, float* out) const;
  void predecessor(int64_t token, float* out) const;
  void successor(int64_t token, float* out) const;

  size_t backend_bytes() const { return backend_bytes_; }  // everything this rank copied in
  // Whether the quantized matrices are held dequantized in f32 (float activations asked of a
  // backend whose quantized kernels use int8 ones: QuantConfig::activation_bits).
  bool dequantized() const { return dequantize_; }
  int64_t target_vocab() const { return target_vocab_; }   // Vt, rows of the target tables
  // The draft vocabulary the head scores, or null (every id below V).
  const DraftVocab* draft_vocab() const { return vocab_.get(); }

 private:
  // The rank's share of a tensor (tensor_share of `name`), checked against `shape`.
  kernels::Matrix load_matrix(const TensorStore& store, const std::string& name, const std::vector<int64_t>& shape);
  kernels::Matrix load_quantized(const TensorStore& store, const std::string& name, const std::vector<int64_t>& shape,
                                 const TensorShare& share, const QuantScheme& scheme);
  const float* load_vector(const TensorStore& store, const std::string& name, const std::vector<int64_t>& shape);
  // Holds a loaded buffer for the weights' lifetime (counted in backend_bytes); returns its data.
  void* keep(kernels::Buffer buf);
  // The rank's share of the head `info` (named `name` in messages): its vocabulary rows, gathered
  // through the draft vocabulary when there is one, quantized for a +head preset.
  kernels::Matrix load_head(const std::string& name, const TensorInfo& info, const TensorShare& share);
  // Uploads rows x cols f32 weights (a share dequantized while loading) and holds them.
  kernels::Matrix keep_f32(const std::vector<float>& w, int64_t rows, int64_t cols);
  // Uploads a quantized share and holds it.
  kernels::Matrix keep_quantized(const QuantShare& q, const std::string& name, const QuantScheme& scheme);
  const TensorInfo& codebook(const std::string& base) const;
  // Checks every drafter tensor and finds the codebooks and the target tables, before anything
  // is allocated; returns the target's head and its name in the store.
  const TensorInfo& check_tensors(std::string* head_name);
  // Finds and checks the embedding and the head, the target's or a speculators drafter's own
  // (sets embed_, embed_store_, head_store_, target_vocab_).
  const TensorInfo& target_tables(std::string* head_name);

  DrafterConfig cfg_;
  ShardPlan plan_;
  kernels::Ops& ops_;
  std::shared_ptr<const TensorStore> drafter_;
  std::shared_ptr<const TensorStore> target_;
  std::shared_ptr<const DraftVocab> vocab_;
  const TensorStore* embed_store_ = nullptr;
  const TensorStore* head_store_ = nullptr;
  std::vector<kernels::Buffer> buffers_;
  size_t backend_bytes_ = 0;
  bool dequantize_ = false;
  int activation_bits_ = 0;  // asked of the backend for every quantized matrix (0: its own)
  const TensorInfo* embed_ = nullptr;
  const TensorInfo* pred_ = nullptr;
  const TensorInfo* succ_ = nullptr;
  int64_t target_vocab_ = 0;
};

// Every tensor name a drafter checkpoint must hold, with its full shape (docs/checkpoint.md).
std::vector<std::pair<std::string, std::vector<int64_t>>> expected_drafter_tensors(const DrafterConfig& cfg);

// A share read from a checkpoint, as the kernels take it.
inline kernels::QuantizedRows quantized_rows(const QuantShare& q, int activation_bits = 0) {
  return {q.bits, q.rows, q.cols, q.group, q.q.data(), q.scales.data(), activation_bits};
}

}  // namespace tpdraft::model
