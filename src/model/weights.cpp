// Loading a rank's share of the drafter: every tensor's shape checked (docs/checkpoint.md), only the
// rows / columns tensor_share() assigns the rank copied (in chunks of ~16 MiB, so a rank never
// stages a whole matrix).
#include "model/weights.h"

#include <algorithm>
#include <chrono>
#include <set>

#include <fmt/ranges.h>

#include "checkpoint/quant_tensors.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"

namespace tpdraft::model {

namespace {

// Staging chunk: bounds the extra memory of a load to ~2 chunks (staged copy + mapped source).
constexpr size_t kStageBytes = 16u << 20;

std::string layer_name(int64_t l, const std::string& rest) { return "layers." + std::to_string(l) + "." + rest; }

// One tensor of every layer: its name after "layers.<l>.", its full shape, and the field of
// LayerWeights it loads into (a matrix, or an f32 vector).
struct LayerTensor {
  const char* name;
  std::vector<int64_t> shape;
  kernels::Matrix LayerWeights::*matrix = nullptr;
  const float* LayerWeights::*vector = nullptr;
};

// Every per-layer tensor of a drafter with config c, in checkpoint (and load) order.
std::vector<LayerTensor> layer_tensors(const DrafterConfig& c) {
  using W = LayerWeights;
  const int64_t H = c.hidden, D = c.head_dim;
  // Products of config values: checked, since a programmatic config need not have been validated.
  const int64_t QD = checked_mul(c.n_q, D, "q rows (num_attention_heads x head_dim)");
  const int64_t KD = checked_mul(c.n_kv, D, "k/v rows (num_key_value_heads x head_dim)");
  std::vector<LayerTensor> out = {
      {"input_layernorm.weight", {H}, nullptr, &W::input_norm},
      {"post_attention_layernorm.weight", {H}, nullptr, &W::post_norm},
      {"self_attn.q_proj.weight", {QD, H}, &W::q},
      {"self_attn.k_proj.weight", {KD, H}, &W::k},
      {"self_attn.v_proj.weight", {KD, H}, &W::v},
      {"self_attn.o_proj.weight", {H, QD}, &W::o},
      {"self_attn.q_norm.weight", {D}, nullptr, &W::q_norm},
      {"self_attn.k_norm.weight", {D}, nullptr, &W::k_norm}};
  if (c.bias) {
    out.push_back({"self_attn.q_proj.bias", {QD}, nullptr, &W::q_bias});
    out.push_back({"self_attn.k_proj.bias", {KD}, nullptr, &W::k_bias});
    out.push_back({"self_attn.v_proj.bias", {KD}, nullptr, &W::v_bias});
    out.push_back({"self_attn.o_proj.bias", {H}, nullptr, &W::o_bias});
  }
  out.push_back({"mlp.gate_proj.weight", {c.ffn, H}, &W::gate});
  out.push_back({"mlp.up_proj.weight", {c.ffn, H}, &W::up});
  out.push_back({"mlp.down_proj.weight", {H, c.ffn}, &W::down});
  if (c.is_dflash2()) {
    const int64_t KG2 = checked_mul(2 * c.conv_kernel, c.conv_groups(), "kernel projection rows (2 x K x G)");
    out.push_back({"attention_conv.base_kernel", {2, c.conv_kernel, H}, nullptr, &W::attn_conv_base});
    out.push_back({"mlp_conv.base_kernel", {2, c.conv_kernel, H}, nullptr, &W::mlp_conv_base});
    out.push_back({"attention_conv.kernel_projection.weight", {KG2, H}, &W::attn_conv_proj});
    out.push_back({"mlp_conv.kernel_projection.weight", {KG2, H}, &W::mlp_conv_proj});
  }
  return out;
}

// Refuses a NaN or Inf among the n x width elements just staged from rows row0.. and columns
// col0.. of t: one such weight turns every logit into NaN and the draft into token -1.
void check_finite(const TensorInfo& t, const void* staged, int64_t n, int64_t width, int64_t row0, int64_t col0) {
  const int64_t i = find_non_finite(t.dtype, staged, static_cast<size_t>(n * width));
  if (i < 0) return;
  TPDRAFT_FAIL("{}: tensor '{}' holds a non-finite value (NaN or Inf) at row {}, column {}; weights must be finite",
               t.file, t.name, row0 + i / width, col0 + i % width);
}

// A buffer of `rows` rows of `row_bytes` in backend memory, filled through ~kStageBytes of host
// memory: fill(r, n, stage) writes rows [r, r + n) into the stage, which is then copied in.
template <typename Fill>
kernels::Buffer upload_staged(kernels::Ops& ops, int64_t rows, size_t row_bytes, const Fill& fill) {
  kernels::Buffer buf(ops, static_cast<size_t>(rows) * row_bytes);
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(kStageBytes / std::max<size_t>(1, row_bytes)));
  std::vector<std::byte> stage(static_cast<size_t>(std::min(chunk, std::max<int64_t>(rows, 1))) * row_bytes);
  for (int64_t r = 0; r < rows; r += chunk) {
    const int64_t n = std::min(chunk, rows - r);
    fill(r, n, stage.data());
    ops.to_device(static_cast<std::byte*>(buf.get()) + static_cast<size_t>(r) * row_bytes, stage.data(),
                  static_cast<size_t>(n) * row_bytes);
  }
  return buf;
}

void row_to_f32(const TensorInfo& t, int64_t row, float* out, const char* what) {
  TPDRAFT_CHECK(row >= 0 && row < t.rows(), "token id {} outside the {} ({} rows, {})", row, what, t.rows(), t.file);
  copy_rows(t, row, 1, DType::F32, out);
  // These tables stay mapped and are read a row at a time, so each row is checked as it is read.
  const int64_t bad = find_non_finite(DType::F32, out, static_cast<size_t>(t.cols()));
  TPDRAFT_CHECK_INPUT(bad < 0, "{}: tensor '{}' row {} holds a non-finite value (NaN or Inf) at column {}; weights must be "
                "finite", t.file, t.name, row, bad);
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> expected_drafter_tensors(const DrafterConfig& c) {
  const int64_t H = c.hidden;
  const int64_t TH = checked_mul(c.n_taps(), H, "fc columns (taps x hidden_size)");
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {
      {"fc.weight", {H, TH}}, {"hidden_norm.weight", {H}}, {"norm.weight", {H}}};
  const std::vector<LayerTensor> per_layer = layer_tensors(c);
  for (int64_t l = 0; l < c.layers; ++l)
    for (const LayerTensor& t : per_layer) out.emplace_back(layer_name(l, t.name), t.shape);
  if (c.is_dflash2()) {
    out.push_back({"candidate_selector.hidden_projection.weight", {c.selector_rank, H}});
    out.push_back({"candidate_selector.predecessor_codebook", {c.vocab, c.selector_rank}});
    out.push_back({"candidate_selector.successor_codebook", {c.vocab, c.selector_rank}});
  }
  return out;
}

DrafterWeights::DrafterWeights(const DrafterConfig& cfg, std::shared_ptr<const TensorStore> drafter,
                               std::shared_ptr<const TensorStore> target, const ShardPlan& plan, kernels::Ops& ops,
                               std::shared_ptr<const DraftVocab> vocab)
    : cfg_(cfg), plan_(plan), ops_(ops), drafter_(std::move(drafter)), target_(std::move(target)),
      vocab_(std::move(vocab)) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t H = cfg.hidden, T = cfg.n_taps();
  const TensorStore& d = *drafter_;
  TPDRAFT_CHECK(cfg.draft_vocab == (vocab_ ? vocab_->size() : 0),
                "the config's draft vocabulary ({} tokens) and the map given ({} ids) differ", cfg.draft_vocab,
                vocab_ ? vocab_->size() : 0);

  // Unknown tensors are reported, never silently used or ignored.
  std::set<std::string> known;
  for (const auto& [name, shape] : expected_drafter_tensors(cfg)) {
    known.insert(name);
    // A quantized module's companions (a zero point or g_idx is refused when it loads).
    if (cfg.quant.scheme_for(name).quantized())
      for (const char* part : {"packed", "scale", "shape", "zero_point", "g_idx"}) known.insert(quant_part(name, part));
  }
  // A speculators checkpoint's own tables and its draft vocabulary map.
  if (cfg.layout == Layout::Speculators)
    for (const char* name : {"embed_tokens.weight", "lm_head.weight", "d2t", "t2d"}) known.insert(name);
  std::vector<std::string> unknown;
  for (const auto& n : d.names())
    if (!known.count(n) && !(ends_with(n, ".weight") && known.count(n.substr(0, n.size() - 7))))
      unknown.push_back(n);
  if (!unknown.empty())
    TPDRAFT_LOG_WARN("{}: {} tensor(s) not used by a {} drafter: {}{}", d.source(), unknown.size(), cfg.arch_name,
                     fmt::join(unknown.begin(), unknown.begin() + std::min<size_t>(unknown.size(), 8), ", "),
                     unknown.size() > 8 ? ", ..." : "");

  std::string head_name;
  const TensorInfo& head_info = check_tensors(&head_name);
  const int want_act = cfg.quant.activation_bits;
  TPDRAFT_CHECK(want_act != 8 || ops.offers_activation_bits(8),
                "{}: an a8 quantization (int8 activations) was asked for, but backend '{}' multiplies quantized "
                "weights with {} activations only (use the preset without a8, or with a16)", d.source(), ops.name(),
                ops.quantized_activation_bits() == 16 ? "bf16" : "float");
  // Float activations on a backend whose quantized kernels round them to int8 only: the weights
  // are held dequantized, exactly, in f32 and run by the float kernels.
  dequantize_ = want_act == 16 && ops.quantized_activation_bits() == 8 && !ops.offers_activation_bits(16);
  // int8 activations asked of a backend whose own are not (CUDA): every quantized matrix says so.
  activation_bits_ = want_act == 8 && ops.quantized_activation_bits() != 8 ? 8 : 0;

  fc = load_matrix(d, "fc.weight", {H, T * H});
  hidden_norm = load_vector(d, "hidden_norm.weight", {H});
  final_norm = load_vector(d, "norm.weight", {H});

  layers.resize(static_cast<size_t>(cfg.layers));
  const std::vector<LayerTensor> per_layer = layer_tensors(cfg);
  for (int64_t l = 0; l < cfg.layers; ++l) {
    LayerWeights& w = layers[static_cast<size_t>(l)];
    for (const LayerTensor& t : per_layer) {
      if (t.matrix != nullptr) w.*t.matrix = load_matrix(d, layer_name(l, t.name), t.shape);
      else w.*t.vector = load_vector(d, layer_name(l, t.name), t.shape);
    }
  }

  // The embedding stays host-mapped; the head's vocabulary slice is copied in. A tied head is
  // read from the embedding table, with the head's share.
  const TensorShare head_share = tensor_share(cfg, plan, "lm_head.weight", head_info.shape);
  head_dtype = head_info.dtype;
  if (cfg.quant.head.quantized())
    TPDRAFT_CHECK(ops.supports(kernels::quantized_format(cfg.quant.head.bits), kernels::WeightOp::Head),
                  "{}: --quant with +head: backend '{}' has no kernels for a quantized head (use --quant without "
                  "+head)", head_store_->source(), ops.name());
  head = load_head(head_name, head_info, head_share);

  if (cfg.is_dflash2())
    selector_proj = load_matrix(d, "candidate_selector.hidden_projection.weight", {cfg.selector_rank, H});
  if (plan.rank == 0)
    TPDRAFT_LOG_INFO("loaded {} ({}): {:.1f} MiB on this rank in {:.2f} s", d.source(), plan.describe(),
                     static_cast<double>(backend_bytes_) / (1 << 20),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

const TensorInfo& DrafterWeights::check_tensors(std::string* head_name) {
  // Every tensor is checked (present, shaped as the config says, a float dtype) before the first
  // buffer is allocated: a bad tensor in the last layer must not cost loading all the others.
  const bool stored_quantized = cfg_.quant.source == QuantConfig::Source::Checkpoint;
  for (const auto& [name, shape] : expected_drafter_tensors(cfg_)) {
    if (ends_with(name, "_codebook")) continue;
    const QuantScheme scheme = cfg_.quant.scheme_for(name);
    if (stored_quantized && scheme.quantized()) check_quantized_tensor(*drafter_, name, shape, scheme);
    else drafter_->require(name, shape);
  }
  if (cfg_.is_dflash2()) {
    pred_ = &codebook("candidate_selector.predecessor_codebook");
    succ_ = &codebook("candidate_selector.successor_codebook");
  }
  return target_tables(head_name);
}

const TensorInfo& DrafterWeights::target_tables(std::string* head_name) {
  const int64_t H = cfg_.hidden, V = cfg_.vocab;
  // A table of `hidden` floats and at least `rows` rows (exactly, when `exact`); `shown` and
  // `name` name it in the messages.
  auto check_table = [&](const TensorInfo& table, const char* whose, const std::string& shown, const std::string& name,
                         int64_t rows, bool exact) {
    TPDRAFT_CHECK(table.shape.size() == 2 && table.shape[1] == H && (exact ? table.shape[0] == rows : table.shape[0] >= rows),
                  "{}: {} tensor '{}' has shape {}, expected [{}{}, hidden {}]", table.file, whose, shown,
                  table.shape_str(), exact ? "" : "Vt >= vocab_size ", rows, H);
    TPDRAFT_CHECK(is_float_weight(table.dtype), "{}: {} tensor '{}' has dtype {}, expected F32, F16 or BF16",
                  table.file, whose, name, dtype_name(table.dtype));
  };
  // A speculators drafter may ship its own embedding [V, H] and head ([N, H] for a draft
  // vocabulary, else [V, H]); what it does not ship comes from the target.
  const bool spec = cfg_.layout == Layout::Speculators;
  const TensorInfo* own_embed = spec ? drafter_->find("embed_tokens.weight") : nullptr;
  const TensorInfo* own_head = spec ? drafter_->find("lm_head.weight") : nullptr;
  TPDRAFT_CHECK(!spec || drafter_->find("lm_head.weight_packed") == nullptr,
                "{}: the drafter's head 'lm_head' is stored quantized; tpdraft reads a float draft head (quantize it "
                "while loading with --quant q8+head instead)", drafter_->source());
  if (own_embed != nullptr) {
    check_table(*own_embed, "drafter", "embed_tokens.weight", "embed_tokens.weight", V, false);
    embed_ = own_embed;
    embed_store_ = drafter_.get();
  }
  if (own_head != nullptr) {
    const int64_t rows = cfg_.draft_vocab > 0 ? cfg_.draft_vocab : V;
    check_table(*own_head, "drafter", "lm_head.weight", "lm_head.weight", rows, cfg_.draft_vocab > 0);
    head_store_ = drafter_.get();
    *head_name = "lm_head.weight";
  }
  if (embed_ != nullptr && own_head != nullptr) {
    target_vocab_ = embed_->shape[0];
    return *own_head;
  }

  const TensorStore& t = *target_;
  const TensorInfo* target_embed = t.find("embed_tokens.weight");
  TPDRAFT_CHECK(target_embed != nullptr, "{}: target tensor 'model.embed_tokens.weight' is missing (expected [>= {}, {}])",
                t.source(), V, H);
  check_table(*target_embed, "target", "model.embed_tokens.weight", "model.embed_tokens.weight", V, false);
  if (embed_ == nullptr) {
    embed_ = target_embed;
    embed_store_ = target_.get();
  }
  target_vocab_ = target_embed->shape[0];
  if (own_head != nullptr) return *own_head;

  const TargetConfig tcfg = TargetConfig::from_dir(t.source());
  const TensorInfo* head_info = t.find("lm_head.weight");
  *head_name = "lm_head.weight";
  // Without lm_head the embedding is the head (tied, HF's default), unless the config says the
  // two are separate: then the download is incomplete, and the embedding would draft wrong tokens.
  TPDRAFT_CHECK(head_info != nullptr || tcfg.tie_word_embeddings || !tcfg.tie_stated,
                "{}: target tensor 'lm_head.weight' is missing, and its config.json says tie_word_embeddings: false "
                "(the head is not the embedding); is the download complete?",
                t.source());
  if (tcfg.tie_word_embeddings || head_info == nullptr) {
    head_info = target_embed;
    *head_name = "embed_tokens.weight";
  }
  check_table(*head_info, "target", "lm_head.weight", *head_name, V, false);
  head_store_ = target_.get();
  return *head_info;
}

const TensorInfo& DrafterWeights::codebook(const std::string& base) const {
  // Stored under its base name, or with a `.weight` suffix.
  const std::string name = drafter_->find(base) != nullptr ? base : base + ".weight";
  TPDRAFT_CHECK(drafter_->find(name) != nullptr, "{}: tensor '{}' (or '{}.weight') is missing, expected [{}, {}]",
                drafter_->source(), base, base, cfg_.vocab, cfg_.selector_rank);
  return drafter_->require(name, {cfg_.vocab, cfg_.selector_rank});
}

kernels::Matrix DrafterWeights::load_matrix(const TensorStore& store, const std::string& name,
                                            const std::vector<int64_t>& shape) {
  const TensorShare share = tensor_share(cfg_, plan_, name, shape);
  // Memory estimates (tpdraft info) count what tensor_share says; the load must agree.
  TPDRAFT_CHECK(!share.as_f32 && share.placement != Placement::HostMapped,
                "the shard rules do not keep tensor '{}' as a matrix in backend memory", name);
  if (&store == drafter_.get()) {
    const QuantScheme scheme = cfg_.quant.scheme_for(name);
    if (scheme.quantized()) return load_quantized(store, name, shape, share, scheme);
  }
  const TensorInfo& info = store.require(name, shape);
  const Range rows = share.rows, cols = share.cols;
  const size_t row_bytes = static_cast<size_t>(cols.size()) * dtype_size(info.dtype);
  kernels::Buffer buf = upload_staged(ops_, rows.size(), row_bytes, [&](int64_t r, int64_t n, std::byte* stage) {
    const TensorInfo src = row_view(info, rows.begin + r, n);
    if (cols.begin == 0 && cols.end == info.cols()) copy_rows(src, 0, n, info.dtype, stage);
    else copy_cols(src, cols.begin, cols.size(), info.dtype, stage);
    check_finite(info, stage, n, cols.size(), rows.begin + r, cols.begin);
    // The source pages are done with: drop them so a rank's resident memory stays its share
    // (a tied head's table stays mapped for embedding lookups).
    if (&info != embed_) release_pages(src);
  });
  return {info.dtype, rows.size(), cols.size(), keep(std::move(buf))};
}

kernels::Matrix DrafterWeights::load_head(const std::string& name, const TensorInfo& info, const TensorShare& share) {
  // Row j of the share is head row src(j): the vocabulary row itself, or the draft vocabulary's.
  const std::vector<int64_t>* rows = vocab_ ? &vocab_->head_rows : nullptr;
  auto src = [&](int64_t j) { return rows ? (*rows)[static_cast<size_t>(share.rows.begin + j)] : share.rows.begin + j; };
  if (cfg_.quant.head.quantized())
    return keep_quantized(quantize_share(info, cfg_.quant.head, share.rows, share.cols, rows), name, cfg_.quant.head);
  TPDRAFT_CHECK(share.cols.begin == 0 && share.cols.end == info.cols(), "the head is split by rows only");
  const size_t row_bytes = static_cast<size_t>(info.cols()) * dtype_size(info.dtype);
  kernels::Buffer buf = upload_staged(ops_, share.rows.size(), row_bytes, [&](int64_t r, int64_t n, std::byte* stage) {
    // Consecutive source rows are copied as one run: the whole chunk for a full head.
    for (int64_t j = 0, run = 1; j < n; j += run) {
      const int64_t row = src(r + j);
      for (run = 1; j + run < n && src(r + j + run) == row + run;) ++run;
      TPDRAFT_CHECK(row >= 0 && row + run <= info.rows(), "{}: head rows [{}, {}) outside tensor '{}' ({} rows)",
                    info.file, row, row + run, info.name, info.rows());
      const TensorInfo part = row_view(info, row, run);
      std::byte* at = stage + static_cast<size_t>(j) * row_bytes;
      copy_rows(part, 0, run, info.dtype, at);
      check_finite(info, at, run, info.cols(), row, 0);
      if (&info != embed_) release_pages(part);
    }
  });
  return {info.dtype, share.rows.size(), info.cols(), keep(std::move(buf))};
}

kernels::Matrix DrafterWeights::load_quantized(const TensorStore& store, const std::string& name,
                                               const std::vector<int64_t>& shape, const TensorShare& share,
                                               const QuantScheme& scheme) {
  const bool stored = cfg_.quant.source == QuantConfig::Source::Checkpoint;
  if (scheme.kind == QuantScheme::Kind::Fp8) {
    // No FP8 kernels: the share is dequantized (exactly) and held as f32.
    return keep_f32(read_fp8_share(store, name, shape, scheme, share.rows, share.cols), share.rows.size(),
                    share.cols.size());
  }
  return keep_quantized(stored ? read_packed_share(store, name, shape, scheme, share.rows, share.cols)
                               : quantize_share(store.require(name, shape), scheme, share.rows, share.cols),
                        name, scheme);
}

kernels::Matrix DrafterWeights::keep_f32(const std::vector<float>& w, int64_t rows, int64_t cols) {
  kernels::Buffer buf(ops_, w.size() * sizeof(float));
  ops_.to_device(buf.get(), w.data(), buf.bytes());
  return {DType::F32, rows, cols, keep(std::move(buf))};
}

kernels::Matrix DrafterWeights::keep_quantized(const QuantShare& q, const std::string& name,
                                               const QuantScheme& scheme) {
  if (dequantize_) return keep_f32(q.dequantized(), q.rows, q.cols);  // q * scale: exact in f32
  const kernels::WeightFormat format = kernels::quantized_format(q.bits);
  TPDRAFT_CHECK(ops_.supports(format, kernels::WeightOp::Matmul),
                "tensor '{}' is {}: backend '{}' has no kernels for quantized weights (use the cpu backend or a float "
                "checkpoint)", name, scheme.describe(), ops_.name());
  kernels::Buffer buf(ops_, ops_.quantized_bytes(format, q.rows, q.cols, q.group));
  kernels::Matrix m;
  try {
    m = ops_.upload_quantized(quantized_rows(q, activation_bits_), buf.get());
  } catch (const InputError& e) {  // a backend's refusal of this matrix, naming it, of the same kind
    throw_input_error(fmt::format("tensor '{}' ({}): {}", name, scheme.describe(), e.what()));
  } catch (const Error& e) {
    TPDRAFT_FAIL("tensor '{}' ({}): {}", name, scheme.describe(), e.what());
  }
  keep(std::move(buf));
  return m;
}

const float* DrafterWeights::load_vector(const TensorStore& store, const std::string& name,
                                         const std::vector<int64_t>& shape) {
  const TensorInfo& info = store.require(name, shape);
  const TensorShare share = tensor_share(cfg_, plan_, name, shape);
  TPDRAFT_CHECK(share.as_f32, "the shard rules do not keep tensor '{}' as an f32 vector", name);
  const Range part = share.flat();
  std::vector<float> all = to_f32(info);
  const int64_t bad = find_non_finite(DType::F32, all.data() + part.begin, static_cast<size_t>(part.size()));
  TPDRAFT_CHECK(bad < 0, "{}: tensor '{}' holds a non-finite value (NaN or Inf) at element {}; weights must be finite",
                info.file, info.name, part.begin + bad);
  kernels::Buffer buf(ops_, static_cast<size_t>(part.size()) * sizeof(float));
  ops_.to_device(buf.get(), all.data() + part.begin, buf.bytes());
  return static_cast<const float*>(keep(std::move(buf)));
}

void* DrafterWeights::keep(kernels::Buffer buf) {
  backend_bytes_ += buf.bytes();
  buffers_.push_back(std::move(buf));
  return buffers_.back().get();
}

void DrafterWeights::embedding_row(int64_t token, float* out) const {
  TPDRAFT_CHECK(token >= 0 && token < cfg_.vocab, "token id {} outside [0, vocab_size = {})", token, cfg_.vocab);
  row_to_f32(*embed_, token, out, embed_store_ == drafter_.get() ? "drafter embedding" : "target embedding");
}
void DrafterWeights::predecessor(int64_t token, float* out) const {
  row_to_f32(*pred_, token, out, "predecessor codebook");
}
void DrafterWeights::successor(int64_t token, float* out) const { row_to_f32(*succ_, token, out, "successor codebook"); }

}  // namespace tpdraft::model
