// The drafter on one rank: settle (target taps -> context rows), draft (one block forward over
// [anchor, MASK x (B-1)] for several sessions at once, then token selection) and rollback.
// Written once against kernels::Ops and parallel::Communicator; no backend or transport here.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "model/selection.h"
#include "model/session.h"
#include "model/weights.h"
#include "parallel/communicator.h"

namespace tpdraft::model {

// Declared limits; every workspace is sized from them at construction, none per draft.
struct DrafterLimits {
  int64_t max_sessions = 1;    // sessions in one batched draft
  int64_t max_context = 4096;  // positions a session may hold
  int64_t settle_chunk = 256;  // rows settled per forward
  bool keep_all_positions = false;  // sliding layers keep every position too (for dumps)
  // Capture the block forward once per session count and replay it (a CUDA graph on the GPU).
  bool graphs = false;
};

struct DraftRequest {
  Session* session = nullptr;
  int64_t anchor_token = 0;  // sits at position session->length()
  SamplingParams sampling;
};

struct DraftResult {
  std::vector<int64_t> tokens;  // B-1 draft tokens for positions a+1 .. a+B-1
  std::vector<float> probs;     // q_r(d_r), 1 for greedy
};

// What `--dump` and the tests read: the block's final-normed rows and the full logits.
struct DraftDump {
  std::vector<float> hidden;  // [S, B, H]
  std::vector<float> logits;  // [S, B-1, V]
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
  ~Drafter();

  const DrafterConfig& config() const { return cfg_; }
  const DrafterLimits& limits() const { return limits_; }

  std::unique_ptr<Session> new_session();
  // Settles n rows of taps (host, [n, T*H] f32) at positions p0 .. p0+n-1. The context is cut to
  // p0 first, so p0 must not exceed the session's length. Inputs are checked before anything
  // changes.
  void settle(Session& session, int64_t p0, const float* taps, int64_t n);
  // Drops positions >= length.
  void rollback(Session& session, int64_t length);
  // One batched draft; requests name distinct sessions.
  std::vector<DraftResult> draft(const std::vector<DraftRequest>& requests, DraftDump* dump = nullptr);

  const DraftTimes& last_times() const { return times_; }
  // Whether the block forward is captured and replayed (DrafterLimits::graphs, unless a capture
  // failed and the drafter went back to issuing ops one by one).
  bool graphs() const { return limits_.graphs; }
  // Graph segments per captured forward: 1 when the communicator joins the capture, else one
  // more than the forward's all-reduces, which then run between segments. 0: nothing captured.
  size_t graph_segments(int64_t sessions) const;
  // Copies layer l's context of the session, positions [0, length), as [length, Nk_local, D]
  // f32 each; every position must still be held (see DrafterLimits::keep_all_positions).
  void read_context(const Session& session, int64_t layer, std::vector<float>* k, std::vector<float>* v) const;
  // Context bytes per position on this rank (all layers, K and V).
  size_t context_bytes_per_position() const;

 private:
  // A captured block forward for one session count: graph segments, and the all-reduces that
  // run between them (none when the communicator can be captured).
  struct ForwardGraph {
    std::vector<std::unique_ptr<kernels::OpGraph>> segments;
    std::vector<std::pair<float*, size_t>> reduces;  // reduces[i] runs after segments[i]
    parallel::CommStats captured;  // collectives inside the segments, counted on each replay
  };

  void check_rollback(const Session& s, int64_t length) const;
  int64_t layer_capacity(int64_t layer) const;
  // Writes the step table (positions, anchors, context views, block input rows) for the requests
  // to the backend, in one copy.
  void upload_step(const std::vector<DraftRequest>& requests);
  // The block forward from the step table's rows into g_draft_: replayed, captured or issued op
  // by op.
  void forward(int64_t sessions);
  void run_layers(int64_t sessions);
  void reduce(float* data, size_t count);
  void capture(int64_t sessions);
  void conv(const float* in, float* out, const float* base, const float* delta, int64_t side, int64_t sessions);
  std::vector<DraftResult> select(const std::vector<DraftRequest>& requests, DraftDump* dump);

  std::shared_ptr<const DrafterWeights> weights_;
  const DrafterConfig& cfg_;
  kernels::Ops& ops_;
  parallel::Communicator& comm_;
  DrafterLimits limits_;
  int64_t nq_local_ = 0, nkv_local_ = 0, ffn_local_ = 0;
  int64_t next_session_id_ = 0;
  DraftTimes times_;

  // Workspaces (backend memory), sized for max_sessions * B rows or settle_chunk rows.
  kernels::Buffer x_, xc_, q_, k_, v_, attn_, o_, gate_, up_, delta_, g_, g_draft_, sel_;
  kernels::Buffer topv_, settle_u_, settle_c_, settle_k_, settle_v_;
  kernels::Buffer topi_;
  kernels::Buffer logits_dev_;  // [max_sessions * (B-1), local vocab], made on first need (sampling, dumps)

  // The step table in backend memory, read by the ops when they run (so that a replayed graph
  // sees this draft's positions and contexts): positions [M] and anchors [S] (int64), the context
  // views [layers][S], then the block rows [M, H] (f32), which the forward updates in place as
  // its residual stream. Staged on the host in step_host_ (allocated once). settle_pos_ holds a
  // settle chunk's positions.
  kernels::Buffer step_, settle_pos_;
  std::vector<unsigned char> step_host_;
  size_t anchors_offset_ = 0, views_offset_ = 0, rows_offset_ = 0;
  std::vector<int64_t> positions_;  // host staging of settle positions

  std::map<int64_t, ForwardGraph> graphs_;  // by session count
  ForwardGraph* capturing_ = nullptr;       // the graph being captured, if any
};

}  // namespace tpdraft::model
