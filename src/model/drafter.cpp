// The drafter's forward passes (docs/model.md) and the host-side selection (docs/sampling.md) on one rank.
// Every matmul is the rank's shard; the two all-reduces per layer restore the full sums.
#include "model/drafter.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <cstring>
#include <string>

#include "core/bounds.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/timing.h"

namespace tpdraft::model {

namespace {

size_t f32_bytes(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }

}  // namespace

Drafter::Drafter(std::shared_ptr<const DrafterWeights> weights, kernels::Ops& ops, parallel::Communicator& comm,
                 DrafterLimits limits)
    : weights_(std::move(weights)), cfg_(weights_->config()), ops_(ops), comm_(comm), limits_(limits),
      recorder_(ops, comm, limits.graphs) {
  TPDRAFT_CHECK(limits_.max_sessions >= 1 && limits_.max_sessions <= kMaxStepEntries,
                "max sessions must lie in 1..{}, got {}", kMaxStepEntries, limits_.max_sessions);
  TPDRAFT_CHECK(limits_.max_context >= 1 && limits_.max_context <= kMaxContext, "max context must lie in 1..{}, got {}",
                kMaxContext, limits_.max_context);
  TPDRAFT_CHECK(limits_.settle_chunk >= 1, "settle chunk must be at least 1, got {}", limits_.settle_chunk);
  const ShardPlan& plan = weights_->plan();
  TPDRAFT_CHECK(plan.tp == comm_.size() && plan.rank == comm_.rank(),
                "the weights hold the share of rank {} of {}, but the communicator is rank {} of {}", plan.rank,
                plan.tp, comm_.rank(), comm_.size());
  TPDRAFT_CHECK(limits_.kv_dtype == DType::F32 || limits_.kv_dtype == DType::BF16,
                "kv dtype {} is not f32 or bf16", dtype_name(limits_.kv_dtype));
  TPDRAFT_CHECK(ops_.holds_context(limits_.kv_dtype),
                "kv dtype {}: a {} context cache is CPU-only for now (the {} backend keeps its context in f32)",
                dtype_name(limits_.kv_dtype), dtype_name(limits_.kv_dtype), ops_.name());
  nq_local_ = plan.q_heads.size();
  nkv_local_ = plan.kv_heads.size();
  ffn_local_ = plan.ffn.size();
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, B = cfg_.block;
  check_workspace_fits();
  const int64_t M = limits_.max_sessions * B, Md = limits_.max_sessions * (B - 1), C = limits_.settle_chunk;
  const int64_t kmax = std::max<int64_t>(1, cfg_.selector_topk);
  // The f32 workspaces and their sizes in floats (the shapes drafter.h gives).
  const std::pair<kernels::Buffer*, int64_t> workspaces[] = {
      {&normed_, M * H}, {&conv_out_, M * H}, {&partial_, M * H}, {&final_normed_, M * H}, {&block_, M * H},
      {&draft_rows_, Md * H}, {&q_, M * nq_local_ * D}, {&attn_, M * nq_local_ * D}, {&k_, M * nkv_local_ * D},
      {&v_, M * nkv_local_ * D}, {&gate_, M * ffn_local_}, {&up_, M * ffn_local_}, {&top_values_, Md * kmax},
      {&settle_taps_, C * cfg_.n_taps() * H}, {&settle_context_, C * H}, {&settle_k_, C * nkv_local_ * D},
      {&settle_v_, C * nkv_local_ * D}};
  for (const auto& [buffer, floats] : workspaces) *buffer = kernels::Buffer(ops_, f32_bytes(floats));
  if (cfg_.is_dflash2()) {
    conv_delta_ = kernels::Buffer(ops_, f32_bytes(M * 2 * cfg_.conv_kernel * cfg_.conv_groups()));
    selector_ = kernels::Buffer(ops_, f32_bytes(Md * cfg_.selector_rank));
  }
  top_ids_ = kernels::Buffer(ops_, static_cast<size_t>(Md * kmax) * sizeof(int64_t));
  // The step table: positions [M], anchors [S], views [layers][S], the block's row table [M],
  // then the distinct input rows [1 + S, H] (64-byte aligned): the MASK row and each anchor's.
  const size_t S = static_cast<size_t>(limits_.max_sessions);
  anchors_offset_ = static_cast<size_t>(M) * sizeof(int64_t);
  views_offset_ = anchors_offset_ + S * sizeof(int64_t);
  row_table_offset_ = views_offset_ + static_cast<size_t>(cfg_.layers) * S * sizeof(kernels::ContextView);
  const size_t table_end = row_table_offset_ + static_cast<size_t>(M) * sizeof(int64_t);
  rows_offset_ = (table_end + 63) / 64 * 64;
  step_host_.assign(rows_offset_ + f32_bytes(static_cast<int64_t>(1 + S) * H), 0);
  step_ = kernels::Buffer(ops_, step_host_.size());
  positions_.resize(static_cast<size_t>(C));
  settle_pos_ = kernels::Buffer(ops_, positions_.size() * sizeof(int64_t));
}

size_t Drafter::context_bytes_per_position() const {
  return model::context_bytes_per_position(cfg_, weights_->plan(), dtype_size(limits_.kv_dtype));
}

std::unique_ptr<Session> Drafter::new_session() {
  auto s = std::unique_ptr<Session>(new Session());
  s->max_context_ = limits_.max_context;
  const size_t row = static_cast<size_t>(nkv_local_ * cfg_.head_dim) * dtype_size(limits_.kv_dtype);
  s->layers_.resize(static_cast<size_t>(cfg_.layers));
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    auto& lc = s->layers_[static_cast<size_t>(l)];
    lc.capacity = layer_capacity(l);
    const auto bytes = static_cast<size_t>(checked_mul(static_cast<int64_t>(row), lc.capacity,
                                                       "a session's context of layer {}", l));
    lc.k = kernels::Buffer(ops_, bytes);
    lc.v = kernels::Buffer(ops_, bytes);
  }
  return s;
}

size_t Drafter::session_bytes() const {
  const auto row = static_cast<int64_t>(static_cast<size_t>(nkv_local_ * cfg_.head_dim) * dtype_size(limits_.kv_dtype));
  int64_t total = 0;
  for (int64_t l = 0; l < cfg_.layers; ++l)
    total = checked_add(total, checked_mul(2 * row, layer_capacity(l), "a session's context"), "a session's context");
  return static_cast<size_t>(total);
}

int64_t Drafter::layer_capacity(int64_t layer) const {
  // A sliding layer reads at most W-1 positions back; B more keep a rejected block's worth of
  // positions so that a rollback after a draft never needs a row the ring has dropped.
  const bool sliding = cfg_.sliding[static_cast<size_t>(layer)] && !limits_.keep_all_positions;
  return sliding ? std::min(limits_.max_context, checked_add(cfg_.window, cfg_.block, "sliding_window + block_size"))
                 : limits_.max_context;
}

void Drafter::check_rollback(const Session& s, int64_t length, int64_t rows_after) const {
  TPDRAFT_CHECK(length >= 0 && length <= s.end_, "cannot roll back a session of length {} to {}: expected 0..{}",
                s.end_, length, s.end_);
  const int64_t end = checked_add(length, rows_after, "the length after the new rows");
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    const auto& lc = s.layers_[static_cast<size_t>(l)];
    // The oldest position a draft at `end` reads; the kept ones, below `length`, must be held.
    const int64_t needed = cfg_.sliding[static_cast<size_t>(l)] ? std::max<int64_t>(0, end - cfg_.window + 1) : 0;
    TPDRAFT_CHECK(needed >= length || lc.begin <= needed,
                  "cannot roll back to length {}{}: layer {} keeps positions from {} on (window {} + block {}), "
                  "but a draft there needs position {}",
                  length, rows_after > 0 ? fmt::format(" and settle {} rows", rows_after) : std::string(), l,
                  lc.begin, cfg_.window, cfg_.block, needed);
  }
}

void Drafter::cut(Session& s, int64_t length) {
  s.end_ = length;
  // Below a ring's oldest position nothing is held; a cut beneath it leaves the ring empty.
  for (auto& lc : s.layers_) lc.begin = std::min(lc.begin, length);
}

void Drafter::read_context(const Session& s, int64_t layer, std::vector<float>* k, std::vector<float>* v) const {
  TPDRAFT_CHECK(layer >= 0 && layer < cfg_.layers, "read_context: layer {} outside [0, {})", layer, cfg_.layers);
  const auto& lc = s.layers_[static_cast<size_t>(layer)];
  TPDRAFT_CHECK(lc.begin == 0, "read_context: layer {} no longer holds positions below {}", layer, lc.begin);
  const size_t n = static_cast<size_t>(s.end_ * nkv_local_ * cfg_.head_dim), esize = dtype_size(limits_.kv_dtype);
  std::vector<unsigned char> raw(n * esize);
  for (auto [out, ring] : {std::pair{k, &lc.k}, std::pair{v, &lc.v}}) {
    ops_.to_host(raw.data(), ring->get(), raw.size());
    out->resize(n);
    convert_to_f32(limits_.kv_dtype, raw.data(), out->data(), n);
  }
}

void Drafter::rollback(Session& session, int64_t length) {
  check_rollback(session, length);
  cut(session, length);
}

void Drafter::settle(Session& s, int64_t p0, const float* taps, int64_t n) {
  TPDRAFT_CHECK(s.layers_.size() == static_cast<size_t>(cfg_.layers), "settle: the session belongs to another drafter");
  TPDRAFT_CHECK(n >= 0, "settle: row count must be >= 0, got {}", n);
  TPDRAFT_CHECK(p0 >= 0 && p0 <= s.end_, "settle at position {}: expected 0..{} (the session's length; no gaps)", p0,
                s.end_);
  TPDRAFT_CHECK(n <= s.max_context_ - p0, "settle of {} rows at position {} exceeds the session's max context {}", n,
                p0, s.max_context_);
  TPDRAFT_CHECK(n == 0 || taps != nullptr, "settle: no tap rows given");
  check_rollback(s, p0, n);
  cut(s, p0);

  const int64_t H = cfg_.hidden, D = cfg_.head_dim, TH = cfg_.n_taps() * H, kvw = nkv_local_ * D;
  const float eps = static_cast<float>(cfg_.eps);
  for (int64_t j0 = 0; j0 < n; j0 += limits_.settle_chunk) {
    const int64_t rows = std::min(limits_.settle_chunk, n - j0);
    const int64_t first = p0 + j0;
    ops_.to_device(settle_taps_.get(), taps + j0 * TH, f32_bytes(rows * TH));
    for (int64_t j = 0; j < rows; ++j) positions_[static_cast<size_t>(j)] = first + j;
    ops_.to_device(settle_pos_.get(), positions_.data(), static_cast<size_t>(rows) * sizeof(int64_t));
    const auto* positions = static_cast<const int64_t*>(settle_pos_.get());
    ops_.matmul(weights_->fc, settle_taps_.f32(), rows, settle_context_.f32());
    ops_.rms_norm(settle_context_.f32(), weights_->hidden_norm, settle_context_.f32(), rows, H, eps);
    for (int64_t l = 0; l < cfg_.layers; ++l) {
      const LayerWeights& w = weights_->layers[static_cast<size_t>(l)];
      auto& lc = s.layers_[static_cast<size_t>(l)];
      ops_.matmul(w.k, settle_context_.f32(), rows, settle_k_.f32(), w.k_bias);
      ops_.head_norm_rope(settle_k_.f32(), w.k_norm, rows, nkv_local_, D, eps, positions, cfg_.rope_theta);
      ops_.matmul(w.v, settle_context_.f32(), rows, settle_v_.f32(), w.v_bias);
      // Only the last `capacity` rows of a chunk can survive in the ring; writing just those
      // keeps every slot written once.
      const int64_t skip = std::max<int64_t>(0, rows - lc.capacity);
      const DType kt = limits_.kv_dtype;
      ops_.store_context_rows(kt, settle_k_.f32() + skip * kvw, rows - skip, kvw, lc.k.get(), lc.capacity, first + skip);
      ops_.store_context_rows(kt, settle_v_.f32() + skip * kvw, rows - skip, kvw, lc.v.get(), lc.capacity, first + skip);
    }
  }
  ops_.sync();
  s.end_ = p0 + n;
  for (auto& lc : s.layers_) lc.begin = std::max(lc.begin, s.end_ - lc.capacity);
}

void Drafter::conv(const float* in, float* out, const float* base, const float* delta, int64_t side,
                   int64_t sessions) {
  const int64_t K = cfg_.conv_kernel, G = cfg_.conv_groups();
  kernels::ConvParams p;
  p.in = in;
  p.out = out;
  p.base = base + side * K * cfg_.hidden;
  p.delta = delta;
  p.delta_stride = 2 * K * G;
  p.delta_offset = side * K * G;
  p.sessions = sessions;
  p.block = cfg_.block;
  p.hidden = cfg_.hidden;
  p.kernel = K;
  p.group_size = cfg_.conv_group;
  ops_.dyn_conv(p);
}

void Drafter::upload_step(const std::vector<DraftRequest>& requests) {
  const int64_t S = static_cast<int64_t>(requests.size()), H = cfg_.hidden, B = cfg_.block;
  const int64_t Smax = limits_.max_sessions;
  unsigned char* base = step_host_.data();
  auto* positions = reinterpret_cast<int64_t*>(base);
  auto* anchors = reinterpret_cast<int64_t*>(base + anchors_offset_);
  auto* views = reinterpret_cast<kernels::ContextView*>(base + views_offset_);
  auto* row_table = reinterpret_cast<int64_t*>(base + row_table_offset_);
  auto* rows = reinterpret_cast<float*>(base + rows_offset_);
  const float m_in = static_cast<float>(cfg_.in_scale);
  // Block inputs: m_in * E[anchor] for row 0, m_in * E[mask] for the others (host lookups). Only
  // the distinct rows travel; the forward's first op expands them by the row table.
  weights_->embedding_row(cfg_.mask_token, rows);
  for (int64_t s = 0; s < S; ++s) {
    const DraftRequest& req = requests[static_cast<size_t>(s)];
    const Session& sess = *req.session;
    anchors[s] = sess.end_;
    for (int64_t r = 0; r < B; ++r) positions[s * B + r] = sess.end_ + r;
    for (int64_t l = 0; l < cfg_.layers; ++l) {
      const auto& lc = sess.layers_[static_cast<size_t>(l)];
      // A bf16 ring's rows are read as bf16 (AttentionParams::kv_dtype) through the same pointers.
      views[l * Smax + s] = {static_cast<const float*>(lc.k.get()), static_cast<const float*>(lc.v.get()),
                             lc.capacity, lc.begin, sess.end_};
    }
    weights_->embedding_row(req.anchor_token, rows + (1 + s) * H);
    row_table[s * B] = 1 + s;
    for (int64_t r = 1; r < B; ++r) row_table[s * B + r] = 0;
  }
  for (int64_t i = 0; i < (1 + S) * H; ++i) rows[i] *= m_in;
  // One copy per draft, up to this batch's last distinct row.
  ops_.to_device(step_.get(), base, rows_offset_ + f32_bytes((1 + S) * H));
}

// The workspaces grow with max sessions (a block of B rows each) and the settle chunk: refuse,
// naming the limit, a size that cannot be allocated instead of failing in the allocator.
void Drafter::check_workspace_fits() const {
  const int64_t H = cfg_.hidden, D = cfg_.head_dim;
  const int64_t M = checked_mul(limits_.max_sessions, cfg_.block, "max sessions {} x block {}", limits_.max_sessions,
                                cfg_.block);
  int64_t per_row = 5 * H + 2 * (nq_local_ + nkv_local_) * D + 2 * ffn_local_ + 2 * std::max<int64_t>(1, cfg_.selector_topk);
  if (cfg_.is_dflash2()) per_row += 2 * cfg_.conv_kernel * cfg_.conv_groups() + cfg_.selector_rank;
  const int64_t block_bytes = checked_mul(checked_mul(M, per_row, "draft workspace floats"), 4, "draft workspace bytes");
  const int64_t settle_bytes = checked_mul(
      checked_mul(limits_.settle_chunk, cfg_.n_taps() * H + H + 2 * nkv_local_ * D, "settle workspace floats"), 4,
      "settle workspace bytes");
  const uint64_t total = static_cast<uint64_t>(checked_add(block_bytes, settle_bytes, "workspace bytes"));
  const uint64_t memory = machine_memory();
  TPDRAFT_CHECK(memory == 0 || total <= memory,
                "max sessions {} (settle chunk {}): the draft's workspaces take {} bytes ({:.1f} GiB) on this rank, "
                "more than this machine's memory of {:.1f} GiB",
                limits_.max_sessions, limits_.settle_chunk, total, gib(total), gib(memory));
}

size_t Drafter::graph_segments(int64_t sessions) const { return recorder_.segments(sessions); }
size_t Drafter::graph_nodes(int64_t sessions) const { return recorder_.nodes(sessions); }

void Drafter::run_layers(int64_t S) {
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, B = cfg_.block, M = S * B;
  const float eps = static_cast<float>(cfg_.eps);
  const bool v2 = cfg_.is_dflash2();
  const auto* step = static_cast<const unsigned char*>(step_.get());
  const auto* positions = reinterpret_cast<const int64_t*>(step);
  const auto* anchors = reinterpret_cast<const int64_t*>(step + anchors_offset_);
  const auto* views = reinterpret_cast<const kernels::ContextView*>(step + views_offset_);
  const auto* row_table = reinterpret_cast<const int64_t*>(step + row_table_offset_);
  const auto* rows = reinterpret_cast<const float*>(step + rows_offset_);
  float* h = block_.f32();  // the residual stream
  ops_.gather_rows(rows, row_table, M, H, h);
  float* x = normed_.f32();
  float* xc = conv_out_.f32();
  float* o = partial_.f32();
  float* delta = conv_delta_.f32();
  // The residual stream normed for the first sublayer; each later norm joins the add before it.
  ops_.rms_norm(h, weights_->layers[0].input_norm, x, M, H, eps);
  // A sublayer's input: the normed stream x, (DFlash 2) through the input side of its dynamic
  // convolution.
  auto sublayer_in = [&](const kernels::Matrix& conv_proj, const float* conv_base) {
    if (!v2) return static_cast<const float*>(x);
    ops_.matmul(conv_proj, x, M, delta);
    conv(x, xc, conv_base, delta, 0, S);
    return static_cast<const float*>(xc);
  };
  // A sublayer's partial output o: summed over the ranks, then (DFlash 2) through the output side
  // of the convolution, into the residual stream, which is then normed with `next_norm` into y.
  auto sublayer_out = [&](const float* conv_base, const float* next_norm, float* y) {
    recorder_.all_reduce_sum(o, static_cast<size_t>(M * H));
    if (v2) conv(o, xc, conv_base, delta, 1, S);
    ops_.add_rms_norm(h, v2 ? xc : o, next_norm, y, M, H, eps);
  };
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    const LayerWeights& w = weights_->layers[static_cast<size_t>(l)];
    // Attention sublayer.
    const float* xin = sublayer_in(w.attn_conv_proj, w.attn_conv_base);
    ops_.matmul(w.q, xin, M, q_.f32(), w.q_bias);
    ops_.matmul(w.k, xin, M, k_.f32(), w.k_bias);
    ops_.matmul(w.v, xin, M, v_.f32(), w.v_bias);
    ops_.head_norm_rope(q_.f32(), w.q_norm, M, nq_local_, D, eps, positions, cfg_.rope_theta);
    ops_.head_norm_rope(k_.f32(), w.k_norm, M, nkv_local_, D, eps, positions, cfg_.rope_theta);
    kernels::AttentionParams ap;
    ap.q = q_.f32();
    ap.k = k_.f32();
    ap.v = v_.f32();
    ap.out = attn_.f32();
    ap.sessions = S;
    ap.block = B;
    ap.n_q = nq_local_;
    ap.n_kv = nkv_local_;
    ap.head_dim = D;
    ap.anchor = anchors;
    ap.context = views + l * limits_.max_sessions;
    ap.max_context = layer_capacity(l);
    ap.causal = cfg_.causal[static_cast<size_t>(l)];
    ap.window = cfg_.sliding[static_cast<size_t>(l)] ? cfg_.window : 0;
    ap.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    ap.kv_dtype = limits_.kv_dtype;
    ops_.attention(ap);
    // Row-parallel o: each rank holds a partial sum; the bias joins once, on rank 0.
    ops_.matmul(w.o, attn_.f32(), M, o, comm_.rank() == 0 ? w.o_bias : nullptr);
    sublayer_out(w.attn_conv_base, w.post_norm, x);
    // MLP sublayer; the last one's output is normed with the final norm.
    xin = sublayer_in(w.mlp_conv_proj, w.mlp_conv_base);
    ops_.matmul(w.gate, xin, M, gate_.f32());
    ops_.matmul(w.up, xin, M, up_.f32());
    ops_.silu_mul(gate_.f32(), up_.f32(), gate_.f32(), M * ffn_local_);
    ops_.matmul(w.down, gate_.f32(), M, o);
    const bool last = l + 1 == cfg_.layers;
    const float* next_norm = last ? weights_->final_norm : weights_->layers[static_cast<size_t>(l + 1)].input_norm;
    sublayer_out(w.mlp_conv_base, next_norm, last ? final_normed_.f32() : x);
  }
  // The draft rows (1..B-1 of each session) side by side for the head.
  for (int64_t s = 0; s < S; ++s)
    ops_.store_rows(final_normed_.f32() + (s * B + 1) * H, B - 1, H, draft_rows_.f32() + s * (B - 1) * H, B - 1, 0);
}

void Drafter::check_requests(const std::vector<DraftRequest>& requests) const {
  const int64_t S = static_cast<int64_t>(requests.size());
  TPDRAFT_CHECK(S >= 1 && S <= limits_.max_sessions, "draft: {} sessions requested, expected 1..{} (max sessions)", S,
                limits_.max_sessions);
  std::set<const Session*> seen;
  for (const auto& r : requests) {
    TPDRAFT_CHECK(r.session != nullptr, "draft: a request has no session");
    TPDRAFT_CHECK(seen.insert(r.session).second, "draft: a session appears twice in one batch");
    TPDRAFT_CHECK(r.session->layers_.size() == static_cast<size_t>(cfg_.layers),
                  "draft: the session belongs to another drafter");
    check_request(cfg_, r.anchor_token, r.sampling);
    TPDRAFT_CHECK(r.dist_width >= kFullDistribution && r.dist_width <= cfg_.vocab,
                  "draft: a distribution width must be 0 (none), 1..{} (the most likely tokens) or {} (every token), "
                  "got {}", cfg_.vocab, kFullDistribution, r.dist_width);
  }
}

void Drafter::check_request(const DrafterConfig& cfg, int64_t anchor_token, const SamplingParams& sp) {
  TPDRAFT_CHECK(anchor_token >= 0 && anchor_token < cfg.vocab, "draft: anchor token {} outside [0, {})", anchor_token,
                cfg.vocab);
  TPDRAFT_CHECK(sp.temperature == 0 || (sp.temperature >= kMinTemperature && std::isfinite(sp.temperature)),
                "temperature must be 0 (greedy) or a finite value of at least {} (1 / T scales the logits), got {}",
                kMinTemperature, sp.temperature);
  TPDRAFT_CHECK(sp.top_p > 0 && sp.top_p <= 1, "top_p must lie in (0, 1], got {}", sp.top_p);
  TPDRAFT_CHECK(sp.top_k >= 0, "top_k must be >= 0, got {}", sp.top_k);
  TPDRAFT_CHECK(!cfg.is_dflash2() || (sp.top_k == 0 && sp.top_p == 1.0),
                "top_k / top_p apply to DFlash drafters; a DFlash 2 drafter samples over its {} selector candidates",
                cfg.selector_topk);
}

std::vector<DraftResult> Drafter::draft(const std::vector<DraftRequest>& requests, DraftDump* dump) {
  check_requests(requests);
  const int64_t S = static_cast<int64_t>(requests.size()), H = cfg_.hidden, B = cfg_.block;
  const auto t0 = Clock::now();
  upload_step(requests);
  const std::string what = fmt::format("the block forward ({} sessions)", S);
  times_.replayed = recorder_.run(S, [&] { run_layers(S); }, what);
  if (!times_.replayed) comm_.wait_pending(what);  // the all-reduces issued without a wait, once
  ops_.sync();
  times_.layers = seconds_since(t0);

  const auto t1 = Clock::now();
  HeadOutput head = candidates(requests, dump != nullptr);
  times_.head = seconds_since(t1);
  const auto t2 = Clock::now();
  std::vector<DraftResult> results(static_cast<size_t>(S));
  std::vector<Pick> picks = choose(requests, head, &results);
  publish(requests, &picks);
  times_.select = seconds_since(t2);

  for (size_t i = 0; i < picks.size(); ++i) {  // B-1 rows per session
    DraftResult& result = results[i / static_cast<size_t>(B - 1)];
    result.tokens.push_back(picks[i].token);
    result.probs.push_back(picks[i].prob);
  }
  if (dump != nullptr) {
    dump->hidden.resize(static_cast<size_t>(S * B * H));
    ops_.to_host(dump->hidden.data(), final_normed_.get(), dump->hidden.size() * sizeof(float));
    dump->logits = gather_logits(head.logits.data(), S * (B - 1), vocab_slice(), comm_);
    if (const DraftVocab* dv = weights_->draft_vocab()) dump->logit_ids = dv->ids;
  }
  return results;
}

VocabSlice Drafter::vocab_slice() const {
  const ShardPlan& plan = weights_->plan();
  const DraftVocab* dv = weights_->draft_vocab();
  return {plan.vocab.begin, plan.vocab.size(), plan.vocab_padded / plan.tp, cfg_.head_vocab(),
          dv != nullptr ? dv->ids.data() : nullptr, cfg_.vocab};
}

Drafter::HeadOutput Drafter::candidates(const std::vector<DraftRequest>& requests, bool dump) {
  const int64_t Md = static_cast<int64_t>(requests.size()) * (cfg_.block - 1);
  const bool v2 = cfg_.is_dflash2();
  bool sampling = false, greedy = v2;
  for (const auto& r : requests) (v2 || r.sampling.greedy() ? greedy : sampling) = true;
  const VocabSlice slice = vocab_slice();
  const int64_t k = v2 ? cfg_.selector_topk : 1, vl = slice.width;
  // The selector's projection goes first, while its input is on the backend anyway; the copies
  // below wait for it.
  if (v2) ops_.matmul(weights_->selector_proj, draft_rows_.f32(), Md, selector_.f32());
  kernels::HeadParams hp;
  hp.head = weights_->head;
  hp.g = draft_rows_.f32();
  hp.m = Md;
  hp.valid_rows = weights_->head.rows;
  hp.scale = static_cast<float>(cfg_.out_scale);
  hp.cap = static_cast<float>(cfg_.softcap);

  HeadOutput out;
  // Every local candidate of every draft row: from this rank's logits when those are needed
  // anyway (sampling, dumps), else straight from the head's top-k.
  std::vector<std::vector<Candidate>> local(static_cast<size_t>(Md));
  if (dump || sampling) {
    if (!logits_.get()) logits_ = kernels::Buffer(ops_, f32_bytes(limits_.max_sessions * (cfg_.block - 1) * vl));
    ops_.head_logits(hp, logits_.f32());
    out.logits.resize(static_cast<size_t>(Md * vl));
    ops_.to_host(out.logits.data(), logits_.get(), out.logits.size() * sizeof(float));
    if (greedy)
      for (int64_t m = 0; m < Md; ++m) local[static_cast<size_t>(m)] = local_top(out.logits.data() + m * vl, slice, k);
  } else {
    ops_.head_topk(hp, static_cast<int>(k), slice.id_base, top_values_.f32(), static_cast<int64_t*>(top_ids_.get()));
    std::vector<float> values(static_cast<size_t>(Md * k));
    std::vector<int64_t> ids(static_cast<size_t>(Md * k));
    ops_.to_host(values.data(), top_values_.get(), values.size() * sizeof(float));
    ops_.to_host(ids.data(), top_ids_.get(), ids.size() * sizeof(int64_t));
    const int64_t kk = std::min(k, vl);
    for (int64_t m = 0; m < Md; ++m)
      for (int64_t j = 0; j < kk; ++j)
        local[static_cast<size_t>(m)].push_back({values[static_cast<size_t>(m * k + j)], slice.id(ids[static_cast<size_t>(m * k + j)])});
  }
  // Rows drafted by sampling take their own exchanges; the merge is for greedy and selector rows.
  if (greedy) {
    out.candidates = merge_candidates(local, k, comm_);
    for (size_t m = 0; m < out.candidates.size(); ++m) {
      const auto& c = out.candidates[m];
      // A NaN logit sorts anywhere and an Inf one wins every comparison: either way no token can
      // be chosen honestly, so the draft fails instead of returning one.
      TPDRAFT_CHECK(!c.empty() && std::isfinite(c.front().value),
                    "draft row {} of session {} has non-finite logits ({}): the taps or the weights hold NaN or Inf",
                    static_cast<int64_t>(m) % (cfg_.block - 1) + 1, static_cast<int64_t>(m) / (cfg_.block - 1),
                    c.empty() ? std::string("no candidate") : fmt::format("best {}", c.front().value));
    }
  }
  if (v2) {
    out.selector.resize(static_cast<size_t>(Md * cfg_.selector_rank));
    ops_.to_host(out.selector.data(), selector_.get(), out.selector.size() * sizeof(float));
  }
  ops_.sync();
  return out;
}

std::vector<Pick> Drafter::choose(const std::vector<DraftRequest>& requests, const HeadOutput& head,
                                  std::vector<DraftResult>* results) {
  const int64_t B = cfg_.block, R = cfg_.selector_rank, V = cfg_.vocab;
  const size_t rows = static_cast<size_t>(B - 1);
  std::vector<Pick> picks;
  picks.reserve(requests.size() * rows);
  for (size_t s = 0; s < requests.size(); ++s) {
    const DraftRequest& req = requests[s];
    std::vector<RowDistribution>& dists = (*results)[s].dists;
    const bool want = req.dist_width != 0;
    std::vector<Pick> mine;
    std::vector<Support> supports;
    if (cfg_.is_dflash2()) {
      const auto first = head.candidates.begin() + static_cast<std::ptrdiff_t>(s * rows);
      const std::vector<std::vector<Candidate>> c(first, first + static_cast<std::ptrdiff_t>(rows));
      std::vector<std::vector<float>> p(rows);
      for (size_t r = 0; r < rows; ++r) {
        const auto row = head.selector.begin() + static_cast<std::ptrdiff_t>((s * rows + r) * static_cast<size_t>(R));
        p[r].assign(row, row + R);
      }
      mine = selector_walk(req.anchor_token, c, p, *weights_, R, req.sampling, want ? &supports : nullptr);
    } else if (req.sampling.greedy()) {
      for (size_t r = 0; r < rows; ++r) {
        const auto& c = head.candidates[s * rows + r];
        mine.push_back({c.empty() ? -1 : c.front().id, 1.0f});
        if (want) supports.push_back({{mine.back().token, 1.0}});
      }
    } else {
      const int64_t vl = vocab_slice().width;
      mine = sample_sharded(head.logits.data() + static_cast<int64_t>(s * rows) * vl, B - 1, 1, vocab_slice(),
                            req.sampling, comm_, req.dist_width, want ? &dists : nullptr);
    }
    for (Support& support : supports) dists.push_back(shape_distribution(std::move(support), req.dist_width, V));
    picks.insert(picks.end(), mine.begin(), mine.end());
  }
  return picks;
}

void Drafter::publish(const std::vector<DraftRequest>& requests, std::vector<Pick>* picks) {
  // Greedy DFlash rows come from the merged candidates, the same bits on every rank. The selector
  // walk and sampling also read values every rank computed for itself (the selector projection,
  // the sum of exponentials), so rank 0's picks travel to the others, tokens then probabilities
  // in one broadcast: no rounding difference can split the ranks.
  bool computed_per_rank = cfg_.is_dflash2();
  for (const auto& r : requests) computed_per_rank = computed_per_rank || !r.sampling.greedy();
  if (comm_.size() > 1 && computed_per_rank) {
    const size_t n = picks->size();
    std::vector<unsigned char> wire(n * (sizeof(int64_t) + sizeof(float)));
    auto* probs = wire.data() + n * sizeof(int64_t);
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(wire.data() + i * sizeof(int64_t), &(*picks)[i].token, sizeof(int64_t));
      std::memcpy(probs + i * sizeof(float), &(*picks)[i].prob, sizeof(float));
    }
    comm_.broadcast(wire.data(), wire.size(), 0);
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(&(*picks)[i].token, wire.data() + i * sizeof(int64_t), sizeof(int64_t));
      std::memcpy(&(*picks)[i].prob, probs + i * sizeof(float), sizeof(float));
    }
  }
  const int64_t rows = cfg_.block - 1;
  for (size_t i = 0; i < picks->size(); ++i) {
    const Pick& p = (*picks)[i];
    TPDRAFT_CHECK(p.token >= 0 && p.token < cfg_.vocab && std::isfinite(p.prob),
                  "draft row {} of session {} has no valid token (got {} with probability {}): its logits are not "
                  "finite; the inputs or weights hold NaN or Inf",
                  static_cast<int64_t>(i) % rows + 1, static_cast<int64_t>(i) / rows, p.token, p.prob);
  }
}

}  // namespace tpdraft::model
