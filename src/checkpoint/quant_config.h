// Which drafter matrices are quantized, and how: the `quantization_config` of a checkpoint's
// config.json (compressed-tensors: config groups with targets, an ignore list, the weights'
// bits / type / strategy / group size), or a plan made to quantize a float checkpoint while it
// loads (`--quant q8|q4`, `a8`/`a16` choosing the activations, `+head` the target's head too) or into a new checkpoint (`tpdraft quantize`). docs/quantization.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tpdraft::model {

// How the weights of one Linear module are stored.
struct QuantScheme {
  enum class Kind : uint8_t { None, Int, Fp8 };
  enum class Strategy : uint8_t { Tensor, Channel, Group };  // kStrategyNames (quant_config.cpp) follows this order
  Kind kind = Kind::None;
  int bits = 0;  // Int: 4 or 8; Fp8: 8
  Strategy strategy = Strategy::Channel;
  int64_t group = 0;  // Group: columns per scale

  bool quantized() const { return kind != Kind::None; }
  std::string describe() const;  // "int4 g128", "int8 per-channel", "fp8 per-tensor", "float"
  bool operator==(const QuantScheme& o) const {
    return kind == o.kind && bits == o.bits && strategy == o.strategy && group == o.group;
  }
};

// The drafter tensors that may be quantized (Linear weights): fc, q/k/v/o, gate/up/down, the
// DFlash 2 kernel projections and the selector's hidden projection. Norms, biases, conv base
// kernels and selector codebooks always stay as stored.
bool quantizable_tensor(const std::string& tensor);

struct QuantConfig {
  enum class Source : uint8_t { None, Checkpoint, OnLoad };
  Source source = Source::None;
  std::string format;  // Checkpoint: "pack-quantized" (int) or "float-quantized" (fp8)
  struct Group {
    std::string name;
    std::vector<std::string> targets;  // "Linear", a module name, or "re:<regex>"
    QuantScheme weights;
  };
  std::vector<Group> groups;
  std::vector<std::string> ignore;  // module names or "re:<regex>"
  std::string file;                 // for messages
  // The target's head (lm_head, or the tied embedding): quantized only while loading (a `+head`
  // preset); a checkpoint's quantization_config covers drafter tensors only.
  QuantScheme head;
  // What a quantized matrix multiplies: 0, the backend's own kernels (the CPU quantizes
  // activations to int8, CUDA rounds them to bf16); 8, int8 activations (refused by a backend
  // without such kernels); 16, float activations (a backend whose kernels quantize activations
  // holds the weights dequantized, exactly, in f32). Chosen while loading (`--quant q8a8`, ...).
  int activation_bits = 0;

  bool any() const { return source != Source::None; }
  // The scheme of drafter tensor `tensor` (e.g. "layers.0.mlp.down_proj.weight"): the first
  // group with a target matching its module ("layers.0.mlp.down_proj", also tried as
  // "model.layers.0.mlp.down_proj"), unless the ignore list names it. None for tensors that are
  // not quantizable or not targeted.
  QuantScheme scheme_for(const std::string& tensor) const;

  // Parses and checks `quantization_config`; refuses what tpdraft cannot run (another method or
  // format, asymmetric weights, activation ordering, block strategy), naming `source`.
  static QuantConfig from_json(const nlohmann::json& qc, const std::string& source);
  // compressed-tensors' `quantization_config` for a Checkpoint config.
  nlohmann::json to_json() const;
};

// What to quantize: `bits` for the layer matrices selected by `only` ("all", "mlp", "attn"), in
// groups of `group` columns where the group divides a matrix's columns (per channel otherwise);
// fc too with `include_fc`; and fc, the kernel projections and the selector projection at
// `aux_bits` (0: left as they are). Round to nearest, symmetric.
struct QuantRequest {
  int bits = 4;
  int64_t group = 128;
  std::string only = "all";
  bool include_fc = false;
  int aux_bits = 0;
  int head_bits = 0;  // the target's head while loading (0: as stored)
  int activation_bits = 0;  // QuantConfig::activation_bits
  // The --quant presets of draft / bench / open: "q8" (every matrix 8-bit) and "q4" (layer
  // matrices 4-bit, fc and the projections 8-bit), groups of 128 where they fit; "a8" or "a16"
  // after the bits picks the activations ("q8a8": int8, "q4a16": float; none: the backend's own);
  // a "+head" suffix holds the target's head in 8 bits as well (the largest matrix a draft reads).
  static QuantRequest preset(const std::string& name);
  // The scheme of `bits` for a matrix of `cols` columns: groups of `group` where they divide the
  // columns, per channel otherwise.
  QuantScheme scheme(int bits, int64_t cols) const;
};

// j[key], or nullptr when the key is absent or null (HF configs write null for unset keys).
const nlohmann::json* find_key(const nlohmann::json& j, const char* key);

// The names preset() takes, and them as one phrase for messages ("q8, q4, q8a8, ... or q4a16,
// each optionally with +head").
const std::vector<std::string>& quant_presets();
std::string quant_preset_list();

// The per-tensor plan of `request` for the drafter tensors `tensors` (name, full shape), as one
// config group per distinct scheme, listing module names as targets.
QuantConfig plan_quantization(const QuantRequest& request,
                              const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
                              QuantConfig::Source source);

}  // namespace tpdraft::model
