// quantization_config (compressed-tensors) parsing and matching, and quantization plans.
#include "checkpoint/quant_config.h"

#include <algorithm>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/strings.h"

namespace tpdraft::model {

using json = nlohmann::json;

const json* find_key(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

namespace {

const char* kLayerSuffixes[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                                "mlp.down_proj.weight"};

// compressed-tensors' names of the weight strategies, in QuantScheme::Strategy order.
constexpr const char* kStrategyNames[] = {"tensor", "channel", "group"};

bool is_attn(const std::string& t) {
  return ends_with(t, "_proj.weight") && t.find("self_attn.") != std::string::npos;
}
bool is_mlp(const std::string& t) { return ends_with(t, "_proj.weight") && t.find("mlp.") != std::string::npos; }

// compressed-tensors matches a target by class name ("Linear": every quantizable module here),
// by module name, or by a regex ("re:...") matched from the start of the module name.
bool matches(const std::string& target, const std::string& module) {
  if (target == "Linear") return true;
  if (starts_with(target, "re:")) return std::regex_search(module, std::regex("^(?:" + target.substr(3) + ")"));
  return target == module;
}

bool matches_module(const std::string& target, const std::string& module) {
  return matches(target, module) || matches(target, "model." + module);
}

std::vector<std::string> string_list(const json& j, const std::string& source, const std::string& what) {
  TPDRAFT_CHECK(j.is_array(), "{}: quantization_config {} must be a list of strings", source, what);
  std::vector<std::string> out;
  for (const auto& e : j) {
    TPDRAFT_CHECK(e.is_string(), "{}: quantization_config {} must be a list of strings, found {}", source, what,
                  e.dump());
    const std::string s = e.get<std::string>();
    if (starts_with(s, "re:")) {
      try {
        std::regex r(s.substr(3));
      } catch (const std::regex_error& err) {
        TPDRAFT_FAIL("{}: quantization_config {}: '{}' is not a valid regular expression ({})", source, what, s,
                     err.what());
      }
    }
    out.push_back(s);
  }
  return out;
}

QuantScheme parse_weights(const json& w, const std::string& format, const std::string& source,
                          const std::string& where) {
  TPDRAFT_CHECK(w.is_object(), "{}: {}.weights must be an object", source, where);
  QuantScheme s;
  const json* bits = find_key(w, "num_bits");
  TPDRAFT_CHECK(bits && bits->is_number_integer(), "{}: {}.weights.num_bits must be an integer", source, where);
  s.bits = bits->get<int>();
  const json* type = find_key(w, "type");
  const std::string t = type && type->is_string() ? type->get<std::string>() : "int";
  if (const json* sym = find_key(w, "symmetric")) {
    TPDRAFT_CHECK(sym->is_boolean(), "{}: {}.weights.symmetric must be true or false", source, where);
    TPDRAFT_CHECK(sym->get<bool>(), "{}: {}: asymmetric weights (symmetric: false, with zero points) are not "
                  "supported; quantize symmetrically", source, where);
  }
  if (const json* ao = find_key(w, "actorder")) {
    const bool off = (ao->is_boolean() && !ao->get<bool>()) || (ao->is_string() && ao->get<std::string>() == "static");
    TPDRAFT_CHECK(off, "{}: {}: activation ordering (actorder {}) is not supported: its weight_g_idx reorders the "
                  "groups; quantize without act-order", source, where, ao->dump());
  }
  if (const json* dyn = find_key(w, "dynamic"))
    TPDRAFT_CHECK(dyn->is_boolean() && !dyn->get<bool>(), "{}: {}.weights.dynamic must be false", source, where);
  const json* strategy = find_key(w, "strategy");
  const std::string st = strategy && strategy->is_string() ? strategy->get<std::string>() : "tensor";
  const auto known = std::find(std::begin(kStrategyNames), std::end(kStrategyNames), st);
  TPDRAFT_CHECK(known != std::end(kStrategyNames), "{}: {}: weight strategy '{}' is not supported (tensor, channel or "
                "group)", source, where, st);
  s.strategy = static_cast<QuantScheme::Strategy>(known - std::begin(kStrategyNames));
  if (s.strategy == QuantScheme::Strategy::Group) {
    const json* g = find_key(w, "group_size");
    TPDRAFT_CHECK(g && g->is_number_integer() && g->get<int64_t>() > 0,
                  "{}: {}: strategy 'group' needs a positive integer group_size", source, where);
    s.group = g->get<int64_t>();
  }
  if (t == "int") {
    TPDRAFT_CHECK(format == "pack-quantized", "{}: {}: int weights in format '{}' are not supported (only "
                  "pack-quantized)", source, where, format);
    TPDRAFT_CHECK(s.bits == 4 || s.bits == 8, "{}: {}: int weights of {} bits are not supported (4 or 8)", source,
                  where, s.bits);
    s.kind = QuantScheme::Kind::Int;
  } else if (t == "float") {
    TPDRAFT_CHECK(format == "float-quantized", "{}: {}: float weights in format '{}' are not supported (only "
                  "float-quantized)", source, where, format);
    TPDRAFT_CHECK(s.bits == 8, "{}: {}: float weights of {} bits are not supported (8: FP8 e4m3)", source, where,
                  s.bits);
    TPDRAFT_CHECK(s.strategy != QuantScheme::Strategy::Group, "{}: {}: FP8 weights with group scales are not "
                  "supported (per tensor or per channel)", source, where);
    s.kind = QuantScheme::Kind::Fp8;
  } else {
    TPDRAFT_FAIL("{}: {}.weights.type '{}' is not supported ('int' or 'float')", source, where, t);
  }
  return s;
}

}  // namespace

std::string QuantScheme::describe() const {
  if (kind == Kind::None) return "float";
  const std::string base = kind == Kind::Fp8 ? "fp8" : fmt::format("int{}", bits);
  if (strategy == Strategy::Group) return fmt::format("{} g{}", base, group);
  return base + " per-" + kStrategyNames[static_cast<size_t>(strategy)];
}

bool quantizable_tensor(const std::string& t) {
  if (t == "fc.weight" || ends_with(t, "kernel_projection.weight") || ends_with(t, "hidden_projection.weight"))
    return true;
  for (const char* s : kLayerSuffixes)
    if (ends_with(t, s)) return true;
  return false;
}

QuantScheme QuantConfig::scheme_for(const std::string& tensor) const {
  if (!any() || !quantizable_tensor(tensor)) return {};
  const std::string module = tensor.substr(0, tensor.size() - std::string(".weight").size());
  for (const auto& ig : ignore)
    if (matches_module(ig, module)) return {};
  for (const auto& g : groups)
    for (const auto& t : g.targets)
      if (matches_module(t, module)) return g.weights;
  return {};
}

QuantConfig QuantConfig::from_json(const json& qc, const std::string& source) {
  TPDRAFT_CHECK(qc.is_object(), "{}: quantization_config must be an object", source);
  QuantConfig c;
  c.source = Source::Checkpoint;
  c.file = source;
  const json* method = find_key(qc, "quant_method");
  const std::string m = method && method->is_string() ? method->get<std::string>() : "";
  TPDRAFT_CHECK(m == "compressed-tensors", "{}: quantization_config.quant_method '{}' is not supported (only "
                "compressed-tensors, formats pack-quantized and float-quantized)", source, m);
  const json* format = find_key(qc, "format");
  TPDRAFT_CHECK(format && format->is_string(), "{}: quantization_config has no 'format'", source);
  c.format = format->get<std::string>();
  TPDRAFT_CHECK(c.format == "pack-quantized" || c.format == "float-quantized",
                "{}: quantization_config.format '{}' is not supported (pack-quantized or float-quantized)", source,
                c.format);
  const json* groups = find_key(qc, "config_groups");
  TPDRAFT_CHECK(groups && groups->is_object() && !groups->empty(),
                "{}: quantization_config.config_groups must be a non-empty object", source);
  for (const auto& [name, g] : groups->items()) {
    const std::string where = "quantization_config.config_groups." + name;
    TPDRAFT_CHECK(g.is_object(), "{}: {} must be an object", source, where);
    if (const json* f = find_key(g, "format"))
      TPDRAFT_CHECK(f->is_string() && f->get<std::string>() == c.format,
                    "{}: {}.format {} differs from quantization_config.format '{}' (mixed formats are not supported)",
                    source, where, f->dump(), c.format);
    const json* targets = find_key(g, "targets");
    TPDRAFT_CHECK(targets != nullptr, "{}: {} has no targets", source, where);
    Group out;
    out.name = name;
    out.targets = string_list(*targets, source, where + ".targets");
    if (const json* w = find_key(g, "weights")) out.weights = parse_weights(*w, c.format, source, where);
    c.groups.push_back(std::move(out));
  }
  if (const json* ig = find_key(qc, "ignore")) c.ignore = string_list(*ig, source, "ignore");
  return c;
}

json QuantConfig::to_json() const {
  json groups_json = json::object();
  for (const auto& g : groups) {
    const QuantScheme& s = g.weights;
    json w = {{"num_bits", s.bits},
              {"type", s.kind == QuantScheme::Kind::Fp8 ? "float" : "int"},
              {"symmetric", true},
              {"dynamic", false},
              {"actorder", nullptr},
              {"observer", "minmax"}};
    w["strategy"] = kStrategyNames[static_cast<size_t>(s.strategy)];
    w["group_size"] = s.strategy == QuantScheme::Strategy::Group ? json(s.group) : json(nullptr);
    groups_json[g.name] = {{"targets", g.targets},
                           {"weights", w},
                           {"input_activations", nullptr},
                           {"output_activations", nullptr}};
  }
  return {{"quant_method", "compressed-tensors"},
          {"format", format.empty() ? "pack-quantized" : format},
          {"quantization_status", "compressed"},
          {"config_groups", groups_json},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr}};
}

const std::vector<std::string>& quant_presets() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const char* head : {"", "+head"})
      for (const char* act : {"", "a8", "a16"})
        for (const char* bits : {"q8", "q4"}) n.push_back(std::string(bits) + act + head);
    return n;
  }();
  return names;
}

std::string quant_preset_list() { return "q8, q4, q8a8, q4a8, q8a16 or q4a16, each with or without +head"; }

QuantRequest QuantRequest::preset(const std::string& name) {
  const auto& names = quant_presets();
  TPDRAFT_CHECK(std::find(names.begin(), names.end(), name) != names.end(), "unknown quantization '{}': expected {}",
                name, quant_preset_list());
  QuantRequest r;  // the defaults: groups of 128 on every layer matrix, fc at aux_bits
  r.bits = name[1] == '8' ? 8 : 4;
  r.aux_bits = 8;
  r.head_bits = ends_with(name, "+head") ? 8 : 0;
  r.activation_bits = name.compare(2, 3, "a16") == 0 ? 16 : name.compare(2, 2, "a8") == 0 ? 8 : 0;
  return r;
}

QuantScheme QuantRequest::scheme(int scheme_bits, int64_t cols) const {
  QuantScheme s;
  s.kind = QuantScheme::Kind::Int;
  s.bits = scheme_bits;
  if (group > 0 && cols % group == 0) {
    s.strategy = QuantScheme::Strategy::Group;
    s.group = group;
  }
  return s;
}

QuantConfig plan_quantization(const QuantRequest& r,
                              const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
                              QuantConfig::Source source) {
  TPDRAFT_CHECK(r.bits == 4 || r.bits == 8, "quantization: --bits must be 4 or 8, got {}", r.bits);
  TPDRAFT_CHECK(r.aux_bits == 0 || r.aux_bits == 4 || r.aux_bits == 8, "quantization: bits {} (4 or 8)", r.aux_bits);
  TPDRAFT_CHECK(r.group >= 0, "quantization: --group must be positive (0: per channel), got {}", r.group);
  TPDRAFT_CHECK(r.only == "all" || r.only == "mlp" || r.only == "attn",
                "quantization: --only must be all, mlp or attn, got '{}'", r.only);
  QuantConfig c;
  c.source = source;
  c.format = "pack-quantized";
  c.file = "the quantization plan";
  for (const auto& [name, shape] : tensors) {
    if (!quantizable_tensor(name) || shape.size() != 2) continue;
    // Layer matrices as `only` picks them, fc.weight with include_fc, every other matrix at aux_bits.
    int bits = r.aux_bits;
    if (is_attn(name) || is_mlp(name))
      bits = r.only == "all" || (r.only == "mlp" && is_mlp(name)) || (r.only == "attn" && is_attn(name)) ? r.bits : 0;
    else if (name == "fc.weight" && r.include_fc)
      bits = r.bits;
    if (bits == 0) continue;
    const QuantScheme s = r.scheme(bits, shape[1]);
    const std::string module = name.substr(0, name.size() - std::string(".weight").size());
    auto g = std::find_if(c.groups.begin(), c.groups.end(), [&](const auto& e) { return e.weights == s; });
    if (g == c.groups.end()) g = c.groups.insert(g, {fmt::format("group_{}", c.groups.size()), {}, s});
    g->targets.push_back(module);
  }
  if (c.groups.empty()) c.source = QuantConfig::Source::None;
  return c;
}

}  // namespace tpdraft::model
