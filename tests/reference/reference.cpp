// The float64 reference drafter: settle and the block forward of docs/model.md, and the choice
// of draft tokens of docs/sampling.md, written as plain double loops. It shares
// nothing with the fast path but the config and checkpoint readers, so a slip there cannot hide
// by being repeated here. Clarity over speed: every vector is a fresh std::vector.
#include "reference/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace tpdraft::reference {
namespace {

using Vec = std::vector<double>;
using Rows = std::vector<Vec>;

std::string layer_name(int64_t l, const std::string& rest) { return "layers." + std::to_string(l) + "." + rest; }

// w ⊙ x · (mean(x²) + eps)^(-1/2) over x[0 .. n).
Vec rms_norm(const double* x, int64_t n, const Vec& w, double eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  Vec y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * x[i] * inv;
  return y;
}

// Per-head RMSNorm over D, then NeoX rotate-half RoPE at `pos` over the whole head.
void norm_rope_heads(Vec& x, int64_t heads, int64_t d, const Vec& w, double eps, int64_t pos, double theta) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const Vec normed = rms_norm(x.data() + h * d, d, w, eps);
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      const double angle = static_cast<double>(pos) * inv_freq;
      const double c = std::cos(angle), s = std::sin(angle);
      const double x0 = normed[i], x1 = normed[i + half];
      x[h * d + i] = x0 * c - x1 * s;
      x[h * d + i + half] = x1 * c + x0 * s;
    }
  }
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// docs/model.md: out_t[c] = Σ_j (base[side][j][c] + δ_t[side][j][c / gs]) · in_{t-j}[c], block-local.
Rows conv(const Rows& in, const Vec& base, const Rows& delta, int64_t side, int64_t k, int64_t gs) {
  const int64_t rows = static_cast<int64_t>(in.size());
  const int64_t h = static_cast<int64_t>(in[0].size());
  const int64_t g = h / gs;
  Rows out(static_cast<size_t>(rows), Vec(static_cast<size_t>(h), 0.0));
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t c = 0; c < h; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < k && t - j >= 0; ++j) {
        const double coef = base[(side * k + j) * h + c] + delta[t][(side * k + j) * g + c / gs];
        acc += coef * in[t - j][c];
      }
      out[t][c] = acc;
    }
  }
  return out;
}

// Whether the query at position q sees the key at position k (docs/model.md).
bool visible(int64_t q, int64_t k, bool causal, bool sliding, int64_t window) {
  if (causal && k > q) return false;
  if (sliding) {
    if (q - k >= window) return false;
    if (!causal && k - q >= window) return false;
  }
  return true;
}

double gumbel(uint64_t seed, int64_t row, int64_t id) {
  return -std::log(-std::log(ref_uniform(seed, static_cast<uint64_t>(row), static_cast<uint64_t>(id))));
}

// Token ids ordered by logit descending, then id ascending.
std::vector<int64_t> order_by_logit(const double* logits, int64_t v) {
  std::vector<int64_t> ids(static_cast<size_t>(v));
  for (int64_t i = 0; i < v; ++i) ids[i] = i;
  std::sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  return ids;
}

// softmax(values / t), in the order given.
Vec softmax_scaled(const Vec& values, double t) {
  double mx = -std::numeric_limits<double>::infinity();
  for (double x : values) mx = std::max(mx, x / t);
  Vec p(values.size());
  double sum = 0.0;
  for (size_t i = 0; i < values.size(); ++i) {
    p[i] = std::exp(values[i] / t - mx);
    sum += p[i];
  }
  for (double& x : p) x /= sum;
  return p;
}

// docs/sampling.md, DFlash: the kept set (top_k, then top_p), the Gumbel-max pick, q_r(pick).
void sample_dflash(const double* logits, int64_t v, int64_t row, const RefSampling& s, int64_t* token, double* prob) {
  std::vector<int64_t> kept = order_by_logit(logits, v);
  if (s.top_k > 0 && s.top_k < v) kept.resize(static_cast<size_t>(s.top_k));
  Vec vals;
  for (int64_t id : kept) vals.push_back(logits[id]);
  if (s.top_p < 1.0) {
    const Vec p = softmax_scaled(vals, s.temperature);
    double cum = 0.0;
    size_t n = 0;
    while (n < kept.size()) {
      cum += p[n++];
      if (cum >= s.top_p) break;
    }
    kept.resize(n);
    vals.resize(n);
  }
  const Vec q = softmax_scaled(vals, s.temperature);
  size_t best = 0;
  double best_val = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < kept.size(); ++i) {
    const double val = logits[kept[i]] / s.temperature + gumbel(s.seed, row, kept[i]);
    if (val > best_val || (val == best_val && kept[i] < kept[best])) {
      best_val = val;
      best = i;
    }
  }
  *token = kept[best];
  *prob = q[best];
}

}  // namespace

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

double ref_uniform(uint64_t seed, uint64_t row, uint64_t id) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ row) ^ id);
  return (static_cast<double>(h >> 11) + 0.5) / 9007199254740992.0;  // 2^53
}

namespace {

// A quantized matrix as float64, read straight from the compressed-tensors tensors: the bits from
// the packed row width, the group from the scale's shape (docs/quantization.md), w = q * scale.
std::vector<double> dequantize(const model::TensorStore& store, const std::string& name,
                               const std::vector<int64_t>& shape) {
  const int64_t n = shape[0], k = shape[1];
  const model::TensorInfo* scale_t = store.find(name + "_scale");
  if (scale_t == nullptr) throw std::runtime_error("reference: " + name + "_scale missing");
  const std::vector<double> scale = model::to_f64(*scale_t);
  const int64_t per_row = scale.size() == 1 ? 0 : static_cast<int64_t>(scale.size()) / n;  // 0: one scale
  auto scale_of = [&](int64_t r, int64_t c) {
    if (per_row == 0) return scale[0];
    return scale[static_cast<size_t>(r * per_row + c / (k / per_row))];
  };
  std::vector<double> out(static_cast<size_t>(n * k));
  if (const model::TensorInfo* packed = store.find(name + "_packed")) {
    const int64_t words = packed->shape[1];
    const int bits = words == (k + 7) / 8 ? 4 : 8;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const int64_t bit = c * bits;
        uint32_t word;
        std::memcpy(&word, packed->data + 4 * (r * words + bit / 32), 4);
        const int64_t u = (word >> (bit % 32)) & ((1u << bits) - 1);
        out[static_cast<size_t>(r * k + c)] = static_cast<double>(u - (int64_t{1} << (bits - 1))) * scale_of(r, c);
      }
    return out;
  }
  const std::vector<double> w = model::to_f64(*store.find(name));  // FP8, widened exactly
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) out[static_cast<size_t>(r * k + c)] = w[static_cast<size_t>(r * k + c)] * scale_of(r, c);
  return out;
}

}  // namespace

RefModel::RefModel(const std::string& drafter_dir, const std::string& target_dir, const std::vector<int64_t>& token_map) {
  cfg_ = model::DrafterConfig::from_file(drafter_dir + "/config.json");
  const model::DrafterConfig& c = cfg_;
  const int64_t H = c.hidden, D = c.head_dim, Nq = c.n_q, Nk = c.n_kv, F = c.ffn, V = c.vocab;
  auto store = model::TensorStore::open(drafter_dir);

  // Loads `name` (found under `file_name` in the checkpoint) with exactly `shape`.
  auto load_as = [&](const std::string& name, const std::string& file_name, const std::vector<int64_t>& shape) {
    Tensor t;
    t.shape = shape;
    const bool quantized = store->find(file_name + "_packed") || store->find(file_name + "_scale");
    t.data = quantized ? dequantize(*store, file_name, shape) : model::to_f64(store->require(file_name, shape));
    weights_.emplace_back(name, std::move(t));
  };
  auto load = [&](const std::string& name, const std::vector<int64_t>& shape) { load_as(name, name, shape); };

  load("fc.weight", {H, c.n_taps() * H});
  load("hidden_norm.weight", {H});
  load("norm.weight", {H});
  for (int64_t l = 0; l < c.layers; ++l) {
    load(layer_name(l, "input_layernorm.weight"), {H});
    load(layer_name(l, "post_attention_layernorm.weight"), {H});
    const std::vector<std::pair<std::string, std::vector<int64_t>>> attn = {
        {"q_proj", {Nq * D, H}}, {"k_proj", {Nk * D, H}}, {"v_proj", {Nk * D, H}}, {"o_proj", {H, Nq * D}}};
    for (const auto& [proj, shape] : attn) {
      load(layer_name(l, "self_attn." + proj + ".weight"), shape);
      if (c.bias) load(layer_name(l, "self_attn." + proj + ".bias"), {shape[0]});
    }
    load(layer_name(l, "self_attn.q_norm.weight"), {D});
    load(layer_name(l, "self_attn.k_norm.weight"), {D});
    load(layer_name(l, "mlp.gate_proj.weight"), {F, H});
    load(layer_name(l, "mlp.up_proj.weight"), {F, H});
    load(layer_name(l, "mlp.down_proj.weight"), {H, F});
    if (c.is_dflash2()) {
      const int64_t K = c.conv_kernel, G = c.conv_groups();
      for (const char* conv_name : {"attention_conv", "mlp_conv"}) {
        load(layer_name(l, std::string(conv_name) + ".base_kernel"), {2, K, H});
        load(layer_name(l, std::string(conv_name) + ".kernel_projection.weight"), {2 * K * G, H});
      }
    }
  }
  if (c.is_dflash2()) {
    const int64_t R = c.selector_rank;
    load("candidate_selector.hidden_projection.weight", {R, H});
    for (const char* book : {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"}) {
      const std::string name = book;
      const bool plain = store->find(name) != nullptr;
      load_as(name, plain ? name : name + ".weight", {V, R});
    }
  }

  // The embedding and the head, widened exactly via f32: the target's first V rows, or those a
  // speculators drafter ships (its own embedding [V, H]; its reduced head [N, H] with d2t).
  auto target = model::TensorStore::open(target_dir);
  const model::TargetConfig tcfg = model::TargetConfig::from_dir(target_dir);
  auto first_rows = [&](const model::TensorStore& from, const std::string& name, int64_t rows) {
    const model::TensorInfo* info = from.find(name);
    TPDRAFT_CHECK(info != nullptr, "{}: tensor '{}' not found", from.source(), name);
    TPDRAFT_CHECK(info->shape.size() == 2 && info->shape[1] == H && info->shape[0] >= rows,
                  "{}: tensor '{}' has shape {}, expected [>= {}, {}]", from.source(), name, info->shape_str(), rows, H);
    const model::TensorInfo& t = from.require(name, info->shape);  // also rejects non-float dtypes
    std::vector<float> out(static_cast<size_t>(rows * H));
    model::copy_rows(t, 0, rows, DType::F32, out.data());
    return Vec(out.begin(), out.end());
  };
  const bool spec = c.layout == model::Layout::Speculators;
  const bool own_embed = spec && store->find("embed_tokens.weight") != nullptr;
  const bool own_head = spec && store->find("lm_head.weight") != nullptr;
  embed_ = own_embed ? first_rows(*store, "embed_tokens.weight", V) : first_rows(*target, "embed_tokens.weight", V);
  const bool tied = tcfg.tie_word_embeddings || target->find("lm_head.weight") == nullptr;
  const std::string target_head = tied ? "embed_tokens.weight" : "lm_head.weight";
  head_row_.assign(static_cast<size_t>(V), -1);
  if (spec && c.draft_vocab > 0) {
    // d2t: draft row i scores target id i + d2t[i]; the head is the drafter's [N, H] or the
    // target's rows of those ids.
    const model::TensorInfo* d2t = store->find("d2t");
    TPDRAFT_CHECK(d2t != nullptr && d2t->dtype == DType::I64 && d2t->numel() == c.draft_vocab,
                  "reference: {} needs d2t I64 [{}]", drafter_dir, c.draft_vocab);
    for (int64_t i = 0; i < c.draft_vocab; ++i) {
      int64_t offset = 0;
      std::memcpy(&offset, d2t->data + i * 8, 8);
      head_row_[static_cast<size_t>(i + offset)] = own_head ? i : i + offset;
    }
    head_ = own_head ? first_rows(*store, "lm_head.weight", c.draft_vocab) : first_rows(*target, target_head, V);
  } else {
    for (int64_t t = 0; t < V; ++t) head_row_[static_cast<size_t>(t)] = t;
    head_ = own_head ? first_rows(*store, "lm_head.weight", V) : first_rows(*target, target_head, V);
  }
  if (!token_map.empty()) {
    TPDRAFT_CHECK(c.draft_vocab == 0, "reference: a token map applies to a full head");
    std::vector<int64_t> kept(static_cast<size_t>(V), -1);
    for (int64_t t : token_map) kept[static_cast<size_t>(t)] = head_row_[static_cast<size_t>(t)];
    head_row_ = kept;
  }
}

const RefModel::Tensor& RefModel::w(const std::string& name) const {
  for (const auto& [n, t] : weights_)
    if (n == name) return t;
  TPDRAFT_FAIL("reference: tensor '{}' was not loaded", name);
}

std::vector<double> RefModel::linear(const std::string& name, const std::vector<double>& x, bool bias) const {
  const Tensor& wt = w(name + ".weight");
  const int64_t out = wt.shape[0], in = wt.shape[1];
  TPDRAFT_CHECK(static_cast<int64_t>(x.size()) == in, "reference: '{}' expects {} inputs, got {}", name, in,
                x.size());
  Vec y(static_cast<size_t>(out), 0.0);
  for (int64_t o = 0; o < out; ++o) {
    double acc = 0.0;
    for (int64_t i = 0; i < in; ++i) acc += wt.data[o * in + i] * x[i];
    y[o] = acc;
  }
  if (bias && cfg_.bias) {
    const Vec& b = w(name + ".bias").data;
    for (int64_t o = 0; o < out; ++o) y[o] += b[o];
  }
  return y;
}

void RefModel::settle(RefContext& ctx, int64_t p0, const std::vector<double>& u, int64_t n) const {
  const model::DrafterConfig& c = cfg_;
  const int64_t th = c.n_taps() * c.hidden;
  TPDRAFT_CHECK(n >= 0 && static_cast<int64_t>(u.size()) == n * th,
                "reference settle: got {} values for {} rows, expected rows x T*H = {} x {}", u.size(), n, n, th);
  TPDRAFT_CHECK(p0 >= 0 && p0 <= ctx.length(), "reference settle: p0 = {} lies beyond the context length {}", p0,
                ctx.length());
  ctx.k.resize(static_cast<size_t>(c.layers));
  ctx.v.resize(static_cast<size_t>(c.layers));
  for (int64_t l = 0; l < c.layers; ++l) {
    ctx.k[l].resize(static_cast<size_t>(p0));
    ctx.v[l].resize(static_cast<size_t>(p0));
  }
  for (int64_t j = 0; j < n; ++j) {
    const Vec row(u.begin() + j * th, u.begin() + (j + 1) * th);
    const Vec fused = linear("fc", row, false);
    const Vec cj = rms_norm(fused.data(), c.hidden, w("hidden_norm.weight").data, c.eps);
    for (int64_t l = 0; l < c.layers; ++l) {
      Vec k = linear(layer_name(l, "self_attn.k_proj"), cj, true);
      norm_rope_heads(k, c.n_kv, c.head_dim, w(layer_name(l, "self_attn.k_norm.weight")).data, c.eps, p0 + j,
                      c.rope_theta);
      ctx.k[l].push_back(std::move(k));
      ctx.v[l].push_back(linear(layer_name(l, "self_attn.v_proj"), cj, true));
    }
  }
}

std::vector<std::vector<double>> RefModel::attention(int64_t l, const RefContext& ctx, const Rows& x) const {
  const model::DrafterConfig& c = cfg_;
  const int64_t B = static_cast<int64_t>(x.size()), D = c.head_dim, a = ctx.length();
  const bool causal = c.causal[l], sliding = c.sliding[l];
  Rows q(B), k(B), v(B);
  for (int64_t r = 0; r < B; ++r) {
    q[r] = linear(layer_name(l, "self_attn.q_proj"), x[r], true);
    norm_rope_heads(q[r], c.n_q, D, w(layer_name(l, "self_attn.q_norm.weight")).data, c.eps, a + r, c.rope_theta);
    k[r] = linear(layer_name(l, "self_attn.k_proj"), x[r], true);
    norm_rope_heads(k[r], c.n_kv, D, w(layer_name(l, "self_attn.k_norm.weight")).data, c.eps, a + r, c.rope_theta);
    v[r] = linear(layer_name(l, "self_attn.v_proj"), x[r], true);
  }
  // Keys: context positions 0 .. a-1 of this layer, then the block rows at a .. a+B-1.
  std::vector<const Vec*> keys, values;
  for (int64_t p = 0; p < a; ++p) {
    keys.push_back(&ctx.k[l][p]);
    values.push_back(&ctx.v[l][p]);
  }
  for (int64_t r = 0; r < B; ++r) {
    keys.push_back(&k[r]);
    values.push_back(&v[r]);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Rows out(B, Vec(static_cast<size_t>(c.n_q * D), 0.0));
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t h = 0; h < c.n_q; ++h) {
      const int64_t kvh = h * c.n_kv / c.n_q;
      std::vector<int64_t> seen;
      Vec scores;
      for (int64_t p = 0; p < static_cast<int64_t>(keys.size()); ++p) {
        if (!visible(a + r, p, causal, sliding, c.window)) continue;
        double dot = 0.0;
        for (int64_t i = 0; i < D; ++i) dot += q[r][h * D + i] * (*keys[p])[kvh * D + i];
        seen.push_back(p);
        scores.push_back(dot * scale);
      }
      const Vec prob = softmax_scaled(scores, 1.0);
      for (size_t s = 0; s < seen.size(); ++s)
        for (int64_t i = 0; i < D; ++i) out[r][h * D + i] += prob[s] * (*values[seen[s]])[kvh * D + i];
    }
  }
  return out;
}

void RefModel::layer(int64_t l, const RefContext& ctx, Rows& h) const {
  const model::DrafterConfig& c = cfg_;
  const int64_t B = static_cast<int64_t>(h.size()), H = c.hidden, K = c.conv_kernel, gs = c.conv_group;
  const bool d2 = c.is_dflash2();

  Rows x(B), delta(B);
  for (int64_t r = 0; r < B; ++r) {
    x[r] = rms_norm(h[r].data(), H, w(layer_name(l, "input_layernorm.weight")).data, c.eps);
    if (d2) delta[r] = linear(layer_name(l, "attention_conv.kernel_projection"), x[r], false);
  }
  if (d2) x = conv(x, w(layer_name(l, "attention_conv.base_kernel")).data, delta, 0, K, gs);
  const Rows attn = attention(l, ctx, x);
  Rows o(B);
  for (int64_t r = 0; r < B; ++r) o[r] = linear(layer_name(l, "self_attn.o_proj"), attn[r], true);
  if (d2) o = conv(o, w(layer_name(l, "attention_conv.base_kernel")).data, delta, 1, K, gs);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t i = 0; i < H; ++i) h[r][i] += o[r][i];

  Rows z(B), delta2(B);
  for (int64_t r = 0; r < B; ++r) {
    z[r] = rms_norm(h[r].data(), H, w(layer_name(l, "post_attention_layernorm.weight")).data, c.eps);
    if (d2) delta2[r] = linear(layer_name(l, "mlp_conv.kernel_projection"), z[r], false);
  }
  if (d2) z = conv(z, w(layer_name(l, "mlp_conv.base_kernel")).data, delta2, 0, K, gs);
  Rows m(B);
  for (int64_t r = 0; r < B; ++r) {
    const Vec gate = linear(layer_name(l, "mlp.gate_proj"), z[r], false);
    Vec act = linear(layer_name(l, "mlp.up_proj"), z[r], false);
    for (size_t i = 0; i < act.size(); ++i) act[i] *= silu(gate[i]);
    m[r] = linear(layer_name(l, "mlp.down_proj"), act, false);
  }
  if (d2) m = conv(m, w(layer_name(l, "mlp_conv.base_kernel")).data, delta2, 1, K, gs);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t i = 0; i < H; ++i) h[r][i] += m[r][i];
}

RefDraft RefModel::draft(const RefContext& ctx, int64_t anchor_token, const RefSampling& sampling) const {
  const model::DrafterConfig& c = cfg_;
  const int64_t B = c.block, H = c.hidden, V = c.vocab;
  TPDRAFT_CHECK(ctx.k.empty() || (static_cast<int64_t>(ctx.k.size()) == c.layers && ctx.v.size() == ctx.k.size()),
                "reference draft: context holds {} layers, expected {}", ctx.k.size(), c.layers);
  TPDRAFT_CHECK(anchor_token >= 0 && anchor_token < V, "reference draft: anchor token {} outside [0, {})",
                anchor_token, V);
  TPDRAFT_CHECK(sampling.temperature >= 0.0, "reference draft: temperature {} must be >= 0", sampling.temperature);
  TPDRAFT_CHECK(sampling.top_k >= 0, "reference draft: top_k {} must be >= 0", sampling.top_k);
  TPDRAFT_CHECK(sampling.top_p > 0.0 && sampling.top_p <= 1.0, "reference draft: top_p {} must lie in (0, 1]",
                sampling.top_p);
  TPDRAFT_CHECK(!c.is_dflash2() || (sampling.top_k == 0 && sampling.top_p == 1.0),
                "reference draft: top_k / top_p do not apply to the DFlash 2 selector walk");

  Rows h(B);
  for (int64_t r = 0; r < B; ++r) {
    const int64_t token = r == 0 ? anchor_token : c.mask_token;
    h[r].assign(embed_.begin() + token * H, embed_.begin() + (token + 1) * H);
    for (double& x : h[r]) x *= c.in_scale;
  }
  for (int64_t l = 0; l < c.layers; ++l) layer(l, ctx, h);  // an empty context has length 0

  RefDraft d;
  for (int64_t r = 0; r < B; ++r) {
    const Vec g = rms_norm(h[r].data(), H, w("norm.weight").data, c.eps);
    d.hidden.insert(d.hidden.end(), g.begin(), g.end());
  }
  d.logits.assign(static_cast<size_t>((B - 1) * V), -std::numeric_limits<double>::infinity());
  for (int64_t r = 1; r < B; ++r) {
    const double* g = d.hidden.data() + r * H;
    for (int64_t t = 0; t < V; ++t) {
      const int64_t row = head_row_[static_cast<size_t>(t)];
      if (row < 0) continue;  // outside the draft vocabulary
      double acc = 0.0;
      for (int64_t i = 0; i < H; ++i) acc += head_[row * H + i] * g[i];
      double logit = c.out_scale * acc;
      if (c.softcap > 0) logit = c.softcap * std::tanh(logit / c.softcap);
      d.logits[(r - 1) * V + t] = logit;
    }
  }
  choose(d, anchor_token, sampling);
  return d;
}

void RefModel::choose(RefDraft& d, int64_t anchor, const RefSampling& s) const {
  const model::DrafterConfig& c = cfg_;
  const int64_t B = c.block, H = c.hidden, V = c.vocab;
  d.tokens.assign(static_cast<size_t>(B - 1), 0);
  d.probs.assign(static_cast<size_t>(B - 1), 1.0);
  const bool greedy = s.temperature == 0.0;

  if (!c.is_dflash2()) {
    for (int64_t r = 1; r < B; ++r) {
      const double* logits = d.logits.data() + (r - 1) * V;
      if (greedy) {
        d.tokens[r - 1] = std::max_element(logits, logits + V) - logits;  // ties: the lowest id
      } else {
        sample_dflash(logits, V, r, s, &d.tokens[r - 1], &d.probs[r - 1]);
      }
    }
    return;
  }

  // DFlash 2: the selector walk, left to right, prev = the previous row's pick.
  const int64_t R = c.selector_rank, ktop = std::min(c.selector_topk, V);
  const Vec& pred = w("candidate_selector.predecessor_codebook").data;
  const Vec& succ = w("candidate_selector.successor_codebook").data;
  int64_t prev = anchor;
  for (int64_t r = 1; r < B; ++r) {
    const double* logits = d.logits.data() + (r - 1) * V;
    std::vector<int64_t> cand = order_by_logit(logits, V);
    cand.resize(static_cast<size_t>(ktop));
    const Vec g(d.hidden.begin() + r * H, d.hidden.begin() + (r + 1) * H);
    const Vec sr = linear("candidate_selector.hidden_projection", g, false);
    Vec score(cand.size());
    for (size_t i = 0; i < cand.size(); ++i) {
      double pair = 0.0;
      for (int64_t k = 0; k < R; ++k) pair += pred[prev * R + k] * sr[k] * succ[cand[i] * R + k];
      score[i] = logits[cand[i]] + pair;
    }
    size_t pick = 0;
    if (greedy) {
      pick = static_cast<size_t>(std::max_element(score.begin(), score.end()) - score.begin());
    } else {
      double best = -std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < cand.size(); ++i) {
        const double val = score[i] / s.temperature + gumbel(s.seed, r, cand[i]);
        if (val > best) {
          best = val;
          pick = i;
        }
      }
      d.probs[r - 1] = softmax_scaled(score, s.temperature)[pick];
    }
    d.tokens[r - 1] = cand[pick];
    prev = cand[pick];
  }
}

}  // namespace tpdraft::reference
