// The drafter on one rank: settle (target taps -> context rows), draft (one block forward over
// [anchor, MASK x (B-1)] for several sessions at once, then token selection) and rollback.
// Written once against kernels::Ops and parallel::Communicator; no backend or transport here.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "model/selection.h"
#include "model/session.h"
#include "model/sharded_head.h"
#include "model/weights.h"
#include "parallel/communicator.h"
#include "parallel/forward_recorder.h"

namespace tpdraft::model {

// Declared limits; every workspace is sized from them at construction, none per draft.
struct DrafterLimits {
  int64_t max_sessions = 1;    // sessions in one batched draft
  int64_t max_context = 4096;  // positions a session may hold
  int64_t settle_chunk = 256;  // rows settled per forward
  bool keep_all_positions = false;  // sliding layers keep every position too (for dumps)
  // The context cache's element type: F32, or BF16 (half the bytes and memory; its error against
  // float64 is bounded in docs/model.md). BF16 needs a backend that holds it (Ops::holds_context).
  DType kv_dtype = DType::F32;
  // Capture the block forward once per session count and replay it (a CUDA graph on the GPU).
  bool graphs = false;
};

struct DraftRequest {
  Session* session = nullptr;
  int64_t anchor_token = 0;  // sits at position session->length()
  SamplingParams sampling;
  // Each row's draft distribution too (RowDistribution, selection.h): 0 none, w > 0 the w most
  // likely tokens and the mass of the rest, kFullDistribution every token (on a sampled DFlash
  // draft this gathers the logits of every rank).
  int64_t dist_width = 0;
};

struct DraftResult {
  std::vector<int64_t> tokens;  // B-1 draft tokens for positions a+1 .. a+B-1
  std::vector<float> probs;     // q_r(d_r), 1 for greedy
  std::vector<RowDistribution> dists;  // B-1 rows when asked (rank 0's are the ones to report)
};

// What `--dump` and the tests read: the block's final-normed rows and every logit of the head.
struct DraftDump {
  std::vector<float> hidden;  // [S, B, H]
  std::vector<float> logits;  // [S, B-1, V], or [S, B-1, N] over a draft vocabulary
  std::vector<int64_t> logit_ids;  // a draft vocabulary's [N] target ids, one per logits column; else empty
};

// Time spent per phase of the last draft (seconds, host wall clock after a backend sync), and
// how its block forward ran.
struct DraftTimes {
  double layers = 0, head = 0, select = 0;
  bool replayed = false;  // the forward was a replay of a captured graph
};

class Drafter {
 public:
  Drafter(std::shared_ptr<const DrafterWeights> weights, kernels::Ops& ops, parallel::Communicator& comm,
          DrafterLimits limits);

  const DrafterConfig& config() const { return cfg_; }
  const DrafterLimits& limits() const { return limits_; }

  // The checks draft() makes of one request's anchor and sampling, for callers that want to
  // refuse a bad request before any work (names the value and what was expected).
  static void check_request(const DrafterConfig& cfg, int64_t anchor_token, const SamplingParams& sampling);

  std::unique_ptr<Session> new_session();
  // Settles n rows of taps (host, [n, T*H] f32) at positions p0 .. p0+n-1. The context is cut to
  // p0 first, so p0 must not exceed the session's length. Inputs are checked before anything
  // changes.
  void settle(Session& session, int64_t p0, const float* taps, int64_t n);
  // Drops positions >= length.
  void rollback(Session& session, int64_t length);
  // Throws, naming what is missing, when the session cannot be cut to `length` and then, after
  // `rows_after` new rows settled at `length`, draft: a sliding layer's ring may no longer hold a
  // position below `length` that the draft reads. Cutting to 0, or to where the new rows cover
  // the whole window, is always possible. Changes nothing.
  void check_rollback(const Session& session, int64_t length, int64_t rows_after = 0) const;
  // One batched draft; requests name distinct sessions.
  std::vector<DraftResult> draft(const std::vector<DraftRequest>& requests, DraftDump* dump = nullptr);

  const DraftTimes& last_times() const { return times_; }
  // Whether the block forward is captured and replayed (DrafterLimits::graphs, unless a capture
  // failed and the drafter went back to issuing ops one by one).
  bool graphs() const { return recorder_.enabled(); }
  // Graph segments per captured forward: 1 when the communicator joins the capture, else one
  // more than the forward's all-reduces, which then run between segments. 0: nothing captured.
  size_t graph_segments(int64_t sessions) const;
  size_t graph_nodes(int64_t sessions) const;  // kernels and copies a replay runs (CPU: calls)
  // Copies layer l's context of the session, positions [0, length), as [length, Nk_local, D]
  // f32 each; every position must still be held (see DrafterLimits::keep_all_positions).
  void read_context(const Session& session, int64_t layer, std::vector<float>* k, std::vector<float>* v) const;
  // Context bytes per position on this rank (all layers, K and V).
  size_t context_bytes_per_position() const;
  // Bytes one session's context takes on this rank (every layer's ring at its capacity).
  size_t session_bytes() const;

 private:
  // The head's results for the draft rows of one batch, on the host: what `choose` decides from.
  struct HeadOutput {
    std::vector<std::vector<Candidate>> candidates;  // merged top-k of each row (greedy and selector rows)
    std::vector<float> logits;                       // [rows, local vocab]: when sampling or dumping
    std::vector<float> selector;                     // [rows, R]: s_r of the DFlash 2 selector
  };

  void check_requests(const std::vector<DraftRequest>& requests) const;
  // Drops positions >= length (checked by the caller).
  void cut(Session& session, int64_t length);
  int64_t layer_capacity(int64_t layer) const;
  VocabSlice vocab_slice() const;
  void check_workspace_fits() const;
  // Writes the step table (positions, anchors, context views, block input rows) for the requests
  // to the backend, in one copy.
  void upload_step(const std::vector<DraftRequest>& requests);
  // The block forward for S sessions from the step table's rows into draft_rows_, one layer at a
  // time; the recorder replays it from a graph when it can.
  void run_layers(int64_t sessions);
  void conv(const float* in, float* out, const float* base, const float* delta, int64_t side, int64_t sessions);
  // The end of a draft: the head's candidates, the tokens chosen from them, and the same tokens
  // published on every rank.
  HeadOutput candidates(const std::vector<DraftRequest>& requests, bool dump);
  std::vector<Pick> choose(const std::vector<DraftRequest>& requests, const HeadOutput& head,
                           std::vector<DraftResult>* results);
  void publish(const std::vector<DraftRequest>& requests, std::vector<Pick>* picks);

  std::shared_ptr<const DrafterWeights> weights_;
  const DrafterConfig& cfg_;
  kernels::Ops& ops_;
  parallel::Communicator& comm_;
  DrafterLimits limits_;
  parallel::ForwardRecorder recorder_;
  int64_t nq_local_ = 0, nkv_local_ = 0, ffn_local_ = 0;
  DraftTimes times_;

  // Workspaces (backend memory), sized at construction for max_sessions * B block rows (M) or
  // settle_chunk rows. Block forward, per layer:
  kernels::Buffer normed_;        // [M, H] RMSNorm of the residual stream (sublayer input)
  kernels::Buffer conv_out_;      // [M, H] DFlash 2 convolution output
  kernels::Buffer conv_delta_;    // [M, 2*K*G] DFlash 2 dynamic kernel coefficients
  kernels::Buffer q_, k_, v_;     // [M, local heads, D] projections of the local heads
  kernels::Buffer attn_;          // [M, local q heads, D] attention output
  kernels::Buffer partial_;       // [M, H] o / down projection: this rank's partial sum, then the all-reduced sum
  kernels::Buffer gate_, up_;     // [M, local ffn] SwiGLU halves (gate_ then holds silu(gate) * up)
  // End of the forward and the head:
  kernels::Buffer final_normed_;  // [M, H] final RMSNorm of every block row
  kernels::Buffer draft_rows_;    // [M', H] the draft rows (1..B-1 of each session) side by side
  kernels::Buffer selector_;      // [M', R] DFlash 2 selector projections
  kernels::Buffer top_values_, top_ids_;  // [M', k] this rank's head top-k
  kernels::Buffer logits_;        // [M', local vocab], made on first need (sampling, dumps)
  // Settle, per chunk:
  kernels::Buffer settle_taps_;     // [C, T*H] tap rows
  kernels::Buffer settle_context_;  // [C, H] fc and hidden_norm of the rows
  kernels::Buffer settle_k_, settle_v_;  // [C, local kv heads, D] the rows' keys and values

  // The step table in backend memory, read by the ops when they run (so that a replayed graph
  // sees this draft's positions and contexts): positions [M] and anchors [S] (int64), the context
  // views [layers][S], the block's row table [M] (which distinct row each block row starts
  // from), then the distinct rows [1 + S, H] (f32: the MASK row, then each session's anchor
  // row), so that a draft uploads S + 1 rows, not M. Staged on the host in step_host_
  // (allocated once). block_ [M, H] is the residual stream the forward builds from them and
  // updates in place. settle_pos_ holds a settle chunk's positions.
  kernels::Buffer step_, block_, settle_pos_;
  std::vector<unsigned char> step_host_;
  size_t anchors_offset_ = 0, views_offset_ = 0, row_table_offset_ = 0, rows_offset_ = 0;
  std::vector<int64_t> positions_;  // host staging of settle positions
};

}  // namespace tpdraft::model
