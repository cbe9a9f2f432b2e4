// Sanity checks of the float64 reference itself, on hand-built checkpoints whose weights make
// the math computable by a few lines here: identity layers, uniform attention (zero q/k), the
// DFlash 2 convolution and selector walk, the counter-based uniforms and seeded sampling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/checked.h"
#include "core/error.h"
#include "reference/reference.h"
#include "support/test_support.h"

namespace tpdraft::reference {
namespace {

using tpdraft::testing::TempDir;
using Vec = std::vector<double>;

// Geometry of every checkpoint here.
constexpr int64_t kH = 8, kNq = 2, kNk = 1, kD = 4, kF = 8, kV = 12, kB = 3, kVt = 14;
constexpr int64_t kMask = 11;
constexpr double kEps = 1e-6;

// Values k/16, k in [-16, 16], from a small LCG: exact in f32, so the test sees the same numbers.
std::vector<float> pattern(int64_t n, uint32_t salt) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = salt * 2654435761u + 12345u;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int>((s >> 16) % 33) - 16) / 16.0f;
  }
  return v;
}

std::vector<float> identity(int64_t rows, int64_t cols) {
  std::vector<float> v(static_cast<size_t>(rows * cols), 0.0f);
  for (int64_t i = 0; i < std::min(rows, cols); ++i) v[i * cols + i] = 1.0f;
  return v;
}

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
using Weights = std::map<std::string, Tensor>;

void put(Weights& w, const std::string& name, std::vector<int64_t> shape, std::vector<float> data = {}) {
  const int64_t numel = checked_numel(shape, "tensor '{}'", name);
  if (data.empty()) data.assign(static_cast<size_t>(numel), 0.0f);
  ASSERT_EQ(static_cast<int64_t>(data.size()), numel) << name;
  w[name] = Tensor{std::move(shape), std::move(data)};
}

// One tap, fc = identity, norms of ones, every projection zero: each layer is the identity on h.
Weights base_weights(bool dflash2) {
  Weights w;
  put(w, "fc.weight", {kH, kH}, identity(kH, kH));
  for (const char* norm : {"hidden_norm", "norm", "layers.0.input_layernorm", "layers.0.post_attention_layernorm"})
    put(w, std::string(norm) + ".weight", {kH}, std::vector<float>(kH, 1.0f));
  const std::string p = "layers.0.";
  put(w, p + "self_attn.q_proj.weight", {kNq * kD, kH});
  put(w, p + "self_attn.k_proj.weight", {kNk * kD, kH});
  put(w, p + "self_attn.v_proj.weight", {kNk * kD, kH});
  put(w, p + "self_attn.o_proj.weight", {kH, kNq * kD});
  put(w, p + "self_attn.q_norm.weight", {kD}, std::vector<float>(kD, 1.0f));
  put(w, p + "self_attn.k_norm.weight", {kD}, std::vector<float>(kD, 1.0f));
  put(w, p + "mlp.gate_proj.weight", {kF, kH});
  put(w, p + "mlp.up_proj.weight", {kF, kH});
  put(w, p + "mlp.down_proj.weight", {kH, kF});
  if (dflash2) {
    // K = 2, gs = 4 (G = 2), R = 3; the codebooks are set by the tests that read them.
    for (const char* conv : {"attention_conv", "mlp_conv"}) {
      put(w, p + conv + ".base_kernel", {2, 2, kH});
      put(w, p + conv + ".kernel_projection.weight", {2 * 2 * 2, kH});
    }
    put(w, "candidate_selector.hidden_projection.weight", {3, kH});
    put(w, "candidate_selector.predecessor_codebook", {kV, 3});
    put(w, "candidate_selector.successor_codebook.weight", {kV, 3});
  }
  return w;
}

std::string config_text(bool dflash2, const std::string& top_extra, const std::string& dc_extra,
                        const std::string& taps = "[2]") {
  std::string s = R"({"architectures": [")" + std::string(dflash2 ? "DFlash2DraftModel" : "DFlashDraftModel") +
                  R"("], "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 8, "vocab_size": 12,
      "rms_norm_eps": 1e-6, "rope_theta": 10000.0)";
  s += top_extra;
  s += R"(, "dflash_config": {"block_size": 3, "target_layer_ids": )" + taps + R"(, "mask_token_id": 11)";
  if (dflash2) s += R"(, "conv_kernel_size": 2, "conv_group_size": 4, "selector_rank": 3, "selector_top_k": 4)";
  s += dc_extra + "}}";
  return s;
}

// A drafter checkpoint plus a target (embedding with a `model.` prefix and an untied, padded head).
struct Fixture {
  TempDir drafter, target;
  std::vector<float> embed = pattern(kVt * kH, 101);
  std::vector<float> head = pattern(kVt * kH, 202);

  Fixture(const std::string& config, const Weights& w, std::vector<float> head_rows = {}) {
    if (!head_rows.empty()) head = std::move(head_rows);
    tpdraft::testing::write_text(drafter.file("config.json"), config);
    model::SafetensorsWriter d;
    for (const auto& [name, t] : w) d.add_f32(name, DType::F32, t.shape, t.data.data());
    d.write(drafter.file("model.safetensors"));
    tpdraft::testing::write_text(target.file("config.json"), R"({"tie_word_embeddings": false})");
    model::SafetensorsWriter t;
    t.add_f32("model.embed_tokens.weight", DType::F32, {kVt, kH}, embed.data());
    t.add_f32("lm_head.weight", DType::F32, {kVt, kH}, head.data());
    t.write(target.file("model.safetensors"));
  }
  RefModel model() const { return RefModel(drafter.path(), target.path()); }
  Vec embed_row(int64_t token, double scale) const {
    Vec r(kH);
    for (int64_t i = 0; i < kH; ++i) r[i] = scale * embed[token * kH + i];
    return r;
  }
};

Vec rms(const Vec& x, const std::vector<float>& w) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + kEps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * x[i] * inv;
  return y;
}

Vec logits_of(const Vec& g, const std::vector<float>& head, double m_out, double cap) {
  Vec out(kV);
  for (int64_t v = 0; v < kV; ++v) {
    double acc = 0;
    for (int64_t i = 0; i < kH; ++i) acc += head[v * kH + i] * g[i];
    out[v] = m_out * acc;
    if (cap > 0) out[v] = cap * std::tanh(out[v] / cap);
  }
  return out;
}

void expect_near_all(const Vec& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << what << " [" << i << "]";
}

// Row r of the row-major matrix m with `width` columns.
Vec row_of(const Vec& m, int64_t r, int64_t width = kH) {
  return Vec(m.begin() + r * width, m.begin() + (r + 1) * width);
}

std::vector<double> tap_rows(int64_t n, uint32_t salt) {
  const std::vector<float> f = pattern(n * kH, salt);
  return Vec(f.begin(), f.end());
}

TEST(Reference, IdentityLayersGiveNormedEmbeddingsAndHeadLogits) {
  Weights w = base_weights(false);
  w["norm.weight"].data = {1.0f, 0.5f, 2.0f, 1.5f, 0.25f, 1.0f, 3.0f, 0.75f};
  const Fixture fx(config_text(false, "", R"(, "input_embedding_scale": 2.0, "output_multiplier": 0.5,
      "final_logit_softcapping": 3.0)"), w);
  const RefModel m = fx.model();
  RefContext ctx;
  m.settle(ctx, 0, tap_rows(4, 7), 4);
  ASSERT_EQ(ctx.length(), 4);

  const int64_t anchor = 5;
  const RefDraft d = m.draft(ctx, anchor, RefSampling{});
  ASSERT_EQ(d.hidden.size(), static_cast<size_t>(kB * kH));
  ASSERT_EQ(d.logits.size(), static_cast<size_t>((kB - 1) * kV));
  for (int64_t r = 0; r < kB; ++r) {
    const Vec g = rms(fx.embed_row(r == 0 ? anchor : kMask, 2.0), w["norm.weight"].data);
    expect_near_all(row_of(d.hidden, r), g, 1e-12, "hidden");
    if (r == 0) continue;
    const Vec logits = logits_of(g, fx.head, 0.5, 3.0);
    expect_near_all(row_of(d.logits, r - 1, kV), logits, 1e-12, "logits");
    const int64_t best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(d.tokens[r - 1], best);
    EXPECT_EQ(d.probs[r - 1], 1.0);
  }
}

TEST(Reference, TiedOrMissingHeadUsesTheEmbedding) {
  Fixture fx(config_text(false, "", ""), base_weights(false));
  tpdraft::testing::write_text(fx.target.file("config.json"), R"({"tie_word_embeddings": true})");
  const RefModel m = fx.model();
  const RefDraft d = m.draft(RefContext{}, 3, RefSampling{});
  const Vec g = rms(fx.embed_row(kMask, 1.0), std::vector<float>(kH, 1.0f));
  expect_near_all(row_of(d.logits, 0, kV), logits_of(g, fx.embed, 1.0, 0.0), 1e-12, "tied");
}

TEST(Reference, GreedyTiesGoToTheLowerId) {
  const Fixture plain(config_text(false, "", ""), base_weights(false));
  std::vector<float> head = plain.head;
  const Vec logits = logits_of(rms(plain.embed_row(kMask, 1.0), std::vector<float>(kH, 1.0f)), head, 1.0, 0.0);
  const int64_t best = std::max_element(logits.begin(), logits.end()) - logits.begin();
  const int64_t twin = best == 0 ? 6 : best - 1;  // a second row with the same, highest logit
  std::copy(head.begin() + best * kH, head.begin() + (best + 1) * kH, head.begin() + twin * kH);
  const Fixture fx(config_text(false, "", ""), base_weights(false), head);
  const RefDraft d = fx.model().draft(RefContext{}, 0, RefSampling{});
  EXPECT_EQ(d.tokens[0], std::min(best, twin));
  EXPECT_EQ(d.tokens[1], std::min(best, twin));
}

// q = k = 0 makes every visible key score 0, so attention is the mean of the visible values;
// v_proj keeps x[0..4) and o_proj = identity, so h_r gains [mean, mean] (both heads read kv 0).
struct Visibility {
  std::string name;
  std::string top_extra;
  bool causal;
  int64_t window;  // 0: full
};

class UniformAttention : public ::testing::TestWithParam<Visibility> {};

TEST_P(UniformAttention, AveragesTheVisibleValues) {
  const Visibility vis = GetParam();
  Weights w = base_weights(false);
  put(w, "layers.0.self_attn.v_proj.weight", {kNk * kD, kH}, identity(kD, kH));
  put(w, "layers.0.self_attn.o_proj.weight", {kH, kNq * kD}, identity(kH, kH));
  const Fixture fx(config_text(false, vis.top_extra, ""), w);
  const RefModel m = fx.model();

  // Settle 5 rows in two pieces with a rollback in between: rows 3, 4 are written twice.
  const int64_t a = 5;
  const Vec u = tap_rows(a, 11);
  RefContext ctx;
  m.settle(ctx, 0, tap_rows(4, 99), 4);
  m.settle(ctx, 0, Vec(u.begin(), u.begin() + 3 * kH), 3);
  m.settle(ctx, 3, Vec(u.begin() + 3 * kH, u.end()), 2);
  ASSERT_EQ(ctx.length(), a);
  EXPECT_THROW(m.settle(ctx, a + 1, tap_rows(1, 3), 1), tpdraft::Error);

  const std::vector<float> ones(kH, 1.0f);
  std::vector<Vec> values;  // by position: context rows then block rows
  for (int64_t p = 0; p < a; ++p) {
    const Vec c = rms(row_of(u, p), ones);
    values.emplace_back(c.begin(), c.begin() + kD);
  }
  const int64_t anchor = 2;
  std::vector<Vec> h(kB);
  for (int64_t r = 0; r < kB; ++r) {
    h[r] = fx.embed_row(r == 0 ? anchor : kMask, 1.0);
    const Vec x = rms(h[r], ones);
    values.emplace_back(x.begin(), x.begin() + kD);
  }
  const RefDraft d = m.draft(ctx, anchor, RefSampling{});
  for (int64_t r = 0; r < kB; ++r) {
    const int64_t q = a + r;
    Vec mean(kD, 0.0);
    int count = 0;
    for (int64_t k = 0; k < a + kB; ++k) {
      if (vis.causal && k > q) continue;
      if (vis.window > 0 && (q - k >= vis.window || (!vis.causal && k - q >= vis.window))) continue;
      for (int64_t i = 0; i < kD; ++i) mean[i] += values[k][i];
      ++count;
    }
    Vec out = h[r];
    for (int64_t i = 0; i < kH; ++i) out[i] += mean[i % kD] / count;
    expect_near_all(row_of(d.hidden, r), rms(out, ones), 1e-12, "row " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Reference, UniformAttention,
    ::testing::Values(Visibility{"full", "", false, 0}, Visibility{"causal", R"(, "is_causal": true)", true, 0},
                      Visibility{"sliding", R"(, "layer_types": ["sliding_attention"], "sliding_window": 2,
                                 "is_causal": false)", false, 2},
                      Visibility{"sliding_causal", R"(, "layer_types": ["sliding_attention"], "sliding_window": 2)",
                                 true, 2}),
    [](const ::testing::TestParamInfo<Visibility>& info) { return info.param.name; });

Vec affine(const Weights& w, const std::string& name, const Vec& x, bool bias) {
  const Tensor& wt = w.at(name + ".weight");
  const int64_t out = wt.shape[0], in = wt.shape[1];
  Vec y(out, 0.0);
  for (int64_t o = 0; o < out; ++o) {
    if (bias) y[o] = w.at(name + ".bias").data[o];
    for (int64_t i = 0; i < in; ++i) y[o] += wt.data[o * in + i] * x[i];
  }
  return y;
}

// RoPE(pos, per-head RMSNorm(W x + b; norm)) for `heads` heads of kD, written out for D = 4.
Vec rotated_heads(const Weights& w, const std::string& proj, const std::string& norm, int64_t heads, const Vec& x,
                  int64_t pos) {
  const Vec projected = affine(w, proj, x, true);
  const std::vector<float>& nw = w.at(norm).data;
  Vec out(heads * kD);
  for (int64_t h = 0; h < heads; ++h) {
    const Vec y = rms(row_of(projected, h, kD), nw);
    const double freq[2] = {1.0, 0.01};  // 10000^(-2i/4), i = 0, 1
    for (int64_t i = 0; i < 2; ++i) {
      const double c = std::cos(pos * freq[i]), s = std::sin(pos * freq[i]);
      out[h * kD + i] = y[i] * c - y[i + 2] * s;
      out[h * kD + i + 2] = y[i + 2] * c + y[i] * s;
    }
  }
  return out;
}

// Every weight random, biases on, two taps: settle's K/V and one whole full non-causal layer
// (RoPE'd q/k, softmax attention, o_proj, SwiGLU MLP) written out here for the 3 block rows.
TEST(Reference, WholeDFlashLayerWithBiasesAndTwoTaps) {
  Weights w = base_weights(false);
  uint32_t salt = 500;
  for (auto& [name, t] : w) {
    t.data = pattern(checked_numel(t.shape, "tensor '{}'", name), ++salt);
    if (name.find("norm") != std::string::npos)
      for (float& x : t.data) x = 1.0f + x / 2;  // keep norm weights away from zero
  }
  put(w, "fc.weight", {kH, 2 * kH}, pattern(2 * kH * kH, 600));
  for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    const std::string name = std::string("layers.0.self_attn.") + proj;
    put(w, name + ".bias", {w[name + ".weight"].shape[0]}, pattern(w[name + ".weight"].shape[0], ++salt));
  }
  const Fixture fx(config_text(false, R"(, "attention_bias": true)", "", "[1, 3]"), w);
  const RefModel m = fx.model();
  const int64_t a = 5, anchor = 9;
  const Vec u = tap_rows(2 * a, 17);  // [a, 2H]
  RefContext ctx;
  m.settle(ctx, 0, Vec(u.begin(), u.begin() + 3 * 2 * kH), 3);
  m.settle(ctx, 3, Vec(u.begin() + 3 * 2 * kH, u.end()), 2);
  ASSERT_EQ(ctx.length(), a);

  const std::string p = "layers.0.";
  std::vector<Vec> keys, values;
  for (int64_t q = 0; q < a; ++q) {
    const Vec c = rms(affine(w, "fc", row_of(u, q, 2 * kH), false), w["hidden_norm.weight"].data);
    keys.push_back(rotated_heads(w, p + "self_attn.k_proj", p + "self_attn.k_norm.weight", kNk, c, q));
    values.push_back(affine(w, p + "self_attn.v_proj", c, true));
    expect_near_all(ctx.k[0][q], keys.back(), 1e-12, "context K");
    expect_near_all(ctx.v[0][q], values.back(), 1e-12, "context V");
  }

  std::vector<Vec> h(kB), queries(kB);
  for (int64_t r = 0; r < kB; ++r) {
    h[r] = fx.embed_row(r == 0 ? anchor : kMask, 1.0);
    const Vec x = rms(h[r], w[p + "input_layernorm.weight"].data);
    queries[r] = rotated_heads(w, p + "self_attn.q_proj", p + "self_attn.q_norm.weight", kNq, x, a + r);
    keys.push_back(rotated_heads(w, p + "self_attn.k_proj", p + "self_attn.k_norm.weight", kNk, x, a + r));
    values.push_back(affine(w, p + "self_attn.v_proj", x, true));
  }
  const RefDraft d = m.draft(ctx, anchor, RefSampling{});
  for (int64_t r = 0; r < kB; ++r) {
    Vec attn(kNq * kD, 0.0);
    for (int64_t head = 0; head < kNq; ++head) {  // both query heads read kv head 0
      Vec e(keys.size());
      double z = 0;
      for (size_t k = 0; k < keys.size(); ++k) {
        double dot = 0;
        for (int64_t i = 0; i < kD; ++i) dot += queries[r][head * kD + i] * keys[k][i];
        e[k] = std::exp(dot / 2.0);  // 1 / sqrt(D)
        z += e[k];
      }
      for (size_t k = 0; k < keys.size(); ++k)
        for (int64_t i = 0; i < kD; ++i) attn[head * kD + i] += e[k] / z * values[k][i];
    }
    const Vec o = affine(w, p + "self_attn.o_proj", attn, true);
    for (int64_t i = 0; i < kH; ++i) h[r][i] += o[i];
    const Vec zr = rms(h[r], w[p + "post_attention_layernorm.weight"].data);
    const Vec gate = affine(w, p + "mlp.gate_proj", zr, false);
    Vec act = affine(w, p + "mlp.up_proj", zr, false);
    for (int64_t i = 0; i < kF; ++i) act[i] *= gate[i] / (1.0 + std::exp(-gate[i]));
    const Vec mlp = affine(w, p + "mlp.down_proj", act, false);
    for (int64_t i = 0; i < kH; ++i) h[r][i] += mlp[i];
    expect_near_all(row_of(d.hidden, r), rms(h[r], w["norm.weight"].data), 1e-11, "row " + std::to_string(r));
  }
}

TEST(Reference, DFlash2ConvolutionAndSelectorWalk) {
  Weights w = base_weights(true);
  const std::string p = "layers.0.";
  put(w, p + "self_attn.v_proj.weight", {kNk * kD, kH}, identity(kD, kH));
  put(w, p + "self_attn.o_proj.weight", {kH, kNq * kD}, identity(kH, kH));
  put(w, p + "attention_conv.base_kernel", {2, 2, kH}, pattern(2 * 2 * kH, 31));
  put(w, p + "attention_conv.kernel_projection.weight", {8, kH}, pattern(8 * kH, 32));
  put(w, p + "mlp_conv.base_kernel", {2, 2, kH}, pattern(2 * 2 * kH, 33));
  put(w, p + "mlp_conv.kernel_projection.weight", {8, kH}, pattern(8 * kH, 34));
  put(w, "candidate_selector.hidden_projection.weight", {3, kH}, pattern(3 * kH, 35));
  put(w, "candidate_selector.predecessor_codebook", {kV, 3}, pattern(kV * 3, 36));
  put(w, "candidate_selector.successor_codebook.weight", {kV, 3}, pattern(kV * 3, 37));
  const Fixture fx(config_text(true, "", ""), w);
  const RefModel m = fx.model();
  const int64_t a = 4, anchor = 7;
  const Vec u = tap_rows(a, 13);
  RefContext ctx;
  m.settle(ctx, 0, u, a);

  const std::vector<float> ones(kH, 1.0f);
  const std::vector<float>& base = w[p + "attention_conv.base_kernel"].data;
  // Conv with K = 2, G = 2, gs = 4: out_t = (β[s][0] + δ_t[s][0]) in_t + (β[s][1] + δ_t[s][1]) in_{t-1}.
  auto conv = [&](const std::vector<Vec>& in, const std::vector<Vec>& delta, int s) {
    std::vector<Vec> out(kB, Vec(kH, 0.0));
    for (int64_t t = 0; t < kB; ++t)
      for (int64_t c = 0; c < kH; ++c) {
        out[t][c] = (base[(s * 2 + 0) * kH + c] + delta[t][s * 4 + 0 * 2 + c / 4]) * in[t][c];
        if (t > 0) out[t][c] += (base[(s * 2 + 1) * kH + c] + delta[t][s * 4 + 1 * 2 + c / 4]) * in[t - 1][c];
      }
    return out;
  };
  std::vector<Vec> h(kB), x(kB), delta(kB);
  for (int64_t r = 0; r < kB; ++r) {
    h[r] = fx.embed_row(r == 0 ? anchor : kMask, 1.0);
    x[r] = rms(h[r], ones);
    delta[r] = affine(w, p + "attention_conv.kernel_projection", x[r], false);
  }
  const std::vector<Vec> xc = conv(x, delta, 0);
  Vec mean(kD, 0.0);  // full non-causal: every row sees all context and block values
  for (int64_t q = 0; q < a; ++q) {
    const Vec c = rms(row_of(u, q), ones);
    for (int64_t i = 0; i < kD; ++i) mean[i] += c[i] / (a + kB);
  }
  for (int64_t r = 0; r < kB; ++r)
    for (int64_t i = 0; i < kD; ++i) mean[i] += xc[r][i] / (a + kB);
  std::vector<Vec> o(kB, Vec(kH));
  for (int64_t r = 0; r < kB; ++r)
    for (int64_t i = 0; i < kH; ++i) o[r][i] = mean[i % kD];
  const std::vector<Vec> oc = conv(o, delta, 1);

  const RefDraft d = m.draft(ctx, anchor, RefSampling{});
  std::vector<Vec> g(kB);
  for (int64_t r = 0; r < kB; ++r) {
    for (int64_t i = 0; i < kH; ++i) h[r][i] += oc[r][i];  // the MLP sees zero weights: adds 0
    g[r] = rms(h[r], ones);
    expect_near_all(row_of(d.hidden, r), g[r], 1e-12, "hidden");
  }

  // The selector walk, greedy, then sampled; the expected scores computed here.
  const std::vector<float>& pc = w["candidate_selector.predecessor_codebook"].data;
  const std::vector<float>& sc = w["candidate_selector.successor_codebook.weight"].data;
  auto walk = [&](double temp, uint64_t seed) {
    RefDraft want;  // its tokens and probs
    int64_t prev = anchor;
    for (int64_t r = 1; r < kB; ++r) {
      const Vec logits = logits_of(g[r], fx.head, 1.0, 0.0);
      std::vector<int64_t> ids = tpdraft::testing::ids_by_value(logits.data(), kV);
      ids.resize(4);
      const Vec s = affine(w, "candidate_selector.hidden_projection", g[r], false);
      Vec score(4);
      for (int64_t c = 0; c < 4; ++c) {
        score[c] = logits[ids[c]];
        for (int64_t k = 0; k < 3; ++k) score[c] += pc[prev * 3 + k] * s[k] * sc[ids[c] * 3 + k];
      }
      int64_t pick = 0;
      double best = -INFINITY, z = 0;
      for (int64_t c = 0; c < 4; ++c) {
        const double val = temp == 0 ? score[c] : score[c] / temp - std::log(-std::log(ref_uniform(seed, r, ids[c])));
        if (val > best) {
          best = val;
          pick = c;
        }
        if (temp > 0) z += std::exp(score[c] / temp);
      }
      want.tokens.push_back(ids[pick]);
      want.probs.push_back(temp == 0 ? 1.0 : std::exp(score[pick] / temp) / z);
      prev = ids[pick];
    }
    return want;
  };
  EXPECT_EQ(d.tokens, walk(0.0, 0).tokens);
  for (int64_t seed : {1, 2, 3}) {
    const RefDraft want = walk(0.8, seed);
    const RefDraft ds = m.draft(ctx, anchor, RefSampling{0.8, 0, 1.0, static_cast<uint64_t>(seed)});
    EXPECT_EQ(ds.tokens, want.tokens) << "seed " << seed;
    expect_near_all(ds.probs, want.probs, 1e-12, "probs");
  }
  EXPECT_THROW(m.draft(ctx, anchor, RefSampling{0.8, 2, 1.0, 0}), tpdraft::Error);
  EXPECT_THROW(m.draft(ctx, anchor, RefSampling{0.8, 0, 0.9, 0}), tpdraft::Error);
}

TEST(Reference, UniformIsTheDocumentedCounterHash) {
  // The first output of the standard splitmix64 generator seeded with 0 pins the finaliser.
  EXPECT_EQ(splitmix64(0), 0xE220A8397B1DCDAFULL);
  double sum = 0;
  for (uint64_t id = 0; id < 2000; ++id) {
    const double u = ref_uniform(42, 3, id);
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
    EXPECT_EQ(u, ref_uniform(42, 3, id));
    EXPECT_NE(u, ref_uniform(42, 3, id + 1));
    EXPECT_NE(u, ref_uniform(42, 4, id));
    EXPECT_NE(u, ref_uniform(43, 3, id));
    const uint64_t hsh = splitmix64(splitmix64(splitmix64(42) ^ 3) ^ id);
    EXPECT_EQ(u, (static_cast<double>(hsh >> 11) + 0.5) / 9007199254740992.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 2000, 0.5, 0.03);
}

// DFlash sampling with identity layers: the logits are known, so the kept set, the Gumbel-max pick
// and q_r(pick) are computed here from docs/sampling.md.
TEST(Reference, SamplingReportsTheSoftmaxOfTheKeptSet) {
  const Fixture fx(config_text(false, "", ""), base_weights(false));
  const RefModel m = fx.model();
  const int64_t anchor = 1;
  const double temp = 0.7;
  // Every drafted row is a mask row through identity layers: one set of logits for all of them.
  const Vec logits = logits_of(rms(fx.embed_row(kMask, 1.0), std::vector<float>(kH, 1.0f)), fx.head, 1.0, 0.0);
  struct Case {
    int64_t top_k;
    double top_p;
  };
  for (const Case cs : {Case{0, 1.0}, Case{4, 1.0}, Case{0, 0.5}, Case{6, 0.8}}) {
    const std::vector<int64_t> kept = tpdraft::testing::documented_kept_set(logits, temp, cs.top_k, cs.top_p);
    const Vec q = tpdraft::testing::softmax_over(logits, kept, temp);
    for (uint64_t seed : {0u, 5u, 77u}) {
      const RefDraft d = m.draft(RefContext{}, anchor, RefSampling{temp, cs.top_k, cs.top_p, seed});
      for (int64_t r = 1; r < kB; ++r) {
        int64_t pick = -1;
        double best = -INFINITY;
        for (int64_t v : kept) {
          const double val = logits[v] / temp - std::log(-std::log(ref_uniform(seed, r, v)));
          if (val > best) {
            best = val;
            pick = v;
          }
        }
        EXPECT_EQ(d.tokens[r - 1], pick) << "top_k " << cs.top_k << " top_p " << cs.top_p << " seed " << seed;
        EXPECT_NEAR(d.probs[r - 1], q[pick], 1e-12);
      }
    }
  }
}

TEST(Reference, RejectsBadInput) {
  const Fixture fx(config_text(false, "", ""), base_weights(false));
  const RefModel m = fx.model();
  EXPECT_THROW(m.draft(RefContext{}, kV, RefSampling{}), tpdraft::Error);
  EXPECT_THROW(m.draft(RefContext{}, 0, RefSampling{-1.0, 0, 1.0, 0}), tpdraft::Error);
  RefContext ctx;
  EXPECT_THROW(m.settle(ctx, 0, tap_rows(2, 1), 3), tpdraft::Error);

  Weights w = base_weights(false);
  put(w, "layers.0.mlp.up_proj.weight", {kF, kH + 1});
  const Fixture bad(config_text(false, "", ""), w);
  EXPECT_THROW(bad.model(), tpdraft::Error);
}

}  // namespace
}  // namespace tpdraft::reference
