// The drafter's geometry and behaviour, read from an HF `config.json` (docs/checkpoint.md) with
// every key and fallback, checked at load; and the small target-side config (vocab, tie).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "checkpoint/quant_config.h"

namespace tpdraft::model {

enum class Arch { DFlash, DFlash2 };

// How the checkpoint is laid out (docs/checkpoint.md): z-lab's DFlash / DFlash 2 layout, whose
// embedding and head are the target's, or the speculators DFlash layout (speculators_model_type
// "dflash"), which may ship its own embedding and a reduced head with its d2t map.
enum class Layout { ZLab, Speculators };

struct DrafterConfig {
  Arch arch = Arch::DFlash;
  std::string arch_name;  // architectures[0] as written
  Layout layout = Layout::ZLab;

  int64_t hidden = 0;        // H
  int64_t layers = 0;        // L
  int64_t n_q = 0;           // Nq
  int64_t n_kv = 0;          // Nk
  int64_t head_dim = 0;      // D
  int64_t ffn = 0;           // F
  int64_t vocab = 0;         // V: rows tokens may take
  // N: the draft vocabulary the head scores (docs/model.md); 0: none, the head scores all V.
  // Set by a speculators checkpoint's draft_vocab_size or by a token map applied at load.
  int64_t draft_vocab = 0;
  int64_t block = 16;        // B
  int64_t mask_token = -1;
  double eps = 1e-6;
  double rope_theta = 10000.0;
  std::vector<int64_t> taps;  // target layer ids, T = taps.size()
  int64_t num_target_layers = 0;  // 0 when absent

  // Per layer: sliding window on/off and causal block attention on/off.
  std::vector<bool> sliding;
  std::vector<bool> causal;
  int64_t window = 0;  // W, used by sliding layers

  double in_scale = 1.0;   // m_in
  double out_scale = 1.0;  // m_out
  double softcap = 0.0;    // cap, 0 = none
  bool bias = false;       // attention_bias

  // DFlash 2 only.
  int64_t conv_kernel = 0;     // K
  int64_t conv_group = 0;      // gs
  int64_t selector_rank = 0;   // R
  int64_t selector_topk = 0;   // k_top

  // quantization_config (docs/quantization.md), or a plan to quantize while loading.
  QuantConfig quant;

  int64_t n_taps() const { return static_cast<int64_t>(taps.size()); }
  int64_t conv_groups() const { return conv_group > 0 ? hidden / conv_group : 0; }  // G
  bool is_dflash2() const { return arch == Arch::DFlash2; }
  // Rows of the head a draft scores: N with a draft vocabulary, else V.
  int64_t head_vocab() const { return draft_vocab > 0 ? draft_vocab : vocab; }

  // Parses and validates either layout (a speculators_model_type key selects the speculators
  // one); `source` names the file in every message.
  static DrafterConfig from_json(const nlohmann::json& j, const std::string& source);
  static DrafterConfig from_file(const std::string& path);
  // A config.json of the config's layout that from_json reads back to the same config (a draft
  // vocabulary from a token map is not part of a z-lab config and is left out).
  nlohmann::json to_json() const;
  // Re-checks the constraints of docs/checkpoint.md (called by from_json; public for programmatic configs).
  void validate(const std::string& source) const;
};

// The upper bound of a size key of config.json (docs/checkpoint.md), e.g. "vocab_size".
int64_t size_limit(const std::string& key);

// The bits of the target model's config.json tpdraft needs (all optional).
struct TargetConfig {
  bool tie_word_embeddings = false;
  bool tie_stated = false;  // config.json holds the key tie_word_embeddings
  int64_t vocab = 0;   // vocab_size, 0 when absent
  int64_t hidden = 0;  // hidden_size, 0 when absent
  static TargetConfig from_dir(const std::string& dir);  // missing config.json: defaults
};

}  // namespace tpdraft::model
