// The `tpdraft` program as a user runs it: init a checkpoint it has never seen, draft with
// --dump, and compare every dumped tensor with the float64 reference; plus the errors a user
// meets on the command line, each produced here.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "core/files.h"
#include "reference/reference.h"
#include "support/test_support.h"

namespace tpdraft {
namespace {

using Result = testing::CommandResult;

// Runs `prefix tpdraft args` (prefix: e.g. an environment assignment or `timeout`).
Result run_prefixed(const std::string& prefix, const std::string& args) {
  return testing::run_command(prefix + std::string(TPDRAFT_BIN) + " " + args);
}

Result run(const std::string& args) { return run_prefixed("", args); }

using testing::json_line;

// A dumped tensor's relative error to the reference's values.
double rel_error(const model::TensorInfo& dumped, const std::vector<double>& want) {
  return testing::relative_error(model::to_f32(dumped), want);
}

// `tpdraft init --config CONFIG --out OUT extra`.
Result init(const std::string& out, const std::string& extra = "",
            const std::string& config = testing::source_path("configs/tiny-dflash.json")) {
  return run("init --config " + config + " --out " + out + " " + extra);
}

// A failing command line and what its message must name.
struct Case {
  std::string args, needle;
};

// A drafter config from configs/ with some keys replaced, written into dir.
std::string write_config(const testing::TempDir& dir, const std::string& name, const nlohmann::json& changes,
                         const std::string& base = "configs/tiny-dflash.json") {
  nlohmann::json j = nlohmann::json::parse(read_regular_file(testing::source_path(base), "drafter config"));
  j.merge_patch(changes);
  const std::string path = dir.file(name);
  testing::write_text(path, j.dump(2));
  return path;
}

// An odd geometry the program has never seen, with a padded head, written as a config file.
std::string write_odd_config(const testing::TempDir& dir, bool dflash2) {
  nlohmann::json odd = {{"hidden_size", 80}, {"num_attention_heads", 5}, {"num_key_value_heads", dflash2 ? 1 : 5},
                        {"head_dim", 14}, {"intermediate_size", 72}, {"vocab_size", 233},
                        {"dflash_config", {{"mask_token_id", 231}}}};
  if (dflash2) odd["dflash_config"]["conv_group_size"] = 20;
  return write_config(dir, dflash2 ? "odd2.json" : "odd1.json", odd,
                      dflash2 ? "configs/tiny-dflash2.json" : "configs/tiny-dflash.json");
}

void check_against_reference(bool dflash2, const std::string& dtype) {
  testing::TempDir dir;
  const std::string config = write_odd_config(dir, dflash2);
  const std::string ck = dir.file("ck");
  Result made = init(ck, "--seed 3 --dtype " + dtype + " --taps 37 --target-vocab 250", config);
  ASSERT_EQ(made.status, 0) << made.out;
  const std::string dump = dir.file("dump.safetensors");
  Result draft = run("draft --drafter " + ck + "/drafter --target " + ck + "/target --taps " + ck +
                  "/taps.safetensors --anchor 19 --threads 2 --dump " + dump);
  ASSERT_EQ(draft.status, 0) << draft.out;
  const auto json = nlohmann::json::parse(json_line(draft.out));

  reference::RefModel ref(ck + "/drafter", ck + "/target");
  const auto& cfg = ref.config();
  auto taps_store = model::TensorStore::open(ck + "/taps.safetensors");
  reference::RefContext ctx;
  ref.settle(ctx, 0, model::to_f64(*taps_store->find("taps")), 37);
  const reference::RefDraft want = ref.draft(ctx, 19, {});

  auto got = model::TensorStore::open(dump);
  EXPECT_LT(rel_error(got->require("hidden", {cfg.block, cfg.hidden}), want.hidden), 2e-3);
  EXPECT_LT(rel_error(got->require("logits", {cfg.block - 1, cfg.vocab}), want.logits), 2e-3);
  const model::TensorInfo* tokens = got->find("tokens");
  ASSERT_NE(tokens, nullptr);
  std::vector<int64_t> dumped(static_cast<size_t>(tokens->numel()));
  std::memcpy(dumped.data(), tokens->data, tokens->nbytes);
  EXPECT_EQ(dumped, want.tokens);
  EXPECT_EQ(json["tokens"].get<std::vector<int64_t>>(), want.tokens);
  for (int64_t l = 0; l < cfg.layers; ++l) {
    std::vector<double> k, v;
    for (const auto& row : ctx.k[static_cast<size_t>(l)]) k.insert(k.end(), row.begin(), row.end());
    for (const auto& row : ctx.v[static_cast<size_t>(l)]) v.insert(v.end(), row.begin(), row.end());
    const std::string ln = std::to_string(l);
    EXPECT_LT(rel_error(*got->find("context_k." + ln), k), 2e-3) << "layer " << l;
    EXPECT_LT(rel_error(*got->find("context_v." + ln), v), 2e-3) << "layer " << l;
    EXPECT_EQ(got->find("context_k." + ln)->shape, (std::vector<int64_t>{37, cfg.n_kv, cfg.head_dim}));
  }
}

TEST(Cli, DraftOnUnseenDFlashCheckpointMatchesReference) { check_against_reference(false, "bf16"); }
TEST(Cli, DraftOnUnseenDFlash2CheckpointMatchesReference) { check_against_reference(true, "bf16"); }
TEST(Cli, DraftOnF32CheckpointMatchesReference) { check_against_reference(true, "f32"); }

// `tpdraft quantize` on an unseen geometry (o_proj has 70 columns: one scale per row), then `tpdraft draft` on the result against the float64
// reference on the dequantized weights (within the activation rounding the op tests bound), and
// `tpdraft info` naming every matrix's format and its bytes per rank.
TEST(Cli, QuantizeThenDraftMatchesTheDequantizedReference) {
  testing::TempDir dir;
  const std::string config = write_odd_config(dir, true);
  const std::string ck = dir.file("ck"), q = dir.file("q");
  ASSERT_EQ(init(ck, "--seed 4 --taps 29", config).status, 0);
  Result made = run("quantize --drafter " + ck + "/drafter --out " + q + " --bits 4 --group 8 --include-fc");
  ASSERT_EQ(made.status, 0) << made.out;
  EXPECT_NE(made.out.find("tensors quantized"), std::string::npos) << made.out;
  const std::string dump = dir.file("dump.safetensors");
  Result draft = run("draft --drafter " + q + " --target " + ck + "/target --taps " + ck +
                     "/taps.safetensors --anchor 11 --threads 2 --dump " + dump);
  ASSERT_EQ(draft.status, 0) << draft.out;
  reference::RefModel ref(q, ck + "/target");
  const auto& cfg = ref.config();
  auto taps_store = model::TensorStore::open(ck + "/taps.safetensors");
  reference::RefContext ctx;
  ref.settle(ctx, 0, model::to_f64(*taps_store->find("taps")), 29);
  const reference::RefDraft want = ref.draft(ctx, 11, {});
  auto got = model::TensorStore::open(dump);
  const double eh = rel_error(got->require("hidden", {cfg.block, cfg.hidden}), want.hidden);
  const double el = rel_error(got->require("logits", {cfg.block - 1, cfg.vocab}), want.logits);
  EXPECT_LT(eh, 2e-2);
  EXPECT_LT(el, 2e-2);
  EXPECT_GT(el, 1e-5);  // activations are rounded to int8: not the float path's 1e-6

  Result info = run("info --drafter " + q + " --tensors");
  ASSERT_EQ(info.status, 0) << info.out;
  EXPECT_NE(info.out.find("quantized   13 x int4 g8, 2 x int4 per-channel (quantization_config, pack-quantized)"), std::string::npos)
      << info.out;
  EXPECT_NE(info.out.find("layers.1.mlp.down_proj.weight"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("int4 g8"), std::string::npos) << info.out;
  Result onload = run("info --drafter " + ck + "/drafter --quant q8");
  EXPECT_NE(onload.out.find("while loading, --quant q8"), std::string::npos) << onload.out;
  // +head: the head is counted as int8 (per channel: the tiny rows are shorter than a group).
  Result head = run("info --drafter " + ck + "/drafter --target " + ck + "/target --quant q8+head --json");
  ASSERT_EQ(head.status, 0) << head.out;
  const auto hj = nlohmann::json::parse(json_line(head.out));
  const auto plain = nlohmann::json::parse(json_line(run("info --drafter " + ck + "/drafter --target " + ck +
                                                         "/target --quant q8 --json").out));
  EXPECT_EQ(hj["head_format"], "int8 per-channel");
  EXPECT_LT(hj["ranks"][0]["bytes"]["head"].get<double>(), 0.6 * plain["ranks"][0]["bytes"]["head"].get<double>());

  // Quantizing twice, or asking --quant of a quantized checkpoint, is refused.
  Result again = run("draft --drafter " + q + " --target " + ck + "/target --taps " + ck +
                     "/taps.safetensors --anchor 11 --quant q4");
  EXPECT_NE(again.status, 0);
  EXPECT_NE(again.out.find("quantized already"), std::string::npos) << again.out;
  Result bits = run("quantize --drafter " + ck + "/drafter --out " + dir.file("q3") + " --bits 3");
  EXPECT_NE(bits.status, 0);
  EXPECT_NE(bits.out.find("--bits"), std::string::npos) << bits.out;
}

// TPDRAFT_CPU_ISA caps the kernels' level (quantized ones included); an unknown name is refused.
TEST(Cli, CpuIsaCapFromTheEnvironment) {
  const std::string args = "bench --config " + testing::source_path("configs/tiny-dflash2.json") +
                           " --ctx 8 --repeat 1 --warmup 0 --threads 1 --backend cpu --quant q4 --json";
  Result capped = run_prefixed("TPDRAFT_CPU_ISA=scalar ", args);
  EXPECT_EQ(capped.status, 0) << capped.out;
  Result plain = run(args);
  ASSERT_EQ(plain.status, 0) << plain.out;
  // The variants are bit-identical: the same tokens either way.
  EXPECT_EQ(nlohmann::json::parse(json_line(capped.out))["tokens"], nlohmann::json::parse(json_line(plain.out))["tokens"]);
  Result bad = run_prefixed("TPDRAFT_CPU_ISA=avx9 ", args);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("TPDRAFT_CPU_ISA is 'avx9'"), std::string::npos) << bad.out;
}

// bench's report: the draft's figure in the harness's shape beside the key the scaling scripts
// read, and the machine's load, in the JSON and in the table.
TEST(Cli, BenchReportsTheFigureAndTheMachine) {
  const std::string args = "bench --config " + testing::source_path("configs/tiny-dflash2.json") +
                           " --ctx 8 --repeat 3 --warmup 1 --threads 1 --backend cpu";
  Result r = run(args + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(json_line(r.out));
  EXPECT_EQ(j["draft_ms"], j["draft_ms_median"]);
  EXPECT_EQ(j["draft_ms_runs"].get<int>(), 3);
  EXPECT_LE(j["draft_ms_min"].get<double>(), j["draft_ms_p10"].get<double>());
  EXPECT_LE(j["draft_ms_p10"].get<double>(), j["draft_ms"].get<double>());
  EXPECT_LE(j["draft_ms"].get<double>(), j["draft_ms_p90"].get<double>());
  EXPECT_LE(j["draft_ms_p90"].get<double>(), j["draft_ms_max"].get<double>());
  ASSERT_TRUE(j.contains("machine_load")) << r.out;
  EXPECT_EQ(j["machine_load"]["idle"].get<bool>(), j["machine_load"]["not_idle_because"].empty());
  Result table = run(args);
  ASSERT_EQ(table.status, 0) << table.out;
  EXPECT_NE(table.out.find("  machine    "), std::string::npos) << table.out;
}

// bench's sampled drafts: the JSON says which sampling ran, the settle is timed warm, the tokens
// are the sampled ones (not greedy's) and the same at tp 1 and tp 2; top-k on DFlash 2 is refused.
TEST(Cli, BenchTimesSampledDrafts) {
  const std::string args = "bench --config " + testing::source_path("configs/tiny-dflash.json") +
                           " --ctx 8 --repeat 2 --warmup 1 --threads 1 --backend cpu --json";
  const std::string sampling = " --temperature 1.5 --top-k 20 --top-p 0.9 --seed 3";
  Result greedy = run(args + " --seed 3"), tp1 = run(args + sampling), tp2 = run(args + sampling + " --tp 2");
  ASSERT_EQ(greedy.status, 0) << greedy.out;
  ASSERT_EQ(tp1.status, 0) << tp1.out;
  ASSERT_EQ(tp2.status, 0) << tp2.out;
  const auto g = nlohmann::json::parse(json_line(greedy.out)), s1 = nlohmann::json::parse(json_line(tp1.out)),
             s2 = nlohmann::json::parse(json_line(tp2.out));
  EXPECT_EQ(g["sampling"], "greedy");
  EXPECT_EQ(s1["sampling"], "temperature 1.5, top-k 20, top-p 0.9");
  EXPECT_EQ(s1["settle_warm"], true);
  EXPECT_NE(s1["tokens"], g["tokens"]);
  EXPECT_EQ(s1["tokens"], s2["tokens"]);
  Result table = run("bench --config " + testing::source_path("configs/tiny-dflash.json") +
                     " --ctx 8 --repeat 1 --warmup 0 --threads 1 --backend cpu" + sampling);
  EXPECT_NE(table.out.find("temperature 1.5, top-k 20, top-p 0.9 drafts"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("warm (after one untimed settle)"), std::string::npos) << table.out;
  Result refused = run("bench --config " + testing::source_path("configs/tiny-dflash2.json") +
                       " --ctx 8 --repeat 1 --warmup 0 --threads 1 --top-k 5 --temperature 1");
  EXPECT_EQ(refused.status, 2) << refused.out;
}

TEST(Cli, EveryCommandAnswersHelp) {
  for (const char* c : {"", "init ", "info ", "draft ", "bench ", "quantize "}) {
    Result r = run(std::string(c) + "--help");
    EXPECT_EQ(r.status, 0) << c;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << r.out;
  }
}

TEST(Cli, UserErrorsNameWhatIsWrong) {
  testing::TempDir dir;
  const std::string ck = dir.file("ck");
  ASSERT_EQ(init(ck, "--taps 5").status, 0);
  const std::string d = " --drafter " + ck + "/drafter --target " + ck + "/target";
  testing::write_text(dir.file("bad.json"), "{\"architectures\": [\"LlamaForCausalLM\"]}");
  // Taps of the wrong width: written with the other tiny config.
  const std::string other = dir.file("other");
  ASSERT_EQ(init(other, "--taps 3", testing::source_path("configs/tiny-dflash2.json")).status, 0);
  const Case cases[] = {
      {"init --config " + dir.file("bad.json") + " --out " + dir.file("x"), "LlamaForCausalLM"},
      {"init --config " + dir.file("missing.json") + " --out " + dir.file("x"), "missing.json"},
      {"draft" + d + " --taps " + ck + "/taps.safetensors --anchor 100000", "anchor token 100000"},
      {"draft" + d + " --taps " + other + "/taps.safetensors --anchor 1", "tensor 'taps' has shape [3, 192]"},
      {"draft" + d + " --taps " + ck + "/drafter/model.safetensors --anchor 1", "no tensor 'taps'"},
      {"draft --drafter " + ck + "/drafter --target " + other + "/target --taps " + ck + "/taps.safetensors --anchor 1",
       "expected [Vt >= vocab_size 300, hidden 64]"},
      {"draft" + d + " --taps " + ck + "/taps.safetensors --anchor 1 --temperature 1 --top-p 0", "--top-p"},
      {"info --drafter " + dir.path(), "config.json"},
      {"init --config " + testing::source_path("configs/tiny-dflash.json") + " --out " + dir.file("y") + " --dtype f64",
       "dtype"},
  };
  for (const Case& c : cases) {
    Result r = run(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << "\n" << r.out;
  }
  // Sampling options a checkpoint cannot take are the command line's error (2), not the input's:
  // top-k and top-p on a DFlash 2 drafter.
  const Result r = run("draft --drafter " + other + "/drafter --target " + other + "/target --taps " + other +
                       "/taps.safetensors --anchor 1 --temperature 0.8 --top-k 20 --top-p 0.9");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("top_k / top_p apply to DFlash drafters"), std::string::npos) << r.out;
}

TEST(Cli, HugeVocabIsAnErrorNotACrash) {
  // 2^58 (+ 1) rows x 64 columns wrapped to 0 (128) bytes of random weights, then read past them.
  testing::TempDir dir;
  for (int64_t vocab : {int64_t{1} << 58, (int64_t{1} << 58) + 1}) {
    const std::string config = write_config(dir, "v.json", {{"vocab_size", vocab}});
    Result r = run("bench --config " + config + " --ctx 4 --repeat 1 --warmup 0 --threads 1");
    EXPECT_EQ(r.status, 3) << r.out;
    EXPECT_NE(r.out.find("'vocab_size'"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(config), std::string::npos) << r.out;
  }
}

TEST(Cli, BenchConfigBeyondMemoryNamesTheKeysAndBytes) {
  // Every key within its bound, but 8 TiB of random weights: refused before generating them.
  testing::TempDir dir;
  const std::string config =
      write_config(dir, "big.json", {{"hidden_size", 131072}, {"vocab_size", 16777216}, {"num_attention_heads", 32}});
  const auto t0 = std::chrono::steady_clock::now();
  Result r = run("bench --config " + config + " --ctx 4 --repeat 1 --warmup 0 --threads 1");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 120.0);  // not hours
  EXPECT_EQ(r.status, 3) << r.out;
  for (const char* part : {"bytes", "memory", "vocab_size = 16777216", "hidden_size = 131072"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
  EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << r.out;
}

TEST(Cli, ConfigGivenAsDirectoryNamesThePath) {
  testing::TempDir dir;
  Result r = run("bench --config " + dir.path() + " --ctx 4 --repeat 1 --warmup 0");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find(dir.path() + ": is a directory"), std::string::npos) << r.out;
}

TEST(Cli, NonFiniteWeightIsAnErrorNotATokenOfMinusOne) {
  testing::TempDir dir;
  const std::string ck = dir.file("ck");
  ASSERT_EQ(init(ck, "--taps 5").status, 0);
  testing::set_element(ck + "/target/model.safetensors", "lm_head.weight", 17 * 64 + 5, NAN);
  Result r = run("draft --drafter " + ck + "/drafter --target " + ck + "/target --taps " + ck +
                 "/taps.safetensors --anchor 3 --threads 1");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find(ck + "/target/model.safetensors: tensor 'lm_head.weight'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("row 17, column 5"), std::string::npos) << r.out;
  EXPECT_EQ(json_line(r.out), "") << r.out;
}

TEST(Cli, FifoInputsAreRefusedWithoutBlocking) {
  testing::TempDir dir;
  const std::string ck = dir.file("ck");
  ASSERT_EQ(init(ck).status, 0);
  const std::string fifo = dir.file("pipe.safetensors");
  testing::make_fifo(fifo);
  // `timeout` ends a blocked run, so a regression fails here instead of hanging the suite.
  const std::string limit = "timeout -s KILL 20 ";
  Result r = run_prefixed(limit, "draft --drafter " + ck + "/drafter --target " + ck + "/target --taps " + fifo +
                                     " --anchor 1 --threads 1");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find(fifo + ": is a FIFO"), std::string::npos) << r.out;
  r = run_prefixed(limit, "bench --config " + fifo + " --ctx 4 --repeat 1 --warmup 0");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find(fifo + ": is a FIFO"), std::string::npos) << r.out;
  r = run_prefixed(limit, "init --config " + fifo + " --out " + dir.file("other"));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(fifo), std::string::npos) << r.out;
}

// The names in a directory, sorted.
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Cli, InitChecksEverythingBeforeWritingAnything) {
  testing::TempDir dir;
  const Case cases[] = {
      {"--target-vocab 100", "target vocab 100"},  // below vocab_size 300: the drafter was written first
      {"--target-vocab -5", "--target-vocab: must be in 0..16777216, got -5"},
      {"--target-vocab 33554432", "--target-vocab: must be in 0..16777216, got 33554432"},
      {"--taps -1", "--taps: must be at least 0, got -1"},
      {"--taps many", "--taps: expected a whole number, got 'many'"},
      {"--taps 99999999999999999999", "--taps: expected a whole number, got '99999999999999999999'"},
      {"--taps 1099511627776", "bytes"},
  };
  for (const Case& c : cases) {
    Result r = init(dir.file("ck"), c.args);
    EXPECT_NE(r.status, 0) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_LT(r.out.size(), 400u) << r.out;  // no bound printed with hundreds of digits
    // No checkpoint, no half of one, no temporary directory beside it.
    EXPECT_EQ(entries(dir.path()), std::vector<std::string>{}) << c.args;
  }
}

TEST(Cli, InitReplacesAnEarlierCheckpointWhole) {
  testing::TempDir dir;
  const std::string ck = dir.file("ck");
  ASSERT_EQ(init(ck, "--taps 5").status, 0);
  EXPECT_EQ(entries(ck), (std::vector<std::string>{"drafter", "taps.safetensors", "target"}));
  // Written again without taps and with another config: the old taps file must not survive.
  Result r = init(ck + "/", "", testing::source_path("configs/tiny-dflash2.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(entries(ck), (std::vector<std::string>{"drafter", "target"}));
  EXPECT_EQ(model::DrafterConfig::from_file(ck + "/drafter/config.json").arch_name, "DFlash2DraftModel");
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"ck"});
  // An existing empty directory is filled.
  std::filesystem::create_directory(dir.file("empty"));
  ASSERT_EQ(init(dir.file("empty")).status, 0);
  EXPECT_EQ(entries(dir.file("empty")), (std::vector<std::string>{"drafter", "target"}));
  // A destination whose parents do not exist yet is created.
  ASSERT_EQ(init(dir.file("a/b/c")).status, 0);
  EXPECT_EQ(entries(dir.file("a/b/c")), (std::vector<std::string>{"drafter", "target"}));
}

TEST(Cli, InitRefusesToReplaceWhatIsNotACheckpoint) {
  testing::TempDir dir;
  std::filesystem::create_directory(dir.file("data"));
  testing::write_text(dir.file("data/notes.txt"), "keep me");
  Result r = init(dir.file("data"));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(dir.file("data") + ": exists and is not a tpdraft checkpoint"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'notes.txt'"), std::string::npos) << r.out;
  EXPECT_EQ(entries(dir.file("data")), std::vector<std::string>{"notes.txt"});
  // A model directory with more than init writes (here a tokenizer) is not one of ours either.
  std::filesystem::create_directories(dir.file("model/target"));
  testing::write_text(dir.file("model/target/tokenizer.json"), "{}");
  r = init(dir.file("model"));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("'target/tokenizer.json'"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir.file("model/target/tokenizer.json")));
  // A file.
  testing::write_text(dir.file("file"), "x");
  r = init(dir.file("file"));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(dir.file("file") + ": exists and is not a directory"), std::string::npos) << r.out;
  EXPECT_EQ(entries(dir.path()), (std::vector<std::string>{"data", "file", "model"}));
}

TEST(Cli, InitHelpSaysWhatAnExistingOutputBecomes) {
  Result r = run("init --help");
  EXPECT_EQ(r.status, 0);
  for (const char* part : {"replaced", "empty", "drafter/, target/", "refused"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
}

TEST(Cli, UnknownLogLevelIsAnError) {
  testing::TempDir dir;
  const std::string init_into = "init --config " + testing::source_path("configs/tiny-dflash.json") + " --out ";
  // A typo used to switch logging off silently, errors included.
  for (const char* level : {"verbose", "wran", "0"}) {
    Result r = run_prefixed(std::string("TPDRAFT_LOG_LEVEL=") + level + " ", init_into + dir.file("x"));
    EXPECT_EQ(r.status, 2) << level << "\n" << r.out;
    EXPECT_NE(r.out.find(std::string("TPDRAFT_LOG_LEVEL='") + level + "'"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("trace, debug, info, warn, error, critical, off"), std::string::npos) << r.out;
    EXPECT_FALSE(std::filesystem::exists(dir.file("x"))) << level;
  }
  // Known levels work, in any case: warn hides the info lines, debug shows them.
  Result r = run_prefixed("TPDRAFT_LOG_LEVEL=WARN ", init_into + dir.file("w"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("[info]"), std::string::npos) << r.out;
  r = run_prefixed("TPDRAFT_LOG_LEVEL=debug ", init_into + dir.file("d"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[info] wrote " + dir.file("d")), std::string::npos) << r.out;
  // Set but empty counts as unset.
  r = run_prefixed("TPDRAFT_LOG_LEVEL= ", init_into + dir.file("e"));
  EXPECT_EQ(r.status, 0) << r.out;
}

}  // namespace
}  // namespace tpdraft
