// Whole drafts on the CUDA backend against the CPU backend on the same random checkpoints
// (DFlash and DFlash 2, greedy / top-k / sampled paths, several sessions, settle + rollback):
// the same tokens, hidden rows and logits within the GEMM precision. Then tensor parallelism
// with device buffers: two ranks sharing one GPU through host staging, and the NCCL
// communicator (one rank on one GPU; two ranks, a timeout and a draft when two GPUs exist).
// Every test that needs a device skips itself, with the reason, where there is none.
#include <gtest/gtest.h>

#ifndef TPDRAFT_HAVE_CUDA

TEST(CudaDrafter, NeedsTheCudaBackend) {
  GTEST_SKIP() << "this build has no CUDA backend (TPDRAFT_CUDA=OFF or no toolkit)";
}

#else

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/runtime.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/kernel_cases.h"
#include "model/drafter.h"
#include "parallel/nccl_comm.h"
#include "parallel/thread_comm.h"
#include "support/draft_rounds.h"
#include "support/rank.h"
#include "support/test_support.h"
#include "tools/random_checkpoint.h"

namespace tpdraft {
namespace {

using model::DrafterConfig;

#define REQUIRE_GPUS(n)                                                                                    \
  if (kernels::cuda_devices() < (n))                                                                       \
  GTEST_SKIP() << "needs " << (n) << " CUDA device(s), this machine has " << kernels::cuda_devices()

bool single_rounding() {
  const char* mode = std::getenv("TPDRAFT_CUDA_MATMUL");
  return mode != nullptr && std::string(mode) == "single";
}

DrafterConfig tiny(const std::string& file) {
  return DrafterConfig::from_file(testing::source_path("configs/" + file));
}

using testing::Scenario;
using testing::write_checkpoint;
using RankOutput = testing::ScenarioOutput;

// Settles and drafts the scenario on one rank of `group` with a fresh runtime of the backend.
RankOutput run_on(parallel::Communicator& group, model::RuntimeOptions ro, const std::string& ckpt,
                        const DrafterConfig& cfg, const Scenario& sc) {
  ro.limits.max_context = 1024;
  ro.limits.settle_chunk = 48;
  ro.graphs = model::GraphMode::Off;
  return testing::run_scenario(group, ro, ckpt, cfg, sc);
}

RankOutput run_cpu(const std::string& ckpt, const DrafterConfig& cfg, const Scenario& sc) {
  auto comm = parallel::make_single_rank();
  return run_on(*comm, testing::backend("cpu", 2), ckpt, cfg, sc);
}

void expect_same(const RankOutput& want, const RankOutput& got, const std::string& what) {
  const bool loose = single_rounding();
  ASSERT_EQ(got.results.size(), want.results.size()) << what;
  for (size_t s = 0; s < got.results.size(); ++s) {
    if (!loose) {
      EXPECT_EQ(got.results[s].tokens, want.results[s].tokens) << what << " session " << s;
    }
    ASSERT_EQ(got.results[s].probs.size(), want.results[s].probs.size()) << what;
    for (size_t i = 0; i < got.results[s].probs.size() && !loose; ++i)
      EXPECT_NEAR(got.results[s].probs[i], want.results[s].probs[i], 1e-4) << what << " session " << s;
  }
  if (want.dump.hidden.empty()) return;
  const double tol = loose ? 1e-2 : 1e-4;
  const std::vector<double> h(want.dump.hidden.begin(), want.dump.hidden.end());
  const std::vector<double> l(want.dump.logits.begin(), want.dump.logits.end());
  EXPECT_LT(testing::relative_error(got.dump.hidden, h), tol) << what << " hidden";
  EXPECT_LT(testing::relative_error(got.dump.logits, l), tol) << what << " logits";
}

void check_single_gpu(const DrafterConfig& cfg, const Scenario& sc, const std::string& what,
                      DType dtype = DType::BF16) {
  SCOPED_TRACE(what);
  testing::TempDir dir;
  const std::string ckpt = write_checkpoint(dir, cfg, dtype);
  const RankOutput want = run_cpu(ckpt, cfg, sc);
  auto single = parallel::make_single_rank();
  expect_same(want, run_on(*single, testing::backend("cuda"), ckpt, cfg, sc), what);
}

TEST(CudaDrafter, DFlashGreedyAndDump) {
  REQUIRE_GPUS(1);
  check_single_gpu(tiny("tiny-dflash.json"), {}, "dflash");
}

TEST(CudaDrafter, DFlash2SlidingSelectorPaths) {
  REQUIRE_GPUS(1);
  check_single_gpu(tiny("tiny-dflash2.json"), {}, "dflash2 with dump (logits path)");
  Scenario topk;
  topk.contexts = {40, 12, 0};
  topk.dump = false;  // head_topk on the device
  check_single_gpu(tiny("tiny-dflash2.json"), topk, "dflash2 head_topk path, three sessions");
}

TEST(CudaDrafter, SamplingRollbackAndDtypes) {
  REQUIRE_GPUS(1);
  Scenario sampled;
  sampled.contexts = {40, 12, 0};
  sampled.sampling = {{0.9, 0, 1.0, 17}, {1.2, 25, 0.8, 3}, {0.7, 0, 0.95, 8}};
  sampled.rollback = true;
  check_single_gpu(tiny("tiny-dflash.json"), sampled, "dflash sampled, rollback");
  for (DType dt : {DType::F32, DType::F16})
    check_single_gpu(tiny("tiny-dflash2.json"), {}, std::string("dflash2 ") + dtype_name(dt), dt);
}

// Draft vocabularies on the GPU: a speculators checkpoint's own reduced head (gathered rows of
// its d2t) and a token map over a DFlash 2 target head, greedy and sampled, against the CPU.
TEST(CudaDrafter, DraftVocabulariesDraftAsTheCpu) {
  REQUIRE_GPUS(1);
  for (const char* file : {"tiny-dflash.json", "tiny-dflash2.json"}) {
    DrafterConfig cfg = tiny(file);
    std::vector<int64_t> map;
    if (cfg.is_dflash2()) {
      for (int64_t t = 0; t < cfg.vocab; t += 3) map.push_back(t);
    } else {
      cfg.layout = model::Layout::Speculators;
      cfg.arch_name = "DFlashSpeculator";
      cfg.draft_vocab = 90;
    }
    testing::TempDir dir;
    const std::string ckpt = write_checkpoint(dir, cfg);
    auto draft_on = [&](const std::string& backend) {
      model::ModelSource source = model::ModelSource::open(ckpt + "/drafter", ckpt + "/target");
      if (!map.empty()) model::apply_token_map(source, map, "test map");
      auto single = parallel::make_single_rank();
      model::RuntimeOptions ro = testing::backend(backend, 2);
      ro.limits.max_sessions = 2;
      ro.graphs = model::GraphMode::Off;
      model::RankRuntime rt(source, *single, ro);
      auto a = rt.drafter().new_session(), b = rt.drafter().new_session();
      const auto taps = model::random_taps(source.config, 50, 7);
      rt.drafter().settle(*a, 0, taps.data(), 50);
      rt.drafter().settle(*b, 0, taps.data(), 20);
      RankOutput o;
      o.results = rt.drafter().draft({{a.get(), 4, {}}, {b.get(), 9, {0.9, 0, 1.0, 13}}}, &o.dump);
      return o;
    };
    const RankOutput want = draft_on("cpu"), got = draft_on("cuda");
    expect_same(want, got, file);
    EXPECT_EQ(got.dump.logit_ids, want.dump.logit_ids) << file;
  }
}

// int8 activations (--quant q8a8, q4a8+head) on CUDA against the CPU backend, whose own quantized
// kernels they are: both hold the same weights and quantize activations in the same blocks with
// the same rounding, so the drafts differ only where an f32 sum order moves a value across an
// int8 rounding step in a later layer (one quantum of one activation). A wrong fragment, byte,
// scale or block would move every logit, by as much as the logits themselves.
TEST(CudaDrafter, Int8ActivationsDraftAsTheCpu) {
  REQUIRE_GPUS(1);
  for (const char* file : {"tiny-dflash.json", "tiny-dflash2.json"})
    for (const char* quant : {"q8a8", "q4a8+head"}) {
      const std::string what = std::string(file) + " " + quant;
      SCOPED_TRACE(what);
      const DrafterConfig cfg = tiny(file);
      testing::TempDir dir;
      const std::string ckpt = write_checkpoint(dir, cfg);
      Scenario sc;
      sc.contexts = {40, 75, 9};
      sc.quant = quant;
      const RankOutput want = run_cpu(ckpt, cfg, sc);
      auto single = parallel::make_single_rank();
      const RankOutput got = run_on(*single, testing::backend("cuda"), ckpt, cfg, sc);
      const std::vector<double> l(want.dump.logits.begin(), want.dump.logits.end());
      EXPECT_LT(testing::relative_error(got.dump.logits, l), 1e-2) << "logits";
      size_t same = 0, total = 0;
      for (size_t s = 0; s < want.results.size(); ++s)
        for (size_t i = 0; i < want.results[s].tokens.size(); ++i) {
          ++total;
          same += i < got.results[s].tokens.size() && got.results[s].tokens[i] == want.results[s].tokens[i];
        }
      EXPECT_GE(static_cast<double>(same), 0.9 * static_cast<double>(total)) << same << " of " << total << " tokens";
    }
}

TEST(CudaDrafter, WiderGeometryLongerContext) {
  REQUIRE_GPUS(1);
  DrafterConfig cfg = tiny("tiny-dflash2.json");
  cfg.hidden = 256;
  cfg.n_q = 8;
  cfg.n_kv = 2;
  cfg.head_dim = 128;
  cfg.ffn = 512;
  cfg.window = 64;
  cfg.block = 16;
  Scenario sc;
  sc.contexts = {700, 90};
  check_single_gpu(cfg, sc, "hidden 256, head_dim 128, window 64, contexts 700 and 90");
}

// Settles and drafts contexts of 40 and 5 positions on tp in-process ranks with `ro`: every
// rank must match the CPU backend at one rank. Returns the ranks' outputs.
std::vector<RankOutput> check_ranks(const std::string& file, int tp,
                                    const model::RuntimeOptions& ro, const std::string& what) {
  const DrafterConfig cfg = testing::eight_heads_over_two(file);
  testing::TempDir dir;
  const std::string ckpt = write_checkpoint(dir, cfg);
  Scenario sc;
  sc.contexts = {40, 5};
  const RankOutput want = run_cpu(ckpt, cfg, sc);
  std::vector<RankOutput> got(static_cast<size_t>(tp));
  parallel::run_ranks(tp, [&](parallel::Communicator& comm) {
    got[static_cast<size_t>(comm.rank())] = run_on(comm, ro, ckpt, cfg, sc);
  });
  for (int r = 0; r < tp; ++r)
    expect_same(want, got[static_cast<size_t>(r)], what + " rank " + std::to_string(r));
  return got;
}

// Two and four in-process ranks on one GPU: the host communicator carries device buffers by
// staging.
TEST(CudaDrafter, RanksShareOneGpuThroughHostStaging) {
  REQUIRE_GPUS(1);
  model::RuntimeOptions ro = testing::backend("cuda");
  ro.local_rank = 0;  // every rank on the one GPU
  for (int tp : {2, 4})
  for (const char* file : {"tiny-dflash.json", "tiny-dflash2.json"}) {
    SCOPED_TRACE(std::string(file) + " tp " + std::to_string(tp));
    for (const RankOutput& out : check_ranks(file, tp, ro, file))
      EXPECT_EQ(out.comm, "threads+staging");
  }
}

// CUDA graphs: the rounds of support/draft_rounds.h with captured forwards on the GPU equal the
// same rounds issued op by op on the GPU (tokens exactly) and on the CPU (within the GEMM
// precision); at tp = 1 in one graph, at tp = 2 on one GPU in segments around the staged
// all-reduces.
TEST(CudaDrafter, GraphReplaysEqualDirectOpsAndTheCpu) {
  REQUIRE_GPUS(1);
  for (const char* file : {"tiny-dflash.json", "tiny-dflash2.json"}) {
    const DrafterConfig cfg = testing::eight_heads_over_two(file);
    testing::TempDir dir;
    const std::string ckpt = write_checkpoint(dir, cfg);
    auto single = parallel::make_single_rank();
    const auto want = testing::run_draft_rounds(*single, "cpu", ckpt, cfg, false);
    for (int tp : {1, 2}) {
      const std::string what = std::string(file) + " tp " + std::to_string(tp);
      std::vector<std::vector<testing::DraftRound>> eager(static_cast<size_t>(tp)), graphs(static_cast<size_t>(tp));
      testing::run_group(tp, [&](parallel::Communicator& comm) {
        eager[static_cast<size_t>(comm.rank())] = testing::run_draft_rounds(comm, "cuda", ckpt, cfg, false);
        graphs[static_cast<size_t>(comm.rank())] = testing::run_draft_rounds(comm, "cuda", ckpt, cfg, true);
      });
      for (int r = 0; r < tp; ++r) {
        const auto& e = eager[static_cast<size_t>(r)];
        const auto& g = graphs[static_cast<size_t>(r)];
        ASSERT_EQ(g.size(), testing::draft_rounds_replayed().size()) << what;
        for (size_t i = 0; i < g.size(); ++i) {
          const std::string at = what + " rank " + std::to_string(r) + " round " + std::to_string(i);
          EXPECT_EQ(g[i].replayed, testing::draft_rounds_replayed()[i]) << at;
          EXPECT_EQ(g[i].segments, tp == 1 ? 1u : static_cast<size_t>(2 * cfg.layers + 1)) << at;
          ASSERT_EQ(g[i].results.size(), e[i].results.size()) << at;
          for (size_t s = 0; s < g[i].results.size(); ++s)
            EXPECT_EQ(g[i].results[s].tokens, e[i].results[s].tokens) << at << " session " << s;
          const std::vector<double> h(e[i].dump.hidden.begin(), e[i].dump.hidden.end());
          EXPECT_LT(testing::relative_error(g[i].dump.hidden, h), 1e-6) << at;
          RankOutput got_out{g[i].results, g[i].dump, {}, ""}, want_out{want[i].results, want[i].dump, {}, ""};
          expect_same(want_out, got_out, at + " against the cpu");
        }
      }
    }
  }
}

// Host buffers go straight to the host communicator (this runs without a device too).
TEST(HostStaging, HostBuffersPassStraightThrough) {
  parallel::run_ranks(3, [&](parallel::Communicator& comm) {
    auto staged = parallel::make_host_staged(comm, 0, nullptr);
    EXPECT_EQ(staged->rank(), comm.rank());
    EXPECT_EQ(staged->size(), 3);
    std::vector<float> x(10, static_cast<float>(comm.rank() + 1));
    staged->all_reduce_sum(x.data(), x.size());
    EXPECT_EQ(x, std::vector<float>(10, 6.0f));
    const int64_t mine = 10 + comm.rank();
    std::vector<int64_t> all(3);
    staged->all_gather(&mine, all.data(), sizeof(mine));
    EXPECT_EQ(all, (std::vector<int64_t>{10, 11, 12}));
    int64_t token = comm.rank() == 2 ? 42 : 0;
    staged->broadcast(&token, sizeof(token), 2);
    EXPECT_EQ(token, 42);
    staged->barrier();
    EXPECT_EQ(staged->stats().all_reduce_calls, 1u);
    EXPECT_EQ(staged->stats().all_gather_calls, 1u);
    EXPECT_EQ(staged->stats().broadcast_calls, 1u);
    EXPECT_EQ(staged->stats().barrier_calls, 1u);
  });
}

#ifdef TPDRAFT_HAVE_NCCL

// Exact small integers: every rank and every algorithm gives the same sums.
void check_collectives(parallel::Communicator& nccl, kernels::Ops& ops) {
  const int r = nccl.rank(), n = nccl.size();
  const size_t count = 1000;
  std::vector<float> mine(count);
  for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>((i % 7) + static_cast<size_t>(r));
  std::vector<float> sum(count);
  for (size_t i = 0; i < count; ++i) sum[i] = static_cast<float>(n * static_cast<int>(i % 7) + n * (n - 1) / 2);
  // Device buffer.
  kernels::Buffer d = kernels::put(ops, mine);
  nccl.all_reduce_sum(d.f32(), count);
  EXPECT_EQ(kernels::get<float>(ops, d, count), sum) << "all_reduce_sum on device memory";
  // Host buffer (staged through the device).
  std::vector<float> host = mine;
  nccl.all_reduce_sum(host.data(), count);
  EXPECT_EQ(host, sum) << "all_reduce_sum on host memory";
  // all_gather (host in, host out) and broadcast (device).
  std::vector<int64_t> block = {r, 10 * r + 1, 100 * r + 2};
  std::vector<int64_t> all(block.size() * static_cast<size_t>(n));
  nccl.all_gather(block.data(), all.data(), block.size() * sizeof(int64_t));
  for (int q = 0; q < n; ++q)
    EXPECT_EQ(std::vector<int64_t>(all.begin() + 3 * q, all.begin() + 3 * q + 3),
              (std::vector<int64_t>{q, 10 * q + 1, 100 * q + 2}));
  std::vector<float> root(count, static_cast<float>(r + 1));
  ops.to_device(d.get(), root.data(), count * sizeof(float));
  nccl.broadcast(d.get(), count * sizeof(float), n - 1);
  EXPECT_EQ(kernels::get<float>(ops, d, count), std::vector<float>(count, static_cast<float>(n)))
      << "broadcast from the last rank";
  nccl.barrier();
  const parallel::CommStats& st = nccl.stats();
  EXPECT_EQ(st.all_reduce_calls, 2u);
  EXPECT_EQ(st.all_gather_calls, 1u);
  EXPECT_EQ(st.broadcast_calls, 1u);
  EXPECT_EQ(st.barrier_calls, 1u);
}

TEST(NcclCommunicator, OneRankOnOneGpu) {
  REQUIRE_GPUS(1);
  auto ops = kernels::make_cuda_ops(0);
  auto single = parallel::make_single_rank();
  auto nccl = parallel::make_nccl(*single, 0, static_cast<cudaStream_t>(ops->stream()));
  EXPECT_EQ(nccl->name(), "nccl");
  check_collectives(*nccl, *ops);
  // Aborted (as the watchdog or a failed peer would): later calls fail naming the abort, and the
  // destructor does not hang on the aborted communicator.
  nccl->abort("the test aborts it");
  kernels::Buffer d(*ops, 64 * sizeof(float));
  testing::expect_error([&] { nccl->all_reduce_sum(d.f32(), 64); }, {"aborted"});
}

// The all-reduce path is said and the collectives hold on it: symmetric windows where NCCL and
// the device allow them (NCCL 2.27 and later), the ring with TPDRAFT_NCCL_SYMMETRIC=off; an
// all-reduce larger than the window takes the ring on either.
TEST(NcclCommunicator, SymmetricWindowsOrTheRingSayWhichRan) {
  REQUIRE_GPUS(1);
  auto ops = kernels::make_cuda_ops(0);
  auto single = parallel::make_single_rank();
  for (const std::string setting : {"auto", "off"}) {
    setenv("TPDRAFT_NCCL_SYMMETRIC", setting.c_str(), 1);
    auto nccl = parallel::make_nccl(*single, 0, static_cast<cudaStream_t>(ops->stream()));
    const std::string path = nccl->all_reduce_path();
    const bool symmetric = path.rfind("symmetric windows (NCCL ", 0) == 0;
    EXPECT_TRUE(symmetric || path.rfind("ring (NCCL ", 0) == 0) << path;
    if (setting == "off") {
      EXPECT_FALSE(symmetric) << path;
    }
    std::printf("TPDRAFT_NCCL_SYMMETRIC=%s: %s\n", setting.c_str(), path.c_str());
    check_collectives(*nccl, *ops);
    std::vector<float> big(size_t{1} << 20);  // 4 MiB
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 5);
    kernels::Buffer d = kernels::put(*ops, big);
    nccl->all_reduce_sum(d.f32(), big.size());
    EXPECT_EQ(kernels::get<float>(*ops, d, big.size()), big) << "one rank's sum is its data";
  }
  unsetenv("TPDRAFT_NCCL_SYMMETRIC");
}

TEST(NcclCommunicator, TwoRanksOnTwoGpus) {
  REQUIRE_GPUS(2);
  parallel::run_ranks(2, [&](parallel::Communicator& comm) {
    auto ops = kernels::make_cuda_ops(comm.rank());
    auto nccl = parallel::make_nccl(comm, comm.rank(), static_cast<cudaStream_t>(ops->stream()));
    check_collectives(*nccl, *ops);
  });
}

TEST(NcclCommunicator, AMissingPeerTimesOutNamingRankAndOperation) {
  REQUIRE_GPUS(2);
  setenv("TPDRAFT_NCCL_TIMEOUT_S", "3", 1);
  testing::expect_error(
      [] {
        parallel::run_ranks(2, [&](parallel::Communicator& comm) {
          auto ops = kernels::make_cuda_ops(comm.rank());
          auto nccl = parallel::make_nccl(comm, comm.rank(), static_cast<cudaStream_t>(ops->stream()));
          if (comm.rank() != 0) return;  // rank 1 never joins the all-reduce
          kernels::Buffer d(*ops, 64 * sizeof(float));
          nccl->all_reduce_sum(d.f32(), 64);
        });
      },
      {"rank 0", "all_reduce_sum", "timed out"});
  unsetenv("TPDRAFT_NCCL_TIMEOUT_S");
}

TEST(NcclCommunicator, DraftAtTwoRanksOnTwoGpus) {
  REQUIRE_GPUS(2);
  model::RuntimeOptions ro = testing::backend("cuda");
  ro.nccl = true;  // one rank per GPU (the group rank picks it)
  EXPECT_EQ(check_ranks("tiny-dflash2.json", 2, ro, "nccl")[0].comm, "nccl");
}

// NCCL inside a captured forward: the all-reduces join the graph (one segment), which a replay
// runs and wait_pending waits for. Replays must equal the same rounds issued op by op, at one
// rank on one GPU, and at two ranks on two GPUs where they exist.
void check_nccl_graph_rounds(int tp) {
  for (const char* file : {"tiny-dflash.json", "tiny-dflash2.json"}) {
    const DrafterConfig cfg = testing::eight_heads_over_two(file);
    testing::TempDir dir;
    const std::string ckpt = write_checkpoint(dir, cfg);
    std::vector<std::vector<testing::DraftRound>> eager(static_cast<size_t>(tp)), graphs(static_cast<size_t>(tp));
    testing::run_group(tp, [&](parallel::Communicator& comm) {
      eager[static_cast<size_t>(comm.rank())] = testing::run_draft_rounds(comm, "cuda", ckpt, cfg, false, true);
      graphs[static_cast<size_t>(comm.rank())] = testing::run_draft_rounds(comm, "cuda", ckpt, cfg, true, true);
    });
    for (int r = 0; r < tp; ++r)
      for (size_t i = 0; i < graphs[static_cast<size_t>(r)].size(); ++i) {
        const auto& g = graphs[static_cast<size_t>(r)][i];
        const auto& e = eager[static_cast<size_t>(r)][i];
        const std::string at = std::string(file) + " tp " + std::to_string(tp) + " round " + std::to_string(i);
        EXPECT_EQ(g.replayed, testing::draft_rounds_replayed()[i]) << at;
        EXPECT_EQ(g.segments, 1u) << at << ": NCCL's all-reduces should have joined the graph";
        for (size_t s = 0; s < g.results.size(); ++s) EXPECT_EQ(g.results[s].tokens, e.results[s].tokens) << at;
        EXPECT_EQ(g.stats.all_reduce_calls, e.stats.all_reduce_calls) << at;
        const std::vector<double> h(e.dump.hidden.begin(), e.dump.hidden.end());
        EXPECT_LT(testing::relative_error(g.dump.hidden, h), 1e-6) << at;
      }
  }
}

TEST(NcclCommunicator, CapturedForwardAtOneRankEqualsDirectOps) {
  REQUIRE_GPUS(1);
  check_nccl_graph_rounds(1);
}

TEST(NcclCommunicator, CapturedForwardAtTwoRanksEqualsDirectOps) {
  REQUIRE_GPUS(2);
  check_nccl_graph_rounds(2);
}

#endif  // TPDRAFT_HAVE_NCCL

}  // namespace
}  // namespace tpdraft

#endif  // TPDRAFT_HAVE_CUDA
