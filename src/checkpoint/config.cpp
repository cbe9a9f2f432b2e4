// config.json parsing for DFlash / DFlash 2 drafters: key fallbacks as docs/checkpoint.md lists them,
// errors that name the file and the key.
#include "checkpoint/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/checked.h"
#include "core/error.h"
#include "core/files.h"

namespace tpdraft::model {

namespace {

using nlohmann::json;

// Looks a key up in `dflash_config` first, then at the top level.
const json* find_nested(const json& j, const char* key) {
  const json* dc = find_key(j, "dflash_config");
  const json* v = dc != nullptr && dc->is_object() ? find_key(*dc, key) : nullptr;
  return v != nullptr ? v : find_key(j, key);
}

// A true / false key, when present.
void read_bool(const json& j, const char* key, const std::string& source, bool* out) {
  if (const json* v = find_key(j, key)) {
    TPDRAFT_CHECK(v->is_boolean(), "{}: key '{}' must be true or false", source, key);
    *out = v->get<bool>();
  }
}

// A JSON file, or a failure naming it.
json read_json(const std::string& path, const char* what) {
  const std::string text = read_regular_file(path, what);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    TPDRAFT_FAIL("{}: not valid JSON ({})", path, e.what());
  }
}

int64_t as_int(const json* v, const std::string& source, const char* key) {
  // The JSON parser keeps integers above 2^63 as unsigned and longer ones as doubles (1e+300).
  if (v->is_number_unsigned()) {
    const auto u = v->get<uint64_t>();
    TPDRAFT_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                  "{}: key '{}': {} is not an integer in the 64-bit range", source, key, u);
    return static_cast<int64_t>(u);
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  TPDRAFT_CHECK(v->is_number_float() && std::floor(v->get<double>()) == v->get<double>(),
                "{}: key '{}' must be an integer, got {}", source, key, v->dump());
  return checked_to_int64(v->get<double>(), "{}: key '{}'", source, key);
}

double as_double(const json* v, const std::string& source, const char* key) {
  TPDRAFT_CHECK(v->is_number(), "{}: key '{}' must be a number, got {}", source, key, v->dump());
  return v->get<double>();
}

// Upper bounds of the size keys (docs/checkpoint.md): far above any published drafter, and low
// enough that no product of them overflows int64 and a typo fails here, not in an allocation.
struct Bound {
  const char* key;
  int64_t limit;
};
constexpr Bound kBounds[] = {
    {"hidden_size", 1 << 17},      {"num_hidden_layers", 1024},  {"num_attention_heads", 1024},
    {"num_key_value_heads", 1024}, {"head_dim", 4096},           {"intermediate_size", 1 << 20},
    {"vocab_size", 1 << 24},       {"block_size", 1024},         {"sliding_window", 1 << 24},
    {"num_target_layers", 1 << 16}, {"target_layer_ids", 1 << 16}, {"conv_kernel_size", 64},
    {"conv_group_size", 1 << 17},  {"selector_rank", 1 << 16},   {"selector_top_k", 4096},
    {"draft_vocab_size", 1 << 24},
};
constexpr int64_t kMaxTaps = 1024;  // entries of target_layer_ids

// The DFlash 2 keys (top level or dflash_config) and the fields they fill.
constexpr std::pair<const char*, int64_t DrafterConfig::*> kDFlash2Keys[] = {
    {"conv_kernel_size", &DrafterConfig::conv_kernel}, {"conv_group_size", &DrafterConfig::conv_group},
    {"selector_rank", &DrafterConfig::selector_rank},  {"selector_top_k", &DrafterConfig::selector_topk}};

int64_t check_limit(int64_t v, const char* key, const std::string& source) {
  const int64_t limit = size_limit(key);
  TPDRAFT_CHECK(v <= limit, "{}: key '{}' = {} is above the limit of {} for this key", source, key, v, limit);
  return v;
}

// A size key, bounded as soon as it is read: later steps allocate per layer or per tap.
int64_t require_size(const json& j, const char* key, const std::string& source, bool nested = false) {
  const json* v = nested ? find_nested(j, key) : find_key(j, key);
  TPDRAFT_CHECK(v != nullptr, "{}: missing required key '{}'", source, key);
  return check_limit(as_int(v, source, key), key, source);
}

}  // namespace

int64_t size_limit(const std::string& key) {
  for (const Bound& b : kBounds)
    if (key == b.key) return b.limit;
  TPDRAFT_FAIL("config key '{}' has no upper bound defined", key);
}

namespace {

// The Qwen3-shaped geometry both layouts share: at the top level of a z-lab config, in
// transformer_layer_config of a speculators one. `where` names the object in messages.
void read_geometry(const json& j, const std::string& where, DrafterConfig& c) {
  c.hidden = require_size(j, "hidden_size", where);
  c.layers = require_size(j, "num_hidden_layers", where);
  c.n_q = require_size(j, "num_attention_heads", where);
  c.n_kv = find_key(j, "num_key_value_heads") ? require_size(j, "num_key_value_heads", where) : c.n_q;
  TPDRAFT_CHECK(c.n_q > 0, "{}: key 'num_attention_heads' must be positive, got {}", where, c.n_q);
  c.head_dim = find_key(j, "head_dim") ? require_size(j, "head_dim", where) : c.hidden / c.n_q;
  c.ffn = require_size(j, "intermediate_size", where);
  c.vocab = require_size(j, "vocab_size", where);
  if (const json* v = find_key(j, "rms_norm_eps")) c.eps = as_double(v, where, "rms_norm_eps");

  // RoPE: rope_theta, else rope_parameters.rope_theta; scaling types other than default refused.
  if (const json* v = find_key(j, "rope_theta")) {
    c.rope_theta = as_double(v, where, "rope_theta");
  } else if (const json* rp = find_key(j, "rope_parameters"); rp && rp->is_object() && rp->contains("rope_theta")) {
    c.rope_theta = as_double(&(*rp)["rope_theta"], where, "rope_parameters.rope_theta");
  }
  auto check_rope_type = [&](const json* obj, const char* key_name) {
    if (!obj || !obj->is_object()) return;
    for (const char* key : {"rope_type", "type"}) {
      auto it = obj->find(key);
      if (it != obj->end() && it->is_string() && it->get<std::string>() != "default")
        TPDRAFT_FAIL("{}: key '{}.{}' is '{}'; only 'default' RoPE is supported", where, key_name, key,
                     it->get<std::string>());
    }
  };
  check_rope_type(find_key(j, "rope_parameters"), "rope_parameters");
  check_rope_type(find_key(j, "rope_scaling"), "rope_scaling");

  c.sliding.assign(static_cast<size_t>(std::max<int64_t>(c.layers, 0)), false);
  if (const json* lt = find_key(j, "layer_types")) {
    TPDRAFT_CHECK(lt->is_array(), "{}: key 'layer_types' must be a list of strings", where);
    TPDRAFT_CHECK(static_cast<int64_t>(lt->size()) == c.layers,
                  "{}: key 'layer_types' has {} entries, expected num_hidden_layers = {}", where, lt->size(),
                  c.layers);
    for (size_t l = 0; l < lt->size(); ++l) {
      const json& e = (*lt)[l];
      TPDRAFT_CHECK(e.is_string(), "{}: key 'layer_types[{}]' must be a string", where, l);
      const std::string kind = e.get<std::string>();
      TPDRAFT_CHECK(kind == "full_attention" || kind == "sliding_attention",
                    "{}: key 'layer_types[{}]' is '{}', expected 'full_attention' or 'sliding_attention'", where, l,
                    kind);
      c.sliding[l] = kind == "sliding_attention";
    }
  }
  if (find_key(j, "sliding_window")) c.window = require_size(j, "sliding_window", where);
  read_bool(j, "attention_bias", where, &c.bias);
}

// A string-valued key that, when present and not null, must be one of `allowed` (the first is
// what tpdraft runs); `why` says what the others would need.
void require_string_value(const json& j, const char* key, const std::string& source, const char* allowed,
                          const char* why) {
  const json* v = find_key(j, key);
  if (v == nullptr) return;
  TPDRAFT_CHECK(v->is_string(), "{}: key '{}' must be a string", source, key);
  TPDRAFT_CHECK(v->get<std::string>() == allowed, "{}: key '{}' is '{}'; tpdraft runs '{}' only ({})", source, key,
                v->get<std::string>(), allowed, why);
}

// The speculators DFlash layout (docs/checkpoint.md): geometry in transformer_layer_config, the
// target layers as aux ids (one more than tpdraft's taps), the draft vocabulary's size, and the
// format's causality rule; refuses what the format allows and tpdraft does not run.
DrafterConfig speculators_from_json(const json& j, const std::string& source) {
  DrafterConfig c;
  c.layout = Layout::Speculators;
  const json* type = find_key(j, "speculators_model_type");
  TPDRAFT_CHECK(type->is_string() && type->get<std::string>() == "dflash",
                "{}: key 'speculators_model_type' is '{}'; tpdraft reads the speculators 'dflash' layout only", source,
                type->is_string() ? type->get<std::string>() : type->dump());
  c.arch_name = "DFlashSpeculator";
  if (const json* archs = find_key(j, "architectures")) {
    TPDRAFT_CHECK(archs->is_array() && !archs->empty() && (*archs)[0].is_string(),
                  "{}: key 'architectures' must be a non-empty list of strings", source);
    c.arch_name = (*archs)[0].get<std::string>();
  }
  const json* layer = find_key(j, "transformer_layer_config");
  TPDRAFT_CHECK(layer != nullptr && layer->is_object(),
                "{}: missing required key 'transformer_layer_config' (an object with the layers' geometry)", source);
  const std::string where = source + " (transformer_layer_config)";
  read_geometry(*layer, where, c);
  require_string_value(*layer, "hidden_act", where, "silu", "the drafter's MLP is SwiGLU");

  // What the format allows and tpdraft does not run.
  require_string_value(j, "projector_type", source, "dflash", "'domino' adds a correction head");
  for (const char* key : {"sample_from_anchor", "shift_label"}) {
    bool on = false;
    read_bool(j, key, source, &on);
    TPDRAFT_CHECK(!on, "{}: key '{}' is true; tpdraft drafts from the anchor as DFlash does (the anchor row is not "
                  "sampled, drafts are not shifted)", source, key);
  }
  if (const json* v = find_key(j, "target_hidden_size")) {
    const int64_t th = as_int(v, source, "target_hidden_size");
    TPDRAFT_CHECK(th == c.hidden, "{}: key 'target_hidden_size' = {} differs from the drafter's hidden_size {}; "
                  "tpdraft needs taps of the drafter's width", source, th, c.hidden);
  }

  // Block: block_size, else the greedy proposal's speculative_tokens + 1.
  if (find_key(j, "block_size")) {
    c.block = require_size(j, "block_size", source);
  } else {
    const json* sc = find_key(j, "speculators_config");
    const json* methods = sc != nullptr && sc->is_object() ? find_key(*sc, "proposal_methods") : nullptr;
    const json* tokens = methods != nullptr && methods->is_array() && !methods->empty() && (*methods)[0].is_object()
                             ? find_key((*methods)[0], "speculative_tokens")
                             : nullptr;
    TPDRAFT_CHECK(tokens != nullptr, "{}: missing required key 'block_size' (or "
                  "speculators_config.proposal_methods[0].speculative_tokens)", source);
    c.block = check_limit(checked_add(as_int(tokens, source, "speculative_tokens"), int64_t{1}, "block size"),
                          "block_size", source);
  }

  const json* aux = find_key(j, "aux_hidden_state_layer_ids");
  TPDRAFT_CHECK(aux != nullptr, "{}: missing required key 'aux_hidden_state_layer_ids'", source);
  TPDRAFT_CHECK(aux->is_array(), "{}: key 'aux_hidden_state_layer_ids' must be a list of integers", source);
  TPDRAFT_CHECK(static_cast<int64_t>(aux->size()) <= kMaxTaps,
                "{}: key 'aux_hidden_state_layer_ids' lists {} layers, above the limit of {}", source, aux->size(),
                kMaxTaps);
  for (const auto& e : *aux) {
    // Aux id k is the residual stream after k target layers: tap k - 1 (docs/checkpoint.md).
    const int64_t k = as_int(&e, source, "aux_hidden_state_layer_ids");
    TPDRAFT_CHECK(k >= 1, "{}: key 'aux_hidden_state_layer_ids' holds {}; aux id 0 is the target's embedding "
                  "output, and tpdraft taps decoder layers (aux ids >= 1)", source, k);
    c.taps.push_back(check_limit(k - 1, "target_layer_ids", source));
  }

  const json* mask = find_key(j, "mask_token_id");
  TPDRAFT_CHECK(mask != nullptr, "{}: missing required key 'mask_token_id'", source);
  c.mask_token = as_int(mask, source, "mask_token_id");

  bool non_causal = false;
  read_bool(j, "sliding_window_non_causal", source, &non_causal);
  c.causal = non_causal ? std::vector<bool>(c.sliding.size(), false) : c.sliding;

  if (find_key(j, "draft_vocab_size")) {
    const int64_t n = require_size(j, "draft_vocab_size", source);
    TPDRAFT_CHECK(n > 0 && n <= c.vocab, "{}: key 'draft_vocab_size' = {} must lie in [1, vocab_size = {}]", source, n,
                  c.vocab);
    c.draft_vocab = n < c.vocab ? n : 0;
  }
  if (const json* v = find_key(j, "quantization_config")) c.quant = QuantConfig::from_json(*v, source);
  c.validate(source);
  return c;
}

}  // namespace

DrafterConfig DrafterConfig::from_json(const json& j, const std::string& source) {
  TPDRAFT_CHECK(j.is_object(), "{}: expected a JSON object at the top level", source);
  if (find_key(j, "speculators_model_type")) return speculators_from_json(j, source);
  DrafterConfig c;

  const json* archs = find_key(j, "architectures");
  TPDRAFT_CHECK(archs && archs->is_array() && !archs->empty() && (*archs)[0].is_string(),
                "{}: key 'architectures' must be a non-empty list of strings", source);
  c.arch_name = (*archs)[0].get<std::string>();
  TPDRAFT_CHECK(c.arch_name == "DFlashDraftModel" || c.arch_name == "DFlash2DraftModel",
                "{}: key 'architectures' names '{}', expected 'DFlashDraftModel' or 'DFlash2DraftModel' (or a "
                "speculators config with speculators_model_type 'dflash')", source, c.arch_name);
  c.arch = c.arch_name == "DFlash2DraftModel" ? Arch::DFlash2 : Arch::DFlash;
  read_geometry(j, source, c);

  if (find_nested(j, "block_size")) c.block = require_size(j, "block_size", source, true);

  if (const json* v = find_nested(j, "target_layer_ids")) {
    TPDRAFT_CHECK(v->is_array(), "{}: key 'target_layer_ids' must be a list of integers", source);
    TPDRAFT_CHECK(static_cast<int64_t>(v->size()) <= kMaxTaps,
                  "{}: key 'target_layer_ids' lists {} layers, above the limit of {}", source, v->size(), kMaxTaps);
    for (const auto& e : *v)
      c.taps.push_back(check_limit(as_int(&e, source, "target_layer_ids"), "target_layer_ids", source));
  }
  if (find_key(j, "num_target_layers")) c.num_target_layers = require_size(j, "num_target_layers", source);
  if (c.taps.empty() && c.num_target_layers > 0) {
    const int64_t t = c.layers, lt = c.num_target_layers;
    if (t == 1) {
      c.taps.push_back(lt / 2);
    } else {
      for (int64_t i = 0; i < t; ++i) {
        const double x = 1.0 + static_cast<double>(i) * static_cast<double>(lt - 4) / static_cast<double>(t - 1);
        c.taps.push_back(static_cast<int64_t>(std::nearbyint(x)));
      }
    }
  }

  const json* mask = find_nested(j, "mask_token_id");
  TPDRAFT_CHECK(mask != nullptr, "{}: missing required key 'mask_token_id' (top level or dflash_config)", source);
  c.mask_token = as_int(mask, source, "mask_token_id");

  c.causal = c.sliding;
  if (const json* v = find_key(j, "is_causal")) {
    TPDRAFT_CHECK(v->is_boolean(), "{}: key 'is_causal' must be true or false", source);
    c.causal.assign(c.sliding.size(), v->get<bool>());
  }

  if (const json* v = find_nested(j, "input_embedding_scale")) c.in_scale = as_double(v, source, "input_embedding_scale");
  if (const json* v = find_nested(j, "output_multiplier")) c.out_scale = as_double(v, source, "output_multiplier");
  if (const json* v = find_nested(j, "final_logit_softcapping")) c.softcap = as_double(v, source, "final_logit_softcapping");

  if (c.arch == Arch::DFlash2)
    for (const auto& [key, field] : kDFlash2Keys) c.*field = require_size(j, key, source, true);

  if (const json* v = find_key(j, "quantization_config")) c.quant = QuantConfig::from_json(*v, source);

  c.validate(source);
  return c;
}

void DrafterConfig::validate(const std::string& source) const {
  auto positive = [&](int64_t v, const char* key) {
    TPDRAFT_CHECK(v > 0, "{}: key '{}' must be positive, got {}", source, key, v);
    check_limit(v, key, source);
  };
  for (const auto& [v, key] : {std::pair{hidden, "hidden_size"}, {layers, "num_hidden_layers"},
                               {n_q, "num_attention_heads"}, {n_kv, "num_key_value_heads"}, {head_dim, "head_dim"},
                               {ffn, "intermediate_size"}, {vocab, "vocab_size"}})
    positive(v, key);
  TPDRAFT_CHECK(block >= 2, "{}: key 'block_size' must be at least 2 (1 anchor + drafts), got {}", source, block);
  check_limit(block, "block_size", source);
  check_limit(window, "sliding_window", source);
  check_limit(num_target_layers, "num_target_layers", source);
  TPDRAFT_CHECK(n_taps() <= kMaxTaps, "{}: key 'target_layer_ids' lists {} layers, above the limit of {}", source,
                n_taps(), kMaxTaps);
  TPDRAFT_CHECK(n_q % n_kv == 0, "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                source, n_q, n_kv);
  TPDRAFT_CHECK(head_dim % 2 == 0, "{}: key 'head_dim' must be even for RoPE, got {}", source, head_dim);
  TPDRAFT_CHECK(!taps.empty(),
                "{}: no target layers: give 'target_layer_ids' (top level or dflash_config) or 'num_target_layers'",
                source);
  for (int64_t t : taps) {
    TPDRAFT_CHECK(t >= 0, "{}: key 'target_layer_ids' holds a negative layer id {}", source, t);
    check_limit(t, "target_layer_ids", source);
  }
  TPDRAFT_CHECK(mask_token >= 0 && mask_token < vocab, "{}: key 'mask_token_id' = {} must lie in [0, vocab_size = {})",
                source, mask_token, vocab);
  TPDRAFT_CHECK(eps > 0, "{}: key 'rms_norm_eps' must be positive", source);
  TPDRAFT_CHECK(rope_theta > 0, "{}: key 'rope_theta' must be positive", source);
  TPDRAFT_CHECK(softcap >= 0, "{}: key 'final_logit_softcapping' must be >= 0, got {}", source, softcap);
  TPDRAFT_CHECK(out_scale > 0, "{}: key 'output_multiplier' must be positive, got {}", source, out_scale);
  TPDRAFT_CHECK(static_cast<int64_t>(sliding.size()) == layers && static_cast<int64_t>(causal.size()) == layers,
                "{}: per-layer attention kinds must cover all {} layers", source, layers);
  const bool any_sliding = std::find(sliding.begin(), sliding.end(), true) != sliding.end();
  TPDRAFT_CHECK(!any_sliding || window > 0,
                "{}: key 'sliding_window' must be positive when a layer is 'sliding_attention'", source);
  TPDRAFT_CHECK(draft_vocab >= 0 && draft_vocab <= vocab,
                "{}: the draft vocabulary ({} tokens) must lie in [1, vocab_size = {}] (0: none)", source, draft_vocab,
                vocab);
  if (arch == Arch::DFlash2) {
    for (const auto& [key, field] : kDFlash2Keys) positive(this->*field, key);
    TPDRAFT_CHECK(hidden % conv_group == 0, "{}: hidden_size ({}) must be a multiple of conv_group_size ({})", source,
                  hidden, conv_group);
    TPDRAFT_CHECK(selector_topk <= head_vocab(), "{}: selector_top_k ({}) exceeds the {} ({})", source, selector_topk,
                  draft_vocab > 0 ? "draft vocabulary" : "vocab_size", head_vocab());
  }
  if (layout == Layout::Speculators) {
    // What a speculators config can say (docs/checkpoint.md): DFlash layers, full layers
    // bidirectional, sliding layers all causal or all not, no scales or cap on the logits.
    TPDRAFT_CHECK(arch == Arch::DFlash, "{}: the speculators layout holds DFlash drafters, not DFlash 2", source);
    TPDRAFT_CHECK(in_scale == 1.0 && out_scale == 1.0 && softcap == 0.0,
                  "{}: the speculators layout has no embedding scale, output multiplier or soft cap", source);
    const auto first_sliding = std::find(sliding.begin(), sliding.end(), true) - sliding.begin();
    for (size_t l = 0; l < sliding.size(); ++l) {
      TPDRAFT_CHECK(sliding[l] || !causal[l], "{}: layer {}: a full-attention layer of the speculators layout is "
                    "bidirectional", source, l);
      TPDRAFT_CHECK(!sliding[l] || causal[l] == causal[static_cast<size_t>(first_sliding)],
                    "{}: layer {}: the speculators layout gives every sliding layer the same causality", source, l);
    }
  }
}

DrafterConfig DrafterConfig::from_file(const std::string& path) {
  return from_json(read_json(path, "drafter config.json"), path);
}

json DrafterConfig::to_json() const {
  // The geometry read_geometry() reads, in both layouts (json objects keep their keys sorted).
  json geometry = {{"hidden_size", hidden}, {"num_hidden_layers", layers}, {"num_attention_heads", n_q},
                   {"num_key_value_heads", n_kv}, {"head_dim", head_dim}, {"intermediate_size", ffn},
                   {"vocab_size", vocab}, {"rms_norm_eps", eps}, {"rope_theta", rope_theta}, {"attention_bias", bias},
                   {"layer_types", json::array()}};
  for (bool s : sliding) geometry["layer_types"].push_back(s ? "sliding_attention" : "full_attention");
  if (window > 0) geometry["sliding_window"] = window;
  if (layout == Layout::Speculators) {
    validate("speculators config");
    json layer = geometry;
    layer["model_type"] = "qwen3";
    layer["hidden_act"] = "silu";
    std::vector<int64_t> aux;
    for (int64_t t : taps) aux.push_back(t + 1);
    // validate() leaves the sliding layers all causal or all not, and the full ones not.
    const bool non_causal = causal != sliding;
    json j = {{"architectures", json::array({arch_name.empty() ? "DFlashSpeculator" : arch_name})},
              {"speculators_model_type", "dflash"}, {"transformer_layer_config", layer},
              {"draft_vocab_size", head_vocab()}, {"block_size", block}, {"aux_hidden_state_layer_ids", aux},
              {"mask_token_id", mask_token}, {"sliding_window_non_causal", non_causal},
              {"projector_type", "dflash"}, {"sample_from_anchor", false},
              {"speculators_config",
               {{"algorithm", "dflash"},
                {"proposal_methods", json::array({{{"proposal_type", "greedy"}, {"speculative_tokens", block - 1}}})},
                {"default_proposal_method", "greedy"}}}};
    if (quant.source == QuantConfig::Source::Checkpoint) j["quantization_config"] = quant.to_json();
    return j;
  }
  const std::string name = arch_name.empty() ? (arch == Arch::DFlash2 ? "DFlash2DraftModel" : "DFlashDraftModel")
                                              : arch_name;
  json j = geometry;
  j["architectures"] = json::array({name});
  // Written explicitly only when it differs from the per-layer default (causal == sliding).
  const bool all_same =
      std::adjacent_find(causal.begin(), causal.end(), std::not_equal_to<>()) == causal.end();
  if (causal != sliding && all_same) j["is_causal"] = causal.front();
  json dc = {{"block_size", block}, {"target_layer_ids", taps}, {"mask_token_id", mask_token}};
  if (in_scale != 1.0) dc["input_embedding_scale"] = in_scale;
  if (out_scale != 1.0) dc["output_multiplier"] = out_scale;
  if (softcap > 0) dc["final_logit_softcapping"] = softcap;
  if (arch == Arch::DFlash2)
    for (const auto& [key, field] : kDFlash2Keys) dc[key] = this->*field;
  j["dflash_config"] = dc;
  if (num_target_layers > 0) j["num_target_layers"] = num_target_layers;
  if (quant.source == QuantConfig::Source::Checkpoint) j["quantization_config"] = quant.to_json();
  return j;
}

TargetConfig TargetConfig::from_dir(const std::string& dir) {
  TargetConfig t;
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return t;
  const json j = read_json(path, "target config.json");
  // Multimodal targets nest the language model's config.
  const json& tc = (j.contains("text_config") && j["text_config"].is_object()) ? j["text_config"] : j;
  for (const json* src : {&j, &tc}) {
    t.tie_stated = t.tie_stated || find_key(*src, "tie_word_embeddings");
    read_bool(*src, "tie_word_embeddings", path, &t.tie_word_embeddings);
  }
  if (const json* v = find_key(tc, "vocab_size")) t.vocab = as_int(v, path, "vocab_size");
  if (const json* v = find_key(tc, "hidden_size")) t.hidden = as_int(v, path, "hidden_size");
  return t;
}

}  // namespace tpdraft::model
