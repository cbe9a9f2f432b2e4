// Drafter config parsing (docs/checkpoint.md): the tiny configs shipped in configs/, each key
// fallback, the to_json() round trip, and one test per error a user can meet, checking that the
// message names the file and the key at fault.
#include <chrono>
#include <filesystem>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/config.h"
#include "core/error.h"
#include "support/test_support.h"

namespace tpdraft::model {
namespace {

using nlohmann::json;
using testing::expect_error;

const char* kSource = "drafter/config.json";

// A minimal valid DFlash config; tests change one thing at a time.
json base() {
  return json{{"architectures", {"DFlashDraftModel"}},
              {"hidden_size", 64},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"intermediate_size", 96},
              {"vocab_size", 300},
              {"dflash_config", {{"block_size", 8}, {"target_layer_ids", {1, 3}}, {"mask_token_id", 299}}}};
}

// `j` with the value at JSON pointer `at` (e.g. "/dflash_config/block_size") set to `value`.
json with(const std::string& at, json value, json j = base()) {
  j[json::json_pointer(at)] = std::move(value);
  return j;
}

json base2() {
  json j = with("/architectures", {"DFlash2DraftModel"});
  j["dflash_config"].update(
      {{"conv_kernel_size", 2}, {"conv_group_size", 16}, {"selector_rank", 8}, {"selector_top_k", 4}});
  return j;
}

DrafterConfig parse(const json& j) { return DrafterConfig::from_json(j, kSource); }

void expect_config_error(const json& j, std::vector<std::string> parts) {
  parts.push_back(kSource);
  expect_error([&] { parse(j); }, parts);
}

// Every parsed field of `c`, to compare two configs whole.
auto fields(const DrafterConfig& c) {
  return std::tie(c.arch, c.arch_name, c.hidden, c.layers, c.n_q, c.n_kv, c.head_dim, c.ffn, c.vocab, c.block,
                  c.mask_token, c.eps, c.rope_theta, c.taps, c.num_target_layers, c.sliding, c.causal, c.window,
                  c.in_scale, c.out_scale, c.softcap, c.bias, c.conv_kernel, c.conv_group, c.selector_rank,
                  c.selector_topk);
}

// The sizes H, L, Nq, Nk, D, F, V and B of `c`.
std::vector<int64_t> sizes(const DrafterConfig& c) {
  return {c.hidden, c.layers, c.n_q, c.n_kv, c.head_dim, c.ffn, c.vocab, c.block};
}

// eps, rope_theta, the input and output multipliers and the soft cap of `c`.
std::vector<double> reals(const DrafterConfig& c) { return {c.eps, c.rope_theta, c.in_scale, c.out_scale, c.softcap}; }

// The DFlash 2 sizes K, gs, R and k_top of `c`.
std::vector<int64_t> dflash2_sizes(const DrafterConfig& c) {
  return {c.conv_kernel, c.conv_group, c.selector_rank, c.selector_topk};
}

// ---- the shipped tiny configs ----------------------------------------------------------------

TEST(Config, TinyDFlash) {
  const auto c = DrafterConfig::from_file(testing::source_path("configs/tiny-dflash.json"));
  EXPECT_EQ(c.arch, Arch::DFlash);
  EXPECT_FALSE(c.is_dflash2());
  EXPECT_EQ(c.arch_name, "DFlashDraftModel");
  EXPECT_EQ(sizes(c), (std::vector<int64_t>{64, 2, 4, 2, 16, 96, 300, 8}));
  EXPECT_EQ(reals(c), (std::vector<double>{1e-6, 10000.0, 1.0, 1.0, 0.0}));
  EXPECT_FALSE(c.bias);
  EXPECT_EQ(c.taps, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(c.n_taps(), 2);
  EXPECT_EQ(c.mask_token, 299);
  EXPECT_EQ(c.sliding, (std::vector<bool>{false, false}));
  EXPECT_EQ(c.causal, (std::vector<bool>{false, false}));
  EXPECT_EQ(c.window, 0);
  EXPECT_EQ(c.num_target_layers, 0);
  EXPECT_EQ(c.conv_kernel, 0);
  EXPECT_EQ(c.conv_groups(), 0);
}

TEST(Config, TinyDFlash2) {
  const auto c = DrafterConfig::from_file(testing::source_path("configs/tiny-dflash2.json"));
  EXPECT_EQ(c.arch, Arch::DFlash2);
  EXPECT_TRUE(c.is_dflash2());
  EXPECT_EQ(sizes(c), (std::vector<int64_t>{64, 2, 4, 1, 16, 80, 257, 8}));
  EXPECT_EQ(reals(c), (std::vector<double>{1e-5, 500000.0, 1.0, 0.5, 20.0}));
  EXPECT_TRUE(c.bias);
  EXPECT_EQ(c.sliding, (std::vector<bool>{true, false}));
  EXPECT_EQ(c.causal, (std::vector<bool>{true, false}));  // causal exactly where sliding
  EXPECT_EQ(c.window, 6);
  EXPECT_EQ(c.taps, (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(c.mask_token, 250);
  EXPECT_EQ(dflash2_sizes(c), (std::vector<int64_t>{2, 16, 8, 4}));
  EXPECT_EQ(c.conv_groups(), 4);
}

// ---- fallbacks of docs/checkpoint.md ---------------------------------------------------------

TEST(ConfigFallbacks, BlockSize) {
  json j = with("/block_size", 4);
  EXPECT_EQ(parse(j).block, 8);  // dflash_config wins
  j["dflash_config"].erase("block_size");
  EXPECT_EQ(parse(j).block, 4);  // then the top level
  j.erase("block_size");
  EXPECT_EQ(parse(j).block, 16);  // then the default
}

TEST(ConfigFallbacks, TargetLayerIds) {
  json j = with("/target_layer_ids", {5, 6, 7});
  EXPECT_EQ(parse(j).taps, (std::vector<int64_t>{1, 3}));
  j["dflash_config"].erase("target_layer_ids");
  EXPECT_EQ(parse(j).taps, (std::vector<int64_t>{5, 6, 7}));
  j["num_target_layers"] = 36;  // explicit ids still win over the formula
  EXPECT_EQ(parse(j).taps, (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(parse(j).num_target_layers, 36);
}

TEST(ConfigFallbacks, MaskTokenId) {
  json j = with("/mask_token_id", 7);
  EXPECT_EQ(parse(j).mask_token, 299);
  j["dflash_config"].erase("mask_token_id");
  EXPECT_EQ(parse(j).mask_token, 7);
}

TEST(ConfigFallbacks, Multipliers) {
  const struct {
    const char* key;
    double DrafterConfig::*field;
    double dflt;
  } multipliers[] = {{"input_embedding_scale", &DrafterConfig::in_scale, 1.0},
                     {"output_multiplier", &DrafterConfig::out_scale, 1.0},
                     {"final_logit_softcapping", &DrafterConfig::softcap, 0.0}};
  for (const auto& m : multipliers) {
    SCOPED_TRACE(m.key);
    json j = base();
    EXPECT_EQ(parse(j).*m.field, m.dflt);
    j[m.key] = 3.5;
    EXPECT_EQ(parse(j).*m.field, 3.5);  // top level
    j["dflash_config"][m.key] = 0.25;
    EXPECT_EQ(parse(j).*m.field, 0.25);  // dflash_config wins
  }
}

TEST(ConfigFallbacks, RopeTheta) {
  json j = base();
  EXPECT_EQ(parse(j).rope_theta, 10000.0);  // default
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  EXPECT_EQ(parse(j).rope_theta, 1e6);
  j["rope_theta"] = 5e5;
  EXPECT_EQ(parse(j).rope_theta, 5e5);  // the top-level key wins
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(parse(j).rope_theta, 5e5);  // "default" scaling is accepted
}

TEST(ConfigFallbacks, HeadDimAndKvHeads) {
  json j = base();
  EXPECT_EQ(parse(j).head_dim, 16);  // H / Nq = 64 / 4
  j["head_dim"] = 32;
  EXPECT_EQ(parse(j).head_dim, 32);
  j.erase("num_key_value_heads");
  EXPECT_EQ(parse(j).n_kv, 4);  // defaults to Nq
}

TEST(ConfigFallbacks, NumTargetLayersFormula) {
  json j = base();
  j["dflash_config"].erase("target_layer_ids");
  j["num_target_layers"] = 36;
  EXPECT_EQ(parse(j).taps, (std::vector<int64_t>{1, 33}));  // round(1 + i * 32 / 1)
  j["num_hidden_layers"] = 3;
  EXPECT_EQ(parse(j).taps, (std::vector<int64_t>{1, 17, 33}));
  j["num_hidden_layers"] = 5;
  j["num_target_layers"] = 28;
  EXPECT_EQ(parse(j).taps, (std::vector<int64_t>{1, 7, 13, 19, 25}));
  // 1 + i * 26 / 4 = 1, 7.5, 14, 20.5, 27: halves round to even, as Python's round() does.
  j["num_target_layers"] = 30;
  EXPECT_EQ(parse(j).taps, (std::vector<int64_t>{1, 8, 14, 20, 27}));
  EXPECT_EQ(parse(j).n_taps(), 5);
  // T = 1: the middle layer, Lt / 2 (integer division).
  j["num_hidden_layers"] = 1;
  j["num_target_layers"] = 36;
  EXPECT_EQ(parse(j).taps, (std::vector<int64_t>{18}));
  j["num_target_layers"] = 35;
  EXPECT_EQ(parse(j).taps, (std::vector<int64_t>{17}));
}

TEST(ConfigFallbacks, LayerTypesAndSlidingWindow) {
  json j = with("/num_hidden_layers", 3);
  auto c = parse(j);
  EXPECT_EQ(c.sliding, (std::vector<bool>{false, false, false}));  // absent: all full
  j["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention"};
  j["sliding_window"] = 128;
  c = parse(j);
  EXPECT_EQ(c.sliding, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c.causal, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c.window, 128);
}

TEST(ConfigFallbacks, IsCausalOverridesEveryLayer) {
  json j = with("/layer_types", {"sliding_attention", "full_attention"});
  j["sliding_window"] = 4;
  j["is_causal"] = true;
  auto c = parse(j);
  EXPECT_EQ(c.causal, (std::vector<bool>{true, true}));
  EXPECT_EQ(c.sliding, (std::vector<bool>{true, false}));
  j["is_causal"] = false;
  c = parse(j);
  EXPECT_EQ(c.causal, (std::vector<bool>{false, false}));
  EXPECT_EQ(c.sliding, (std::vector<bool>{true, false}));
}

TEST(ConfigFallbacks, AttentionBiasAndEps) {
  json j = base();
  EXPECT_FALSE(parse(j).bias);
  EXPECT_EQ(parse(j).eps, 1e-6);  // default
  j["attention_bias"] = true;
  j["rms_norm_eps"] = 1e-5;
  EXPECT_TRUE(parse(j).bias);
  EXPECT_EQ(parse(j).eps, 1e-5);
}

TEST(ConfigFallbacks, IntegerValuedFloatsAreAccepted) {
  EXPECT_EQ(parse(with("/hidden_size", 64.0)).hidden, 64);
}

TEST(ConfigFallbacks, DFlash2FieldsAtTopLevel) {
  json j = base2();
  for (const char* key : {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"}) {
    j[key] = j["dflash_config"][key];
    j["dflash_config"].erase(key);
  }
  EXPECT_EQ(dflash2_sizes(parse(j)), (std::vector<int64_t>{2, 16, 8, 4}));
}

// ---- to_json round trip ----------------------------------------------------------------------

TEST(Config, ToJsonRoundTrip) {
  for (const char* file : {"configs/tiny-dflash.json", "configs/tiny-dflash2.json"}) {
    SCOPED_TRACE(file);
    const auto c = DrafterConfig::from_file(testing::source_path(file));
    EXPECT_EQ(fields(DrafterConfig::from_json(c.to_json(), "round-trip")), fields(c));
  }
  // Everything away from its default (the null in the patch removes target_layer_ids).
  json j = base2();
  j.merge_patch({{"num_hidden_layers", 3},
                 {"layer_types", {"sliding_attention", "full_attention", "sliding_attention"}},
                 {"sliding_window", 5}, {"is_causal", true}, {"attention_bias", true},
                 {"rms_norm_eps", 1e-5}, {"rope_parameters", {{"rope_theta", 123456.0}}},
                 {"head_dim", 8}, {"num_target_layers", 12},
                 {"dflash_config", {{"input_embedding_scale", 1.25}, {"output_multiplier", 0.3},
                                    {"final_logit_softcapping", 30.0},
                                    {"target_layer_ids", nullptr}}}});
  const auto c = parse(j);
  EXPECT_EQ(c.taps, (std::vector<int64_t>{1, 5, 9}));
  EXPECT_EQ(fields(DrafterConfig::from_json(c.to_json(), "round-trip")), fields(c));
  // And through a file, as `tpdraft init` writes it.
  testing::TempDir dir;
  testing::write_text(dir.file("config.json"), c.to_json().dump(2));
  EXPECT_EQ(fields(DrafterConfig::from_file(dir.file("config.json"))), fields(c));
}

// ---- errors a user can meet ------------------------------------------------------------------

TEST(ConfigErrors, UnknownArchitecture) {
  json j = with("/architectures", {"LlamaForCausalLM"});
  expect_config_error(j, {"architectures", "LlamaForCausalLM", "DFlashDraftModel"});
  j.erase("architectures");
  expect_config_error(j, {"architectures"});
  j["architectures"] = json::array();
  expect_config_error(j, {"architectures"});
}

TEST(ConfigErrors, UnsupportedRopeType) {
  expect_config_error(with("/rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 1e6}}),
                      {"rope_parameters.rope_type", "yarn"});
  expect_config_error(with("/rope_scaling", {{"type", "linear"}, {"factor", 2.0}}), {"rope_scaling.type", "linear"});
  expect_config_error(with("/rope_scaling", {{"rope_type", "llama3"}}), {"rope_scaling.rope_type", "llama3"});
}

TEST(ConfigErrors, HeadsNotDivisible) {
  expect_config_error(with("/num_key_value_heads", 3), {"num_attention_heads", "num_key_value_heads", "(3)"});
}

TEST(ConfigErrors, MaskOutsideVocab) {
  expect_config_error(with("/dflash_config/mask_token_id", 300), {"mask_token_id", "300", "vocab_size"});
  expect_config_error(with("/dflash_config/mask_token_id", -1), {"mask_token_id"});
}

TEST(ConfigErrors, MissingMask) {
  json j = base();
  j["dflash_config"].erase("mask_token_id");
  expect_config_error(j, {"missing", "mask_token_id"});
}

TEST(ConfigErrors, NoTaps) {
  json j = base();
  j["dflash_config"].erase("target_layer_ids");
  expect_config_error(j, {"target_layer_ids", "num_target_layers"});
  j["target_layer_ids"] = json::array();
  expect_config_error(j, {"target_layer_ids"});
}

TEST(ConfigErrors, NegativeTap) {
  expect_config_error(with("/dflash_config/target_layer_ids", {1, -2}), {"target_layer_ids", "-2"});
}

TEST(ConfigErrors, MissingRequiredKeys) {
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                          "vocab_size"}) {
    json j = base();
    j.erase(key);
    expect_config_error(j, {"missing", key});
  }
}

TEST(ConfigErrors, WrongValueTypes) {
  expect_config_error(with("/hidden_size", "64"), {"hidden_size", "integer"});
  expect_config_error(with("/intermediate_size", 95.5), {"intermediate_size", "integer"});
  expect_config_error(with("/is_causal", "yes"), {"is_causal"});
  expect_config_error(with("/attention_bias", 1), {"attention_bias"});
  expect_config_error(with("/rms_norm_eps", "small"), {"rms_norm_eps", "number"});
  expect_config_error(with("/dflash_config/target_layer_ids", 3), {"target_layer_ids", "list"});
  expect_error([] { DrafterConfig::from_json(json::array(), kSource); }, {kSource, "object"});
}

TEST(ConfigErrors, NumbersOutsideTheIntegerRange) {
  // Doubles that are integers but no int64 (the cast was undefined), and integers past int64.
  for (double v : {1e30, -1e30, 1e300, 9223372036854775808.0})
    expect_config_error(with("/hidden_size", v), {"'hidden_size'", fmt::format("{}", v), "64-bit"});
  expect_config_error(with("/vocab_size", std::numeric_limits<uint64_t>::max()),
                      {"'vocab_size'", "18446744073709551615"});
  expect_config_error(with("/dflash_config/target_layer_ids", {1, 1e19}), {"'target_layer_ids'", "1e+19"});
  // A 300-digit literal parses as a double; the message stays short.
  testing::TempDir dir;
  const std::string path = dir.file("config.json");
  json text = base();
  text["intermediate_size"] = 0;
  std::string dumped = text.dump();
  dumped.replace(dumped.find("\"intermediate_size\":0"), 21, "\"intermediate_size\":1" + std::string(300, '0'));
  testing::write_text(path, dumped);
  const std::string msg = testing::error_of([&] { DrafterConfig::from_file(path); });
  EXPECT_NE(msg.find("'intermediate_size'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1e+300"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 200u) << msg;
}

TEST(ConfigErrors, SizesHaveUpperBounds) {
  struct Case {
    const char* key;
    json config;
    std::vector<std::string> parts;  // besides the key and "limit"
  };
  const json sliding = with("/layer_types", {"sliding_attention", "full_attention"});
  const Case cases[] = {
      {"hidden_size", with("/hidden_size", 131073 * 4), {"524292", "131072"}},
      {"num_hidden_layers", with("/num_hidden_layers", 1e9), {"1000000000", "1024"}},
      {"num_attention_heads", with("/num_attention_heads", 2048), {"2048", "1024"}},
      {"num_key_value_heads", with("/num_key_value_heads", 4096), {"4096", "1024"}},
      {"head_dim", with("/head_dim", 8192), {"8192", "4096"}},
      {"intermediate_size", with("/intermediate_size", 1 << 21), {"2097152", "1048576"}},
      {"vocab_size", with("/vocab_size", int64_t{1} << 58), {"288230376151711744", "16777216"}},
      {"block_size", with("/dflash_config/block_size", 4096), {"4096", "1024"}},
      {"sliding_window", with("/sliding_window", int64_t{1} << 40, sliding),
       {"1099511627776", "16777216"}},
      {"target_layer_ids", with("/dflash_config/target_layer_ids", std::vector<int>(2000, 1)),
       {"2000", "1024"}},
      {"target_layer_ids", with("/dflash_config/target_layer_ids", {1, 70000}), {"70000", "65536"}},
      {"num_target_layers", with("/num_target_layers", 1e12), {"1000000000000", "65536"}},
      {"conv_kernel_size", with("/dflash_config/conv_kernel_size", 1000, base2()), {"1000", "64"}},
      {"conv_group_size", with("/dflash_config/conv_group_size", 1 << 20, base2()),
       {"1048576", "131072"}},
      {"selector_rank", with("/dflash_config/selector_rank", 100000, base2()), {"100000", "65536"}},
      {"selector_top_k",
       with("/dflash_config/selector_top_k", 5000, with("/vocab_size", 100000, base2())),
       {"5000", "4096"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> parts = c.parts;
    parts.push_back(std::string("'") + c.key + "'");
    parts.push_back("limit");
    SCOPED_TRACE(c.key);
    expect_config_error(c.config, parts);
  }
  // At the bounds themselves a config is accepted.
  json j = base();
  j.merge_patch({{"hidden_size", 131072}, {"num_attention_heads", 1024},
                 {"num_key_value_heads", 1024}, {"head_dim", 4096}, {"intermediate_size", 1048576},
                 {"vocab_size", 16777216}, {"dflash_config", {{"block_size", 1024}}}});
  EXPECT_EQ(parse(j).vocab, 16777216);
}

TEST(ConfigErrors, HugeLayerCountFailsBeforeDerivingTaps) {
  // Deriving one tap per layer for 1e9 layers took 8 GB and half a minute before the fix.
  json j = base();
  j["dflash_config"].erase("target_layer_ids");
  j["num_target_layers"] = 36;
  j["num_hidden_layers"] = 1e9;
  const auto t0 = std::chrono::steady_clock::now();
  expect_config_error(j, {"'num_hidden_layers'", "1024"});
  // The derivation took half a minute; a bound far below that and far above the check's
  // microseconds holds on a machine busy with other work.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

TEST(ConfigErrors, ValidateChecksBoundsOfProgrammaticConfigs) {
  auto c = parse(base());
  c.vocab = int64_t{1} << 58;
  expect_error([&] { c.validate("made-in-code"); }, {"made-in-code", "'vocab_size'", "16777216"});
  c = parse(base());
  c.layers = 5000;
  c.sliding.assign(5000, false);
  c.causal.assign(5000, false);
  expect_error([&] { c.validate("made-in-code"); }, {"made-in-code", "'num_hidden_layers'", "1024"});
}

TEST(ConfigErrors, ConfigGivenAsDirectory) {
  testing::TempDir dir;
  expect_error([&] { DrafterConfig::from_file(dir.path()); }, {dir.path(), "is a directory", "config.json"});
  // The target's config.json as a directory is an error too, not "no config".
  std::filesystem::create_directory(dir.file("config.json"));
  expect_error([&] { TargetConfig::from_dir(dir.path()); }, {dir.file("config.json"), "is a directory"});
}

TEST(ConfigErrors, ConfigGivenAsFifoIsRefusedWithoutBlocking) {
  testing::TempDir dir;
  const std::string fifo = dir.file("config.json");
  testing::make_fifo(fifo);
  EXPECT_TRUE(testing::finishes_without_blocking(
      fifo, [&] { expect_error([&] { DrafterConfig::from_file(fifo); }, {fifo, "FIFO", "regular file"}); }));
  EXPECT_TRUE(testing::finishes_without_blocking(
      fifo, [&] { expect_error([&] { TargetConfig::from_dir(dir.path()); }, {fifo, "FIFO"}); }));
}

TEST(ConfigErrors, NonPositiveSizes) {
  expect_config_error(with("/num_key_value_heads", 0), {"num_key_value_heads", "positive"});
  expect_config_error(with("/num_attention_heads", 0), {"num_attention_heads", "positive"});
  expect_config_error(with("/vocab_size", -5), {"vocab_size"});
  expect_config_error(with("/dflash_config/block_size", 1), {"block_size", "at least 2"});
  expect_config_error(with("/head_dim", 15), {"head_dim", "even"});
}

TEST(ConfigErrors, LayerTypes) {
  json j = with("/layer_types", {"full_attention"});
  expect_config_error(j, {"layer_types", "1 entries", "num_hidden_layers"});
  j["layer_types"] = {"full_attention", "linear_attention"};
  expect_config_error(j, {"layer_types[1]", "linear_attention"});
  j["layer_types"] = {"full_attention", 3};
  expect_config_error(j, {"layer_types[1]"});
  j["layer_types"] = "full_attention";
  expect_config_error(j, {"layer_types", "list"});
}

TEST(ConfigErrors, SlidingWithoutWindow) {
  json j = with("/layer_types", {"full_attention", "sliding_attention"});
  expect_config_error(j, {"sliding_window"});
  j["sliding_window"] = 0;
  expect_config_error(j, {"sliding_window", "positive"});
}

TEST(ConfigErrors, DFlash2MissingConvFields) {
  for (const char* key : {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"}) {
    json j = base2();
    j["dflash_config"].erase(key);
    expect_config_error(j, {"missing", key});
  }
}

TEST(ConfigErrors, DFlash2GroupDoesNotDivideHidden) {
  expect_config_error(with("/dflash_config/conv_group_size", 24, base2()), {"hidden_size", "conv_group_size", "(24)"});
  expect_config_error(with("/dflash_config/selector_top_k", 301, base2()), {"selector_top_k", "vocab_size"});
}

TEST(ConfigErrors, BadSoftcapAndMultiplier) {
  expect_config_error(with("/dflash_config/final_logit_softcapping", -1.0), {"final_logit_softcapping"});
  expect_config_error(with("/output_multiplier", 0.0), {"output_multiplier"});
}

TEST(ConfigErrors, BadJsonFile) {
  testing::TempDir dir;
  const std::string path = dir.file("config.json");
  testing::write_text(path, "{\"hidden_size\": 64,");
  expect_error([&] { DrafterConfig::from_file(path); }, {path, "not valid JSON"});
}

TEST(ConfigErrors, MissingFile) {
  testing::TempDir dir;
  const std::string path = dir.file("nope.json");
  expect_error([&] { DrafterConfig::from_file(path); }, {path, "cannot open"});
}

TEST(ConfigErrors, ValidateProgrammaticConfig) {
  auto c = parse(base());
  c.n_kv = 3;
  expect_error([&] { c.validate("made-in-code"); }, {"made-in-code", "num_key_value_heads"});
  c = parse(base());
  c.sliding.pop_back();
  expect_error([&] { c.validate("made-in-code"); }, {"made-in-code", "2 layers"});
}

// ---- the target model's config ---------------------------------------------------------------

// tie_word_embeddings, vocab_size and hidden_size of the target config in `dir`.
std::tuple<bool, int64_t, int64_t> target_fields(const std::string& dir) {
  const auto t = TargetConfig::from_dir(dir);
  return {t.tie_word_embeddings, t.vocab, t.hidden};
}

TEST(TargetConfig, Defaults) {
  testing::TempDir dir;
  EXPECT_EQ(target_fields(dir.path()), std::make_tuple(false, 0, 0));
}

TEST(TargetConfig, TopLevelAndNestedTextConfig) {
  testing::TempDir dir;
  testing::write_text(dir.file("config.json"),
                      R"({"tie_word_embeddings": true, "vocab_size": 1000, "hidden_size": 64})");
  EXPECT_EQ(target_fields(dir.path()), std::make_tuple(true, 1000, 64));
  // Multimodal: the language model's sizes live under text_config, which wins for the tie flag.
  testing::write_text(dir.file("config.json"),
                      R"({"tie_word_embeddings": true, "vocab_size": 5,
                          "text_config": {"tie_word_embeddings": false, "vocab_size": 2000, "hidden_size": 32}})");
  EXPECT_EQ(target_fields(dir.path()), std::make_tuple(false, 2000, 32));
}

TEST(TargetConfig, Errors) {
  testing::TempDir dir;
  testing::write_text(dir.file("config.json"), "not json");
  expect_error([&] { TargetConfig::from_dir(dir.path()); }, {"config.json", "not valid JSON"});
  testing::write_text(dir.file("config.json"), R"({"tie_word_embeddings": "yes"})");
  expect_error([&] { TargetConfig::from_dir(dir.path()); }, {"config.json", "tie_word_embeddings"});
}

}  // namespace
}  // namespace tpdraft::model
