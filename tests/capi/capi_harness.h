// What the C ABI tests share: a random checkpoint on disk with the float64 reference over it, a
// drafter handle opened through libtpdraft.so, and a Lane (one session driven through
// tpdraft_step beside the reference's own context for it, checked after every step).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/config.h"
#include "reference/reference.h"
#include "support/rank.h"
#include "support/test_support.h"
#include "tpdraft/tpdraft.h"

namespace tpdraft::capi_test {

// A checkpoint of `cfg` (bf16 weights, seed 7) in its own temp dir, and the reference over it
// (drafting over `token_map` when one is given).
struct Checkpoint {
  testing::TempDir dir;
  model::DrafterConfig cfg;
  std::unique_ptr<reference::RefModel> ref;

  explicit Checkpoint(const model::DrafterConfig& config, const std::vector<int64_t>& token_map = {});
  std::string drafter_dir() const { return dir.file("drafter"); }
  std::string target_dir() const { return dir.file("target"); }
};

// Options for the cpu backend with one thread per rank.
tpdraft_options cpu_options(int tp = 1);

// Owns a drafter handle; closes it on destruction.
class Handle {
 public:
  Handle(const Checkpoint& ck, const tpdraft_options& options);
  ~Handle() { tpdraft_close(d_); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  tpdraft_drafter* get() const { return d_; }
  tpdraft_session open_session() const;
  int64_t length(tpdraft_session s) const;  // tpdraft_session_length, asserted to succeed

 private:
  tpdraft_drafter* d_ = nullptr;
};

tpdraft_sampling greedy();
tpdraft_sampling sampled(double temperature, uint64_t seed);

// An entry settling `n_new` f32 tap rows into session `s` as they come (keep and p0 -1) and
// drafting from `anchor` into `tokens`; no q, no distribution.
tpdraft_step_entry entry(tpdraft_session s, int64_t n_new, const void* taps, int64_t anchor,
                         const tpdraft_sampling& sampling, int64_t* tokens);

// One step of one session, as a decoding loop asks for it.
struct StepSpec {
  int64_t keep = -1;
  int64_t p0 = -1;
  int64_t n_new = 0;
  int64_t anchor = 0;
  tpdraft_sampling sampling = greedy();
  uint64_t taps_seed = 0;
};

// One session of a handle and the reference context that mirrors it.
class Lane {
 public:
  Lane(const Handle& handle, const Checkpoint& ck);

  // Fills the entry for `spec` (f32 taps, outputs in this lane) and moves the reference context
  // the same way; the reference's draft for it becomes what check() expects.
  tpdraft_step_entry plan(const StepSpec& spec);
  // After the step: tokens equal to the reference's, q within 1e-4, the session's length.
  void check(const std::string& what) const;

  tpdraft_session session() const { return session_; }
  const std::vector<int64_t>& tokens() const { return tokens_; }

 private:
  const Handle& handle_;
  const Checkpoint& ck_;
  tpdraft_session session_;
  reference::RefContext ctx_;
  std::vector<float> taps_;
  std::vector<int64_t> tokens_;
  std::vector<float> q_;
  reference::RefDraft want_;
  bool sampled_ = false;
};

// Runs a step of the given entries and asserts it succeeded.
void step_ok(const Handle& handle, std::vector<tpdraft_step_entry> entries);

// f32 tap rows widened for the reference.
std::vector<double> widen(const std::vector<float>& v);

}  // namespace tpdraft::capi_test
