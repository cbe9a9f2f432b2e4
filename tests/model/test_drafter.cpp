// Whole drafts of the fast path against the independent float64 reference, on random
// checkpoints written to disk in the real format: both architectures, every attention kind, GQA
// 1/2/4, bias, soft cap, block sizes 2..16, contexts 0..300, padded / tied target heads, weight
// dtypes, several sessions, settle in pieces with rollback, seeded sampling.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime.h"
#include "model/drafter.h"
#include "parallel/communicator.h"
#include "reference/reference.h"
#include "support/rank.h"
#include "support/test_support.h"
#include "tools/random_checkpoint.h"

namespace tpdraft {
namespace {

using model::DrafterConfig;
using testing::expect_error;
using testing::shipped_config;

struct Case {
  std::string name;
  DrafterConfig cfg;
  DType dtype = DType::BF16;
  int64_t target_vocab = 0;
  bool tie = false;
  int64_t context = 40;
  model::SamplingParams sampling;
};

// A checkpoint on disk plus the fast drafter and the reference over it.
struct Fixture {
  testing::TempDir dir;
  DrafterConfig cfg;
  std::unique_ptr<parallel::Communicator> comm;
  std::unique_ptr<model::RankRuntime> rt;
  model::Drafter* drafter = nullptr;
  std::unique_ptr<reference::RefModel> ref;

  Fixture(const Case& c, int64_t max_sessions = 1, int64_t max_context = 512) : cfg(c.cfg) {
    model::RandomCheckpointOptions o;
    o.seed = 7;
    o.dtype = c.dtype;
    o.target_vocab = c.target_vocab;
    o.tie_embeddings = c.tie;
    o.threads = 2;
    model::write_random_checkpoint(cfg, dir.path(), o, 0);
    comm = parallel::make_single_rank();
    model::RuntimeOptions ro = testing::backend("cpu", 2);
    ro.limits.max_sessions = max_sessions;
    ro.limits.max_context = max_context;
    ro.limits.settle_chunk = 64;  // several chunks for the longer contexts
    rt = testing::open_rank(*comm, dir.path(), cfg, ro);
    drafter = &rt->drafter();
    ref = std::make_unique<reference::RefModel>(dir.file("drafter"), dir.file("target"));
  }
};

std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Checks one fast draft against the reference draft.
void expect_match(const model::DraftResult& got, const model::DraftDump& dump, size_t session,
                  const reference::RefDraft& want, const DrafterConfig& cfg, const std::string& what) {
  const size_t B = static_cast<size_t>(cfg.block), H = static_cast<size_t>(cfg.hidden), V = static_cast<size_t>(cfg.vocab);
  std::vector<float> hidden(dump.hidden.begin() + static_cast<std::ptrdiff_t>(session * B * H),
                            dump.hidden.begin() + static_cast<std::ptrdiff_t>((session + 1) * B * H));
  std::vector<float> logits(dump.logits.begin() + static_cast<std::ptrdiff_t>(session * (B - 1) * V),
                            dump.logits.begin() + static_cast<std::ptrdiff_t>((session + 1) * (B - 1) * V));
  // Same bf16 weights on both sides: only f32 vs f64 arithmetic differs.
  EXPECT_LT(testing::relative_error(hidden, want.hidden), 1e-4) << what;
  EXPECT_LT(testing::relative_error(logits, want.logits), 1e-4) << what;
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.probs.size(), want.probs.size()) << what;
  for (size_t i = 0; i < got.probs.size(); ++i) EXPECT_NEAR(got.probs[i], want.probs[i], 1e-4) << what << " row " << i + 1;
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name);
  Fixture f(c);
  const std::vector<float> taps = model::random_taps(c.cfg, c.context, 11);
  auto session = f.drafter->new_session();
  f.drafter->settle(*session, 0, taps.data(), c.context);
  reference::RefContext rctx;
  f.ref->settle(rctx, 0, widen(taps), c.context);

  const int64_t anchor = (c.cfg.vocab / 3) % c.cfg.vocab;
  model::DraftDump dump;
  const auto got = f.drafter->draft({{session.get(), anchor, c.sampling}}, &dump);
  reference::RefSampling rs{c.sampling.temperature, c.sampling.top_k, c.sampling.top_p, c.sampling.seed};
  expect_match(got[0], dump, 0, f.ref->draft(rctx, anchor, rs), c.cfg, c.name);
}

TEST(DrafterParity, DFlashFullAttention) { run_case({"dflash full", shipped_config("tiny-dflash.json")}); }

TEST(DrafterParity, DFlash2SlidingWindowSmallerThanContext) {
  run_case({"dflash2 sliding", shipped_config("tiny-dflash2.json")});
}

TEST(DrafterParity, CausalAndSlidingKinds) {
  for (bool causal : {false, true}) {
    DrafterConfig cfg = shipped_config("tiny-dflash.json");
    cfg.sliding = {true, false};
    cfg.window = 5;
    cfg.causal = {causal, causal};
    run_case({causal ? "causal sliding+full" : "non-causal sliding+full", cfg});
    cfg.sliding = {false, false};
    run_case({causal ? "causal full" : "non-causal full", cfg});
  }
}

TEST(DrafterParity, GqaRatiosAndBias) {
  for (int64_t nkv : {4, 2, 1}) {
    for (bool bias : {false, true}) {
      DrafterConfig cfg = shipped_config("tiny-dflash.json");
      cfg.n_kv = nkv;
      cfg.bias = bias;
      run_case({"gqa " + std::to_string(4 / nkv) + (bias ? " bias" : ""), cfg});
    }
  }
}

TEST(DrafterParity, BlockSizes) {
  for (int64_t b : {2, 3, 16}) {
    DrafterConfig cfg = shipped_config("tiny-dflash2.json");
    cfg.block = b;
    run_case({"dflash2 block " + std::to_string(b), cfg});
  }
}

TEST(DrafterParity, ContextLengths) {
  for (int64_t n : {0, 1, 7, 300}) {
    Case c{"dflash2 context " + std::to_string(n), shipped_config("tiny-dflash2.json")};
    c.context = n;
    run_case(c);
  }
}

TEST(DrafterParity, OddSizesSoftCapAndScales) {
  DrafterConfig cfg = shipped_config("tiny-dflash.json");
  cfg.hidden = 48;
  cfg.n_q = 6;
  cfg.n_kv = 3;
  cfg.head_dim = 10;
  cfg.ffn = 70;
  cfg.vocab = 211;
  cfg.mask_token = 5;
  cfg.softcap = 1.5;
  cfg.out_scale = 0.7;
  cfg.in_scale = 1.3;
  run_case({"odd sizes", cfg});
}

TEST(DrafterParity, PaddedAndTiedTargetHeads) {
  Case padded{"padded head", shipped_config("tiny-dflash.json")};
  padded.target_vocab = 320;
  run_case(padded);
  Case tied{"tied head", shipped_config("tiny-dflash2.json")};
  tied.target_vocab = 260;
  tied.tie = true;
  run_case(tied);
}

TEST(DrafterParity, WeightDtypes) {
  for (DType d : {DType::F32, DType::F16}) {
    Case c{std::string("dtype ") + dtype_name(d), shipped_config("tiny-dflash2.json")};
    c.dtype = d;
    run_case(c);
  }
}

TEST(DrafterParity, SeededSampling) {
  Case plain{"sampling", shipped_config("tiny-dflash.json")};
  plain.sampling = {0.8, 0, 1.0, 42};
  run_case(plain);
  Case filtered{"sampling top-k top-p", shipped_config("tiny-dflash.json")};
  filtered.sampling = {1.3, 20, 0.9, 5};
  run_case(filtered);
  Case selector{"dflash2 sampling", shipped_config("tiny-dflash2.json")};
  selector.sampling = {0.7, 0, 1.0, 9};
  run_case(selector);
}

TEST(DrafterParity, SeveralSessionsInOneBatch) {
  const Case c{"batch", shipped_config("tiny-dflash2.json")};
  Fixture f(c, 3);
  const int64_t lengths[3] = {0, 9, 33};
  std::vector<std::unique_ptr<model::Session>> sessions;
  std::vector<reference::RefContext> rctx(3);
  std::vector<model::DraftRequest> reqs;
  for (int s = 0; s < 3; ++s) {
    const auto taps = model::random_taps(c.cfg, lengths[s], 100 + static_cast<uint64_t>(s));
    sessions.push_back(f.drafter->new_session());
    f.drafter->settle(*sessions.back(), 0, taps.data(), lengths[s]);
    f.ref->settle(rctx[static_cast<size_t>(s)], 0, widen(taps), lengths[s]);
    reqs.push_back({sessions.back().get(), 10 + s, {}});
  }
  reqs[2].sampling = {0.9, 0, 1.0, 3};
  model::DraftDump dump;
  const auto got = f.drafter->draft(reqs, &dump);
  for (size_t s = 0; s < 3; ++s) {
    const auto& sp = reqs[s].sampling;
    expect_match(got[s], dump, s, f.ref->draft(rctx[s], reqs[s].anchor_token, {sp.temperature, sp.top_k, sp.top_p, sp.seed}),
                 c.cfg, "session " + std::to_string(s));
  }
}

// The speculative round of docs/model.md: settle the prompt, draft, keep m rows, roll back, repeat;
// the context must equal one settle of the kept rows.
TEST(DrafterParity, SettleInPiecesWithRollbackEqualsOneSettle) {
  const Case c{"rounds", shipped_config("tiny-dflash2.json")};  // sliding window 6 < context
  Fixture f(c);
  const int64_t total = 60;
  const auto taps = model::random_taps(c.cfg, total, 21);
  auto pieces = f.drafter->new_session();
  // Settle 20 rows, then 10 rows that are partly rejected: roll back to 25, and settle again.
  f.drafter->settle(*pieces, 0, taps.data(), 20);
  f.drafter->settle(*pieces, 20, taps.data() + 20 * c.cfg.n_taps() * c.cfg.hidden, 10);
  f.drafter->rollback(*pieces, 25);
  EXPECT_EQ(pieces->length(), 25);
  f.drafter->settle(*pieces, 25, taps.data() + 25 * c.cfg.n_taps() * c.cfg.hidden, 8);
  // Overwriting a position replaces it (settle at p0 < length cuts first).
  f.drafter->settle(*pieces, 30, taps.data() + 30 * c.cfg.n_taps() * c.cfg.hidden, 6);
  auto whole = f.drafter->new_session();
  f.drafter->settle(*whole, 0, taps.data(), 36);
  reference::RefContext rctx;
  f.ref->settle(rctx, 0, widen(std::vector<float>(taps.begin(), taps.begin() + 36 * c.cfg.n_taps() * c.cfg.hidden)), 36);

  model::DraftDump d1, d2;
  const auto a = f.drafter->draft({{pieces.get(), 3, {}}}, &d1);
  const auto b = f.drafter->draft({{whole.get(), 3, {}}}, &d2);
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  EXPECT_LT(testing::relative_error(d1.hidden, widen(d2.hidden)), 1e-6);
  expect_match(a[0], d1, 0, f.ref->draft(rctx, 3, {}), c.cfg, "pieces vs reference");
}

TEST(DrafterErrors, BadRequestsAreRefusedWithoutChangingTheSession) {
  const Case c{"errors", shipped_config("tiny-dflash2.json")};
  Fixture f(c, 1, 32);
  auto s = f.drafter->new_session();
  const auto taps = model::random_taps(c.cfg, 40, 1);
  f.drafter->settle(*s, 0, taps.data(), 20);
  expect_error([&] { f.drafter->settle(*s, 21, taps.data(), 1); }, {"no gaps"});
  expect_error([&] { f.drafter->settle(*s, 20, taps.data(), 13); }, {"max context 32"});
  expect_error([&] { f.drafter->rollback(*s, 21); }, {"cannot roll back"});
  expect_error([&] { f.drafter->draft({{s.get(), c.cfg.vocab, {}}}); }, {"anchor token"});
  expect_error([&] { f.drafter->draft({{s.get(), 1, {0.5, 3, 1.0, 0}}}); }, {"selector candidates"});
  expect_error([&] { f.drafter->draft({{s.get(), 1, {}}, {s.get(), 2, {}}}); }, {"sessions requested"});
  EXPECT_EQ(s->length(), 20);
  // The ring of the sliding layer (window 6 + block 8) no longer holds what a far rollback needs.
  f.drafter->settle(*s, 20, taps.data(), 12);
  expect_error([&] { f.drafter->rollback(*s, 2); }, {"cannot roll back to length 2"});
  EXPECT_EQ(s->length(), 32);
}

// Restarting a session of a drafter with sliding layers (an engine that recomputes a preempted
// request sends keep 0 and every row again) is always possible, and so is a cut to where the new
// rows cover the window; both draft what a fresh session of the same rows drafts (and the
// reference). A cut whose draft would read dropped rows is still refused, changing nothing.
TEST(DrafterParity, RestartingASlidingSessionDraftsAsAFreshOne) {
  const Case c{"restart", shipped_config("tiny-dflash2.json")};  // window 6 + block 8: a ring of 14
  Fixture f(c, 1, 64);
  const auto old_rows = model::random_taps(c.cfg, 30, 3), new_rows = model::random_taps(c.cfg, 5, 4);
  auto draft = [&](model::Session* s, model::DraftDump* dump) { return f.drafter->draft({{s, 9, {}}}, dump)[0]; };
  // Cut to 0: five new rows, as a fresh session.
  auto s = f.drafter->new_session(), fresh = f.drafter->new_session();
  f.drafter->settle(*s, 0, old_rows.data(), 30);  // the sliding ring holds positions 16..29
  f.drafter->settle(*s, 0, new_rows.data(), 5);
  f.drafter->settle(*fresh, 0, new_rows.data(), 5);
  EXPECT_EQ(s->length(), 5);
  model::DraftDump restarted_dump, fresh_dump;
  const model::DraftResult restarted = draft(s.get(), &restarted_dump), want = draft(fresh.get(), &fresh_dump);
  EXPECT_EQ(restarted.tokens, want.tokens);
  EXPECT_LT(testing::relative_error(restarted_dump.logits, widen(fresh_dump.logits)), 1e-6);
  reference::RefContext rctx;
  f.ref->settle(rctx, 0, widen(new_rows), 5);
  expect_match(restarted, restarted_dump, 0, f.ref->draft(rctx, 9, {}), c.cfg, "restarted at 0");
  // Cut to 3 and five rows: the sliding layer reads 3..7, all new; the full layer the old 0..2.
  auto t = f.drafter->new_session(), fresh2 = f.drafter->new_session();
  f.drafter->settle(*t, 0, old_rows.data(), 30);
  expect_error([&] { f.drafter->rollback(*t, 3); }, {"cannot roll back to length 3", "needs position 0"});
  EXPECT_EQ(t->length(), 30);
  f.drafter->settle(*t, 3, new_rows.data(), 5);
  f.drafter->settle(*fresh2, 0, old_rows.data(), 3);
  f.drafter->settle(*fresh2, 3, new_rows.data(), 5);
  model::DraftDump cut_dump, fresh2_dump;
  EXPECT_EQ(draft(t.get(), &cut_dump).tokens, draft(fresh2.get(), &fresh2_dump).tokens);
  EXPECT_LT(testing::relative_error(cut_dump.logits, widen(fresh2_dump.logits)), 1e-6);
  // Cut to 3 and two rows: the draft at 5 reads positions 0..2 of the sliding layer, dropped.
  auto u = f.drafter->new_session();
  f.drafter->settle(*u, 0, old_rows.data(), 30);
  expect_error([&] { f.drafter->settle(*u, 3, new_rows.data(), 2); },
               {"cannot roll back to length 3 and settle 2 rows", "needs position 0"});
  EXPECT_EQ(u->length(), 30);
}

// A NaN or Inf that reaches the logits fails the draft naming the row, on every selection path;
// no token (least of all -1) is returned.
TEST(DrafterErrors, NonFiniteTapsFailTheDraftInsteadOfReturningAToken) {
  for (const char* file : {"tiny-dflash.json", "tiny-dflash2.json"})
    for (float bad : {std::nanf(""), INFINITY}) {
      const Case c{file, shipped_config(file)};
      Fixture f(c, 1, 32);
      auto s = f.drafter->new_session();
      auto taps = model::random_taps(c.cfg, 10, 1);
      taps[3 * c.cfg.n_taps() * c.cfg.hidden + 5] = bad;
      f.drafter->settle(*s, 0, taps.data(), 10);
      std::vector<model::SamplingParams> modes = {{}, {0.8, 0, 1.0, 3}};
      if (!c.cfg.is_dflash2()) modes.push_back({0.8, 4, 0.9, 3});
      for (const auto& sp : modes) {
        SCOPED_TRACE(::testing::Message() << file << " T " << sp.temperature << " from " << bad);
        expect_error([&] { f.drafter->draft({{s.get(), 1, sp}}); }, {"draft row"});
      }
    }
}

}  // namespace
}  // namespace tpdraft
