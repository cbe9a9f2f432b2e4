// The C ABI's refusals and promises beyond drafting: every bad step entry, handle and option the
// header lists returns its documented status with a message naming the entry or field and moves
// no session; the open-session limit; closing what is not open; two threads stepping one handle;
// the last error per thread; threads = 0 sharing the cores among the ranks.
#include <pthread.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "capi/capi_harness.h"
#include "core/dtype.h"
#include "tools/random_checkpoint.h"

namespace tpdraft::capi_test {
namespace {

// Expects a call's status `got` to be `want` and the thread's last error to hold every needle.
void expect_refusal(tpdraft_status got, const std::vector<std::string>& needles,
                    tpdraft_status want = TPDRAFT_ERROR_ARGUMENT) {
  EXPECT_EQ(got, want) << "the refusal naming '" << needles.front() << "'";
  const std::string message = tpdraft_last_error();
  for (const std::string& n : needles) EXPECT_NE(message.find(n), std::string::npos) << "'" << n << "' in: " << message;
}

using Entry = tpdraft_step_entry;

// A DFlash 2 drafter (max context 32, two entries a step) with two sessions: a of 10 positions,
// b of 4. A bad entry follows a good one on a, which must not move either.
class CapiStepErrors : public ::testing::Test {
 protected:
  CapiStepErrors() : ck_(testing::shipped_config("tiny-dflash2.json")), h_(ck_, options()), a_(h_, ck_), b_(h_, ck_) {
    step_ok(h_, {a_.plan({-1, -1, 10, 3, greedy(), 1}), b_.plan({-1, -1, 4, 4, greedy(), 2})});
    taps_ = model::random_taps(ck_.cfg, 3, 9);
  }
  static tpdraft_options options() {
    tpdraft_options o = cpu_options();
    o.max_sessions = 2;
    o.max_context = 32;
    return o;
  }
  // A good entry on b: 2 new rows, a greedy draft.
  tpdraft_step_entry good_on_b() {
    return entry(b_.session(), 2, taps_.data(), 6, greedy(), tokens_.data());
  }
  // Steps [good entry on a, `bad`]: refused with ARGUMENT, a message naming entry 1 and the
  // needles, and no session moved.
  void expect_refused(const tpdraft_step_entry& bad, const std::vector<std::string>& needles) {
    std::vector<tpdraft_step_entry> entries = {entry(a_.session(), 1, taps_.data(), 1, greedy(), tokens_.data()), bad};
    std::vector<std::string> all = {"entry 1"};
    all.insert(all.end(), needles.begin(), needles.end());
    expect_refusal(tpdraft_step(h_.get(), entries.data(), entries.size()), all);
    expect_unmoved();
  }
  // expect_refused of the good entry on b with `spoil` applied.
  void expect_spoiled_refused(const std::function<void(Entry&)>& spoil,
                              const std::vector<std::string>& needles) {
    tpdraft_step_entry e = good_on_b();
    spoil(e);
    expect_refused(e, needles);
  }
  void expect_unmoved() {
    EXPECT_EQ(h_.length(a_.session()), 10);
    EXPECT_EQ(h_.length(b_.session()), 4);
  }

  Checkpoint ck_;
  Handle h_;
  Lane a_, b_;
  std::vector<float> taps_;
  std::vector<int64_t> tokens_ = std::vector<int64_t>(16);
};

TEST_F(CapiStepErrors, AGoodEntryAloneSucceeds) {
  step_ok(h_, {good_on_b()});
  EXPECT_EQ(h_.length(b_.session()), 6);
}

TEST_F(CapiStepErrors, SessionsUnknownOrTwice) {
  expect_spoiled_refused([](Entry& e) { e.session = 999; }, {"session 999", "not open"});
  const tpdraft_session a = a_.session();
  expect_spoiled_refused([&](Entry& e) { e.session = a; },
                         {"session " + std::to_string(a), "twice"});
}

TEST_F(CapiStepErrors, KeepOrP0BeyondTheSession) {
  expect_spoiled_refused([](Entry& e) { e.keep = 5; }, {"keep 5", "holds 4"});
  expect_spoiled_refused([](Entry& e) { e.keep = -2; }, {"keep -2"});
  expect_spoiled_refused(
      [](Entry& e) {
        e.keep = 3;
        e.p0 = 4;
      },
      {"p0 4", "after keep"});
  expect_spoiled_refused([](Entry& e) { e.p0 = 5; }, {"p0 5"});
}

TEST_F(CapiStepErrors, ARollBackTheSlidingRingCannotMake) {
  // 30 positions: the sliding layer's ring (window 6 + block 8) no longer holds position 0.
  step_ok(h_, {b_.plan({-1, -1, 26, 4, greedy(), 3})});
  tpdraft_step_entry e = good_on_b();
  e.keep = 2;
  tpdraft_step_entry on_a = good_on_b();
  on_a.session = a_.session();
  std::vector<tpdraft_step_entry> entries = {on_a, e};
  expect_refusal(tpdraft_step(h_.get(), entries.data(), entries.size()),
                 {"entry 1", "cannot roll back to length 2"});
  EXPECT_EQ(h_.length(a_.session()), 10);
  EXPECT_EQ(h_.length(b_.session()), 30);
}

TEST_F(CapiStepErrors, NonFiniteTaps) {
  const int64_t width = ck_.cfg.n_taps() * ck_.cfg.hidden;
  std::vector<float> bad = taps_;
  bad[static_cast<size_t>(width + 5)] = std::nanf("");
  tpdraft_step_entry e = good_on_b();
  e.taps = bad.data();
  expect_refused(e, {"NaN", "position 5", "column 5"});
  bad[static_cast<size_t>(width + 5)] = -INFINITY;
  expect_refused(e, {"Inf", "position 5"});
  std::vector<uint16_t> bf16(bad.size());
  convert_from_f32(DType::BF16, bad.data(), bf16.data(), bad.size());
  e.taps = bf16.data();
  e.taps_dtype = TPDRAFT_BF16;
  expect_refused(e, {"NaN or Inf", "position 5"});
}

// Finite taps beyond ±2^30 overflow fc and the norms: refused before the forward, which they once
// turned into NaN and a failed drafter (ending a server for all its clients).
TEST_F(CapiStepErrors, TapsBeyondTheBound) {
  const int64_t width = ck_.cfg.n_taps() * ck_.cfg.hidden;
  std::vector<float> huge(taps_.size(), 3e38f);
  tpdraft_step_entry e = good_on_b();
  e.taps = huge.data();
  expect_refused(e, {"position 4", "column 0", "beyond the ±2^30"});
  std::vector<float> one = taps_;
  one[static_cast<size_t>(width + 2)] = -2e9f;
  e.taps = one.data();
  expect_refused(e, {"position 5", "column 2", "-2000000000", "beyond the ±2^30"});
  std::vector<uint16_t> bf16(one.size());
  convert_from_f32(DType::BF16, one.data(), bf16.data(), one.size());
  e.taps = bf16.data();
  e.taps_dtype = TPDRAFT_BF16;
  expect_refused(e, {"position 5", "column 2", "beyond the ±2^30"});
  one[static_cast<size_t>(width + 2)] = 1e9f;  // just inside the bound: drafts
  e = good_on_b();
  e.taps = one.data();
  std::vector<tpdraft_step_entry> entries = {e};
  EXPECT_EQ(tpdraft_step(h_.get(), entries.data(), 1), TPDRAFT_OK) << tpdraft_last_error();
}

// At tp 2 a step refused for one entry's data (taps past the bound, a temperature whose inverse
// overflows) is refused before any rank works: both once failed inside the forward and left the
// group refusing every later call. The handle goes on drafting what the reference drafts.
TEST(CapiTp2Errors, AnEntryRefusedForItsDataLeavesTheGroupWorking) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash2.json"));
  tpdraft_options o = cpu_options();
  o.tp = 2;
  o.threads = 1;
  Handle h(ck, o);
  Lane a(h, ck);
  step_ok(h, {a.plan({-1, -1, 6, 3, greedy(), 1})});
  a.check("first step");
  const int64_t width = ck.cfg.n_taps() * ck.cfg.hidden;
  std::vector<float> huge(static_cast<size_t>(2 * width), 3e38f), fine(static_cast<size_t>(2 * width), 0.5f);
  std::vector<int64_t> tokens(16);
  tpdraft_step_entry bad = entry(a.session(), 2, huge.data(), 4, greedy(), tokens.data());
  expect_refusal(tpdraft_step(h.get(), &bad, 1), {"entry 0", "beyond the ±2^30"});
  bad = entry(a.session(), 2, fine.data(), 4, sampled(1e-310, 7), tokens.data());
  expect_refusal(tpdraft_step(h.get(), &bad, 1), {"entry 0", "at least 1e-06"});
  EXPECT_EQ(h.length(a.session()), 6);
  step_ok(h, {a.plan({-1, -1, 2, 5, greedy(), 2})});
  a.check("a step after the refused ones");
}

TEST_F(CapiStepErrors, TapsMissingOrUnreadable) {
  expect_spoiled_refused([](Entry& e) { e.taps = nullptr; }, {"no taps"});
  expect_spoiled_refused([](Entry& e) { e.taps_dtype = 7; }, {"taps_dtype 7"});
  expect_spoiled_refused([](Entry& e) { e.taps_on_device = 1; }, {"device memory", "cpu"});
  expect_spoiled_refused([](Entry& e) { e.n_new = -1; }, {"-1 new rows"});
  // 4 + 29 > the max context 32
  expect_spoiled_refused([](Entry& e) { e.n_new = 29; }, {"29 new rows", "max context 32"});
}

TEST_F(CapiStepErrors, AnchorOutsideTheVocabulary) {
  const int64_t vocab = ck_.cfg.vocab;
  expect_spoiled_refused([&](Entry& e) { e.anchor = vocab; }, {"anchor", std::to_string(vocab)});
  expect_spoiled_refused([](Entry& e) { e.anchor = -1; }, {"anchor", "-1"});
}

TEST_F(CapiStepErrors, BadSampling) {
  expect_spoiled_refused([](Entry& e) { e.sampling = {0.8, 5, 1.0, 1}; }, {"top_k", "DFlash 2"});
  expect_spoiled_refused([](Entry& e) { e.sampling = {-0.5, 0, 1.0, 1}; }, {"temperature", "-0.5"});
  expect_spoiled_refused([](Entry& e) { e.sampling = {0.5, 0, 0.0, 1}; }, {"top_p"});
  expect_spoiled_refused([](Entry& e) { e.sampling = {NAN, 0, 1.0, 1}; }, {"temperature"});
  // 1 / T overflows below about 5.6e-309, and the logits' scale long before: refused below 1e-6.
  expect_spoiled_refused([](Entry& e) { e.sampling = {1e-300, 0, 1.0, 1}; }, {"temperature", "at least 1e-06", "1e-300"});
  expect_spoiled_refused([](Entry& e) { e.sampling = {5e-7, 0, 1.0, 1}; }, {"temperature", "at least 1e-06"});
  expect_spoiled_refused([](Entry& e) { e.sampling = {INFINITY, 0, 1.0, 1}; }, {"temperature", "inf"});
}

TEST_F(CapiStepErrors, MissingOutputBuffers) {
  tpdraft_step_entry e = good_on_b();
  e.tokens = nullptr;
  expect_refused(e, {"tokens"});
  std::vector<float> probs(100);
  std::vector<int64_t> ids(100);
  e = good_on_b();
  e.dist_width = 3;
  e.dist_ids = ids.data();
  expect_refused(e, {"dist_probs"});
  e.dist_ids = nullptr;
  e.dist_probs = probs.data();
  expect_refused(e, {"dist_ids"});
  e.dist_ids = ids.data();
  e.dist_width = -2;
  expect_refused(e, {"distribution width", "-2"});
  e.dist_width = ck_.cfg.vocab + 1;
  expect_refused(e, {"distribution width", std::to_string(ck_.cfg.vocab + 1)});
}

TEST_F(CapiStepErrors, BadCountsAndNullHandles) {
  std::vector<tpdraft_step_entry> three = {good_on_b(), good_on_b(), good_on_b()};
  three[1].session = a_.session();
  three[2].session = 12345;
  expect_refusal(tpdraft_step(h_.get(), three.data(), 3), {"1 to 2 entries", "got 3"});
  expect_refusal(tpdraft_step(h_.get(), three.data(), 0), {"got 0"});
  // A count past the array is refused before any entry is read (the sanitizer build would report
  // a read past `one`).
  tpdraft_step_entry one = good_on_b();
  expect_refusal(tpdraft_step(h_.get(), &one, 9), {"tpdraft_step", "1 to 2 entries", "got 9"});
  expect_refusal(tpdraft_step(h_.get(), nullptr, 1), {"tpdraft_step", "entries is NULL"});
  expect_refusal(tpdraft_step(nullptr, three.data(), 1), {"tpdraft_step", "drafter is NULL"});
  int64_t n = 0;
  expect_refusal(tpdraft_session_length(nullptr, a_.session(), &n),
                 {"tpdraft_session_length", "NULL"});
  expect_refusal(tpdraft_session_length(h_.get(), a_.session(), nullptr),
                 {"tpdraft_session_length", "NULL"});
  tpdraft_session s = 0;
  expect_refusal(tpdraft_session_open(nullptr, &s), {"tpdraft_session_open", "NULL"});
  expect_refusal(tpdraft_session_close(nullptr, a_.session()), {"tpdraft_session_close", "NULL"});
  tpdraft_caps caps{sizeof caps};
  expect_refusal(tpdraft_caps_get(nullptr, &caps), {"tpdraft_caps_get", "NULL"});
  caps.struct_size = 8;
  expect_refusal(tpdraft_caps_get(h_.get(), &caps), {"tpdraft_caps_get", "struct_size"});
  tpdraft_close(nullptr);  // allowed
  expect_unmoved();
}

TEST_F(CapiStepErrors, AClosedSessionIsUnknown) {
  const tpdraft_session b = b_.session();
  ASSERT_EQ(tpdraft_session_close(h_.get(), b), TPDRAFT_OK) << tpdraft_last_error();
  expect_refusal(tpdraft_session_close(h_.get(), b), {"session " + std::to_string(b), "not open"});
  int64_t n = -5;
  expect_refusal(tpdraft_session_length(h_.get(), b, &n), {"session " + std::to_string(b)});
  expect_refusal(tpdraft_session_close(h_.get(), 77), {"session 77", "not open"});
  std::vector<tpdraft_step_entry> entries = {good_on_b()};
  expect_refusal(tpdraft_step(h_.get(), entries.data(), 1),
                 {"entry 0", "session " + std::to_string(b)});
  EXPECT_EQ(h_.length(a_.session()), 10);
}

// ---- tpdraft_open ------------------------------------------------------------------------------

// Opens with `o`; expects `status`, no handle, and the needles in the message.
void expect_open_refused(const Checkpoint& ck, const tpdraft_options& o, tpdraft_status status,
                         const std::vector<std::string>& needles) {
  tpdraft_drafter* d = reinterpret_cast<tpdraft_drafter*>(&d);  // must be reset to NULL
  expect_refusal(tpdraft_open(ck.drafter_dir().c_str(), ck.target_dir().c_str(), &o, &d), needles,
                 status);
  EXPECT_EQ(d, nullptr);
}

// Target ids for the option checks: a good pair, and a list whose third lies beyond V = 257.
const int64_t kIds[] = {3, 9};
const int64_t kBadIds[] = {1, 2, 257};

TEST(CapiOpenErrors, BadOptionsNameTheField) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash2.json"));
  const std::string missing_map = ck.dir.file("no-such-map.json");
  const tpdraft_options good = cpu_options();
  tpdraft_options o = good;
  o.struct_size = 0;
  expect_open_refused(ck, o, TPDRAFT_ERROR_INPUT, {"struct_size", "tpdraft_options_init"});
  const std::vector<std::pair<std::function<void(tpdraft_options&)>, std::string>> fields = {
      {[](tpdraft_options& x) { x.struct_size = sizeof(tpdraft_options) - 4; }, "struct_size"},
      {[](tpdraft_options& x) { x.threads = -1; }, "options.threads is -1"},
      {[](tpdraft_options& x) { x.tp = -2; }, "options.tp is -2"},
      {[](tpdraft_options& x) { x.max_sessions = 0; }, "options.max_sessions is 0"},
      {[](tpdraft_options& x) { x.max_sessions = -3; }, "options.max_sessions is -3"},
      // Sizes beyond the program's bounds (core/bounds.h): refused by value, before a buffer size
      // is computed from them (2^58 positions wrapped the context's size to a NULL buffer).
      {[](tpdraft_options& x) { x.max_sessions = 2000000000; }, "options.max_sessions is 2000000000, expected 1..4096"},
      {[](tpdraft_options& x) { x.max_context = 0; }, "options.max_context is 0"},
      {[](tpdraft_options& x) { x.max_context = int64_t{1} << 58; }, "options.max_context is 288230376151711744"},
      {[](tpdraft_options& x) { x.max_context = INT64_MAX; }, "expected 1..2147483648"},
      {[](tpdraft_options& x) { x.max_open_sessions = 1 << 21; }, "options.max_open_sessions is 2097152"},
      {[](tpdraft_options& x) { x.tp = 300; }, "options.tp is 300, expected 0..256"},
      {[](tpdraft_options& x) { x.threads = 10000000; }, "options.threads is 10000000"},
      {[](tpdraft_options& x) { x.max_open_sessions = -1; }, "options.max_open_sessions is -1"},
      {[](tpdraft_options& x) { x.graphs = 2; }, "options.graphs is 2"},
      {[](tpdraft_options& x) { x.backend = "tpu"; }, "backend 'tpu'"},
      {[](tpdraft_options& x) { x.tp = 3; }, "tp = 3"},
      {[](tpdraft_options& x) { x.quant = "q5"; }, "options.quant is 'q5'"},
      // The draft vocabulary: one way at a time, a count that matches, ids inside the vocabulary.
      {[&](tpdraft_options& x) {
         x.token_map = "map.json";
         x.token_ids = kIds;
         x.n_token_ids = 2;
       }, "options.token_map and options.token_ids are both set"},
      {[&](tpdraft_options& x) { x.token_ids = kIds; }, "options.n_token_ids is 0"},
      {[&](tpdraft_options& x) {
         x.token_ids = kIds;
         x.n_token_ids = -5;
       }, "options.n_token_ids is -5"},
      {[](tpdraft_options& x) { x.n_token_ids = 3; }, "options.n_token_ids is 3"},
      {[&](tpdraft_options& x) {
         x.token_ids = kIds;
         x.n_token_ids = int64_t{1} << 40;
       }, "options.n_token_ids is 1099511627776"},
      {[&](tpdraft_options& x) {
         x.token_ids = kBadIds;
         x.n_token_ids = 3;
       }, "options.token_ids: draft row 2 maps to target id 257"},
      {[&](tpdraft_options& x) {
         x.token_ids = kBadIds;
         x.n_token_ids = 1;
       }, "selector_top_k (4) exceeds the draft vocabulary (1)"},
      {[&](tpdraft_options& x) { x.token_map = missing_map.c_str(); }, "no-such-map.json"},
  };
  for (const auto& [spoil, needle] : fields) {
    o = good;
    spoil(o);
    SCOPED_TRACE(needle);
    expect_open_refused(ck, o, TPDRAFT_ERROR_INPUT, {"tpdraft_open", needle});
  }
}

// Threads that cannot start (a default stack larger than any mapping can be) fail tpdraft_open
// with a message naming the thread, where they once ended the host through std::terminate: the
// rank threads of tp = 2, and the CPU workers of one rank.
TEST(CapiOpenErrors, ThreadsThatCannotStart) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash2.json"));
  pthread_attr_t saved, huge;
  ASSERT_EQ(pthread_getattr_default_np(&saved), 0);
  ASSERT_EQ(pthread_attr_init(&huge), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&huge, size_t{1} << 46), 0);  // 64 TiB
  ASSERT_EQ(pthread_setattr_default_np(&huge), 0);
  tpdraft_options ranks = cpu_options(), workers = cpu_options();
  ranks.tp = 2;
  ranks.threads = 1;
  workers.tp = 1;
  workers.threads = 2;
  expect_open_refused(ck, ranks, TPDRAFT_ERROR_INPUT, {"tpdraft_open", "cannot start the thread of rank 1 of 2"});
  expect_open_refused(ck, workers, TPDRAFT_ERROR_INPUT, {"tpdraft_open", "cannot start CPU worker thread 2 of 2"});
  pthread_setattr_default_np(&saved);
  pthread_attr_destroy(&huge);
  pthread_attr_destroy(&saved);
  Handle after(ck, ranks);  // the defaults restored, the same options open
}

TEST(CapiOpenErrors, MissingCheckpointOrNullArguments) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash.json"));
  const std::string missing = ck.dir.file("no-such-drafter");
  tpdraft_drafter* d = nullptr;
  const tpdraft_options o = cpu_options();
  expect_refusal(tpdraft_open(missing.c_str(), ck.target_dir().c_str(), &o, &d), {missing}, TPDRAFT_ERROR_INPUT);
  EXPECT_EQ(d, nullptr);
  const std::string no_target = ck.dir.file("no-such-target");
  expect_refusal(tpdraft_open(ck.drafter_dir().c_str(), no_target.c_str(), &o, &d),
                 {no_target}, TPDRAFT_ERROR_INPUT);
  expect_refusal(tpdraft_open(nullptr, ck.target_dir().c_str(), &o, &d), {"tpdraft_open", "NULL"});
  expect_refusal(tpdraft_open(ck.drafter_dir().c_str(), ck.target_dir().c_str(), &o, nullptr),
                 {"tpdraft_open", "out is NULL"});
}

// ---- sessions and threads ----------------------------------------------------------------------

TEST(CapiSessions, TheOpenSessionLimitHolds) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash.json"));
  tpdraft_options o = cpu_options(2);
  o.max_open_sessions = 2;
  Handle h(ck, o);
  const tpdraft_session a = h.open_session(), b = h.open_session();
  EXPECT_NE(a, b);
  tpdraft_session c = -1;
  expect_refusal(tpdraft_session_open(h.get(), &c), {"tpdraft_session_open", "max_open_sessions"});
  EXPECT_EQ(c, -1);
  ASSERT_EQ(tpdraft_session_close(h.get(), a), TPDRAFT_OK) << tpdraft_last_error();
  ASSERT_EQ(tpdraft_session_open(h.get(), &c), TPDRAFT_OK) << tpdraft_last_error();
  EXPECT_NE(c, a);  // ids are not reused
  EXPECT_NE(c, b);
  EXPECT_EQ(h.length(c), 0);
}

// Threads of this process (Linux: the entries of /proc/self/task).
int thread_count() {
  std::error_code ec;
  const std::filesystem::directory_iterator tasks("/proc/self/task", ec);
  return ec ? -1 : static_cast<int>(std::distance(tasks, {}));
}

TEST(CapiThreads, ZeroThreadsShareTheCoresAmongTheRanks) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash.json"));
  tpdraft_options o = cpu_options(2);
  o.threads = 0;
  const int before = thread_count();
  ASSERT_GT(before, 0);
  Handle h(ck, o);
  // Each rank computes on its own thread plus its pool's workers; all of them together (the
  // caller's thread included) are the cores, or one per rank where there are fewer cores.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_LE(thread_count() - before + 1, std::max(cores, 2));
}

TEST(CapiThreads, TwoThreadsSteppingOneHandleAreSerialised) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash2.json"));
  Handle h(ck, cpu_options(2));
  const int64_t rows = 6, anchors[] = {3, 50, 120, 200};
  const std::vector<float> taps = model::random_taps(ck.cfg, rows, 17);
  reference::RefContext ctx;
  ck.ref->settle(ctx, 0, widen(taps), rows);
  std::vector<std::vector<int64_t>> want;
  for (int64_t a : anchors) want.push_back(ck.ref->draft(ctx, a, {}).tokens);

  // Each thread: its own session, rolled back to 0 and given the same rows every step.
  auto worker = [&](int steps) {
    const tpdraft_session s = h.open_session();
    int mismatches = 0;
    std::vector<int64_t> tokens(static_cast<size_t>(ck.cfg.block - 1));
    for (int i = 0; i < steps; ++i) {
      tpdraft_step_entry e = entry(s, rows, taps.data(), anchors[i % 4], greedy(), tokens.data());
      e.keep = i == 0 ? -1 : 0;
      if (tpdraft_step(h.get(), &e, 1) != TPDRAFT_OK || tokens != want[static_cast<size_t>(i % 4)]) ++mismatches;
    }
    return mismatches;
  };
  auto first = std::async(std::launch::async, worker, 40);
  auto second = std::async(std::launch::async, worker, 40);
  EXPECT_EQ(first.get(), 0);
  EXPECT_EQ(second.get(), 0);
}

TEST(CapiThreads, TheLastErrorIsPerThread) {
  const Checkpoint ck(testing::shipped_config("tiny-dflash.json"));
  Handle h(ck, cpu_options());
  const tpdraft_session s = h.open_session();
  std::promise<void> first_failed, second_failed;
  auto first = std::async(std::launch::async, [&] {
    int64_t n = 0;
    EXPECT_EQ(tpdraft_session_length(h.get(), 4242, &n), TPDRAFT_ERROR_ARGUMENT);
    first_failed.set_value();
    second_failed.get_future().wait();
    return std::string(tpdraft_last_error());
  });
  first_failed.get_future().wait();
  auto second = std::async(std::launch::async, [&] {
    EXPECT_EQ(tpdraft_session_close(h.get(), 5353), TPDRAFT_ERROR_ARGUMENT);
    second_failed.set_value();
    return std::string(tpdraft_last_error());
  });
  const std::string second_error = second.get(), first_error = first.get();
  EXPECT_NE(first_error.find("session 4242"), std::string::npos) << first_error;
  EXPECT_NE(second_error.find("session 5353"), std::string::npos) << second_error;
  // This thread's own calls succeeded: its last error is empty.
  EXPECT_EQ(h.length(s), 0);
  EXPECT_STREQ(tpdraft_last_error(), "");
}

}  // namespace
}  // namespace tpdraft::capi_test
