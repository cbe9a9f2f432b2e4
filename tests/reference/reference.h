// The independent float64 reference of the DFlash / DFlash 2 drafter: plain loops written
// straight from docs/model.md, sharing no code with the fast path except the config and
// checkpoint readers. Slow on purpose; used on tiny configs to check whole drafts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/config.h"

namespace tpdraft::reference {

// How draft tokens are chosen (docs/sampling.md).
struct RefSampling {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: off (DFlash 1 only)
  double top_p = 1.0;        // 1: off (DFlash 1 only)
  uint64_t seed = 0;
};

struct RefDraft {
  std::vector<double> hidden;  // [B, H]: final-normed rows of the block, row 0 included
  std::vector<double> logits;  // [B-1, V]: after m_out and soft cap; -inf outside a draft vocabulary
  std::vector<int64_t> tokens; // [B-1]
  std::vector<double> probs;   // [B-1]: q_r(d_r) (1 for greedy)
};

// One session's context: per layer, per position, K and V [Nk * D] (after k_norm and RoPE).
struct RefContext {
  std::vector<std::vector<std::vector<double>>> k;  // [L][pos][Nk*D]
  std::vector<std::vector<std::vector<double>>> v;
  int64_t length() const { return k.empty() ? 0 : static_cast<int64_t>(k[0].size()); }
};

class RefModel {
 public:
  // drafter_dir holds config.json + safetensors; target_dir the target's embedding and head. A
  // speculators checkpoint's own embedding and head are read from drafter_dir, its draft
  // vocabulary from d2t. With `token_map`, only those target ids are drafted (docs/model.md):
  // every other logit is -inf.
  RefModel(const std::string& drafter_dir, const std::string& target_dir,
           const std::vector<int64_t>& token_map = {});

  const model::DrafterConfig& config() const { return cfg_; }

  // Settles rows u [n, T*H] at positions p0 .. p0+n-1: the context is first cut to p0 rows,
  // then the new rows are appended (docs/model.md, settle).
  void settle(RefContext& ctx, int64_t p0, const std::vector<double>& u, int64_t n) const;
  // Drafts one block with the anchor token at position ctx.length() (docs/model.md, docs/sampling.md).
  RefDraft draft(const RefContext& ctx, int64_t anchor_token, const RefSampling& sampling) const;

 private:
  model::DrafterConfig cfg_;
  // All weights as f64, keyed by canonical tensor name.
  struct Tensor {
    std::vector<int64_t> shape;
    std::vector<double> data;
  };
  const Tensor& w(const std::string& name) const;
  // W x (+ bias when the config has biases and `bias` asks for it) for the Linear `name`.
  std::vector<double> linear(const std::string& name, const std::vector<double>& x, bool bias) const;
  // Attention of one layer for the block rows x (already normed and convolved), docs/model.md steps 3-4.
  std::vector<std::vector<double>> attention(int64_t l, const RefContext& ctx,
                                             const std::vector<std::vector<double>>& x) const;
  // One decoder layer over the block rows h (docs/model.md, steps 1-10).
  void layer(int64_t l, const RefContext& ctx, std::vector<std::vector<double>>& h) const;
  // Fills tokens and probs from logits and hidden (docs/sampling.md).
  void choose(RefDraft& d, int64_t anchor, const RefSampling& s) const;
  std::vector<std::pair<std::string, Tensor>> weights_;
  std::vector<double> embed_;  // [V, H] first V rows of the embedding (the target's, or a speculators drafter's)
  std::vector<double> head_;   // [rows, H]: the head's rows
  std::vector<int64_t> head_row_;  // [V]: the row of head_ that scores each target id, -1 for none (logit -inf)
};

// The splitmix64 finaliser, the hash behind ref_uniform.
uint64_t splitmix64(uint64_t x);
// The counter-based uniform in (0, 1) behind seeded sampling: key (seed, row, id).
double ref_uniform(uint64_t seed, uint64_t row, uint64_t id);

}  // namespace tpdraft::reference
