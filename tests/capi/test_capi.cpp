// libtpdraft.so driven through its C ABI as a speculative-decoding engine drives it, against the
// float64 reference: a loop of steps on one session (settle a prefix, keep all and settle more,
// roll back, overwrite), several sessions in one step, DFlash and DFlash 2, tp 1 and 2, bf16 and
// f16 taps, seeded sampling, the draft distributions as the header lays them out, and the caps.
// The refused calls, the limits and the threading promises are in capi_errors.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "capi/capi_harness.h"
#include "core/dtype.h"
#include "tools/random_checkpoint.h"

namespace tpdraft::capi_test {
namespace {

// The steps of one decoding loop; the comment says what the target did before each.
std::vector<StepSpec> loop_steps(const tpdraft_sampling& s) {
  return {
      {-1, -1, 20, 5, s, 1},   // the prompt: 20 rows, then draft from the anchor at position 20
      {-1, -1, 3, 17, s, 2},   // every draft accepted: keep all, settle 3 more rows
      {18, -1, 2, 40, s, 3},   // a rejection: back to 18 positions, settle 2 rows
      {-1, 19, 2, 41, s, 4},   // p0 inside the session: position 19 replaced, 20 added
      {19, 17, 1, 60, s, 5},   // keep 19, then settle from 17: the context is cut to 17 first
      {-1, -1, 0, 255, s, 6},  // no new rows: draft again from another anchor
  };
}

// Runs the loop on a fresh handle of `tp` ranks; every step is checked against the reference.
// Returns the tokens of every step.
std::vector<std::vector<int64_t>> run_loop(const Checkpoint& ck, int tp, const tpdraft_sampling& s) {
  Handle h(ck, cpu_options(tp));
  Lane lane(h, ck);
  std::vector<std::vector<int64_t>> tokens;
  int n = 0;
  for (const StepSpec& spec : loop_steps(s)) {
    step_ok(h, {lane.plan(spec)});
    lane.check("tp " + std::to_string(tp) + " step " + std::to_string(++n));
    tokens.push_back(lane.tokens());
  }
  return tokens;
}

struct LoopCase {
  const char* config;
  tpdraft_sampling sampling;
};

class CapiLoop : public ::testing::TestWithParam<LoopCase> {};

TEST_P(CapiLoop, EveryStepDraftsWhatTheReferenceDraftsAtTp1AndTp2) {
  const Checkpoint ck(testing::shipped_config(GetParam().config));
  const auto tp1 = run_loop(ck, 1, GetParam().sampling);
  const auto tp2 = run_loop(ck, 2, GetParam().sampling);
  EXPECT_EQ(tp1, tp2);
}

INSTANTIATE_TEST_SUITE_P(Drafters, CapiLoop,
                         ::testing::Values(LoopCase{"tiny-dflash.json", greedy()},
                                           LoopCase{"tiny-dflash.json", sampled(0.8, 42)},
                                           LoopCase{"tiny-dflash.json", {1.2, 20, 0.9, 5}},
                                           LoopCase{"tiny-dflash2.json", greedy()},
                                           LoopCase{"tiny-dflash2.json", sampled(0.7, 9)}));

TEST(CapiBatch, SeveralSessionsInOneStepInAnyOrder) {
  for (const char* file : {"tiny-dflash.json", "tiny-dflash2.json"}) {
    SCOPED_TRACE(file);
    const Checkpoint ck(testing::shipped_config(file));
    Handle h(ck, cpu_options());
    Lane a(h, ck), b(h, ck), c(h, ck);
    step_ok(h, {a.plan({-1, -1, 0, 11, greedy(), 1}),
                b.plan({-1, -1, 9, 12, greedy(), 2}),
                c.plan({-1, -1, 33, 13, sampled(0.9, 3), 3})});
    const std::pair<const Lane*, std::string> lanes[] = {{&a, "a"}, {&b, "b"}, {&c, "c"}};
    for (const auto& [lane, name] : lanes) lane->check(name + ", first step");
    step_ok(h, {c.plan({-1, -1, 1, 14, sampled(0.9, 4), 4}),
                a.plan({-1, -1, 4, 15, greedy(), 5}),
                b.plan({7, -1, 2, 16, sampled(1.1, 6), 6})});
    for (const auto& [lane, name] : lanes) lane->check(name + ", second step");
    // The library says where the step's time went: parts within the whole, all of them spent.
    tpdraft_step_times t{};
    ASSERT_EQ(tpdraft_last_step_times(h.get(), &t), TPDRAFT_OK);
    EXPECT_GT(t.settle_seconds, 0.0);
    EXPECT_GT(t.draft_seconds, 0.0);
    EXPECT_LE(t.settle_seconds + t.draft_seconds, t.total_seconds);
  }
}

constexpr int64_t kGuardId = -99;
constexpr float kGuardProb = -9.0f;
constexpr size_t kGuard = 16;  // entries past the end of each buffer that must stay untouched

// One entry's outputs: its tokens and q, and distribution buffers of `rows` x `width` followed
// by guard entries.
struct DistBuffers {
  std::vector<int64_t> tokens, ids;
  std::vector<float> q, probs, rest;
  DistBuffers(size_t rows, size_t width)
      : tokens(rows), ids(rows * width + kGuard, kGuardId), q(rows), probs(rows * width + kGuard, kGuardProb),
        rest(rows + kGuard, kGuardProb) {}
  // Steps `e` alone, its outputs here with a distribution of `dist_width`.
  void step(const Handle& h, tpdraft_step_entry e, int64_t dist_width) {
    e.tokens = tokens.data();
    e.q = q.data();
    e.dist_width = dist_width;
    e.dist_ids = dist_width > 0 ? ids.data() : nullptr;
    e.dist_probs = probs.data();
    e.dist_rest = rest.data();
    step_ok(h, {e});
  }
  void expect_guards_intact(size_t rows, size_t width) const {
    for (size_t i = rows * width; i < ids.size(); ++i) EXPECT_EQ(ids[i], kGuardId) << "ids[" << i << "]";
    for (size_t i = rows * width; i < probs.size(); ++i) EXPECT_EQ(probs[i], kGuardProb) << "probs[" << i << "]";
    for (size_t i = rows; i < rest.size(); ++i) EXPECT_EQ(rest[i], kGuardProb) << "rest[" << i << "]";
  }
};

// Settles `rows` tap rows given as `dtype` bytes into a fresh session and drafts (sampled), with
// a distribution of width 4.
DistBuffers draft_from(const Handle& h, const Checkpoint& ck, const void* taps, tpdraft_dtype dtype,
                       int64_t rows) {
  DistBuffers d(static_cast<size_t>(ck.cfg.block - 1), 4);
  tpdraft_step_entry e = entry(h.open_session(), rows, taps, 77, sampled(0.9, 8), nullptr);
  e.taps_dtype = dtype;
  d.step(h, e, 4);
  return d;
}

TEST(CapiTaps, Bf16AndF16TapsDraftAsTheF32TapsRoundedTheSameWay) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash.json"));
  Handle h(ck, cpu_options());
  const int64_t rows = 12;
  const std::vector<float> taps = model::random_taps(ck.cfg, rows, 31);
  const std::pair<DType, tpdraft_dtype> kinds[] = {{DType::BF16, TPDRAFT_BF16}, {DType::F16, TPDRAFT_F16}};
  for (const auto& [dtype, abi] : kinds) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<unsigned char> bytes(taps.size() * dtype_size(dtype));
    convert_from_f32(dtype, taps.data(), bytes.data(), taps.size());
    // The same bytes back in f32: the taps rounded as the library must read the dtype's bytes.
    std::vector<float> same(taps.size());
    convert_to_f32(dtype, bytes.data(), same.data(), taps.size());
    const DistBuffers got = draft_from(h, ck, bytes.data(), abi, rows);
    const DistBuffers want = draft_from(h, ck, same.data(), TPDRAFT_F32, rows);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.q, want.q);
    EXPECT_EQ(got.ids, want.ids);
    EXPECT_EQ(got.probs, want.probs);
    EXPECT_EQ(got.rest, want.rest);
    // The rounding is the one the reference sees too (and differs from the f32 taps).
    EXPECT_NE(same, taps);
    reference::RefContext ctx;
    ck.ref->settle(ctx, 0, widen(same), rows);
    const reference::RefDraft ref = ck.ref->draft(ctx, 77, {0.9, 0, 1.0, 8});
    EXPECT_EQ(got.tokens, ref.tokens);
    for (size_t i = 0; i < got.q.size(); ++i) EXPECT_NEAR(got.q[i], ref.probs[i], 1e-4) << "row " << i + 1;
  }
}

// ---- distributions -----------------------------------------------------------------------------

// softmax(logits / T) of one reference row, every token.
std::vector<double> softmax_row(const std::vector<double>& logits, size_t row, size_t vocab, double temperature) {
  std::vector<double> p(logits.begin() + static_cast<std::ptrdiff_t>(row * vocab),
                        logits.begin() + static_cast<std::ptrdiff_t>((row + 1) * vocab));
  const double top = *std::max_element(p.begin(), p.end());
  double z = 0;
  for (double& x : p) z += (x = std::exp((x - top) / temperature));
  for (double& x : p) x /= z;
  return p;
}

// One session with `rows` settled taps, and a step drafting from it with `dist_width`.
struct DistRun {
  DistBuffers out;
  reference::RefDraft want;
  DistRun(const Checkpoint& ck, const Handle& h, const tpdraft_sampling& s, int64_t dist_width, size_t width)
      : out(static_cast<size_t>(ck.cfg.block - 1), width) {
    const std::vector<float> taps = model::random_taps(ck.cfg, 15, 41);
    out.step(h, entry(h.open_session(), 15, taps.data(), 21, s, nullptr), dist_width);
    reference::RefContext ctx;
    ck.ref->settle(ctx, 0, widen(taps), 15);
    want = ck.ref->draft(ctx, 21, {s.temperature, s.top_k, s.top_p, s.seed});
    EXPECT_EQ(out.tokens, want.tokens);
    out.expect_guards_intact(out.tokens.size(), width);
  }
};

// Row r of a width-w listing against the exact distribution p: the ids by probability (a near
// tie may swap two, so each listed probability is checked against its own id and against the
// exact w largest), and the rest mass.
void expect_top(const DistBuffers& out, size_t r, size_t w, const std::vector<double>& p) {
  std::vector<double> sorted = p;
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  double listed = 0;
  for (size_t j = 0; j < w; ++j) {
    const int64_t id = out.ids[r * w + j];
    ASSERT_TRUE(id >= 0 && id < static_cast<int64_t>(p.size())) << "row " << r << " id " << id;
    EXPECT_NEAR(out.probs[r * w + j], p[static_cast<size_t>(id)], 2e-4) << "row " << r << " id " << id;
    EXPECT_NEAR(out.probs[r * w + j], sorted[j], 2e-4) << "row " << r << " place " << j;
    if (j > 0) {
      EXPECT_GE(out.probs[r * w + j - 1], out.probs[r * w + j]) << "row " << r;
    }
    listed += sorted[j];
  }
  EXPECT_NEAR(out.rest[r], 1.0 - listed, 2e-4) << "row " << r;
}

TEST(CapiDistributions, DFlashSampledTopWidthAndFullAgainstTheReference) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash.json"));
  Handle h(ck, cpu_options());
  const size_t rows = static_cast<size_t>(ck.cfg.block - 1), V = static_cast<size_t>(ck.cfg.vocab), w = 5;
  const tpdraft_sampling s = sampled(0.8, 12);
  const DistRun top(ck, h, s, static_cast<int64_t>(w), w);
  const DistRun full(ck, h, s, TPDRAFT_DIST_FULL, V);
  for (size_t r = 0; r < rows; ++r) {
    const std::vector<double> p = softmax_row(top.want.logits, r, V, s.temperature);
    expect_top(top.out, r, w, p);
    EXPECT_NEAR(top.out.q[r], p[static_cast<size_t>(top.out.tokens[r])], 2e-4) << "row " << r;
    double total = 0;
    for (size_t v = 0; v < V; ++v) {
      EXPECT_NEAR(full.out.probs[r * V + v], p[v], 2e-4) << "row " << r << " token " << v;
      total += full.out.probs[r * V + v];
    }
    EXPECT_NEAR(total, 1.0, 1e-4) << "row " << r;
  }
  // dist_ids is not needed for the full distribution: it was left NULL and nothing failed.
}

TEST(CapiDistributions, GreedyListsThePickAlone) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash.json"));
  Handle h(ck, cpu_options());
  const size_t rows = static_cast<size_t>(ck.cfg.block - 1), w = 3;
  const DistRun run(ck, h, greedy(), static_cast<int64_t>(w), w);
  for (size_t r = 0; r < rows; ++r) {
    const std::vector<int64_t> ids(run.out.ids.begin() + static_cast<std::ptrdiff_t>(r * w),
                                   run.out.ids.begin() + static_cast<std::ptrdiff_t>((r + 1) * w));
    EXPECT_EQ(ids, (std::vector<int64_t>{run.want.tokens[r], -1, -1})) << "row " << r;
    EXPECT_EQ(run.out.probs[r * w], 1.0f);
    EXPECT_EQ(run.out.probs[r * w + 1], 0.0f);
    EXPECT_EQ(run.out.probs[r * w + 2], 0.0f);
    EXPECT_EQ(run.out.rest[r], 0.0f);
    EXPECT_EQ(run.out.q[r], 1.0f);
  }
}

// A DFlash 2 draw is among the selector's candidates: a width past their count lists them all,
// then -1 with probability 0, and the drafted token with its q among them.
TEST(CapiDistributions, DFlash2SampledListsTheSelectorCandidates) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash2.json"));
  Handle h(ck, cpu_options());
  const size_t rows = static_cast<size_t>(ck.cfg.block - 1), k = static_cast<size_t>(ck.cfg.selector_topk),
               w = k + 2;
  const DistRun run(ck, h, sampled(0.7, 9), static_cast<int64_t>(w), w);
  for (size_t r = 0; r < rows; ++r) {
    double total = 0;
    bool drafted_listed = false;
    for (size_t j = 0; j < w; ++j) {
      const int64_t id = run.out.ids[r * w + j];
      const float p = run.out.probs[r * w + j];
      if (j >= k) {
        EXPECT_EQ(id, -1) << "row " << r << " place " << j;
        EXPECT_EQ(p, 0.0f) << "row " << r << " place " << j;
        continue;
      }
      EXPECT_TRUE(id >= 0 && id < ck.cfg.vocab) << "row " << r << " id " << id;
      if (id == run.out.tokens[r]) {
        drafted_listed = true;
        EXPECT_NEAR(p, run.out.q[r], 1e-6) << "row " << r;
      }
      total += p;
    }
    EXPECT_TRUE(drafted_listed) << "row " << r;
    EXPECT_NEAR(total, 1.0, 1e-5) << "row " << r;
    EXPECT_NEAR(run.out.rest[r], 0.0f, 1e-5) << "row " << r;
    EXPECT_NEAR(run.out.q[r], run.want.probs[r], 1e-4) << "row " << r;
  }
}

// ---- draft vocabularies ------------------------------------------------------------------------

// Every third id and the last: the map of the C ABI tests.
std::vector<int64_t> every_third(int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < vocab; t += 3) ids.push_back(t);
  ids.push_back(vocab - 1);
  return ids;
}

// The loop of run_loop through a token map given as a file or as ids, and a speculators
// checkpoint's own draft vocabulary: every step against the reference over the same map, tokens
// inside it, tp 1 and 2 alike, and the caps saying how many ids the head scores.
TEST(CapiDraftVocab, TokenMapFileOrIdsDraftWhatTheReferenceDrafts) {
  const model::DrafterConfig cfg = testing::shipped_config("tiny-dflash.json");
  const std::vector<int64_t> ids = every_third(cfg.vocab);
  const Checkpoint ck(cfg, ids);
  std::string json = "[";
  for (size_t i = ids.size(); i-- > 0;) json += std::to_string(ids[i]) + (i ? ", " : "]");  // any order
  testing::write_text(ck.dir.file("map.json"), json);
  std::vector<int64_t> repeated = ids;
  repeated.insert(repeated.end(), ids.begin(), ids.begin() + 5);  // repeats are dropped
  for (const tpdraft_sampling& s : {greedy(), sampled(0.9, 3), tpdraft_sampling{1.1, 9, 0.8, 6}}) {
    for (int tp : {1, 2}) {
      for (bool as_file : {true, false}) {
        tpdraft_options o = cpu_options(tp);
        const std::string path = ck.dir.file("map.json");
        if (as_file) {
          o.token_map = path.c_str();
        } else {
          o.token_ids = repeated.data();
          o.n_token_ids = static_cast<int64_t>(repeated.size());
        }
        Handle h(ck, o);
        tpdraft_caps caps{sizeof caps};
        ASSERT_EQ(tpdraft_caps_get(h.get(), &caps), TPDRAFT_OK) << tpdraft_last_error();
        EXPECT_EQ(caps.draft_vocab_size, static_cast<int64_t>(ids.size()));
        EXPECT_EQ(caps.vocab_size, cfg.vocab);
        Lane lane(h, ck);
        int n = 0;
        for (const StepSpec& spec : loop_steps(s)) {
          step_ok(h, {lane.plan(spec)});
          lane.check("tp " + std::to_string(tp) + (as_file ? " file" : " ids") + " step " + std::to_string(++n));
          for (int64_t t : lane.tokens()) EXPECT_EQ(t % 3 == 0 || t == cfg.vocab - 1, true) << "token " << t;
        }
      }
    }
  }
}

TEST(CapiDraftVocab, SpeculatorsCheckpointDraftsWithItsOwnTables) {
  model::DrafterConfig cfg = testing::shipped_config("tiny-dflash.json");
  cfg.layout = model::Layout::Speculators;
  cfg.arch_name = "DFlashSpeculator";
  cfg.draft_vocab = 61;
  const Checkpoint ck(cfg);
  for (const tpdraft_sampling& s : {greedy(), sampled(0.8, 11)}) {
    const auto tp1 = run_loop(ck, 1, s);
    EXPECT_EQ(tp1, run_loop(ck, 2, s));
  }
  Handle h(ck, cpu_options());
  tpdraft_caps caps{sizeof caps};
  ASSERT_EQ(tpdraft_caps_get(h.get(), &caps), TPDRAFT_OK) << tpdraft_last_error();
  EXPECT_STREQ(caps.architecture, "DFlashSpeculator");
  EXPECT_EQ(caps.draft_vocab_size, 61);
}

// The full distribution of a sampled draft over a map: the reference's softmax over the mapped
// ids, exactly zero elsewhere (what rejection sampling needs).
TEST(CapiDraftVocab, TheFullDistributionIsZeroOutsideTheMap) {
  const model::DrafterConfig cfg = testing::shipped_config("tiny-dflash.json");
  const std::vector<int64_t> ids = every_third(cfg.vocab);
  const Checkpoint ck(cfg, ids);
  tpdraft_options o = cpu_options(2);
  o.token_ids = ids.data();
  o.n_token_ids = static_cast<int64_t>(ids.size());
  Handle h(ck, o);
  const size_t rows = static_cast<size_t>(cfg.block - 1), V = static_cast<size_t>(cfg.vocab);
  const tpdraft_sampling s = sampled(0.8, 12);
  const DistRun full(ck, h, s, TPDRAFT_DIST_FULL, V);
  for (size_t r = 0; r < rows; ++r) {
    const std::vector<double> p = softmax_row(full.want.logits, r, V, s.temperature);
    double inside = 0;
    for (size_t v = 0; v < V; ++v) {
      const bool mapped = v % 3 == 0 || v == V - 1;
      EXPECT_NEAR(full.out.probs[r * V + v], p[v], 2e-4) << "row " << r << " token " << v;
      if (!mapped) {
        EXPECT_EQ(full.out.probs[r * V + v], 0.0f) << "row " << r << " token " << v;
      }
      inside += mapped ? full.out.probs[r * V + v] : 0.0;
    }
    EXPECT_NEAR(inside, 1.0, 1e-4) << "row " << r;
  }
}

// ---- caps --------------------------------------------------------------------------------------

TEST(CapiCaps, EqualTheConfigAndTheOptions) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash2.json"));
  tpdraft_options o = cpu_options(2);
  o.max_sessions = 3;
  o.max_context = 100;
  o.max_open_sessions = 5;
  Handle h(ck, o);
  tpdraft_caps caps{sizeof caps};
  ASSERT_EQ(tpdraft_caps_get(h.get(), &caps), TPDRAFT_OK) << tpdraft_last_error();
  const model::DrafterConfig& c = ck.cfg;
  EXPECT_STREQ(caps.architecture, "DFlash2DraftModel");
  EXPECT_STREQ(caps.backend, "cpu");
  EXPECT_EQ(caps.block_size, c.block);
  EXPECT_EQ(caps.tp, 2);
  EXPECT_EQ(caps.taps_width, c.n_taps() * c.hidden);
  EXPECT_EQ(caps.hidden_size, c.hidden);
  EXPECT_EQ(caps.vocab_size, c.vocab);
  EXPECT_EQ(caps.mask_token_id, c.mask_token);
  ASSERT_EQ(caps.n_target_layers, static_cast<int32_t>(c.taps.size()));
  EXPECT_EQ(std::vector<int64_t>(caps.target_layer_ids, caps.target_layer_ids + caps.n_target_layers),
            (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(caps.max_sessions, 3);
  EXPECT_EQ(caps.max_context, 100);
  EXPECT_EQ(caps.max_open_sessions, 5);
}

TEST(CapiCaps, NullOptionsGiveTheDocumentedDefaults) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash.json"));
  tpdraft_drafter* d = nullptr;
  ASSERT_EQ(tpdraft_open(ck.drafter_dir().c_str(), ck.target_dir().c_str(), nullptr, &d), TPDRAFT_OK)
      << tpdraft_last_error();
  tpdraft_caps caps{sizeof caps};
  EXPECT_EQ(tpdraft_caps_get(d, &caps), TPDRAFT_OK) << tpdraft_last_error();
  EXPECT_STREQ(caps.architecture, "DFlashDraftModel");
  EXPECT_EQ(caps.tp, 1);
  EXPECT_EQ(caps.max_sessions, 8);
  EXPECT_EQ(caps.max_context, 4096);
  EXPECT_EQ(caps.max_open_sessions, 64);
  EXPECT_EQ(caps.n_target_layers, 2);
  tpdraft_close(d);
}

TEST(CapiCaps, VersionAndStatusNames) {
  EXPECT_STREQ(tpdraft_version(), TPDRAFT_VERSION_STRING);
  const std::pair<int, const char*> names[] = {
      {TPDRAFT_OK, "ok"}, {TPDRAFT_ERROR_ARGUMENT, "argument"}, {TPDRAFT_ERROR_INPUT, "input"},
      {TPDRAFT_ERROR_RUNTIME, "runtime"}, {42, "unknown"}};
  for (const auto& [status, name] : names) EXPECT_STREQ(tpdraft_status_name(status), name) << status;
}

// An entry from tpdraft_step_entry_init asks for nothing beyond a greedy draft: keep and p0 -1,
// no rows, top_p 1 (a zeroed entry's top_p 0 would be refused), no distribution, no buffers.
TEST(CapiEntry, InitAsksForAPlainGreedyDraft) {
  tpdraft_step_entry e;
  std::memset(&e, 0x5a, sizeof(e));
  tpdraft_step_entry_init(&e);
  EXPECT_EQ(e.keep, -1);
  EXPECT_EQ(e.p0, -1);
  EXPECT_EQ(e.n_new, 0);
  EXPECT_EQ(e.taps, nullptr);
  EXPECT_EQ(e.taps_dtype, TPDRAFT_F32);
  EXPECT_EQ(e.taps_on_device, 0);
  EXPECT_EQ(e.sampling.temperature, 0.0);
  EXPECT_EQ(e.sampling.top_k, 0);
  EXPECT_EQ(e.sampling.top_p, 1.0);
  EXPECT_EQ(e.dist_width, 0);
  EXPECT_EQ(e.tokens, nullptr);
  EXPECT_EQ(e.q, nullptr);
  tpdraft_step_entry_init(nullptr);  // harmless
}

}  // namespace
}  // namespace tpdraft::capi_test
