// The drafter as a speculative-decoding loop drives it, on one rank: sessions by id, and a step
// that for each entry rolls a session back, settles the taps of the positions the target just
// committed and drafts one block from the anchor, every entry in one batched forward. Every
// entry is checked before anything changes. The library and `tpdraft draft`, `bench` and `serve`
// all drive ranks through this class; every rank of a group makes the same calls in the same
// order (sessions get the same ids everywhere).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/runtime.h"
#include "kernels/buffer.h"
#include "model/drafter.h"
#include "parallel/communicator.h"

namespace tpdraft::engine {

// What a caller needs to know of the drafter to drive it.
struct Caps {
  std::string architecture;
  int64_t block = 0;       // B: one anchor row and B - 1 drafted tokens per step
  int64_t taps_width = 0;  // T * H floats per tap row
  int64_t hidden = 0;      // H
  int64_t vocab = 0;       // V
  int64_t draft_vocab = 0; // N: target ids the head scores (a draft vocabulary), V when it scores all
  int64_t mask_token = 0;
  std::vector<int64_t> target_layers;  // the target layers whose outputs make a tap row, in order
  int64_t tp = 1;
  int64_t max_sessions = 0;       // entries in one step
  int64_t max_context = 0;        // positions one session may hold
  int64_t max_open_sessions = 0;  // sessions open at once
};

// Where one entry's tap rows are: [n_new, T*H] of F32, BF16 or F16, in host memory or in the
// device memory of a CUDA backend, written by work queued on `stream` (a cudaStream_t).
struct TapRows {
  const void* data = nullptr;
  DType dtype = DType::F32;
  bool on_device = false;
  void* stream = nullptr;
};

// Where the last step's time went on this rank (seconds).
struct StepTimes {
  double settle = 0;  // roll-backs and settling the new rows
  double draft = 0;   // the batched draft: forward, head, selection (and a dump, when asked)
  parallel::CommStats comm;  // the draft's collectives
};

// What a step dumps when asked: the drafter's dump of the draft and, with `context`, each layer's
// whole context [n, Nk, D] of the first entry's session after it, assembled from the ranks'
// slices. Every rank of the group takes part, so every rank must ask alike.
struct StepDump {
  bool context = false;
  model::DraftDump draft;
  std::vector<std::vector<float>> k, v;  // per layer
};

struct StepEntry {
  int64_t session = -1;
  int64_t keep = -1;  // roll the session back to this length first; -1: keep what it holds
  int64_t p0 = -1;    // position of the first new row; -1: the length after the roll-back
  int64_t n_new = 0;  // tap rows of positions p0 .. p0 + n_new - 1
  TapRows taps;
  int64_t anchor = 0;  // the token at position p0 + n_new, from which the block is drafted
  model::SamplingParams sampling;
  int64_t dist_width = 0;  // each row's draft distribution (model::DraftRequest::dist_width)
};

class Engine {
 public:
  // `group` is this rank's tensor-parallel group; it must outlive the engine. max_open_sessions
  // bounds the sessions held at once (each holds max_context positions of context).
  Engine(const model::ModelSource& source, parallel::Communicator& group, const model::RuntimeOptions& options,
         int64_t max_open_sessions);

  const Caps& caps() const { return caps_; }
  const StepTimes& last_times() const { return times_; }
  model::RankRuntime& runtime() { return *rt_; }

  int64_t open_session();
  void close_session(int64_t id);
  int64_t session_length(int64_t id) const;
  int64_t open_sessions() const { return static_cast<int64_t>(sessions_.size()); }

  // Every entry is checked first (an unknown or repeated session, a roll-back the session
  // cannot make, positions beyond the session or its limit, missing or non-finite taps, an anchor
  // outside the vocabulary, bad sampling): a bad entry throws tpdraft::Error naming the entry and
  // nothing changes. Then each session is rolled back and settled, and all are drafted together.
  // A collective: every rank of the group calls it with the same entries.
  std::vector<model::DraftResult> step(const std::vector<StepEntry>& entries, StepDump* dump = nullptr);
  // The two halves of step: the checks (no collective, no change; the same verdict on every
  // rank, so one rank may check for all), and the work on entries that passed them.
  void check(const std::vector<StepEntry>& entries) const;
  std::vector<model::DraftResult> apply(const std::vector<StepEntry>& entries, StepDump* dump = nullptr);
  // Throws naming the session when it is not open.
  void check_open(int64_t id) const { session(id); }

 private:
  model::Session& session(int64_t id) const;
  // One entry's checks (`seen`: the sessions of the entries before it); check() prefixes the
  // entry's index to whatever they refuse.
  void check_entry(const StepEntry& e, std::set<int64_t>* seen) const;
  void check_taps(const StepEntry& e, int64_t p0) const;  // p0: the entry's first new position
  // The entry's tap rows as f32 where the drafter reads them (converted into staged_ if need be).
  const float* taps_f32(const StepEntry& e);

  std::unique_ptr<model::RankRuntime> rt_;
  Caps caps_;
  std::map<int64_t, std::unique_ptr<model::Session>> sessions_;
  int64_t next_id_ = 1;
  std::vector<float> staged_;
  kernels::Buffer device_staged_;  // device taps of f16 / bf16 widened to f32, on the backend
  StepTimes times_;
};

}  // namespace tpdraft::engine
