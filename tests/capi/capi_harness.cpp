// The C ABI tests' checkpoint, handle and lane: a session stepped through libtpdraft.so while
// the float64 reference settles and drafts the same rows, so every step has its expected draft.
#include "capi/capi_harness.h"

#include <gtest/gtest.h>

#include "tools/random_checkpoint.h"

namespace tpdraft::capi_test {

Checkpoint::Checkpoint(const model::DrafterConfig& config, const std::vector<int64_t>& token_map) : cfg(config) {
  model::RandomCheckpointOptions o;
  o.seed = 7;
  o.threads = 2;
  model::write_random_checkpoint(cfg, dir.path(), o, 0);
  ref = std::make_unique<reference::RefModel>(drafter_dir(), target_dir(), token_map);
}

tpdraft_options cpu_options(int tp) {
  tpdraft_options o;
  tpdraft_options_init(&o);
  o.backend = "cpu";
  o.threads = 1;
  o.tp = tp;
  o.max_sessions = 4;
  o.max_context = 128;
  return o;
}

Handle::Handle(const Checkpoint& ck, const tpdraft_options& options) {
  const tpdraft_status st = tpdraft_open(ck.drafter_dir().c_str(), ck.target_dir().c_str(), &options, &d_);
  if (st != TPDRAFT_OK) ADD_FAILURE() << "tpdraft_open: " << tpdraft_last_error();
}

tpdraft_session Handle::open_session() const {
  tpdraft_session s = -1;
  EXPECT_EQ(tpdraft_session_open(d_, &s), TPDRAFT_OK) << tpdraft_last_error();
  return s;
}

int64_t Handle::length(tpdraft_session s) const {
  int64_t n = -1;
  EXPECT_EQ(tpdraft_session_length(d_, s, &n), TPDRAFT_OK) << tpdraft_last_error();
  return n;
}

tpdraft_sampling greedy() { return {0.0, 0, 1.0, 0}; }
tpdraft_sampling sampled(double temperature, uint64_t seed) { return {temperature, 0, 1.0, seed}; }

tpdraft_step_entry entry(tpdraft_session s, int64_t n_new, const void* taps, int64_t anchor,
                         const tpdraft_sampling& sampling, int64_t* tokens) {
  tpdraft_step_entry e;
  tpdraft_step_entry_init(&e);  // keep and p0 -1, f32 taps
  e.session = s;
  e.n_new = n_new;
  e.taps = taps;
  e.anchor = anchor;
  e.sampling = sampling;
  e.tokens = tokens;
  return e;
}

std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

Lane::Lane(const Handle& handle, const Checkpoint& ck)
    : handle_(handle), ck_(ck), session_(handle.open_session()) {
  const size_t drafts = static_cast<size_t>(ck.cfg.block - 1);
  tokens_.assign(drafts, -7);
  q_.assign(drafts, -7.0f);
}

tpdraft_step_entry Lane::plan(const StepSpec& spec) {
  const reference::RefModel& ref = *ck_.ref;
  if (spec.keep >= 0) ref.settle(ctx_, spec.keep, {}, 0);
  const int64_t p0 = spec.p0 < 0 ? ctx_.length() : spec.p0;
  taps_ = model::random_taps(ck_.cfg, spec.n_new, spec.taps_seed);
  ref.settle(ctx_, p0, widen(taps_), spec.n_new);
  const tpdraft_sampling& s = spec.sampling;
  want_ = ref.draft(ctx_, spec.anchor, {s.temperature, s.top_k, s.top_p, s.seed});
  sampled_ = s.temperature > 0;

  tpdraft_step_entry e = entry(session_, spec.n_new, taps_.data(), spec.anchor, s, tokens_.data());
  e.keep = spec.keep;
  e.p0 = spec.p0;
  e.q = q_.data();
  return e;
}

void Lane::check(const std::string& what) const {
  EXPECT_EQ(tokens_, want_.tokens) << what;
  ASSERT_EQ(q_.size(), want_.probs.size()) << what;
  for (size_t i = 0; i < q_.size(); ++i) {
    if (sampled_) {
      EXPECT_NEAR(q_[i], want_.probs[i], 1e-4) << what << " row " << i + 1;
    } else {
      EXPECT_EQ(q_[i], 1.0f) << what << " row " << i + 1;
    }
  }
  EXPECT_EQ(handle_.length(session_), ctx_.length()) << what;
}

void step_ok(const Handle& handle, std::vector<tpdraft_step_entry> entries) {
  ASSERT_EQ(tpdraft_step(handle.get(), entries.data(), entries.size()), TPDRAFT_OK) << tpdraft_last_error();
  EXPECT_STREQ(tpdraft_last_error(), "");
}

}  // namespace tpdraft::capi_test
