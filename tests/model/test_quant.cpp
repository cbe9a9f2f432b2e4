// Quantized checkpoints: quantization_config parsing and target matching, the shard plan's group
// rule, the pack-quantized / FP8 reader (every share of a tp split equal to the matching part of
// the whole; each inconsistency an error naming tensor and file), `tpdraft quantize`'s output read
// back, and a checkpoint packed by hand here in the compressed-tensors layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/config.h"
#include "checkpoint/quant_config.h"
#include "checkpoint/quant_tensors.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "model/shard_plan.h"
#include "model/weights.h"
#include "support/test_support.h"
#include "tools/quantize.h"
#include "tools/random_checkpoint.h"

namespace tpdraft::model {
namespace {

using testing::expect_error;

using json = nlohmann::json;

json int_config(int bits, const std::string& strategy, int64_t group) {
  json w = {{"num_bits", bits}, {"type", "int"}, {"symmetric", true}, {"strategy", strategy}, {"actorder", nullptr},
            {"dynamic", false}};
  w["group_size"] = strategy == "group" ? json(group) : json(nullptr);
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", w}}}}},
          {"ignore", {"fc", "re:.*kernel_projection$"}}};
}

QuantRequest request(int bits, int64_t group) {
  QuantRequest r;
  r.bits = bits;
  r.group = group;
  return r;
}

TEST(QuantConfig, TargetsIgnoreAndSchemes) {
  const QuantConfig c = QuantConfig::from_json(int_config(4, "group", 128), "cfg.json");
  const QuantScheme down = c.scheme_for("layers.3.mlp.down_proj.weight");
  EXPECT_EQ(down.kind, QuantScheme::Kind::Int);
  EXPECT_EQ(down.bits, 4);
  EXPECT_EQ(down.strategy, QuantScheme::Strategy::Group);
  EXPECT_EQ(down.group, 128);
  EXPECT_EQ(down.describe(), "int4 g128");
  EXPECT_FALSE(c.scheme_for("fc.weight").quantized());  // ignored by name
  EXPECT_FALSE(c.scheme_for("layers.0.mlp_conv.kernel_projection.weight").quantized());  // by regex
  EXPECT_TRUE(c.scheme_for("candidate_selector.hidden_projection.weight").quantized());
  // Never quantized, whatever the targets: norms, biases, base kernels, codebooks.
  EXPECT_FALSE(c.scheme_for("layers.0.input_layernorm.weight").quantized());
  EXPECT_FALSE(c.scheme_for("layers.0.self_attn.q_proj.bias").quantized());
  EXPECT_FALSE(c.scheme_for("layers.0.attention_conv.base_kernel").quantized());
  EXPECT_FALSE(c.scheme_for("candidate_selector.predecessor_codebook").quantized());

  // Module names with the "model." prefix match as well; the first matching group wins.
  json two = int_config(8, "channel", 0);
  two["config_groups"]["group_1"] = two["config_groups"]["group_0"];
  two["config_groups"]["group_0"]["targets"] = {"re:model\\.layers\\.1\\..*"};
  two["config_groups"]["group_0"]["weights"]["num_bits"] = 4;
  const QuantConfig t = QuantConfig::from_json(two, "cfg.json");
  EXPECT_EQ(t.scheme_for("layers.1.self_attn.o_proj.weight").bits, 4);
  EXPECT_EQ(t.scheme_for("layers.0.self_attn.o_proj.weight").bits, 8);
  EXPECT_EQ(t.scheme_for("layers.0.self_attn.o_proj.weight").describe(), "int8 per-channel");

  // Round trip through to_json.
  QuantConfig back = QuantConfig::from_json(c.to_json(), "again");
  EXPECT_EQ(back.scheme_for("layers.3.mlp.down_proj.weight"), down);
  EXPECT_FALSE(back.scheme_for("fc.weight").quantized());
}

// `j` with the value at JSON pointer `at` set to `value`.
json with(json j, const std::string& at, json value) {
  j[json::json_pointer(at)] = std::move(value);
  return j;
}

TEST(QuantConfig, RefusesWhatCannotRun) {
  const json g128 = int_config(4, "group", 128), c8 = int_config(8, "channel", 0);
  const std::string w = "/config_groups/group_0/weights/";
  const std::pair<json, std::string> cases[] = {
      {with(g128, w + "symmetric", false), "asymmetric"},
      {with(g128, w + "actorder", "group"), "activation ordering"},
      {with(g128, "/quant_method", "gptq"), "'gptq' is not supported"},
      {int_config(4, "block", 0), "strategy 'block'"},
      {int_config(3, "channel", 0), "3 bits"},
      {int_config(4, "group", 0), "positive integer group_size"},
      {with(c8, w + "type", "float"), "float weights in format 'pack-quantized'"},
      {with(c8, "/ignore", {"re:([unclosed"}), "not a valid regular expression"},
      {with(c8, "/format", "naive-quantized"), "'naive-quantized' is not supported"},
  };
  for (const auto& c : cases)
    expect_error([&] { QuantConfig::from_json(c.first, "drafter/config.json"); }, {c.second, "drafter/config.json"});
}

TEST(QuantConfig, PlansAndPresets) {
  const DrafterConfig cfg = DrafterConfig::from_file(testing::source_path("configs/tiny-dflash2.json"));
  const auto tensors = expected_drafter_tensors(cfg);
  QuantRequest r = request(4, 16);
  r.only = "mlp";
  const QuantConfig mlp = plan_quantization(r, tensors, QuantConfig::Source::Checkpoint);
  EXPECT_EQ(mlp.scheme_for("layers.1.mlp.down_proj.weight").describe(), "int4 g16");
  EXPECT_FALSE(mlp.scheme_for("layers.1.self_attn.q_proj.weight").quantized());
  EXPECT_FALSE(mlp.scheme_for("fc.weight").quantized());
  r.only = "attn";
  r.include_fc = true;
  r.group = 128;  // divides none of the tiny matrices: one scale per row
  const QuantConfig attn = plan_quantization(r, tensors, QuantConfig::Source::Checkpoint);
  EXPECT_EQ(attn.scheme_for("layers.0.self_attn.o_proj.weight").describe(), "int4 per-channel");
  EXPECT_EQ(attn.scheme_for("fc.weight").describe(), "int4 per-channel");
  EXPECT_FALSE(attn.scheme_for("layers.0.mlp.up_proj.weight").quantized());
  const QuantConfig q4 = plan_quantization(QuantRequest::preset("q4"), tensors, QuantConfig::Source::OnLoad);
  EXPECT_EQ(q4.scheme_for("layers.0.mlp.up_proj.weight").bits, 4);
  EXPECT_EQ(q4.scheme_for("fc.weight").bits, 8);
  EXPECT_EQ(q4.scheme_for("layers.0.attention_conv.kernel_projection.weight").bits, 8);
  EXPECT_EQ(q4.scheme_for("candidate_selector.hidden_projection.weight").bits, 8);
  EXPECT_THROW(QuantRequest::preset("q3"), Error);
  // +head: the head int8 as well (the layers as without it); nothing else takes the suffix.
  EXPECT_EQ(QuantRequest::preset("q4").head_bits, 0);
  EXPECT_EQ(QuantRequest::preset("q4+head").head_bits, 8);
  EXPECT_EQ(QuantRequest::preset("q4+head").bits, 4);
  EXPECT_EQ(QuantRequest::preset("q8+head").bits, 8);
  for (const char* bad : {"+head", "q8+", "q8+heads", "q3+head", "head"}) EXPECT_THROW(QuantRequest::preset(bad), Error) << bad;
  EXPECT_EQ(QuantRequest::preset("q8").activation_bits, 0);
  EXPECT_EQ(QuantRequest::preset("q4a8").activation_bits, 8);
  EXPECT_EQ(QuantRequest::preset("q4a8").bits, 4);
  EXPECT_EQ(QuantRequest::preset("q8a16+head").activation_bits, 16);
  EXPECT_EQ(QuantRequest::preset("q8a16+head").head_bits, 8);
  EXPECT_EQ(QuantRequest::preset("q8a8+head").activation_bits, 8);
  EXPECT_EQ(quant_presets().size(), 12u);
  for (const char* bad : {"q8a", "q8a4", "q8+heada8", "q4a16+", "a8", "q8 ", "Q8"})
    EXPECT_THROW(QuantRequest::preset(bad), Error) << bad;
}

// The shard plan: a tp whose row-parallel parts would cut a scale group is refused at start-up.
TEST(QuantShardPlan, TpThatCutsAGroupIsAStartUpError) {
  DrafterConfig cfg = DrafterConfig::from_file(testing::source_path("configs/tiny-dflash2.json"));
  // cfg.quant: int4 in groups of `group`.
  auto plan = [&](int64_t group) {
    cfg.quant = plan_quantization(request(4, group), expected_drafter_tensors(cfg), QuantConfig::Source::Checkpoint);
  };
  plan(16);  // o: 64 columns (parts of 32 at tp 2, 16 at tp 4); down: 80 (40 at tp 2)
  EXPECT_NO_THROW(ShardPlan::make(cfg, 0, 1));
  expect_error([&] { ShardPlan::make(cfg, 1, 2); },
               {"tp = 2 cuts the quantization groups of 'layers.0.mlp.down_proj.weight'", "parts of 40"});
  plan(8);  // parts of 40 and 32 hold whole groups of 8; at tp 4, 20 does not
  EXPECT_NO_THROW(ShardPlan::make(cfg, 1, 2));
  EXPECT_THROW(ShardPlan::make(cfg, 3, 4), Error);
  plan(4);
  EXPECT_NO_THROW(ShardPlan::make(cfg, 3, 4));
  plan(20);  // K = 64 matrices fall back to one scale per row; down (80) takes groups of 20
  EXPECT_NO_THROW(ShardPlan::make(cfg, 0, 4));
  EXPECT_THROW(ShardPlan::make(cfg, 0, 8), Error);  // 80 / 8 = 10 < 20; n_q = 4 refuses tp 8 first anyway
}

// A float checkpoint and its `tpdraft quantize` copy in one temp dir.
struct Quantized {
  testing::TempDir dir;
  DrafterConfig cfg;
  std::string drafter() const { return dir.file("ckpt/drafter"); }
  std::string qdrafter() const { return dir.file("q"); }
  Quantized(const std::string& config, const QuantRequest& r) {
    cfg = DrafterConfig::from_file(testing::source_path("configs/" + config));
    RandomCheckpointOptions o;
    o.seed = 3;
    o.threads = 2;
    write_random_checkpoint(cfg, dir.file("ckpt"), o, 0);
    quantize_checkpoint(drafter(), qdrafter(), r);
  }
};

TEST(QuantReader, QuantizeOutputReadsBackAndSharesAgree) {
  QuantRequest r = request(4, 4);  // whole groups in every part at tp 2 and 4
  r.include_fc = true;
  Quantized q("tiny-dflash2.json", r);
  const DrafterConfig qcfg = DrafterConfig::from_file(q.qdrafter() + "/config.json");
  ASSERT_EQ(qcfg.quant.source, QuantConfig::Source::Checkpoint);
  EXPECT_EQ(qcfg.quant.format, "pack-quantized");
  const auto store = TensorStore::open(q.qdrafter());
  const auto src = TensorStore::open(q.drafter());
  // The layout: packed int32 words, bf16 scales, an I64 shape; no float copy of the matrix.
  const std::string down = "layers.1.mlp.down_proj.weight";
  ASSERT_NE(store->find(down + "_packed"), nullptr);
  EXPECT_EQ(store->find(down + "_packed")->dtype, DType::I32);
  EXPECT_EQ(store->find(down + "_packed")->shape, (std::vector<int64_t>{64, 10}));  // 80 * 4 / 32
  EXPECT_EQ(store->find(down + "_scale")->shape, (std::vector<int64_t>{64, 20}));   // 80 / 4
  EXPECT_EQ(store->find(down + "_scale")->dtype, DType::BF16);
  EXPECT_EQ(store->find(down), nullptr);
  ASSERT_NE(store->find("layers.0.input_layernorm.weight"), nullptr);  // unquantized as stored

  for (const auto& [name, shape] : expected_drafter_tensors(qcfg)) {
    const QuantScheme s = qcfg.quant.scheme_for(name);
    if (!s.quantized()) continue;
    SCOPED_TRACE(name);
    const QuantShare all = read_packed_share(*store, name, shape, s, {0, shape[0]}, {0, shape[1]});
    // What was read is what quantizing the float tensor gives, and within half a step of it.
    const QuantShare fresh = quantize_share(*src->find(name), s, {0, shape[0]}, {0, shape[1]});
    EXPECT_EQ(all.q, fresh.q);
    EXPECT_EQ(all.scales, fresh.scales);
    const std::vector<float> orig = to_f32(*src->find(name));
    const std::vector<float> deq = all.dequantized();
    for (size_t i = 0; i < orig.size(); ++i) {
      const float step = all.scales[(i / static_cast<size_t>(shape[1])) * static_cast<size_t>(shape[1] / all.group) +
                                    (i % static_cast<size_t>(shape[1])) / static_cast<size_t>(all.group)];
      ASSERT_LE(std::fabs(deq[i] - orig[i]), 0.5f * step * 1.0001f + 1e-30f) << i;
    }
    // Every tp share is the matching block of the whole.
    for (int tp : {2, 4}) {
      for (int rank = 0; rank < tp; ++rank) {
        const ShardPlan plan = ShardPlan::make(qcfg, rank, tp);
        const TensorShare share = tensor_share(qcfg, plan, name, shape);
        const QuantShare part = read_packed_share(*store, name, shape, s, share.rows, share.cols);
        ASSERT_EQ(part.rows, share.rows.size());
        ASSERT_EQ(part.cols, share.cols.size());
        const std::vector<float> pd = part.dequantized();
        for (int64_t rr = 0; rr < part.rows; ++rr) {
          for (int64_t c = 0; c < part.cols; ++c) {
            const auto at = static_cast<size_t>(rr * part.cols + c);
            const auto whole = static_cast<size_t>((share.rows.begin + rr) * shape[1] + share.cols.begin + c);
            ASSERT_EQ(part.q[at], all.q[whole]);
            ASSERT_EQ(pd[at], deq[whole]);
          }
        }
      }
    }
  }
  // A quantized checkpoint is not quantized twice.
  expect_error([&] { quantize_checkpoint(q.qdrafter(), q.dir.file("q2"), r); }, {"quantized already"});
}

// Rewrites the safetensors file `path` through `edit(name, tensor) -> keep?` plus `extra` tensors.
void rewrite(const std::string& path, const std::function<bool(const std::string&, OwnedTensor&)>& edit,
             std::vector<OwnedTensor> extra = {}) {
  std::vector<OwnedTensor> all;
  for (OwnedTensor& t : testing::read_tensors(path))
    if (edit(t.name, t)) all.push_back(std::move(t));
  for (auto& e : extra) all.push_back(std::move(e));
  testing::write_tensors(path, all);
}

// Rewrites the safetensors file `path` with tensor `name` changed by `edit`.
void edit_tensor(const std::string& path, const std::string& name, const std::function<void(OwnedTensor&)>& edit) {
  rewrite(path, [&](const std::string& n, OwnedTensor& t) {
    if (n == name) edit(t);
    return true;
  });
}

TEST(QuantReader, InconsistenciesNameTensorAndFile) {
  Quantized q("tiny-dflash.json", request(8, 16));
  const DrafterConfig qcfg = DrafterConfig::from_file(q.qdrafter() + "/config.json");
  const std::string up = "layers.0.mlp.up_proj.weight";
  const std::vector<int64_t> shape{qcfg.ffn, qcfg.hidden};
  const QuantScheme s = qcfg.quant.scheme_for(up);
  ASSERT_TRUE(s.quantized());
  const std::string file = q.qdrafter(), weights = file + "/model.safetensors";
  // Each case edits a fresh copy of the valid file: the checks restore it.
  const std::vector<OwnedTensor> original = testing::read_tensors(weights);
  auto check = [&](const std::string& needle) {
    expect_error([&] { check_quantized_tensor(*TensorStore::open(file), up, shape, s); },
                 {needle, "model.safetensors"});
    testing::write_tensors(weights, original);
  };
  auto bytes_of = [](std::vector<int64_t> v) {
    std::vector<std::byte> b(v.size() * 8);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };

  rewrite(weights, [](const std::string&, OwnedTensor&) { return true; },
          {{up + "_zero_point", DType::I8, {shape[0], 1}, std::vector<std::byte>(static_cast<size_t>(shape[0]))}});
  check("'" + up + "_zero_point': asymmetric quantization");
  rewrite(weights, [](const std::string&, OwnedTensor&) { return true; },
          {{up + "_g_idx", DType::I32, {shape[1]}, std::vector<std::byte>(static_cast<size_t>(shape[1]) * 4)}});
  check("'" + up + "_g_idx': activation ordering");
  edit_tensor(weights, up + "_packed", [](OwnedTensor& t) {
    t.shape[1] -= 1;
    t.bytes.resize(static_cast<size_t>(t.shape[0] * t.shape[1]) * 4);
  });
  check("'" + up + "_packed' has shape [96, 15], expected [96, 16]");
  edit_tensor(weights, up + "_scale", [&](OwnedTensor& t) {
    t.shape = {shape[0], 1};
    t.bytes.resize(static_cast<size_t>(shape[0]) * 2);
  });
  check("'" + up + "_scale' has shape [96, 1], expected [96, 4]");
  edit_tensor(weights, up + "_shape", [&](OwnedTensor& t) { t.bytes = bytes_of({shape[0], shape[1] + 1}); });
  check("says [96, 65]");
  rewrite(weights, [&](const std::string& n, OwnedTensor&) { return n != up + "_scale"; });
  expect_error([&] { check_quantized_tensor(*TensorStore::open(file), up, shape, s); },
               {file + ": tensor '" + up + "_scale' is missing"});
  testing::write_tensors(weights, original);
  // A config that quantizes a tensor the file stores as floats.
  rewrite(weights, [&](const std::string& n, OwnedTensor&) { return n.rfind(up, 0) != 0; },
          {{up, DType::BF16, shape, std::vector<std::byte>(static_cast<size_t>(shape[0] * shape[1]) * 2)}});
  check("is stored unquantized");
  // A non-finite scale is found when the share is read.
  edit_tensor(weights, up + "_scale", [](OwnedTensor& t) {
    const uint16_t nan = 0x7fc0;
    std::memcpy(t.bytes.data() + 6, &nan, 2);
  });
  expect_error([&] { read_packed_share(*TensorStore::open(file), up, shape, s, {0, shape[0]}, {0, shape[1]}); },
               {"'" + up + "_scale' holds a non-finite scale"});
  testing::write_tensors(weights, original);
  // The whole drafter loads again from the restored file (the checks above left nothing behind).
  const auto store = TensorStore::open(file);
  for (const auto& [name, sh] : expected_drafter_tensors(qcfg)) {
    const QuantScheme scheme = qcfg.quant.scheme_for(name);
    if (scheme.quantized()) {
      EXPECT_NO_THROW(check_quantized_tensor(*store, name, sh, scheme)) << name;
    }
  }
}

TEST(QuantReader, Fp8PerChannelAndPerTensor) {
  // A float-quantized module written here: e4m3 bytes and a per-channel or per-tensor scale.
  testing::TempDir dir;
  const int64_t n = 5, k = 12;
  std::vector<std::byte> w(static_cast<size_t>(n * k));
  std::mt19937 rng(4);
  for (auto& b : w) {
    uint8_t v;
    do v = static_cast<uint8_t>(rng()); while ((v & 0x7f) == 0x7f);  // no NaN codes
    b = std::byte{v};
  }
  const float channel[n] = {0.5f, 2.0f, 0.125f, 1.0f, 3.0f};
  SafetensorsWriter wr;
  wr.add("m.weight", DType::F8E4M3, {n, k}, w.data(), w.size());
  wr.add("m.weight_scale", DType::F32, {n, 1}, channel, sizeof(channel));
  const float one = 0.25f;
  wr.add("t.weight", DType::F8E4M3, {n, k}, w.data(), w.size());
  wr.add("t.weight_scale", DType::F32, {1}, &one, sizeof(one));
  wr.write(dir.file("model.safetensors"));
  const auto store = TensorStore::open(dir.path());
  QuantScheme s;
  s.kind = QuantScheme::Kind::Fp8;
  s.bits = 8;
  s.strategy = QuantScheme::Strategy::Channel;
  const std::vector<float> got = read_fp8_share(*store, "m.weight", {n, k}, s, {1, 4}, {2, 9});
  s.strategy = QuantScheme::Strategy::Tensor;
  const std::vector<float> got_t = read_fp8_share(*store, "t.weight", {n, k}, s, {0, n}, {0, k});
  // e4m3 decoded here from its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits.
  auto decode = [](uint8_t v) {
    const int e = (v >> 3) & 15, m = v & 7;
    const double mag = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
    return (v & 0x80) ? -mag : mag;
  };
  for (int64_t r = 1; r < 4; ++r)
    for (int64_t c = 2; c < 9; ++c)
      EXPECT_EQ(got[static_cast<size_t>((r - 1) * 7 + c - 2)],
                decode(static_cast<uint8_t>(w[static_cast<size_t>(r * k + c)])) * channel[r]);
  for (size_t i = 0; i < got_t.size(); ++i) EXPECT_EQ(got_t[i], decode(static_cast<uint8_t>(w[i])) * 0.25);
  // A NaN code is refused, naming the tensor and the file.
  w[7] = std::byte{0x7f};
  SafetensorsWriter bad;
  bad.add("m.weight", DType::F8E4M3, {n, k}, w.data(), w.size());
  bad.add("m.weight_scale", DType::F32, {1}, &one, sizeof(one));
  bad.write(dir.file("model.safetensors"));
  const auto store2 = TensorStore::open(dir.path());
  expect_error([&] { read_fp8_share(*store2, "m.weight", {n, k}, s, {0, n}, {0, k}); },
               {"'m.weight' holds NaN at row 0, column 7", "model.safetensors"});
}

}  // namespace
}  // namespace tpdraft::model
